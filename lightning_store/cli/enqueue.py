"""``store enqueue``: put tasks in the queue from a JSON Lines file or stdin, or the rows of a Parquet or CSV file or
of a Hugging Face dataset (:mod:`lightning_store.task_sources`).

Contract: every line is read and checked first (:mod:`lightning_store.cli.tasks`); one bad line, or an empty
input, and nothing is written (exit status 1, each bad line named on stderr). Then the rollouts are enqueued in
batches (at most :data:`BATCH` rollouts and about :data:`BATCH_BYTES` of JSON each), each batch all or none
(``enqueue_many_rollouts``); stdout gets each rollout's id on its own line as its batch is written (``--json``:
one object per rollout), stderr a one-line summary. With caller ids (``--id-field``, or ``rollout_id`` in
``--requests`` lines) a re-run is idempotent: the store returns a rollout that exists unchanged, and the command
reports it as ``existed``. A failure while writing leaves the batches before it written (their ids printed).
"""

from __future__ import annotations

import enum
import json
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from lightning_store.cli.common import DEFAULT_STORE, StoreTarget, Token, errors, fail, with_store
from lightning_store.cli.tasks import Defaults, read_requests
from lightning_store.contract import LightningStore
from lightning_store.errors import InvalidRequestError
from lightning_store.limits import check_json
from lightning_store.models import EnqueueRolloutRequest, RolloutConfig, RolloutMode
from lightning_store.task_sources import TaskSourceError, task_lines

BATCH = 500
"""Rollouts per ``enqueue_many_rollouts`` call (one transaction, one request)."""
BATCH_BYTES = 8 * 2**20
"""A batch ends before its JSON would pass this size: well under the server's body limit (32 MiB by default)."""
WHAT = "cannot enqueue"
_CONFIG_OPTIONS = {
    "max_attempts": "--max-attempts",
    "timeout_seconds": "--timeout",
    "unresponsive_seconds": "--unresponsive",
    "retry_condition": "--retry-on",
}


class RetryOn(enum.StrEnum):
    """Attempt statuses a rollout may be retried on."""

    failed = "failed"
    timeout = "timeout"
    unresponsive = "unresponsive"


def enqueue(
    file: Annotated[
        str,
        typer.Argument(
            help="Tasks: a JSON Lines file (one per line; - or omitted: stdin), a .parquet or .csv file (one per "
            "row), a directory saved by Hugging Face datasets, or hf:NAME."
        ),
    ] = "-",
    split: Annotated[
        str | None, typer.Option(help="The split of a Hugging Face dataset that has several \\[default: train].")
    ] = None,
    requests: Annotated[
        bool,
        typer.Option("--requests", help="Each line is a whole enqueue request {input, mode, config, …}, not a task."),
    ] = False,
    mode: Annotated[RolloutMode | None, typer.Option(help="The rollouts' mode.")] = None,
    resources_id: Annotated[
        str | None, typer.Option(help="Run with this resources snapshot (default: the latest at enqueue).")
    ] = None,
    max_attempts: Annotated[int | None, typer.Option(min=1, help="Attempts allowed, the first included.")] = None,
    timeout: Annotated[float | None, typer.Option(help="Seconds an attempt may run (timeout_seconds).")] = None,
    unresponsive: Annotated[
        float | None, typer.Option(help="Seconds an attempt may go without a heartbeat (unresponsive_seconds).")
    ] = None,
    retry_on: Annotated[
        list[RetryOn] | None, typer.Option(help="Retry an attempt that ends so (repeatable; retry_condition).")
    ] = None,
    metadata: Annotated[str | None, typer.Option(help="A JSON object stored with each rollout.")] = None,
    id_field: Annotated[
        str | None, typer.Option(help="Take each rollout's id from this field of the task: re-runs are idempotent.")
    ] = None,
    id_prefix: Annotated[str, typer.Option(help="Put this before each id taken with --id-field.")] = "",
    store: StoreTarget = DEFAULT_STORE,
    token: Token = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per rollout instead of its id.")] = False,
) -> None:
    """Put tasks in the queue, one rollout per line of FILE (JSON Lines; or per row of Parquet, CSV, a Hugging Face
    dataset); print each rollout's id."""
    if id_prefix and id_field is None:
        fail(WHAT, "--id-prefix applies to ids taken with --id-field: give --id-field too", 2)
    config = {
        "max_attempts": max_attempts,
        "timeout_seconds": timeout,
        "unresponsive_seconds": unresponsive,
        "retry_condition": [status.value for status in retry_on] if retry_on else None,
    }
    defaults = Defaults(
        fields=_option_fields(mode, resources_id, config, metadata), id_field=id_field, id_prefix=id_prefix
    )
    name = "<stdin>" if file == "-" else file
    if file == "-" and sys.stdin.isatty():
        errors.print("reading tasks from stdin, one JSON value per line (end with Ctrl-D)", highlight=False)
    try:
        result = read_requests(task_lines(file, split=split), name, defaults, whole_requests=requests)
    except TaskSourceError as exc:
        fail(WHAT, str(exc))
    for problem in result.problems:
        errors.print(problem, soft_wrap=True, highlight=False, markup=False)
    if result.problems:
        more = f" (stopped reading after {len(result.problems)})" if result.stopped else ""
        bad = f"{len(result.problems)} bad line{'s' if len(result.problems) > 1 else ''}{more}"
        fail(WHAT, f"{bad} in {name}; nothing was enqueued")
    if not result.requests:
        fail(WHAT, f"{name} holds no tasks (every line is empty)")

    async def work(target: LightningStore) -> Tally:
        await _check_resources(target, result.requests)
        return await _enqueue_batches(target, result.requests, as_json=as_json)

    typer.echo(with_store(store, token, WHAT, work).summary(), err=True)


def _option_fields(
    mode: str | None, resources_id: str | None, config: dict[str, Any], metadata: str | None
) -> dict[str, Any]:
    """The request fields the options set, checked (exit status 2 naming the option when one is bad)."""
    fields: dict[str, Any] = {}
    if mode is not None:
        fields["mode"] = mode
    if resources_id is not None:
        fields["resources_id"] = resources_id
    given = {key: value for key, value in config.items() if value is not None}
    try:
        RolloutConfig.model_validate(given)
    except ValidationError as exc:
        error = exc.errors()[0]
        option = _CONFIG_OPTIONS.get(str(error["loc"][0]), "config") if error["loc"] else "config"
        fail(WHAT, f"{option}: {error['msg']}", 2)
    if given:
        fields["config"] = given
    if metadata is not None:
        try:
            value = json.loads(metadata)
        except json.JSONDecodeError as exc:
            fail(WHAT, f"--metadata: not JSON ({exc.msg})", 2)
        if not isinstance(value, dict):
            fail(WHAT, "--metadata: must be a JSON object", 2)
        try:
            check_json(value, "--metadata")
        except InvalidRequestError as exc:
            fail(WHAT, exc.message, 2)
        fields["metadata"] = value
    try:
        EnqueueRolloutRequest.model_validate({"input": None, **fields})
    except ValidationError as exc:
        error = exc.errors()[0]
        fail(WHAT, f"--{str(error['loc'][0]).replace('_', '-')}: {error['msg'].removeprefix('Value error, ')}", 2)
    return fields


async def _check_resources(store: LightningStore, requests: Sequence[EnqueueRolloutRequest]) -> None:
    """Refuse resources ids that name no stored snapshot (the store itself would keep them, for a snapshot that
    may be written later; from the terminal an unknown id is far more likely a typo)."""
    for resources_id in sorted({r.resources_id for r in requests if r.resources_id is not None}):
        if await store.get_resources_by_id(resources_id) is None:
            fail(WHAT, f"no resources {resources_id!r} in the store (`store resources list` shows them)")


@dataclass
class Tally:
    """What an enqueue did: rollouts written, rollouts that already existed (left unchanged), and the modes and
    resources ids of the new ones."""

    new: int = 0
    existed: int = 0
    modes: set[str | None] = field(default_factory=set)
    resources: set[str | None] = field(default_factory=set)

    def summary(self) -> str:
        """``enqueued 8 rollouts (mode train, resources rs-…)``, saying how many already existed."""
        line = f"enqueued {self.new} rollout{'' if self.new == 1 else 's'}"
        if self.existed:
            line += f"; {self.existed} already existed and {'was' if self.existed == 1 else 'were'} left unchanged"
        if not self.new:
            return line
        modes = sorted(m for m in self.modes if m is not None)
        details = [f"mode{'s' if len(modes) > 1 else ''} {', '.join(modes)}" if modes else "no mode"]
        named = sorted(r for r in self.resources if r is not None)
        details.append(f"resources {', '.join(named)}" if named else "no resources")
        return f"{line} ({', '.join(details)})"


def _batches(requests: Sequence[EnqueueRolloutRequest]) -> Iterator[Sequence[EnqueueRolloutRequest]]:
    """Consecutive runs of ``requests``: at most :data:`BATCH` each, and at most :data:`BATCH_BYTES` of JSON
    unless one request alone is larger."""
    first = size = 0
    for index, request in enumerate(requests):
        length = len(request.model_dump_json(exclude_none=True))
        if index > first and (index - first >= BATCH or size + length > BATCH_BYTES):
            yield requests[first:index]
            first, size = index, 0
        size += length
    if first < len(requests):
        yield requests[first:]


async def _enqueue_batches(store: LightningStore, requests: Sequence[EnqueueRolloutRequest], *, as_json: bool) -> Tally:
    """Enqueue in batches, printing each batch on stdout as it is written. A rollout ``existed`` when a rollout of
    its id was in the store just before its batch was written (the store then returned it unchanged)."""
    tally = Tally()
    start = 0
    for batch in _batches(requests):
        ids = [r.rollout_id for r in batch if r.rollout_id is not None]
        before = {r.rollout_id for r in await store.query_rollouts(rollout_id_in=ids)} if ids else set()
        try:
            rollouts = await store.enqueue_many_rollouts(batch)
        except BaseException:
            if start:
                errors.print(
                    f"the rollouts of the first {start} tasks were enqueued before this failure (ids on stdout)"
                )
            raise
        start += len(batch)
        for rollout in rollouts:
            existed = rollout.rollout_id in before
            if existed:
                tally.existed += 1
            else:
                tally.new += 1
                tally.modes.add(rollout.mode)
                tally.resources.add(rollout.resources_id)
            if as_json:
                row = {
                    "rollout_id": rollout.rollout_id,
                    "status": rollout.status,
                    "mode": rollout.mode,
                    "resources_id": rollout.resources_id,
                    "existed": existed,
                }
                sys.stdout.write(json.dumps(row) + "\n")
            else:
                sys.stdout.write(rollout.rollout_id + "\n")
        sys.stdout.flush()
    return tally

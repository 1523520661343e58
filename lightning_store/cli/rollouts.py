"""``store rollouts``: list and inspect rollouts and attempts from the terminal, and show what an attempt did.

Every command reads through the store contract only, so it works the same against a ``store serve`` URL and a
database URL (``--store``, see :mod:`lightning_store.cli.common`), with a fixed number of store calls per
command: ``list`` makes two for a whole page (the rollouts with their latest attempts, then one span search for
those attempts' rewards and exceptions), ``show`` four, ``transcript`` four. Rewards and errors follow the rules
of :mod:`lightning_store.transcript`, which are the SQL views' (docs/reference/sql.md).
"""

from __future__ import annotations

import asyncio
import enum
import json
from typing import Annotated, Any, cast

import typer
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from lightning_store.cli.common import DEFAULT_STORE, AsJson, StoreTarget, Token, out, print_records, with_store
from lightning_store.cli.transcript import clock, print_json_lines, print_transcript
from lightning_store.contract import LightningStore
from lightning_store.errors import NotFoundError
from lightning_store.llm_calls import LlmCall
from lightning_store.models import Attempt, AttemptedRollout, PaginatedResult, Rollout, RolloutMode, RolloutStatus
from lightning_store.resources import ResourcesUpdate
from lightning_store.spans import Span
from lightning_store.transcript import OUTCOME_SPANS, Event, attempt_error, build_transcript, first_line, last_reward

rollouts = typer.Typer(help="List, inspect, retry, requeue and cancel rollouts.", no_args_is_help=True)

ERROR_WIDTH = 60
"""Characters of an error message shown in a table (``--json`` has it whole)."""
MIN_ERROR_WIDTH = 20
"""The narrowest the error column of a table gets before the table goes wider than the terminal."""


class StatusChoice(enum.StrEnum):
    """The rollout statuses (``lightning_store.models.ROLLOUT_STATUSES``) as choices of ``--status``."""

    queuing = "queuing"
    preparing = "preparing"
    running = "running"
    failed = "failed"
    succeeded = "succeeded"
    cancelled = "cancelled"
    requeuing = "requeuing"


class ModeChoice(enum.StrEnum):
    """The rollout modes (``lightning_store.models.ROLLOUT_MODES``) as choices of ``--mode``."""

    train = "train"
    val = "val"
    test = "test"


RolloutId = Annotated[str, typer.Argument(help="The rollout's id (as `store rollouts list` shows it).")]


@rollouts.command("list")
def list_rollouts(
    status: Annotated[
        list[StatusChoice] | None, typer.Option("--status", help="Only rollouts in this status (repeatable).")
    ] = None,
    mode: Annotated[ModeChoice | None, typer.Option(help="Only rollouts of this mode.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="Rollouts per page.")] = 20,
    offset: Annotated[int, typer.Option(min=0, help="Rollouts to skip (the newest first).")] = 0,
    target: StoreTarget = DEFAULT_STORE,
    token: Token = None,
    as_json: AsJson = False,
) -> None:
    """List rollouts, newest first: status, attempts, the latest attempt's reward and error, duration."""
    statuses = cast("list[RolloutStatus] | None", [s.value for s in status] if status else None)
    modes = cast("list[RolloutMode] | None", [mode.value] if mode else None)

    async def read(store: LightningStore) -> tuple[PaginatedResult[Rollout], list[Span]]:
        page = await store.query_rollouts(
            status_in=statuses,
            mode_in=modes,
            sort_by="start_time",
            sort_order="desc",
            limit=limit,
            offset=offset,
        )
        latest = {r.rollout_id: r.attempt.attempt_id for r in page if isinstance(r, AttemptedRollout)}
        if not latest:
            return page, []
        names = list(OUTCOME_SPANS)
        found = await store.search_spans(
            rollout_ids=list(latest), attempt_ids=list(latest.values()), names=names, limit=-1
        )
        return page, found.items

    page, spans = with_store(target, token, "cannot list rollouts", read)
    rows = [_summary(rollout, spans) for rollout in page]
    if as_json:
        print_records(rows, [], as_json=True)
        return
    if not rows:
        where = f" at offset {offset} ({page.total} in all)" if page.total else ""
        out.print(f"no rollouts{' match' if status or mode else ''}{where}", style="dim", highlight=False)
        return
    _table([_summary_cells(row) for row in rows])
    more = f"; --offset {offset + len(rows)} for more" if offset + len(rows) < page.total else ""
    line = f"{offset + 1}–{offset + len(rows)} of {page.total} rollouts, newest first{more}"
    out.print(line, style="dim", highlight=False)


def _summary(rollout: Rollout, spans: list[Span]) -> dict[str, Any]:
    """A row of ``list --json``: the rollout, its latest attempt, that attempt's last reward and its error."""
    attempt = rollout.attempt if isinstance(rollout, AttemptedRollout) else None
    own = [s for s in spans if attempt is not None and s.attempt_id == attempt.attempt_id]
    return {
        "rollout_id": rollout.rollout_id,
        "status": rollout.status,
        "mode": rollout.mode,
        "attempts": attempt.sequence_id if attempt else 0,
        "reward": last_reward(own),
        "duration_seconds": _duration(rollout.start_time, rollout.end_time),
        "error": attempt_error(attempt, own) if attempt else None,
        "start_time": rollout.start_time,
        "end_time": rollout.end_time,
        "latest_attempt_id": attempt.attempt_id if attempt else None,
        "latest_attempt_status": attempt.status if attempt else None,
        "resources_id": rollout.resources_id,
    }


def _summary_cells(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "rollout": row["rollout_id"],
        "status": row["status"],
        "mode": row["mode"],
        "attempts": row["attempts"],
        "reward": _number(row["reward"]),
        "duration (s)": _number(row["duration_seconds"], ".1f"),
        "started": clock(row["start_time"], short=True),
        "error": first_line(row["error"], ERROR_WIDTH),
    }


@rollouts.command()
def show(
    rollout_id: RolloutId,
    target: StoreTarget = DEFAULT_STORE,
    token: Token = None,
    as_json: AsJson = False,
) -> None:
    """Show a rollout (status, mode, input, resources, config, metadata, times) and a table of its attempts."""

    async def read(store: LightningStore) -> tuple[Rollout, list[Attempt], list[Span], ResourcesUpdate | None]:
        rollout = await _rollout(store, rollout_id)
        attempts, spans, resources = await asyncio.gather(
            store.query_attempts(rollout_id),
            store.search_spans(rollout_ids=[rollout_id], names=list(OUTCOME_SPANS), limit=-1),
            _resources(store, rollout.resources_id),
        )
        return rollout, attempts.items, spans.items, resources

    rollout, attempts, spans, resources = with_store(target, token, "cannot show rollout", read)
    record = rollout.model_dump(mode="json", exclude={"attempt"})
    record["duration_seconds"] = _duration(rollout.start_time, rollout.end_time)
    record["resources_version"] = resources.version if resources else None
    record["attempts"] = [_attempt_record(attempt, spans) for attempt in attempts]
    if as_json:
        print_records([record], [], as_json=True)
        return
    _print_rollout(record)


def _attempt_record(attempt: Attempt, spans: list[Span]) -> dict[str, Any]:
    own = [s for s in spans if s.attempt_id == attempt.attempt_id]
    record = attempt.model_dump(mode="json")
    record["duration_seconds"] = _duration(attempt.start_time, attempt.end_time)
    record["reward"] = last_reward(own)
    record["error"] = attempt_error(attempt, own)
    return record


def _print_rollout(record: dict[str, Any]) -> None:
    grid = Table.grid(padding=(0, 2))
    version = f" (version {record['resources_version']})" if record["resources_version"] is not None else ""
    ended = (
        f"{clock(record['end_time'])} ({_number(record['duration_seconds'], '.1f')} s)" if record["end_time"] else "-"
    )
    fields = {
        "rollout": record["rollout_id"],
        "status": record["status"],
        "mode": record["mode"] or "-",
        "input": json.dumps(record["input"], default=str, ensure_ascii=False),
        "resources": f"{record['resources_id'] or '-'}{version}",
        "config": json.dumps(record["config"]),
        "metadata": json.dumps(record["metadata"] or {}, default=str, ensure_ascii=False),
        "enqueued": clock(record["start_time"]),
        "ended": ended,
    }
    for name, value in fields.items():
        grid.add_row(Text(name, style="bold"), Text(str(value)))
    out.print(grid)
    if not record["attempts"]:
        out.print("no attempts yet", style="dim")
        return
    rows = [
        {
            "attempt": a["attempt_id"],
            "#": a["sequence_id"],
            "status": a["status"],
            "worker": a["worker_id"],
            "started": clock(a["start_time"], short=True),
            "duration (s)": _number(a["duration_seconds"], ".1f"),
            "reward": _number(a["reward"]),
            "error": a["error"],
        }
        for a in record["attempts"]
    ]
    out.print(Text("attempts", style="bold"))
    _table(rows)


@rollouts.command()
def transcript(
    rollout_id: RolloutId,
    attempt: Annotated[str | None, typer.Option(help="The attempt's id (default: the rollout's latest).")] = None,
    full: Annotated[
        bool, typer.Option("--full", help="Every prompt message of every call, not only new ones.")
    ] = False,
    tokens: Annotated[bool, typer.Option("--tokens", help="Add the LLM calls' prompt and response token ids.")] = False,
    target: StoreTarget = DEFAULT_STORE,
    token: Token = None,
    as_json: AsJson = False,
) -> None:
    """What the agent did in an attempt, in time order: LLM calls, tool calls, rewards, exceptions; then totals."""

    async def read(store: LightningStore) -> tuple[Rollout, Attempt, list[Span], list[LlmCall]]:
        rollout = await _rollout(store, rollout_id)
        attempts = (await store.query_attempts(rollout_id)).items
        chosen = [a for a in attempts if a.attempt_id == attempt] if attempt else attempts[-1:]
        if not chosen:
            raise NotFoundError(
                f"rollout '{rollout_id}' has no attempt '{attempt}'"
                if attempt
                else f"rollout '{rollout_id}' has no attempts yet (it is {rollout.status})"
            )
        spans, calls = await asyncio.gather(
            store.query_spans(rollout_id, chosen[0].attempt_id),
            store.query_llm_calls([rollout_id], attempt_id=chosen[0].attempt_id),
        )
        return rollout, chosen[0], spans.items, calls

    rollout, chosen, spans, calls = with_store(target, token, "cannot show transcript", read)
    header: Event = {"event": "attempt", "rollout_id": rollout.rollout_id, **chosen.model_dump(mode="json")}
    header["error"] = attempt_error(chosen, spans)
    events = build_transcript(spans, calls, full=full, tokens=tokens)
    if as_json:
        print_json_lines([header, *events])
        return
    print_transcript(header, events)


async def _rollout(store: LightningStore, rollout_id: str) -> Rollout:
    rollout = await store.get_rollout_by_id(rollout_id)
    if rollout is None:
        raise NotFoundError(f"no rollout '{rollout_id}'")
    return rollout


async def _resources(store: LightningStore, resources_id: str | None) -> ResourcesUpdate | None:
    return await store.get_resources_by_id(resources_id) if resources_id else None


def _table(rows: list[dict[str, Any]]) -> None:
    """``rows`` (at least one, each a dict with the same keys) as a borderless table. Every column but ``error``
    keeps its full width, so ids and times are never cut; ``error`` wraps in what the terminal has left, and the
    table goes wider than the terminal rather than leave it less than ``MIN_ERROR_WIDTH`` columns."""
    names = list(rows[0])
    cells = [["" if row[name] is None else str(row[name]) for name in names] for row in rows]
    widths = [max([len(name), *(len(line[i]) for line in cells)]) for i, name in enumerate(names)]
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, header_style="bold")
    for name, width in zip(names, widths, strict=True):
        if name == "error":
            table.add_column(name, overflow="fold")
        else:
            table.add_column(name, width=width, no_wrap=True)
    for line in cells:
        table.add_row(*(Text(cell) for cell in line))  # plain text: an error's "[…]" is not rich markup
    fixed = sum(w for n, w in zip(names, widths, strict=True) if n != "error") + 3 * (len(names) - 1)
    width = fixed + MIN_ERROR_WIDTH
    if width <= out.width:
        out.print(table)
        return
    terminal = out.is_terminal
    wide = Console(file=out.file, width=width, color_system="auto" if terminal else None, force_terminal=terminal)
    wide.print(table)


def _duration(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else end - start


def _number(value: float | None, spec: str = "g") -> str:
    return "" if value is None else format(value, spec)

"""``store rollouts retry|requeue|cancel``: act on rollouts from the terminal, by id or by status.

Each is ``update_rollout`` through the store contract (so a ``store serve`` URL and a database URL behave alike):

- ``retry`` puts failed (or cancelled) rollouts back in the queue under their own ids: the next runner to claim
  one makes its next attempt (the attempts made so far stay, and the retry policy's count is not reset: a rollout
  that used its ``max_attempts`` gets one more attempt per retry).
- ``requeue`` does the same for any rollout that is not being worked on, succeeded ones included (to run them
  again) and queued ones (to move them to the queue's tail, e.g. with ``--resources latest``).
- ``cancel`` takes rollouts out of the queue, or stops counting a running one: a cancelled rollout stays
  cancelled whatever its attempt then reports (``lifecycle.rollout_status_after_attempt``); its runner is not
  interrupted.

**Pinning.** A rollout runs with the resources snapshot it was enqueued with (its ``resources_id``), not the
latest one, so that a rollout's data is tied to the policy that made it. After ``store resources set-llm`` moved
the endpoint, rollouts enqueued before still use the old one; ``--resources latest`` (or an id) re-pins them as
they go back in the queue, and the commands say when the rollouts they touched are pinned to an older snapshot.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, cast

import typer

from lightning_store.cli.common import DEFAULT_STORE, AsJson, StoreTarget, Token, errors, fail, out, with_store
from lightning_store.cli.rollouts import ModeChoice, StatusChoice
from lightning_store.contract import LightningStore
from lightning_store.errors import NotFoundError
from lightning_store.models import Rollout, RolloutMode, RolloutStatus
from lightning_store.resources import ResourcesUpdate

CONCURRENT_UPDATES = 16
"""Updates in flight at once: a few thousand rollouts take seconds through a server, not minutes."""


@dataclass(frozen=True)
class Action:
    """What a command does: the statuses it acts on, those it acts on when no id or ``--status`` is given
    (empty: one of them is required), and the status it sets."""

    verb: str
    done: str
    acts_on: tuple[RolloutStatus, ...]
    default: tuple[RolloutStatus, ...]
    to: RolloutStatus


RETRY = Action("retry", "retried", ("failed", "cancelled"), ("failed",), "requeuing")
REQUEUE = Action("requeue", "requeued", ("queuing", "requeuing", "failed", "cancelled", "succeeded"), (), "requeuing")
CANCEL = Action(
    "cancel", "cancelled", ("queuing", "requeuing", "preparing", "running"), ("queuing", "requeuing"), "cancelled"
)

RolloutIds = Annotated[list[str] | None, typer.Argument(help="Rollout ids (none: choose them with --status).")]
Statuses = Annotated[list[StatusChoice] | None, typer.Option("--status", help="Act on every rollout in this status.")]
Mode = Annotated[ModeChoice | None, typer.Option(help="Only rollouts of this mode.")]
Resources = Annotated[
    str | None,
    typer.Option(
        "--resources",
        help="Re-pin to this resources snapshot: `latest` or an id (default: keep each rollout's own).",
    ),
]
DryRun = Annotated[bool, typer.Option("--dry-run", help="Say what would change; change nothing.")]


# retry, requeue and cancel repeat one signature on purpose: typer reads each command's options from its own; the
# work is ``_act``'s.
def retry(
    rollout_ids: RolloutIds = None,
    status: Statuses = None,
    mode: Mode = None,
    resources: Resources = None,
    dry_run: DryRun = False,
    target: StoreTarget = DEFAULT_STORE,
    token: Token = None,
    as_json: AsJson = False,
) -> None:
    """Put failed rollouts (default: every one; or those named, or --status cancelled) back in the queue."""
    _act(RETRY, rollout_ids, status, mode, resources, dry_run, target, token, as_json)


def requeue(
    rollout_ids: RolloutIds = None,
    status: Statuses = None,
    mode: Mode = None,
    resources: Resources = None,
    dry_run: DryRun = False,
    target: StoreTarget = DEFAULT_STORE,
    token: Token = None,
    as_json: AsJson = False,
) -> None:
    """Put rollouts that are not running (succeeded ones too) at the queue's tail, to run them again."""
    _act(REQUEUE, rollout_ids, status, mode, resources, dry_run, target, token, as_json)


def cancel(
    rollout_ids: RolloutIds = None,
    status: Statuses = None,
    mode: Mode = None,
    dry_run: DryRun = False,
    target: StoreTarget = DEFAULT_STORE,
    token: Token = None,
    as_json: AsJson = False,
) -> None:
    """Cancel queued rollouts (default: every one; or those named, or --status running); they stay cancelled."""
    _act(CANCEL, rollout_ids, status, mode, None, dry_run, target, token, as_json)


@dataclass
class Outcome:
    """What a command found and did: the rollouts it changed (as they were before), those it could not act on
    (id, reason), the snapshot it re-pinned to and the latest snapshot."""

    changed: list[Rollout]
    refused: list[tuple[str, str]]
    pinned_to: ResourcesUpdate | None
    latest: ResourcesUpdate | None


def _act(
    action: Action,
    rollout_ids: Sequence[str] | None,
    status: Sequence[StatusChoice] | None,
    mode: ModeChoice | None,
    resources: str | None,
    dry_run: bool,
    target: str,
    token: str | None,
    as_json: bool,
) -> None:
    statuses = cast("tuple[RolloutStatus, ...]", tuple(s.value for s in status or ()))
    if rollout_ids and statuses:
        fail(f"cannot {action.verb}", "name rollouts by id or by --status, not both", 2)
    if not rollout_ids and not statuses and not action.default:
        fail(f"cannot {action.verb}", "name the rollouts: give their ids or --status", 2)
    if wrong := [s for s in statuses if s not in action.acts_on]:
        allowed = ", ".join(action.acts_on)
        fail(f"cannot {action.verb}", f"--status {wrong[0]}: {action.verb} acts on {allowed}", 2)
    chosen = statuses or action.default
    modes = cast("list[RolloutMode] | None", [mode.value] if mode else None)

    async def work(store: LightningStore) -> Outcome:
        latest = await store.get_latest_resources()
        pinned_to = await _snapshot(store, resources, latest) if resources else None
        if rollout_ids:
            found = {r.rollout_id: r for r in (await store.query_rollouts(rollout_id_in=list(rollout_ids))).items}
            refused = [(r, "no such rollout") for r in dict.fromkeys(rollout_ids) if r not in found]
            picked = [found[r] for r in dict.fromkeys(rollout_ids) if r in found]
            refused += [(r.rollout_id, f"it is {r.status}") for r in picked if r.status not in action.acts_on]
            picked = [r for r in picked if r.status in action.acts_on]
            if mode is not None:
                refused += [(r.rollout_id, f"its mode is {r.mode}, not {mode.value}") for r in picked if r.mode != mode]
                picked = [r for r in picked if r.mode == mode]
        else:
            page = await store.query_rollouts(status_in=list(chosen), mode_in=modes, sort_by="start_time", limit=-1)
            picked, refused = list(page.items), []
        if not dry_run:
            await _update(store, action, picked, pinned_to)
        return Outcome(picked, refused, pinned_to, latest)

    outcome = with_store(target, token, f"cannot {action.verb}", work)
    _report(action, outcome, dry_run=dry_run, as_json=as_json)
    if outcome.refused:
        raise typer.Exit(1)


async def _snapshot(store: LightningStore, wanted: str, latest: ResourcesUpdate | None) -> ResourcesUpdate:
    if wanted == "latest":
        if latest is None:
            raise NotFoundError("the store has no resources yet (`store resources set-llm URL --model M` writes some)")
        return latest
    snapshot = await store.get_resources_by_id(wanted)
    if snapshot is None:
        raise NotFoundError(f"no resources snapshot '{wanted}' (`store resources list` shows them)")
    return snapshot


async def _update(
    store: LightningStore, action: Action, rollouts: list[Rollout], pinned_to: ResourcesUpdate | None
) -> None:
    gate = asyncio.Semaphore(CONCURRENT_UPDATES)

    async def one(rollout: Rollout) -> None:
        async with gate:
            if pinned_to is None:
                await store.update_rollout(rollout.rollout_id, status=action.to)
            else:
                await store.update_rollout(rollout.rollout_id, status=action.to, resources_id=pinned_to.resources_id)

    await asyncio.gather(*(one(r) for r in rollouts))


def _report(action: Action, outcome: Outcome, *, dry_run: bool, as_json: bool) -> None:
    """Stdout: one line per rollout changed (a JSON object with ``--json``) and a summary; stderr: the refused
    ones, and a hint when rollouts that go back in the queue are pinned to a snapshot older than the latest."""
    import json

    pin = outcome.pinned_to.resources_id if outcome.pinned_to else None
    for rollout in outcome.changed:
        record = {
            "rollout_id": rollout.rollout_id,
            "from": rollout.status,
            "to": action.to,
            "resources_id": pin or rollout.resources_id,
            "dry_run": dry_run,
        }
        if as_json:
            sys.stdout.write(json.dumps(record) + "\n")
        else:
            pinned = record["resources_id"] or ""
            out.print(f"{rollout.rollout_id}  {rollout.status} → {action.to}  {pinned}", highlight=False)
    for rollout_id, reason in outcome.refused:
        errors.print(f"cannot {action.verb} {rollout_id}: {reason}", markup=False, highlight=False)
    n = len(outcome.changed)
    what = f"would {action.verb}" if dry_run else action.done
    pinned = f", pinned to {pin}" if pin else ""
    if not as_json:
        out.print(f"{what} {n} rollout{'' if n == 1 else 's'}{pinned}", style="dim", highlight=False)
    latest = outcome.latest
    if pin is None and action.to == "requeuing" and latest is not None:
        behind = [r for r in outcome.changed if r.resources_id != latest.resources_id]
        if behind:
            older = ", ".join(sorted({r.resources_id or "none" for r in behind}))
            errors.print(
                f"note: {len(behind)} of them run with another resources snapshot ({older}) than the latest "
                f"({latest.resources_id}): pass --resources latest to re-pin them",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )

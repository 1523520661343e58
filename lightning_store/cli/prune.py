"""``store prune``: delete the spans (or whole rollouts) of finished rollouts by age and mode, beside a serving
store, in short transactions (:mod:`lightning_store.sql.prune_rules`; the rules in docs/reference/prune.md).

It works on the database (``--database-url``), as ``store sql`` does. Without ``--yes`` it shows what would go
and asks on a terminal; elsewhere (a script, cron) it refuses to delete without ``--yes``.
"""

from __future__ import annotations

import datetime
import enum
import json
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from sqlalchemy.engine import make_url

from lightning_store import aio
from lightning_store.cli.common import database_failure, errors, fail, out
from lightning_store.settings import load_settings
from lightning_store.sql.prune_rules import DEFAULT_BATCH_ROWS, DEFAULT_PAUSE, Rules, Summary, parse_duration

WHAT = "cannot prune"


class KeepMode(enum.StrEnum):
    train = "train"
    val = "val"
    test = "test"
    none = "none"


class PruneWhat(enum.StrEnum):
    spans = "spans"
    rollouts = "rollouts"


def prune(
    older_than: Annotated[
        str | None,
        typer.Option(help="Only rollouts that ended longer ago than this: 30d, 12h, 90m, 3600s, 2w."),
    ] = None,
    keep_mode: Annotated[
        list[KeepMode] | None,
        typer.Option(help="Keep rollouts of this mode (repeatable; none: rollouts without a mode); prune the rest."),
    ] = None,
    what: Annotated[
        PruneWhat,
        typer.Option(help="spans: their spans but rewards and metrics; rollouts: every row of them."),
    ] = PruneWhat.spans,
    include_runs: Annotated[
        bool, typer.Option("--include-runs", help="Prune finished training runs' own rollouts too (mode none).")
    ] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print what would go; delete nothing.")] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Delete without asking.")] = False,
    batch_size: Annotated[
        int, typer.Option(min=1, help="Rows deleted per transaction (spans; --what rollouts: every row).")
    ] = DEFAULT_BATCH_ROWS,
    pause: Annotated[float, typer.Option(min=0.0, help="Seconds to wait between transactions.")] = DEFAULT_PAUSE,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as one JSON object.")] = False,
    database_url: Annotated[
        str | None,
        typer.Option(
            "--database-url", help="SQLAlchemy URL; default $LIGHTNING_STORE_DATABASE_URL or ./lightning_store.db"
        ),
    ] = None,
) -> None:
    """Delete the spans (or whole rollouts) of finished rollouts older than an age or outside given modes."""
    seconds = None
    if older_than is not None:
        try:
            seconds = parse_duration(older_than)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="'--older-than'") from None
    if older_than is None and keep_mode is None:
        raise typer.BadParameter(
            "store prune selects by age, by mode or both: give --older-than, --keep-mode or both",
            param_hint="'--older-than' / '--keep-mode'",
        )
    keep = None if keep_mode is None else frozenset(m.value for m in keep_mode)
    try:
        rules = Rules(older_than=seconds, keep_modes=keep, what=what.value, include_runs=include_runs)
    except ValueError as exc:
        raise typer.BadParameter(str(exc).replace("keep_modes", "--keep-mode"), param_hint="'--keep-mode'") from None
    if not (dry_run or yes or sys.stdin.isatty()):
        fail(WHAT, "store prune deletes for good: pass --yes to delete (or --dry-run to see what would go)", 2)
    url = load_settings(database_url=database_url).database_url
    _check_sqlite_file(url)
    # One cutoff for the plan and the delete: what ended while the confirmation waited is not in either.
    now = time.time()

    if dry_run or not yes or errors.is_terminal:
        plan = _run(url, rules, None, now)
        if dry_run:
            _print(plan, as_json)
            return
        if not yes:
            _print(plan, as_json=False, file_errors=as_json)  # with --json, stdout holds the summary alone
            if plan.total.rollouts == 0:
                return
            typer.confirm("Delete them?", abort=True, err=True)
        total = plan.rows
    else:
        total = None
    summary = Summary(rules, dry_run=False)
    _run(url, rules, (summary, batch_size, pause, total), now)
    _print(summary, as_json)


def _run(url: str, rules: Rules, deleting: tuple[Summary, int, float, int | None] | None, now: float) -> Summary:
    """Plan (``deleting`` None) or prune into the given summary, batch size, pause, progress total; a database
    that cannot be reached or is not migrated ends the command with one line (exit 1), an interrupt with what
    went so far (exit 130)."""
    # Imported here: the SQL store's modules cost every `store` command a quarter second to load.
    from lightning_store.migrate import check_current
    from lightning_store.sql.engine import make_engine
    from lightning_store.sql.pruner import Pruner

    progress = None
    if deleting is not None and errors.is_terminal:
        unit = "rows" if rules.what == "rollouts" else "spans"
        progress = Progress(
            TextColumn("pruning"),
            BarColumn(),
            TextColumn(f"{{task.completed:>12,.0f}} {unit}"),
            TimeElapsedColumn(),
            console=errors,
            transient=True,
        )

    async def work() -> Summary:
        engine = make_engine(url, pool_size=2)
        try:
            await check_current(engine)
            pruner = Pruner(engine, rules, now=now)
            if deleting is None:
                return await pruner.plan()
            summary, batch_rows, pause, total = deleting
            if progress is None:
                return await pruner.prune(batch_rows=batch_rows, pause=pause, summary=summary)
            task = progress.add_task("pruning", total=total)
            return await pruner.prune(
                batch_rows=batch_rows,
                pause=pause,
                summary=summary,
                on_batch=lambda rows: progress.advance(task, rows),
            )
        finally:
            await engine.dispose()

    try:
        if progress is None:
            return aio.run(work())
        with progress:
            return aio.run(work())
    except KeyboardInterrupt:
        if deleting is None:
            raise typer.Exit(130) from None
        _print(deleting[0], as_json=False, file_errors=True)
        fail("interrupted", "the batch in progress was rolled back; what is listed above was deleted", 130)
    except Exception as exc:
        line = database_failure(exc, url)
        if line is None:
            raise
        fail(WHAT, line)


def _check_sqlite_file(url: str) -> None:
    """A SQLite URL naming no file is an error (connecting would create an empty database there)."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        path = Path(str(parsed.database))
        if not path.exists():
            fail(WHAT, f"no database at {path} (name one with --database-url or $LIGHTNING_STORE_DATABASE_URL)")


def _print(summary: Summary, as_json: bool, *, file_errors: bool = False) -> None:
    if as_json:
        sys.stdout.write(json.dumps(summary.as_json()) + "\n")
        return
    console = errors if file_errors else out

    def say(line: str) -> None:
        console.print(line, soft_wrap=True, highlight=False, markup=False)

    total = summary.total
    verb = "would delete" if summary.dry_run else "deleted"
    whole = summary.rules.what == "rollouts"
    if total.rollouts == 0:
        say("nothing to prune: no finished rollout matches" if summary.dry_run else "deleted nothing")
    elif whole:
        say(
            f"{verb} {_n(total.rollouts, 'rollout')}: {_n(total.attempts, 'attempt')}, {_n(total.spans, 'span')}, "
            f"{_n(total.llm_calls, 'LLM call')}"
        )
    else:
        say(
            f"{verb} {_n(total.spans, 'span')} of {_n(total.rollouts, 'rollout')} (the rollouts, their attempts, "
            "LLM calls, rewards and metrics stay)"
        )
    if total.rollouts:
        columns = ["mode", "rollouts", "attempts", "spans", "LLM calls"] if whole else ["mode", "rollouts", "spans"]
        table = Table(box=None)
        for i, name in enumerate(columns):
            table.add_column(name, justify="right" if i else "left")
        rows = [*sorted(summary.by_mode.items()), *([("total", total)] if len(summary.by_mode) > 1 else [])]
        for mode, t in rows:
            counts = [t.rollouts, t.attempts, t.spans, t.llm_calls] if whole else [t.rollouts, t.spans]
            table.add_row(mode, *(f"{n:,}" for n in counts))
        console.print(table)
        say(f"they ended between {_when(total.oldest_end_time)} and {_when(total.newest_end_time)}")
    if summary.runs.runs:
        runs = "; ".join(f"{r.algorithm} {r.rollout_id} since {_when(r.start_time)}" for r in summary.runs.runs)
        kept = _n(summary.protected, "matching rollout") if summary.dry_run else "the rollouts"
        say(f"kept {kept} of training runs in progress: {runs}")
    if not summary.dry_run:
        say(f"{_n(summary.batches, 'transaction')} in {summary.seconds:.1f} s")


def _n(count: int, word: str) -> str:
    return f"{count:,} {word}{'' if count == 1 else 's'}"


def _when(seconds: float | None) -> str:
    if seconds is None:
        return ""
    return datetime.datetime.fromtimestamp(seconds).strftime("%Y-%m-%d %H:%M:%S")

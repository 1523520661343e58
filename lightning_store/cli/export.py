"""``store export``: write the store's rollouts, attempts, LLM calls, spans and training steps to Parquet or JSON
Lines files in one directory (:mod:`lightning_store.export`; docs/reference/export.md).

Bad options end the command before the database is touched (exit status 2, naming the option); a database that
cannot be reached or is not migrated, with one line (exit status 1), as ``store sql`` does. On a terminal, stderr
shows the rows written per file as they are written; stdout gets one line per file at the end.
"""

from __future__ import annotations

import contextlib
import datetime
import enum
import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import sqlalchemy as sa
import typer
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from lightning_store import aio
from lightning_store.cli.common import DatabaseUrl, ReadStore, Token, database_failure, errors, fail
from lightning_store.errors import UnauthorizedError
from lightning_store.export.events import ExportStreamError, RemoteExportError
from lightning_store.export.queries import ExportFilterError, ExportFilters
from lightning_store.export.writers import (
    DEFAULT_BATCH_SIZE,
    PARQUET_HINT,
    ExportFormat,
    MissingExtraError,
    require_pyarrow,
)
from lightning_store.limits import MAX_INT32
from lightning_store.settings import load_settings

if TYPE_CHECKING:
    from lightning_store.export import ExportResult, FileResult

WHAT = "cannot export"


class Mode(enum.StrEnum):
    """A rollout mode (``--mode``; :data:`lightning_store.models.RolloutMode`)."""

    train = "train"
    val = "val"
    test = "test"


class FileName(enum.StrEnum):
    """The files of an export (``--what``)."""

    rollouts = "rollouts"
    attempts = "attempts"
    llm_calls = "llm_calls"
    spans = "spans"
    training_steps = "training_steps"


def export(
    out_dir: Annotated[
        Path, typer.Argument(metavar="OUT_DIR", help="Directory to write the files into (created when missing).")
    ],
    fmt: Annotated[
        ExportFormat, typer.Option("--format", help="parquet (needs the 'export' extra) or jsonl.")
    ] = ExportFormat.parquet,
    what: Annotated[
        list[FileName] | None, typer.Option("--what", help="Write only this file (repeatable); default: every file.")
    ] = None,
    mode: Annotated[list[Mode] | None, typer.Option(help="Only rollouts of this mode (repeatable).")] = None,
    since: Annotated[
        str | None,
        typer.Option(help="Only rollouts enqueued at or after this time: ISO 8601 (UTC unless it says) or epoch s."),
    ] = None,
    until: Annotated[str | None, typer.Option(help="Only rollouts enqueued before this time (as --since).")] = None,
    resources_id: Annotated[
        list[str] | None, typer.Option(help="Only rollouts run against this resources id (repeatable).")
    ] = None,
    resources_version: Annotated[
        list[int] | None,
        typer.Option(
            min=0,
            max=MAX_INT32,
            help="Only rollouts whose latest attempt ran on this resources version (repeatable).",
        ),
    ] = None,
    run: Annotated[
        str | None,
        typer.Option(help="Only this training or APO run (its run_id): its rollouts, those it enqueued, its steps."),
    ] = None,
    batch_size: Annotated[
        int | None,
        typer.Option(min=1, help=f"Rows read and written at a time; default {DEFAULT_BATCH_SIZE:,}, llm_calls 1,000."),
    ] = None,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Write into a directory that is not empty (replaces an export there).")
    ] = False,
    target: ReadStore = None,
    token: Token = None,
    database_url: DatabaseUrl = None,
) -> None:
    """Export rollouts, attempts, LLM calls (token ids, logprobs, rewards), spans and training steps to files."""
    # Imported here: the migrations' machinery is not needed by the other commands' start.
    from lightning_store.export import ExportDirectoryError, check_directory, export_store

    if fmt is ExportFormat.parquet:
        try:
            require_pyarrow()
        except MissingExtraError:
            typer.echo(PARQUET_HINT, err=True)
            raise typer.Exit(2) from None
    try:
        filters = ExportFilters(
            modes=tuple(dict.fromkeys(m.value for m in mode or ())),
            since=None if since is None else parse_time(since, "--since"),
            until=None if until is None else parse_time(until, "--until"),
            resources_ids=tuple(dict.fromkeys(resources_id or ())),
            resources_versions=tuple(dict.fromkeys(resources_version or ())),
            run=run,
        )
        check_directory(out_dir, overwrite=overwrite)
    except ExportFilterError as exc:
        raise typer.BadParameter(exc.message, param_hint=exc.option) from None
    except ExportDirectoryError as exc:
        fail(WHAT, str(exc), 2)
    from lightning_store.connect import is_server_url, store_target
    from lightning_store.errors import StoreError

    try:  # --store (or $LIGHTNING_STORE_URL) wins over --database-url, as for stats and sql
        url = store_target(target) if target else load_settings(database_url=database_url).database_url
    except StoreError as exc:
        raise typer.BadParameter(exc.message, param_hint="--store") from None
    display = _Display() if errors.is_terminal else None
    files = None if not what else [w.value for w in what]

    async def work() -> ExportResult:
        if is_server_url(url):
            return await _through_server(url, token, out_dir, fmt, filters, files, batch_size, overwrite, display)
        return await export_store(
            url,
            out_dir,
            fmt=fmt,
            filters=filters,
            what=files,
            batch_size=batch_size,
            overwrite=overwrite,
            progress=display,
        )

    try:
        if display is None:
            result = aio.run(work())
        else:
            with display.progress:
                result = aio.run(work())
    except ExportFilterError as exc:
        raise typer.BadParameter(exc.message, param_hint=exc.option) from None
    except ExportDirectoryError as exc:
        fail(WHAT, str(exc), 2)
    except (RemoteExportError, ExportStreamError) as exc:
        fail(WHAT, str(exc))
    except UnauthorizedError as exc:
        fail(WHAT, f"{url}: {exc}; pass --token or set LIGHTNING_STORE_TOKEN")
    except Exception as exc:
        line = database_failure(exc, url)
        if line is not None:
            fail(WHAT, line)
        if isinstance(exc, sa.exc.DBAPIError):
            fail(WHAT, str(exc.orig))
        raise
    for file in result.files:
        typer.echo(f"{file.path}: {file.rows:,} row{'' if file.rows == 1 else 's'}, {_size(file.bytes)}")


async def _through_server(
    url: str,
    token: str | None,
    out_dir: Path,
    fmt: ExportFormat,
    filters: ExportFilters,
    what: list[str] | None,
    batch_size: int | None,
    overwrite: bool,
    display: _Display | None,
) -> ExportResult:
    """The export of the server at ``url``: it reads its database and streams the rows, this process writes the
    files (:mod:`lightning_store.export.remote`)."""
    from lightning_store.export import prepare, write_export
    from lightning_store.export.remote import request_body, server_events

    prepare(out_dir, fmt, batch_size, overwrite=overwrite)
    events = server_events(url, token, request_body(filters, what, batch_size))
    async with contextlib.aclosing(events):
        return await write_export(events, out_dir, fmt, filters, batch_size, display, served_by=url)


def parse_time(value: str, option: str) -> float:
    """Seconds since the epoch from a number of them or an ISO 8601 time (UTC unless it names an offset)."""
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            moment = datetime.datetime.fromisoformat(text)
        except ValueError:
            raise ExportFilterError(
                option, f"{value!r} is neither an ISO 8601 time (2026-01-31T12:00:00Z) nor seconds since the epoch"
            ) from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=datetime.UTC)
        return moment.timestamp()
    if not math.isfinite(seconds):
        raise ExportFilterError(option, f"{value!r} is not a time")
    return seconds


def _size(count: int) -> str:
    size = float(count)
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{count} bytes" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{count} bytes"


class _Display:
    """Rows written per file, on stderr (a terminal)."""

    def __init__(self) -> None:
        self.progress = Progress(
            TextColumn("{task.description:<16}"),
            BarColumn(),
            TextColumn("{task.completed:>12,.0f} rows"),
            TimeElapsedColumn(),
            console=errors,
        )
        self._tasks: dict[str, TaskID] = {}

    def started(self, name: str) -> None:
        self._tasks[name] = self.progress.add_task(name, total=None)

    def advanced(self, name: str, rows: int) -> None:
        self.progress.update(self._tasks[name], completed=rows)

    def finished(self, result: FileResult) -> None:
        self.progress.update(self._tasks[result.name], completed=result.rows, total=max(result.rows, 1))

"""An export as a stream of events, read from the database: :func:`export_events` yields what ``store export``
writes (each file's start, its rows in batches of columns, its end), and the writer turns them into files
(:mod:`~lightning_store.export.exporter`). The same stream crosses HTTP as JSON lines (``POST /v1/export``,
:mod:`~lightning_store.export.remote`), so that ``store export --store http://…`` writes the same files from a
server's database as from a database it opens itself.

Each event line: ``{"event": "begin", "schema_revision", "database"}``, then per file ``{"event": "file", "file",
"batch_size"}``, ``{"event": "rows", "columns": [[…], …]}`` per batch (a column a list, in the file's column
order) and ``{"event": "end_file"}``, and last ``{"event": "done"}``; ``{"event": "error", "message"}`` ends a
stream that failed midway.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from lightning_store.export.queries import RUN_STEPS, ExportFilterError, ExportFilters, dataset_queries, run_rollout
from lightning_store.export.reader import begin_snapshot, end_snapshot, reader
from lightning_store.export.schema import DATASETS, convert
from lightning_store.export.writers import default_batch_size
from lightning_store.migrate import check_current, current_revision


@dataclass(frozen=True)
class Begin:
    """The export can be made: its filters select, the database is current. ``database``: its URL, no password."""

    schema_revision: str | None
    database: str


@dataclass(frozen=True)
class FileStart:
    name: str
    batch_size: int


@dataclass(frozen=True)
class Rows:
    """A batch of the current file's rows, as columns in its order."""

    columns: list[list[Any]]


@dataclass(frozen=True)
class FileEnd:
    pass


@dataclass(frozen=True)
class Done:
    pass


Event = Begin | FileStart | Rows | FileEnd | Done


class ExportStreamError(RuntimeError):
    """A stream of events that failed midway, or ended before :class:`Done`."""


class RemoteExportError(RuntimeError):
    """A server could not be reached or refused the export (not a filter's fault); the message says which
    (:mod:`~lightning_store.export.remote`)."""


def checked_names(what: Sequence[str] | None) -> list[str]:
    """The files ``what`` names, in the layout's order (default: all); ExportFilterError for an unknown one."""
    unknown = sorted(set(what or ()) - set(DATASETS))
    if unknown:
        raise ExportFilterError("--what", f"unknown file {unknown[0]!r} (one of {', '.join(DATASETS)})")
    return [name for name in DATASETS if what is None or not what or name in what]


async def export_events(
    database: str | URL | AsyncEngine,
    *,
    filters: ExportFilters,
    names: Sequence[str],
    batch_size: int | None = None,
) -> AsyncGenerator[Event]:
    """The export of ``names`` from ``database``, read in one snapshot, ``batch_size`` rows a batch (default per
    file). :class:`ExportFilterError`, ``DatabaseUnavailableError`` and ``DatabaseNotMigratedError`` are raised
    before :class:`Begin`, so that a consumer writes nothing for an export that cannot be made."""
    async with reader(database) as (engine, owned):
        await check_current(engine)
        revision = await current_revision(engine)
        shown = engine.url.render_as_string(hide_password=True)
        async with engine.connect() as conn:
            await begin_snapshot(conn, owned=owned)
            try:
                postgres = engine.dialect.name == "postgresql"
                run_rollouts = await resolve_run(conn, filters, postgres=postgres)
                queries = dataset_queries(filters, run_rollouts, postgres=postgres)
                yield Begin(revision, shown)
                for name in names:
                    size = batch_size or default_batch_size(name)
                    yield FileStart(name, size)
                    query = queries[name]
                    result = await conn.stream(query.statement().execution_options(yield_per=size), query.params)
                    async for batch in result.partitions(size):
                        yield Rows(convert(DATASETS[name], batch))
                    yield FileEnd()
                yield Done()
            finally:
                await end_snapshot(conn, owned=owned)


async def resolve_run(conn: AsyncConnection, filters: ExportFilters, *, postgres: bool) -> list[str]:
    """The training-run rollouts of ``filters.run`` (a resumed run has one per ``store train`` that wrote it; an
    APO run, one); raises :class:`ExportFilterError` when it names no run."""
    run = filters.run
    if run is None:
        return []
    rows = (await conn.execute(RUN_STEPS.statement(), {"run": run})).all()
    if any(row.run_id == run for row in rows):
        return sorted({run} | {row.training_rollout_id for row in rows if row.run_id == run})
    if rows:
        raise ExportFilterError("--run", f"{run!r} continues the run {rows[0].run_id!r}: pass --run {rows[0].run_id}")
    if (await conn.execute(run_rollout(postgres).statement(), {"run": run})).first() is not None:
        return [run]
    raise ExportFilterError("--run", f"no training or APO run {run!r} in the store (training_steps_v, apo_runs_v)")


def encode(event: Event) -> bytes:
    """One event as its JSON line."""
    if isinstance(event, Begin):
        record: dict[str, Any] = {"event": "begin", "schema_revision": event.schema_revision}
        record["database"] = event.database
    elif isinstance(event, FileStart):
        record = {"event": "file", "file": event.name, "batch_size": event.batch_size}
    elif isinstance(event, Rows):
        record = {"event": "rows", "columns": event.columns}
    elif isinstance(event, FileEnd):
        record = {"event": "end_file"}
    else:
        record = {"event": "done"}
    # NaN and infinities pass as JSON's common extension: a float column may hold them (a loss that diverged).
    return json.dumps(record, ensure_ascii=False, allow_nan=True).encode() + b"\n"


def error_line(message: str) -> bytes:
    return json.dumps({"event": "error", "message": message}, ensure_ascii=False).encode() + b"\n"


def decode(line: bytes | str) -> Event:
    """The event of one JSON line; :class:`ExportStreamError` for an error event or a line that is none."""
    try:
        record = json.loads(line)
        kind = record["event"]
        if kind == "begin":
            return Begin(record["schema_revision"], str(record["database"]))
        if kind == "file":
            name = record["file"]
            if name not in DATASETS:
                raise ValueError(f"unknown file {name!r}")
            return FileStart(name, int(record["batch_size"]))
        if kind == "rows":
            return Rows(list(record["columns"]))
        if kind == "end_file":
            return FileEnd()
        if kind == "done":
            return Done()
        message = str(record.get("message")) if kind == "error" else f"an unknown event {kind!r}"
    except (ValueError, KeyError, TypeError) as exc:
        message = f"a line that is not an export event ({exc})"
    raise ExportStreamError(message)

"""``store export``: the store's rollouts, attempts, LLM calls, spans and training steps as Parquet or JSON Lines
files (docs/reference/export.md), read from the documented views only, on a read-only connection.

Memory stays flat however large the store: each file's SELECT is streamed (a server-side cursor on Postgres,
a stepped statement on SQLite) ``batch_size`` rows at a time, and each batch is written before the next is read.
Every file is read within one snapshot (one read-only transaction), so the files agree with each other even
while the store is being written. Files are written under temporary names and renamed when complete;
``manifest.json`` is written last, so a directory with a manifest holds a whole export.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from lightning_store.export.queries import (
    RUN_STEPS,
    ExportFilterError,
    ExportFilters,
    Query,
    dataset_queries,
    run_rollout,
)
from lightning_store.export.reader import begin_snapshot, end_snapshot, reader
from lightning_store.export.schema import ARROW_TYPES, DATASETS, convert
from lightning_store.export.writers import (
    DEFAULT_BATCH_SIZE,
    ExportFormat,
    MissingExtraError,
    default_batch_size,
    open_sink,
    require_pyarrow,
)
from lightning_store.migrate import check_current, current_revision

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "MANIFEST",
    "ExportDirectoryError",
    "ExportFilterError",
    "ExportFilters",
    "ExportFormat",
    "ExportResult",
    "FileResult",
    "MissingExtraError",
    "export_store",
]

MANIFEST = "manifest.json"
LAYOUT_VERSION = 1
"""The version of the file layout (docs/reference/export.md); manifest.json records it."""


class ExportDirectoryError(ValueError):
    """The output directory cannot take the export (not empty without ``overwrite``, or not a directory)."""


@dataclass(frozen=True)
class FileResult:
    name: str
    path: Path
    rows: int
    bytes: int
    batch_size: int


@dataclass
class ExportResult:
    out_dir: Path
    format: ExportFormat
    files: list[FileResult] = field(default_factory=list)
    manifest: dict[str, Any] = field(default_factory=dict)


class ExportProgress(Protocol):
    """Told as files are written (the command's progress display)."""

    def started(self, name: str) -> None: ...

    def advanced(self, name: str, rows: int) -> None:
        """``rows``: how many rows of ``name`` are written so far."""

    def finished(self, result: FileResult) -> None: ...


def layout_files() -> set[str]:
    """Every name an export may write into its directory (both formats)."""
    return {f"{name}.{fmt.value}" for name in DATASETS for fmt in ExportFormat} | {MANIFEST}


def check_directory(out_dir: Path, *, overwrite: bool) -> None:
    """Raise :class:`ExportDirectoryError` unless ``out_dir`` is missing, an empty directory, or (``overwrite``)
    a directory."""
    if not out_dir.exists():
        return
    if not out_dir.is_dir():
        raise ExportDirectoryError(f"{out_dir} is not a directory")
    if not overwrite and any(out_dir.iterdir()):
        raise ExportDirectoryError(f"{out_dir} is not empty: pass --overwrite to replace the export files in it")


async def export_store(
    database: str | URL | AsyncEngine,
    out_dir: Path,
    *,
    fmt: ExportFormat | str = ExportFormat.parquet,
    filters: ExportFilters | None = None,
    what: Sequence[str] | None = None,
    batch_size: int | None = None,
    overwrite: bool = False,
    progress: ExportProgress | None = None,
) -> ExportResult:
    """Export the store at ``database`` (a URL, or an engine) into ``out_dir``: the files ``what`` names (default
    all, in the layout's order) in format ``fmt``, holding what ``filters`` select, streamed ``batch_size`` rows
    at a time (default :data:`DEFAULT_BATCH_SIZE`, and 1,000 for ``llm_calls``, whose rows are large).

    Raises :class:`MissingExtraError` (Parquet without pyarrow), :class:`ExportDirectoryError`,
    :class:`ExportFilterError` (an unknown ``--run``), :class:`DatabaseUnavailableError` and
    :class:`~lightning_store.migrate.DatabaseNotMigratedError` before anything is written.
    """
    fmt = ExportFormat(fmt)
    filters = filters or ExportFilters()
    names = [name for name in DATASETS if what is None or name in what]
    unknown = sorted(set(what or ()) - set(DATASETS))
    if unknown:
        raise ExportFilterError("--what", f"unknown file {unknown[0]!r} (one of {', '.join(DATASETS)})")
    if batch_size is not None and batch_size < 1:
        raise ExportFilterError("--batch-size", "must be at least 1")
    if fmt is ExportFormat.parquet:
        require_pyarrow()
    check_directory(out_dir, overwrite=overwrite)
    result = ExportResult(out_dir, fmt)
    async with reader(database) as (engine, owned):
        await check_current(engine)
        revision = await current_revision(engine)
        async with engine.connect() as conn:
            await begin_snapshot(conn, owned=owned)
            try:
                postgres = engine.dialect.name == "postgresql"
                run_rollouts = await resolve_run(conn, filters, postgres=postgres)
                queries = dataset_queries(filters, run_rollouts, postgres=postgres)
                _clear(out_dir)
                for name in names:
                    size = batch_size or default_batch_size(name)
                    file = await _write_file(conn, name, queries[name], out_dir, fmt, size, progress)
                    result.files.append(file)
            finally:
                await end_snapshot(conn, owned=owned)
        database_shown = engine.url.render_as_string(hide_password=True)
    result.manifest = _manifest(result, filters, batch_size, revision, database_shown)
    partial = out_dir / f".{MANIFEST}.partial"
    partial.write_text(json.dumps(result.manifest, indent=2) + "\n", encoding="utf-8")
    partial.replace(out_dir / MANIFEST)
    return result


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


async def _write_file(
    conn: AsyncConnection,
    name: str,
    query: Query,
    out_dir: Path,
    fmt: ExportFormat,
    batch_size: int,
    progress: ExportProgress | None,
) -> FileResult:
    dataset = DATASETS[name]
    final = out_dir / f"{name}.{fmt.value}"
    partial = out_dir / f".{final.name}.partial"
    if progress is not None:
        progress.started(name)
    rows = 0
    sink = open_sink(partial, dataset, fmt)
    try:
        result = await conn.stream(query.statement().execution_options(yield_per=batch_size), query.params)
        async for batch in result.partitions(batch_size):
            sink.write(convert(dataset, batch))
            rows += len(batch)
            if progress is not None:
                progress.advanced(name, rows)
        sink.close()
    except BaseException:
        with contextlib.suppress(Exception):
            sink.close()
        partial.unlink(missing_ok=True)
        raise
    partial.replace(final)
    written = FileResult(name, final, rows, final.stat().st_size, batch_size)
    if progress is not None:
        progress.finished(written)
    return written


def _clear(out_dir: Path) -> None:
    """Create ``out_dir``, or remove the files of an earlier export from it, and those a killed one left half
    written (others are left alone)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in [MANIFEST, *sorted(layout_files() - {MANIFEST})]:
        (out_dir / name).unlink(missing_ok=True)
        (out_dir / f".{name}.partial").unlink(missing_ok=True)


def _manifest(
    result: ExportResult, filters: ExportFilters, batch_size: int | None, revision: str | None, database: str
) -> dict[str, Any]:
    now = time.time()
    try:
        version = metadata.version("lightning-store")
    except metadata.PackageNotFoundError:
        version = "unknown"
    return {
        "layout": LAYOUT_VERSION,
        "format": result.format.value,
        "exported_at": datetime.datetime.fromtimestamp(now, datetime.UTC).isoformat(),
        "exported_at_seconds": now,
        "lightning_store_version": version,
        "schema_revision": revision,
        "database": database,
        "filters": filters.as_json(),
        "batch_size": batch_size,
        "files": {
            file.name: {
                "path": file.path.name,
                "rows": file.rows,
                "bytes": file.bytes,
                "batch_size": file.batch_size,
                "columns": {c.name: ARROW_TYPES[c.kind] for c in DATASETS[file.name].columns},
            }
            for file in result.files
        },
    }

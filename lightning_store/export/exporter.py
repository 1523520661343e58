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
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from lightning_store.export.events import (
    Begin,
    Done,
    Event,
    ExportStreamError,
    FileEnd,
    FileStart,
    Rows,
    checked_names,
    export_events,
)
from lightning_store.export.queries import ExportFilterError, ExportFilters
from lightning_store.export.schema import ARROW_TYPES, DATASETS
from lightning_store.export.writers import (
    DEFAULT_BATCH_SIZE,
    ExportFormat,
    MissingExtraError,
    open_sink,
    require_pyarrow,
)

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "MANIFEST",
    "ExportDirectoryError",
    "ExportFilterError",
    "ExportFilters",
    "ExportFormat",
    "ExportResult",
    "ExportStreamError",
    "FileResult",
    "MissingExtraError",
    "export_store",
    "prepare",
    "write_export",
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
    filters = filters or ExportFilters()
    names = checked_names(what)
    prepare(out_dir, fmt, batch_size, overwrite=overwrite)
    events = export_events(database, filters=filters, names=names, batch_size=batch_size)
    async with contextlib.aclosing(events):
        return await write_export(events, out_dir, fmt, filters, batch_size, progress)


def prepare(out_dir: Path, fmt: ExportFormat | str, batch_size: int | None, *, overwrite: bool) -> None:
    """What an export checks before it reads anything: the batch size, pyarrow for Parquet, the directory."""
    if batch_size is not None and batch_size < 1:
        raise ExportFilterError("--batch-size", "must be at least 1")
    if ExportFormat(fmt) is ExportFormat.parquet:
        require_pyarrow()
    check_directory(out_dir, overwrite=overwrite)


async def write_export(
    events: AsyncIterator[Event],
    out_dir: Path,
    fmt: ExportFormat | str,
    filters: ExportFilters,
    batch_size: int | None,
    progress: ExportProgress | None = None,
    *,
    served_by: str | None = None,
) -> ExportResult:
    """Write an export's events (:mod:`~lightning_store.export.events`, read here or sent by a server) into
    ``out_dir``: nothing is touched there before the first event (an export that cannot be made raises first),
    each file is written under a temporary name and renamed once complete, the manifest last. A stream that ends
    before :class:`Done` raises :class:`ExportStreamError` and leaves no manifest."""
    fmt = ExportFormat(fmt)
    result = ExportResult(out_dir, fmt)
    begin: Begin | None = None
    writing: _FileWriter | None = None
    try:
        async for event in events:
            if isinstance(event, Begin):
                begin = event
                _clear(out_dir)
            elif isinstance(event, FileStart):
                writing = _FileWriter(out_dir, event, fmt, progress)
            elif isinstance(event, Rows) and writing is not None:
                writing.write(event.columns)
            elif isinstance(event, FileEnd) and writing is not None:
                result.files.append(writing.finish())
                writing = None
            elif isinstance(event, Done) and begin is not None:
                break
            else:
                raise ExportStreamError(f"an export event out of order: {type(event).__name__}")
        else:
            raise ExportStreamError("the export ended before it was complete")
    finally:
        if writing is not None:
            writing.abandon()
    assert begin is not None
    result.manifest = _manifest(result, filters, batch_size, begin, served_by)
    partial = out_dir / f".{MANIFEST}.partial"
    partial.write_text(json.dumps(result.manifest, indent=2) + "\n", encoding="utf-8")
    partial.replace(out_dir / MANIFEST)
    return result


class _FileWriter:
    """One file of an export, written under a temporary name until :meth:`finish`."""

    def __init__(self, out_dir: Path, start: FileStart, fmt: ExportFormat, progress: ExportProgress | None) -> None:
        self.name, self.batch_size, self.progress = start.name, start.batch_size, progress
        self.final = out_dir / f"{start.name}.{fmt.value}"
        self.partial = out_dir / f".{self.final.name}.partial"
        self.rows = 0
        if progress is not None:
            progress.started(start.name)
        self.sink = open_sink(self.partial, DATASETS[start.name], fmt)

    def write(self, columns: list[list[Any]]) -> None:
        self.sink.write(columns)
        self.rows += len(columns[0]) if columns else 0
        if self.progress is not None:
            self.progress.advanced(self.name, self.rows)

    def finish(self) -> FileResult:
        self.sink.close()
        self.partial.replace(self.final)
        written = FileResult(self.name, self.final, self.rows, self.final.stat().st_size, self.batch_size)
        if self.progress is not None:
            self.progress.finished(written)
        return written

    def abandon(self) -> None:
        with contextlib.suppress(Exception):
            self.sink.close()
        self.partial.unlink(missing_ok=True)


def _clear(out_dir: Path) -> None:
    """Create ``out_dir``, or remove the files of an earlier export from it, and those a killed one left half
    written (others are left alone)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in [MANIFEST, *sorted(layout_files() - {MANIFEST})]:
        (out_dir / name).unlink(missing_ok=True)
        (out_dir / f".{name}.partial").unlink(missing_ok=True)


def _manifest(
    result: ExportResult, filters: ExportFilters, batch_size: int | None, begin: Begin, served_by: str | None
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
        "schema_revision": begin.schema_revision,
        "database": begin.database,
        **({"served_by": served_by} if served_by else {}),
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

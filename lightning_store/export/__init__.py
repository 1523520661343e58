"""Reading the store out, and its retention: ``store export`` writes the documented views as Parquet or JSON Lines
files (:mod:`~lightning_store.export.exporter`, with the queries, schema, writers and the reader of an export),
and ``store prune`` deletes what a retention rule no longer keeps (:mod:`~lightning_store.sql.prune_rules`, over
``sql/pruner.py`` and ``sql/retention.py``).

A room of the core's outer ring: it imports the contract, the models and the SQL store, never the command line
(``lightning_store.cli`` imports it) nor the outer packages. ``from lightning_store.export import export_store,
ExportFilters, …`` is the public path.
"""

from lightning_store.export.exporter import (
    DEFAULT_BATCH_SIZE,
    MANIFEST,
    ExportDirectoryError,
    ExportFilterError,
    ExportFilters,
    ExportFormat,
    ExportResult,
    ExportStreamError,
    FileResult,
    MissingExtraError,
    check_directory,
    export_store,
    prepare,
    write_export,
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
    "check_directory",
    "export_store",
    "prepare",
    "write_export",
]

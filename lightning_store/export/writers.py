"""The two file formats of ``store export``, written one batch at a time: nothing but the batch in hand is held.

Parquet goes through ``pyarrow.parquet.ParquetWriter`` with the file's fixed Arrow schema (one row group per
batch); JSON Lines is one JSON object per row, keys in the file's column order, JSON columns as text (the same
values as in Parquet, so that any JSON reader infers the same columns whatever the rows hold).
"""

from __future__ import annotations

import enum
import json
from pathlib import Path
from typing import Any, Protocol

from lightning_store.export.schema import Dataset, arrow_schema

DEFAULT_BATCH_SIZE = 10_000
"""Rows read from the database and written to the file at a time, unless the caller says."""
BATCH_SIZES = {"llm_calls": 1_000}
"""Files whose rows are larger by default: an LLM call carries its token ids and logprobs (a call of 250 tokens
is about 10 KiB of Python objects while its batch is converted)."""


def default_batch_size(name: str) -> int:
    """The batch size of the file ``name`` when the caller gives none."""
    return BATCH_SIZES.get(name, DEFAULT_BATCH_SIZE)


PARQUET_HINT = "store export needs the 'export' extra for Parquet: pip install 'lightning-store[export]'"


class ExportFormat(enum.StrEnum):
    """A file format; its value is the files' extension."""

    parquet = "parquet"
    jsonl = "jsonl"


class MissingExtraError(RuntimeError):
    """Parquet was asked for and pyarrow cannot be imported."""

    def __init__(self) -> None:
        super().__init__(PARQUET_HINT)


def require_pyarrow() -> None:
    """Raise :class:`MissingExtraError` unless pyarrow (and its Parquet module) can be imported."""
    try:
        import pyarrow.parquet  # noqa: F401
    except ImportError as exc:
        raise MissingExtraError() from exc


class Sink(Protocol):
    """One file being written."""

    def write(self, columns: list[list[Any]]) -> None:
        """Append one batch, given as columns (each a list of values, the dataset's column order)."""

    def close(self) -> None:
        """Finish the file (an export that wrote no row still gets a complete file)."""


class ParquetSink:
    def __init__(self, path: Path, dataset: Dataset, *, compression: str = "zstd") -> None:
        import pyarrow.parquet as pq

        self._schema = arrow_schema(dataset)
        self._writer = pq.ParquetWriter(str(path), self._schema, compression=compression)

    def write(self, columns: list[list[Any]]) -> None:
        import pyarrow as pa

        if not columns or not columns[0]:
            return
        arrays = [pa.array(values, type=f.type) for values, f in zip(columns, self._schema, strict=True)]
        self._writer.write_batch(pa.RecordBatch.from_arrays(arrays, schema=self._schema))

    def close(self) -> None:
        self._writer.close()


class JsonlSink:
    def __init__(self, path: Path, dataset: Dataset) -> None:
        self._names = dataset.names
        self._file = path.open("w", encoding="utf-8")

    def write(self, columns: list[list[Any]]) -> None:
        names = self._names
        lines = [
            json.dumps(dict(zip(names, row, strict=True)), ensure_ascii=False) for row in zip(*columns, strict=True)
        ]
        if lines:
            self._file.write("\n".join(lines) + "\n")

    def close(self) -> None:
        self._file.close()


def open_sink(path: Path, dataset: Dataset, fmt: ExportFormat) -> Sink:
    if fmt is ExportFormat.parquet:
        return ParquetSink(path, dataset)
    return JsonlSink(path, dataset)

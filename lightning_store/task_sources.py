"""Tasks from where people keep datasets: JSON Lines, Parquet, CSV, or a Hugging Face ``datasets`` dataset.

``store enqueue`` and ``store train --train/--val/--test`` read their tasks through :func:`task_lines`: one JSON
document per task, as bytes, so that every source goes through the same checks as a JSON Lines file (a bad row is
named as ``SOURCE:N``, N the line of a JSON Lines file, else the row counting from 1). Which source a name is:

- ``-`` or a path ending in ``.jsonl``, ``.json``, ``.ndjson`` (or any other suffix): JSON Lines, one task per line;
- ``….parquet`` (or ``.pq``): each row a task, an object of its columns (``pyarrow``, the ``export`` extra);
- ``….csv``: each row a task, an object of the header's columns; numbers, booleans and empty cells (null) are
  inferred per column by ``pyarrow``'s CSV reader, the rest is text;
- a directory written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``, or ``hf:NAME`` for
  ``datasets.load_dataset(NAME)`` (a Hub name, which needs the network or its cache, or a local directory of
  data files): each row a task (``datasets``, installed by the user). A split of a dataset with several is
  named by ``split`` or by a ``:SPLIT`` suffix (``hf:gsm8k:test``, ``data/gsm8k:test``); default ``train``.

Values that JSON cannot hold as they are become text (times and dates in ISO 8601, decimals) or are refused
(bytes): a task is what the agent receives, and it must reach the agent unchanged from the store.
"""

from __future__ import annotations

import datetime
import decimal
import json
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

JSON_LINES = "jsonl"
PARQUET = "parquet"
CSV = "csv"
HUGGING_FACE = "hf"
HF_PREFIX = "hf:"
DEFAULT_SPLIT = "train"


class TaskSourceError(ValueError):
    """A source that cannot be read at all (a missing file, a library not installed, an unknown split): one line."""


class UnreadableRow(str):
    """In place of a row's JSON: why the row cannot be a task (a value JSON cannot hold)."""

    __slots__ = ()


def _is_saved_dataset(path: Path) -> bool:
    return (path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists()


def split_suffix(source: str) -> tuple[str, str | None]:
    """``source`` without a ``:SPLIT`` suffix naming a split of a Hugging Face dataset, and that split (None when
    there is none): ``hf:NAME:SPLIT``, or ``DIRECTORY:SPLIT`` where the directory is a saved dataset."""
    if source.startswith(HF_PREFIX):
        name, _, split = source.removeprefix(HF_PREFIX).partition(":")
        return HF_PREFIX + name, split or None
    head, sep, split = source.rpartition(":")
    if sep and split and not Path(source).exists() and Path(head).is_dir() and _is_saved_dataset(Path(head)):
        return head, split
    return source, None


def source_format(source: str) -> str:
    """Which of :data:`JSON_LINES`, :data:`PARQUET`, :data:`CSV`, :data:`HUGGING_FACE` ``source`` names (without
    a split suffix)."""
    if source.startswith(HF_PREFIX):
        return HUGGING_FACE
    path = Path(source)
    if source != "-" and path.is_dir():
        if _is_saved_dataset(path):
            return HUGGING_FACE
        raise TaskSourceError(f"{source} is a directory, not a dataset saved with datasets' save_to_disk")
    suffix = path.suffix.lower()
    if suffix in (".parquet", ".pq"):
        return PARQUET
    if suffix == ".csv":
        return CSV
    return JSON_LINES


def task_lines(
    source: str, *, split: str | None = None, stdin: Iterable[bytes] | None = None
) -> Iterator[bytes | UnreadableRow]:
    """One JSON document per task of ``source`` (JSON Lines: its raw lines, blank ones included, so that numbers
    are line numbers). Raises :class:`TaskSourceError` when the source cannot be opened; a row whose values JSON
    cannot hold is an :class:`UnreadableRow` saying why (the reader reports it as a bad line)."""
    source, suffix = split_suffix(source)
    if suffix is not None:
        if split is not None and split != suffix:
            raise TaskSourceError(f"two splits named: :{suffix} and --split {split}")
        split = suffix
    kind = source_format(source)
    if kind == JSON_LINES:
        if source == "-":
            yield from stdin if stdin is not None else sys.stdin.buffer
            return
        try:
            stream = Path(source).open("rb")  # noqa: SIM115 - closed by the with below
        except OSError as exc:
            raise TaskSourceError(f"cannot read {source}: {exc.strerror or exc}") from None
        with stream:
            yield from stream
        return
    for row in _rows(source, kind, split):
        yield _json_line(row)


def _rows(source: str, kind: str, split: str | None) -> Iterator[dict[str, Any]]:
    if kind == HUGGING_FACE:
        yield from _dataset_rows(source, split)
        return
    if split is not None:
        raise TaskSourceError(f"a split applies to a Hugging Face dataset, not to {source}")
    if not Path(source).exists():
        raise TaskSourceError(f"cannot read {source}: No such file or directory")
    try:
        import pyarrow.csv
        import pyarrow.parquet
    except ImportError:
        raise TaskSourceError(f"reading {kind} files needs pyarrow: pip install 'lightning-store[export]'") from None
    try:
        table = pyarrow.parquet.read_table(source) if kind == PARQUET else pyarrow.csv.read_csv(source)
    except (OSError, pyarrow.ArrowException) as exc:
        raise TaskSourceError(f"cannot read {source} as {kind}: {exc}") from None
    for batch in table.to_batches():
        yield from batch.to_pylist()


def _dataset_rows(source: str, split: str | None) -> Iterator[dict[str, Any]]:
    try:
        import datasets
    except ImportError:
        raise TaskSourceError(f"reading {source} needs Hugging Face datasets: pip install datasets") from None
    try:
        if source.startswith(HF_PREFIX):
            loaded: Any = datasets.load_dataset(source.removeprefix(HF_PREFIX))
        else:
            loaded = datasets.load_from_disk(source)
    except Exception as exc:  # datasets raises many kinds (FileNotFoundError, DatasetNotFoundError, ConnectionError…)
        raise TaskSourceError(f"cannot load the dataset {source}: {type(exc).__name__}: {exc}") from None
    if isinstance(loaded, datasets.DatasetDict):
        wanted = split or DEFAULT_SPLIT
        if wanted not in loaded:
            raise TaskSourceError(f"{source} has no split {wanted!r} (it has: {', '.join(loaded)})")
        loaded = loaded[wanted]
    elif split is not None and split != DEFAULT_SPLIT:
        raise TaskSourceError(f"{source} is one dataset, without splits: the split {split!r} does not apply")
    yield from loaded


def _json_line(row: dict[str, Any]) -> bytes | UnreadableRow:
    try:
        return json.dumps(row, default=_json_value, allow_nan=True, ensure_ascii=False).encode()
    except (TypeError, ValueError) as exc:
        return UnreadableRow(str(exc))


def _json_value(value: Any) -> Any:
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal | datetime.timedelta):
        return str(value)
    # NumPy's scalars and arrays (a DataFrame's cells), recognised by their conversion methods: numpy is not
    # imported here. str and bytes have neither.
    for convert in ("tolist", "item"):
        method = getattr(value, convert, None)
        if callable(method) and not isinstance(value, bytes | str):
            return method()
    raise TypeError(f"a value of type {type(value).__name__} is not JSON ({str(value)[:40]!r})")


def read_tasks(source: str, *, split: str | None = None) -> list[Any]:
    """Every task of ``source`` as a JSON value (what :func:`task_lines` gives, parsed); a line that is not JSON
    or a row JSON cannot hold is a :class:`TaskSourceError` naming it (``SOURCE:N: reason``)."""
    tasks = []
    for number, line in enumerate(task_lines(source, split=split), start=1):
        if isinstance(line, UnreadableRow):
            raise TaskSourceError(f"{source}:{number}: {line}")
        if not line.strip():
            continue
        try:
            tasks.append(json.loads(line))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            reason = error.msg if isinstance(error, json.JSONDecodeError) else "not UTF-8"
            raise TaskSourceError(f"{source}:{number}: not JSON ({reason})") from None
    if not tasks:
        raise TaskSourceError(f"{source} holds no tasks")
    return tasks


def tasks_of(data: Any, *, what: str = "tasks") -> list[Any]:
    """The tasks of a dataset held in memory or named by a path: a list (or any iterable) of JSON values, a
    pandas ``DataFrame`` (each row an object of its columns), a Hugging Face ``Dataset`` (each row) or
    ``DatasetDict`` (its ``train`` split), or a ``str``/``Path`` read with :func:`read_tasks`. Each task goes
    through JSON as a stored one would (NumPy values become Python's, times ISO 8601 text), so that the agent
    receives what the store will return; a value JSON cannot hold is a :class:`TaskSourceError` naming ``what``
    and the row (from 1). The Python API's datasets (``Trainer.fit``) come through here."""
    if isinstance(data, str | Path):
        return read_tasks(str(data))
    if isinstance(data, dict) and not _is_dataset_dict(data):
        raise TaskSourceError(f"{what}: a dict is one task; give a list of tasks (or a DataFrame, a dataset, a path)")
    rows = _in_memory_rows(data, what)
    tasks = []
    for number, row in enumerate(rows, start=1):
        line = _json_line(row)
        if isinstance(line, UnreadableRow):
            raise TaskSourceError(f"{what}: row {number}: {line}")
        tasks.append(json.loads(line))
    if not tasks:
        raise TaskSourceError(f"{what}: no tasks")
    return tasks


def _is_dataset_dict(data: Any) -> bool:
    return type(data).__name__ in ("DatasetDict", "IterableDatasetDict")


def _in_memory_rows(data: Any, what: str) -> Iterable[Any]:
    if _is_dataset_dict(data):
        if DEFAULT_SPLIT not in data:
            raise TaskSourceError(f"{what}: the dataset has no split {DEFAULT_SPLIT!r} (it has: {', '.join(data)})")
        return _in_memory_rows(data[DEFAULT_SPLIT], what)
    to_dict = getattr(data, "to_dict", None)
    if callable(to_dict) and hasattr(data, "columns"):  # a pandas DataFrame
        rows: list[Any] = to_dict(orient="records")
        return rows
    if isinstance(data, Iterable) and not isinstance(data, bytes | bytearray):
        return data
    raise TaskSourceError(f"{what}: a {type(data).__name__} is not a dataset (give a list, a DataFrame, a path)")

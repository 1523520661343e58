"""The file layout of ``store export`` (docs/reference/export.md): which files an export holds, their columns
and the type of each, and how a value read from the store's views becomes a value of that type.

The layout is fixed: a file has the same columns with the same types whatever the store holds or the filters
select (an empty file included), so that readers never guess. The Arrow schemas are built only when Parquet is
written (pyarrow is the optional ``export`` extra); JSON Lines needs nothing beyond the standard library.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

Kind = Literal["string", "int", "float", "json", "ints", "floats"]
"""A column's type: text; a 64-bit integer; a double; JSON as its text; a list of 64-bit integers (token ids);
a list of doubles (log-probabilities). Every column may be null, except where docs/reference/export.md says."""

ARROW_TYPES: dict[Kind, str] = {
    "string": "string",
    "int": "int64",
    "float": "double",
    "json": "large_string",
    "ints": "list<int64>",
    "floats": "list<double>",
}
"""Each kind's Arrow type as Arrow writes it (the Parquet files' schema; manifest.json lists them)."""


@dataclass(frozen=True)
class Column:
    name: str
    kind: Kind


@dataclass(frozen=True)
class Dataset:
    """One file of an export: ``<name>.parquet`` or ``<name>.jsonl``."""

    name: str
    columns: tuple[Column, ...]

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]


def _columns(spec: str) -> tuple[Column, ...]:
    """``"a:string b:int …"`` as columns."""
    columns = []
    for item in spec.split():
        name, kind = item.split(":")
        if kind not in ARROW_TYPES:
            raise ValueError(f"unknown column kind {kind!r}")
        columns.append(Column(name, kind))
    return tuple(columns)


ROLLOUTS = Dataset(
    "rollouts",
    _columns(
        "rollout_id:string status:string mode:string resources_id:string resources_version:int step:int "
        "task_id:string start_time:float end_time:float duration_seconds:float num_attempts:int "
        "latest_attempt_id:string latest_attempt_status:string latest_worker_id:string reward:float "
        "input:json metadata:json config:json"
    ),
)
ATTEMPTS = Dataset(
    "attempts",
    _columns(
        "rollout_id:string attempt_id:string sequence_id:int status:string worker_id:string mode:string "
        "start_time:float end_time:float duration_seconds:float last_heartbeat_time:float reward:float metadata:json"
    ),
)
LLM_CALLS = Dataset(
    "llm_calls",
    _columns(
        "rollout_id:string attempt_id:string span_id:string sequence_id:int agent_name:string model:string "
        "resources_id:string resources_version:int llm_resource:string mode:string step:int task_id:string "
        "prompt_tokens:int response_tokens:int prompt_token_ids:ints response_token_ids:ints response_logprobs:floats "
        "finish_reason:string error:string start_time:float end_time:float latency_seconds:float "
        "usage_prompt_tokens:int usage_completion_tokens:int reward:float"
    ),
)
SPANS = Dataset(
    "spans",
    _columns(
        "rollout_id:string attempt_id:string attempt_sequence_id:int sequence_id:int name:string trace_id:string "
        "span_id:string parent_id:string status_code:string status_message:string start_time:float "
        "end_time:float duration_seconds:float attributes:json"
    ),
)
TRAINING_STEPS = Dataset(
    "training_steps",
    _columns(
        "run_id:string training_rollout_id:string algorithm:string step:int resources_version:int time:float "
        "reward_mean:float reward_std:float val_reward:float val_rollouts:float loss:float pg_loss:float kl:float "
        "entropy:float grad_norm:float trained_transitions:float step_seconds:float metrics:json"
    ),
)
DATASETS: dict[str, Dataset] = {d.name: d for d in (ROLLOUTS, ATTEMPTS, LLM_CALLS, SPANS, TRAINING_STEPS)}
"""Every file of the layout, in the order an export writes them."""


def _string(value: Any) -> str | None:
    return None if value is None else str(value)


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _json(value: Any) -> str | None:
    """JSON as text: the database's own text of it (SQLite returns what was stored, Postgres its JSONB rendering);
    a driver that returns it decoded gets it encoded again."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def _list(value: Any) -> list[Any] | None:
    if value is None:
        return None
    items = json.loads(value) if isinstance(value, str | bytes) else value
    if items is None:  # a JSON null (revisions before 0008 stored one for "no logprobs")
        return None
    if not isinstance(items, list):
        raise ValueError(f"expected a JSON array, got {type(items).__name__}")
    return items


def _ints(value: Any) -> list[int] | None:
    items = _list(value)
    return None if items is None else [int(v) for v in items]


def _floats(value: Any) -> list[float] | None:
    items = _list(value)
    return None if items is None else [float(v) for v in items]


CONVERTERS: dict[Kind, Callable[[Any], Any]] = {
    "string": _string,
    "int": _int,
    "float": _float,
    "json": _json,
    "ints": _ints,
    "floats": _floats,
}


def convert(dataset: Dataset, rows: Sequence[Sequence[Any]]) -> list[list[Any]]:
    """Rows as read from the database (columns in the dataset's order) as columns of file values."""
    if not rows:
        return [[] for _ in dataset.columns]
    return [
        [CONVERTERS[column.kind](value) for value in values]
        for column, values in zip(dataset.columns, zip(*rows, strict=True), strict=True)
    ]


def arrow_schema(dataset: Dataset) -> Any:
    """The dataset's Arrow schema (``pyarrow.Schema``); needs pyarrow."""
    import pyarrow as pa

    types: dict[Kind, Any] = {
        "string": pa.string(),
        "int": pa.int64(),
        "float": pa.float64(),
        "json": pa.large_string(),
        "ints": pa.list_(pa.int64()),
        "floats": pa.list_(pa.float64()),
    }
    return pa.schema([pa.field(c.name, types[c.kind], nullable=True) for c in dataset.columns])

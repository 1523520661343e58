"""What ``store export`` selects: its filters, and the one SELECT per file over the documented views
(docs/reference/sql.md), never the tables. The same statements run on SQLite and on Postgres; only the JSON
member read differs.

Filters select rollouts (``rollouts_v``); the attempts, LLM calls and spans exported are those of the selected
rollouts, and training steps are filtered by run and time only. Each statement orders its rows, so that an export
is the same however it is batched.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.sql.elements import TextClause

from lightning_store.export.schema import DATASETS, Dataset


class ExportFilterError(ValueError):
    """A filter that cannot select anything as given; ``option`` names the command-line option."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(f"{option}: {message}")
        self.option = option
        self.message = message


@dataclass(frozen=True)
class ExportFilters:
    """Which rollouts an export holds; every filter given must hold (an empty tuple or ``None``: no filter).

    ``since`` and ``until`` bound the rollout's ``start_time`` (its enqueue time, seconds since the epoch):
    ``since <= start_time < until``. ``resources_versions`` is the version ``rollouts_v`` reports (the one its
    latest attempt ran on). ``run`` is a run's id (``training_steps_v.run_id`` or ``apo_runs_v.run_id``).
    """

    modes: tuple[str, ...] = ()
    since: float | None = None
    until: float | None = None
    resources_ids: tuple[str, ...] = ()
    resources_versions: tuple[int, ...] = ()
    run: str | None = None

    def __post_init__(self) -> None:
        if self.since is not None and self.until is not None and self.since >= self.until:
            raise ExportFilterError("--until", "must be later than --since")

    @property
    def selects_rollouts(self) -> bool:
        """Whether some rollouts may be left out (else the export holds the whole store)."""
        return bool(
            self.modes
            or self.since is not None
            or self.until is not None
            or self.resources_ids
            or self.resources_versions
            or self.run is not None
        )

    def as_json(self) -> dict[str, Any]:
        """As manifest.json records them."""
        return {
            "mode": list(self.modes),
            "since": self.since,
            "until": self.until,
            "resources_id": list(self.resources_ids),
            "resources_version": list(self.resources_versions),
            "run": self.run,
        }


@dataclass(frozen=True)
class Query:
    sql: str
    params: dict[str, Any] = field(default_factory=dict)

    def statement(self) -> TextClause:
        """The statement, its list parameters expanded (``IN :modes``)."""
        expanding: list[sa.BindParameter[Any]] = [
            sa.bindparam(k, expanding=True) for k, v in self.params.items() if isinstance(v, list)
        ]
        return sa.text(self.sql).bindparams(*expanding)


def metadata_string(column: str, key: str, *, postgres: bool) -> str:
    """The member ``key`` of the JSON object ``column`` as text (NULL when missing)."""
    if postgres:
        return f"({column} ->> '{key}')"
    return f"json_extract({column}, '$.\"{key}\"')"


RUN_STEPS = Query(
    "SELECT DISTINCT run_id, training_rollout_id FROM training_steps_v "
    "WHERE run_id = :run OR training_rollout_id = :run"
)
"""The training-run rollouts of the run ``:run``, or of the run that a resumed part ``:run`` belongs to."""


def run_rollout(postgres: bool) -> Query:
    """Whether ``:run`` is a run's rollout (RL or APO) that has no step in ``training_steps_v``."""
    marker = metadata_string("r.metadata", "training_run", postgres=postgres)
    return Query(f"SELECT r.rollout_id FROM rollouts_v r WHERE r.rollout_id = :run AND {marker} IS NOT NULL")


def _rollout_conditions(filters: ExportFilters, run_rollouts: Sequence[str], postgres: bool) -> Query:
    """The conditions on ``rollouts_v r`` that select the rollouts (``AND``-ed, without ``WHERE``)."""
    conditions: list[str] = []
    params: dict[str, Any] = {}
    if filters.modes:
        conditions.append("r.mode IN :modes")
        params["modes"] = list(filters.modes)
    if filters.since is not None:
        conditions.append("r.start_time >= :since")
        params["since"] = filters.since
    if filters.until is not None:
        conditions.append("r.start_time < :until")
        params["until"] = filters.until
    if filters.resources_ids:
        conditions.append("r.resources_id IN :resources_ids")
        params["resources_ids"] = list(filters.resources_ids)
    if filters.resources_versions:
        conditions.append("r.resources_version IN :resources_versions")
        params["resources_versions"] = list(filters.resources_versions)
    if filters.run is not None:
        training_run = metadata_string("r.metadata", "training_run_id", postgres=postgres)
        apo_run = metadata_string("r.metadata", "apo_run", postgres=postgres)
        conditions.append(f"(r.rollout_id IN :run_rollouts OR {training_run} IN :run_rollouts OR {apo_run} = :run)")
        params["run_rollouts"] = list(run_rollouts)
        params["run"] = filters.run
    return Query(" AND ".join(conditions) or "1 = 1", params)


def _select(dataset: Dataset, alias: str, others: dict[str, str]) -> str:
    """The select list: each column from ``alias``, or from the expression ``others`` gives it."""
    return ", ".join(others.get(name, f"{alias}.{name}") + f" AS {name}" for name in dataset.names)


def dataset_queries(filters: ExportFilters, run_rollouts: Sequence[str], *, postgres: bool) -> dict[str, Query]:
    """One statement per file. ``run_rollouts``: the training-run rollouts of ``filters.run`` (see
    :func:`lightning_store.export.resolve_run`)."""
    where = _rollout_conditions(filters, run_rollouts, postgres)
    params = where.params
    selected = f"SELECT r.rollout_id FROM rollouts_v r WHERE {where.sql}"

    def of_selected(column: str) -> str:
        return f" WHERE {column} IN ({selected})" if filters.selects_rollouts else ""

    # The reward of each attempt: its last reward span (by sequence id; rewards_v holds the primary reward).
    rewards = f"""WITH rewards AS (
            SELECT w.attempt_id, w.reward,
                   row_number() OVER (PARTITION BY w.attempt_id ORDER BY w.sequence_id DESC, w.span_id DESC) AS newest
            FROM rewards_v w{of_selected("w.rollout_id")}
        )"""
    reward = {"reward": "x.reward"}
    steps: list[str] = []
    step_params: dict[str, Any] = {}
    for condition, name, value in (
        ("t.run_id = :run", "run", filters.run),
        ("t.time >= :since", "since", filters.since),
        ("t.time < :until", "until", filters.until),
    ):
        if value is not None:
            steps.append(condition)
            step_params[name] = value
    return {
        "rollouts": Query(
            f"""{rewards}
        SELECT {_select(DATASETS["rollouts"], "r", reward)}
        FROM rollouts_v r LEFT JOIN rewards x ON x.attempt_id = r.latest_attempt_id AND x.newest = 1
        WHERE {where.sql}
        ORDER BY r.start_time, r.rollout_id""",
            params,
        ),
        "attempts": Query(
            f"""{rewards}
        SELECT {_select(DATASETS["attempts"], "a", reward)}
        FROM attempts_v a LEFT JOIN rewards x ON x.attempt_id = a.attempt_id AND x.newest = 1
        {of_selected("a.rollout_id")}
        ORDER BY a.rollout_id, a.sequence_id""",
            params,
        ),
        "llm_calls": Query(
            f"""{rewards}
        SELECT {_select(DATASETS["llm_calls"], "c", reward | {"step": "r.step", "task_id": "r.task_id"})}
        FROM llm_calls_v c JOIN rollouts_v r ON r.rollout_id = c.rollout_id
        LEFT JOIN rewards x ON x.attempt_id = c.attempt_id AND x.newest = 1
        {of_selected("c.rollout_id")}
        ORDER BY c.rollout_id, c.sequence_id, c.attempt_id, c.span_id""",
            params,
        ),
        "spans": Query(
            f"""SELECT {_select(DATASETS["spans"], "s", {})}
        FROM spans_v s{of_selected("s.rollout_id")}
        ORDER BY s.rollout_id, s.sequence_id, s.attempt_id, s.span_id""",
            params,
        ),
        "training_steps": Query(
            f"""SELECT {_select(DATASETS["training_steps"], "t", {})}
        FROM training_steps_v t{" WHERE " + " AND ".join(steps) if steps else ""}
        ORDER BY t.run_id, t.step""",
            step_params,
        ),
    }

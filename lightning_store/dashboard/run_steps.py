"""A training run's steps (``training_steps_v``) as the run page shows them: the step table and the metric charts.

Contract: a step's value of a metric is its ``training_steps_v`` column where the view has one, else the member of
its ``metrics`` JSON; a chart's latest value of a metric is the value at the highest step that has one. Charts use
the ``data-chart`` convention of ``dashboard.js`` (x: the step; a step without the metric is a gap).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from lightning_store.dashboard.prompt_diff import finite, json_value
from lightning_store.dashboard.reader import Reader

METRIC_COLUMNS = (
    "reward_mean",
    "reward_std",
    "val_reward",
    "val_rollouts",
    "loss",
    "pg_loss",
    "kl",
    "entropy",
    "grad_norm",
    "trained_transitions",
    "step_seconds",
)
"""The metrics ``training_steps_v`` has columns for (docs/reference/sql.md). Its migration lists them again:
a migration is frozen SQL and imports nothing of the package."""
STEP_COLUMNS = ("step", "training_rollout_id", "resources_version", "time", *METRIC_COLUMNS)

RL_CHARTS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("reward", "Training reward (mean ± std)", ("reward_mean", "reward_std")),
    ("val", "Validation reward", ("val_reward",)),
    ("kl", "KL to the reference policy", ("kl", "anchor_kl")),
    ("loss", "Loss", ("loss", "pg_loss", "value_loss")),
    ("entropy", "Entropy (nats)", ("entropy",)),
    ("staleness", "Staleness (versions)", ("staleness_max", "stale_dropped")),
    ("step_time", "Step time (s)", ("step_seconds", "collect_seconds", "train_seconds")),
    ("grad_norm", "Gradient norm", ("grad_norm",)),
)
"""(name, title, metrics) of an RL run's charts (docs/reference/metrics.md); a chart none of whose metrics was
logged is left out."""
APO_CHARTS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("val", "Validation score", ("val_reward", "val_best", "val_mean")),
    (
        "candidates",
        "Candidates so far",
        ("candidates_proposed", "candidates_accepted", "candidates_rejected", "candidates_invalid"),
    ),
    ("pool", "Pool and Pareto frontier", ("pool_size", "frontier_size")),
    ("rollouts", "Rollouts spent", ("rollouts_spent",)),
    ("optimizer", "Optimizer calls", ("optimizer_calls",)),
    ("tokens", "Optimizer tokens", ("optimizer_tokens",)),
    ("round_time", "Round time (s)", ("round_seconds",)),
)
"""An APO run's per-round charts (docs/reference/apo.md, "Metrics per round")."""
APO_COLUMNS = (
    "val_reward",
    "val_mean",
    "candidates_proposed",
    "candidates_accepted",
    "candidates_rejected",
    "candidates_invalid",
    "pool_size",
    "frontier_size",
    "rollouts_spent",
    "optimizer_calls",
    "optimizer_tokens",
    "round_seconds",
)
"""The metrics an APO run's round table shows as columns (every metric is in its details cell)."""


@dataclass
class Chart:
    name: str
    title: str
    data: dict[str, Any]
    """``{"x": steps, "series": {label: values}, "x_label": ...}`` for ``dashboard.js``."""
    latest: list[tuple[str, float]] = field(default_factory=list)
    """(metric, its value at the highest step that has one), for each metric drawn."""


@dataclass
class Steps:
    rows: list[dict[str, Any]]
    """One per step, ascending: the view's columns, and ``metric_values`` (every metric: columns over JSON members)."""
    columns: list[str]
    """The columns the step table shows (the view's, less those no step has; for APO, its round metrics)."""
    charts: list[Chart]
    rollout_ids: list[str]
    """The training-run rollouts that wrote the run's steps, in order of their first step."""


async def read_steps(reader: Reader, run_id: str, *, apo: bool) -> Steps:
    """The steps of run ``run_id`` (of algorithm ``apo`` only when ``apo``), ascending."""
    only_apo = " AND algorithm = 'apo'" if apo else ""
    rows = await reader.rows(
        f"SELECT algorithm, {', '.join(STEP_COLUMNS)}, metrics FROM training_steps_v WHERE run_id = :run_id{only_apo} "
        "ORDER BY step",
        {"run_id": run_id},
    )
    for row in rows:
        members = json_value(row.pop("metrics"))
        values = {k: v for k, v in members.items() if finite(v) is not None} if isinstance(members, dict) else {}
        values.update({c: row[c] for c in METRIC_COLUMNS if row[c] is not None})
        row["metric_values"] = values
    if apo:
        columns = ["step", "training_rollout_id", "time", *APO_COLUMNS]
    else:
        columns = [c for c in STEP_COLUMNS if c == "step" or any(r[c] is not None for r in rows)]
    specs = APO_CHARTS if apo else RL_CHARTS
    x_label = "round" if apo else "step"
    charts = [c for name, title, metrics in specs if (c := _chart(rows, name, title, metrics, x_label)) is not None]
    rollout_ids = list(dict.fromkeys(str(r["training_rollout_id"]) for r in rows))
    return Steps(rows, columns, charts, rollout_ids)


def _chart(rows: Sequence[dict[str, Any]], name: str, title: str, metrics: Sequence[str], x_label: str) -> Chart | None:
    present = [m for m in metrics if any(finite(r["metric_values"].get(m)) is not None for r in rows)]
    if not present:
        return None
    series = {m: [finite(r["metric_values"].get(m)) for r in rows] for m in present}
    if name == "reward" and "reward_mean" in series and "reward_std" in series:
        means, stds = series.pop("reward_mean"), series.pop("reward_std")
        band = list(zip(means, stds, strict=True))
        series = {
            "reward_mean": means,
            "mean − std": [m - s if m is not None and s is not None else None for m, s in band],
            "mean + std": [m + s if m is not None and s is not None else None for m, s in band],
        }
    latest = [(m, value) for m in present if (value := _last(rows, m)) is not None]
    data = {"x": [r["step"] for r in rows], "series": series, "x_label": x_label}
    return Chart(name, title, data, latest)


def _last(rows: Sequence[dict[str, Any]], metric: str) -> float | None:
    for row in reversed(rows):
        value = finite(row["metric_values"].get(metric))
        if value is not None:
            return value
    return None

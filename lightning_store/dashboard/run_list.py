"""Every training run of the store in one list: RL runs from ``training_steps_v`` and APO runs from ``apo_runs_v``.

Contract: an RL run is a ``run_id`` of ``training_steps_v`` that is not an APO run; a training-run rollout (one whose
``metadata.training_run`` is set) that has written no step yet is listed as a run of its own, without steps; an APO
run is a row of ``apo_runs_v`` (with or without rounds). Runs are listed newest first, by their rollout's start.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from lightning_store.dashboard.reader import Reader

APO = "apo"


async def training_rollouts(
    reader: Reader, where: str = "", params: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """The training-run rollouts (``rollouts_v`` rows whose ``metadata.training_run`` is set), with that value as
    ``algorithm``; ``where`` adds a condition."""
    algorithm = reader.json_text("metadata", "training_run_key")
    return await reader.rows(
        f"SELECT rollout_id, status, start_time, end_time, {algorithm} AS algorithm FROM rollouts_v "
        f"WHERE {algorithm} IS NOT NULL{where} ORDER BY start_time, rollout_id",
        {"training_run_key": "training_run", **(params or {})},
    )


async def list_runs(reader: Reader) -> list[dict[str, Any]]:
    """One dict per run (``kind`` ``rl`` or ``apo``), newest first."""
    steps = await reader.rows(
        "SELECT run_id, training_rollout_id, algorithm, step, time, reward_mean, val_reward "
        "FROM training_steps_v ORDER BY step"
    )
    rollouts = {r["rollout_id"]: r for r in await training_rollouts(reader)}
    apo_rows = await reader.rows(
        "SELECT run_id, status, search, best_candidate, seed_val_score, best_val_score, seed_test_score, "
        "best_test_score, max_rollouts, rollouts_spent, rollouts_in_store, max_optimizer_calls, "
        "optimizer_calls_spent, optimizer_calls_in_store, optimizer_tokens_spent, optimizer_tokens_in_store, "
        "max_optimizer_tokens FROM apo_runs_v"
    )
    apo_ids = {row["run_id"] for row in apo_rows}
    by_run: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for step in steps:
        by_run[step["run_id"]].append(step)
    runs: list[dict[str, Any]] = []
    seen: set[str] = set(apo_ids)
    for run_id, rows in by_run.items():
        if run_id in apo_ids:
            continue
        members = list(dict.fromkeys([run_id, *(r["training_rollout_id"] for r in rows)]))
        seen.update(members)
        runs.append(_rl_entry(run_id, rows, [rollouts[m] for m in members if m in rollouts]))
    for rollout_id, rollout in rollouts.items():
        if rollout_id not in seen and rollout["algorithm"] != APO:
            runs.append(_rl_entry(rollout_id, [], [rollout]))
    for row in apo_rows:
        rounds = [s for s in by_run.get(row["run_id"], []) if s["algorithm"] == APO]
        rollout = rollouts.get(row["run_id"], {})
        runs.append(
            {
                **row,
                "kind": "apo",
                "algorithm": APO,
                "steps": len(rounds),
                "last_step": rounds[-1]["step"] if rounds else None,
                "start_time": rollout.get("start_time"),
                "last_time": max((s["time"] for s in rounds), default=rollout.get("end_time")),
            }
        )
    runs.sort(key=lambda r: (r["start_time"] is not None, r["start_time"] or 0.0, r["run_id"]), reverse=True)
    return runs


def _rl_entry(run_id: str, rows: list[dict[str, Any]], rollouts: list[dict[str, Any]]) -> dict[str, Any]:
    """An RL run's line: ``rows`` its steps (ascending), ``rollouts`` its training-run rollouts."""
    own = next((r for r in rollouts if r["rollout_id"] == run_id), None)
    newest = max(rollouts, key=lambda r: (r["start_time"] or 0.0, r["rollout_id"]), default=None)
    rewards = [r["reward_mean"] for r in rows if r["reward_mean"] is not None]
    vals = [r["val_reward"] for r in rows if r["val_reward"] is not None]
    return {
        "kind": "rl",
        "run_id": run_id,
        "algorithm": (own or {}).get("algorithm") or (rows[0]["algorithm"] if rows else None),
        "steps": len(rows),
        "last_step": rows[-1]["step"] if rows else None,
        "first_time": rows[0]["time"] if rows else None,
        "last_time": max((r["time"] for r in rows), default=None),
        "last_reward_mean": rewards[-1] if rewards else None,
        "best_val_reward": max(vals) if vals else None,
        "status": newest["status"] if newest else None,
        "rollouts": len(rollouts),
        "start_time": (own or newest or {}).get("start_time"),
    }

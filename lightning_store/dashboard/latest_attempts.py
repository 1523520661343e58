"""The columns of the rollouts list that read each listed rollout's latest attempt: how long it ran (``ran``:
from the attempt's start, not from the enqueue, to its end, or to now while it runs) and why it did not succeed
(``error``), each read for a whole page at once.

The error's rule is ``lightning_store.transcript.attempt_error``'s (what ``store rollouts list`` shows), read with two
statements for a whole page instead of the spans of every attempt: the last ``agentlightning.exception`` span's
status message (what the runner records when the agent raises, ``ValueError: …``), else the reason the attempt
was released with (``released: worker stopped``), else what its status says (timed out, stopped sending
heartbeats). Rollouts whose latest attempt succeeded or still runs have none.
"""

from __future__ import annotations

import json
from typing import Any

from lightning_store import semconv
from lightning_store.dashboard.reader import Reader, bound_list
from lightning_store.transcript import QUIET_STATUSES

FAILED_STATUSES = ("failed", "timeout", "unresponsive")


async def latest_errors(reader: Reader, rows: list[dict[str, Any]]) -> dict[str, str]:
    """``{rollout_id: error}`` for the rows (``rollouts_v`` rows) whose latest attempt failed in some way."""
    failing = {r["latest_attempt_id"]: r for r in rows if r.get("latest_attempt_status") in FAILED_STATUSES}
    if not failing:
        return {}
    listed, names = bound_list("a", failing)
    spans = await reader.rows(
        f"SELECT attempt_id, sequence_id, status_message FROM spans_v WHERE name = :exception "
        f"AND attempt_id IN ({listed}) ORDER BY sequence_id",
        {**names, "exception": semconv.EXCEPTION},
    )
    attempts = await reader.rows(f"SELECT attempt_id, metadata FROM attempts_v WHERE attempt_id IN ({listed})", names)
    raised = {s["attempt_id"]: s["status_message"] for s in spans if s["status_message"]}  # the last one wins
    released = {a["attempt_id"]: _released(a["metadata"]) for a in attempts}
    errors = {}
    for attempt_id, row in failing.items():
        error = raised.get(attempt_id) or released.get(attempt_id) or QUIET_STATUSES.get(row["latest_attempt_status"])
        if error:
            errors[row["rollout_id"]] = error
    return errors


def _released(metadata: Any) -> str | None:
    value = json.loads(metadata) if isinstance(metadata, str) else metadata
    reason = value.get("released") if isinstance(value, dict) else None
    return f"released: {reason}" if reason else None


async def latest_runs(reader: Reader, rows: list[dict[str, Any]], now: float) -> dict[str, float]:
    """``{rollout_id: seconds}``: how long each row's latest attempt ran, from its start to its end (to ``now``
    while it runs); rollouts never claimed have none."""
    latest = {r["latest_attempt_id"]: r["rollout_id"] for r in rows if r.get("latest_attempt_id")}
    if not latest:
        return {}
    listed, names = bound_list("a", latest)
    attempts = await reader.rows(
        f"SELECT attempt_id, start_time, end_time FROM attempts_v WHERE attempt_id IN ({listed})", names
    )
    return {
        latest[a["attempt_id"]]: max(0.0, (a["end_time"] if a["end_time"] is not None else now) - a["start_time"])
        for a in attempts
        if a["start_time"] is not None
    }

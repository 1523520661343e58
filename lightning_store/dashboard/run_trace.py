"""What a run's own rollouts hold: the training-run rollouts themselves (a resumed RL run has several), their LLM
calls (APO's optimizer calls, ``apo.critique`` and ``apo.edit``) and their spans (step metrics, APO candidates and
the result), each to be linked to its place on the rollout page.

Contract: at most :data:`LIMIT` calls and :data:`LIMIT` spans are read (oldest first); ``more_calls`` and
``more_spans`` say whether there were more.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lightning_store.dashboard.prompt_diff import in_list
from lightning_store.dashboard.reader import Reader

LIMIT = 500


async def run_trace(reader: Reader, rollout_ids: Sequence[str]) -> dict[str, Any]:
    """``rollouts`` (``rollouts_v`` rows, oldest first), ``calls`` (``llm_calls_v``), ``spans`` (``spans_v``, with
    the span's ``step``, ``candidate``, ``candidate_status`` and ``summary`` read from its attributes)."""
    ids, params = in_list("rollout", rollout_ids)
    rollouts = await reader.rows(
        "SELECT rollout_id, status, start_time, end_time, duration_seconds, num_attempts, latest_attempt_status "
        f"FROM rollouts_v WHERE rollout_id IN {ids} ORDER BY start_time, rollout_id",
        params,
    )
    calls = await reader.rows(
        "SELECT rollout_id, span_id, sequence_id, agent_name, model, prompt_tokens, response_tokens, "
        "usage_prompt_tokens, usage_completion_tokens, finish_reason, start_time, latency_seconds "
        f"FROM llm_calls_v WHERE rollout_id IN {ids} ORDER BY start_time, rollout_id, sequence_id LIMIT {LIMIT + 1}",
        params,
    )
    step = reader.json_text("attributes", "step_key")
    candidate = reader.json_text("attributes", "candidate_key")
    status = reader.json_text("attributes", "status_key")
    best = reader.json_text("attributes", "best_key")
    spans = await reader.rows(
        f"SELECT rollout_id, span_id, sequence_id, name, status_code, start_time, end_time, {step} AS step, "
        f"{candidate} AS candidate, {status} AS candidate_status, {best} AS best_candidate "
        f"FROM spans_v WHERE rollout_id IN {ids} ORDER BY start_time, rollout_id, sequence_id LIMIT {LIMIT + 1}",
        {
            **params,
            "step_key": "step",
            "candidate_key": "apo.candidate",
            "status_key": "apo.status",
            "best_key": "apo.best_candidate",
        },
    )
    for span in spans:
        span["summary"] = _summary(span)
    return {
        "rollouts": rollouts,
        "calls": calls[:LIMIT],
        "more_calls": len(calls) > LIMIT,
        "spans": spans[:LIMIT],
        "more_spans": len(spans) > LIMIT,
        "limit": LIMIT,
    }


def _summary(span: dict[str, Any]) -> str:
    """A few words on what a run's span records."""
    if span["candidate"] is not None:
        return f"candidate {span['candidate']}: {span['candidate_status'] or '?'}"
    if span["best_candidate"] is not None:
        return f"result: best candidate {span['best_candidate']}"
    if span["step"] is not None:
        return f"step {span['step']} metrics"
    return ""

"""What must hold after faults, checked from the database alone (and the writer's log of acknowledged writes).

``python -m tests.cluster.audit DATABASE_URL ACKS_FILE STEPS SLACK`` prints one JSON object: for each check,
``{"held": bool, "detail": str}``. Run inside the database's host, so no fault of the network between it and the
others can reach it.

- ``acknowledged``: every rollout and span whose write the store acknowledged is stored.
- ``one_runner``: no two attempts of a rollout ran at once, unless the earlier was given up (``timeout`` or
  ``unresponsive``: its retry policy allows the next); no rollout has more attempts than its ``max_attempts``.
- ``timeouts``: every attempt of a rollout with a timeout ended (none still preparing or running), none later than
  its timeout plus ``SLACK`` seconds (the watchdog's interval and a margin).
- ``training``: the training run reached ``STEPS`` steps (``training_steps_v``), in one run or resumed.
- ``llm_calls``: every succeeded attempt of the agent's rollouts has the records of the LLM calls it made: the
  flight agent makes exactly ``input.steps`` calls.

``given_up`` (a number, not a check) counts the attempts the watchdog gave up (timed out or unresponsive): a
runner host that vanished mid-attempt leaves at least one.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import asyncpg

OVERLAPS = """
SELECT a.rollout_id, a.sequence_id AS earlier, a.status, b.sequence_id AS later
FROM attempts_v a JOIN attempts_v b ON b.rollout_id = a.rollout_id AND b.sequence_id > a.sequence_id
WHERE b.start_time < COALESCE(a.end_time, 'infinity'::float8) AND a.status NOT IN ('timeout', 'unresponsive')
"""
TOO_MANY = """
SELECT rollout_id, num_attempts FROM rollouts_v
WHERE num_attempts > COALESCE((config::jsonb ->> 'max_attempts')::int, 1)
"""
LATE = """
SELECT a.rollout_id, a.sequence_id, a.status, a.duration_seconds, (r.config::jsonb ->> 'timeout_seconds')::float8 AS t
FROM attempts_v a JOIN rollouts_v r USING (rollout_id)
WHERE r.config::jsonb ->> 'timeout_seconds' IS NOT NULL
  AND (a.status IN ('preparing', 'running')
       OR a.duration_seconds > (r.config::jsonb ->> 'timeout_seconds')::float8 + $1)
"""
CALLS = """
SELECT a.rollout_id, a.attempt_id, (r.input::jsonb ->> 'steps')::int AS expected, count(c.span_id) AS recorded
FROM attempts_v a JOIN rollouts_v r USING (rollout_id)
LEFT JOIN llm_calls_v c ON c.rollout_id = a.rollout_id AND c.attempt_id = a.attempt_id
WHERE a.status = 'succeeded' AND r.input::jsonb ? 'question'
GROUP BY a.rollout_id, a.attempt_id, r.input
"""


def _check(held: bool, detail: str) -> dict[str, Any]:
    return {"held": held, "detail": detail}


async def audit(url: str, acks: list[dict[str, str]], steps: int, slack: float) -> dict[str, Any]:
    rollouts = {ack["rollout_id"] for ack in acks}
    spans = {(ack["rollout_id"], ack["span_id"]) for ack in acks if "span_id" in ack}
    conn = await asyncpg.connect(url)
    try:
        found = await conn.fetch("SELECT rollout_id FROM rollouts_v WHERE rollout_id = ANY($1)", list(rollouts))
        stored = await conn.fetch("SELECT rollout_id, span_id FROM spans_v WHERE rollout_id = ANY($1)", list(rollouts))
        missing_rollouts = rollouts - {row["rollout_id"] for row in found}
        missing_spans = spans - {(row["rollout_id"], row["span_id"]) for row in stored}
        overlaps = await conn.fetch(OVERLAPS)
        too_many = await conn.fetch(TOO_MANY)
        attempts, retried = await conn.fetchrow(
            "SELECT count(*), count(*) FILTER (WHERE a.status IN ('timeout', 'unresponsive')) "
            "FROM attempts_v a JOIN rollouts_v r USING (rollout_id) "
            "WHERE r.config::jsonb ->> 'timeout_seconds' IS NOT NULL"
        )
        late = await conn.fetch(LATE, slack)
        reached = await conn.fetchval("SELECT max(step) FROM training_steps_v")
        calls = await conn.fetch(CALLS)
    finally:
        await conn.close()
    wrong_calls = [row for row in calls if row["recorded"] != row["expected"]]
    return {
        "acknowledged": _check(
            not missing_rollouts and not missing_spans,
            f"{len(rollouts)} rollouts, {len(spans)} spans acknowledged; missing {len(missing_rollouts)}, "
            f"{len(missing_spans)}",
        ),
        "one_runner": _check(
            not overlaps and not too_many,
            f"{len(overlaps)} overlapping attempts not given up; {len(too_many)} rollouts over max_attempts"
            + (f": {[dict(row) for row in overlaps[:3]]}" if overlaps else ""),
        ),
        "timeouts": _check(
            attempts > 0 and not late,
            f"{attempts} attempts ({retried} given up and retried); {len(late)} unfinished or late"
            + (f": {[dict(row) for row in late[:3]]}" if late else ""),
        ),
        "given_up": retried,
        "training": _check(reached == steps, f"reached step {reached} of {steps}"),
        "llm_calls": _check(
            bool(calls) and not wrong_calls,
            f"{len(calls)} succeeded attempts; {len(wrong_calls)} with calls missing or doubled"
            + (f": {[dict(row) for row in wrong_calls[:3]]}" if wrong_calls else ""),
        ),
    }


if __name__ == "__main__":
    url, acks_path, steps, slack = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    acks = [json.loads(line) for line in acks_path.read_text(encoding="utf-8").splitlines() if line.strip()]
    print(json.dumps(asyncio.run(audit(url, acks, steps, slack))))

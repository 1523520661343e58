"""A judge reward after OpenPipe ART's RULER: an LLM ranks each group's trajectories relative to each other.

GRPO only needs rewards that order a group's rollouts of one task; an LLM is better at comparing attempts side by
side than at scoring one alone. So, with the algorithm's ``judge`` option, after a step's rollouts finish and
before they are read as transitions, every group (the rollouts of one task) with at least two succeeded rollouts
is judged:

* Each rollout's transcript is read back from the store (``lightning_store.transcript``: its LLM calls, tool calls
  with their input and output, exceptions; its own rewards left out, so the judge does not copy them) and the
  judge LLM (any OpenAI-compatible endpoint) gets the task, the rubric and the transcripts in one request, asking
  for a JSON object ``{"scores": [{"trajectory": 1, "explanation": "...", "score": 0.7}, ...]}``.
* Each score (clamped to [0, 1]) becomes the rollout's reward: an annotation span named ``ruler`` on its attempt,
  with the judge's explanation (``lightning_store.judge.explanation``) and model, written after the agent's own,
  so it is the attempt's last reward, the one the adapters read. The agent's reward stays in the store beside it.
* The judge's call is recorded like any other LLM call, on the training run's rollout (with token ids when the
  judge's server returns them).
* A group whose answer does not parse, misses a trajectory or fails keeps the agents' own rewards (a warning,
  and ``judge_failed_groups`` counts it): the judge never loses a step.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
import uuid
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field

from lightning_store import LlmCall, semconv
from lightning_store.contract import LightningStore
from lightning_store.models import AttemptedRollout
from lightning_store.spans import Span
from lightning_store.transcript import build_transcript

logger = logging.getLogger(__name__)

DEFAULT_RUBRIC = (
    "A trajectory that achieves the task's goal scores higher than one that does not. Among those that do, one "
    "that gets there with fewer mistakes and wasted steps scores higher. Partial progress earns partial credit."
)
SYSTEM = (
    "You are a judge. Below are several trajectories: attempts by an AI agent at the same task. Compare them "
    "with each other and score each from 0 to 1 by the rubric; a better trajectory gets a higher score.\n\n"
    "Rubric: {rubric}\n\n"
    'Answer with a JSON object only: {{"scores": [{{"trajectory": 1, "explanation": "<one sentence>", '
    '"score": <0 to 1>}}, ...]}}, one entry per trajectory.'
)
REWARD_NAME = "ruler"
EXPLANATION = "lightning_store.judge.explanation"
JUDGE_MODEL = "lightning_store.judge.model"


class JudgeConfig(BaseModel):
    """The ``judge`` option of the RL algorithms (docs/reference/algorithms.md)."""

    model_config = ConfigDict(extra="forbid")

    endpoint: str = Field(pattern=r"^https?://", description="OpenAI-compatible base URL (…/v1) of the judge.")
    model: str = Field(min_length=1, description="The judge's model name.")
    api_key: str | None = Field(
        None,
        exclude=True,
        description="Its key (default: LIGHTNING_STORE_JUDGE_API_KEY); never logged with the config.",
    )
    rubric: str = Field(DEFAULT_RUBRIC, min_length=1, description="What a better trajectory is.")
    max_tokens: int = Field(512, ge=16, description="The most tokens the judge may write per group.")
    timeout: float = Field(300.0, gt=0, description="Seconds one judge call may take.")


async def judge_groups(
    store: LightningStore, rollout_ids: Sequence[str], judge: JudgeConfig, run: AttemptedRollout
) -> dict[str, float]:
    """Judge the groups of ``rollout_ids`` (grouped by ``metadata.task_id``) and write the scores as rewards;
    the step's metrics: ``judged_groups``, ``judge_failed_groups``, ``judge_seconds``."""
    started = time.perf_counter()
    found = (await store.query_rollouts(rollout_id_in=list(rollout_ids), status_in=["succeeded"])).items
    groups: dict[str, list[AttemptedRollout]] = defaultdict(list)
    for rollout in found:
        if isinstance(rollout, AttemptedRollout):
            groups[str((rollout.metadata or {}).get("task_id", rollout.rollout_id))].append(rollout)
    judged = failed = 0
    key = judge.api_key or os.environ.get("LIGHTNING_STORE_JUDGE_API_KEY") or "unused"
    async with httpx.AsyncClient(timeout=judge.timeout, headers={"Authorization": f"Bearer {key}"}) as http:
        for task_id, members in sorted(groups.items()):
            if len(members) < 2:
                continue
            members.sort(key=lambda r: r.rollout_id)
            try:
                scores = await _judge_group(store, http, judge, run, members)
            except (httpx.HTTPError, ValueError) as error:
                logger.warning(
                    "the judge left group %s unjudged (the agents' rewards stand): %s: %s",
                    task_id,
                    type(error).__name__,
                    error,
                )
                failed += 1
                continue
            await _write_rewards(store, judge, members, scores)
            judged += 1
    return {
        "judged_groups": float(judged),
        "judge_failed_groups": float(failed),
        "judge_seconds": time.perf_counter() - started,
    }


async def _judge_group(
    store: LightningStore,
    http: httpx.AsyncClient,
    judge: JudgeConfig,
    run: AttemptedRollout,
    members: list[AttemptedRollout],
) -> list[tuple[float, str]]:
    parts = [f"Task:\n{json.dumps(members[0].input, ensure_ascii=False, default=str)[:4000]}"]
    calls = await store.query_llm_calls([rollout.rollout_id for rollout in members])  # the group's, at once
    for number, rollout in enumerate(members, 1):
        attempt = rollout.attempt.attempt_id
        spans = (await store.query_spans(rollout.rollout_id, attempt)).items
        own = [c for c in calls if c.rollout_id == rollout.rollout_id and c.attempt_id == attempt]
        parts.append(f"Trajectory {number}:\n{trajectory_text(spans, own)}")
    request = {
        "model": judge.model,
        "messages": [
            {"role": "system", "content": SYSTEM.format(rubric=judge.rubric)},
            {"role": "user", "content": "\n\n".join(parts)},
        ],
        "max_tokens": judge.max_tokens,
        "temperature": 0.0,
        "response_format": {"type": "json_object"},
    }
    began = time.time()
    answer = await http.post(f"{judge.endpoint.rstrip('/')}/chat/completions", json=request)
    answer.raise_for_status()
    response = answer.json()
    await _record_call(store, run, request, response, began)
    text = str(((response.get("choices") or [{}])[0].get("message") or {}).get("content") or "")
    return parse_scores(text, len(members))


def parse_scores(text: str, count: int) -> list[tuple[float, str]]:
    """(score, explanation) per trajectory 1..``count`` from the judge's answer; ``ValueError`` when the answer
    holds no such JSON object or misses a trajectory."""
    match = re.search(r"\{.*\}", text, flags=re.DOTALL)
    if match is None:
        raise ValueError(f"no JSON object in the judge's answer: {text[:200]!r}")
    try:
        entries = json.loads(match.group(0)).get("scores")
    except (json.JSONDecodeError, AttributeError) as error:
        raise ValueError(f"the judge's answer is not the JSON asked for: {text[:200]!r}") from error
    scores: dict[int, tuple[float, str]] = {}
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict) and isinstance(entry.get("trajectory"), int):
            score = entry.get("score")
            if isinstance(score, int | float) and not isinstance(score, bool) and score == score:
                scores[entry["trajectory"]] = (min(1.0, max(0.0, float(score))), str(entry.get("explanation", "")))
    missing = [n for n in range(1, count + 1) if n not in scores]
    if missing:
        raise ValueError(f"the judge scored no trajectory {missing}: {text[:200]!r}")
    return [scores[n] for n in range(1, count + 1)]


def trajectory_text(spans: Sequence[Span], calls: Sequence[LlmCall]) -> str:
    """An attempt (its spans and LLM-call records) as the judge reads it: the first call's prompt, every reply,
    tool call and exception in order; no reward (at most 6,000 characters, the start kept)."""
    lines: list[str] = []
    for event in build_transcript(spans, calls):
        kind = event["event"]
        if kind == "llm_call":
            lines += [f"{m.get('role')}: {m.get('content')}" for m in event.get("messages") or []]
            lines.append(f"assistant: {event.get('response') or ''}")
            lines += [f"assistant calls {c['name']}({c['arguments']})" for c in event.get("tool_calls") or []]
        elif kind == "tool":
            lines.append(
                f"tool {event['name']} got {event.get('input')!s:.500} and returned {event.get('output')!s:.500}"
            )
        elif kind in ("exception", "error", "llm_error"):
            lines.append(f"{kind}: {event.get('message') or event.get('error')}")
    return "\n".join(lines)[:6000]


async def _record_call(
    store: LightningStore, run: AttemptedRollout, request: dict[str, Any], response: dict[str, Any], began: float
) -> None:
    choice = (response.get("choices") or [{}])[0]
    ended = time.time()
    call = LlmCall(
        rollout_id=run.rollout_id,
        attempt_id=run.attempt.attempt_id,
        agent_name="judge",
        model=str(response.get("model") or request["model"]),
        prompt_token_ids=_ids(response.get("prompt_token_ids")),
        response_token_ids=_ids(choice.get("token_ids")),
        request=request,
        response=response,
        finish_reason=choice.get("finish_reason"),
        start_time=began,
        end_time=ended,
        latency_seconds=ended - began,
    )
    await store.add_llm_calls([call])


def _ids(value: Any) -> list[int]:
    ok = isinstance(value, list) and all(isinstance(i, int) and 0 <= i < 2**31 for i in value)
    return list(value) if ok else []


async def _write_rewards(
    store: LightningStore, judge: JudgeConfig, members: list[AttemptedRollout], scores: list[tuple[float, str]]
) -> None:
    now = time.time()
    spans = [
        Span(
            rollout_id=rollout.rollout_id,
            attempt_id=rollout.attempt.attempt_id,
            sequence_id=0,  # allocated by the store, after the attempt's own spans
            trace_id=uuid.uuid4().hex,
            span_id=uuid.uuid4().hex[:16],
            name=semconv.ANNOTATION,
            start_time=now,
            end_time=now,
            attributes={
                semconv.reward_name(0): REWARD_NAME,
                semconv.reward_value(0): score,
                EXPLANATION: explanation[:2000],
                JUDGE_MODEL: judge.model,
            },
        )
        for rollout, (score, explanation) in zip(members, scores, strict=True)
    ]
    await store.add_many_spans(spans, allocate_sequence_ids=True)

"""A small store for the ``store export`` tests, filled through the store contract the way the real writers fill
it: a GRPO run (``algorithms.collect`` enqueues its train and val rollouts, ``MetricsLog`` writes its steps) that
is resumed once, an APO run's rollouts, a rollout of no run, a retried rollout, one without a reward and one left
in the queue; each attempt has an LLM call record (token ids, logprobs, usage) and reward spans.

:class:`Filled` says what was written, so that tests can tell which rollouts each filter must select.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from algorithms.collect import enqueue_groups
from algorithms.session import MetricsLog
from lightning_store.contract import LightningStore
from lightning_store.llm_calls import LlmCall
from lightning_store.models import AttemptedRollout, RolloutConfig
from lightning_store.spans import Span, TraceStatus

REWARD = "agentlightning.reward.0.value"


@dataclass
class Filled:
    run_id: str
    """The GRPO run (``training_steps_v.run_id``)."""
    resumed_id: str
    """The rollout of the resumed ``store train`` that continues it."""
    apo_run_id: str
    boundary: float
    """A time after the run's first part was enqueued and before the rest."""
    modes: dict[str, str | None] = field(default_factory=dict)
    """Every rollout's mode, the run rollouts' included."""
    before: set[str] = field(default_factory=set)
    """The rollouts enqueued before ``boundary``."""
    of_run: set[str] = field(default_factory=set)
    """The rollouts ``--run run_id`` selects: the run's own two and those they enqueued."""
    of_apo: set[str] = field(default_factory=set)
    versions: dict[str, int | None] = field(default_factory=dict)
    """``rollouts_v.resources_version``: the lowest version of the latest attempt's LLM calls."""
    rewards: dict[str, float | None] = field(default_factory=dict)
    """Each attempt's reward: its last reward span's."""
    queued: str = ""
    """A rollout still in the queue (no attempt)."""


def wait_a_tick() -> float:
    """A time strictly between what was written before and what is written after."""
    time.sleep(0.02)
    now = time.time()
    time.sleep(0.02)
    return now


async def fill(store: LightningStore) -> Filled:
    config = RolloutConfig(max_attempts=2, retry_condition=["failed"])
    run = await MetricsLog.start(store, "grpo", {"group_size": 2})
    await run.log(0, {"val_reward": 0.25, "val_rollouts": 2.0})
    run_id = run.run.rollout_id
    train = await enqueue_groups(store, [("t1", {"q": 1}), ("t2", {"q": 2})], 2, step=0, config=config, run_id=run_id)
    val = await enqueue_groups(store, [("v1", {"q": 9})], 2, step=1, config=config, mode="val", run_id=run_id)
    await run.log(1, {"reward_mean": 0.5, "loss": 0.125, "version": 2.0, "val_reward": 0.5, "val_rollouts": 2.0})
    await run.finish(succeeded=True)
    first_part = await _work(store, {rid: 1 for rid in train} | {rid: 2 for rid in val}, retry=train[0])

    boundary = wait_a_tick()
    resumed = await MetricsLog.start(store, "grpo", {"group_size": 2})  # `store train` again: continues the run
    await resumed.log(1, {"val_reward": 0.75, "val_rollouts": 2.0})
    later = await enqueue_groups(store, [("t3", {"q": 3})], 2, step=1, config=config, run_id=resumed.run.rollout_id)
    await resumed.log(2, {"reward_mean": 0.75, "loss": 0.0625, "version": 3.0})
    await resumed.finish(succeeded=True)

    apo = await store.start_rollout({"algorithm": "apo"}, metadata={"training_run": "apo"})
    apo_ids = [
        (
            await store.enqueue_rollout(
                {"q": i},
                mode="val",
                resources_id="apo-0123456789abcdef",
                metadata={"task_id": f"a{i}", "apo_run": apo.rollout_id, "apo_split": "val"},
            )
        ).rollout_id
        for i in range(2)
    ]
    other = (await store.enqueue_rollout({"q": "other"}, mode="test", metadata={"note": "ünïcode ✓"})).rollout_id
    second_part = await _work(store, {rid: 3 for rid in later} | {rid: 1 for rid in apo_ids} | {other: 4})
    await _calls(store, apo, 1, agent_name="apo.critique", reward=None)
    queued = (await store.enqueue_rollout({"q": "late"}, mode="train")).rollout_id

    filled = Filled(run_id, resumed.run.rollout_id, apo.rollout_id, boundary, queued=queued)
    modes: dict[str, str | None] = {run_id: None, resumed.run.rollout_id: None, apo.rollout_id: None, other: "test"}
    filled.modes = modes | {rid: "train" for rid in [*train, *later, queued]} | {rid: "val" for rid in [*val, *apo_ids]}
    filled.before = {run_id, *train, *val}
    filled.of_run = {run_id, resumed.run.rollout_id, *train, *val, *later}
    filled.of_apo = {apo.rollout_id, *apo_ids}
    for part in (first_part, second_part):
        filled.versions |= part[0]
        filled.rewards |= part[1]
    for own in (apo, run.run, resumed.run):  # the runs' own rollouts emit no reward
        filled.rewards[own.attempt.attempt_id] = None
    filled.versions |= {apo.rollout_id: 1, run_id: None, resumed.run.rollout_id: None, queued: None}
    return filled


async def _work(
    store: LightningStore, versions: dict[str, int], *, retry: str | None = None
) -> tuple[dict[str, int | None], dict[str, float | None]]:
    """Run every queued rollout as a runner would: one LLM call and a reward per attempt (``retry``: its first
    attempt fails after a reward of 0.125 and the second succeeds with two rewards; the first rollout of the
    batch emits no reward at all)."""
    rollout_versions: dict[str, int | None] = {}
    rewards: dict[str, float | None] = {}
    index = 0
    while claimed := await store.dequeue_many_rollouts(limit=100, worker_id="w1"):
        for attempt in claimed:
            rid, aid = attempt.rollout_id, attempt.attempt.attempt_id
            version = versions[rid]
            if rid == retry and attempt.attempt.sequence_id == 1:
                rewards[aid] = await _calls(store, attempt, version + 1, reward=[0.125])
                await store.update_attempt(rid, aid, status="failed")
                continue
            if rid == retry:
                rewards[aid] = await _calls(store, attempt, version, reward=[0.25, 0.875])
            elif index == 0:
                rewards[aid] = await _calls(store, attempt, version, reward=None)
            else:
                rewards[aid] = await _calls(store, attempt, version, reward=[index / 8])
            index += 1
            rollout_versions[rid] = version
            await store.update_attempt(rid, aid, status="succeeded")
    return rollout_versions, rewards


async def _calls(
    store: LightningStore,
    attempt: AttemptedRollout,
    version: int,
    *,
    reward: list[float] | None,
    agent_name: str = "solver",
) -> float | None:
    """An LLM call (its span and its record) and ``reward`` spans; the attempt's reward (the last)."""
    rid, aid = attempt.rollout_id, attempt.attempt.attempt_id
    trace = rid.encode().hex()[:32].ljust(32, "0")
    seed = sum(aid.encode()) % 1000
    now = time.time()
    spans = [
        Span(
            rollout_id=rid,
            attempt_id=aid,
            sequence_id=0,
            trace_id=trace,
            span_id=f"{seed:04x}00000000llm1"[:16],
            name="openai.chat.completion",
            attributes={"gen_ai.request.model": "tiny", "nested": {"list": [1, 2.5, "x"]}, "text": "héllo ✓"},
            start_time=now,
            end_time=now + 0.5,
        ),
        *(
            Span(
                rollout_id=rid,
                attempt_id=aid,
                sequence_id=0,
                trace_id=trace,
                span_id=f"{seed:04x}0000000rew{i}"[:16],
                parent_id=f"{seed:04x}00000000llm1"[:16],
                name="agentlightning.annotation",
                status=TraceStatus(status_code="OK"),
                attributes={REWARD: value, "agentlightning.reward.0.name": "score"},
                start_time=now + 1,
                end_time=now + 1 + i,
            )
            for i, value in enumerate(reward or [])
        ),
    ]
    written = await store.add_many_spans(spans, allocate_sequence_ids=True)
    prompt = [seed + i for i in range(5)]
    response = [2**31 - 1 - seed, 7, 0]  # the largest token id an LlmCall takes
    await store.add_llm_calls(
        [
            LlmCall(
                rollout_id=rid,
                attempt_id=aid,
                span_id=spans[0].span_id,
                sequence_id=written[0].sequence_id,
                agent_name=agent_name,
                model="tiny",
                resources_id=attempt.resources_id,
                resources_version=version,
                prompt_token_ids=prompt,
                response_token_ids=response,
                response_logprobs=[-0.1 * (seed % 7) - 1e-9, -1.0, 0.0],
                request={"messages": [{"role": "user", "content": "2+2?"}]},
                response={"usage": {"prompt_tokens": len(prompt), "completion_tokens": len(response)}},
                finish_reason="stop",
                start_time=now,
                end_time=now + 0.5,
                latency_seconds=0.5,
            )
        ]
    )
    return None if not reward else reward[-1]


def store_command() -> list[str]:
    """The installed ``store`` script beside this interpreter, else ``python -m lightning_store.cli``."""
    script = shutil.which("store", path=str(Path(sys.executable).parent))
    return [script] if script is not None else [sys.executable, "-m", "lightning_store.cli"]


def run_export(
    url: str, out: Path, *args: str, quick: bool = False, prelude: str = "", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``store export OUT --database-url URL ARGS…`` as a subprocess: the ``store`` script, or (``quick`` or
    ``prelude``) the same command line run by the core's own typer app in ``python -c``, which skips loading the
    plugin commands of the other packages (``store export`` is the core's own): 0.7 s less per run. ``prelude``:
    Python run in that process first (e.g. to make an import fail)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("LIGHTNING_STORE_")}
    environ |= {"COLUMNS": "200", **(env or {})}
    if quick or prelude:
        script = f"import sys\nsys.argv[0] = 'store'\n{prelude}\nfrom lightning_store.cli import app\napp()"
        command = [sys.executable, "-c", script]
    else:
        command = store_command()
    argv = [*command, "export", str(out), "--database-url", url, *args]
    return subprocess.run(argv, env=environ, cwd=out.parent, capture_output=True, text=True, timeout=120, check=False)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    import json

    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


JSON_COLUMNS = {"input", "metadata", "config", "attributes", "metrics"}
"""The files' JSON columns (text in the files; parsed before comparing)."""


def parsed(row: dict[str, Any]) -> dict[str, Any]:
    """A file's row with its JSON columns parsed."""
    import json

    return {k: json.loads(v) if k in JSON_COLUMNS and isinstance(v, str) else v for k, v in row.items()}


def _minus(end: float | None, start: float | None) -> float | None:
    return None if end is None or start is None else end - start


async def expected_export(store: LightningStore, filled: Filled, selected: set[str]) -> dict[str, list[dict[str, Any]]]:
    """What the rollouts, attempts, llm_calls and spans files must hold for the rollouts ``selected``, read from
    the store through its contract (JSON columns parsed), in the files' order."""
    rollouts = sorted(
        (await store.query_rollouts(rollout_id_in=sorted(selected))).items, key=lambda r: (r.start_time, r.rollout_id)
    )
    out: dict[str, list[dict[str, Any]]] = {"rollouts": [], "attempts": [], "llm_calls": [], "spans": []}
    by_id = {r.rollout_id: r for r in rollouts}
    sequences: dict[str, int] = {}
    for rollout in rollouts:
        attempts = list((await store.query_attempts(rollout.rollout_id)).items)
        latest = attempts[-1] if attempts else None
        meta = rollout.metadata or {}
        step, task_id = meta.get("step"), meta.get("task_id")
        out["rollouts"].append(
            {
                "rollout_id": rollout.rollout_id,
                "status": rollout.status,
                "mode": rollout.mode,
                "resources_id": rollout.resources_id,
                "resources_version": filled.versions.get(rollout.rollout_id),
                "step": step if isinstance(step, int) else None,
                "task_id": task_id if isinstance(task_id, str) else None,
                "start_time": rollout.start_time,
                "end_time": rollout.end_time,
                "duration_seconds": _minus(rollout.end_time, rollout.start_time),
                "num_attempts": len(attempts),
                "latest_attempt_id": latest and latest.attempt_id,
                "latest_attempt_status": latest and latest.status,
                "latest_worker_id": latest and latest.worker_id,
                "reward": None if latest is None else filled.rewards[latest.attempt_id],
                "input": rollout.input,
                "metadata": rollout.metadata,
                "config": rollout.config.model_dump(mode="json"),
            }
        )
        for a in attempts:
            sequences[a.attempt_id] = a.sequence_id
            out["attempts"].append(
                {
                    "rollout_id": a.rollout_id,
                    "attempt_id": a.attempt_id,
                    "sequence_id": a.sequence_id,
                    "status": a.status,
                    "worker_id": a.worker_id,
                    "mode": rollout.mode,
                    "start_time": a.start_time,
                    "end_time": a.end_time,
                    "duration_seconds": _minus(a.end_time, a.start_time),
                    "last_heartbeat_time": a.last_heartbeat_time,
                    "reward": filled.rewards[a.attempt_id],
                    "metadata": a.metadata,
                }
            )
    for c in await store.query_llm_calls(sorted(selected)):
        rollout = by_id[c.rollout_id]
        usage = (c.response or {}).get("usage", {})
        meta = rollout.metadata or {}
        step, task_id = meta.get("step"), meta.get("task_id")
        out["llm_calls"].append(
            {
                "rollout_id": c.rollout_id,
                "attempt_id": c.attempt_id,
                "span_id": c.span_id,
                "sequence_id": c.sequence_id,
                "agent_name": c.agent_name,
                "model": c.model,
                "resources_id": c.resources_id,
                "resources_version": c.resources_version,
                "llm_resource": c.llm_resource,
                "mode": rollout.mode,
                "step": step if isinstance(step, int) else None,
                "task_id": task_id if isinstance(task_id, str) else None,
                "prompt_tokens": len(c.prompt_token_ids),
                "response_tokens": len(c.response_token_ids),
                "prompt_token_ids": c.prompt_token_ids,
                "response_token_ids": c.response_token_ids,
                "response_logprobs": c.response_logprobs,
                "finish_reason": c.finish_reason,
                "error": c.error,
                "start_time": c.start_time,
                "end_time": c.end_time,
                "latency_seconds": c.latency_seconds,
                "usage_prompt_tokens": usage.get("prompt_tokens"),
                "usage_completion_tokens": usage.get("completion_tokens"),
                "reward": filled.rewards[c.attempt_id],
            }
        )
    for rollout_id in sorted(selected):
        for s in (await store.query_spans(rollout_id)).items:
            out["spans"].append(
                {
                    "rollout_id": s.rollout_id,
                    "attempt_id": s.attempt_id,
                    "attempt_sequence_id": sequences[s.attempt_id],
                    "sequence_id": s.sequence_id,
                    "name": s.name,
                    "trace_id": s.trace_id,
                    "span_id": s.span_id,
                    "parent_id": s.parent_id,
                    "status_code": s.status.status_code,
                    "status_message": s.status.description,
                    "start_time": s.start_time,
                    "end_time": s.end_time,
                    "duration_seconds": _minus(s.end_time, s.start_time),
                    "attributes": s.attributes,
                }
            )
    return out

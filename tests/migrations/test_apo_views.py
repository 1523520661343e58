"""The views of revision 0003 compute what docs/reference/sql.md says, on SQLite and on Postgres:
``prompt_candidates_v`` (one row per candidate span of a prompt optimization run), ``apo_runs_v`` (one row per
run: its result as reported next to what the store holds) and the ``usage`` token counts ``llm_calls_v`` gained.
The store is filled as algorithms/apo/SPEC.md says an APO run fills it, plus records holding values of the wrong
JSON types; the APO examples of the SQL reference (its ```sql apo block) run against it too."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from lightning_store.llm_calls import LlmCall
from lightning_store.models import EnqueueRolloutRequest
from lightning_store.spans import Span
from lightning_store.sql import SqlStore, open_store
from tests.migrations.test_migrations import BACKENDS, rows

SQL_DOC = Path(__file__).parents[2] / "docs" / "reference" / "sql.md"
SEED, BETTER, MERGED, OTHER_SEED = ("apo-" + digit * 16 for digit in "0132")
SEED_TEMPLATES = json.dumps({"system": "Answer {question}."})
BETTER_TEMPLATES = json.dumps({"system": "Answer {question} in one word."})
CANDIDATE_COLUMNS = (
    "run_id, round, candidate, origin, template_name, status, reason, resources_id, parent_resources_id, parents,"
    " critique, minibatch_score, parent_minibatch_score, val_score, val_tasks, templates, is_best, rollouts_spent,"
    " optimizer_calls_spent, optimizer_tokens_spent, time"
)


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[SqlStore]:
    opened = await open_store(database_url, migrate=True, watchdog=False)
    yield opened
    await opened.close()


def apo_span(run_id: str, attempt_id: str, sequence_id: int, name: str, span_id: str, **attributes: Any) -> Span:
    return Span(
        rollout_id=run_id,
        attempt_id=attempt_id,
        sequence_id=sequence_id,
        trace_id="0" * 31 + "a",
        span_id=span_id,
        name=name,
        start_time=2000.0 + sequence_id,
        end_time=2000.5 + sequence_id,
        attributes={f"apo.{key}": value for key, value in attributes.items()},
    )


def candidate_span(run_id: str, attempt_id: str, sequence_id: int, ordinal: int, **attributes: Any) -> Span:
    span_id = f"{0xC000000000000000 + ordinal:016x}"
    name = "lightning_store.apo.candidate"
    return apo_span(run_id, attempt_id, sequence_id, name, span_id, candidate=ordinal, **attributes)


def result_span(run_id: str, attempt_id: str, sequence_id: int, **attributes: Any) -> Span:
    return apo_span(run_id, attempt_id, sequence_id, "lightning_store.apo.result", "e000000000000000", **attributes)


def optimizer_call(run_id: str, attempt_id: str, ordinal: int, response: dict[str, Any] | None) -> LlmCall:
    return LlmCall(
        rollout_id=run_id,
        attempt_id=attempt_id,
        span_id=f"{0xD000000000000000 + ordinal:016x}",
        sequence_id=100 + ordinal,
        agent_name="apo.critique" if ordinal % 2 else "apo.edit",
        model="optimizer",
        prompt_token_ids=[],
        response_token_ids=[],
        request={"model": "optimizer", "messages": [{"role": "user", "content": "# Task: critique"}]},
        response=response,
        start_time=3000.0 + ordinal,
    )


def usage(prompt: Any, completion: Any, total: Any) -> dict[str, Any]:
    return {"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": total}}


def agent_rollout(run_id: str, resources_id: str, task: str, split: str) -> EnqueueRolloutRequest:
    metadata = {"task_id": task, "apo_run": run_id, "apo_candidate": resources_id, "apo_task": task}
    return EnqueueRolloutRequest(
        rollout_id=f"apo-{resources_id[-4:]}-{task}-{run_id[-8:]}",
        input={"question": task},
        mode=split,
        resources_id=resources_id,
        metadata=metadata | {"apo_split": split},
    )


@dataclass
class Filled:
    run: str
    """A finished run: four candidates (one written twice), a result, agent rollouts and optimizer calls."""
    unfinished: str
    """A run without a result, whose records hold values of the wrong JSON types."""


async def fill(store: SqlStore) -> Filled:
    run = await store.start_rollout({"algorithm": "apo", "config": {}}, metadata={"training_run": "apo"})
    run_id, attempt = run.rollout_id, run.attempt.attempt_id
    await store.add_many_spans(
        [
            candidate_span(
                run_id,
                attempt,
                1,
                0,
                round=0,
                resources_id=SEED,
                parent="",
                parents="[]",
                origin="seed",
                template="",
                status="seed",
                reason="",
                critique="",
                val_score=0.5,
                val_tasks=2,
                templates=SEED_TEMPLATES,
                rollouts_spent=2,
                optimizer_calls_spent=0,
                optimizer_tokens_spent=0,
            ),
            # First written before its test (the budget ran out), written again below on another attempt.
            candidate_span(
                run_id,
                attempt,
                2,
                1,
                round=1,
                resources_id=BETTER,
                parent=SEED,
                parents=json.dumps([SEED]),
                origin="reflection",
                template="system",
                status="unevaluated",
                reason="",
                critique="Ask for one word.",
                templates=BETTER_TEMPLATES,
                rollouts_spent=2,
                optimizer_calls_spent=2,
                optimizer_tokens_spent=250,
            ),
            candidate_span(
                run_id,
                attempt,
                3,
                2,
                round=1,
                resources_id="",
                parent=SEED,
                parents=json.dumps([SEED]),
                origin="reflection",
                template="system",
                status="invalid",
                reason="drops the placeholder {question}",
                critique="Drop the question.",
                templates=json.dumps({"system": "Answer."}),
                rollouts_spent=6,
                optimizer_calls_spent=4,
                optimizer_tokens_spent=300,
            ),
            candidate_span(
                run_id,
                attempt,
                4,
                3,
                round=2,
                resources_id=MERGED,
                parent=BETTER,
                parents=json.dumps([BETTER, SEED]),
                origin="merge",
                template="",
                status="rejected",
                reason="no better than its parent on the minibatch",
                critique="",
                minibatch_score=0.5,
                parent_minibatch_score=1.0,
                templates=BETTER_TEMPLATES,
                rollouts_spent=7,
                optimizer_calls_spent=4,
                optimizer_tokens_spent=300,
            ),
        ]
    )
    responses = [usage(40, 60, 100), usage(100, 50, 150), usage(30, 20, 50), {"choices": []}]
    await store.add_llm_calls(
        [optimizer_call(run_id, attempt, ordinal, response) for ordinal, response in enumerate(responses, start=1)]
    )
    # A second attempt of the run rollout writes candidate 1 again (the store keeps both: another attempt), then
    # the result.
    again = (await store.start_attempt(run_id)).attempt.attempt_id
    await store.add_many_spans(
        [
            candidate_span(
                run_id,
                again,
                6,
                1,
                round=1,
                resources_id=BETTER,
                parent=SEED,
                parents=json.dumps([SEED]),
                origin="reflection",
                template="system",
                status="accepted",
                reason="",
                critique="Ask for one word.",
                minibatch_score=1.0,
                parent_minibatch_score=0.5,
                val_score=0.75,
                val_tasks=2,
                templates=BETTER_TEMPLATES,
                rollouts_spent=6,
                optimizer_calls_spent=2,
                optimizer_tokens_spent=250,
            ),
            result_span(
                run_id,
                again,
                7,
                search="pareto",
                seed=12345,
                best_candidate=1,
                best_resources_id=BETTER,
                published_resources_id=BETTER,
                published_version=2,
                seed_val_score=0.5,
                best_val_score=0.75,
                seed_test_score=0.0,
                best_test_score=1.0,
                test_tasks=1,
                max_rollouts=8,
                rollouts_spent=7,
                test_rollouts_spent=2,
                max_optimizer_calls=10,
                optimizer_calls_spent=4,
                optimizer_tokens_spent=300,
            ),
        ]
    )
    await store.enqueue_many_rollouts(
        [
            agent_rollout(run_id, BETTER, "v1", "val"),
            agent_rollout(run_id, SEED, "v1", "val"),
            agent_rollout(run_id, SEED, "v2", "val"),
            agent_rollout(run_id, BETTER, "v2", "val"),
            agent_rollout(run_id, SEED, "t1", "train"),
            agent_rollout(run_id, BETTER, "t1", "train"),
            agent_rollout(run_id, MERGED, "t1", "train"),
            agent_rollout(run_id, SEED, "x1", "test"),
            agent_rollout(run_id, BETTER, "x1", "test"),
        ]
    )
    # One agent rollout ran and was rewarded (the first enqueued: the best candidate on a validation task).
    claimed = await store.dequeue_rollout(worker_id="w1")
    assert claimed is not None and claimed.resources_id == BETTER
    reward = {"agentlightning.reward.0.name": "primary", "agentlightning.reward.0.value": 1.0}
    await store.add_span(
        Span(
            rollout_id=claimed.rollout_id,
            attempt_id=claimed.attempt.attempt_id,
            sequence_id=1,
            trace_id="0" * 31 + "b",
            span_id="000000000000000b",
            name="agentlightning.annotation",
            attributes=reward,
        )
    )
    await store.update_attempt(claimed.rollout_id, claimed.attempt.attempt_id, status="succeeded")
    await store.update_rollout(run_id, status="succeeded")

    # A run still going, and wrongly typed values: each reads as NULL (a whole number beyond 32 bits is kept
    # where the column holds tokens).
    other = await store.start_rollout({"algorithm": "apo", "config": {}}, metadata={"training_run": "apo"})
    other_id, other_attempt = other.rollout_id, other.attempt.attempt_id
    await store.add_span(
        candidate_span(
            other_id,
            other_attempt,
            1,
            0,
            round=0.5,
            resources_id=OTHER_SEED,
            parent="",
            origin="seed",
            template=7,
            status="seed",
            val_score="high",
            val_tasks=2,
            rollouts_spent="3",
            optimizer_calls_spent=0,
            optimizer_tokens_spent=5_000_000_000,
        )
    )
    odd = [None, usage("12", 2.5, 3_000_000_000), {"usage": "n/a"}, usage(7, 3, 10)]
    await store.add_llm_calls(
        [optimizer_call(other_id, other_attempt, ordinal, response) for ordinal, response in enumerate(odd, start=11)]
    )
    await store.enqueue_many_rollouts([agent_rollout(other_id, OTHER_SEED, "v1", "val")])
    # Neither an APO run nor an APO run's rollout.
    await store.start_rollout({"algorithm": "grpo"}, metadata={"training_run": "grpo"})
    await store.enqueue_rollout({"question": "q"}, mode="train", metadata={"task_id": "q"})
    return Filled(run_id, other_id)


@pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
async def test_prompt_candidates(store: SqlStore) -> None:
    filled = await fill(store)
    run = {"run_id": filled.run, "val_tasks": None, "is_best": 0}
    found = await rows(store, f"SELECT {CANDIDATE_COLUMNS} FROM prompt_candidates_v ORDER BY run_id, candidate")
    by_run = {run_id: [row for row in found if row["run_id"] == run_id] for run_id in (filled.run, filled.unfinished)}
    assert len(found) == 5
    assert by_run[filled.run] == [
        run
        | {"round": 0, "candidate": 0, "origin": "seed", "template_name": None, "status": "seed", "reason": ""}
        | {"resources_id": SEED, "parent_resources_id": None, "parents": "[]", "critique": ""}
        | {"minibatch_score": None, "parent_minibatch_score": None, "val_score": 0.5, "val_tasks": 2}
        | {"templates": SEED_TEMPLATES, "rollouts_spent": 2, "optimizer_calls_spent": 0}
        | {"optimizer_tokens_spent": 0, "time": 2001.5},
        # The newer of its two writes.
        run
        | {"round": 1, "candidate": 1, "origin": "reflection", "template_name": "system", "status": "accepted"}
        | {"reason": "", "resources_id": BETTER, "parent_resources_id": SEED, "parents": json.dumps([SEED])}
        | {"critique": "Ask for one word.", "minibatch_score": 1.0, "parent_minibatch_score": 0.5}
        | {"val_score": 0.75, "val_tasks": 2, "templates": BETTER_TEMPLATES, "is_best": 1, "rollouts_spent": 6}
        | {"optimizer_calls_spent": 2, "optimizer_tokens_spent": 250, "time": 2006.5},
        run
        | {"round": 1, "candidate": 2, "origin": "reflection", "template_name": "system", "status": "invalid"}
        | {"reason": "drops the placeholder {question}", "resources_id": None, "parent_resources_id": SEED}
        | {"parents": json.dumps([SEED]), "critique": "Drop the question.", "minibatch_score": None}
        | {"parent_minibatch_score": None, "val_score": None, "templates": json.dumps({"system": "Answer."})}
        | {"rollouts_spent": 6, "optimizer_calls_spent": 4, "optimizer_tokens_spent": 300, "time": 2003.5},
        run
        | {"round": 2, "candidate": 3, "origin": "merge", "template_name": None, "status": "rejected"}
        | {"reason": "no better than its parent on the minibatch", "resources_id": MERGED}
        | {"parent_resources_id": BETTER, "parents": json.dumps([BETTER, SEED]), "critique": ""}
        | {"minibatch_score": 0.5, "parent_minibatch_score": 1.0, "val_score": None, "templates": BETTER_TEMPLATES}
        | {"rollouts_spent": 7, "optimizer_calls_spent": 4, "optimizer_tokens_spent": 300, "time": 2004.5},
    ]
    # No result yet: is_best is NULL. Values of the wrong type are NULL; absent ones too.
    assert by_run[filled.unfinished] == [
        {"run_id": filled.unfinished, "round": None, "candidate": 0, "origin": "seed", "template_name": None}
        | {"status": "seed", "reason": None, "resources_id": OTHER_SEED, "parent_resources_id": None}
        | {"parents": None, "critique": None, "minibatch_score": None, "parent_minibatch_score": None}
        | {"val_score": None, "val_tasks": 2, "templates": None, "is_best": None, "rollouts_spent": None}
        | {"optimizer_calls_spent": 0, "optimizer_tokens_spent": 5_000_000_000, "time": 2001.5}
    ]


@pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
async def test_apo_runs(store: SqlStore) -> None:
    filled = await fill(store)
    found = {row["run_id"]: row for row in await rows(store, "SELECT * FROM apo_runs_v")}
    assert set(found) == {filled.run, filled.unfinished}
    # The budget as the run reported it equals what the store holds.
    assert found[filled.run] == {
        "run_id": filled.run,
        "status": "succeeded",
        "search": "pareto",
        "seed": 12345,
        "best_candidate": 1,
        "best_resources_id": BETTER,
        "published_resources_id": BETTER,
        "published_version": 2,
        "seed_val_score": 0.5,
        "best_val_score": 0.75,
        "seed_test_score": 0.0,
        "best_test_score": 1.0,
        "test_tasks": 1,
        "max_rollouts": 8,
        "rollouts_spent": 7,
        "rollouts_in_store": 7,
        "test_rollouts_spent": 2,
        "test_rollouts_in_store": 2,
        "max_optimizer_calls": 10,
        "optimizer_calls_spent": 4,
        "optimizer_calls_in_store": 4,
        "optimizer_tokens_spent": 300,
        "optimizer_tokens_in_store": 300,
        "max_optimizer_tokens": None,
    }
    # Without a result span the reported columns are NULL; what the store holds is counted all the same (a
    # total_tokens that is not a number counts nothing; one beyond 32 bits counts in full).
    reported = dict.fromkeys(found[filled.run], None)
    assert found[filled.unfinished] == reported | {
        "run_id": filled.unfinished,
        "status": "running",  # a span is a heartbeat of its attempt
        "rollouts_in_store": 1,
        "test_rollouts_in_store": 0,
        "optimizer_calls_in_store": 4,
        "optimizer_tokens_in_store": 3_000_000_010,
    }
    assert list(found[filled.run]) == [
        "run_id",
        "status",
        "search",
        "seed",
        "best_candidate",
        "best_resources_id",
        "published_resources_id",
        "published_version",
        "seed_val_score",
        "best_val_score",
        "seed_test_score",
        "best_test_score",
        "test_tasks",
        "max_rollouts",
        "rollouts_spent",
        "rollouts_in_store",
        "test_rollouts_spent",
        "test_rollouts_in_store",
        "max_optimizer_calls",
        "optimizer_calls_spent",
        "optimizer_calls_in_store",
        "optimizer_tokens_spent",
        "optimizer_tokens_in_store",
        "max_optimizer_tokens",
    ]


@pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
async def test_llm_calls_carry_the_usage_of_their_response(store: SqlStore) -> None:
    await fill(store)
    found = await rows(
        store,
        "SELECT agent_name, prompt_tokens, response_tokens, usage_prompt_tokens, usage_completion_tokens"
        " FROM llm_calls_v ORDER BY span_id",
    )
    # Hosted LLMs report usage but no token ids. Usage that is absent or not a whole number reads as NULL.
    expected_usage: list[tuple[int | None, int | None]] = [
        (40, 60),
        (100, 50),
        (30, 20),
        (None, None),
        (None, None),
        (None, None),
        (None, None),
        (7, 3),
    ]
    assert found == [
        dict[str, object](agent_name="apo.critique" if ordinal % 2 else "apo.edit", prompt_tokens=0, response_tokens=0)
        | {"usage_prompt_tokens": prompt, "usage_completion_tokens": completion}
        for ordinal, (prompt, completion) in zip([1, 2, 3, 4, 11, 12, 13, 14], expected_usage, strict=True)
    ]


def apo_examples() -> list[str]:
    """Each statement of the SQL reference's ```sql apo blocks (the examples a GRPO store cannot answer)."""
    found = []
    for block in re.findall(r"```sql apo\n(.*?)```", SQL_DOC.read_text(), flags=re.DOTALL):
        for statement in block.split(";"):
            lines = [line for line in statement.splitlines() if not line.lstrip().startswith("--")]
            if "".join(lines).strip():
                found.append("\n".join(lines).strip())
    return found


def test_the_docs_hold_apo_examples() -> None:
    assert len(apo_examples()) >= 3


@pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
async def test_the_apo_examples_return_rows(store: SqlStore) -> None:
    await fill(store)
    for example in apo_examples():
        found = await rows(store, example)
        assert found, f"no rows from\n{example}"

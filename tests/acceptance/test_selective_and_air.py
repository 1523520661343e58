"""Selective optimization and AIR credit assignment, learnt through the whole stack (see tests/learning.py).

* Two agents share one model; training only the planner (with the checker's calls anchored to the reference,
  ``anchor_beta``) raises its Memory-first rate while the checker's yes-rate, measured on the model before and
  after, stays where it was. Trained together, the checker moves too (the control: the reward does depend on
  it). Without the anchor the shared weights carried the checker off by 0.1 to 0.2 (docs/reference/algorithms.md).
* On a task whose final reward is sparse (eight planner calls must all name memory), AIR's intermediate rewards
  from tool statuses reach the target in fewer steps than identical assignment of the final reward.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from algorithms.rl.builtin import GRPO
from examples.flight.agent import NAMES, SYSTEM, choose_tool
from examples.flight.model import VAL_TASKS, build_tool_namer
from lightning_store.client import HttpStore
from tests.learning import answer_rate, train
from tests.workflow_agents import CHECKER_SYSTEM, VERDICTS, choose_verdict

# The learning runs are in CI (a minute or two each, and each fails with the gradient off); their controls, runs
# as long that show what the measure depends on (training every agent moves the checker; identical credit does not
# reach AIR's target), are long (LIGHTNING_STORE_TEST_LONG=1), outside CI's budget.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

COMMON: dict[str, Any] = {"learning_rate": 4e-4, "tasks_per_step": 4, "group_size": 8, "eval_repeats": 8}
VAL_QUESTIONS = [str(task["question"]) for task in VAL_TASKS]
STEPS = 30
AIR_STEPS = 16
AIR_TARGET = 0.05
"""After 12 steps AIR was seen anywhere from 0.047 to 0.66 (identical credit 0.0 every time): the run's sampling
depends on how the policy server's batches happened to form, so AIR gets 16 steps to pass 0.05."""


def memory_first(reply: str) -> bool:
    return choose_tool(reply) == "memory"


def says_yes(reply: str) -> bool:
    return choose_verdict(reply) == "yes"


async def train_workflow(
    tmp_path: Path, trainer_store: tuple[HttpStore, str], agents: str | None
) -> tuple[tuple[float, float], tuple[float, float], list[dict[str, Any]]]:
    """Train the planner (``agents="planner"``) or both agents (None) of the two-agent workflow for ``STEPS``:
    the (planner, checker) rates before and after, and the run's history."""
    store, url = trainer_store
    model = build_tool_namer(tmp_path / "model", roles=((SYSTEM, NAMES), (CHECKER_SYSTEM, VERDICTS)))
    before = (
        answer_rate(model, SYSTEM, memory_first, questions=VAL_QUESTIONS),
        answer_rate(model, CHECKER_SYSTEM, says_yes, questions=VAL_QUESTIONS),
    )
    assert before[0] < 0.5 and 0.3 < before[1] < 0.7
    out = tmp_path / "out"
    summary = await train(
        GRPO(**COMMON, agents=agents, anchor_beta=1.0),
        store=store,
        url=url,
        model_dir=model,
        output_dir=out,
        steps=STEPS,
        agent="tests.workflow_agents:planner_and_checker",
    )
    trained = out / f"step-{STEPS}"
    after = (
        answer_rate(trained, SYSTEM, memory_first, questions=VAL_QUESTIONS),
        answer_rate(trained, CHECKER_SYSTEM, says_yes, questions=VAL_QUESTIONS),
    )
    return before, after, summary["history"]


async def test_training_the_planner_only_leaves_the_checker_unchanged(
    tmp_path: Path, trainer_store: tuple[HttpStore, str]
) -> None:
    (planner_before, checker_before), (planner, checker), history = await train_workflow(
        tmp_path, trainer_store, "planner"
    )
    steps = [h for h in history if "transitions" in h]
    assert steps and all(0 < h["transitions"] <= h["rollouts"] for h in steps), "only the planner's calls count"
    assert all("anchor_kl" in h for h in steps), "the checker's calls are anchored"
    # Seen: the planner 0.28 -> 0.875-0.94 and the checker 0.531 -> 0.516-0.531 (five runs, 2026-11-28), and once
    # the planner only 0.72 in CI: the run's sampling depends on how the policy server's batches formed. 0.6 is
    # still more than double where it started. With the gradient off it stays at 0.28.
    assert planner >= 0.6, f"the planner's Memory-first rate rose from {planner_before} to {planner} only"
    assert abs(checker - checker_before) <= 0.05, f"the untrained checker moved from {checker_before} to {checker}"


@pytest.mark.long
async def test_control_training_every_agent_moves_the_checker(
    tmp_path: Path, trainer_store: tuple[HttpStore, str]
) -> None:
    """The control of the test above: the reward does depend on the checker, so a run that trains it moves it."""
    (_, checker_before), (_, checker), history = await train_workflow(tmp_path, trainer_store, None)
    assert all(h["transitions"] > h["rollouts"] for h in history if "transitions" in h)
    assert checker >= checker_before + 0.2, "control: training every agent moves the checker"


async def train_sparse(tmp_path: Path, trainer_store: tuple[HttpStore, str], credit: str) -> float:
    """The held-out reward after ``AIR_STEPS`` steps on the sparse task (eight planner calls must all name
    memory), with ``credit`` assignment."""
    store, url = trainer_store
    summary = await train(
        GRPO(**COMMON | {"eval_repeats": 32}, credit=credit, air_alpha=0.5),
        store=store,
        url=url,
        model_dir=build_tool_namer(tmp_path / "model"),
        output_dir=tmp_path / "out",
        steps=AIR_STEPS,
        agent="tests.workflow_agents:sparse_flight",
    )
    history = summary["history"]
    assert history[0]["val_reward"] < 0.02, "eight calls all naming memory should start out rare (1/6561)"
    return float(history[-1]["val_reward"])


async def test_air_reaches_the_target(tmp_path: Path, trainer_store: tuple[HttpStore, str]) -> None:
    """AIR learns from every call's tool status (with the gradient off it stayed at 0.008)."""
    after = await train_sparse(tmp_path, trainer_store, "air")
    assert after >= AIR_TARGET, f"AIR's val reward after {AIR_STEPS} steps: {after}"


@pytest.mark.long
async def test_control_identical_credit_does_not_reach_the_target_in_as_many_steps(
    tmp_path: Path, trainer_store: tuple[HttpStore, str]
) -> None:
    """Identical credit learns only from the rare rollouts where all eight calls named memory (about 8% of runs
    see one within the 512 rollouts): after the same number of steps it has not reached the target."""
    after = await train_sparse(tmp_path, trainer_store, "identical")
    assert after < AIR_TARGET, f"identical credit's val reward after {AIR_STEPS} steps: {after}"

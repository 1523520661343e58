"""Prompt optimization (APO) runs to the end on each framework agent of ``examples/`` (issue 40): the prompt the
framework owns (a LangChain system prompt, an Agents SDK ``instructions``, an AutoGen ``system_message``), bound
to a prompt template resource with ``runners.prompt``, is what the candidates change, and each candidate's
rollouts show its text in the framework's own LLM spans.

Real parts: ``store serve`` (embedded), the built-in policy server on SmolLM2-135M-Instruct as the agents' model,
``store train --algorithm apo`` with its runner processes and the frameworks' instrumentation. The optimizer LLM is
the scripted STAND-IN of ``tests.scripted_optimizer`` (a hosted optimizer cannot exist offline): it proposes one
rewrite per template."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from bench.smollm2 import available as smollm2_available
from examples.calc_agent.agent import SYSTEM_MESSAGE
from examples.rag_agent.agent import INSTRUCTIONS
from examples.sql_agent.agent import WRITE_SYSTEM
from lightning_store.resources import LLM
from tests.acceptance.test_apo import candidates, runs, sql, stack, store_train, summary_of, train_argv
from tests.acceptance.test_apo_real_model import policy_server
from tests.scripted_optimizer import create_app

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(900),
    pytest.mark.skipif(not smollm2_available(), reason="SmolLM2 needs the smollm2 and train extras (bench/smollm2.py)"),
]
pytest.importorskip("autogen_agentchat")
pytest.importorskip("langgraph.graph")

EXAMPLES = Path(__file__).parents[2] / "examples"
MARK = "Think about which numbers and which table the question needs."
CASES = {
    # example folder: (entry point, template name, seed text, extra LLM settings)
    "sql_agent": ("examples.sql_agent.agent:sql_agent", "write_system", WRITE_SYSTEM, {}),
    "rag_agent": ("examples.rag_agent.agent:rag_agent", "instructions", INSTRUCTIONS, {}),
    "calc_agent": (
        "examples.calc_agent.agent:calc_agent",
        "system_message",
        SYSTEM_MESSAGE,
        {"forced_parameters": {"tool_choice": "required"}},
    ),
}


@pytest.fixture(scope="module")
def served_smollm2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    from bench.smollm2 import convert

    model = convert(tmp_path_factory.mktemp("smollm2") / "smollm2-135m")
    with policy_server(model, tmp_path_factory.mktemp("policy") / "policy.log") as url:
        yield url, model.name


@pytest.mark.parametrize(
    "example",
    # CI runs the calculator (one LLM call per rollout, ~1.5 min); the other two (~3.5 min together) are `long`,
    # to keep CI within its budget: LIGHTNING_STORE_TEST_LONG=1 runs them.
    [pytest.param("calc_agent"), *(pytest.param(e, marks=pytest.mark.long) for e in ("rag_agent", "sql_agent"))],
)
def test_apo_rewrites_the_prompt_the_framework_owns_and_runs_to_the_end(
    tmp_path: Path, example: str, served_smollm2: tuple[str, str]
) -> None:
    agent, name, seed_text, settings = CASES[example]
    lines = (EXAMPLES / example / "train.jsonl").read_text().splitlines()
    # Eight training tasks: APO stops without proposing once the seed solved every training task it was shown,
    # and the calculator's seed solves about half of its problems (four tasks: two solved minibatches of two in a
    # row, about one run in sixteen; eight: four in a row, about one in 250).
    (tmp_path / "train.jsonl").write_text("\n".join(lines[:8]) + "\n")
    (tmp_path / "val.jsonl").write_text("\n".join(lines[8:11]) + "\n")
    rewrite = f"{seed_text} {MARK}"
    config = yaml.safe_load((EXAMPLES / example / "apo.yaml").read_text())  # the example's, with small budgets
    config |= {"max_rollouts": 16, "max_optimizer_calls": 2, "minibatch_size": 2}
    url, model = served_smollm2
    llm = LLM(endpoint=url, model=model, max_tokens_cap=48, **settings)
    with stack(tmp_path, create_app({name: [rewrite]}), {name: seed_text}, agent_llm=llm) as env:
        summary = summary_of(store_train(train_argv(env, tmp_path, agent, config), timeout=800))
        (run,) = runs(env["db"])
        rows = candidates(env["db"], run["run_id"])
        marked = sql(  # the run's own rollout records the optimizer's answers, which hold it too
            env["db"],
            "SELECT rollout_id FROM spans WHERE instr(attributes, ?) > 0 AND rollout_id != ?",
            MARK,
            run["run_id"],
        )
        rollouts = sql(env["db"], "SELECT rollout_id, resources_id FROM rollouts")
    assert summary["algorithm"] == "apo" and run["rollouts_spent"] <= 16
    texts = {json.loads(r["templates"])[name]: r for r in rows}
    assert set(texts) == {seed_text, rewrite}, texts  # the seed and the optimizer's one proposal
    # The proposal was run: its rollouts' framework LLM spans carry its text, and only theirs.
    proposal = texts[rewrite]
    assert proposal["status"] in ("accepted", "rejected"), dict(proposal)
    assert marked, "no LLM span of the framework shows the rewritten prompt"
    by_resources = {r["rollout_id"]: r["resources_id"] for r in rollouts}
    assert {by_resources[r["rollout_id"]] for r in marked} == {proposal["resources_id"]}

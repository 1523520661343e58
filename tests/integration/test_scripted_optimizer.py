"""The APO tests' stand-in LLM (``tests.scripted_optimizer``) and agents (``tests.apo_agents``), checked on their
own: over HTTP with the OpenAI SDK, the way the APO run and its agents reach them."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from openai import OpenAI

from lightning_store import LLM, PromptTemplate
from tests import apo_agents
from tests.apo_agents import (
    BAD_REWRITE,
    CHECKER_GOOD,
    CHECKER_SEED,
    CLASSIFY_SEED,
    CLASSIFY_SEED_JINJA,
    FLAKY_ERROR,
    GOOD_REWRITE,
    GOOD_REWRITE_JINJA,
    PARETO_COUNTS,
    PLANNER_GOOD,
    PLANNER_SEED,
    classify_tasks,
    flaky_tasks,
    hinted,
    pareto_lineage,
    pareto_tasks,
    render,
    score,
)
from tests.scripted_optimizer import (
    CRITIQUE_PREFIX,
    OPTIMIZER_MODEL,
    RULE_MODEL,
    Raw,
    create_app,
    rule_answer,
    serve_scripted,
    true_label,
)

REPORT = """### Rollout 1: FAILED (score 0, status failed)
Task: {"id": "t1"}
Error: RuntimeError: boom
### Rollout 2: LOW SCORE (score 0, status succeeded)
Task: {"id": "t2"}
[reward] 0.0 feedback={"feedback": "expected odd"}
### Rollout 3: FAILED (score 0, status failed)
Task: {"id": "t3"}
### Rollout 4: OK (score 1, status succeeded)
Task: {"id": "t4"}"""


def _block(name: str, template: str) -> str:
    return f"Template name: {name}\nEngine: f-string\nPlaceholders: {{text}}\n\n<template>\n{template}\n</template>"


def critique_request(name: str, template: str, report: str = REPORT) -> list[dict[str, str]]:
    user = f"# Task: critique\n\n{_block(name, template)}\n\n## Rollouts (failures first)\n\n{report}"
    return [{"role": "system", "content": "You review prompt templates."}, {"role": "user", "content": user}]


def edit_request(name: str, template: str, critique: str = "Add the rules.") -> list[dict[str, str]]:
    user = (
        f"# Task: rewrite\n\n{_block(name, template)}\n\n## Critique\n\n{critique}\n\n"
        "Answer with the complete new template between <template> and </template>."
    )
    return [{"role": "system", "content": "You rewrite prompt templates."}, {"role": "user", "content": user}]


def parsed(answer: str) -> str:
    """The new template as the APO reads it: the last tagged block, else the answer without its code fence."""
    tagged = re.findall(r"<template>\s*?\n?(.*?)\n?\s*</template>", answer, re.DOTALL)
    if tagged:
        return str(tagged[-1])
    fenced = re.match(r"^```[\w-]*\n(.*)\n```$", answer.strip(), re.DOTALL)
    return fenced.group(1) if fenced else answer.strip()


class Scripted:
    """A served stand-in and an OpenAI client for it."""

    def __init__(self, app: FastAPI, url: str) -> None:
        self.app, self.url = app, url
        self.client = OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=30)

    def chat(self, messages: Sequence[Mapping[str, str]], model: str = OPTIMIZER_MODEL) -> Any:
        return self.client.chat.completions.create(model=model, messages=list(messages))  # type: ignore[arg-type]

    def edit(self, name: str, template: str) -> str:
        return parsed(self.chat(edit_request(name, template)).choices[0].message.content or "")

    def ask(self, prompt: str) -> str:
        reply = self.chat([{"role": "user", "content": prompt}], model=RULE_MODEL)
        return reply.choices[0].message.content or ""


@pytest.fixture
def scripted() -> Iterator[Any]:
    """Call with create_app's arguments: serves that app until the test ends."""
    with contextlib.ExitStack() as stack:

        def start(*args: Any, **kwargs: Any) -> Scripted:
            app = create_app(*args, **kwargs)
            url = stack.enter_context(serve_scripted(app))
            served = Scripted(app, url)
            stack.callback(served.client.close)
            return served

        yield start


def test_critique_names_the_template_and_counts_failed_rollouts(scripted: Any) -> None:
    llm = scripted()
    reply = llm.chat(critique_request("prompt_template", CLASSIFY_SEED))
    text = reply.choices[0].message.content
    assert text.startswith(f"{CRITIQUE_PREFIX}prompt_template:")
    assert "the report holds 4 rollouts, 2 FAILED, 1 LOW SCORE" in text
    [entry] = llm.app.state.log
    assert (entry["kind"], entry["template"], entry["failed"], entry["low_score"], entry["rollouts"]) == (
        "critique",
        "prompt_template",
        2,
        1,
        4,
    )

    custom = scripted(critique=lambda name, counts: f"{name} failed {counts.failed} times")
    assert custom.chat(critique_request("planner", PLANNER_SEED)).choices[0].message.content == "planner failed 2 times"


def test_the_script_is_consumed_in_order_per_template_then_repeats(scripted: Any) -> None:
    llm = scripted({"prompt_template": ["one {text}", "two {text}"], "checker": ["check {text} {plan}"]})
    assert llm.edit("prompt_template", CLASSIFY_SEED) == "one {text}"
    assert llm.edit("checker", CHECKER_SEED) == "check {text} {plan}"
    assert llm.edit("prompt_template", "whatever parent {text}") == "two {text}"  # the cursor is per name
    assert llm.edit("prompt_template", CLASSIFY_SEED) == "two {text}"  # used up: the last again
    assert llm.edit("planner", PLANNER_SEED) == PLANNER_SEED  # no script: the parent unchanged
    edits = [e for e in llm.app.state.log if e["kind"] == "edit"]
    assert [e["source"] for e in edits] == ["script", "script", "script", "script", "echo"]
    assert edits[2]["parent"] == "whatever parent {text}"
    assert len(llm.app.state.requests) == 5 and llm.app.state.requests[0]["model"] == OPTIMIZER_MODEL

    cycling = scripted({"prompt_template": ["one {text}", "two {text}"]}, exhausted="cycle")
    assert [cycling.edit("prompt_template", CLASSIFY_SEED) for _ in range(5)] == ["one {text}", "two {text}"] * 2 + [
        "one {text}"
    ]
    echoing = scripted({"prompt_template": ["one {text}"]}, exhausted="echo")
    assert [echoing.edit("prompt_template", CLASSIFY_SEED) for _ in range(2)] == ["one {text}", CLASSIFY_SEED]


def test_the_lineage_answers_per_parent_before_the_script(scripted: Any) -> None:
    seed, lineage = pareto_lineage()
    llm = scripted({"prompt_template": ["from the script {text}"]}, lineage=lineage)
    assert llm.edit("prompt_template", seed) == hinted("A", variant=1)
    assert llm.edit("prompt_template", hinted("A", variant=1)) == hinted("A", "B", variant=1)
    assert llm.edit("prompt_template", f"\n{seed}  \n") == GOOD_REWRITE  # parents compared stripped
    assert llm.edit("prompt_template", seed) == GOOD_REWRITE  # used up: repeats its last
    assert llm.edit("prompt_template", GOOD_REWRITE) == "from the script {text}"  # not in the lineage
    sources = [e["source"] for e in llm.app.state.log]
    assert sources == ["lineage", "lineage", "lineage", "lineage", "script"]


def test_answer_formats_and_raw_entries(scripted: Any) -> None:
    for answer_format in ("tagged", "prose", "fenced", "bare"):
        llm = scripted({"t": ["new {text}"]}, answer_format=answer_format)
        text = llm.chat(edit_request("t", "old {text}")).choices[0].message.content
        assert parsed(text) == "new {text}"
        assert ("<template>" in text) == (answer_format in ("tagged", "prose"))
        assert text.startswith("Here is") == (answer_format == "prose")
    raw = scripted({"t": [Raw("no template here"), "fine {text}"]})
    assert raw.chat(edit_request("t", "old {text}")).choices[0].message.content == "no template here"
    assert raw.app.state.log[0]["answer"] is None and raw.edit("t", "old {text}") == "fine {text}"


def test_usage_counts_words(scripted: Any) -> None:
    llm = scripted({"t": ["four words {text} here"]})
    messages = edit_request("t", "old {text}")
    reply = llm.chat(messages)
    prompt_words = sum(len(m["content"].split()) for m in messages)
    completion_words = len(reply.choices[0].message.content.split())
    assert reply.usage is not None
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (prompt_words, completion_words)
    assert reply.usage.total_tokens == prompt_words + completion_words
    again = llm.chat(messages)
    assert again.usage == reply.usage and again.created == reply.created  # deterministic

    answer = llm.chat([{"role": "user", "content": "Classify A-17"}], model=RULE_MODEL)
    assert answer.usage is not None and (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (2, 1)
    raw = llm.app.state.requests  # token ids ride along for the store's proxy
    assert raw[-1]["model"] == RULE_MODEL


def test_streaming_and_unknown_requests_are_refused(scripted: Any) -> None:
    llm = scripted()
    body = {"model": OPTIMIZER_MODEL, "messages": edit_request("t", "x {text}"), "stream": True}
    assert httpx.post(f"{llm.url}/v1/chat/completions", json=body).status_code == 400
    other = {"model": OPTIMIZER_MODEL, "messages": [{"role": "user", "content": "hello"}]}
    assert httpx.post(f"{llm.url}/v1/chat/completions", json=other).status_code == 400
    assert httpx.get(f"{llm.url}/v1/models").json()["data"][0]["id"] == RULE_MODEL
    vllm_style = httpx.post(
        f"{llm.url}/v1/chat/completions", json={"model": RULE_MODEL, "messages": [{"role": "user", "content": "B-7"}]}
    ).json()
    assert vllm_style["choices"][0]["token_ids"] == [1000] and vllm_style["prompt_token_ids"] == [1]


def test_the_rule_model_answers_by_the_prompts_wording(scripted: Any) -> None:
    llm = scripted()
    assert llm.ask("Classify the item A-17. Answer with one word.") == "even"  # no hint: the guess
    assert llm.ask("Classify the item A-17. Use hint-A.") == "odd"
    assert llm.ask("Classify the item A-17. Use HINT-a.") == "odd"  # case-insensitive
    assert llm.ask("Classify the item A-17. Use hint-B, hint-C.") == "even"  # other categories' hints
    assert llm.ask("Classify B-731. Use hint-B.") == "large" and llm.ask("Classify B-12. hint-B") == "small"
    assert llm.ask("Classify C-10. hint-C") == "buzz" and llm.ask("Classify C-9. hint-C") == "fizz"
    assert llm.ask("Classify C-10. Answer with one word.") == "fizz"
    assert llm.ask("Classify the item. Use hint-A.") == "unknown"
    assert llm.ask("Classify A-17. Use hint-A. Explain your reasoning.") == "Let me explain: A-17 looks odd to me."
    # The checker: keeps a proposal only with hint-check, and ignores the category hints.
    assert llm.ask("Check A-17. Proposed answer: odd. Use hint-A.") == "unsure"
    assert llm.ask("Check A-17. Proposed answer: Odd. Use hint-check.") == "odd"
    assert llm.ask("Check A-17. Proposed answer: even. Use hint-check.") == "even"
    assert llm.ask("Classify C-10. Use hint-check.") == "fizz"  # hint-check is not hint-C
    # Messages of every role are read, in content parts too.
    reply = llm.chat(
        [{"role": "system", "content": "Use hint-A."}, {"role": "user", "content": [{"type": "text", "text": "A-3"}]}],
        model=RULE_MODEL,
    )
    assert reply.choices[0].message.content == "odd"
    assert [e["kind"] for e in llm.app.state.log][-1] == "rule"


def test_the_task_splits_are_deterministic_disjoint_and_balanced() -> None:
    splits = {split: classify_tasks(split) for split in ("train", "val", "test")}
    assert classify_tasks("val") == splits["val"]
    items = [t["text"] for tasks in splits.values() for t in tasks]
    assert len(items) == len(set(items)) == 36
    for task in splits["train"]:
        assert set(task) == {"id", "text", "category", "label"} and task["label"] == true_label(task["text"])
    assert [t["category"] for t in splits["train"][:6]] == ["A", "B", "C"] * 2
    guesses = {"A": "even", "B": "small", "C": "fizz"}
    assert sum(t["label"] == guesses[t["category"]] for t in splits["val"]) == 6  # half
    hard = pareto_tasks("test")
    assert len(hard) == sum(PARETO_COUNTS.values()) and all(t["label"] != guesses[t["category"]] for t in hard)
    crashing = [t["crash"] for t in flaky_tasks("train")]
    assert crashing[:6] == [True, False, False, True, False, False]
    with pytest.raises(ValueError):
        classify_tasks("dev")


def _mean(template: str, tasks: list[dict[str, Any]]) -> float:
    prompt = PromptTemplate(template=template, engine="f-string")
    return sum(score(t, rule_answer(render(prompt, t)))[0] for t in tasks) / len(tasks)


@pytest.mark.parametrize("split", ["train", "val", "test"])
def test_the_pareto_lineage_has_the_designed_scores(split: str) -> None:
    tasks = pareto_tasks(split)
    seed, lineage = pareto_lineage(branch_factor=2)
    only_a, full = lineage[seed][:2], lineage[seed][2]
    assert _mean(seed, tasks) == pytest.approx(5 / 13)
    assert all(_mean(a, tasks) == pytest.approx(6 / 13) for a in only_a)
    both = [child for a in only_a for child in lineage[a]]
    assert len(set(both)) == 4 and all(_mean(ab, tasks) == pytest.approx(8 / 13) for ab in both)
    assert _mean(full, tasks) == 1.0
    assert not any(child in lineage for child in both)  # the beam's line ends there
    # The seed alone is right on the C items: no A/B candidate dominates it.
    c_items = [t for t in tasks if t["category"] == "C"]
    assert _mean(seed, c_items) == 1.0 and _mean(both[0], c_items) == 0.0


def test_good_bad_and_the_seed_on_the_classify_task() -> None:
    tasks = classify_tasks("val")
    assert _mean(CLASSIFY_SEED, tasks) == 0.5
    assert _mean(GOOD_REWRITE, tasks) == 1.0
    assert _mean(BAD_REWRITE, tasks) == 0.0
    assert _mean(hinted("A"), tasks) == pytest.approx(4 / 6)


def test_the_agents_over_http(scripted: Any) -> None:
    llm_app = scripted()
    llm = LLM(endpoint=f"{llm_app.url}/v1", model=RULE_MODEL)
    task = classify_tasks("train")[0]
    seed, good = (PromptTemplate(template=t, engine="f-string") for t in (CLASSIFY_SEED, GOOD_REWRITE))
    assert apo_agents.classify_outcome(task, llm, good) == (1.0, f"correct: {task['label']}")
    jinja = PromptTemplate(template=GOOD_REWRITE_JINJA, engine="jinja")
    assert apo_agents.classify_outcome(task, llm, jinja)[0] == 1.0
    assert llm_app.app.state.requests[-1]["messages"][0]["content"] == GOOD_REWRITE.format(text=task["text"])
    odd = next(t for t in classify_tasks("train") if t["label"] == "odd")
    assert apo_agents.classify_outcome(odd, llm, seed) == (0.0, "expected odd, got 'even'")
    assert apo_agents.classify_plain(odd, llm=llm, prompt_template=good) == 1.0
    assert apo_agents.classify(odd, llm=llm, prompt_template=good) is None  # emits its reward itself
    with pytest.raises(RuntimeError, match=FLAKY_ERROR):
        apo_agents.flaky_classify({**odd, "crash": True}, llm=llm, prompt_template=good)
    assert apo_agents.flaky_classify({**odd, "crash": False}, llm=llm, prompt_template=good) is None
    jinja_seed = PromptTemplate(template=CLASSIFY_SEED_JINJA, engine="jinja")
    assert render(jinja_seed, odd) == CLASSIFY_SEED.format(text=odd["text"])

    templates = {
        name: PromptTemplate(template=t, engine="f-string")
        for name, t in [("p0", PLANNER_SEED), ("p1", PLANNER_GOOD), ("c0", CHECKER_SEED), ("c1", CHECKER_GOOD)]
    }
    plan = apo_agents.plan_and_check_outcome
    tasks = apo_agents.plan_tasks("val")

    def mean(planner: str, checker: str) -> float:
        return sum(plan(t, llm, templates[planner], templates[checker])[0] for t in tasks) / len(tasks)

    assert mean("p0", "c0") == 0.0 and mean("p1", "c0") == 0.0  # the seed checker is always unsure
    assert mean("p0", "c1") == 0.5 and mean("p1", "c1") == 1.0
    assert plan(odd, llm, templates["p0"], templates["c1"])[1] == (
        "expected odd, got 'even' (the planner proposed 'even')"
    )
    assert apo_agents.plan_and_check(odd, llm=llm, planner=templates["p1"], checker=templates["c1"]) is None

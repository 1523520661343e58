"""Agents and tasks for the prompt-optimization (APO) tests, importable by worker processes as
``tests.apo_agents:NAME`` (``store run`` / ``store train --agent``). Their model is the rule model of
``tests.scripted_optimizer`` (a scripted stand-in, not a model; its docstring has the rules), reached through
the ``llm`` resource with the OpenAI SDK.

Agents (each renders its prompt-template resources with the task's fields, all but ``label`` and ``crash``):

* ``classify(task, llm, prompt_template)``: one call; scores 1.0 when the stripped, lower-cased answer (a
  trailing period dropped) equals ``task["label"]``, else 0.0, and emits that reward itself with a ``feedback``
  attribute (``"expected odd, got 'even'"``), returning None (so the attempt has one reward, with feedback);
* ``classify_plain(task, llm, prompt_template)``: the same, returning the score (the runner emits it; no
  feedback);
* ``plan_and_check(task, llm, planner, checker)``: the planner template (fields of the task) is asked first; its
  answer becomes the ``plan`` field of the checker template, whose answer is scored as ``classify``'s (reward
  with feedback emitted, returns None);
* ``flaky_classify(task, llm, prompt_template)``: ``classify``, except that on a task with ``crash`` true it raises
  ``RuntimeError("<FLAKY_ERROR> on task <id>")`` after its LLM call (the attempt fails: score 0, and the error
  text is what the optimizer should be shown).

Tasks: ``{"id", "text", "category", "label"}`` (``flaky_tasks`` add ``crash``), where ``text`` is an item such as
``A-17``; splits ``train``, ``val``, ``test`` never share an item; the same arguments give the same list.
"""

from __future__ import annotations

import os
import random
import threading
from collections.abc import Mapping
from typing import Any

import jinja2
from openai import DefaultHttpxClient, OpenAI

from lightning_store import LLM, PromptTemplate
from runners import rollout
from tests.scripted_optimizer import CATEGORIES, CHECK_HINT, hint
from tracers import emit_reward

SPLITS = ("train", "val", "test")
DEFAULT_COUNTS: dict[str, int] = {"A": 4, "B": 4, "C": 4}
"""Items per category of a split, by default."""
PARETO_COUNTS: dict[str, int] = {"A": 6, "B": 2, "C": 5}
"""Items per category of each split of the Pareto-versus-beam test (use with ``hard=True``)."""
FLAKY_ERROR = "flaky tool exploded"
"""In the message of every exception ``flaky_classify`` raises."""
_RENDER_SKIPS = ("label", "crash")
_JINJA = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False)
_HTTP: tuple[int, DefaultHttpxClient] | None = None
_HTTP_LOCK = threading.Lock()

# --------------------------------------------------------------------------------------------------------------
# Templates
# --------------------------------------------------------------------------------------------------------------

CLASSIFY_SEED = "Classify the item {text}. Answer with one word."
"""The one-template seed (f-string): no hint, so the rule model guesses (about 0.5 with balanced labels)."""
CLASSIFY_SEED_JINJA = "Classify the item {{ text }}. Answer with one word."
"""The same seed for the Jinja engine."""


def hinted(*categories: str, base: str = CLASSIFY_SEED, variant: int = 0) -> str:
    """``base`` with the hints of ``categories`` (``"A"``, ``"B"``, ``"C"``, or ``"check"``) appended, e.g.
    ``"Classify the item {text}. Answer with one word. Use hint-A, hint-B."``; ``variant`` > 0 adds
    ``" (variant N)"``, a different text (another candidate) with the same behaviour."""
    text = base + (" Use " + ", ".join(hint(c) for c in categories) + "." if categories else "")
    return text + (f" (variant {variant})" if variant else "")


GOOD_REWRITE = hinted("A", "B", "C")
"""Right on every item (accuracy 1.0)."""
PARTIAL_REWRITE = hinted("A")
"""Right on the A items, guesses on the others."""
BAD_REWRITE = CLASSIFY_SEED + " Explain your reasoning."
"""Answers with a sentence: accuracy 0, worse than the seed."""
INVALID_REWRITES = (
    "Classify the item. Answer with one word.",
    "Classify the item {text} in the {style} style. Answer with one word.",
    "Classify the item {text. Answer with one word.",
)
"""Refused before any rollout: drops ``{text}``; adds ``{style}``; does not parse."""
GOOD_REWRITE_JINJA = hinted("A", "B", "C", base=CLASSIFY_SEED_JINJA)
BAD_REWRITE_JINJA = CLASSIFY_SEED_JINJA + " Explain your reasoning."
INVALID_REWRITE_JINJA = "Classify the item {{ text }. Answer with one word."
"""A Jinja syntax error."""

PLANNER_SEED = "Plan: propose a one-word label for the item {text}."
"""The planner's seed: no hint, so its plan is the category's guess."""
CHECKER_SEED = "Check the plan for the item {text}. Proposed answer: {plan}. Reply with the final one-word label."
"""The checker's seed: no ``hint-check``, so every final answer is ``unsure`` (score 0)."""
PLANNER_GOOD = hinted("A", "B", "C", base=PLANNER_SEED)
"""The planner's good rewrite: its plan is the true label."""
CHECKER_GOOD = CHECKER_SEED + f" Use {CHECK_HINT}."
"""The checker's good rewrite: it keeps the plan (score = the plans' accuracy)."""


def pareto_lineage(branch_factor: int = 1) -> tuple[str, dict[str, list[str]]]:
    """The seed and the optimizer's lineage script for the Pareto-versus-beam test (see the reasoning in
    ``tests.scripted_optimizer``): seed S = ``hinted("C")``; S's first ``branch_factor`` rewrites are A-only
    variants, its next is FULL = ``hinted("A", "B", "C")``; each A-only variant's rewrites are A+B variants
    (``branch_factor`` of them); nothing further (unchanged answers: invalid). Run beam search with
    ``beam_width <= branch_factor`` and ``branch_factor`` children per member: it keeps the A-only variants (mean
    6/13 on ``PARETO_COUNTS`` with ``hard=True`` labels, over S's 5/13), drops S, and ends at an A+B candidate
    (8/13). Pareto keeps S on its frontier (the only one right on C items) and, once it has drawn S
    ``branch_factor + 1`` times, reaches FULL (1.0)."""
    seed = hinted("C")
    only_a = [hinted("A", variant=i + 1) for i in range(branch_factor)]
    lineage: dict[str, list[str]] = {seed: [*only_a, hinted("A", "B", "C")]}
    for i, parent in enumerate(only_a):
        lineage[parent] = [hinted("A", "B", variant=i * branch_factor + j + 1) for j in range(branch_factor)]
    return seed, lineage


# --------------------------------------------------------------------------------------------------------------
# Tasks
# --------------------------------------------------------------------------------------------------------------


def classify_tasks(split: str, counts: Mapping[str, int] | None = None, *, hard: bool = False) -> list[dict[str, Any]]:
    """``counts[c]`` items of each category ``c`` for ``split`` (train, val or test), categories interleaved
    (A, B, C, A, B, C, ...). Labels alternate between the category's two (balanced: the rule model's no-hint
    guess is right on half), or with ``hard`` are never the guess (a candidate is right only where it has the
    hint). Items of different splits differ: a split draws N from 1..999 with ``(N // 3) % 3`` its index."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, not {split!r}")
    per_category: list[list[dict[str, Any]]] = []
    for name, count in (counts or DEFAULT_COUNTS).items():
        category = CATEGORIES[name]
        numbers = [n for n in range(1, 1000) if (n // 3) % 3 == SPLITS.index(split)]
        random.Random(f"apo-tasks:{split}:{name}").shuffle(numbers)
        wanted = [category.labels[1] if hard else category.labels[i % 2] for i in range(count)]
        chosen: list[dict[str, Any]] = []
        for label in wanted:
            n = next((n for n in numbers if category.label(n) == label), None)
            if n is None:
                raise ValueError(f"not enough {label!r} items of category {name} for the {split} split")
            numbers.remove(n)
            chosen.append({"id": f"{split}-{name}-{n}", "text": f"{name}-{n}", "category": name, "label": label})
        per_category.append(chosen)
    longest = max((len(c) for c in per_category), default=0)
    return [chosen[i] for i in range(longest) for chosen in per_category if i < len(chosen)]


def pareto_tasks(split: str) -> list[dict[str, Any]]:
    """The Pareto-versus-beam test's split: ``PARETO_COUNTS`` items, ``hard`` labels."""
    return classify_tasks(split, PARETO_COUNTS, hard=True)


def plan_tasks(split: str, counts: Mapping[str, int] | None = None) -> list[dict[str, Any]]:
    """Tasks of ``plan_and_check``: balanced ones (its checker-first path needs the guesses to score)."""
    return classify_tasks(split, counts)


def flaky_tasks(split: str, counts: Mapping[str, int] | None = None, *, every: int = 3) -> list[dict[str, Any]]:
    """``classify_tasks`` with ``crash`` true on every ``every``-th task (the first of each ``every``)."""
    return [{**task, "crash": i % every == 0} for i, task in enumerate(classify_tasks(split, counts))]


# --------------------------------------------------------------------------------------------------------------
# Agents
# --------------------------------------------------------------------------------------------------------------


def render(template: PromptTemplate, task: Mapping[str, Any], **extra: Any) -> str:
    """The template filled with the task's fields (all but ``label`` and ``crash``) and ``extra``: ``str.format``
    for the f-string engine, Jinja (undefined names are errors) for ``jinja``."""
    fields = {k: v for k, v in task.items() if k not in _RENDER_SKIPS} | extra
    if template.engine == "jinja":
        return _JINJA.from_string(template.template).render(**fields)
    if template.engine == "f-string":
        return template.template.format(**fields)
    raise ValueError(f"the APO test agents render f-string and jinja templates, not {template.engine!r}")


def _http() -> DefaultHttpxClient:
    """One HTTP client per process, shared by every SDK client (building an SDK client's own costs ~75 ms)."""
    global _HTTP
    with _HTTP_LOCK:
        if _HTTP is None or _HTTP[0] != os.getpid():
            _HTTP = (os.getpid(), DefaultHttpxClient(timeout=60))
        return _HTTP[1]


def ask(llm: LLM, prompt: str, **options: Any) -> str:
    """One chat call with ``prompt`` as the user message (``options``: ``max_tokens``, ...); the answer's text."""
    client = OpenAI(base_url=llm.endpoint, api_key=llm.api_key or "none", max_retries=0, http_client=_http())
    messages: Any = [{"role": "user", "content": prompt}]
    reply = client.chat.completions.create(model=llm.model, messages=messages, **options)
    return reply.choices[0].message.content or ""


def score(task: Mapping[str, Any], answer: str) -> tuple[float, str]:
    """1.0 when the one-word answer is the label, else 0.0; and the feedback text."""
    word = answer.strip().rstrip(".").strip().lower()
    if word == task["label"]:
        return 1.0, f"correct: {task['label']}"
    return 0.0, f"expected {task['label']}, got {answer.strip()!r}"


def classify_outcome(task: Mapping[str, Any], llm: LLM, prompt_template: PromptTemplate) -> tuple[float, str]:
    """``classify``'s score and feedback, without emitting anything."""
    return score(task, ask(llm, render(prompt_template, task)))


def plan_and_check_outcome(
    task: Mapping[str, Any], llm: LLM, planner: PromptTemplate, checker: PromptTemplate
) -> tuple[float, str]:
    """``plan_and_check``'s score and feedback, without emitting anything."""
    plan = ask(llm, render(planner, task))
    final = ask(llm, render(checker, task, plan=plan))
    value, feedback = score(task, final)
    return value, f"{feedback} (the planner proposed {plan.strip()!r})"


@rollout
def classify(task: dict[str, Any], llm: LLM, prompt_template: PromptTemplate) -> None:
    """One-word classification with the ``prompt_template`` resource; emits the reward with feedback."""
    value, feedback = classify_outcome(task, llm, prompt_template)
    emit_reward(value, attributes={"feedback": feedback})


@rollout
def classify_plain(task: dict[str, Any], llm: LLM, prompt_template: PromptTemplate) -> float:
    """``classify`` returning its score (the runner emits the reward; no feedback)."""
    return classify_outcome(task, llm, prompt_template)[0]


@rollout
def plan_and_check(task: dict[str, Any], llm: LLM, planner: PromptTemplate, checker: PromptTemplate) -> None:
    """Two templates: the ``planner`` proposes, the ``checker`` (given the proposal as ``plan``) decides."""
    value, feedback = plan_and_check_outcome(task, llm, planner, checker)
    emit_reward(value, attributes={"feedback": feedback})


@rollout
def flaky_classify(task: dict[str, Any], llm: LLM, prompt_template: PromptTemplate) -> None:
    """``classify`` that raises on tasks with ``crash`` true (after calling its LLM)."""
    value, feedback = classify_outcome(task, llm, prompt_template)
    if task.get("crash"):
        raise RuntimeError(f"{FLAKY_ERROR} on task {task['id']}")
    emit_reward(value, attributes={"feedback": feedback})


# --------------------------------------------------------------------------------------------------------------
# A real model's task (SmolLM2): the reply's format depends on the instructions
# --------------------------------------------------------------------------------------------------------------

YES_NO_SEED = "{question}"
"""SmolLM2-135M-Instruct answers most yes/no questions from this prompt with a sentence ("The answer to ...")."""


@rollout
def yes_no_format(task: dict[str, Any], llm: LLM, prompt_template: PromptTemplate) -> None:
    """A yes/no question for a program that parses the reply: 1.0 when the reply's first word is ``yes`` or
    ``no`` (whatever the fact), else 0.0, with the reply as feedback."""
    reply = ask(llm, render(prompt_template, task), max_tokens=8, temperature=0.0)
    words = reply.split()
    first = words[0].strip(".,!?:;'\"").lower() if words else ""
    value = 1.0 if first in ("yes", "no") else 0.0
    verdict = "parses" if value else "does not start with yes or no"
    emit_reward(value, attributes={"feedback": f"reply {reply[:80]!r} {verdict}"})

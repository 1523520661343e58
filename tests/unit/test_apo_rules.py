"""APO's pure rules: which rewrites are refused before any rollout, GEPA's Pareto weights, the minibatch cycle."""

from __future__ import annotations

import random

import pytest

from algorithms.apo.candidates import Candidate, best, pareto_weights
from algorithms.apo.context import TaskCycle
from algorithms.apo.evaluation import tasks_of
from algorithms.apo.reflection import parse_rewrite
from algorithms.apo.templates import check_rewrite, placeholders
from lightning_store.resources import PromptTemplate

F = "f-string"


@pytest.mark.parametrize(
    ("parent", "engine", "child", "ok", "reason"),
    [
        ("Q: {question}", F, "Answer {question} briefly.", True, ""),
        ("Q: {question}", F, "Answer briefly.", False, "drops {question}"),
        ("Q: {question}", F, "Q: {question} in {style}", False, "adds {style}"),
        ("Q: {question}", F, "  Q: {question} ", False, "unchanged"),
        ("Q: {question}", F, "", False, "empty rewrite"),
        ("Q: {question}", F, "Q: {question} {", False, "not a valid format string"),
        ("Q: {question}", F, "Q: {question} {0}", False, "positional field"),
        ("Score {score:.2f} of {task.name}", F, "Rate {score:.2f} for {task.name}", True, ""),
        ("Q: {{ question }}", "jinja", "Answer {{ question }} now", True, ""),
        ("Q: {{ question }}", "jinja", "Answer {{ question } now", False, "Jinja syntax error"),
        ("Q: {{ question }}", "jinja", "Answer now", False, "drops {{ question }}"),
        (
            "{% for m in msgs %}{{ m.text }}{% endfor %}",
            "jinja",
            "{% for m in msgs %}- {{ m.text }}{% endfor %}",
            True,
            "",
        ),
    ],
)
def test_a_rewrite_keeps_its_placeholders_and_renders(
    parent: str, engine: str, child: str, ok: bool, reason: str
) -> None:
    verdict = check_rewrite(PromptTemplate(template=parent, engine=engine), child)
    assert verdict.ok is ok
    assert reason in verdict.reason


def test_placeholders_of_both_engines() -> None:
    assert placeholders(PromptTemplate(template="{a} {b.c} {d[0]} {{literal}}", engine=F)) == {"a", "b", "d"}
    assert placeholders(PromptTemplate(template="{{ a }} {% if b %}{{ c.d }}{% endif %}", engine="jinja")) == {
        "a",
        "b",
        "c",
    }


def _candidate(ordinal: int, scores: dict[str, float]) -> Candidate:
    template = PromptTemplate(template=f"t{ordinal} {{x}}", engine=F)
    return Candidate(ordinal, 0, {"p": template}, {"p": template}, "seed", val_scores=scores)


def test_pareto_weights_keep_per_task_winners_and_drop_the_dominated() -> None:
    seed = _candidate(0, {"a": 1, "b": 0, "c": 0, "d": 0})  # alone right on a
    wide = _candidate(1, {"a": 0, "b": 1, "c": 1, "d": 0})  # the best mean, wrong on a
    covered = _candidate(2, {"a": 0, "b": 1, "c": 0, "d": 0})  # every task it wins, `wide` wins too
    assert pareto_weights([seed, wide, covered]) == {0: 1, 1: 2}
    assert best([seed, wide, covered]) is wide
    tie = _candidate(3, {"a": 0, "b": 1, "c": 1, "d": 0})
    assert best([seed, wide, tie]) is wide  # the earliest wins a tie
    assert pareto_weights([_candidate(0, {"a": 0, "b": 0})]) == {}  # nothing won: the caller takes the best


def test_the_minibatch_cycle_draws_distinct_tasks_even_from_a_file_with_repeats() -> None:
    tasks = tasks_of([{"q": 1}, {"q": 1}, {"q": 2}])
    cycle = TaskCycle(tasks, random.Random(0))
    for _ in range(5):
        drawn = cycle.draw(3)
        assert sorted(t.input["q"] for t in drawn) == [1, 2]


def test_the_rewrite_is_read_from_the_last_template_block_or_the_whole_answer() -> None:
    assert parse_rewrite("old: <template>A {x}</template> new: <template>\nB {x}\n</template>") == "B {x}"
    assert parse_rewrite("```text\nC {x}\n```") == "C {x}"
    assert parse_rewrite("  D {x}  ") == "D {x}"

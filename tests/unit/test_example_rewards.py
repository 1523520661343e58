"""The examples' rewards give what their docstrings and the how-to pages say they give."""

from __future__ import annotations

import pytest

from examples.rag_agent.reward import reward as rag_reward
from examples.sql_agent.reward import execution_reward

HIS_DOCUMENT = ["Drakor Pexkor was born in Vellum. Drakor Pexkor works for Lumzen Works."]


@pytest.mark.parametrize(
    ("answer", "retrieved", "expected"),
    [
        ("Vellum", HIS_DOCUMENT, 1.0),  # the name, after finding its document
        ("He was born in Vellum", HIS_DOCUMENT, 0.2 + 0.8 / 3),  # a sentence around it (F1 0.33)
        ("Lumzen Works", HIS_DOCUMENT, 0.2),  # a wrong answer after finding the answer's document
        ("Vellum", ["Vellum is a city in Galdoria."], 1.0),  # any returned document that holds the answer counts
        ("Vellum", [], 0.8),  # the right name without having searched for it
        ("Lumzen Works", ["No document matches."], 0.0),
        (HIS_DOCUMENT[0] + " Vellum is a city in Galdoria.", HIS_DOCUMENT, 0.2),  # a copy of the documents: no F1
        ("Drakor Pexkor was born in Vellum.", HIS_DOCUMENT, 0.2 + 0.8 * 2 / 7),  # one sentence (6 words) counts
    ],
)
def test_the_rag_reward_is_a_share_for_finding_plus_the_answers_f1(
    answer: str, retrieved: list[str], expected: float
) -> None:
    assert rag_reward(answer, "Vellum", retrieved) == pytest.approx(expected)


def test_the_rag_rewards_finding_needs_every_word_of_a_two_word_answer() -> None:
    assert rag_reward("x", "Lumzen Works", ["Lumzen is a city."]) == 0.0
    assert rag_reward("x", "Lumzen Works", HIS_DOCUMENT) == pytest.approx(0.2)


def test_the_sql_reward_is_execution_match_with_partial_credit_for_a_query_that_runs() -> None:
    gold = "SELECT COUNT(*) FROM students"
    assert execution_reward("school", "SELECT count(id) FROM students", gold) == 1.0
    assert execution_reward("school", "DROP TABLE students", gold) == 0.0
    assert execution_reward("school", "SELECT * FROM no_such_table", gold) == 0.0
    assert execution_reward("school", None, gold) == 0.0
    assert 0.1 <= execution_reward("school", "SELECT id FROM students", gold) < 0.5

"""The RAG example's search (``examples/rag_agent/knowledge.py``) returns what its docstring and the how-to say:
the best match, the documents it links to, then the next best; never a document without a word of the query."""

from __future__ import annotations

import json
import re
from pathlib import Path

from examples.rag_agent.knowledge import search_documents

QUESTIONS = Path(__file__).parents[2] / "examples" / "rag_agent"


def test_a_persons_search_returns_the_documents_of_her_birthplace_and_her_employer() -> None:
    found = search_documents("Draos Arkor").splitlines()
    assert found == [
        "Draos Arkor was born in Arbal. Draos Arkor works for Armor Works.",
        "Arbal is a city in Morzenlum.",
        "Armor Works is a company founded in 1988. Armor Works has its headquarters in Velzen.",
    ]


def test_a_link_is_a_whole_name_not_a_part_of_one() -> None:
    found = search_documents("Baltrel").splitlines()
    assert found[:2] == [
        "Baltrel is a city in Niczenpex.",
        "Niczenpex is a country. The currency of Niczenpex is the Pexist.",
    ]
    assert not any(line.startswith("Niczen is") for line in found)  # Niczen is a city; "Niczenpex" does not link it
    assert len(found) <= 4


def test_a_query_that_shares_no_word_finds_nothing() -> None:
    assert search_documents("2017") == "No document matches."


def test_every_two_hop_answer_is_in_the_first_search_for_the_name_the_question_asks_about() -> None:
    """Why the links: one search for the question's person returns the document that holds a two-hop answer."""
    for split in ("train", "val", "test"):
        for line in (QUESTIONS / f"{split}.jsonl").read_text().splitlines():
            task = json.loads(line)
            if task["hops"] == 2:
                person = re.search(r"(?:company|country was) (.+?) (?:works for|born\?)", task["question"])
                assert person, task
                assert task["answer"] in search_documents(person[1]), task

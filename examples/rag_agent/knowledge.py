"""The RAG example's knowledge base: ``corpus.jsonl`` beside this file, searched by IDF-weighted word overlap.
Shared by the agent's ``function_tool`` and by the MCP server that serves the same search (``search_server.py``)."""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from functools import cache
from pathlib import Path

CORPUS = Path(__file__).with_name("corpus.jsonl")


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


@cache
def documents() -> list[dict[str, str]]:
    return [json.loads(line) for line in CORPUS.read_text().splitlines()]


@cache
def idf() -> dict[str, float]:
    counts = Counter(word for document in documents() for word in set(words(document["text"])))
    return {word: math.log(len(documents()) / count) for word, count in counts.items()}


def search_documents(query: str, k: int = 2) -> str:
    """The (at most) ``k`` documents whose words best cover the query's (each shared word weighs its IDF), one per
    line; a document that shares no word with the query is never returned, and none at all says so. Why not pad
    to ``k``: a small model copies whatever the search showed it last, an unrelated document included."""
    asked = set(words(query))
    scored = [(sum(idf().get(w, 0.0) for w in asked.intersection(words(d["text"]))), d) for d in documents()]
    ranked = sorted((pair for pair in scored if pair[0] > 0), key=lambda pair: -pair[0])
    return "\n".join(document["text"] for _, document in ranked[:k]) or "No document matches."

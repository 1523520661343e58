"""The RAG example's knowledge base: ``corpus.jsonl`` beside this file, searched by IDF-weighted word overlap, the
best match with the documents it links to. Shared by the agent's ``function_tool`` and by the MCP server that serves
the same search (``search_server.py``)."""

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
    """The best-matching document (its words cover the query's best, each shared word weighing its IDF), then the
    documents of the names it mentions (its links, as a wiki page's), then the rest of the ``k`` best: one per
    line, at most four. A document that shares no word with the query is never returned, and none at all says so.

    Why the links: a two-hop question (``In which country was X born?``) needs X's document and its birthplace's.
    SmolLM2-135M made a second search in none of 120 untrained rollouts of the validation questions (nor with a
    worked two-hop example to copy), so all rollouts of a two-hop question scored 0 and GRPO had nothing to
    compare; with the links, the first search returns both documents and the agent must still read the two facts
    and compose them. Why not pad to ``k``: a small model copies whatever the search showed it last, an unrelated
    document included."""
    asked = set(words(query))
    scored = [(sum(idf().get(w, 0.0) for w in asked.intersection(words(d["text"]))), d) for d in documents()]
    ranked = [document for _, document in sorted((pair for pair in scored if pair[0] > 0), key=lambda p: -p[0])]
    if not ranked:
        return "No document matches."
    best = ranked[0]
    linked = [d for d in documents() if d is not best and re.search(rf"\b{re.escape(d['title'])}\b", best["text"])]
    found = [best, *linked, *(d for d in ranked[1:k] if d not in linked)]
    return "\n".join(document["text"] for document in found[:4])

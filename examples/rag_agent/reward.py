"""The RAG example's reward: the token F1 of the agent's answer against the gold answer (SQuAD's measure), with a
share for a search that found the document holding the answer.

Both are lower-cased, stripped of punctuation and of the articles ``a``, ``an``, ``the``, and split into words;
F1 = 2PR / (P + R) over the multisets of words. ``"Ostrel"`` for ``Ostrel`` is 1.0; ``"She was born in Ostrel."``
0.33 (the right word among four others); an answer without it 0. Why F1 and not exact match: a small model first
learns to say the retrieved name at all, then to say only it, and F1 rewards both steps.

The reward is ``FOUND x found + (1 - FOUND) x F1``, with ``found`` 1 when one of the searches returned a
document holding every word of the gold answer. Why: it tells a search for the name the question asks about (which
returns the answer's document, the search following links for a two-hop question) from one that missed, even when
the answer after it is wrong; on F1 alone, before the search followed links, all four rollouts of most two-hop
questions scored 0 and GRPO had nothing to compare. The answer's F1 still counts in every case (a rambling answer
that names the right word earns more than one that does not), and the full reward needs both.
"""

from __future__ import annotations

import re
from collections import Counter


def normal_words(text: str) -> list[str]:
    return [w for w in re.findall(r"[a-z0-9]+", text.lower()) if w not in ("a", "an", "the")]


def f1(answer: str, gold: str) -> float:
    said, wanted = Counter(normal_words(answer)), Counter(normal_words(gold))
    common = sum((said & wanted).values())
    if common == 0:
        return 0.0
    precision, recall = common / sum(said.values()), common / sum(wanted.values())
    return 2 * precision * recall / (precision + recall)


FOUND = 0.2
"""The share of the reward earned by the searches' having found a document with the answer."""


def reward(answer: str, gold: str, retrieved: list[str]) -> float:
    """The rollout's reward: ``FOUND`` if a document in ``retrieved`` (the searches' outputs) holds every word of
    ``gold``, plus ``1 - FOUND`` times the answer's F1."""
    wanted = set(normal_words(gold))
    found = any(wanted <= set(normal_words(document)) for document in retrieved)
    return FOUND * found + (1 - FOUND) * f1(answer, gold)

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
questions scored 0 and GRPO had nothing to compare. The full reward needs both.

An answer of more than ``MAX_ANSWER_WORDS`` words earns no F1. Why: trained on F1 alone, the model learned to
copy the search's documents into its answer (the answer's words among twenty others, F1 0.1-0.2, more than a
wrong name earns), and its held-out exact answers fell from 1 to 0 of 60 while the reward rose; with the cap it
learned to answer with the name (3 to 16 exact answers of 60).
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
MAX_ANSWER_WORDS = 8
"""An answer of more words earns no F1: a copy of the documents names the answer among dozens of other words."""


def reward(answer: str, gold: str, retrieved: list[str]) -> float:
    """The rollout's reward: ``FOUND`` if a document in ``retrieved`` (the searches' outputs) holds every word of
    ``gold``, plus ``1 - FOUND`` times the answer's F1 when it has at most ``MAX_ANSWER_WORDS`` words."""
    wanted = set(normal_words(gold))
    found = any(wanted <= set(normal_words(document)) for document in retrieved)
    answered = f1(answer, gold) if len(normal_words(answer)) <= MAX_ANSWER_WORDS else 0.0
    return FOUND * found + (1 - FOUND) * answered

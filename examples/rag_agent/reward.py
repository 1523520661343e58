"""The RAG example's reward: the token F1 of the agent's answer against the gold answer (SQuAD's measure).

Both are lower-cased, stripped of punctuation and of the articles ``a``, ``an``, ``the``, and split into words;
F1 = 2PR / (P + R) over the multisets of words. ``"Ostrel"`` for ``Ostrel`` is 1.0; ``"She was born in Ostrel."``
0.33 (the right word among four others); an answer without it 0. Why F1 and not exact match: a small model first
learns to say the retrieved name at all, then to say only it, and F1 rewards both steps.
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

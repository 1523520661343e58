"""The calculator example's reward: numeric match, with credit on the way to it.

The answer is the last number in the agent's final message (thousands separators ignored). It scores 1.0 when it
equals the task's answer (within 1e-6). Otherwise at most 0.5: 0.25 × the share of the problem's numbers that the
expression the agent computed uses, plus 0.25 × ``max(0, 1 − |answer − gold| / |gold|)``. So an expression with
both numbers and the wrong operation (``7653 + 1862`` for 5791) earns 0.25 and a little closeness, one number
copied 0.125, a number out of nowhere almost nothing. Why the shaping: an untrained 135M model seldom writes the
exact expression; copying the problem's numbers is the first step it can learn, and a reward of 0 for every near
miss gives GRPO nothing to compare within a group.
"""

from __future__ import annotations

import re

NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def numbers(text: str) -> list[float]:
    found = []
    for match in NUMBER.findall(text):
        try:
            found.append(float(match.replace(",", "")))
        except ValueError:
            continue
    return found


def numeric_reward(answer: str, gold: float, *, question: str = "", expression: str = "") -> float:
    """The reward of an agent's final ``answer`` to ``question``, whose expression was ``expression``."""
    said = numbers(answer)
    if said and abs(said[-1] - gold) <= 1e-6:
        return 1.0
    closeness = max(0.0, 1.0 - abs(said[-1] - gold) / abs(gold)) if said else 0.0
    asked, used = numbers(question), set(numbers(expression))
    copied = sum(n in used for n in asked) / len(asked) if asked else 0.0
    return 0.25 * copied + 0.25 * closeness

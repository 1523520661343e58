"""A yes/no question answerer written with the plain OpenAI SDK, for prompt optimization (APO).

The agent formats its ``prompt_template`` resource (an f-string with ``{question}``) with the task's question,
sends it as the one user message to the LLM its resources name, and is rewarded 1.0 when the first word of the
answer, lower-cased and stripped of punctuation, is the task's ``answer`` (``yes`` or ``no``), else 0.0. So a
correct answer that starts with anything else (``"A dog is a mammal, so yes"``) scores 0: what the prompt must
get right is the format as well as the fact.

Tasks are JSON objects ``{"id": ..., "question": "Is a dog a mammal?", "answer": "yes"}`` (``train.jsonl``,
``val.jsonl``, ``test.jsonl`` beside this file). Run it with
``store train --algorithm apo --agent examples.apo.agent:answer ...``.
"""

from __future__ import annotations

import string
from typing import Any

from openai import DefaultHttpxClient, OpenAI

from lightning_store.resources import LLM, PromptTemplate
from runners import rollout

MAX_TOKENS = 8
"""Enough for a one-word answer and a few words after it (the reward reads the first word only), and enough of a
rambling answer for the optimizer to see what went wrong."""
HTTP = DefaultHttpxClient(timeout=120)
"""One connection pool for every rollout of this worker process (a new ``OpenAI()`` builds its own otherwise)."""


def first_word(text: str) -> str:
    """The answer's first word, lower-cased, with the punctuation around it removed (``"Yes."`` -> ``yes``)."""
    words = text.split()
    return words[0].strip(string.punctuation).lower() if words else ""


def score(task: dict[str, Any], reply: str) -> float:
    return 1.0 if first_word(reply) == task["answer"] else 0.0


@rollout
def answer(task: dict[str, Any], llm: LLM, prompt_template: PromptTemplate) -> float:
    client = OpenAI(base_url=llm.endpoint, api_key=llm.api_key or "unused", max_retries=0, http_client=HTTP)
    prompt = prompt_template.format(question=task["question"])
    completion = client.chat.completions.create(
        model=llm.model,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=MAX_TOKENS,
        temperature=0.0,
    )
    return score(task, completion.choices[0].message.content or "")

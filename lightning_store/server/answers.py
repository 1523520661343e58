"""An upstream's answer read as a training transition, or the reason it cannot be one.

The proxy records every call that got an answer. What it records must obey the limits of what the API accepts
(ADR 0010: the door applies to what comes back from upstreams too), and one malformed answer must never cost
the records of other calls. So an answer is read here, once, without raising:

- an answer that is a JSON object within the limits is kept as the record's ``response``; one that is not (a
  list, a string, non-finite numbers, integers beyond 64 bits, nesting deeper than
  :data:`~lightning_store.limits.MAX_DEPTH`) is kept as its raw text, ``{"raw": "…"}``, at most
  :data:`MAX_RAW_CHARS` characters;
- the token ids and logprobs are read strictly: token ids are integers in ``[0, 2³¹)`` (a vocabulary index),
  logprobs finite numbers, one per response token when there are both. An answer whose ids or logprobs break
  that (or whose ``choices`` is not a list of objects) is recorded without them, with
  :attr:`Answer.problem` saying why: the record's ``error``, which adapters read as "not trainable".

An answer without token ids at all (a hosted model) is not a problem: it is recorded with empty ids, as before.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, NoReturn

from lightning_store.errors import InvalidRequestError
from lightning_store.limits import MAX_INT32, check_json, storable, storable_text

MAX_RAW_CHARS = 1 << 20
"""The most characters of an unreadable answer's raw text a record keeps."""
MAX_FINISH_REASON = 32
"""The record's ``finish_reason`` column width."""


class NotATransition(ValueError):
    """An answer's token ids or logprobs cannot be read; the message says which and why."""


@dataclass
class Answer:
    """What a record keeps of one answer. ``problem`` is None when the answer is a transition (possibly without
    token ids); else the ids are empty and the problem says why."""

    response: dict[str, Any]
    model: str | None = None
    prompt_token_ids: list[int] = field(default_factory=list)
    response_token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    problem: str | None = None


class TooDeep(ValueError):
    """JSON nested deeper than Python's parser goes: it is JSON, but it cannot be read."""


def parse(raw: bytes | str) -> Any:
    """``raw`` parsed as JSON. Raises ``ValueError`` when it is not JSON, :class:`TooDeep` (one too) when it
    nests deeper than Python's parser goes."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise TooDeep("the answer is nested too deep to parse") from None


def answer_from(raw: bytes) -> Answer | None:
    """The record of the answer whose JSON text is ``raw``; None when ``raw`` is not JSON (the proxy answers
    that with a 502). Never raises."""
    try:
        value = parse(raw)
    except TooDeep as exc:  # JSON all the same: the agent gets it, the record says why it is not trainable
        return Answer(response=raw_response(raw), problem=str(exc))
    except ValueError:
        return None
    return read_answer(value, raw)


def read_answer(value: Any, raw: bytes | str) -> Answer:
    """The record of an answer ``value`` parsed from the JSON text ``raw``; never raises."""
    try:
        check_json(value, "answer", text=False)
    except InvalidRequestError as exc:
        return Answer(response=raw_response(raw), problem=f"the answer cannot be stored as JSON: {exc}")
    if not isinstance(value, dict):
        return Answer(response=raw_response(raw), problem=f"the answer is a JSON {_kind(value)}, not an object")
    return read_storable(storable(value, raw))


def read_storable(value: dict[str, Any]) -> Answer:
    """The record of an answer already within the limits (:func:`read_answer` checked it, or the stream
    assembler built it from checked parts)."""
    model = value.get("model")
    answer = Answer(response=value, model=model if isinstance(model, str) else None)
    try:
        choice = _first_choice(value)
        prompt = value.get("prompt_token_ids") or choice.get("prompt_token_ids") or []
        answer.prompt_token_ids = token_ids(prompt, "prompt_token_ids")
        answer.response_token_ids = token_ids(choice.get("token_ids") or [], "choices.0.token_ids")
        answer.logprobs = choice_logprobs(choice)
        if answer.logprobs and len(answer.logprobs) != len(answer.response_token_ids):
            raise NotATransition(
                f"{len(answer.logprobs)} logprobs for {len(answer.response_token_ids)} response token ids"
            )
        answer.finish_reason = finish_reason(choice.get("finish_reason"))
    except NotATransition as exc:
        answer.prompt_token_ids, answer.response_token_ids, answer.logprobs = [], [], []
        answer.problem = str(exc)
    return answer


def raw_response(raw: bytes | str) -> dict[str, Any]:
    """An unreadable answer as a record keeps it: its text, at most :data:`MAX_RAW_CHARS` characters."""
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
    return {"raw": storable_text(text[:MAX_RAW_CHARS])}


def token_ids(value: Any, where: str) -> list[int]:
    """``value`` as a list of token ids, or :class:`NotATransition` naming ``where``."""
    if not isinstance(value, list):
        raise NotATransition(f"{where} is a JSON {_kind(value)}, not a list of token ids")
    if not value or (set(map(type, value)) == {int} and min(value) >= 0 and max(value) <= MAX_INT32):
        return value  # the common case, checked in C
    for index, item in enumerate(value):
        if type(item) is not int or not 0 <= item <= MAX_INT32:
            raise NotATransition(f"{where}.{index} is {_shown(item)}, not a token id (an integer in [0, 2^31))")
    return value


def choice_logprobs(choice: dict[str, Any]) -> list[float]:
    """The sampled tokens' logprobs of one choice, as vLLM returns them for chat (``logprobs.content``) and for
    completions (``logprobs.token_logprobs``, where a null stands for a prompt token and is skipped)."""
    logprobs = choice.get("logprobs")
    if logprobs is None:
        return []
    if not isinstance(logprobs, dict):
        raise NotATransition(f"choices.0.logprobs is a JSON {_kind(logprobs)}, not an object")
    content = logprobs.get("content")
    if content is not None:  # chat
        if not isinstance(content, list):
            raise NotATransition(f"choices.0.logprobs.content is a JSON {_kind(content)}, not a list")
        try:
            values = [item["logprob"] for item in content]
        except (TypeError, KeyError):
            _refuse_first_bad_item(content)
        if not _finite_numbers(values):
            _refuse_first_bad_item(content)
        return [float(v) for v in values] if int in set(map(type, values)) else values  # common: all floats
    listed = logprobs.get("token_logprobs") or []
    if not isinstance(listed, list):
        raise NotATransition(f"choices.0.logprobs.token_logprobs is a JSON {_kind(listed)}, not a list")
    return [logprob(v, f"choices.0.logprobs.token_logprobs.{i}") for i, v in enumerate(listed) if v is not None]


def logprob(value: Any, where: str) -> float:
    if type(value) not in (int, float) or not math.isfinite(value):
        raise NotATransition(f"{where} is {_shown(value)}, not a log-probability (a finite number)")
    return float(value)


def _refuse_first_bad_item(content: list[Any]) -> NoReturn:
    """Raise :class:`NotATransition` naming the first item of ``logprobs.content`` without a finite logprob."""
    for index, item in enumerate(content):
        if not isinstance(item, dict) or "logprob" not in item:
            raise NotATransition(f"choices.0.logprobs.content.{index} has no logprob")
        logprob(item["logprob"], f"choices.0.logprobs.content.{index}.logprob")
    raise NotATransition("choices.0.logprobs.content holds an item that is not a logprob")


def _finite_numbers(values: list[Any]) -> bool:
    """Whether every item is a finite int or float (not a bool), checked in C-speed passes."""
    return set(map(type, values)) <= {float, int} and all(map(math.isfinite, values))


def finish_reason(value: Any) -> str | None:
    return value[:MAX_FINISH_REASON] if isinstance(value, str) and value else None


def _first_choice(value: dict[str, Any]) -> dict[str, Any]:
    choices = value.get("choices")
    if choices is None:
        return {}
    if not isinstance(choices, list):
        raise NotATransition(f"choices is a JSON {_kind(choices)}, not a list")
    if not choices:
        return {}
    if not isinstance(choices[0], dict):
        raise NotATransition(f"choices.0 is a JSON {_kind(choices[0])}, not an object")
    return choices[0]


def _kind(value: Any) -> str:
    names = {dict: "object", list: "list", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def _shown(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, str | int | float | bool) or value is None else _kind(value)
    return text if len(text) <= 40 else f"{text[:37]}..."

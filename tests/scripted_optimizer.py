"""A scripted STAND-IN for the two LLMs of a prompt-optimization (APO) run: there is no hosted LLM offline, so the
tests serve this instead. It is not a model: every answer follows a script or a fixed rule, so that an APO run is
deterministic and its outcome can be designed in advance.

One OpenAI-compatible endpoint, ``POST /v1/chat/completions`` (non-streaming; ``stream`` is answered 400), plus
``GET /v1/models``. The request's ``model`` picks the role:

**``model == "rule-model"`` (RULE_MODEL): the agents' model.** It answers from the prompt text (every message's
content, joined by newlines) by the rules below, so that the wording of a prompt template decides the answer.

* The *item* is the first ``X-N`` in the prompt (``X`` a category letter A, B or C, ``N`` a number 1..999, e.g.
  ``A-17``); the task generators (``tests/apo_agents.py``) put it in the ``text`` field. Its true label:

  ====  ==============================  ===============  ======================
  cat.  label                           labels           guess (without hint)
  ====  ==============================  ===============  ======================
  A     parity of N                     even / odd       even
  B     N < 500                         small / large    small
  C     N divisible by 3                fizz / buzz      fizz
  ====  ==============================  ===============  ======================

* Rule 1 (no item): the answer is ``unknown``.
* Rule 2 (checker): when the prompt holds a proposal, ``Proposed answer: WORD`` (case-insensitive), the model
  *checks* it: it answers WORD (lower-cased) when the prompt contains ``hint-check``, else ``unsure``. Category
  hints are ignored in such a prompt.
* Rule 3 (classifier): otherwise it answers the true label when the prompt contains ``hint-X`` for the item's
  category X (case-insensitive, a whole word: ``hint-A``), else the category's guess (right on about half the
  items, or on none with the generators' ``hard=True`` labels).
* Rule 4 (format): when the prompt contains a word starting with ``explain`` (case-insensitive), the answer is a
  sentence (``"Let me explain: A-17 looks odd to me."``) instead of one word, which an agent comparing one word
  scores 0.

So for the one-template test (``classify``): a rewrite adding hints is *good* (all hints: accuracy 1.0), one asking
for an explanation is *bad* (accuracy 0, worse than the seed's guesses), one dropping ``{text}`` is *invalid* (the
APO refuses it before any rollout; the model would say ``unknown``). For the two-template test
(``plan_and_check``: the planner's answer becomes the checker's ``Proposed answer``), the final answer is right only
when the planner has the category's hint (or the guess happens to be right) AND the checker has ``hint-check``:
with neither, every answer is ``unsure`` (score 0); the checker's rewrite alone lifts the score to the guesses'
(about 0.5 with balanced labels); the planner's rewrite then lifts it to 1.0 (while the planner's alone changes
nothing, as the checker still says ``unsure``).

**Why the rules separate Pareto from beam search** (``tests.apo_agents.pareto_lineage`` builds this script).
Category hints add up: a candidate with hints for a set of categories is right exactly on those categories'
items (with ``hard=True`` labels, where every guess is wrong), so candidates *trade* tasks and the per-task
winners differ from the best mean. With validation counts A=6, B=2, C=5 (``PARETO_COUNTS``):

* the seed S has ``hint-C`` only: mean 5/13, but the only candidate right on C items;
* the optimizer's first rewrite of S is A1 = ``hint-A`` only (it *drops* ``hint-C``): mean 6/13 > S's, so a beam
  of width 1 (or width w with the first w rewrites of S all A-only) keeps A1 and drops S for good;
* A1 is rewritten to AB = ``hint-A, hint-B``: mean 8/13, still wrong on every C item, and AB has no script entry
  (its rewrites come back unchanged: invalid), so the beam ends at AB (held-out 8/13);
* the per-task Pareto frontier keeps S (it alone wins the C items, so AB never dominates it) and draws it again
  as a parent (weight 5 of 13 per round), and S's next rewrite is FULL = ``hint-A, hint-B, hint-C``: 1.0 on
  validation and held-out test. A candidate that is best on some tasks though not on the mean, rewritten further,
  reaches the best score, which beam search, keeping only the top means, cannot.

**Any other model: the optimizer** (``scripted-optimizer``, OPTIMIZER_MODEL, is the conventional name; a
``gradient_model``/``apply_edit_model`` of another name lands here too, and is recorded). The request's last user
message says what is asked (see ``algorithms/apo/SPEC.md``, "Optimizer requests"):

* ``# Task: critique``: the answer is a fixed critique naming the template (``Template name: NAME``) and counting
  the report's rollouts by verdict: a section header ``### Rollout N: FAILED (`` counts as failed
  (``FAILED_MARKER``, a regex; ``LOW_SCORE_MARKER`` and ``ROLLOUT_MARKER`` likewise), e.g.
  ``"CRITIQUE of template prompt_template: the report holds 4 rollouts, 1 FAILED, 2 LOW SCORE. ..."``
  (``critique=`` replaces it).
* ``# Task: rewrite``: the answer is the next proposal for the template between ``<template>`` and
  ``</template>`` in the request (the parent), taken from, in this order:

  1. ``lineage``: ``{parent template text: [child texts...]}`` (texts compared stripped), one cursor per parent;
  2. ``script``: ``{template name: [texts...]}``, one cursor per template name (whatever the parent);
  3. else the parent unchanged (the APO refuses it as ``unchanged``).

  When a list is used up, ``exhausted`` decides: ``"repeat"`` its last entry (default), ``"cycle"`` from its
  start, or ``"echo"`` the parent unchanged. An entry is a template text, answered as ``answer_format`` says
  (``tagged``: ``<template>\\nTEXT\\n</template>``; ``prose``: the same inside sentences; ``fenced``: in a code
  fence, no tags; ``bare``: the text alone), or a :class:`Raw` answered verbatim.

Every answer carries ``usage`` with word counts: ``prompt_tokens`` = words of all message contents,
``completion_tokens`` = words of the answer (at least 1), ``total_tokens`` their sum. The rule model's answers
also carry token ids the way vLLM returns them (as ``tests.scripted_upstream``), for the store's LLM proxy.

``app.state.requests`` keeps every request body answered (like ``tests.scripted_upstream``), ``app.state.log`` one
dict per answer: ``kind`` (``critique`` | ``edit`` | ``rule``), ``model``, ``template`` (name, optimizer calls),
``parent`` (edits), ``answer`` (the text answered; for edits the proposal before wrapping, ``None`` for a
:class:`Raw`), ``source`` (edits: ``lineage`` | ``script`` | ``echo``), and for critiques ``rollouts``,
``failed``, ``low_score``.

:func:`serve_scripted` serves an app on 127.0.0.1 (an ephemeral port) from a background thread, so that the test
process and its subprocesses (``store run`` workers, ``store train``) reach it while the test blocks.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

RULE_MODEL = "rule-model"
"""The agents' model: answers by the rules in the module docstring."""
OPTIMIZER_MODEL = "scripted-optimizer"
"""The conventional optimizer model name (any model other than RULE_MODEL is answered as the optimizer)."""

FAILED_MARKER = r"^### Rollout \d+: FAILED\b"
"""A failed rollout's section header in the critique request's report (a multiline regex)."""
LOW_SCORE_MARKER = r"^### Rollout \d+: LOW SCORE\b"
"""A low-scoring (succeeded, score < 1) rollout's section header."""
ROLLOUT_MARKER = r"^### Rollout \d+:"
"""Any rollout's section header."""

CRITIQUE_PREFIX = "CRITIQUE of template "
"""Every default critique starts with this, then the template name."""
CREATED = 1_700_000_000
"""The ``created`` stamp of every answer (fixed, so that answers are the same from run to run)."""

Exhausted = Literal["repeat", "cycle", "echo"]
AnswerFormat = Literal["tagged", "prose", "fenced", "bare"]


# --------------------------------------------------------------------------------------------------------------
# The rule model
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Category:
    """A task category of the rule model: its two labels, the rule choosing between them, the no-hint guess."""

    name: str
    labels: tuple[str, str]
    guess: str
    rule: str

    def label(self, number: int) -> str:
        """The true label of item ``NAME-number``."""
        if self.name == "A":
            return "even" if number % 2 == 0 else "odd"
        if self.name == "B":
            return "small" if number < 500 else "large"
        return "fizz" if number % 3 == 0 else "buzz"


CATEGORIES: dict[str, Category] = {
    "A": Category("A", ("even", "odd"), "even", "even when the number is even, else odd"),
    "B": Category("B", ("small", "large"), "small", "small when the number is below 500, else large"),
    "C": Category("C", ("fizz", "buzz"), "fizz", "fizz when the number is divisible by 3, else buzz"),
}
ITEM = re.compile(r"\b([ABC])-(\d{1,3})\b")
PROPOSAL = re.compile(r"proposed answer:\s*([A-Za-z]+)", re.IGNORECASE)
CHECK_HINT = "hint-check"
EXPLAIN = re.compile(r"\bexplain", re.IGNORECASE)


def hint(category: str) -> str:
    """The instruction phrase that makes the rule model right on ``category``'s items: ``hint-A``."""
    return f"hint-{category}"


def true_label(item: str) -> str:
    """The true label of an item text such as ``A-17``."""
    match = ITEM.fullmatch(item.strip())
    if match is None:
        raise ValueError(f"not an item: {item!r} (want X-N with X in A, B, C and N in 1..999)")
    return CATEGORIES[match.group(1)].label(int(match.group(2)))


def _has_phrase(prompt: str, phrase: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(phrase)}(?![\w-])", prompt, re.IGNORECASE) is not None


def rule_answer(prompt: str) -> str:
    """The rule model's answer to a prompt (the module docstring's rules 1-4)."""
    item = ITEM.search(prompt)
    if item is None:
        answer = "unknown"
    else:
        category = CATEGORIES[item.group(1)]
        proposal = PROPOSAL.search(prompt)
        if proposal is not None:
            answer = proposal.group(1).lower() if _has_phrase(prompt, CHECK_HINT) else "unsure"
        elif _has_phrase(prompt, hint(category.name)):
            answer = category.label(int(item.group(2)))
        else:
            answer = category.guess
    if EXPLAIN.search(prompt):
        subject = item.group(0) if item is not None else "this"
        answer = f"Let me explain: {subject} looks {answer} to me."
    return answer


# --------------------------------------------------------------------------------------------------------------
# The optimizer
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Raw:
    """A script entry answered verbatim (not wrapped in ``<template>`` tags): for testing odd optimizer answers."""

    text: str


Entry = str | Raw
_TEMPLATE = re.compile(r"<template>\s*?\n?(.*?)\n?\s*</template>", re.DOTALL)
_NAME = re.compile(r"^Template name:\s*(.+?)\s*$", re.MULTILINE)


@dataclass(frozen=True)
class ReportCounts:
    """How many rollouts a critique request's report holds, by verdict."""

    rollouts: int
    failed: int
    low_score: int


def report_counts(
    text: str,
    failed_marker: str = FAILED_MARKER,
    low_score_marker: str = LOW_SCORE_MARKER,
    rollout_marker: str = ROLLOUT_MARKER,
) -> ReportCounts:
    """Count the markers (multiline regexes) in a critique request's user message."""

    def count(pattern: str) -> int:
        return len(re.findall(pattern, text, re.MULTILINE))

    return ReportCounts(count(rollout_marker), count(failed_marker), count(low_score_marker))


def default_critique(name: str, counts: ReportCounts) -> str:
    """The fixed critique: names the template and counts the report's rollouts by verdict."""
    return (
        f"{CRITIQUE_PREFIX}{name}: the report holds {counts.rollouts} rollouts, {counts.failed} FAILED, "
        f"{counts.low_score} LOW SCORE. The template lacks the rule for some categories; state it."
    )


def template_name(user: str) -> str:
    """The ``Template name: NAME`` of an optimizer request ("" when absent)."""
    match = _NAME.search(user)
    return match.group(1) if match else ""


def current_template(user: str) -> str:
    """The template between the first ``<template>`` and ``</template>`` of an optimizer request."""
    match = _TEMPLATE.search(user)
    return match.group(1) if match else ""


def wrap(text: str, answer_format: AnswerFormat) -> str:
    """A proposal as the optimizer's answer."""
    if answer_format == "tagged":
        return f"<template>\n{text}\n</template>"
    if answer_format == "prose":
        return (
            "Here is the rewritten template, following the critique.\n\n"
            f"<template>\n{text}\n</template>\n\nIt keeps every placeholder."
        )
    if answer_format == "fenced":
        return f"```\n{text}\n```"
    return text


class _Cursors:
    """Lists consumed in order, one cursor per key."""

    def __init__(self, lists: Mapping[str, Sequence[Entry]], exhausted: Exhausted) -> None:
        self.lists = {key: list(entries) for key, entries in lists.items()}
        self.exhausted = exhausted
        self.used: dict[str, int] = {}

    def next(self, key: str) -> Entry | None:
        """The key's next entry; None when the key has none (or its list is used up and ``exhausted="echo"``)."""
        entries = self.lists.get(key)
        if not entries:
            return None
        index = self.used.get(key, 0)
        self.used[key] = index + 1
        if index < len(entries):
            return entries[index]
        if self.exhausted == "repeat":
            return entries[-1]
        if self.exhausted == "cycle":
            return entries[index % len(entries)]
        return None


def words(text: str) -> int:
    """The stand-in's token count: whitespace-separated words."""
    return len(text.split())


def create_app(
    script: Mapping[str, Sequence[Entry]] | None = None,
    *,
    lineage: Mapping[str, Sequence[Entry]] | None = None,
    exhausted: Exhausted = "repeat",
    answer_format: AnswerFormat = "tagged",
    critique: Callable[[str, ReportCounts], str] | None = None,
    failed_marker: str = FAILED_MARKER,
    rule_models: Sequence[str] = (RULE_MODEL,),
) -> FastAPI:
    """The stand-in as an ASGI app (see the module docstring).

    ``script``: template name -> proposals, one cursor per name; ``lineage``: parent template text -> proposals,
    one cursor per parent (tried first); ``exhausted``: what a used-up list answers (``repeat`` its last entry,
    ``cycle``, ``echo`` the parent); ``answer_format``: how a proposal is wrapped; ``critique``: replaces the fixed
    critique, called with the template name and the report's counts; ``failed_marker``: the regex counting failed
    rollouts; ``rule_models``: the model names answered by the rules."""
    app = FastAPI()
    app.state.requests = []
    app.state.log = []
    by_name = _Cursors(script or {}, exhausted)
    by_parent = _Cursors({key.strip(): entries for key, entries in (lineage or {}).items()}, exhausted)
    critic = critique or default_critique
    rule_names = set(rule_models)

    @app.get("/v1/models")
    async def models() -> Any:
        names = [*rule_names, OPTIMIZER_MODEL]
        return {"object": "list", "data": [{"id": n, "object": "model", "owned_by": "scripted"} for n in names]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        body = await request.json()
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return _error(400, "the scripted stand-in wants a chat completion request with messages")
        if body.get("stream"):
            return _error(400, "the scripted stand-in does not stream")
        app.state.requests.append(body)
        messages = [m for m in body["messages"] if isinstance(m, dict)]
        model = str(body.get("model") or "")
        if model in rule_names:
            answer = rule_answer("\n".join(_text(m.get("content")) for m in messages))
            app.state.log.append({"kind": "rule", "model": model, "answer": answer})
            return _completion(body, messages, answer, len(app.state.requests), token_ids=True)
        users = [_text(m.get("content")) for m in messages if m.get("role") == "user"]
        user = users[-1] if users else ""
        name = template_name(user)
        if user.startswith("# Task: critique"):
            counts = report_counts(user, failed_marker=failed_marker)
            answer = critic(name, counts)
            app.state.log.append(
                {
                    "kind": "critique",
                    "model": model,
                    "template": name,
                    "answer": answer,
                    "rollouts": counts.rollouts,
                    "failed": counts.failed,
                    "low_score": counts.low_score,
                }
            )
        elif user.startswith("# Task: rewrite"):
            parent = current_template(user)
            entry, source = by_parent.next(parent.strip()), "lineage"
            if entry is None:
                entry, source = by_name.next(name), "script"
            if entry is None:
                entry, source = parent, "echo"
            proposal = None if isinstance(entry, Raw) else entry
            answer = entry.text if isinstance(entry, Raw) else wrap(entry, answer_format)
            app.state.log.append(
                {
                    "kind": "edit",
                    "model": model,
                    "template": name,
                    "parent": parent,
                    "answer": proposal,
                    "source": source,
                }
            )
        else:
            return _error(400, "the scripted optimizer answers '# Task: critique' and '# Task: rewrite' only")
        return _completion(body, messages, answer, len(app.state.requests), token_ids=False)

    return app


def _completion(
    body: dict[str, Any], messages: list[dict[str, Any]], answer: str, ordinal: int, *, token_ids: bool
) -> dict[str, Any]:
    prompt_tokens = sum(words(_text(m.get("content"))) for m in messages)
    completion_tokens = max(1, words(answer))
    choice: dict[str, Any] = {
        "index": 0,
        "message": {"role": "assistant", "content": answer},
        "finish_reason": "stop",
    }
    reply: dict[str, Any] = {
        "id": f"chatcmpl-scripted-{ordinal}",
        "object": "chat.completion",
        "created": CREATED,
        "model": body.get("model") or "scripted",
        "choices": [choice],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }
    if token_ids:
        ids = list(range(1000, 1000 + completion_tokens))
        reply["prompt_token_ids"] = list(range(1, 1 + prompt_tokens))
        choice["token_ids"] = ids
        choice["logprobs"] = {
            "content": [{"token": str(t), "logprob": -0.5, "bytes": None, "top_logprobs": []} for t in ids]
        }
    return reply


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "invalid_request_error"}}, status_code=status)


def _text(content: Any) -> str:
    """A message's content as text (a string, or a list of content parts)."""
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return str(content or "")


# --------------------------------------------------------------------------------------------------------------
# Serving
# --------------------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def serve_scripted(app: Any, *, startup_timeout: float = 30.0) -> Iterator[str]:
    """Serve an ASGI app with uvicorn on 127.0.0.1 (an ephemeral port) in a background thread; yields its root
    URL, ``http://127.0.0.1:PORT`` (the OpenAI base URL is that plus ``/v1``). Being a thread with its own event
    loop, it answers while the test blocks (on a subprocess, say), and from any process on this machine."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, name="scripted-llm", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the scripted LLM server stopped before it started")
        if time.monotonic() > deadline:
            server.should_exit = True
            raise TimeoutError(f"the scripted LLM server did not start in {startup_timeout} s")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)

"""``GET /dashboard/search?text=…``: the LLM calls whose prompt or response holds a text, newest first, each with
the passage that matched and a link to the call on its rollout's page.

What is searched: the text of each recorded call's messages (their ``content``, and the arguments of the tool calls
they carry) and of its answer (the message's content and tool calls), case-insensitively (on SQLite, for ASCII
letters only). The database narrows the calls with ``LIKE`` over the JSON of ``request`` and ``response`` (the text
sought written as JSON writes it, so that quotes, newlines and non-ASCII letters match); each candidate is then
checked on its text, so that a word matching a JSON key (``role``) finds nothing. It is a scan of the
``llm_calls`` table: seconds on millions of calls, and at most :data:`MAX_CANDIDATES` candidates are read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from lightning_store.dashboard.prompt_diff import json_value
from lightning_store.dashboard.reader import Reader, reader_of
from lightning_store.dashboard.templating import render
from lightning_store.dashboard.timing import TimedReader
from lightning_store.transcript import text_of

router = APIRouter()

MAX_RESULTS = 50
MAX_CANDIDATES = 400
"""Calls the database returns at most for one search (it narrows; the text check decides)."""
MAX_TEXT = 200
CONTEXT = 70
"""Characters shown on each side of a match."""


@dataclass
class Hit:
    rollout_id: str
    span_id: str | None
    agent_name: str | None
    model: str | None
    start_time: float
    where: str
    """``prompt`` (which message: ``prompt · user``) or ``response``."""
    before: str
    match: str
    after: str


@router.get("/search", response_class=HTMLResponse)
async def search(request: Request, text: str = "") -> Response:
    """The search form, and the calls that hold ``text``."""
    reader = TimedReader(reader_of(request))
    sought = text.strip()[:MAX_TEXT]
    hits, more = (await find(reader, sought)) if sought else ([], False)
    context = {"page": "search", "text": sought, "hits": hits, "more": more, "max": MAX_RESULTS}
    return reader.stamp(render(request, "search.html", context))


async def find(reader: Reader, sought: str) -> tuple[list[Hit], bool]:
    """Up to :data:`MAX_RESULTS` calls whose prompt or response text holds ``sought``, newest first, and whether
    more may hold it."""
    # Within JSON, text is written escaped; SQLite's JSON is ASCII-only (json.dumps' default), Postgres' is not.
    written = json.dumps(sought, ensure_ascii=not reader.postgres)[1:-1].lower()
    pattern = "%" + written.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
    rows = await reader.rows(
        "SELECT rollout_id, span_id, agent_name, model, start_time, request, response FROM llm_calls "
        "WHERE lower(CAST(request AS TEXT)) LIKE :pattern ESCAPE '\\' "
        "OR lower(CAST(response AS TEXT)) LIKE :pattern ESCAPE '\\' "
        "ORDER BY start_time DESC, pk DESC LIMIT :limit",
        {"pattern": pattern, "limit": MAX_CANDIDATES + 1},
    )
    hits = [hit for row in rows[:MAX_CANDIDATES] if (hit := _hit(row, sought)) is not None]
    return hits[:MAX_RESULTS], len(hits) > MAX_RESULTS or len(rows) > MAX_CANDIDATES


def _hit(row: dict[str, Any], sought: str) -> Hit | None:
    for where, text in _texts(json_value(row["request"]), json_value(row["response"])):
        at = text.casefold().find(sought.casefold())
        if at < 0:
            continue
        end = at + len(sought)
        return Hit(
            rollout_id=row["rollout_id"],
            span_id=row["span_id"],
            agent_name=row["agent_name"],
            model=row["model"],
            start_time=row["start_time"],
            where=where,
            before=("…" if at > CONTEXT else "") + text[max(0, at - CONTEXT) : at],
            match=text[at:end],
            after=text[end : end + CONTEXT] + ("…" if end + CONTEXT < len(text) else ""),
        )
    return None


def _texts(request: Any, response: Any) -> list[tuple[str, str]]:
    """(where, text) of every message of the prompt and of the answer."""
    found: list[tuple[str, str]] = []
    messages = request.get("messages") if isinstance(request, dict) else None
    for message in messages if isinstance(messages, list) else []:
        if isinstance(message, dict):
            found += _message_texts(f"prompt · {message.get('role', '?')}", message)
    prompt = request.get("prompt") if isinstance(request, dict) else None  # a text completion
    if isinstance(prompt, str):
        found.append(("prompt", prompt))
    choices = response.get("choices") if isinstance(response, dict) else None
    for choice in choices if isinstance(choices, list) else []:
        if isinstance(choice, dict):
            message = choice.get("message")
            if isinstance(message, dict):
                found += _message_texts("response", message)
            if isinstance(choice.get("text"), str):
                found.append(("response", choice["text"]))
    return found


def _message_texts(where: str, message: dict[str, Any]) -> list[tuple[str, str]]:
    texts = [(where, text_of(message.get("content")) or "")]
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else []:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            texts.append((f"{where} · tool call {function.get('name', '?')}", str(function.get("arguments", ""))))
    return texts

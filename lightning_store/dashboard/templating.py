"""The dashboard's Jinja environment: templates shipped in this package, and the filters pages share."""

from __future__ import annotations

import datetime as dt
import json
import math
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates

HERE = Path(__file__).parent
templates = Jinja2Templates(directory=HERE / "templates")


def when(seconds: float | None) -> str:
    """A time as ``2026-11-24 17:25:03`` (UTC), or an em dash."""
    if seconds is None:
        return "—"
    return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def duration(seconds: float | None) -> str:
    """A length of time for a person: ``820 ms``, ``4.2 s``, ``3 min 5 s``, ``2 h 10 min``."""
    if seconds is None or not math.isfinite(seconds):
        return "—"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60)} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60)} min"


def number(value: Any, digits: int = 3) -> str:
    """A metric as shown: integers as they are, other numbers to ``digits`` significant figures, None as —."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:.{digits}g}" if abs(value) < 10**digits else f"{value:.0f}"
    return str(value)


def pretty_json(value: Any) -> str:
    """JSON for a ``<pre>``: parsed when given as text, indented, non-ASCII kept."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return str(value)
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


def as_json_script(value: Any) -> str:
    """Data for a page's script inside ``<script type="application/json">``: ``</`` cannot end the element."""
    return json.dumps(value, default=str).replace("</", "<\\/")


templates.env.filters.update(when=when, duration=duration, number=number, pretty_json=pretty_json)
templates.env.globals.update(as_json_script=as_json_script)


def render(request: Request, name: str, context: dict[str, Any], status_code: int = 200) -> HTMLResponse:
    """The page ``name`` with ``context``; every page also knows whether the server has a token (for the
    log-out link)."""
    context = {"has_token": getattr(request.app.state, "token", None) is not None, **context}
    response: HTMLResponse = templates.TemplateResponse(request, name, context, status_code=status_code)
    return response

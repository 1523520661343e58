"""The overview: what the store holds and what is happening now (refreshes itself every few seconds)."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from lightning_store.dashboard.reader import Reader, reader_of
from lightning_store.dashboard.templating import render

router = APIRouter()

STATUSES = ("queuing", "requeuing", "preparing", "running", "succeeded", "failed", "cancelled")
RATE_MINUTES = 10
SILENT_SECONDS = 60
"""A worker whose last heartbeat is older is shown as silent (its process stopped, or cannot reach the store):
``store run``'s workers heartbeat every few seconds, idle or busy (every 5 s, after a claim that waited up to 5 s)."""
"""The rates cover this many whole minutes before the current one, and the current one so far."""
REFRESH_SECONDS = 3


async def overview_data(reader: Reader, store: Any, now: float) -> dict[str, Any]:
    """Every number the overview shows, read at ``now``."""
    counts = await reader.rows(
        "SELECT status, COALESCE(mode, '') AS mode, count(*) AS n FROM rollouts_v GROUP BY status, mode"
    )
    modes = sorted({row["mode"] for row in counts}, key=lambda m: (m == "", m))
    by_status_mode = {(row["status"], row["mode"]): int(row["n"]) for row in counts}
    statuses = [s for s in STATUSES if any(k[0] == s for k in by_status_mode)] + sorted(
        {k[0] for k in by_status_mode} - set(STATUSES)
    )
    attempts_running = int(
        await reader.scalar("SELECT count(*) FROM attempts_v WHERE status IN ('preparing', 'running')") or 0
    )
    first_minute = int(now // 60) - RATE_MINUTES
    rollouts_per_minute = await _per_minute(reader, "rollouts_v", "end_time", first_minute)
    calls_per_minute = await _per_minute(reader, "llm_calls_v", "start_time", first_minute)
    minutes = list(range(first_minute, int(now // 60) + 1))
    window = now - first_minute * 60  # the seconds the rates cover
    workers = sorted(
        (await store.query_workers()).items,
        key=lambda w: -(w.last_heartbeat_time or 0.0),
    )
    return {
        "modes": modes,
        "statuses": statuses,
        "counts": by_status_mode,
        "status_totals": {s: sum(n for (st, _), n in by_status_mode.items() if st == s) for s in statuses},
        "mode_totals": {m: sum(n for (_, md), n in by_status_mode.items() if md == m) for m in modes},
        "total": sum(by_status_mode.values()),
        "queue_depth": sum(n for (s, _), n in by_status_mode.items() if s in ("queuing", "requeuing")),
        "attempts_running": attempts_running,
        "workers": workers,
        "silent_after": SILENT_SECONDS,
        "rate_minutes": RATE_MINUTES,
        "rollouts_per_second": sum(rollouts_per_minute.values()) / window,
        "calls_per_second": sum(calls_per_minute.values()) / window,
        "rates_chart": {
            "x": [m * 60 for m in minutes],
            "series": {
                "rollouts finished / min": [rollouts_per_minute.get(m, 0) for m in minutes],
                "LLM calls / min": [calls_per_minute.get(m, 0) for m in minutes],
            },
        },
        "now": now,
    }


async def _per_minute(reader: Reader, view: str, column: str, first_minute: int) -> dict[int, int]:
    minute = reader.bucket(column, 60)
    rows = await reader.rows(
        f"SELECT {minute} AS minute, count(*) AS n FROM {view} WHERE {column} >= :since GROUP BY {minute}",
        {"since": first_minute * 60.0},
    )
    return {int(row["minute"]): int(row["n"]) for row in rows}


@router.get("/", response_class=HTMLResponse)
async def overview(request: Request) -> HTMLResponse:
    data = await overview_data(reader_of(request), request.app.state.store, time.time())
    return render(request, "overview.html", {"page": "overview", "refresh": REFRESH_SECONDS, **data})


@router.get("/overview/live", response_class=HTMLResponse)
async def overview_live(request: Request) -> HTMLResponse:
    """The overview's live part alone, which the page swaps in every few seconds."""
    data = await overview_data(reader_of(request), request.app.state.store, time.time())
    return render(request, "overview_live.html", {"refresh": REFRESH_SECONDS, **data})

"""The training-runs pages: ``/dashboard/runs`` (every RL and APO run) and ``/dashboard/runs/{run_id}``.

Contract: a run's page shows what it is (its record's input: the algorithm's options, and the model, agent,
runners and tasks that ``Trainer`` wrote there) and which steps trained nothing (metric ``untrained``); an RL
run's page shows its metric charts by step, each with its latest value in the DOM
(``data-testid="metric-<name>-last"``, the exact value in ``data-value``), and every ``training_steps_v`` row
of the run (``data-testid="step-row"``); an APO run's page shows its per-round charts, its outcome and budgets
(``apo_runs_v``) and its candidates (``prompt_candidates_v``) by round with their lineage. Both list the run's
own rollouts, LLM calls and spans, linked to the rollout page. A run id that is a later (resumed) training-run
rollout of a run redirects to that run; any other unknown id is an HTML 404.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from lightning_store.dashboard.apo_run import apo_run_row, candidates
from lightning_store.dashboard.prompt_diff import is_possible_id, json_value
from lightning_store.dashboard.reader import reader_of
from lightning_store.dashboard.run_list import APO, list_runs, training_rollouts
from lightning_store.dashboard.run_steps import read_steps
from lightning_store.dashboard.run_trace import run_trace
from lightning_store.dashboard.templating import render

router = APIRouter()


def not_found(request: Request, what: str, given: str, back: str) -> HTMLResponse:
    """The HTML 404 page of the runs and resources pages (``back``: the list page to go back to)."""
    context = {"page": back, "what": what, "given": given, "back": f"/dashboard/{back}"}
    return render(request, "missing.html", context, status_code=404)


@router.get("/runs", response_class=HTMLResponse)
async def runs_page(request: Request) -> HTMLResponse:
    runs = await list_runs(reader_of(request))
    return render(request, "runs.html", {"page": "runs", "runs": runs})


@router.get("/runs/{run_id}", response_class=HTMLResponse)
async def run_page(request: Request, run_id: str) -> Response:
    if not is_possible_id(run_id):
        return not_found(request, "training run", run_id, "runs")
    reader = reader_of(request)
    context: dict[str, Any] = {"page": "runs", "run_id": run_id}
    apo = await apo_run_row(reader, run_id)
    steps = await read_steps(reader, run_id, apo=apo is not None)
    own = await training_rollouts(reader, " AND rollout_id = :run_id", {"run_id": run_id})
    if apo is None and not steps.rows:
        if not own or own[0]["algorithm"] == APO:
            return not_found(request, "training run", run_id, "runs")
        # A resumed run's later rollout: its steps belong to the run it continues.
        owner = await reader.scalar(
            "SELECT run_id FROM training_steps_v WHERE training_rollout_id = :run_id LIMIT 1", {"run_id": run_id}
        )
        if owner is not None and owner != run_id:
            return RedirectResponse(f"/dashboard/runs/{quote(str(owner), safe='')}", status_code=307)
    rollout_ids = list(dict.fromkeys([run_id, *steps.rollout_ids]))
    described = json_value(await reader.scalar("SELECT input FROM rollouts_v WHERE rollout_id = :r", {"r": run_id}))
    described = described if isinstance(described, dict) else {}
    context |= {
        "config": _flat(described.get("config")),
        "about": described.get("run") if isinstance(described.get("run"), dict) else {},
        "untrained": [row["step"] for row in steps.rows if row["metric_values"].get("untrained")],
        "kind": "apo" if apo is not None else "rl",
        "algorithm": APO if apo is not None else (own[0]["algorithm"] if own else steps.rows[0]["algorithm"]),
        "steps": steps,
        "last_step": steps.rows[-1] if steps.rows else None,
        "apo": apo,
        **await run_trace(reader, rollout_ids),
    }
    if apo is not None:
        context |= await candidates(reader, run_id)
    return render(request, "run.html", context)


def _flat(config: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """The run's options as (``a.b`` name, value) pairs, sorted; nested options flattened."""
    if not isinstance(config, dict):
        return []
    pairs: list[tuple[str, Any]] = []
    for key, value in sorted(config.items()):
        if isinstance(value, dict) and value:
            pairs += _flat(value, f"{prefix}{key}.")
        else:
            pairs.append((f"{prefix}{key}", value))
    return pairs

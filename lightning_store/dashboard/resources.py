"""The resources pages: ``/dashboard/resources`` (every resources id) and ``/dashboard/resources/{resources_id}``.

Snapshots are read through the store contract (``query_resources``, ``get_resources_by_id``); what ran on them from
the documented views. The store keeps the content of a resources id's latest version only (``update_resources``
replaces it and bumps ``version``), so earlier versions are listed by what ran on them: rollouts
(``rollouts_v.resources_version``), LLM calls, and for ``policy`` the training step that published them.

Contract: each prompt template of the latest version is diffed, line by line, against the same template of its
*parent*: for an APO candidate (``apo-…``), its ``prompt_candidates_v.parent_resources_id``; for an id an APO run
published as its current version, that run's seed candidate. Without a known parent there is no diff (the page
says why). Unknown or impossible ids are an HTML 404.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse

from lightning_store.dashboard.prompt_diff import in_list, is_possible_id, line_diff, template_texts
from lightning_store.dashboard.reader import Reader, reader_of
from lightning_store.dashboard.runs import not_found
from lightning_store.dashboard.templating import render
from lightning_store.resources import PromptTemplate, ResourcesUpdate

router = APIRouter()

PAGE = 100
"""Resources ids per page of the list."""
MAX_VERSIONS = 500
"""Versions listed at most on a resources page (the newest)."""
POLICY = "policy"
"""The resources id ``store train`` publishes the policy under; ``training_steps_v.resources_version`` is its."""


@router.get("/resources", response_class=HTMLResponse)
async def resources_page(request: Request, offset: int = Query(0, ge=0, le=2**31)) -> HTMLResponse:
    store = request.app.state.store
    reader = reader_of(request)
    page = await store.query_resources(sort_by="update_time", sort_order="desc", limit=PAGE, offset=offset)
    ids, params = in_list("rid", [r.resources_id for r in page.items])
    counts = await reader.rows(
        f"SELECT resources_id, count(*) AS rollouts FROM rollouts_v WHERE resources_id IN {ids} GROUP BY resources_id",
        params,
    )
    made_by: dict[str, dict[str, Any]] = {}
    for row in await reader.rows(
        "SELECT resources_id, run_id, candidate, status FROM prompt_candidates_v "
        f"WHERE resources_id IN {ids} ORDER BY time DESC",
        params,
    ):
        made_by[row["resources_id"]] = row  # the oldest candidate with this id last, so it stays
    published: dict[str, list[dict[str, Any]]] = {}
    for row in await reader.rows(
        "SELECT run_id, published_resources_id, published_version FROM apo_runs_v "
        f"WHERE published_resources_id IN {ids} ORDER BY run_id",
        params,
    ):
        published.setdefault(row["published_resources_id"], []).append(row)
    context = {
        "page": "resources",
        "items": page.items,
        "total": page.total,
        "offset": offset,
        "limit": PAGE,
        "rollouts": {row["resources_id"]: int(row["rollouts"]) for row in counts},
        "made_by": made_by,
        "published": published,
        "kinds": {r.resources_id: _kinds(r) for r in page.items},
    }
    return render(request, "resources.html", context)


@router.get("/resources/{resources_id}", response_class=HTMLResponse)
async def resource_page(request: Request, resources_id: str) -> HTMLResponse:
    if not is_possible_id(resources_id):
        return not_found(request, "resources", resources_id, "resources")
    store = request.app.state.store
    snapshot: ResourcesUpdate | None = await store.get_resources_by_id(resources_id)
    if snapshot is None:
        return not_found(request, "resources", resources_id, "resources")
    reader = reader_of(request)
    candidates = await reader.rows(
        "SELECT run_id, round, candidate, origin, status, template_name, parent_resources_id, parents "
        "FROM prompt_candidates_v WHERE resources_id = :rid ORDER BY time, run_id",
        {"rid": resources_id},
    )
    published = await reader.rows(
        "SELECT run_id, published_version, best_candidate, best_resources_id FROM apo_runs_v "
        "WHERE published_resources_id = :rid ORDER BY run_id",
        {"rid": resources_id},
    )
    parent = await _parent(store, reader, snapshot, candidates, published)
    entries = []
    for name, resource in snapshot.resources.items():
        entry: dict[str, Any] = {"name": name, "resource": resource, "type": resource.resource_type}
        if isinstance(resource, PromptTemplate) and parent is not None:
            before = parent["templates"].get(name)
            entry["parent_text"] = before
            entry["diff"] = line_diff(before, resource.template) if before is not None else None
            entry["changed"] = any(line.kind != "ctx" for line in entry["diff"] or [])
        entries.append(entry)
    versions = await _versions(reader, snapshot)
    context = {
        "page": "resources",
        "snapshot": snapshot,
        "entries": entries,
        "parent": parent,
        "candidates": candidates,
        "published": published,
        "versions": versions[:MAX_VERSIONS],
        "more_versions": len(versions) > MAX_VERSIONS,
        "unversioned_rollouts": await _unversioned(reader, resources_id),
        "total_rollouts": sum(v["rollouts"] for v in versions),
    }
    return render(request, "resource.html", context)


def _kinds(snapshot: ResourcesUpdate) -> list[tuple[str, str]]:
    """(name, what) for each named resource: ``llm: model`` or ``prompt template (engine)``."""
    found = []
    for name, resource in snapshot.resources.items():
        if isinstance(resource, PromptTemplate):
            found.append((name, f"prompt template ({resource.engine})"))
        else:
            found.append((name, f"{resource.resource_type}: {resource.model}"))
    return found


async def _parent(
    store: Any,
    reader: Reader,
    snapshot: ResourcesUpdate,
    candidates: list[dict[str, Any]],
    published: list[dict[str, Any]],
) -> dict[str, Any] | None:
    """What the latest version's prompt templates are diffed against: ``label``, ``resources_id`` (or None),
    ``run_id`` and ``templates`` (name → text); None when no parent is known."""
    for row in candidates:
        parent_id = row["parent_resources_id"]
        if parent_id:
            templates = await _templates_of(store, reader, parent_id)
            label = f"its parent candidate in APO run {row['run_id']}"
            return {"label": label, "resources_id": parent_id, "run_id": row["run_id"], "templates": templates}
    for row in published:
        if row["published_version"] == snapshot.version:
            seeds = await reader.rows(
                "SELECT resources_id, templates FROM prompt_candidates_v WHERE run_id = :run_id AND candidate = 0",
                {"run_id": row["run_id"]},
            )
            if seeds:
                seed_id = seeds[0]["resources_id"]
                templates = await _templates_of(store, reader, seed_id) if seed_id else {}
                label = f"the seed of APO run {row['run_id']}, which published this version"
                templates = templates or template_texts(seeds[0]["templates"])
                return {"label": label, "resources_id": seed_id, "run_id": row["run_id"], "templates": templates}
    return None


async def _templates_of(store: Any, reader: Reader, resources_id: str) -> dict[str, str]:
    """The prompt templates of a stored snapshot, else of the APO candidate with that id, else {}."""
    snapshot: ResourcesUpdate | None = await store.get_resources_by_id(resources_id)
    if snapshot is not None:
        return {n: r.template for n, r in snapshot.resources.items() if isinstance(r, PromptTemplate)}
    rows = await reader.rows(
        "SELECT templates FROM prompt_candidates_v WHERE resources_id = :rid ORDER BY time LIMIT 1",
        {"rid": resources_id},
    )
    return template_texts(rows[0]["templates"]) if rows else {}


async def _versions(reader: Reader, snapshot: ResourcesUpdate) -> list[dict[str, Any]]:
    """One row per version something is known of (the latest always), newest first: ``rollouts`` that ran on it,
    ``calls`` served with it and their first/last time, the training ``steps`` that published it (``policy``)
    and when the store wrote it (``written``: version 1's creation and the latest's update; both always listed)."""
    params = {"rid": snapshot.resources_id}
    by_version: dict[int, dict[str, Any]] = {}

    def version(v: int) -> dict[str, Any]:
        return by_version.setdefault(
            v, {"version": v, "rollouts": 0, "calls": 0, "first_call": None, "last_call": None, "steps": []}
        )

    for row in await reader.rows(
        "SELECT resources_version, count(*) AS n FROM rollouts_v WHERE resources_id = :rid "
        "AND resources_version IS NOT NULL GROUP BY resources_version",
        params,
    ):
        version(int(row["resources_version"]))["rollouts"] = int(row["n"])
    for row in await reader.rows(
        "SELECT resources_version, count(*) AS n, min(start_time) AS first_call, max(start_time) AS last_call "
        "FROM llm_calls_v WHERE resources_id = :rid AND resources_version IS NOT NULL GROUP BY resources_version",
        params,
    ):
        version(int(row["resources_version"])).update(
            calls=int(row["n"]), first_call=row["first_call"], last_call=row["last_call"]
        )
    if snapshot.resources_id == POLICY:
        for row in await reader.rows(
            "SELECT resources_version, run_id, step, time FROM training_steps_v "
            "WHERE resources_version IS NOT NULL ORDER BY time"
        ):
            version(int(row["resources_version"]))["steps"].append(row)
    version(1)["written"] = snapshot.create_time
    version(snapshot.version)["written"] = snapshot.update_time
    return sorted(by_version.values(), key=lambda v: -v["version"])


async def _unversioned(reader: Reader, resources_id: str) -> int:
    """Rollouts on ``resources_id`` whose version is unknown (no LLM call recorded for their latest attempt)."""
    count = await reader.scalar(
        "SELECT count(*) FROM rollouts_v WHERE resources_id = :rid AND resources_version IS NULL",
        {"rid": resources_id},
    )
    return int(count or 0)

"""The resources pages: ``/dashboard/resources`` (every resources id) and ``/dashboard/resources/{resources_id}``.

Snapshots are read through the store contract (``query_resources``, ``get_resources_by_id``); earlier versions
from ``resource_versions_v``, and what ran on each version from the other documented views: rollouts
(``rollouts_v.resources_version``), LLM calls, and for ``policy`` the training step that published it.

Contract: the page shows the latest version, or ``?version=N`` a stored earlier one. Each of its prompt templates
is diffed, line by line, against the same template of its *parent* (``resource_versions.parent_of``: the version
before it, else an APO parent). Without a known parent there is no diff (the page says why). Unknown or
impossible ids, and versions the history does not hold, are an HTML 404.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse

from lightning_store.dashboard.prompt_diff import in_list, is_possible_id, line_diff
from lightning_store.dashboard.reader import reader_of
from lightning_store.dashboard.resource_versions import (
    Version,
    parent_of,
    stored_version,
    unversioned_rollouts,
    versions_of,
)
from lightning_store.dashboard.runs import not_found
from lightning_store.dashboard.templating import render
from lightning_store.resources import PromptTemplate, ResourcesUpdate

router = APIRouter()

PAGE = 100
"""Resources ids per page of the list."""
MAX_VERSIONS = 500
"""Versions listed at most on a resources page (the newest)."""


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
async def resource_page(
    request: Request, resources_id: str, version: int | None = Query(None, ge=1, le=2**31 - 1)
) -> HTMLResponse:
    if not is_possible_id(resources_id):
        return not_found(request, "resources", resources_id, "resources")
    store = request.app.state.store
    snapshot: ResourcesUpdate | None = await store.get_resources_by_id(resources_id)
    if snapshot is None:
        return not_found(request, "resources", resources_id, "resources")
    reader = reader_of(request)
    latest = Version(version=snapshot.version, time=snapshot.update_time, resources=snapshot.resources)
    shown = latest if version in (None, snapshot.version) else await stored_version(reader, resources_id, version)
    if shown is None:
        return not_found(request, "resources version", f"{resources_id} version {version}", "resources")
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
    parent = await parent_of(store, reader, snapshot, shown, candidates, published)
    entries = []
    for name, resource in shown.resources.items():
        entry: dict[str, Any] = {"name": name, "resource": resource, "type": resource.resource_type}
        if isinstance(resource, PromptTemplate) and parent is not None:
            before = parent["templates"].get(name)
            entry["parent_text"] = before
            entry["diff"] = line_diff(before, resource.template) if before is not None else None
            entry["changed"] = any(line.kind != "ctx" for line in entry["diff"] or [])
        entries.append(entry)
    versions = await versions_of(reader, snapshot)
    context = {
        "page": "resources",
        "snapshot": snapshot,
        "shown": shown,
        "entries": entries,
        "parent": parent,
        "candidates": candidates,
        "published": published,
        "versions": versions[:MAX_VERSIONS],
        "more_versions": len(versions) > MAX_VERSIONS,
        "unversioned_rollouts": await unversioned_rollouts(reader, resources_id),
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

"""What the resources page knows of a resources id's versions, and which version a prompt is diffed against.

Since revision 0006 the store keeps every version it writes (``resource_versions_v``): a version's prompt
templates are diffed against the newest stored version before it. Versions written before that revision are
gone (the history starts at the version an id had when the store was migrated); for an id's first stored version
the parent comes from prompt optimization instead: an APO candidate's parent candidate
(``prompt_candidates_v.parent_resources_id``), or, for an id an APO run published, that run's seed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter, ValidationError

from lightning_store.dashboard.prompt_diff import json_value, template_texts
from lightning_store.dashboard.reader import Reader
from lightning_store.resources import NamedResources, PromptTemplate, ResourcesUpdate

POLICY = "policy"
"""The resources id ``store train`` publishes the policy under; ``training_steps_v.resources_version`` is its."""
_named_resources: TypeAdapter[NamedResources] = TypeAdapter(NamedResources)


@dataclass(frozen=True)
class Version:
    """One stored version of a resources id: when it was written and what it held."""

    version: int
    time: float
    resources: NamedResources


async def stored_version(reader: Reader, resources_id: str, version: int) -> Version | None:
    """Version ``version`` of ``resources_id`` as the history holds it; None when it holds no such version (or
    a row that no longer reads as resources)."""
    rows = await reader.rows(
        "SELECT version, time, resources FROM resource_versions_v WHERE resources_id = :rid AND version = :v",
        {"rid": resources_id, "v": version},
    )
    return _parsed(rows[0]) if rows else None


async def version_before(reader: Reader, resources_id: str, version: int) -> Version | None:
    """The newest stored version of ``resources_id`` older than ``version``, if any."""
    rows = await reader.rows(
        "SELECT version, time, resources FROM resource_versions_v WHERE resources_id = :rid AND version < :v "
        "ORDER BY version DESC LIMIT 1",
        {"rid": resources_id, "v": version},
    )
    return _parsed(rows[0]) if rows else None


def _parsed(row: dict[str, Any]) -> Version | None:
    try:
        resources = _named_resources.validate_python(json_value(row["resources"]))
    except ValidationError:
        return None
    return Version(version=int(row["version"]), time=float(row["time"]), resources=resources)


def templates(resources: NamedResources) -> dict[str, str]:
    """The prompt templates among ``resources``: name → text."""
    return {name: r.template for name, r in resources.items() if isinstance(r, PromptTemplate)}


async def parent_of(
    store: Any,
    reader: Reader,
    snapshot: ResourcesUpdate,
    shown: Version,
    candidates: list[dict[str, Any]],
    published: list[dict[str, Any]],
) -> dict[str, Any] | None:
    """What ``shown``'s prompt templates are diffed against: ``label``, ``resources_id`` (or None), ``version``
    (a stored version of this id, or None), ``run_id`` (or None) and ``templates`` (name → text); None when no
    parent is known."""
    rid = snapshot.resources_id
    before = await version_before(reader, rid, shown.version)
    if before is not None:
        label = f"version {before.version} of {rid}, the one before it"
        return {
            "label": label,
            "resources_id": None,
            "version": before.version,
            "run_id": None,
            "templates": templates(before.resources),
        }
    if shown.version != snapshot.version and shown.version != 1:
        return None  # an older version: only the history can say what came before it
    for row in candidates:
        parent_id = row["parent_resources_id"]
        if parent_id:
            label = f"its parent candidate in APO run {row['run_id']}"
            return {
                "label": label,
                "resources_id": parent_id,
                "version": None,
                "run_id": row["run_id"],
                "templates": await _templates_of(store, reader, parent_id),
            }
    for row in published:
        if row["published_version"] == shown.version:
            seeds = await reader.rows(
                "SELECT resources_id, templates FROM prompt_candidates_v WHERE run_id = :run_id AND candidate = 0",
                {"run_id": row["run_id"]},
            )
            if seeds:
                seed_id = seeds[0]["resources_id"]
                found = await _templates_of(store, reader, seed_id) if seed_id else {}
                label = f"the seed of APO run {row['run_id']}, which published this version"
                return {
                    "label": label,
                    "resources_id": seed_id,
                    "version": None,
                    "run_id": row["run_id"],
                    "templates": found or template_texts(seeds[0]["templates"]),
                }
    return None


async def _templates_of(store: Any, reader: Reader, resources_id: str) -> dict[str, str]:
    """The prompt templates of a stored snapshot, else of the APO candidate with that id, else {}."""
    snapshot: ResourcesUpdate | None = await store.get_resources_by_id(resources_id)
    if snapshot is not None:
        return templates(snapshot.resources)
    rows = await reader.rows(
        "SELECT templates FROM prompt_candidates_v WHERE resources_id = :rid ORDER BY time LIMIT 1",
        {"rid": resources_id},
    )
    return template_texts(rows[0]["templates"]) if rows else {}


async def versions_of(reader: Reader, snapshot: ResourcesUpdate) -> list[dict[str, Any]]:
    """One row per version something is known of, newest first: ``stored`` (its content is in the history) and
    ``written`` (when the store wrote it: from the history, and for version 1 and the latest from the snapshot),
    ``rollouts`` that ran on it, ``calls`` served with it and their first/last time, and the training ``steps``
    that published it (``policy``). The latest version and version 1 are always listed."""
    params = {"rid": snapshot.resources_id}
    by_version: dict[int, dict[str, Any]] = {}

    def version(v: int) -> dict[str, Any]:
        return by_version.setdefault(
            v,
            {
                "version": v,
                "stored": False,
                "rollouts": 0,
                "calls": 0,
                "first_call": None,
                "last_call": None,
                "steps": [],
            },
        )

    for row in await reader.rows("SELECT version, time FROM resource_versions_v WHERE resources_id = :rid", params):
        version(int(row["version"])).update(stored=True, written=row["time"])
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
    version(1).setdefault("written", snapshot.create_time)
    version(snapshot.version).update(written=snapshot.update_time, stored=True)
    return sorted(by_version.values(), key=lambda v: -v["version"])


async def unversioned_rollouts(reader: Reader, resources_id: str) -> int:
    """Rollouts on ``resources_id`` whose version is unknown (no LLM call recorded for their latest attempt)."""
    count = await reader.scalar(
        "SELECT count(*) FROM rollouts_v WHERE resources_id = :rid AND resources_version IS NULL",
        {"rid": resources_id},
    )
    return int(count or 0)

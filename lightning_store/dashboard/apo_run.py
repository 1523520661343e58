"""An APO run as its page shows it: the run's outcome and budgets (``apo_runs_v``) and its candidates
(``prompt_candidates_v``) by round, with their lineage.

Contract: candidates are ordered by (round, candidate); a candidate's parents are the resources ids of its
``parents`` (two for a merge), each linked to the run's earliest candidate with that resources id when there is
one; ``changes`` diffs each of its templates that differs from its first parent's. The lineage is a tree by first
parent (candidates whose parent is not in the run are roots), flattened depth first with each node's depth.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from lightning_store.dashboard.prompt_diff import line_diff, string_list, template_texts
from lightning_store.dashboard.reader import Reader


async def apo_run_row(reader: Reader, run_id: str) -> dict[str, Any] | None:
    """The run's ``apo_runs_v`` row, None when ``run_id`` is no APO run."""
    rows = await reader.rows("SELECT * FROM apo_runs_v WHERE run_id = :run_id", {"run_id": run_id})
    return rows[0] if rows else None


async def candidates(reader: Reader, run_id: str) -> dict[str, Any]:
    """``candidates`` (rows by round and ordinal, with ``parent_links``, ``template_texts`` and ``changes``),
    ``rounds`` (round → its candidates) and ``lineage`` (``(depth, candidate)`` pairs, depth first)."""
    rows = await reader.rows(
        "SELECT * FROM prompt_candidates_v WHERE run_id = :run_id ORDER BY round, candidate",
        {"run_id": run_id},
    )
    by_resources: dict[str, dict[str, Any]] = {}
    for row in sorted(rows, key=lambda r: r["candidate"] if r["candidate"] is not None else -1):
        if row["resources_id"]:
            by_resources.setdefault(row["resources_id"], row)
    for row in rows:
        row["template_texts"] = template_texts(row["templates"])
        parent_ids = list(string_list(row["parents"])) or (
            [row["parent_resources_id"]] if row["parent_resources_id"] else []
        )
        row["parent_links"] = [(p, (by_resources.get(p) or {}).get("candidate")) for p in parent_ids]
    for row in rows:
        first = by_resources.get(row["parent_resources_id"] or "")
        row["changes"] = _changes(first["template_texts"] if first else None, row["template_texts"])
    rounds: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        rounds[row["round"] if row["round"] is not None else -1].append(row)
    return {"candidates": rows, "rounds": dict(rounds), "lineage": _lineage(rows, by_resources)}


def _changes(parent: dict[str, str] | None, mine: dict[str, str]) -> list[tuple[str, list[Any]]]:
    """(template name, its line diff against the parent's template of that name) for each template whose lines
    changed; a template the parent lacks is diffed against the empty text."""
    if parent is None:
        return []
    diffs = [(name, line_diff(parent.get(name, ""), text)) for name, text in mine.items() if parent.get(name) != text]
    return [(name, lines) for name, lines in diffs if any(line.kind != "ctx" for line in lines)]


def _lineage(rows: list[dict[str, Any]], by_resources: dict[str, dict[str, Any]]) -> list[tuple[int, dict[str, Any]]]:
    children: dict[int, list[dict[str, Any]]] = defaultdict(list)
    roots: list[dict[str, Any]] = []
    for row in sorted(rows, key=lambda r: r["candidate"] if r["candidate"] is not None else -1):
        parent = by_resources.get(row["parent_resources_id"] or "")
        if parent is None or parent is row:
            roots.append(row)
        else:
            children[id(parent)].append(row)
    flat: list[tuple[int, dict[str, Any]]] = []
    placed: set[int] = set()
    stack = [(0, row) for row in reversed(roots)]
    while stack:
        depth, row = stack.pop()
        if id(row) in placed:
            continue  # a cycle in hostile data: each candidate once
        placed.add(id(row))
        flat.append((depth, row))
        stack += [(depth + 1, child) for child in reversed(children[id(row)])]
    flat += [(0, row) for row in rows if id(row) not in placed]
    return flat

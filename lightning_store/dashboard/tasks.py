"""``GET /dashboard/tasks/{task_id}``: one task's rollouts compared across policy versions.

The rollouts whose ``rollouts_v.task_id`` is the task (``metadata.task_id``, which training sets on every rollout
it enqueues), grouped by the resources version they ran on (``rollouts_v.resources_version``: the version their
latest attempt's calls were served with): per version the number of rollouts, how many succeeded, their mean
reward (each rollout's reward as the rollouts list counts it: the last reward span of its latest attempt), and
each rollout with its reward and its final answer (the last LLM call of its latest attempt), so that what the
policy answered to the same task can be read version by version. At most :data:`MAX_ROLLOUTS` rollouts, the newest.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from lightning_store.dashboard.prompt_diff import json_value
from lightning_store.dashboard.reader import Reader, bound_list, reader_of
from lightning_store.dashboard.rollouts_query import page_rows
from lightning_store.dashboard.templating import render
from lightning_store.dashboard.timing import TimedReader
from lightning_store.transcript import text_of

router = APIRouter()

MAX_ROLLOUTS = 500


@dataclass
class VersionGroup:
    resources_id: str | None
    version: int | None
    rollouts: list[dict[str, Any]] = field(default_factory=list)

    @property
    def succeeded(self) -> int:
        return sum(1 for r in self.rollouts if r["status"] == "succeeded")

    @property
    def mean_reward(self) -> float | None:
        rewards = [r["reward"] for r in self.rollouts if r["reward"] is not None]
        return sum(rewards) / len(rewards) if rewards else None


@router.get("/tasks/{task_id:path}", response_class=HTMLResponse)
async def task_page(request: Request, task_id: str) -> Response:
    """The task's rollouts by version (200), or a page saying no rollout has that task id (404)."""
    reader = TimedReader(reader_of(request))
    groups, total = await compare(reader, task_id)
    if not groups:
        missing = {"page": "rollouts", "what": "task", "given": task_id, "back": "/dashboard/rollouts"}
        return reader.stamp(render(request, "missing.html", missing, status_code=404))
    context = {"page": "rollouts", "task_id": task_id, "groups": groups, "total": total, "max": MAX_ROLLOUTS}
    return reader.stamp(render(request, "task.html", context))


async def compare(reader: Reader, task_id: str) -> tuple[list[VersionGroup], int]:
    """The task's rollouts grouped by version, oldest version first, and how many rollouts it has in all."""
    found = await reader.rows(
        "SELECT rollout_id FROM rollouts_v WHERE task_id = :task ORDER BY start_time DESC, rollout_id LIMIT :limit",
        {"task": task_id, "limit": MAX_ROLLOUTS},
    )
    if not found:
        return [], 0
    total = int(await reader.scalar("SELECT count(*) FROM rollouts_v WHERE task_id = :task", {"task": task_id}))
    rows = await page_rows(reader, [r["rollout_id"] for r in found])
    answers = await _final_answers(reader, rows)
    groups: dict[tuple[str | None, int | None], VersionGroup] = {}
    for row in sorted(rows, key=lambda r: (r["resources_version"] is None, r["resources_version"] or 0)):
        key = (row["resources_id"], row["resources_version"])
        group = groups.setdefault(key, VersionGroup(*key))
        group.rollouts.append({**row, "answer": answers.get(row["rollout_id"])})
    for group in groups.values():
        group.rollouts.sort(key=lambda r: r["start_time"])
    return list(groups.values()), total


async def _final_answers(reader: Reader, rows: list[dict[str, Any]]) -> dict[str, str]:
    """``{rollout_id: text}``: the answer of the last LLM call of each row's latest attempt."""
    latest = {r["latest_attempt_id"]: r["rollout_id"] for r in rows if r.get("latest_attempt_id")}
    if not latest:
        return {}
    listed, names = bound_list("a", latest)
    calls = await reader.rows(
        f"SELECT attempt_id, sequence_id, response FROM llm_calls WHERE attempt_id IN ({listed}) ORDER BY sequence_id",
        names,
    )
    answers: dict[str, str] = {}
    for call in calls:  # the last one of each attempt wins
        answers[latest[call["attempt_id"]]] = _answer_text(json_value(call["response"]))
    return answers


def _answer_text(response: Any) -> str:
    """The answer's text, and the tools it called (``→ search()``)."""
    choices = response.get("choices") if isinstance(response, dict) else None
    choice: dict[str, Any] = (
        choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    )
    message = choice.get("message")
    message = message if isinstance(message, dict) else {}
    text = text_of(message.get("content")) or choice.get("text") or ""
    calls = message.get("tool_calls")
    names = []
    for call in calls if isinstance(calls, list) else []:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            names.append(str(function.get("name", "?")))
    return str(text) + (f" → {', '.join(names)}()" if names else "")

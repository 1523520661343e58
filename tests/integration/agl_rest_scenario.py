"""One sequence of REST requests an Agent Lightning 0.3 user, script or dashboard sends, and how to compare two
servers' answers to it.

:func:`play` sends every request of :data:`SCENARIO` to a server (the reference ``agl store`` or ``store serve``)
and returns a transcript: per step, the status and the body with the server's own choices taken out (generated ids
become the names the scenario gave them, times become ``<time>``). Two transcripts are then compared step by step
by :func:`differences`: the same status; for a success, every key the reference answers with the same value
(``store serve`` may add keys: its additions); for an error, the status alone (the bodies differ by design:
ours name the field).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

Json = Any


@dataclass
class Step:
    """One request. ``path`` and strings in ``params``/``body`` may name captured ids as ``{name}``; ``capture``
    names ids in the answer (``{"r1": "0.rollout_id"}``: a dotted path into the JSON)."""

    label: str
    method: str
    path: str
    params: list[tuple[str, str]] | None = None
    body: Json = None
    capture: dict[str, str] = field(default_factory=dict)


def _span(rollout: str, attempt: str, span_id: str, name: str, sequence_id: int) -> dict[str, Any]:
    return {
        "rollout_id": f"{{{rollout}}}",
        "attempt_id": f"{{{attempt}}}",
        "sequence_id": sequence_id,
        "trace_id": "ab" * 16,
        "span_id": span_id,
        "parent_id": None if span_id == "s1" else "s1",
        "name": name,
        "status": {"status_code": "OK", "description": None},
        "attributes": {"k": 1},
        "events": [],
        "links": [],
        "start_time": float(sequence_id),
        "end_time": float(sequence_id) + 0.5,
        "context": None,
        "parent": None,
        "resource": {"attributes": {}, "schema_url": ""},
    }


def _get(label: str, path: str, query: str = "") -> Step:
    params = [tuple(pair.split("=", 1)) for pair in query.split("&") if pair] if query else None
    return Step(label, "GET", path, params=params)  # type: ignore[arg-type]


def _post(label: str, path: str, body: Json = None, **capture: str) -> Step:
    return Step(label, "POST", path, body=body, capture=capture)


def _listing_steps(path: str, queries: list[str]) -> list[Step]:
    return [_get(f"GET {path}?{query}", path, query) for query in queries]


ROLLOUT_QUERIES = [
    "",
    "status_in=preparing&status_in=queuing&sort_by=start_time&sort_order=desc&limit=2&offset=0",
    "status_in=queuing",
    "rollout_id_in={r1}&rollout_id_in={r3}",
    "rollout_id_contains=zz-no-such&filter_logic=or&status_in=preparing",
    "rollout_id_contains=zz-no-such&filter_logic=and&status_in=preparing",
    "sort_by=mode",
    "sort_by=mode&sort_order=desc",
    "sort_by=resources_id&sort_order=desc",
    "sort_by=end_time",
    "sort_by=end_time&sort_order=desc",
    "sort_by=status&limit=1&offset=1",
    "limit=2&offset=3",
    "limit=-1&offset=10",
    "sort_by=bogus",
    "limit=0",
    "limit=-2",
    "offset=-1",
    "sort_order=sideways",
    "filter_logic=xor",
    "status_in=bogus",
    "limit=abc",
    "unknown_key=1",
]
SPAN_QUERIES = [
    "rollout_id={r4}",
    "rollout_id={r4}&attempt_id=latest",
    "rollout_id={r4}&attempt_id={a4}&sort_order=desc",
    "rollout_id={r4}&name_contains=tool",
    "rollout_id={r4}&name=llm&span_id=s3&filter_logic=or",
    "rollout_id={r4}&parent_id=s1",
    "rollout_id={r4}&trace_id_contains=abab&limit=1&offset=1",
    "rollout_id={r4}&sort_by=name&sort_order=desc",
    "rollout_id={r4}&sort_by=parent_id",
    "rollout_id={r1}&attempt_id=latest",
    "rollout_id=ro-nothing",
    "rollout_id={r4}&sort_by=bogus",
    "rollout_id={r4}&limit=0",
    "",
]
WORKER_QUERIES = [
    "",
    "status_in=busy",
    "status_in=busy&status_in=idle&sort_by=worker_id&sort_order=desc",
    "worker_id_contains=w",
    "worker_id_contains=3&status_in=busy&filter_logic=or&sort_by=worker_id",
    "sort_by=status",
    "sort_by=last_heartbeat_time&sort_order=desc",
    "limit=1&offset=1&sort_by=worker_id",
    "sort_by=bogus",
    "offset=-1",
]
ATTEMPT_QUERIES = [
    "",
    "sort_order=desc",
    "sort_by=start_time&sort_order=desc&limit=1",
    "limit=1&offset=1",
    "sort_by=worker_id",
    "sort_by=bogus",
    "limit=-2",
]

SCENARIO: list[Step] = [
    # One rollout a request: a batch's rollouts share one start time here, and sorting by it would tie.
    _post("enqueue r1", "/v1/agl/queues/rollouts/enqueue", {"rollouts": [{"input": {"q": 1}}]}, r1="0.rollout_id"),
    _post(
        "enqueue r2",
        "/v1/agl/queues/rollouts/enqueue",
        {"rollouts": [{"input": {"q": 2}, "mode": "train"}]},
        r2="0.rollout_id",
    ),
    _post(
        "enqueue r3",
        "/v1/agl/queues/rollouts/enqueue",
        {"rollouts": [{"input": 3, "metadata": {"m": 1}}]},
        r3="0.rollout_id",
    ),
    _post("dequeue one", "/v1/agl/queues/rollouts/dequeue", {"limit": 1, "worker_id": "w1"}, a1="0.attempt.attempt_id"),
    _post(
        "start a rollout",
        "/v1/agl/rollouts",
        {"input": "four", "mode": "val", "resources_id": None, "config": None, "metadata": None, "worker_id": "w2"},
        r4="rollout_id",
        a4="attempt.attempt_id",
    ),
    *_listing_steps("/v1/agl/rollouts", ROLLOUT_QUERIES),
    _post("search rollouts by status", "/v1/agl/rollouts/search", {"status_in": ["queuing"], "sort_by": "mode"}),
    _post("search rollouts, a bad sort", "/v1/agl/rollouts/search", {"sort_by": "bogus"}),
    _post("search rollouts, limit -5", "/v1/agl/rollouts/search", {"limit": -5}),
    _post("update rollout: nothing", "/v1/agl/rollouts/{r2}", {}),
    _post("update rollout: nulls", "/v1/agl/rollouts/{r2}", {"mode": None, "resources_id": None, "metadata": None}),
    _post("update rollout: status null", "/v1/agl/rollouts/{r2}", {"status": None}),
    _post("update rollout: config null", "/v1/agl/rollouts/{r2}", {"config": None}),
    _post("update rollout: status bogus", "/v1/agl/rollouts/{r2}", {"status": "bogus"}),
    _post("update rollout: metadata", "/v1/agl/rollouts/{r3}", {"metadata": {"m": 2}, "mode": "test"}),
    _post("update attempt: metadata null", "/v1/agl/rollouts/{r1}/attempts/{a1}", {"metadata": None}),
    _post("update attempt: status null", "/v1/agl/rollouts/{r1}/attempts/{a1}", {"status": None}),
    _post("update attempt: worker null", "/v1/agl/rollouts/{r1}/attempts/{a1}", {"worker_id": None}),
    _post("update attempt: heartbeat null", "/v1/agl/rollouts/{r1}/attempts/{a1}", {"last_heartbeat_time": None}),
    _post("update attempt: metadata", "/v1/agl/rollouts/{r1}/attempts/{a1}", {"metadata": {"k": "v"}}),
    _post("update attempt: empty worker", "/v1/agl/rollouts/{r1}/attempts/latest", {"worker_id": ""}),
    _post("update attempt: running", "/v1/agl/rollouts/{r1}/attempts/{a1}", {"status": "running"}),
    _post("start a second attempt", "/v1/agl/rollouts/{r1}/attempts", {"worker_id": "w3"}, a1b="attempt.attempt_id"),
    *_listing_steps("/v1/agl/rollouts/{r1}/attempts", ATTEMPT_QUERIES),
    _get("attempts of an unknown rollout", "/v1/agl/rollouts/ro-nothing/attempts"),
    _post("next sequence id, latest", "/v1/agl/spans/next", {"rollout_id": "{r4}", "attempt_id": "latest"}),
    _post("span s1", "/v1/agl/spans", _span("r4", "a4", "s1", "agent.run", 2)),
    _post("span s2", "/v1/agl/spans", _span("r4", "a4", "s2", "tool.call", 3)),
    _post("span s3", "/v1/agl/spans", _span("r4", "a4", "s3", "llm", 4)),
    _post("next sequence id after spans", "/v1/agl/spans/next", {"rollout_id": "{r4}", "attempt_id": "latest"}),
    _post("next sequence id by id", "/v1/agl/spans/next", {"rollout_id": "{r4}", "attempt_id": "{a4}"}),
    *_listing_steps("/v1/agl/spans", SPAN_QUERIES),
    _post("search spans latest", "/v1/agl/spans/search", {"rollout_id": "{r4}", "attempt_id": "latest"}),
    _post("heartbeat w3", "/v1/agl/workers/w3", {"heartbeat_stats": {"cpu": 0.5}}),
    _post("heartbeat w9 (new)", "/v1/agl/workers/w9"),
    _post("heartbeat null", "/v1/agl/workers/w3", {"heartbeat_stats": None}),
    *_listing_steps("/v1/agl/workers", WORKER_QUERIES),
    _post("search workers", "/v1/agl/workers/search", {"status_in": ["busy"], "sort_by": "worker_id"}),
    _get("worker w1", "/v1/agl/workers/w1"),
    _get("unknown worker", "/v1/agl/workers/nobody"),
    _post(
        "add resources",
        "/v1/agl/resources",
        {"p": {"resource_type": "prompt_template", "template": "Hi {x}", "engine": "f-string"}},
        rs1="resources_id",
    ),
    _post(
        "update resources",
        "/v1/agl/resources/{rs1}",
        {"p": {"resource_type": "prompt_template", "template": "Hello {x}", "engine": "f-string"}},
    ),
    _get("list resources", "/v1/agl/resources", "sort_by=version&sort_order=desc"),
    _get("list resources, a bad sort", "/v1/agl/resources", "sort_by=bogus"),
    _get("latest resources", "/v1/agl/resources/latest"),
    _post("finish r1", "/v1/agl/rollouts/{r1}/attempts/latest", {"status": "succeeded"}),
    _get("rollout r1", "/v1/agl/rollouts/{r1}"),
    _get("rollouts by end time", "/v1/agl/rollouts", "sort_by=end_time&sort_order=desc"),
    _get("worker w3 after", "/v1/agl/workers/w3"),
    _post("OTLP metrics (not served)", "/v1/metrics"),
    _post("OTLP logs (not served)", "/v1/logs"),
    _get("an unknown API path", "/v1/agl/nothing-here"),
]


@dataclass
class Answer:
    label: str
    status: int
    body: Json


def play(base_url: str, scenario: list[Step] = SCENARIO) -> list[Answer]:
    """Send ``scenario`` to the server at ``base_url``; its answers, normalized (see the module docstring)."""
    ids: dict[str, str] = {}
    answers = []
    with httpx.Client(base_url=base_url, timeout=30) as client:
        for step in scenario:
            fill: Callable[[Any], Any] = lambda value: _fill(value, ids)  # noqa: E731
            response = client.request(
                step.method,
                fill(step.path),
                params=fill(step.params),
                json=fill(step.body) if step.body is not None else None,
            )
            body = response.json() if response.headers.get("content-type", "").startswith("application/json") else None
            if response.status_code < 300:
                for name, path in step.capture.items():
                    ids[name] = _at(body, path)
            answers.append(Answer(step.label, response.status_code, _normalized(body, ids)))
    return answers


def _fill(value: Any, ids: dict[str, str]) -> Any:
    if isinstance(value, str):
        return re.sub(r"\{(\w+)\}", lambda m: ids.get(m.group(1), m.group(0)), value)
    if isinstance(value, list):
        return [_fill(item, ids) for item in value]
    if isinstance(value, tuple):
        return tuple(_fill(item, ids) for item in value)
    if isinstance(value, dict):
        return {key: _fill(item, ids) for key, item in value.items()}
    return value


def _at(body: Json, path: str) -> str:
    for part in path.split("."):
        body = body[int(part)] if isinstance(body, list) else body[part]
    return str(body)


def _normalized(body: Json, ids: dict[str, str], key: str = "") -> Json:
    names = {value: f"<{name}>" for name, value in ids.items()}
    if isinstance(body, dict):
        return {k: _normalized(v, ids, k) for k, v in body.items()}
    if isinstance(body, list):
        return [_normalized(item, ids) for item in body]
    if key.endswith("_time") and isinstance(body, (int, float)) and body > 1e9:  # a clock reading, not a fixture's
        return "<time>"
    if isinstance(body, str):
        return names.get(body, body)
    return body


def differences(reference: list[Answer], ours: list[Answer], additions: dict[str, set[str]]) -> list[str]:
    """Each step where ``ours`` does not answer as ``reference`` did, as one line. ``additions``: keys ``ours``
    may add to an object, by the object's kind (``rollout``, ``attempt``, ``worker``, ``span``, ``resource``…;
    ``*`` for any)."""
    problems = []
    for expected, got in zip(reference, ours, strict=True):
        if expected.status != got.status:
            problems.append(f"{expected.label}: status {got.status}, the reference {expected.status} ({got.body})")
        elif expected.status < 300:
            problems.extend(f"{expected.label}: {p}" for p in _compare(expected.body, got.body, "", additions))
    return problems


def _compare(expected: Json, got: Json, path: str, additions: dict[str, set[str]]) -> list[str]:
    if isinstance(expected, dict) and isinstance(got, dict):
        problems = [f"{path}.{k}: missing" for k in expected if k not in got]
        allowed = additions.get("*", set()) | additions.get(_kind(expected), set())
        problems += [f"{path}.{k}: added ({got[k]!r})" for k in got if k not in expected and k not in allowed]
        for k in expected:
            if k in got:
                problems += _compare(expected[k], got[k], f"{path}.{k}", additions)
        return problems
    if isinstance(expected, list) and isinstance(got, list):
        if len(expected) != len(got):
            return [f"{path}: {len(got)} items, the reference {len(expected)}: {got!r} vs {expected!r}"]
        pairs = enumerate(zip(expected, got, strict=True))
        return [p for i, (e, g) in pairs for p in _compare(e, g, f"{path}.{i}", additions)]
    if expected != got:
        return [f"{path}: {got!r}, the reference {expected!r}"]
    return []


def _kind(item: dict[str, Any]) -> str:
    for key, kind in (("span_id", "span"), ("attempt_id", "attempt"), ("rollout_id", "rollout")):
        if key in item:
            return kind
    if "worker_id" in item:
        return "worker"
    if "resource_type" in item:
        return "resource"
    return "other"

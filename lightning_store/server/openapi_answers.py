"""What each operation of the server answers, as the OpenAPI document states it: the success body of every known
operation, and which operations answer 400, 404 and 409 (and when), which are open without a token and which
never touch the database. :mod:`lightning_store.server.openapi` applies these tables to FastAPI's document.
"""

from __future__ import annotations

from dataclasses import dataclass

from lightning_store.server.openapi_schemas import Schema, array, nullable, object_schema, page, ref

PROXY_BOUND = "/rollout/{rollout_id}/attempt/{attempt_id}/v1/{kind}"
PROXY_WORKER = "/worker/{worker_id}/v1/{kind}"
PROXY_PATHS = frozenset({PROXY_BOUND, PROXY_WORKER, "/v1/chat/completions", "/v1/completions"})


OPEN_OPERATIONS = frozenset({("get", "/v1/agl/health")})
"""Operations the guards serve without a token (``guards.OPEN_PATHS``)."""
NO_DATABASE = frozenset({("get", "/metrics")})
"""Operations that never touch the database, so never answer 503."""
HEALTH = ("get", "/v1/agl/health")
"""Answers 503 too when the database does not answer, with its ``status`` and ``database`` keys."""

NOT_FOUND: dict[tuple[str, str], str] = {
    ("post", "/v1/agl/rollouts/{rollout_id}"): "No rollout has this id.",
    ("post", "/v1/agl/rollouts/{rollout_id}/attempts"): "No rollout has this id.",
    ("post", "/v1/agl/rollouts/{rollout_id}/attempts/{attempt_id}"): "No such rollout, or no such attempt of it.",
    ("post", "/v1/agl/attempts/end"): "An entry names an unknown rollout or attempt (nothing was written).",
    ("get", "/v1/agl/rollouts/{rollout_id}/attempts/{attempt_id}/resources"): "No such rollout or attempt.",
    ("post", "/v1/agl/spans"): "The span's rollout or attempt does not exist.",
    ("post", "/v1/agl/spans/batch"): "A span's rollout or attempt does not exist (nothing was written).",
    ("post", "/v1/agl/spans/next"): "No such rollout or attempt.",
    ("post", "/v1/agl/spans/next/batch"): "A pair names an unknown rollout or attempt (nothing was allocated).",
    ("post", "/v1/agl/llm_calls/batch"): "A call's rollout or attempt does not exist (nothing was written).",
    ("post", "/v1/traces"): "A span names an unknown rollout or attempt (nothing was written).",
    ("post", PROXY_BOUND): "No such rollout or attempt, or no proxy route for this kind.",
    ("post", PROXY_WORKER): "No such worker, or no proxy route for this kind.",
    ("post", "/v1/chat/completions"): "The x-rollout-id/x-attempt-id headers name no known attempt.",
    ("post", "/v1/completions"): "The x-rollout-id/x-attempt-id headers name no known attempt.",
}
"""The operations that answer 404, and when: those that look up an id that must exist. Getters answer ``null``
for an unknown id instead, searches an empty page, and upserts (resources, workers) create what is missing."""

CONFLICT: dict[tuple[str, str], str] = {
    ("post", "/v1/agl/rollouts/{rollout_id}/attempts/{attempt_id}"): (
        "With if_current: the attempt is no longer its rollout's latest, or has already ended. Nothing was written."
    ),
    ("post", PROXY_WORKER): "The worker is running no attempt (error_type NoAttempt; not to be retried).",
    ("post", "/v1/agl/spans/next"): "The rollout has no sequence ids left (a span took 2^53 - 1).",
    ("post", "/v1/agl/spans/next/batch"): "A rollout has no sequence ids left (nothing was allocated).",
}
"""The operations that answer 409: conditional updates whose condition no longer holds, and a call on the proxy
route of a worker that runs no attempt."""

_PAGE_400 = "A page that cannot be served: `sort_by` names no sortable field, `limit` is 0 or below -1, `offset` < 0."
_NULL_400 = "An explicit null for a field that needs a value (leave the key out to keep the field)."
BAD_REQUEST: dict[tuple[str, str], str] = {
    **{
        (method, path): _PAGE_400
        for method, path in (
            ("get", "/v1/agl/rollouts"),
            ("post", "/v1/agl/rollouts/search"),
            ("get", "/v1/agl/rollouts/{rollout_id}/attempts"),
            ("post", "/v1/agl/rollouts/{rollout_id}/attempts/search"),
            ("get", "/v1/agl/spans"),
            ("post", "/v1/agl/spans/search"),
            ("post", "/v1/agl/spans/query"),
            ("get", "/v1/agl/resources"),
            ("get", "/v1/agl/workers"),
            ("post", "/v1/agl/workers/search"),
        )
    },
    ("post", "/v1/agl/rollouts/{rollout_id}"): _NULL_400,
    ("post", "/v1/agl/rollouts/{rollout_id}/attempts/{attempt_id}"): _NULL_400,
    ("post", "/v1/agl/workers/{worker_id}"): _NULL_400,
}
"""The operations that answer 400, where Agent Lightning's server does (``BadRequestError``)."""

FASTAPI_422 = "Validation Error"
"""FastAPI's description of the 422 it documents (with its own error schema)."""
ERROR_DESCRIPTIONS = {
    "401": "The server has a token and the request does not carry it (`Authorization: Bearer <token>`).",
    "413": "The request body is over the server's limit (max_body_bytes).",
    "415": "The request carries a body whose content type is not accepted here.",
    "422": "Invalid input: the body, a parameter, the path or the query breaks the contract; `field` names it.",
    "502": "The LLM upstream cannot be reached, gave an answer that is not JSON, or none is configured.",
    "503": "The database cannot be reached: retry. Nothing was done, unless `maybe_written` is true (the database "
    "went away while the write committed): then retry only an idempotent request, or look first.",
}


@dataclass(frozen=True)
class Success:
    """An operation's success answer: its status, description and JSON schema."""

    status: str
    description: str
    schema: Schema


def successes() -> dict[tuple[str, str], Success]:
    """Every known operation's success answer (see the route modules for what each returns)."""
    rollout_any = ref("RolloutWithLatestAttempt")
    return {
        ("get", "/v1/agl/health"): Success("200", "The server is up.", ref("Health")),
        ("get", "/v1/agl/statistics"): Success("200", "Counts of what the store holds.", ref("StoreStatistics")),
        ("post", "/v1/agl/queues/rollouts/enqueue"): Success(
            "201", "The queued rollouts, in request order (without an `attempt` key).", array(ref("Rollout"))
        ),
        ("post", "/v1/agl/queues/rollouts/dequeue"): Success(
            "200",
            "The claimed rollouts with their new attempts; empty when the queue stayed empty.",
            array(ref("AttemptedRollout")),
        ),
        ("post", "/v1/agl/queues/rollouts/claim"): Success(
            "200",
            "The claimed rollouts, each with the resources its attempt runs with (null: the store holds none); "
            "empty when the queue stayed empty.",
            array(ref("Claim")),
        ),
        ("post", "/v1/agl/rollouts"): Success(
            "201", "The rollout, started with its first attempt.", ref("AttemptedRollout")
        ),
        ("get", "/v1/agl/rollouts"): Success(
            "200", "A page of rollouts, each with its latest attempt when it has one.", page("Rollout")
        ),
        ("get", "/v1/agl/rollouts/{rollout_id}/attempts"): Success(
            "200", "A page of the rollout's attempts (empty for an unknown rollout).", page("Attempt")
        ),
        ("get", "/v1/agl/spans"): Success("200", "A page of the rollout's spans.", page("Span")),
        ("get", "/v1/agl/workers"): Success("200", "A page of workers.", page("Worker")),
        ("post", "/v1/agl/rollouts/search"): Success(
            "200", "A page of rollouts, each with its latest attempt when it has one.", page("Rollout")
        ),
        ("get", "/v1/agl/rollouts/{rollout_id}"): Success(
            "200",
            "The rollout (with its latest attempt when it has one), or null when no rollout has this id.",
            nullable(rollout_any),
        ),
        ("post", "/v1/agl/rollouts/{rollout_id}"): Success(
            "200", "The updated rollout, with its latest attempt when it has one.", rollout_any
        ),
        ("post", "/v1/agl/rollouts/{rollout_id}/attempts"): Success(
            "201", "The rollout with its new attempt.", ref("AttemptedRollout")
        ),
        ("post", "/v1/agl/rollouts/{rollout_id}/attempts/search"): Success(
            "200", "A page of the rollout's attempts (empty for an unknown rollout).", page("Attempt")
        ),
        ("get", "/v1/agl/rollouts/{rollout_id}/attempts/latest"): Success(
            "200",
            "The rollout's latest attempt, or null when it has none (or no rollout has this id).",
            nullable(ref("Attempt")),
        ),
        ("post", "/v1/agl/rollouts/{rollout_id}/attempts/{attempt_id}"): Success(
            "200", "The updated attempt.", ref("Attempt")
        ),
        ("post", "/v1/agl/attempts/end"): Success(
            "200",
            "Per entry, the ended attempt, or null where the attempt was no longer current.",
            array(nullable(ref("Attempt"))),
        ),
        ("post", "/v1/agl/waits/rollouts"): Success(
            "200",
            "The rollouts among those named that have finished (without an `attempt` key).",
            array(ref("Rollout")),
        ),
        ("post", "/v1/agl/watchdog/scan"): Success(
            "200",
            "How many attempts the scan marked.",
            object_schema({"marked": {"type": "integer"}}, title="ScanResult"),
        ),
        ("post", "/v1/agl/spans"): Success(
            "201", "The stored span, or null when a span with its ids was stored already.", nullable(ref("Span"))
        ),
        ("post", "/v1/agl/spans/batch"): Success(
            "201",
            "The spans stored by this request (duplicates left out); with `return_spans: false`, their positions "
            "in the request and the sequence ids they were stored with.",
            {
                "anyOf": [
                    object_schema({"spans": array(ref("Span"))}, title="AddedSpans"),
                    object_schema(
                        {"added": array({"type": "integer"}), "sequence_ids": array({"type": "integer"})},
                        title="AddedSpanPositions",
                    ),
                ]
            },
        ),
        ("post", "/v1/agl/spans/search"): Success("200", "A page of the rollout's spans.", page("Span")),
        ("post", "/v1/agl/spans/query"): Success("200", "A page of the spans found.", page("Span")),
        ("post", "/v1/agl/spans/next"): Success(
            "200", "The next sequence id.", object_schema({"sequence_id": {"type": "integer"}}, title="SequenceId")
        ),
        ("post", "/v1/agl/spans/next/batch"): Success(
            "200",
            "One sequence id per pair, in order.",
            object_schema({"sequence_ids": array({"type": "integer"})}, title="SequenceIds"),
        ),
        ("post", "/v1/agl/llm_calls/batch"): Success(
            "201",
            "How many calls the request carried.",
            object_schema({"received": {"type": "integer"}}, title="Received"),
        ),
        ("post", "/v1/agl/llm_calls/search"): Success(
            "200", "The LLM calls found.", object_schema({"items": array(ref("LlmCall"))}, title="LlmCalls")
        ),
        ("get", "/v1/agl/resources"): Success("200", "A page of resources snapshots.", page("ResourcesUpdate")),
        ("post", "/v1/agl/resources"): Success("201", "The new snapshot.", ref("ResourcesUpdate")),
        ("get", "/v1/agl/resources/latest"): Success(
            "200", "The latest snapshot, or null when there is none.", nullable(ref("ResourcesUpdate"))
        ),
        ("post", "/v1/agl/resources/{resources_id}"): Success(
            "200", "The snapshot under this id (created when it did not exist).", ref("ResourcesUpdate")
        ),
        ("get", "/v1/agl/resources/{resources_id}"): Success(
            "200", "The snapshot, or null when none has this id.", nullable(ref("ResourcesUpdate"))
        ),
        ("get", "/v1/agl/rollouts/{rollout_id}/attempts/{attempt_id}/resources"): Success(
            "200",
            "The resources the attempt runs with, or null when there are none.",
            nullable(ref("ResourcesUpdate")),
        ),
        ("post", "/v1/agl/workers/search"): Success("200", "A page of workers.", page("Worker")),
        ("get", "/v1/agl/workers/{worker_id}"): Success(
            "200", "The worker, or null when none has this id.", nullable(ref("Worker"))
        ),
        ("post", "/v1/agl/workers/{worker_id}"): Success(
            "200", "The worker (created when it did not exist).", ref("Worker")
        ),
    }

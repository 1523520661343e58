"""Benchmark of the server's door for JSON bodies (``server/json_body.decode``) against ``json.loads`` alone.

A body of ``--spans`` realistic tracer spans (15 attributes, 30 token ids, OpenTelemetry context and resource),
as ``POST /v1/agl/spans/batch`` receives it, is decoded ``--repeats`` times each way; the strings are inspected
only when the body holds a ``\\u`` escape, so the run also times a body with one non-ASCII character escaped.
Prints milliseconds per body and per span, and the ratio to ``json.loads``.

    python -m bench.input_limits                 # 100 spans per body, 200 repeats
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

from lightning_store.server.json_body import decode


def span(i: int, note: str) -> dict[str, Any]:
    return {
        "rollout_id": "ro-0123456789ab",
        "attempt_id": "at-0123456789ab",
        "sequence_id": i,
        "trace_id": "a" * 32,
        "span_id": f"{i:016x}",
        "parent_id": "c" * 16,
        "name": "openai.chat.completion",
        "status": {"status_code": "OK", "description": None},
        "attributes": {f"gen_ai.attribute.{k}": f"{note} {k}" for k in range(15)} | {"token_ids": list(range(30))},
        "events": [],
        "links": [],
        "start_time": 1.7e9 + i,
        "end_time": 1.7e9 + i + 0.5,
        "context": {"trace_id": "a" * 32, "span_id": f"{i:016x}", "is_remote": False, "trace_state": {}},
        "parent": None,
        "resource": {"attributes": {"service.name": "agent", "telemetry.sdk.language": "python"}, "schema_url": ""},
    }


def per_call(function: Callable[[bytes], Any], body: bytes, repeats: int) -> float:
    started = time.perf_counter()
    for _ in range(repeats):
        function(body)
    return (time.perf_counter() - started) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spans", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    for label, note in (("ASCII text", "value"), ("a \\u escape", "valué")):
        body = json.dumps({"spans": [span(i, note) for i in range(args.spans)]}).encode()
        loads = per_call(json.loads, body, args.repeats)
        checked = per_call(decode, body, args.repeats)
        print(
            f"{label:12} {len(body) / 1000:7.1f} kB  json.loads {loads * 1e3:6.2f} ms  decode {checked * 1e3:6.2f} ms"
            f"  checks {(checked - loads) / args.spans * 1e6:5.1f} µs/span  ratio {checked / loads:4.2f}"
        )


if __name__ == "__main__":
    main()

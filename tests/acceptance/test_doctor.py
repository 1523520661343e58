"""``store doctor``: the pre-flight a user runs before ``store run`` or ``store train``.

Real parts: a ``store serve`` subprocess (SQLite), ``store doctor`` as installed, run from the repository root (the
agent is imported from there, as ``store run`` would), and two LLM endpoints: the scripted stand-in of
``tests.scripted_upstream`` (answers with token ids and tool calls, as vLLM does) and a STAND-IN for a hosted API
that returns no token ids and refuses ``tools`` (what such a service cannot be offline).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from lightning_store import LLM
from lightning_store.client import HttpStore
from tests.acceptance.test_cli import store_command
from tests.acceptance.test_serve import Server, clean_env, free_port, wait_healthy
from tests.scripted_optimizer import serve_scripted
from tests.scripted_upstream import create_app

ROOT = Path(__file__).parents[2]
AGENT = "tests.acceptance.test_cli_rollouts:weather_agent"


def hosted_stand_in() -> FastAPI:
    """A hosted chat API as many are: plain answers, no token ids, and no tools for this model."""
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def complete(body: dict[str, Any]) -> JSONResponse:
        if body.get("tools"):
            return JSONResponse({"error": {"message": "tools are not supported by this model"}}, status_code=400)
        message = {"role": "assistant", "content": "OK"}
        return JSONResponse(
            {
                "id": "c1",
                "object": "chat.completion",
                "model": body["model"],
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            }
        )

    return app


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    served = Server(cwd=tmp_path)
    try:
        asyncio.run(wait_healthy(served.url, served.process))
        yield served
    finally:
        served.stop()


def set_llm(url: str, llm: LLM) -> None:
    async def run() -> None:
        store = HttpStore(url)
        try:
            await store.add_resources({"main_llm": llm})
        finally:
            await store.close()

    asyncio.run(run())


def doctor(*args: str) -> tuple[int, list[dict[str, str]]]:
    result = subprocess.run(
        [*store_command(), "doctor", "--json", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=clean_env(),
        timeout=120,
        check=False,
    )
    return result.returncode, [json.loads(line) for line in result.stdout.splitlines()]


def outcomes(checks: list[dict[str, str]]) -> dict[str, str]:
    return {c["check"]: c["outcome"] for c in checks}


def test_a_ready_setup_passes_every_check(server: Server) -> None:
    with serve_scripted(create_app({"city": "Paris"})) as upstream:
        set_llm(server.url, LLM(endpoint=f"{upstream}/v1", model="scripted"))
        code, checks = doctor("--store", server.url, "--agent", AGENT)
    assert code == 0, checks
    assert outcomes(checks) == {
        "store": "ok",
        "resources": "ok",
        "llm": "ok",
        "token ids": "ok",
        "tools": "ok",
        "agent": "ok",
    }
    details = {c["check"]: c["detail"] for c in checks}
    assert f"main_llm = scripted at {upstream}/v1" in details["resources"]
    assert details["agent"].startswith(f"{AGENT} loads")


def test_what_will_not_work_is_named_before_anything_runs(server: Server) -> None:
    code, checks = doctor("--store", server.url, "--agent", "my_agnet:agent")
    assert code == 1 and outcomes(checks) == {"store": "ok", "resources": "FAIL", "agent": "FAIL"}
    assert "store resources set-llm URL --model M" in checks[1]["detail"]
    assert "cannot import 'my_agnet'" in checks[2]["detail"]

    with serve_scripted(hosted_stand_in()) as hosted:
        set_llm(server.url, LLM(endpoint=f"{hosted}/v1", model="hosted"))
        code, checks = doctor("--store", server.url)
    assert code == 0 and outcomes(checks) == {  # warnings: it runs, but cannot be trained on / call tools
        "store": "ok",
        "resources": "ok",
        "llm": "ok",
        "token ids": "warn",
        "tools": "warn",
    }
    assert "cannot be trained on" in checks[3]["detail"] and "tools are not supported" in checks[4]["detail"]

    set_llm(server.url, LLM(endpoint=f"http://127.0.0.1:{free_port()}/v1", model="gone"))
    code, checks = doctor("--store", server.url)
    assert code == 1 and outcomes(checks)["llm"] == "FAIL" and "is the model server running?" in checks[2]["detail"]

    code, checks = doctor("--store", f"http://127.0.0.1:{free_port()}")
    assert code == 1 and checks[0]["check"] == "store" and "start one with `store serve`" in checks[0]["detail"]

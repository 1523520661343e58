"""``store doctor``: check, before anything runs, what a ``store run`` or ``store train`` will need.

Each check is one line, ``ok``, ``warn`` or ``FAIL``, with what was found or what to do:

- **store**: the store at ``--store`` answers (a server's health, then its statistics), with the token if given;
- **resources**: the latest resources snapshot, and the LLM it names (the first ``llm`` resource);
- **llm**: that endpoint answers a one-token chat completion for that model, and whether its answer carries the
  token ids training needs (``prompt_token_ids`` and ``choices[0].token_ids``, as vLLM's ``return_token_ids`` and
  ``store policy serve`` give them: without them the proxy records calls that cannot be trained on) and whether
  it accepts ``tools`` (a tool-calling agent needs that);
- **agent** (with ``--agent``): the agent imports from this directory, as ``store run`` would import it
  (``--agent-only``: this check alone, as ``store train --dry-run`` uses it).

The exit status is 1 when a check failed, else 0 (warnings included). Nothing is written to the store; the LLM
check sends two tiny completions (one with a tool offered).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass
from typing import Annotated, Any, Literal

import httpx
import typer

from lightning_store import aio
from lightning_store.cli.common import DEFAULT_STORE, AsJson, StoreTarget, Token
from lightning_store.connect import connect, store_target
from lightning_store.errors import StoreError
from lightning_store.resources import LLM
from runners.agent import agent_problem, load_agent

Outcome = Literal["ok", "warn", "FAIL"]
PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": "ping",
        "description": "Answers pong.",
        "parameters": {"type": "object", "properties": {}},
    },
}
LLM_TIMEOUT = 60.0
"""Seconds the endpoint may take for a one-token answer (a local model's first call loads it)."""


@dataclass
class Check:
    check: str
    outcome: Outcome
    detail: str


def doctor(
    agent: Annotated[
        str | None, typer.Option(help="The agent as module:name, checked as store run imports it.")
    ] = None,
    target: StoreTarget = DEFAULT_STORE,
    token: Token = None,
    agent_only: Annotated[
        bool, typer.Option("--agent-only", help="Check the agent alone: no store, resources or LLM checks.")
    ] = False,
    as_json: AsJson = False,
) -> None:
    """Check the store, its resources, the LLM they name (token ids, tools) and the agent, before running."""
    if agent_only and agent is None:
        raise typer.BadParameter("--agent-only checks the agent: give it with --agent", param_hint="--agent")
    checks = [] if agent_only else aio.run(_store_checks(target, token))
    if agent is not None:
        checks.append(_agent_check(agent))
    for check in checks:
        if as_json:
            typer.echo(json.dumps(asdict(check)))
        else:
            typer.echo(f"{check.outcome:<4}  {check.check:<9}  {check.detail}")
    if any(check.outcome == "FAIL" for check in checks):
        raise typer.Exit(1)


async def _store_checks(target: str, token: str | None) -> list[Check]:
    try:
        url = store_target(target)
    except StoreError as exc:
        return [Check("store", "FAIL", exc.message)]
    try:
        store = await connect(url, token=token, timeout=10)
    except Exception as exc:  # an unsupported database URL, a driver not installed
        return [Check("store", "FAIL", f"cannot open {url}: {exc}")]
    try:
        try:
            stats = await store.statistics()
            latest = await store.get_latest_resources()
        except Exception as exc:
            hint = " (start one with `store serve`, or name another with --store)" if url.startswith("http") else ""
            return [Check("store", "FAIL", f"{url}: {type(exc).__name__}: {str(exc)[:200]}{hint}")]
        found = f"{url}: {stats['total_rollouts']} rollouts, {stats['total_resources']} resources snapshots"
        checks = [Check("store", "ok", found)]
        if latest is None:
            line = "the store has no resources yet: `store resources set-llm URL --model M` names the LLM"
            return [*checks, Check("resources", "FAIL", line)]
        llms = [(name, r) for name, r in latest.resources.items() if isinstance(r, LLM)]
        if not llms:
            line = f"the latest snapshot {latest.resources_id} names no LLM (`store resources set-llm URL --model M`)"
            return [*checks, Check("resources", "warn", line)]
        name, llm = llms[0]
        checks.append(Check("resources", "ok", f"latest {latest.resources_id}: {name} = {llm.model} at {llm.endpoint}"))
        return [*checks, *await _llm_checks(llm)]
    finally:
        await store.close()


async def _llm_checks(llm: LLM) -> list[Check]:
    headers = {"authorization": f"Bearer {llm.api_key}"} if llm.api_key else {}
    body: dict[str, Any] = {
        "model": llm.model,
        "messages": [{"role": "user", "content": "Say OK."}],
        "max_tokens": 1,
        "return_token_ids": True,
    }
    url = llm.endpoint.rstrip("/") + "/chat/completions"
    async with httpx.AsyncClient(timeout=LLM_TIMEOUT, headers=headers) as http:
        try:
            plain = await http.post(url, json=body)
        except httpx.HTTPError as exc:
            return [Check("llm", "FAIL", f"{url}: {type(exc).__name__}: {exc} (is the model server running?)")]
        if plain.status_code != 200:
            return [Check("llm", "FAIL", f"{url} answered {plain.status_code}: {plain.text[:200]}")]
        checks = [Check("llm", "ok", f"{llm.model} at {llm.endpoint} answers")]
        checks.append(_token_ids_check(plain.json()))
        try:
            tooled = await http.post(url, json={**body, "tools": [PROBE_TOOL]})
        except httpx.HTTPError as exc:
            return [*checks, Check("tools", "warn", f"the request with a tool failed: {type(exc).__name__}: {exc}")]
    if tooled.status_code == 200:
        return [*checks, Check("tools", "ok", "accepts tools (a tool-calling agent can run)")]
    refused = f"refuses tools ({tooled.status_code}: {tooled.text[:160]}): a tool-calling agent cannot run on it"
    return [*checks, Check("tools", "warn", refused)]


def _token_ids_check(answer: Any) -> Check:
    choices = answer.get("choices") if isinstance(answer, dict) else None
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    prompt = answer.get("prompt_token_ids") or choice.get("prompt_token_ids")
    if prompt and choice.get("token_ids"):
        return Check("token ids", "ok", "the answers carry prompt and response token ids (trainable)")
    return Check(
        "token ids",
        "warn",
        "the answers carry no token ids: calls are recorded but cannot be trained on (serve the model with "
        "`store policy serve` or vLLM, which return them)",
    )


def _agent_check(spec: str) -> Check:
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as store run's workers import it: from the directory it runs in
    try:
        agent = load_agent(spec)
    except Exception as exc:  # whatever importing the user's module raises
        return Check("agent", "FAIL", agent_problem(spec, exc))
    return Check("agent", "ok", f"{spec} loads ({agent.name}{', async' if agent.is_async else ''})")

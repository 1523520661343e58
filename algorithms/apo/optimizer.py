"""The optimizer LLM: any OpenAI-compatible chat endpoint, called one request at a time, each call recorded in the
store as an LLM call of the APO run (``llm_calls_v``, ``agent_name`` ``apo.critique`` or ``apo.edit``), so its
cost is queryable next to the agents' calls.

The record doubles as the replay log of a resumed run: a call's record id derives from its place in the run's
sequence of calls and its request, and a call whose record is already in the store is answered from it instead
of the endpoint. A run restarted after a crash therefore replays its search with the same answers and charges
each call once; a run that takes another path (a changed config) makes new calls.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from dataclasses import dataclass
from typing import Any

import httpx

from algorithms.apo.budget import Budget
from lightning_store.contract import LightningStore
from lightning_store.limits import storable
from lightning_store.llm_calls import LlmCall
from lightning_store.settings import OptimizerSettings

RETRY_PAUSES = (1.0, 4.0, 16.0)
RETRIED_STATUSES = (429, 500, 502, 503, 504)


class OptimizerError(RuntimeError):
    """The optimizer endpoint failed or answered something that is not a chat completion."""


async def check_reachable(settings: OptimizerSettings) -> None:
    """Fail now, not mid-run, when the endpoint cannot be reached (``GET /models``; any HTTP answer counts as
    reachable, since some servers do not implement that route)."""
    url = (settings.optimizer_url or "").rstrip("/")
    try:
        async with httpx.AsyncClient(timeout=min(10.0, settings.optimizer_timeout)) as client:
            await client.get(f"{url}/models")
    except httpx.HTTPError as error:
        raise OptimizerError(f"cannot reach {settings.optimizer_url}: {type(error).__name__}: {error}") from None


class OptimizerBudgetSpent(Exception):
    """No optimizer call may start: the call or token budget is spent."""


@dataclass(frozen=True)
class Reply:
    text: str
    tokens: int


class Optimizer:
    """Chat completions against ``settings``' endpoint for the run whose rollout/attempt ids are given."""

    def __init__(
        self, settings: OptimizerSettings, store: LightningStore, run_id: str, attempt_id: str, budget: Budget
    ) -> None:
        if not settings.optimizer_url or not settings.optimizer_model:
            raise ValueError("the optimizer needs optimizer_url and optimizer_model")
        self.settings = settings
        self.model: str = settings.optimizer_model
        self.store = store
        self.run_id = run_id
        self.attempt_id = attempt_id
        self.budget = budget
        headers = {"Authorization": f"Bearer {settings.optimizer_api_key}"} if settings.optimizer_api_key else {}
        self._client = httpx.AsyncClient(
            base_url=settings.optimizer_url.rstrip("/"), headers=headers, timeout=settings.optimizer_timeout
        )
        self._recorded: dict[str, dict[str, Any]] = {}
        self._ordinal = 0

    async def load_replay(self) -> int:
        """Read the calls this run already recorded (a resumed run answers them from the store); their count."""
        for call in await self.store.query_llm_calls([self.run_id], attempt_id=self.attempt_id):
            if call.span_id and call.response is not None:
                self._recorded[call.span_id] = call.response
        return len(self._recorded)

    async def close(self) -> None:
        await self._client.aclose()

    async def complete(
        self,
        purpose: str,
        messages: list[dict[str, str]],
        *,
        temperature: float,
        model: str | None = None,
        max_tokens: int | None = None,
    ) -> Reply:
        """One call (``purpose``: ``critique`` or ``edit``). Raises :class:`OptimizerBudgetSpent` before calling
        when the budget has no call left."""
        request: dict[str, Any] = {"model": model or self.model, "messages": messages, "temperature": temperature}
        if max_tokens is not None:
            request["max_tokens"] = max_tokens
        key = hashlib.sha256(f"{self._ordinal}:{json.dumps(request, sort_keys=True)}".encode()).hexdigest()[:16]
        if not self.budget.affords_calls(1):
            raise OptimizerBudgetSpent()
        self._ordinal += 1
        response = self._recorded.get(key)
        if response is None:
            started = time.time()
            response = await self._post(request)
            await self.store.add_llm_calls(
                [
                    LlmCall(
                        rollout_id=self.run_id,
                        attempt_id=self.attempt_id,
                        span_id=key,
                        agent_name=f"apo.{purpose}",
                        model=str(request["model"]),
                        prompt_token_ids=[],
                        response_token_ids=[],
                        request=request,
                        response=response,
                        finish_reason=_finish_reason(response),
                        start_time=started,
                        end_time=time.time(),
                        latency_seconds=time.time() - started,
                    )
                ]
            )
            self._recorded[key] = response
        tokens = _tokens(response)
        self.budget.charge_call(tokens)
        return Reply(_text(response), tokens)

    async def _post(self, request: dict[str, Any]) -> dict[str, Any]:
        """The endpoint's answer; a connection error, 429 or 5xx is tried again after 1, 4 and 16 s (a hosted API's
        passing trouble should not end a run), anything else fails at once."""
        for pause in (*RETRY_PAUSES, None):
            try:
                answer = await self._client.post("/chat/completions", json=request)
            except httpx.HTTPError as error:
                if pause is None:
                    raise OptimizerError(f"optimizer call to {self.settings.optimizer_url} failed: {error}") from None
                await asyncio.sleep(pause)
                continue
            if answer.status_code in RETRIED_STATUSES and pause is not None:
                await asyncio.sleep(pause)
                continue
            break
        if answer.status_code >= 400:
            raise OptimizerError(f"optimizer answered {answer.status_code}: {answer.text[:500]}")
        try:
            body = storable(answer.json(), answer.content)  # a NUL in a model's text would be lost on Postgres
            _text(body)
        except (ValueError, KeyError, IndexError, TypeError):
            raise OptimizerError(
                f"optimizer answered something that is not a chat completion: {answer.text[:500]}"
            ) from None
        if not isinstance(body, dict):
            raise OptimizerError("optimizer answered something that is not a chat completion")
        return body


def _text(response: dict[str, Any]) -> str:
    content = response["choices"][0]["message"]["content"]
    return content if isinstance(content, str) else ""


def _finish_reason(response: dict[str, Any]) -> str | None:
    try:
        reason = response["choices"][0].get("finish_reason")
    except (KeyError, IndexError, AttributeError):
        return None
    return str(reason)[:32] if reason is not None else None


def _tokens(response: dict[str, Any]) -> int:
    usage = response.get("usage") or {}
    total = usage.get("total_tokens")
    if isinstance(total, int):
        return total
    parts = [usage.get("prompt_tokens"), usage.get("completion_tokens")]
    return sum(p for p in parts if isinstance(p, int))

"""The messages view: each LLM call as a chat transcript (with its tools), for prompt optimization and SFT.

Where transitions carry token ids, a transcript carries what the agent sent and got back in the OpenAI chat
format, so that it can be re-rendered with another template, shown to a critic model, or used as an SFT
example. It is read from the request and response the LLM proxy recorded with each call.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from adapters.episodes import Episode


@dataclass(frozen=True)
class Transcript:
    """One call: ``messages`` sent plus the assistant's reply as the last message, the ``tools`` offered
    (OpenAI function specs, empty when none), and the episode's final reward."""

    rollout_id: str
    step: int
    agent_name: str | None
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    reward: float | None


def transcripts(episodes: Sequence[Episode], *, last_only: bool = False) -> list[Transcript]:
    """Transcripts of every call of the episodes (with ``last_only``, of each episode's last call: the whole
    conversation when the agent keeps one history). Calls recorded without their request are skipped."""
    found = []
    for episode in episodes:
        indexed = list(enumerate(episode.calls))
        for step, call in indexed[-1:] if last_only else indexed:
            if not call.request or not isinstance(call.request.get("messages"), list):
                continue
            messages = [dict(m) for m in call.request["messages"]]
            reply = _reply(call.response)
            if reply is not None:
                messages.append(reply)
            found.append(
                Transcript(
                    rollout_id=episode.rollout.rollout_id,
                    step=step,
                    agent_name=episode.agent_of(call),
                    messages=messages,
                    tools=list(call.request.get("tools") or []),
                    reward=episode.reward,
                )
            )
    return found


def _reply(response: dict[str, Any] | None) -> dict[str, Any] | None:
    """The assistant message of a chat completion, without provider extras (token ids, logprobs)."""
    choices = (response or {}).get("choices") or []
    message = choices[0].get("message") if choices and isinstance(choices[0], dict) else None
    if not isinstance(message, dict):
        return None
    keep = ("role", "content", "tool_calls", "name")
    return {k: v for k, v in message.items() if k in keep and v is not None}

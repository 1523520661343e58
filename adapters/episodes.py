"""Reading finished rollouts back from the store as episodes: the LLM calls, rewards and tool calls of the
attempt that counts.

A batch of rollouts is read with a fixed number of store queries (rollouts, then LLM calls and five span
searches at once), never one request per span or per rollout, so that adapting a training batch costs the same
two round trips' wait against a local SQL store or a remote server.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from lightning_store import semconv
from lightning_store.contract import LightningStore
from lightning_store.llm_calls import LlmCall
from lightning_store.models import AttemptedRollout, Rollout
from lightning_store.spans import Span

OPENINFERENCE_KIND = "openinference.span.kind"
AGENT_NAME_ATTRIBUTES = ("gen_ai.agent.name", "agent.name", "graph.node.id")
"""Attributes naming the agent of a span, first match wins: the GenAI convention, then OpenInference's."""
LANGGRAPH_NODE = "langgraph_node"
"""The key of a LangGraph node's name in the ``metadata`` OpenInference records on its CHAIN span (a JSON text)."""


@dataclass(frozen=True)
class ToolCall:
    """A finished tool call of the episode: its name, whether it succeeded, and when it started."""

    name: str
    ok: bool
    start_time: float


@dataclass(frozen=True)
class AgentSpan:
    """A span that runs one named agent; LLM calls that start inside it belong to that agent."""

    name: str
    start_time: float
    end_time: float


@dataclass
class Episode:
    """One rollout's attempt that counts (its latest, which succeeded), as the adapter needs it.

    ``calls`` are in the order they were made. ``reward`` is the primary value of the last reward span (None
    when the agent emitted none). ``group`` is what GRPO groups by: the rollout's ``metadata["task_id"]`` when
    set, else its input (canonical JSON).
    """

    rollout: Rollout
    attempt_id: str
    calls: list[LlmCall]
    reward: float | None
    group: str
    tools: list[ToolCall] = field(default_factory=list)
    agents: list[AgentSpan] = field(default_factory=list)

    def agent_of(self, call: LlmCall) -> str | None:
        """The call's agent: the name the call was recorded with, else the innermost agent span around it."""
        if call.agent_name:
            return call.agent_name
        inside = [a for a in self.agents if a.start_time <= call.start_time <= a.end_time]
        return min(inside, key=lambda a: a.end_time - a.start_time).name if inside else None

    def tools_after(self, index: int) -> list[ToolCall]:
        """The tool calls that the ``index``-th LLM call led to: those started after it and before the next."""
        start = self.calls[index].start_time
        end = self.calls[index + 1].start_time if index + 1 < len(self.calls) else math.inf
        return [tool for tool in self.tools if start <= tool.start_time < end]


@dataclass
class EpisodeBatch:
    """The episodes of a set of rollouts, and how many rollouts were left out and why."""

    episodes: list[Episode]
    skipped: dict[str, int]


def group_key(rollout: Rollout) -> str:
    metadata = rollout.metadata or {}
    if "task_id" in metadata:
        return str(metadata["task_id"])
    return json.dumps(rollout.input, sort_keys=True, default=str)


def primary_reward(span: Span) -> float | None:
    value = span.attributes.get(semconv.reward_value(0))
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


async def read_episodes(
    store: LightningStore, rollout_ids: Sequence[str], *, agent_spans: Sequence[str] = ()
) -> EpisodeBatch:
    """Episodes of the given rollouts that succeeded; the others are counted in ``skipped`` by reason
    (``not_found``, ``not_succeeded``, ``no_llm_calls``).

    The spans that name the agent of the LLM calls inside them: agent spans (GenAI ``invoke_agent …``,
    OpenInference ``AGENT``), LangGraph nodes (OpenInference ``CHAIN`` spans whose ``metadata`` holds a
    ``langgraph_node``: the node's name), and spans named one of ``agent_spans`` (their name; an
    ``operation("planner")`` span's is its operation name)."""
    ids = list(dict.fromkeys(rollout_ids))
    skipped: dict[str, int] = defaultdict(int)
    if not ids:
        return EpisodeBatch([], {})
    rollouts = {r.rollout_id: r for r in (await store.query_rollouts(rollout_id_in=ids)).items}
    skipped["not_found"] = len(ids) - len(rollouts)
    counted: dict[str, AttemptedRollout] = {}
    for rollout in rollouts.values():
        if rollout.status == "succeeded" and isinstance(rollout, AttemptedRollout):
            counted[rollout.rollout_id] = rollout
        else:
            skipped["not_succeeded"] += 1
    attempt_of = {r.rollout_id: r.attempt.attempt_id for r in counted.values()}
    chosen = list(counted)
    if not chosen:
        return EpisodeBatch([], {k: v for k, v in skipped.items() if v})
    # The calls and the span searches do not depend on each other: sent together, they cost one round trip's
    # wait instead of six.
    calls, spans = await asyncio.gather(
        store.query_llm_calls(chosen), _spans(store, chosen, list(attempt_of.values()), agent_spans)
    )
    by_rollout: dict[str, list[LlmCall]] = defaultdict(list)
    for call in calls:
        if attempt_of.get(call.rollout_id) == call.attempt_id:
            by_rollout[call.rollout_id].append(call)
    episodes = []
    for rollout_id in (i for i in ids if i in counted):
        if not by_rollout[rollout_id]:
            skipped["no_llm_calls"] += 1
            continue
        own = spans[rollout_id]
        rewards = [r for r in (primary_reward(s) for s in own if s.name == semconv.ANNOTATION) if r is not None]
        episodes.append(
            Episode(
                rollout=counted[rollout_id],
                attempt_id=attempt_of[rollout_id],
                calls=sorted(by_rollout[rollout_id], key=lambda c: (c.sequence_id or 0, c.start_time)),
                reward=rewards[-1] if rewards else None,
                group=group_key(counted[rollout_id]),
                tools=sorted(filter(None, map(_tool_call, own)), key=lambda t: t.start_time),
                agents=[agent for span in own if (agent := _agent_span(span, agent_spans)) is not None],
            )
        )
    return EpisodeBatch(episodes, {k: v for k, v in skipped.items() if v})


async def _spans(
    store: LightningStore, rollout_ids: list[str], attempt_ids: list[str], agent_spans: Sequence[str]
) -> dict[str, list[Span]]:
    """Reward, tool and agent spans of the chosen attempts, by rollout, in the order they were stored."""
    found: dict[str, list[Span]] = defaultdict(list)
    if not rollout_ids:
        return found
    queries: list[dict[str, Any]] = [
        {"names": [semconv.ANNOTATION]},
        {"name_prefix": "execute_tool"},
        {"name_prefix": "invoke_agent"},
        {"attributes_match": {OPENINFERENCE_KIND: "TOOL"}},
        {"attributes_match": {OPENINFERENCE_KIND: "AGENT"}},
        {"attributes_match": {OPENINFERENCE_KIND: "CHAIN"}},  # LangGraph's nodes among them
    ]
    if agent_spans:
        queries.append({"names": [*agent_spans, semconv.OPERATION]})
    pages = await asyncio.gather(
        *(store.search_spans(rollout_ids=rollout_ids, attempt_ids=attempt_ids, limit=-1, **query) for query in queries)
    )
    seen: set[tuple[str, str]] = set()
    for page in pages:
        for span in page.items:
            if (span.rollout_id, span.span_id) not in seen:
                seen.add((span.rollout_id, span.span_id))
                found[span.rollout_id].append(span)
    for spans in found.values():
        spans.sort(key=lambda s: s.sequence_id)
    return found


def _tool_call(span: Span) -> ToolCall | None:
    is_tool = span.name.startswith("execute_tool") or span.attributes.get(OPENINFERENCE_KIND) == "TOOL"
    if not is_tool or span.start_time is None:
        return None
    name = span.attributes.get(semconv.TOOL_NAME) or span.attributes.get("tool.name") or span.name
    name = str(name).removeprefix("execute_tool ").strip()
    return ToolCall(name=name, ok=span.status.status_code != "ERROR", start_time=span.start_time)


def _agent_span(span: Span, named: Sequence[str] = ()) -> AgentSpan | None:
    if span.start_time is None or span.end_time is None:
        return None
    own = span.attributes.get(semconv.OPERATION_NAME) if span.name == semconv.OPERATION else span.name
    if own in named:
        return AgentSpan(name=str(own), start_time=span.start_time, end_time=span.end_time)
    kind = span.attributes.get(OPENINFERENCE_KIND)
    if kind == "CHAIN":
        node = _langgraph_node(span.attributes.get("metadata"))
        return None if node is None else AgentSpan(name=node, start_time=span.start_time, end_time=span.end_time)
    if not (span.name.startswith("invoke_agent") or kind == "AGENT"):
        return None
    names = (span.attributes.get(key) for key in AGENT_NAME_ATTRIBUTES)
    name = next((str(n) for n in names if n), span.name.removeprefix("invoke_agent").strip() or span.name)
    return AgentSpan(name=name, start_time=span.start_time, end_time=span.end_time)


def _langgraph_node(metadata: Any) -> str | None:
    """The LangGraph node a CHAIN span runs, from its ``metadata`` (OpenInference writes it as JSON text)."""
    if isinstance(metadata, str) and LANGGRAPH_NODE in metadata:
        try:
            metadata = json.loads(metadata)
        except ValueError:
            return None
    node = metadata.get(LANGGRAPH_NODE) if isinstance(metadata, dict) else None
    return node if isinstance(node, str) and node else None

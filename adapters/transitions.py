"""Episodes to transitions: one per LLM call, with the reward and return that credit assignment gave it.

No concatenation and no masks: each transition is exactly one call's prompt token ids (what the policy saw)
and response token ids (what it produced), so any single-turn RL algorithm trains on it unchanged.
Agent selection keeps only the calls of the agents being trained (a regex on the agent's name), as in the
paper's text-to-SQL case where two of three agents learn and the third stays fixed.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from adapters.credit import CreditAssignment, Identical
from adapters.episodes import Episode, read_episodes
from lightning_store.contract import LightningStore


@dataclass(frozen=True)
class Transition:
    """One LLM call as a training sample. ``logprobs`` are the behaviour policy's, one per response token
    (None when the server did not return them). ``step`` is the call's index within its episode."""

    rollout_id: str
    attempt_id: str
    group: str
    agent_name: str | None
    step: int
    resources_id: str | None
    resources_version: int | None
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float] | None
    reward: float
    return_: float
    final_reward: float


@dataclass
class Adapted:
    """Transitions of a batch, and what was left out: ``skipped`` counts episodes and calls by reason.
    ``others`` holds the calls of the agents not trained, when the adapter keeps them (``keep_others``)."""

    transitions: list[Transition]
    skipped: Counter[str] = field(default_factory=Counter)
    others: list[Transition] = field(default_factory=list)

    @property
    def episodes(self) -> int:
        return len({t.rollout_id for t in self.transitions})


@dataclass(frozen=True)
class TransitionAdapter:
    """Turns episodes into transitions.

    ``credit`` shares each episode's reward among its calls. ``agents`` is a regex (``re.fullmatch``) of the
    agent names to train; None trains every call, including calls with no agent name. ``missing_reward``
    stands in for an episode that emitted no reward; None leaves such episodes out (counted as
    ``no_reward``). ``keep_others`` keeps the other agents' calls apart in ``Adapted.others`` (still counted
    as ``other_agent_calls``), for a trainer that holds those agents' behaviour in place. ``agent_spans`` names
    spans (by their exact name, or an ``operation``'s name) that name the agent of the LLM calls made inside
    them, besides the agent spans and LangGraph nodes that always do (:func:`~adapters.episodes.read_episodes`).
    ``llm_resource``, when set, trains only the calls that llm resource served (a call recorded without one
    counts as its): another LLM of the rollout (a judge, a hosted model for another role) is not the policy, and
    its calls are counted as ``other_llm_calls``.
    """

    credit: CreditAssignment = field(default_factory=Identical)
    agents: str | None = None
    missing_reward: float | None = None
    keep_others: bool = False
    agent_spans: tuple[str, ...] = ()
    llm_resource: str | None = None

    def __post_init__(self) -> None:
        if self.agents is not None:
            re.compile(self.agents)  # a bad pattern fails here, not in the middle of training

    def adapt(self, episodes: Sequence[Episode], skipped: dict[str, int] | None = None) -> Adapted:
        adapted = Adapted([], Counter(skipped or {}))
        pattern = re.compile(self.agents) if self.agents is not None else None
        for episode in episodes:
            final = episode.reward if episode.reward is not None else self.missing_reward
            if final is None:
                adapted.skipped["no_reward"] += 1
                continue
            rewards, returns = self.credit.assign(episode, final)
            for step, call in enumerate(episode.calls):
                if self.llm_resource is not None and call.llm_resource not in (None, self.llm_resource):
                    adapted.skipped["other_llm_calls"] += 1
                    continue
                agent = episode.agent_of(call)
                other = pattern is not None and (agent is None or not pattern.fullmatch(agent))
                if other:
                    adapted.skipped["other_agent_calls"] += 1
                    if not self.keep_others:
                        continue
                if call.error is not None:  # its answer could not be read as a transition (the record says why)
                    adapted.skipped["untrainable_calls"] += 1
                    continue
                if not call.prompt_token_ids or not call.response_token_ids:
                    adapted.skipped["calls_without_token_ids"] += 1
                    continue
                (adapted.others if other else adapted.transitions).append(
                    Transition(
                        rollout_id=episode.rollout.rollout_id,
                        attempt_id=episode.attempt_id,
                        group=episode.group,
                        agent_name=agent,
                        step=step,
                        resources_id=call.resources_id,
                        resources_version=call.resources_version,
                        prompt_ids=list(call.prompt_token_ids),
                        response_ids=list(call.response_token_ids),
                        logprobs=list(call.response_logprobs) if call.response_logprobs else None,
                        reward=rewards[step],
                        return_=returns[step],
                        final_reward=final,
                    )
                )
        return adapted

    async def read(self, store: LightningStore, rollout_ids: Sequence[str]) -> Adapted:
        """Read the rollouts' episodes from ``store`` (a fixed number of queries) and adapt them."""
        batch = await read_episodes(store, rollout_ids, agent_spans=self.agent_spans)
        return self.adapt(batch.episodes, batch.skipped)

"""LightningRL: GRPO, REINFORCE++ and PPO on transitions, one LLM call each.

The training loop is shared: enqueue ``tasks × G`` rollouts against the current policy version, wait for them
(or, asynchronously, keep the queue topped up), adapt them to transitions with credit assignment, compute the
algorithm's advantages, update the policy, serve and publish the new version, log metrics, checkpoint.
The three algorithms differ only in :meth:`LightningRL.advantages` (and PPO's value head).
"""

from __future__ import annotations

import logging
import time
from abc import abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field

from adapters import Transition, TransitionAdapter, credit_assignment
from algorithms import collect, tensor_thread
from algorithms.base import Algorithm, AlgorithmConfig
from algorithms.ruler import JudgeConfig, judge_groups
from algorithms.session import DEFAULT_MAX_STEPS, MetricsLog, ServedPolicy, TrainingSession
from algorithms.training import checkpoints
from lightning_store import aio
from lightning_store.models import RolloutConfig
from lightning_store.resources import LLM

logger = logging.getLogger(__name__)

SKIPPED_EPISODES = ("not_found", "not_succeeded", "no_llm_calls", "no_reward")
"""The adapter's reasons that leave a whole rollout out (its other reasons count LLM calls)."""

if TYPE_CHECKING:
    import torch

    from algorithms.training.policy import TrainablePolicy
    from algorithms.training.trainers import Trainer
    from algorithms.training.update import Rollouts


@dataclass
class Estimate:
    """An algorithm's advantages: ``keep`` lists the transitions to train on (others carry no signal, e.g. a
    GRPO group with equal rewards); ``per_token`` is ``[len(keep), T]``; ``returns`` are PPO's value targets."""

    keep: list[int]
    per_token: torch.Tensor
    returns: torch.Tensor | None = None
    metrics: dict[str, float] = field(default_factory=dict)


class LightningRLConfig(AlgorithmConfig):
    """Options shared by GRPO, REINFORCE++ and PPO (each documented in docs/reference/algorithms.md)."""

    group_size: int = Field(4, ge=1, le=256, description="Rollouts per task per step (G).")
    tasks_per_step: int = Field(8, ge=1, description="Tasks drawn per step; a step trains on tasks × G rollouts.")
    learning_rate: float = Field(1e-5, gt=0, description="AdamW learning rate.")
    clip_eps: float = Field(0.2, gt=0, lt=1, description="PPO-style clip range of the importance ratio (ε).")
    kl_beta: float = Field(0.04, ge=0, description="Weight of the k3 KL to the frozen reference policy (β).")
    micro_batch_size: int = Field(
        8, ge=1, description="Sequences per forward/backward pass (a call each, or a packed conversation's calls)."
    )
    mini_batches: int = Field(1, ge=1, description="Optimizer steps per epoch over a step's transitions.")
    epochs: int = Field(1, ge=1, description="Passes over a step's transitions.")
    pack_conversations: bool = Field(
        True,
        description="Train the calls of one conversation whose prompts extend the previous call's prompt +"
        " response in one sequence (each call keeps its own transition, advantages and loss terms; the loss is"
        " that of separate sequences); False: every call is a sequence of its own.",
    )
    max_grad_norm: float | None = Field(1.0, gt=0, description="Gradient clipping norm (None: no clipping).")
    credit: Literal["identical", "discounted", "air"] = Field("identical", description="Credit assignment.")
    gamma: float = Field(1.0, gt=0, le=1, description="Discount of the `discounted` credit assignment.")
    air_alpha: float = Field(0.2, ge=0, le=1, description="Weight of tool-status rewards in AIR (α).")
    air_weights: dict[str, float] = Field(default_factory=dict, description="AIR weight per tool name.")
    agents: str | None = Field(
        None,
        description="Regex of the agent names to train (None: every LLM call). A call's agent is the name it was "
        "recorded with, else the innermost agent span around it: an agent span, a LangGraph node, or a span "
        "named in `agent_spans`.",
    )
    agent_spans: list[str] = Field(
        default_factory=list,
        description="Span names that name the agent of the LLM calls made inside them (e.g. a workflow's steps "
        "traced with `operation`); agent spans and LangGraph nodes always do.",
    )
    anchor_beta: float = Field(
        0.0,
        ge=0,
        description="With `agents`: weight of a KL-to-reference term on the other agents' calls, which holds their"
        " behaviour in place where they share the model (0: their calls are left out).",
    )
    asynchronous: bool = Field(False, description="Keep the queue topped up instead of waiting for each batch.")
    max_staleness: int = Field(1, ge=0, description="Async mode: drop transitions more than K versions old.")
    rollout_timeout: float | None = Field(300.0, gt=0, description="Timeout of each rollout's attempt (s).")
    max_attempts: int = Field(2, ge=1, description="Attempts per rollout (failed and timed-out ones retry).")
    save_every: int = Field(1, ge=0, description="Checkpoint every N steps (0: only at the end).")
    keep_checkpoints: int = Field(2, ge=1, description="How many checkpoints to keep.")
    lora: dict[str, Any] | None = Field(None, description="peft LoraConfig options; None trains every weight.")
    seed: int = Field(0, description="Seed of task sampling and mini-batch shuffling.")
    eval_every: int = Field(0, ge=0, description="Evaluate on the validation tasks every N steps (0: first/last).")
    eval_repeats: int = Field(4, ge=1, description="Rollouts per validation task in an evaluation.")
    max_tokens_cap: int | None = Field(
        None,
        ge=1,
        description="The most tokens an agent's LLM call may ask of the policy (a larger `max_tokens` is lowered "
        "to it by the proxy, and a call that names none gets it): framework agents ask for 2,048 where a small "
        "model on a CPU should write a few dozen (None: no cap).",
    )
    judge: JudgeConfig | None = Field(
        None,
        description="A judge LLM that ranks each group's rollouts relative to each other (after RULER) and whose "
        "scores become their rewards: `{endpoint, model, api_key, rubric, max_tokens, timeout}` "
        "([algorithms.md](#judge-rewards-ruler)). None: the agents' own rewards.",
    )
    forced_parameters: dict[str, Any] = Field(
        default_factory=dict,
        description="Request fields the proxy sets on every call to the policy, replacing the agent's: "
        '`{"tool_choice": "required"}` for a framework that always asks `auto` (AutoGen), where a small model left'
        " to choose never calls its tool. It applies to every call: an agent that answers after its tool call would"
        " be made to call again (it suits AutoGen's single tool iteration), and vLLM refuses `required` without"
        " tools.",
    )


class LightningRL(Algorithm):
    """The shared loop; subclasses define the advantage."""

    Config: ClassVar[type[AlgorithmConfig]] = LightningRLConfig
    config: LightningRLConfig
    value_head: ClassVar[bool] = False

    def _policy_llm(self, session: TrainingSession) -> LLM:
        """The LLM resource of the served policy, with this run's ``max_tokens_cap`` and ``forced_parameters``."""
        forced = self.config.forced_parameters or None
        return (
            _served(session)
            .llm()
            .model_copy(update={"max_tokens_cap": self.config.max_tokens_cap, "forced_parameters": forced})
        )

    def flat(self, transitions: list[Transition]) -> dict[str, float] | None:
        """The step's metrics when its transitions cannot train (every advantage would be dropped), found before
        any forward pass, so that such a step costs no reference log-probabilities; None when they may train."""
        del transitions
        return None

    @abstractmethod
    def advantages(self, transitions: list[Transition], rollouts: Rollouts) -> Estimate:
        """Which transitions to train on, their per-token advantages, PPO's value targets, and metrics."""

    def adapter(self) -> TransitionAdapter:
        c = self.config
        options: dict[str, object] = {}
        if c.credit == "discounted":
            options = {"gamma": c.gamma}
        elif c.credit == "air":
            options = {"alpha": c.air_alpha, "weights": dict(c.air_weights)}
        anchored = c.agents is not None and c.anchor_beta > 0
        return TransitionAdapter(
            credit=credit_assignment(c.credit, **options),
            agents=c.agents,
            keep_others=anchored,
            agent_spans=tuple(c.agent_spans),
            llm_resource=collect.POLICY_LLM,
        )

    async def train(self, session: TrainingSession) -> dict[str, Any]:
        from algorithms.training.trainers import PolicySpec, open_trainer

        c = self.config
        if session.model_dir is None or session.policy is None:
            raise ValueError(f"{self.name} trains a model: the session needs model_dir and policy")
        start, checkpoint = checkpoints.resume_point(session.output_dir, session.resume)
        spec = PolicySpec(session.model_dir, c.learning_rate, self.value_head, c.lora, checkpoint)
        trainer = await tensor_thread.run(
            open_trainer,
            session.trainer,
            spec,
            reference=c.kl_beta > 0 or c.anchor_beta > 0,
            micro_batch_size=c.micro_batch_size,
            max_grad_norm=c.max_grad_norm,
            log_dir=session.output_dir,
        )
        try:
            return await self._train(session, trainer, start, resumed=checkpoint is not None)
        finally:
            await tensor_thread.run(trainer.close)

    async def _train(self, session: TrainingSession, trainer: Trainer, start: int, *, resumed: bool) -> dict[str, Any]:
        c = self.config
        max_steps = DEFAULT_MAX_STEPS if session.max_steps is None else session.max_steps
        policy = trainer.policy
        if resumed:
            await tensor_thread.run(_serve, session, policy, start)
        store = session.store
        # The store's version of the policy resources is what the proxy stamps on each LLM call: staleness is
        # measured against it (it keeps counting across runs on the same store).
        published = await collect.publish_policy(store, self._policy_llm(session))
        log = await MetricsLog.start(store, self.name, c.model_dump(), run=session.run_info)
        session.attach(log)
        run_id = log.run.rollout_id  # every rollout the run enqueues names it (metadata.training_run_id)
        sampler = collect.TaskSampler(session.train_tasks, c.tasks_per_step, seed=c.seed)
        for _ in range(start):
            sampler.draw()  # a resumed run continues with the tasks it would have drawn
        rollout_config = RolloutConfig(
            timeout_seconds=c.rollout_timeout, max_attempts=c.max_attempts, retry_condition=["failed", "timeout"]
        )
        adapter = self.adapter()
        in_flight: list[str] = []
        if session.freeze_heap:
            aio.freeze_startup_heap()  # the policy, its reference and the served copy are loaded
        try:
            if session.val_tasks and start < max_steps:
                await log.log(start, await self._evaluate(session, start, rollout_config, run_id))
            for step in range(start, max_steps):
                session.on_phase(f"collecting step {step + 1}")
                started = time.perf_counter()
                wanted = c.tasks_per_step * c.group_size
                if c.asynchronous:
                    while len(in_flight) < 2 * wanted:  # one batch running, one queued behind it
                        in_flight += await collect.enqueue_groups(
                            store, sampler.draw(), c.group_size, step=step, config=rollout_config, run_id=run_id
                        )
                    ids = await collect.take_finished(store, in_flight, wanted)
                else:
                    ids = await collect.enqueue_groups(
                        store, sampler.draw(), c.group_size, step=step, config=rollout_config, run_id=run_id
                    )
                    await collect.wait_all(store, ids)
                judged = await judge_groups(store, ids, c.judge, log.run) if c.judge is not None else {}
                collected = time.perf_counter()
                session.on_phase(f"training step {step + 1}")
                adapted = await adapter.read(store, ids)
                adapted_at = time.perf_counter()
                transitions = adapted.transitions
                lags = [published.version - (t.resources_version or 0) for t in transitions]
                stale = sum(lag > c.max_staleness for lag in lags) if c.asynchronous else 0
                if stale:
                    transitions = [t for t, lag in zip(transitions, lags, strict=True) if lag <= c.max_staleness]
                    lags = [lag for lag in lags if lag <= c.max_staleness]
                metrics = await tensor_thread.run(self._step, trainer, transitions, adapted.others)
                updated = time.perf_counter()
                rewards = list({t.rollout_id: t.final_reward for t in transitions}.values())
                # A step that trained no transition left the weights as they were: serving and publishing them
                # again would only make a new version of the same policy (and hide that nothing was learnt).
                untrained = not metrics.get("trained_transitions")
                if untrained:
                    logger.warning("step %d trained nothing: %s", step + 1, _why_untrained(adapted.skipped, rewards))
                else:
                    await tensor_thread.run(_serve, session, policy, step + 1)
                    published = await collect.publish_policy(store, self._policy_llm(session))
                finished = time.perf_counter()
                metrics |= {
                    "reward_mean": sum(rewards) / len(rewards) if rewards else 0.0,
                    "reward_std": _std(rewards),
                    "rollouts": float(len(ids)),
                    "transitions": float(len(transitions)),
                    "stale_dropped": float(stale),
                    "staleness_max": float(max(lags, default=0)),
                    "skipped_episodes": float(sum(adapted.skipped.get(k, 0) for k in SKIPPED_EPISODES)),
                    "other_agent_calls": float(adapted.skipped.get("other_agent_calls", 0)),
                    "collect_seconds": collected - started,
                    "adapt_seconds": adapted_at - collected,
                    "train_seconds": updated - adapted_at,
                    "publish_seconds": finished - updated,
                    "step_seconds": finished - started,
                    "version": float(published.version),
                    "untrained": float(untrained),
                    **judged,
                }
                last = step + 1 == max_steps
                if session.val_tasks and (last or (c.eval_every and (step + 1) % c.eval_every == 0)):
                    metrics |= await self._evaluate(session, step + 1, rollout_config, run_id)
                await log.log(step + 1, metrics)
                if (c.save_every and (step + 1) % c.save_every == 0) or step + 1 == max_steps:
                    session.on_phase(f"saving step {step + 1}")
                    await tensor_thread.run(checkpoints.save, trainer, session.output_dir, step + 1, c.keep_checkpoints)
        except BaseException:
            await log.finish(succeeded=False)
            raise
        await log.finish(succeeded=True)
        return {"steps": max(start, max_steps), "history": log.history}

    async def _evaluate(
        self, session: TrainingSession, step: int, config: RolloutConfig, run_id: str
    ) -> dict[str, float]:
        session.on_phase("evaluating")
        return await collect.evaluate(
            session.store, session.val_tasks, self.config.eval_repeats, step=step, config=config, run_id=run_id
        )

    def _step(self, trainer: Trainer, transitions: list[Any], others: list[Any]) -> dict[str, float]:
        from algorithms.training.update import UpdateJob, UpdateSettings, anchor, measure

        policy = trainer.policy

        if not transitions:
            return {"trained_transitions": 0.0}
        if (flat := self.flat(transitions)) is not None:
            return flat
        c = self.config
        # One optimizer step per batch: the policy before it is the policy differentiated, no separate pass.
        single_step = c.epochs == 1 and c.mini_batches == 1
        packing = c.pack_conversations
        rollouts = measure(policy, transitions, c.micro_batch_size, old_logprobs=not single_step, packing=packing)
        estimate = self.advantages(transitions, rollouts)
        metrics = dict(estimate.metrics)
        metrics["trained_transitions"] = float(len(estimate.keep))
        if not estimate.keep:
            return metrics
        settings = UpdateSettings(
            clip_eps=c.clip_eps,
            kl_beta=c.kl_beta,
            micro_batch_size=c.micro_batch_size,
            mini_batches=c.mini_batches,
            epochs=c.epochs,
            max_grad_norm=c.max_grad_norm,
            seed=c.seed,
            **self.update_options(),
        )
        kept = [transitions[i] for i in estimate.keep]
        anchors = anchor(policy, others, c.micro_batch_size, c.anchor_beta, packing=packing) if others else None
        selected = rollouts.select(estimate.keep)
        job = UpdateJob(kept, estimate.per_token, selected, settings, estimate.returns, anchors, packing=packing)
        return metrics | trainer.update(job)

    def update_options(self) -> dict[str, float]:
        """Extra :class:`UpdateSettings` fields of a subclass (PPO's value loss)."""
        return {}


def _why_untrained(skipped: Mapping[str, int], rewards: list[float]) -> str:
    """One line for the log: why a step had nothing to train, and what to look at."""
    left_out = ", ".join(f"{count} {reason}" for reason, count in sorted(skipped.items()) if count)
    if not rewards:
        return f"no transitions to train (left out: {left_out or 'nothing'}); the policy was not updated"
    distinct = sorted(set(rewards))
    shown = ", ".join(f"{r:g}" for r in distinct[:5]) + (", …" if len(distinct) > 5 else "")
    return (
        f"the rewards carried no signal (all equal within each group; rewards seen: {shown}); the policy was not "
        "updated and no new version was published (are the tasks too hard or too easy, or the reward constant?)"
    )


def _serve(session: TrainingSession, policy: TrainablePolicy, version: int) -> None:
    """Hands the policy's weights to the policy server (a copy of every tensor: on the tensor thread)."""
    _served(session).load_state(policy.state_dict(), version)


def _served(session: TrainingSession) -> ServedPolicy:
    if session.policy is None:
        raise ValueError("LightningRL needs the session's policy server")
    return session.policy


def _std(values: list[float]) -> float:
    if not values:
        return 0.0
    mean = sum(values) / len(values)
    return float((sum((v - mean) ** 2 for v in values) / len(values)) ** 0.5)

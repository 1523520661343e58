"""APO's options (``--config apo.yaml``). Agent Lightning 0.3's APO option names are accepted unchanged, so a 0.3
user's config runs as it is; every option is documented in docs/reference/apo.md."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from algorithms.base import AlgorithmConfig


class ApoConfig(AlgorithmConfig):
    # What is optimized ---------------------------------------------------------------------------------------
    resources_id: str | None = Field(
        None,
        description="The resources snapshot to start from (default: the store's latest): its prompt templates "
        "are the seed and its other resources (the agents' LLM) ride along with every candidate.",
    )
    templates: list[str] | None = Field(
        None, description="Names of the prompt-template resources to optimize (default: every one in the snapshot)."
    )
    require_placeholders: bool = Field(
        True, description="Refuse to start when an optimized template has no placeholder (no task data reaches it)."
    )
    publish_resources_id: str | None = Field(
        None,
        description="The resources id whose next version the best candidate becomes, which makes it the "
        "latest resources (default: the seed snapshot's id).",
    )
    # Search -------------------------------------------------------------------------------------------------
    search: Literal["pareto", "beam"] = Field("pareto", description="Per-task Pareto frontier (GEPA) or beam (0.3).")
    seed: int = Field(0, description="Seeds every random choice: same seed and same LLMs give the same run.")
    minibatch_size: int = Field(3, ge=1, description="pareto: training tasks a proposal is reflected on and tested on.")
    merge: bool = Field(False, description="pareto: also try merging two frontier candidates (no optimizer call).")
    merge_every: int = Field(3, ge=1, description="pareto: attempt a merge every this many rounds.")
    max_rounds: int | None = Field(
        None, ge=1, description="Rounds at most (pareto: one proposal each; beam: default beam_rounds)."
    )
    # Agent Lightning 0.3 beam search (names and defaults as there) -----------------------------------------
    beam_width: int = Field(4, ge=1, description="beam: candidates kept per round.")
    branch_factor: int = Field(4, ge=1, description="beam: children proposed per beam member per round.")
    beam_rounds: int = Field(3, ge=1, description="beam: rounds.")
    gradient_batch_size: int = Field(4, ge=1, description="beam: training tasks each beam member runs per round.")
    val_batch_size: int = Field(16, ge=1, description="beam: shared validation minibatch that ranks the candidates.")
    diversity_temperature: float = Field(1.0, ge=0, description="Sampling temperature of the rewrite calls.")
    rollout_batch_timeout: float = Field(
        3600.0, gt=0, description="Seconds to wait for a batch of rollouts; unfinished ones are cancelled, score 0."
    )
    run_initial_validation: bool = Field(
        True, description="beam: score the seed on the full validation set first (pareto always does)."
    )
    gradient_model: str | None = Field(None, description="Model of the critique calls (default: the optimizer's).")
    apply_edit_model: str | None = Field(None, description="Model of the rewrite calls (default: the optimizer's).")
    # Budgets ------------------------------------------------------------------------------------------------
    max_rollouts: int = Field(400, ge=1, description="Agent rollouts the search may run (cached ones are free).")
    max_optimizer_calls: int = Field(100, ge=2, description="Optimizer LLM calls (critique + rewrite = 2).")
    max_optimizer_tokens: int | None = Field(
        None, ge=1, description="Optimizer tokens (usage.total_tokens): no call starts once they are spent."
    )
    # Reflection ---------------------------------------------------------------------------------------------
    critique_prompt_file: Path | None = Field(None, description="Instructions of the critique call (Markdown).")
    edit_prompt_file: Path | None = Field(None, description="Instructions of the rewrite call (Markdown).")
    reflection_rollouts: int = Field(4, ge=1, description="Rollouts shown to the critique, failures first.")
    trace_chars: int = Field(3000, ge=200, description="Characters of one rollout's trace shown to the critique.")
    optimizer_max_tokens: int | None = Field(
        None, ge=1, description="max_tokens of each optimizer call (None: the endpoint's default)."
    )
    critique_temperature: float = Field(0.0, ge=0, description="Sampling temperature of the critique calls.")
    test_repeats: int = Field(
        1,
        ge=1,
        le=100,
        description="Rollouts per held-out test task for the seed and for the best (their mean is the score).",
    )
    # Rollouts -----------------------------------------------------------------------------------------------
    rollout_timeout: float | None = Field(600.0, gt=0, description="Seconds an attempt may run.")
    unresponsive_seconds: float | None = Field(
        120.0, gt=0, description="Seconds without a heartbeat after which an attempt counts as lost with its runner."
    )
    max_attempts: int = Field(
        2, ge=1, description="Attempts per rollout; only a lost attempt (unresponsive) is retried, a failure scores 0."
    )

    @model_validator(mode="after")
    def _files_exist(self) -> ApoConfig:
        for name in ("critique_prompt_file", "edit_prompt_file"):
            path = getattr(self, name)
            if path is not None and not Path(path).is_file():
                raise ValueError(f"{name}: no such file: {path}")
        return self

    def rounds(self) -> int | None:
        """Rounds at most: ``max_rounds``, else ``beam_rounds`` for beam, else unbounded (the budgets end it)."""
        if self.max_rounds is not None:
            return self.max_rounds
        return self.beam_rounds if self.search == "beam" else None

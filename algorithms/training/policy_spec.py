"""What every rank needs to build the same policy (:class:`PolicySpec`): shared by the training backends, so that
neither imports the other (``trainers`` opens ``deepspeed_trainer``, whose ranks rebuild the policy from this)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from algorithms.training.policy import TrainablePolicy


@dataclass(frozen=True)
class PolicySpec:
    """What every rank needs to build the same policy: the model, the optimizer's learning rate, PPO's value
    head, LoRA options, and the checkpoint a resumed run continues from."""

    model_dir: Path
    learning_rate: float
    value_head: bool = False
    lora: dict[str, Any] | None = None
    checkpoint: Path | None = None

    def build(self, *, reference: bool) -> TrainablePolicy:
        from algorithms.training.policy import TrainablePolicy

        return TrainablePolicy(
            self.model_dir,
            learning_rate=self.learning_rate,
            reference=reference,
            value_head=self.value_head,
            lora=self.lora,
            checkpoint=self.checkpoint,
        )

"""Training backends: where a policy update runs. ``torch`` updates the policy in this process; ``deepspeed``
spreads each update over several processes (:mod:`algorithms.training.deepspeed_trainer`). Either way the trainer's
``policy`` is the one the algorithm measures the batch with and the policy server is loaded from.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from lightning_store.settings import TrainerSettings

if TYPE_CHECKING:
    from algorithms.training.policy import TrainablePolicy
    from algorithms.training.update import UpdateJob


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


class Trainer(Protocol):
    """A training backend holding the policy being trained."""

    policy: TrainablePolicy

    def update(self, job: UpdateJob) -> dict[str, float]:
        """Run one policy update (:func:`algorithms.training.update.update`); the batch's metrics."""
        ...

    def save(self, directory: Path) -> None:
        """Write a checkpoint (weights that ``from_pretrained`` loads, and the optimizer state) to ``directory``."""
        ...

    def close(self) -> None:
        """Release the backend's processes (idempotent)."""
        ...


class LocalTrainer:
    """The policy and its optimizer in this process (the ``torch`` backend)."""

    def __init__(self, spec: PolicySpec, *, reference: bool) -> None:
        self.policy = spec.build(reference=reference)
        if spec.checkpoint is not None:
            self.policy.load_optimizer(spec.checkpoint)

    def update(self, job: UpdateJob) -> dict[str, float]:
        return job.run(self.policy)

    def save(self, directory: Path) -> None:
        self.policy.save(directory)

    def close(self) -> None:
        pass


def open_trainer(
    settings: TrainerSettings,
    spec: PolicySpec,
    *,
    reference: bool,
    micro_batch_size: int,
    max_grad_norm: float | None,
    log_dir: Path,
) -> Trainer:
    """The backend ``settings.trainer`` names, started; ``log_dir`` receives the logs of extra processes."""
    if settings.trainer == "deepspeed":
        from algorithms.training.deepspeed_trainer import DeepSpeedTrainer

        return DeepSpeedTrainer(
            spec,
            reference=reference,
            settings=settings,
            micro_batch_size=micro_batch_size,
            max_grad_norm=max_grad_norm,
            log_dir=log_dir,
        )
    return LocalTrainer(spec, reference=reference)

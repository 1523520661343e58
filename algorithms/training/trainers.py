"""Training backends: where a policy update runs. ``torch`` updates the policy in this process; ``deepspeed``
spreads each update over several processes (:mod:`algorithms.training.deepspeed_trainer`). Either way the trainer's
``policy`` is the one the algorithm measures the batch with and the policy server is loaded from.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from algorithms.training.policy_spec import PolicySpec
from lightning_store.settings import TrainerSettings

__all__ = ["LocalTrainer", "PolicySpec", "Trainer", "open_trainer"]

if TYPE_CHECKING:
    from algorithms.training.policy import TrainablePolicy
    from algorithms.training.update import UpdateJob


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

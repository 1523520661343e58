"""Checkpoints of a training run: ``OUTPUT/step-N`` directories that ``from_pretrained`` loads, the newest of
which a resumed run starts from (weights, value head, optimizer state; task sampling is replayed)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from algorithms.training.trainers import Trainer

PREFIX = "step-"


def saved_steps(output_dir: Path) -> list[int]:
    """Steps with a complete checkpoint (a ``config.json`` is written), ascending."""
    if not output_dir.exists():
        return []
    steps = []
    for child in output_dir.iterdir():
        if child.name.startswith(PREFIX) and child.name[len(PREFIX) :].isdigit() and (child / "config.json").exists():
            steps.append(int(child.name[len(PREFIX) :]))
    return sorted(steps)


def resume_point(output_dir: Path, resume: bool) -> tuple[int, Path | None]:
    """The step to start from and the checkpoint to continue: the newest when resuming, else step 0 and none."""
    steps = saved_steps(output_dir) if resume else []
    if not steps:
        return 0, None
    return steps[-1], output_dir / f"{PREFIX}{steps[-1]}"


def save(trainer: Trainer, output_dir: Path, step: int, keep: int) -> Path:
    """Save step ``step`` (to a temporary name first, so a crash never leaves a half checkpoint that looks
    complete) and delete all but the ``keep`` newest."""
    final = output_dir / f"{PREFIX}{step}"
    partial = output_dir / f".partial-{PREFIX}{step}"
    shutil.rmtree(partial, ignore_errors=True)
    trainer.save(partial)
    shutil.rmtree(final, ignore_errors=True)
    partial.rename(final)
    for old in saved_steps(output_dir)[:-keep]:
        shutil.rmtree(output_dir / f"{PREFIX}{old}", ignore_errors=True)
    return final

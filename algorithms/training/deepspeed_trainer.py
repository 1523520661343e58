"""DeepSpeed as the training backend: each policy update data-parallel over ``trainer_processes`` ranks.

Rank 0 is the trainer's own process. It keeps everything that happens once per step, as with one process:
it measures the batch (old and reference log-probs, values), computes the advantages, and the policy server
is loaded from its weights. Ranks 1…N−1 are subprocesses (``python -m algorithms.training.deepspeed_trainer``) that
hold a copy of the policy without the reference. For each update rank 0 broadcasts the job (transitions,
advantages, measured tensors, settings) and every rank runs :func:`algorithms.training.update.update` on its share of
each mini-batch under its DeepSpeed engine: gradients are averaged at each optimizer step, and with ZeRO
stages 1 and 2 the optimizer state (and with 2 the gradients) are partitioned over the ranks. After a step
the weights are the same on every rank. On CPU the ranks talk over gloo.

Checkpoints: rank 0 writes the weights (``from_pretrained`` loads them) and every rank writes its optimizer
partition into ``deepspeed/`` (``engine.save_checkpoint``); a resumed run with the same number of ranks
loads them back.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import subprocess
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from algorithms.local_stack import terminate
from algorithms.training.policy_spec import PolicySpec
from lightning_store.settings import TrainerSettings

if TYPE_CHECKING:
    from algorithms.training.policy import TrainablePolicy
    from algorithms.training.update import UpdateJob

CHECKPOINT_DIR = "deepspeed"
CHECKPOINT_TAG = "optimizer"


class TrainerFailed(RuntimeError):
    """A rank could not start or died; the message names its log."""


@contextmanager
def _quiet() -> Iterator[None]:
    """DeepSpeed's own deprecation warnings (torch.jit at import, torch.distributed's ``all_gather_into_tensor``
    in ZeRO): not ours to change."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning, module="deepspeed")
        warnings.filterwarnings("ignore", message=".*all_gather_into_tensor.*", category=FutureWarning)
        warnings.filterwarnings("ignore", message=".*torch.jit.*", category=DeprecationWarning)
        yield


def deepspeed_config(settings: TrainerSettings, micro_batch_size: int, max_grad_norm: float | None) -> dict[str, Any]:
    """The engine's configuration: the caller accumulates over as many micro-batches as a mini-batch has
    (``managed_gradient_accumulation`` off: each ``step()`` is a boundary), and clips at ``max_grad_norm``;
    the ``deepspeed_config`` file's options are laid over it."""
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "gradient_accumulation_steps": 1,
        "managed_gradient_accumulation": False,
        "gradient_clipping": max_grad_norm or 0.0,
        "zero_optimization": {"stage": settings.deepspeed_zero_stage},
        "zero_allow_untested_optimizer": True,  # the policy's torch AdamW
        "steps_per_print": 1 << 30,
    }
    if settings.deepspeed_config:
        config |= json.loads(Path(settings.deepspeed_config).read_text())
    return config


class DeepSpeedOptimization:
    """:class:`algorithms.training.optimization.Optimization` on one rank, through its DeepSpeed engine."""

    def __init__(self, engine: Any, rank: int, world: int) -> None:
        self.engine = engine
        self.rank = rank
        self.world = world

    def backward(self, loss: torch.Tensor) -> None:
        with _quiet():
            self.engine.backward(loss, scale_wrt_gas=False)

    def step(self) -> float:
        with _quiet():
            self.engine.step()
        norm = self.engine.get_global_grad_norm()
        return float(norm) if norm is not None else 0.0

    def reduce(self, totals: dict[str, float]) -> dict[str, float]:
        summed = torch.tensor(list(totals.values()), dtype=torch.float64)
        dist.all_reduce(summed)
        return dict(zip(totals, summed.tolist(), strict=True))


class _Rank:
    """One rank's policy, engine and job handling (the same code on rank 0 and on the workers)."""

    def __init__(self, spec: PolicySpec, config: dict[str, Any], *, reference: bool) -> None:
        with _quiet():
            import deepspeed

        self.policy = spec.build(reference=reference)
        modules = {"model": self.policy.model}
        if self.policy.value_head is not None:
            modules["value_head"] = self.policy.value_head
        with _quiet():
            # The engine starts from rank 0's weights (it broadcasts them), so LoRA's random init agrees too.
            self.engine, *_ = deepspeed.initialize(
                model=torch.nn.ModuleDict(modules), optimizer=self.policy.optimizer, config=config
            )
        self.optimization = DeepSpeedOptimization(self.engine, dist.get_rank(), dist.get_world_size())
        if spec.checkpoint is not None and (spec.checkpoint / CHECKPOINT_DIR).exists():
            saved = len(list((spec.checkpoint / CHECKPOINT_DIR).rglob("zero_pp_rank_*_optim_states.pt")))
            if saved != self.optimization.world:
                raise TrainerFailed(
                    f"{spec.checkpoint} holds the optimizer state of {saved} ranks; resume it with as many"
                    f" (trainer_processes), or move {CHECKPOINT_DIR}/ away to start the optimizer afresh"
                )
            with _quiet():
                self.engine.load_checkpoint(
                    str(spec.checkpoint / CHECKPOINT_DIR), tag=CHECKPOINT_TAG, load_lr_scheduler_states=False
                )

    def run(self, job: tuple[Any, ...]) -> dict[str, float] | None:
        """Run a job rank 0 broadcast: ``("update", UpdateJob)`` or ``("save", directory)``."""
        if job[0] == "update":
            result: dict[str, float] = job[1].run(self.policy, self.optimization)
            return result
        if job[0] == "save":
            with _quiet():
                self.engine.save_checkpoint(str(Path(job[1]) / CHECKPOINT_DIR), tag=CHECKPOINT_TAG, save_latest=False)
            return None
        raise ValueError(f"unknown job {job[0]!r}")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _join(port: int, rank: int, world: int, timeout: float) -> None:
    """Join the ranks' process group (gloo; rank 0 hosts the rendezvous) and tell DeepSpeed about it."""
    with _quiet():
        import deepspeed

    os.environ["LOCAL_RANK"] = str(rank)  # DeepSpeed's engine insists on it; one machine, so local = global
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=timeout),
    )
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)


def _leave() -> None:
    """Destroy the process group through DeepSpeed, which also drops the groups it cached (a later trainer in
    this process builds a new one)."""
    import deepspeed.comm

    deepspeed.comm.destroy_process_group()


class DeepSpeedTrainer:
    """The ``deepspeed`` training backend (:class:`algorithms.training.trainers.Trainer`): rank 0 here, the other
    ranks started as subprocesses (their logs in ``log_dir/deepspeed-rank-N.log``)."""

    def __init__(
        self,
        spec: PolicySpec,
        *,
        reference: bool,
        settings: TrainerSettings,
        micro_batch_size: int,
        max_grad_norm: float | None,
        log_dir: Path,
    ) -> None:
        if dist.is_initialized():
            raise TrainerFailed("a torch.distributed process group is already running in this process")
        self.world = settings.trainer_processes
        config = deepspeed_config(settings, micro_batch_size, max_grad_norm)
        port = _free_port()
        log_dir.mkdir(parents=True, exist_ok=True)
        self.logs = [log_dir / f"deepspeed-rank-{rank}.log" for rank in range(1, self.world)]
        worker = {"spec": _spec_json(spec), "config": config, "port": port, "world": self.world}
        worker["timeout"] = settings.trainer_timeout
        threads = str(max(1, (os.cpu_count() or 1) // self.world))
        self.processes: list[subprocess.Popen[bytes]] = []
        for rank, log in enumerate(self.logs, start=1):
            env = os.environ | {"OMP_NUM_THREADS": threads, "LIGHTNING_STORE_DEEPSPEED_RANK": str(rank)}
            with log.open("wb") as out:
                command = [sys.executable, "-m", "algorithms.training.deepspeed_trainer", json.dumps(worker)]
                self.processes.append(subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env))
        self._open = True
        self._idle = False  # until every rank has started
        try:
            _join(port, 0, self.world, settings.trainer_timeout)
            self._rank = _Rank(spec, config, reference=reference)
            self._idle = True
        except BaseException as error:
            self.close()
            raise TrainerFailed(f"the DeepSpeed ranks did not start: {error}; see {self.logs}") from error
        self.policy: TrainablePolicy = self._rank.policy

    def update(self, job: UpdateJob) -> dict[str, float]:
        metrics = self._everywhere(("update", job))
        assert metrics is not None
        return metrics

    def save(self, directory: Path) -> None:
        self.policy.save(directory, optimizer=False)
        self._everywhere(("save", str(directory)))

    def close(self) -> None:
        """Stop the ranks: told to, when they are waiting for a job; terminated, when a job broke off (a rank
        still inside a collective would not hear the order)."""
        if not self._open:
            return
        self._open = False
        if self._idle and dist.is_initialized() and all(p.poll() is None for p in self.processes):
            dist.broadcast_object_list([("stop",)], src=0)
        for process in self.processes:
            try:
                process.wait(timeout=30 if self._idle else 0)
            except subprocess.TimeoutExpired:
                terminate(process)
        if dist.is_initialized():
            _leave()

    def _everywhere(self, job: tuple[Any, ...]) -> dict[str, float] | None:
        """Broadcast ``job`` and run it here too (a collective: every rank runs it in step)."""
        dead = [(rank, p.returncode) for rank, p in enumerate(self.processes, start=1) if p.poll() is not None]
        if dead:
            rank, code = dead[0]
            raise TrainerFailed(f"DeepSpeed rank {rank} exited with {code}; see {self.logs[rank - 1]}")
        self._idle = False
        dist.broadcast_object_list([job], src=0)
        result = self._rank.run(job)
        self._idle = True
        return result


def _spec_json(spec: PolicySpec) -> dict[str, Any]:
    return {k: str(v) if isinstance(v, Path) else v for k, v in asdict(spec).items()}


def _spec_from_json(fields: dict[str, Any]) -> PolicySpec:
    paths = {k: Path(fields[k]) for k in ("model_dir", "checkpoint") if fields[k] is not None}
    return PolicySpec(**(fields | paths))


def _worker(arguments: dict[str, Any]) -> None:
    """A rank ≥ 1: join, build the same policy, then run rank 0's jobs until told to stop."""
    spec = _spec_from_json(arguments["spec"])
    rank = int(os.environ["LIGHTNING_STORE_DEEPSPEED_RANK"])
    _join(arguments["port"], rank, arguments["world"], arguments["timeout"])
    state = _Rank(spec, arguments["config"], reference=False)
    while True:
        received: list[Any] = [None]
        dist.broadcast_object_list(received, src=0)
        job = received[0]
        if job[0] == "stop":
            break
        state.run(job)
    _leave()


if __name__ == "__main__":
    _worker(json.loads(sys.argv[1]))

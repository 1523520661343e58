"""A policy server in the trainer's process: the trainer hands it new weights in memory after each update.

It runs :class:`PolicyServer` under uvicorn in a background thread on ``host`` (127.0.0.1 unless the store servers
run on other machines), so the runners' agents reach it over HTTP (through the store's LLM proxy) exactly as they
would reach vLLM, while a weight swap costs a ``load_state_dict`` instead of a checkpoint round trip.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import uvicorn

from algorithms.local_stack import free_port, url_host
from algorithms.serving.policy_server import PolicyServer
from lightning_store.resources import LLM


class LocalPolicy:
    """Serves ``model_dir`` as ``model_name``; ``start()`` returns once it answers. Implements
    ``algorithms.session.ServedPolicy``."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        model_name: str = "policy",
        port: int | None = None,
        max_batch_size: int = 64,
        decode_threads: int | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        self.server = PolicyServer(
            model_dir, model_name=model_name, max_batch_size=max_batch_size, decode_threads=decode_threads
        )
        self.host = host
        self.port = port or free_port(host)
        self._uvicorn = uvicorn.Server(
            uvicorn.Config(self.server.app(), host=host, port=self.port, log_level="warning")
        )
        self._thread = threading.Thread(target=self._uvicorn.run, name="policy-server", daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://{url_host(self.host)}:{self.port}/v1"

    def start(self, timeout: float = 30.0) -> LocalPolicy:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._uvicorn.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"the policy server did not start on port {self.port}")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        self._uvicorn.should_exit = True
        self._thread.join(timeout=10)

    def llm(self) -> LLM:
        return LLM(endpoint=self.base_url, model=self.server.model_name, sampling_parameters={"temperature": 1.0})

    def load_state(self, state: Mapping[str, Any], version: int) -> None:
        self.server.load_state(state, version)

    def __enter__(self) -> LocalPolicy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

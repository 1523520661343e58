"""``store policy serve``: a policy model served on its own, as an OpenAI-compatible endpoint that returns token
ids (added to the ``store`` CLI through the ``lightning_store.commands`` entry points).

The engines are those of ``store train`` (same settings, :class:`~lightning_store.settings.PolicyServerSettings`):
the built-in transformers server (:mod:`algorithms.serving.policy_server`, CPU or GPU) or vLLM from its own
virtualenv (:mod:`algorithms.serving.vllm`). The command prints the base URL once the server answers, and stops
cleanly (exit status 0) on SIGINT or SIGTERM. ``python -m algorithms.serving.policy_cli`` runs the same command.

This module imports without torch (what needs it is imported inside the command), so that a plain install can
list the ``store`` commands and say which extra this one needs (:mod:`algorithms.extras`).
"""

from __future__ import annotations

import contextlib
import shlex
import signal
import socket
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from pydantic import ValidationError

from algorithms.extras import needs_train_extra
from algorithms.local_stack import url_host
from lightning_store import aio
from lightning_store.settings import PolicyServerSettings, load_policy_server_settings

HELP = "\n\n".join(
    [
        "Serve a policy model as an OpenAI-compatible endpoint (/v1/chat/completions, /v1/completions, /v1/models) "
        "that returns token ids (prompt_token_ids, choices[0].token_ids) and logprobs, as vLLM does with "
        "return_token_ids. Engines: transformers (built in; CPU or GPU) or vllm (from its own virtualenv).",
        'Prints `serving MODEL_DIR at http://HOST:PORT/v1 (model name "NAME")` once it answers; SIGINT or SIGTERM '
        "stops it. Use it as the store's LLM with `store resources set-llm http://HOST:PORT/v1 --model NAME`, or as "
        "the proxy's fallback with `store serve --llm-upstream http://HOST:PORT/v1 --llm-model NAME`.",
        "Needs the train extra (torch, transformers); vllm also needs a virtualenv with vLLM.",
    ]
)
STOP_SECONDS = 10.0
"""How long a stopping transformers server lets the requests in flight finish."""

policy = needs_train_extra(typer.Typer(help="Policy models: serve one on its own.", no_args_is_help=True))


class ServeFailed(Exception):
    """The server cannot start; the message is one line saying why."""


def serve(
    model_dir: Annotated[
        Path,
        typer.Argument(metavar="MODEL_DIR", help="The model directory (transformers format: config.json, weights)."),
    ],
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port (0: any free one, printed on start).")] = 8000,
    model_name: Annotated[
        str | None,
        typer.Option(help="The name calls use for the model ('model' in a request); default: MODEL_DIR's name."),
    ] = None,
    engine: Annotated[
        str | None,
        typer.Option(
            help="transformers (built in, the default) or vllm; env LIGHTNING_STORE_POLICY_SERVER.",
            show_default=False,
        ),
    ] = None,
    vllm_python: Annotated[
        str | None, typer.Option(help="With vllm: the Python of its virtualenv; env LIGHTNING_STORE_VLLM_PYTHON.")
    ] = None,
    vllm_args: Annotated[
        str | None,
        typer.Option(help="With vllm: extra arguments of its server, quoted as one; env LIGHTNING_STORE_VLLM_ARGS."),
    ] = None,
    decode_threads: Annotated[
        int | None,
        typer.Option(min=1, help="With transformers: intra-op threads to decode with; default: every core."),
    ] = None,
) -> None:
    """Serve ``model_dir`` until SIGINT or SIGTERM (the command's help is :data:`HELP`)."""
    try:
        settings = load_policy_server_settings(
            policy_server=engine, vllm_python=vllm_python, vllm_args=vllm_args, decode_threads=decode_threads
        )
    except ValidationError as error:
        _fail(f"--engine is transformers or vllm ({error.errors()[0]['msg']})")
    if not (model_dir / "config.json").is_file():
        what = "does not exist" if not model_dir.exists() else "is not a model directory (no config.json)"
        _fail(f"{model_dir} {what}")
    if settings.policy_server == "vllm" and not settings.vllm_python:
        _fail(
            "--engine vllm needs the Python of vLLM's virtualenv: --vllm-python PATH (or LIGHTNING_STORE_VLLM_PYTHON)"
        )
    name = model_name or model_dir.resolve().name
    try:
        with _served(settings, model_dir, name, host, port) as (base_url, alive):
            stop = _stop_on_signals()  # before the line that tells a caller it may stop us
            aio.freeze_startup_heap()  # the model is loaded; also keeps the exit short (torch's modules stay put)
            typer.echo(f'serving {model_dir} at {base_url} (model name "{name}")')
            typer.echo(
                f"use it: store resources set-llm {base_url} --model {name}  "
                f"(or store serve --llm-upstream {base_url} --llm-model {name}); Ctrl-C stops it"
            )
            sys.stdout.flush()
            while not stop.wait(0.5):
                if not alive():
                    raise ServeFailed("the server stopped on its own (see the lines above)")
            typer.echo("stopping", err=True)
    except ServeFailed as error:
        _fail(str(error), code=1)


@contextlib.contextmanager
def _served(
    settings: PolicyServerSettings, model_dir: Path, name: str, host: str, port: int
) -> Iterator[tuple[str, Callable[[], bool]]]:
    """The engine the settings name, serving ``model_dir`` as ``name``; yields its base URL (``…/v1``) and a
    function that says whether it is still up."""
    if settings.policy_server == "vllm":
        with _vllm(settings, model_dir, name, host, port) as served:
            yield served
        return
    listening = _listen(host, port)  # before loading the model: a port in use fails at once
    with _transformers(settings, model_dir, name, listening) as served:
        yield served


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        raise ServeFailed(f"cannot listen on {host}:{port}: {error.strerror or error}") from None
    return sock


@contextlib.contextmanager
def _transformers(
    settings: PolicyServerSettings, model_dir: Path, name: str, listening: socket.socket
) -> Iterator[tuple[str, Callable[[], bool]]]:
    """The built-in server under uvicorn in a thread (the main thread waits for the signals), on ``listening``."""
    import uvicorn

    from algorithms.progress import quiet_transformers
    from algorithms.serving.policy_server import PolicyServer
    from lightning_store.logs import LogLevel

    quiet_transformers(LogLevel.info)  # no "Loading weights" bar between the command's lines
    with listening:
        try:
            server = PolicyServer(model_dir, model_name=name, decode_threads=settings.decode_threads)
        except Exception as error:  # a model transformers cannot load: say so in one line
            reason = " ".join(str(error).split())  # one line, however many the library wrote
            raise ServeFailed(f"cannot load the model in {model_dir}: {type(error).__name__}: {reason}") from None
        config = uvicorn.Config(
            server.app(), log_level="warning", timeout_graceful_shutdown=int(STOP_SECONDS), lifespan="off"
        )
        running = uvicorn.Server(config)
        thread = threading.Thread(
            target=running.run, kwargs={"sockets": [listening]}, name="policy-server", daemon=True
        )
        thread.start()
        while not running.started:
            if not thread.is_alive():
                raise ServeFailed("the policy server stopped while starting (see the lines above)")
            thread.join(0.05)
        try:
            yield _base_url(listening), thread.is_alive
        finally:
            running.should_exit = True
            thread.join(STOP_SECONDS + 5)


@contextlib.contextmanager
def _vllm(
    settings: PolicyServerSettings, model_dir: Path, name: str, host: str, port: int
) -> Iterator[tuple[str, Callable[[], bool]]]:
    """vLLM in its own virtualenv, logging to a file whose path is printed."""
    from algorithms.serving.vllm import VllmFailed, VllmPolicy

    assert settings.vllm_python is not None
    work_dir = Path(tempfile.mkdtemp(prefix="store-policy-vllm-"))
    vllm = VllmPolicy(
        model_dir,
        python=settings.vllm_python,
        work_dir=work_dir,
        model_name=name,
        host=host,
        port=port or None,
        swap="restart",  # never used: a model served on its own is not swapped
        extra_args=shlex.split(settings.vllm_args),
    )
    typer.echo(f"starting vLLM (its log: {vllm.log})", err=True)
    # Starting takes minutes: a SIGTERM meanwhile interrupts like Ctrl-C, so that vLLM is stopped, not orphaned.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        vllm.start()
    except VllmFailed as error:
        raise ServeFailed(str(error).splitlines()[0] + f" (its log: {vllm.log})") from None
    except BaseException:
        vllm.stop()
        raise
    try:
        yield f"http://{url_host(host)}:{vllm.port}/v1", vllm.running
    finally:
        vllm.stop()


def _stop_on_signals() -> threading.Event:
    """An event that SIGINT or SIGTERM sets (from now on)."""
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    return stop


def _base_url(listening: socket.socket) -> str:
    host, port = listening.getsockname()[:2]
    return f"http://{url_host(host)}:{port}/v1"


def _fail(line: str, code: int = 2) -> NoReturn:
    """One line on stderr, then exit ``code``."""
    typer.echo(f"cannot serve the policy: {line}", err=True)
    raise typer.Exit(code)


policy.command("serve", help=HELP)(serve)


def main() -> None:
    """``python -m algorithms.serving.policy_cli``: ``store policy serve`` as a program of its own."""
    app = typer.Typer(add_completion=False)
    app.command(help=HELP)(serve)
    app(prog_name="python -m algorithms.serving.policy_cli")


if __name__ == "__main__":
    main()

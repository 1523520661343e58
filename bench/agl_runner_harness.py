# mypy: ignore-errors
"""Agent Lightning's side of ``bench/runner_throughput.py``: the same two agents on agentlightning's own runner.

Run with an interpreter that has ``agentlightning`` (0.3.0), never with the project's: this file imports only the
standard library at the top and agentlightning lazily, which is why mypy skips it (agentlightning is never a
dependency of the project) and why it does not import ``lightning_store``. Nor can it import ``bench/harness.py``, which
needs the project: its process helpers (``free_port``, ``stop``, ``child``, ``wait_http``) are that module's, written
again, and its agents are ``bench/runner_agents.py``'s, written against Agent Lightning's API.

For each agent and runner count it starts a fresh ``agl store`` (the in-memory store behind Agent Lightning's
HTTP server, the same command line as ``bench/server_ops.py``) and a fresh runner fleet, driven through the
public API the way a deployment with a separate store runs its runners (``AGL_CURRENT_ROLE=runner``)::

    Trainer(strategy=ClientServerExecutionStrategy(role="runner", n_runners=N, ...),
            runner=LitAgentRunner(tracer=AgentOpsTracer(), poll_interval=...)).fit(agent)

that is, N runner processes (one process, the main one, when N is 1), each with one ``LitAgentRunner`` pulling
rollouts from the store through ``LightningStoreClient``, traced by the Trainer's default ``AgentOpsTracer``
(``--tracer otel``: the plain ``OtelTracer``). The agents are ``@rollout`` functions:

* ``noop``      returns the reward 1.0 at once;
* ``six_calls`` makes six sequential chat calls with the OpenAI SDK, then returns 1.0. With ``--llm proxy`` (the
  default) the calls go through Agent Lightning's ``LLMProxy`` (LiteLLM, in its own process, started here as an
  algorithm would start it: bound to the store, published as a ``ProxyLLM`` resource, which ``@rollout`` turns
  into a per-attempt endpoint), so each call is recorded in the store, as our proxy records it (LiteLLM's
  tracing writes about 11 spans per call). The runner itself starts no proxy. With ``--llm direct`` the agent
  calls the upstream directly.

The LLM upstream is ``bench/echo_upstream.py`` (started here unless ``--upstream`` names one), which answers at
once. Once every runner has registered with the store (its first, empty, dequeue), ROLLOUTS rollouts are
enqueued in one call and timed until the last one has finished, as for ours. The JSON rows also give the spans
stored per rollout (mean of the first few, read after the timing).

Runners poll: a runner that finds the queue empty sleeps ``poll_interval`` (Agent Lightning's default 5 s,
jitter 0.5 s) before asking again, where ours long-polls. With the default every cell would mostly measure the
first sleep, so the default here is ``--poll-interval 0.1`` (jitter half of it).

    /tmp/aglvenv/bin/python bench/agl_runner_harness.py --rollouts 40 --workers 1,4 --json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # agentlightning imports litellm, which else stalls

HERE = Path(__file__).resolve()
CALLS = 6
MODEL = "echo"
STARTUP_SECONDS = 120.0
AGENTS = ("noop", "six_calls")
SAMPLE = 5


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# The agents ----------------------------------------------------------------------------------------------------


def make_agent(name: str) -> Any:
    """The ``@rollout`` agent called ``name`` (Agent Lightning requires the ``task`` and ``llm`` parameters)."""
    from agentlightning import rollout
    from openai import AsyncOpenAI

    async def noop(task: Any, llm: Any) -> float:
        return 1.0

    async def six_calls(task: Any, llm: Any) -> float:
        async with AsyncOpenAI(base_url=llm.endpoint, api_key=llm.api_key or "unused", max_retries=0) as client:
            messages: list[Any] = [{"role": "user", "content": "Plan a trip to Paris."}]
            for _ in range(CALLS):
                completion = await client.chat.completions.create(model=llm.model, messages=messages, max_tokens=8)
                messages += [{"role": "assistant", "content": completion.choices[0].message.content or ""}]
                messages += [{"role": "user", "content": "And then?"}]
        return 1.0

    return rollout({"noop": noop, "six_calls": six_calls}[name])


# The runner fleet (``runners`` subcommand, its own process) ----------------------------------------------------


def run_runners(args: argparse.Namespace) -> None:
    """N ``LitAgentRunner`` s against the store at ``args.store`` until this process group is terminated."""
    from agentlightning import Trainer
    from agentlightning.execution.client_server import ClientServerExecutionStrategy
    from agentlightning.runner import LitAgentRunner
    from agentlightning.tracer import AgentOpsTracer, OtelTracer

    logging.basicConfig(level=logging.WARNING)
    url = urlsplit(args.store)
    tracer = AgentOpsTracer() if args.tracer == "agentops" else OtelTracer()
    runner = LitAgentRunner(tracer=tracer, poll_interval=args.poll_interval, interval_jitter=args.poll_interval / 2)
    strategy = ClientServerExecutionStrategy(
        role="runner", server_host=url.hostname, server_port=url.port, n_runners=args.workers
    )
    trainer = Trainer(n_runners=args.workers, strategy=strategy, runner=runner, tracer=tracer)
    trainer.fit(make_agent(args.agent))


# Processes -----------------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""


def stop(process: subprocess.Popen) -> None:
    """SIGTERM to the process group it leads (runner processes, the server's children), SIGKILL if it lingers."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=20)


def otlp_env(store: str) -> dict[str, str]:
    """The environment with the store's OTLP endpoint as the default one for trace exporters.

    agentlightning 0.3.0 points its OTLP exporters (the runner's tracer, the LLM proxy's) at the store by setting
    ``OTLPSpanExporter._endpoint`` after construction; opentelemetry-exporter-otlp-proto-http >= 1.39 reads the
    endpoint only in the constructor, so the spans would go to localhost:4318 (nothing there, retried for
    seconds). Every span carries its rollout and attempt in resource attributes, so naming the one store endpoint
    as the default restores what Agent Lightning intends.
    """
    return os.environ | {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{store}/v1/traces"}


@contextlib.contextmanager
def child(argv: list[str], log_file: Path, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen]:
    with log_file.open("wb") as sink:
        process = subprocess.Popen(
            argv, stdout=sink, stderr=subprocess.STDOUT, cwd=log_file.parent, env=env, start_new_session=True
        )
    try:
        yield process
    finally:
        stop(process)


def wait_http(url: str, process: subprocess.Popen, log_file: Path) -> None:
    import httpx

    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{url} exited with {process.returncode}:\n{tail(log_file)}")
        with contextlib.suppress(httpx.HTTPError):
            httpx.get(url, timeout=2)
            return
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer in {STARTUP_SECONDS:.0f}s:\n{tail(log_file)}")


@contextlib.contextmanager
def agl_store(directory: Path) -> Iterator[str]:
    """``agl store`` (in memory) on a free port, as ``bench/server_ops.py`` starts it; yields its root URL."""
    port = free_port()
    log_file = directory / f"agl-store-{port}.log"
    launcher = "import sys; from agentlightning.cli import main; sys.argv[0] = 'agl'; sys.exit(main())"
    argv = [sys.executable, "-c", launcher, "store", "--host", "127.0.0.1", "--port", str(port)]
    with child(argv, log_file) as process:
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/v1/agl/health", process, log_file)
        yield url


@contextlib.contextmanager
def echo_upstream(directory: Path) -> Iterator[str]:
    port = free_port()
    log_file = directory / "echo.log"
    with child([sys.executable, str(HERE.with_name("echo_upstream.py")), str(port)], log_file) as process:
        wait_http(f"http://127.0.0.1:{port}/", process, log_file)
        yield f"http://127.0.0.1:{port}/v1"


@contextlib.contextmanager
def runners(store: str, agent: str, workers: int, args: argparse.Namespace, directory: Path) -> Iterator[None]:
    argv = [sys.executable, str(HERE), "runners", "--store", store, "--agent", agent, "--workers", str(workers)]
    argv += ["--poll-interval", str(args.poll_interval), "--tracer", args.tracer]
    with child(argv, directory / f"runners-{agent}-{workers}.log", env=otlp_env(store)):
        yield


# The measurement -----------------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def llm_resource(store: Any, store_url: str, upstream: str, use_proxy: bool, directory: Path) -> Any:
    """The ``main_llm`` resource: the upstream itself, or Agent Lightning's LLMProxy in front of it."""
    from agentlightning import LLM

    if not use_proxy:
        yield LLM(endpoint=upstream, model=MODEL)
        return
    from agentlightning.llm_proxy import LLMProxy

    model_list = [{"model_name": MODEL, "litellm_params": {"model": f"hosted_vllm/{MODEL}", "api_base": upstream}}]
    # Today's LiteLLM (1.106) refuses to start its proxy without a master key, which agentlightning 0.3.0 does not
    # set: allow that (as older LiteLLM did) rather than add an authentication check Agent Lightning never made.
    settings = {"general_settings": {"dangerously_permit_weak_or_unset_master_key": True}}
    proxy = LLMProxy(
        port=free_port(),
        host="127.0.0.1",
        model_list=model_list,
        store=store,
        launch_mode="mp",
        litellm_config=settings,
    )
    # The proxy's process is forked in start(): it inherits the OTLP endpoint and, as its stdout and stderr
    # (LiteLLM prints a banner), the log file.
    saved_env = dict(os.environ)
    os.environ.update(otlp_env(store_url))
    sys.stdout.flush()
    sys.stderr.flush()
    saved_fds = os.dup(1), os.dup(2)
    with (directory / "llm-proxy.log").open("ab") as sink:
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        try:
            await proxy.start()
        finally:
            os.dup2(saved_fds[0], 1)
            os.dup2(saved_fds[1], 2)
            for fd in saved_fds:
                os.close(fd)
            os.environ.clear()
            os.environ.update(saved_env)
    try:
        yield proxy.as_resource()  # a ProxyLLM: @rollout hands the agent /rollout/{id}/attempt/{id} of the proxy
    finally:
        await proxy.stop()


async def measure(
    store_url: str, upstream: str, agent: str, workers: int, args: argparse.Namespace, directory: Path
) -> tuple[float, dict[str, Any]]:
    """Rollouts per second once ``workers`` runners are up, and (untimed) what the first rollouts recorded."""
    from agentlightning import EnqueueRolloutRequest
    from agentlightning.store.client_server import LightningStoreClient

    store = LightningStoreClient(store_url)
    try:
        use_proxy = agent == "six_calls" and args.llm == "proxy"
        async with llm_resource(store, store_url, upstream, use_proxy, directory) as llm:
            await store.add_resources({"main_llm": llm})
            for _ in range(int(STARTUP_SECONDS * 10)):
                if len(await store.query_workers()) >= workers:
                    break
                await asyncio.sleep(0.1)
            else:
                raise RuntimeError("the runners did not register")
            started = time.perf_counter()
            enqueued = await store.enqueue_many_rollouts(
                [EnqueueRolloutRequest(input={"i": i}) for i in range(args.rollouts)]
            )
            ids = [r.rollout_id for r in enqueued]
            pending = set(ids)
            while pending:
                # Agent Lightning's client refuses waits over 0.1 s; the server answers as soon as all are done.
                done = await store.wait_for_rollouts(rollout_ids=sorted(pending), timeout=0.1)
                pending -= {r.rollout_id for r in done if r.status in ("succeeded", "failed", "cancelled")}
            elapsed = time.perf_counter() - started
            statuses = {r.status for r in await store.query_rollouts(rollout_id_in=ids)}
            if statuses != {"succeeded"}:
                raise RuntimeError(f"rollouts ended {statuses}")
            await asyncio.sleep(1.0)  # the proxy exports its spans after answering
            return args.rollouts / elapsed, await recorded(store, ids[:SAMPLE])
    finally:
        await store.close()


async def recorded(store: Any, rollout_ids: list[str]) -> dict[str, Any]:
    """Spans per rollout (mean over ``rollout_ids``) and their names, for the report."""
    counts: list[int] = []
    names: set[str] = set()
    for rollout_id in rollout_ids:
        spans = await store.query_spans(rollout_id)
        counts.append(len(spans))
        names |= {span.name for span in spans}
    return {"spans_per_rollout": round(sum(counts) / max(len(counts), 1), 1), "span_names": sorted(names)}


def run_cells(args: argparse.Namespace) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="ls_bench_agl_runner_") as tmp:
        directory = Path(tmp)
        with contextlib.ExitStack() as stack:
            upstream = args.upstream or stack.enter_context(echo_upstream(directory))
            for agent in args.agents:
                for workers in args.workers:
                    with agl_store(directory) as store, runners(store, agent, workers, args, directory):
                        try:
                            rate, spans = asyncio.run(measure(store, upstream, agent, workers, args, directory))
                        except Exception as error:
                            log(tail(directory / f"runners-{agent}-{workers}.log"))
                            raise RuntimeError(f"agl {agent} x{workers} failed") from error
                    llm = None if agent == "noop" else args.llm
                    log(f"[agl memory] {agent} x{workers}: {rate:.1f} rollouts/s" + (f" (LLM {llm})" if llm else ""))
                    results.append(
                        {
                            "system": "agl",
                            "backend": "memory",
                            "agent": agent,
                            "workers": workers,
                            "rollouts_per_s": round(rate, 2),
                            "llm": llm,
                            "tracer": args.tracer,
                            "poll_interval": args.poll_interval,
                            **spans,
                        }
                    )
    return results


# Command line --------------------------------------------------------------------------------------------------


def counts(value: str) -> list[int]:
    numbers = [int(part) for part in value.split(",") if part.strip()]
    if not numbers or min(numbers) < 1:
        raise argparse.ArgumentTypeError(f"worker counts must be positive integers, not {value!r}")
    return numbers


def agent_list(value: str) -> list[str]:
    names = [name.strip() for name in value.split(",") if name.strip()]
    if not names or set(names) - set(AGENTS):
        raise argparse.ArgumentTypeError(f"agents are {', '.join(AGENTS)}, not {value!r}")
    return names


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--poll-interval", type=float, default=0.1, help="runner poll interval when the queue is empty")
    common.add_argument(
        "--tracer", choices=("agentops", "otel"), default="agentops", help="agentops: Trainer's default"
    )
    if argv[:1] == ["runners"]:
        parser = argparse.ArgumentParser(prog="agl_runner_harness.py runners", parents=[common])
        parser.add_argument("--store", required=True)
        parser.add_argument("--agent", choices=AGENTS, required=True)
        parser.add_argument("--workers", type=int, required=True)
        run_runners(parser.parse_args(argv[1:]))
        return
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], parents=[common], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rollouts", type=int, default=200)
    parser.add_argument("--workers", type=counts, default=[1, 4, 16])
    parser.add_argument("--agents", type=agent_list, default=list(AGENTS))
    parser.add_argument(
        "--llm", choices=("proxy", "direct"), default="proxy", help="six_calls: through LLMProxy or not"
    )
    parser.add_argument("--upstream", default=None, help="OpenAI-compatible base URL [default: start echo_upstream]")
    parser.add_argument("--json", action="store_true", help="print the results as JSON (one document)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("agentlightning").setLevel(logging.ERROR)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))  # stop the children on the way out
    results = run_cells(args)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for row in results:
            print(f"agl memory  {row['agent']:<10} x{row['workers']:<3} {row['rollouts_per_s']:8.1f} rollouts/s")


if __name__ == "__main__":
    main()

"""The Python API (``algorithms.Trainer``) as a notebook and a script use it: examples/train_in_a_notebook.ipynb
executed end to end in a real Jupyter kernel (nbclient), a kernel interrupt and a Ctrl-C in a script each stop every
process the run started, and APO through the same call.

Real parts throughout: ``store serve`` on SQLite and ``store run`` as subprocesses, the built-in policy server on the
tutorial's tiny model, an IPython kernel. The stand-in of ``tests.scripted_optimizer`` (for the hosted LLM APO's
optimizer and agents would call) is the only one.
"""

from __future__ import annotations

import ast
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests import apo_agents as agents
from tests.acceptance.test_apo import latest_template, runs, sql, stack, write_tasks
from tests.scripted_optimizer import OPTIMIZER_MODEL, create_app

pytestmark = pytest.mark.slow
nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).parents[2]
NOTEBOOK = ROOT / "examples" / "train_in_a_notebook.ipynb"


def processes_under(directory: Path) -> list[psutil.Process]:
    """The processes whose command line names ``directory`` (the run's store serve, on its database there)."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        if str(directory) in " ".join(process.info["cmdline"] or []):
            found.append(process)
    return found


def wait_for(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {timeout} s"
        time.sleep(0.2)


def text_of(cell: Any) -> str:
    """Everything a cell showed: streams, results and displays, as plain text."""
    parts = []
    for output in cell.outputs:
        if output.output_type == "stream":
            parts.append(output.text)
        elif "data" in output:
            parts.append(output.data.get("text/plain", ""))
    return "\n".join(parts)


def with_parameters(notebook: Any, **values: Any) -> Any:
    """``notebook`` with a cell assigning ``values`` after its ``parameters`` cell (what papermill does)."""
    [index] = [i for i, cell in enumerate(notebook.cells) if "parameters" in cell.metadata.get("tags", [])]
    assignments = "\n".join(f"{name} = {value!r}" for name, value in values.items())
    injected = nbformat.v4.new_code_cell(assignments, metadata={"tags": ["injected-parameters"]})
    notebook.cells.insert(index + 1, injected)
    return notebook


def test_the_notebook_trains_end_to_end_in_a_kernel(tmp_path: Path) -> None:
    notebook = with_parameters(nbformat.read(NOTEBOOK, as_version=4), steps=3)
    client = nbclient.NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()  # raises CellExecutionError, with the cell and its traceback, if any cell fails

    cells = {cell.source.splitlines()[0]: cell for cell in notebook.cells if cell.cell_type == "code"}
    run = tmp_path / "notebook-run" / "run"
    # The fit cell: the line updated in place ended on the finished bar, then the summary block.
    fit = next(cell for first, cell in cells.items() if first.startswith("from algorithms import"))
    shown = text_of(fit)
    assert "done" in shown and "[########################] 3/3" in shown, shown
    assert "grpo: 3 steps in" in shown and "val_reward" in shown and "checkpoint" in shown, shown
    assert not [o for o in fit.outputs if o.output_type == "stream" and o.name == "stderr" and "Error" in o.text]
    # The summary's validation rewards, as the notebook shows them, are the store's.
    val_reward = ast.literal_eval(text_of(cells["summary.val_reward"]))
    assert (val_reward["first_step"], val_reward["last_step"]) == (0, 3)
    assert 0.0 <= val_reward["first"] <= 1.0 and 0.0 <= val_reward["last"] <= 1.0
    curve = text_of(next(cell for first, cell in cells.items() if first.startswith("import sqlite3")))
    assert "reward_mean" in curve and "val_reward" in curve
    history = text_of(next(cell for first, cell in cells.items() if first.startswith("history =")))
    assert "reward_mean" in history and "kl" in history
    assert text_of(cells["summary.checkpoint"]) == f"PosixPath('{Path('notebook-run') / 'run' / 'step-3'}')"
    assert (run / "step-3" / "config.json").exists() and (run / "store.db").exists()
    assert not processes_under(tmp_path), "fit returned with processes of the run still running"


@pytest.mark.long
def test_the_notebook_as_written_learns_what_it_says(tmp_path: Path) -> None:
    """Its 40 steps, and the claim of its section 4: val_reward from 0.3-0.5 to above 0.85."""
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        notebook, timeout=1200, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    [cell] = [c for c in notebook.cells if c.cell_type == "code" and c.source == "summary.val_reward"]
    val_reward = ast.literal_eval(text_of(cell))
    assert 0.3 <= val_reward["first"] <= 0.5 and val_reward["last"] > 0.85, val_reward


FIT = """
from pathlib import Path

from algorithms import GRPO, Trainer
from examples.flight.model import TRAIN_TASKS, VAL_TASKS, build_tool_namer

model = build_tool_namer(Path({directory!r}) / "model", steps=20)
trainer = Trainer(GRPO(tasks_per_step=2, group_size=2, eval_repeats=2), model=model, runners=2,
                  output=Path({directory!r}) / "run", steps=40, progress=False)
trainer.fit("examples.flight.agent:flight_agent", train=TRAIN_TASKS, val=VAL_TASKS)
"""


def runner_started(run: Path) -> bool:
    log = run / "runner.log"
    return log.exists() and '"status"' in log.read_text(errors="replace")  # an attempt finished


@pytest.fixture
def kernel() -> Iterator[Any]:
    from jupyter_client.manager import start_new_kernel

    manager, client = start_new_kernel(kernel_name="python3")
    try:
        yield manager, client
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def test_a_kernel_interrupt_stops_the_run_and_every_process(tmp_path: Path, kernel: Any) -> None:
    manager, client = kernel
    message = client.execute(FIT.format(directory=str(tmp_path)))
    wait_for(lambda: runner_started(tmp_path / "run"), 180, "a rollout finished")
    assert processes_under(tmp_path), "the store serve of the run"
    kernel_process = psutil.Process(manager.provisioner.pid)
    assert kernel_process.children(recursive=True), "the run's processes, children of the kernel"

    manager.interrupt_kernel()
    reply = client.get_shell_msg(timeout=120)
    while reply["parent_header"].get("msg_id") != message:
        reply = client.get_shell_msg(timeout=120)
    assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt", reply
    # Every process the run started has stopped, and the kernel lives on for the next cell.
    assert not processes_under(tmp_path)
    assert not kernel_process.children(recursive=True)
    assert client.execute_interactive("1 + 1", timeout=30)["content"]["status"] == "ok"


def test_ctrl_c_in_a_script_stops_the_run_and_every_process(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(FIT.format(directory=str(tmp_path)))
    process = subprocess.Popen([sys.executable, str(script)], cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: runner_started(tmp_path / "run"), 180, "a rollout finished")
        children = psutil.Process(process.pid).children(recursive=True)
        assert children
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode != 0 and "KeyboardInterrupt" in stderr, stderr[-2000:]
    assert not [child for child in children if child.is_running() and child.status() != psutil.STATUS_ZOMBIE]
    assert not processes_under(tmp_path)


def test_apo_runs_through_the_same_call(tmp_path: Path) -> None:
    """APO from Python, attached to a store server: no model, the tasks as a list, a DataFrame and a JSONL path,
    the optimizer LLM given as settings; it finds the good rewrite (the scripted optimizer's third proposal), as
    ``store train`` does in test_apo.py."""
    pandas = pytest.importorskip("pandas")
    from algorithms import APO, Trainer
    from lightning_store.settings import OptimizerSettings

    script = {"prompt_template": [agents.BAD_REWRITE, agents.PARTIAL_REWRITE, agents.GOOD_REWRITE]}
    paths = write_tasks(tmp_path, test=agents.classify_tasks("test"))
    with stack(tmp_path, create_app(script), {"prompt_template": agents.CLASSIFY_SEED}) as env:
        summary = Trainer(
            APO(seed=3, max_rollouts=120, max_optimizer_calls=16, minibatch_size=3),
            store=env["store"],
            runners=2,
            output=tmp_path / "run",
            optimizer=OptimizerSettings(optimizer_url=env["llm"], optimizer_model=OPTIMIZER_MODEL),
            progress=False,
        ).fit(
            agents.classify,
            train=agents.classify_tasks("train"),
            val=pandas.DataFrame(agents.classify_tasks("val")),
            test=paths["test"],
        )
        assert latest_template(env["db"]) == agents.GOOD_REWRITE
        (run,) = runs(env["db"])
        [record] = sql(env["db"], "SELECT input FROM rollouts_v WHERE rollout_id = ?", run["run_id"])
    # What the run is, as the dashboard's run page shows it: beside the options, what the Trainer was given.
    about = json.loads(record["input"])["run"]
    assert about["agent"] == "tests.apo_agents:classify" and about["model"] is None and about["runners"] == 2
    assert about["tasks"] == {split: len(agents.classify_tasks(split)) for split in ("train", "val", "test")}
    assert summary.algorithm == "apo" and summary.checkpoint is None and summary.store == env["store"]
    assert summary.val_reward["last"] == 1.0 > summary.val_reward["first"]
    assert run["best_test_score"] == 1.0 and summary.history[0]["step"] == 0

"""What ``Trainer.fit`` refuses before it starts anything (each a ConfigurationError naming the argument), how it
names an agent for the runner processes, the datasets it takes (``task_sources.tasks_of``), and
``aio.run_blocking`` under a running event loop (a Jupyter cell), its KeyboardInterrupt included."""

from __future__ import annotations

import _thread
import asyncio
import datetime
import threading
from pathlib import Path
from typing import Any

import pytest

from algorithms import APO, GRPO, Trainer
from algorithms.base import ConfigurationError
from algorithms.trainer import agent_name
from lightning_store import aio
from lightning_store.task_sources import TaskSourceError, tasks_of
from tests import apo_agents


def test_an_agent_is_named_by_where_its_module_holds_it() -> None:
    assert agent_name("examples.flight.agent:flight_agent") == "examples.flight.agent:flight_agent"
    assert agent_name(apo_agents.classify) == "tests.apo_agents:classify"
    from examples.flight.agent import flight_agent  # an @rollout agent: an instance of the runner's wrapper

    assert agent_name(flight_agent) == "examples.flight.agent:flight_agent"


def test_an_agent_the_runners_cannot_import_is_refused_naming_why() -> None:
    def local(task: Any) -> float:
        return 1.0

    with pytest.raises(ConfigurationError, match=r"^agent: .*local.* is defined in a function"):
        agent_name(local)
    local.__module__ = "__main__"
    local.__qualname__ = "notebook_agent"
    with pytest.raises(ConfigurationError, match=r"^agent: notebook_agent is defined in a notebook cell"):
        agent_name(local)


@pytest.mark.parametrize(
    ("options", "fit", "refusal"),
    [
        ({"runners": 0}, {}, r"^store: with runners=0"),
        ({}, {"agent": None}, r"^agent: give the agent"),
        ({}, {"train": None}, r"^train: give the training tasks"),
        ({"model": None}, {}, r"^model: grpo trains a model"),
        ({"model": "no/such/dir"}, {}, r"^model: .*no/such/dir is not one"),
        ({"report_to": "tensorbored"}, {}, r"^report_to: unknown tracker 'tensorbored'"),
        ({}, {"train": {"question": "one task"}}, r"^train: a dict is one task"),
        ({}, {"val": [{"at": b"bytes"}]}, r"^val: row 1: .*bytes is not JSON"),
        ({}, {"train": "no-such.jsonl"}, r"^train: cannot read no-such.jsonl"),
        ({}, {"train": []}, r"^train: no tasks"),
    ],
)
def test_fit_refuses_before_anything_starts(
    tmp_path: Path, options: dict[str, Any], fit: dict[str, Any], refusal: str
) -> None:
    trainer = Trainer(GRPO(), **{"model": tmp_path, "output": tmp_path / "run", "progress": False, **options})
    arguments = {"agent": "examples.flight.agent:flight_agent", "train": [{"question": "q"}], **fit}
    with pytest.raises(ConfigurationError, match=refusal):
        trainer.fit(**arguments)
    assert not (tmp_path / "run").exists()  # nothing started, nothing written


def test_apo_needs_no_model_and_one_given_is_not_used(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(ConfigurationError, match=r"^store: "):
        Trainer(APO(), runners=0, output=tmp_path / "run", progress=False).fit(train=[{"question": "q"}])
    plan = Trainer(APO(), model=tmp_path, output=tmp_path / "run").plan("a:b", [{"q": 1}], None, None)
    assert plan.model is None and plan.steps is None and plan.serving is None
    assert "apo trains no model: model is not used" in caplog.text


def test_datasets_in_memory_become_json_tasks() -> None:
    pandas = pytest.importorskip("pandas")
    numpy = pytest.importorskip("numpy")
    frame = pandas.DataFrame(
        {
            "question": ["a", "b"],
            "n": numpy.array([1, 2]),
            "x": [0.5, 1.5],
            "when": pandas.to_datetime(["2026-12-04"] * 2),
        }
    )
    assert tasks_of(frame) == [
        {"question": "a", "n": 1, "x": 0.5, "when": "2026-12-04T00:00:00"},
        {"question": "b", "n": 2, "x": 1.5, "when": "2026-12-04T00:00:00"},
    ]
    frame["vector"] = [numpy.array([1, 2]), numpy.array([3])]
    assert [task["vector"] for task in tasks_of(frame)] == [[1, 2], [3]]
    assert tasks_of(["plain text", 3, {"a": datetime.date(2026, 12, 4)}]) == ["plain text", 3, {"a": "2026-12-04"}]
    assert tasks_of(task for task in [{"a": 1}]) == [{"a": 1}]  # any iterable


def test_hugging_face_datasets_become_tasks() -> None:
    datasets = pytest.importorskip("datasets")
    dataset = datasets.Dataset.from_list([{"question": "a", "answer": 1}, {"question": "b", "answer": 2}])
    assert tasks_of(dataset) == [{"question": "a", "answer": 1}, {"question": "b", "answer": 2}]
    assert tasks_of(datasets.DatasetDict({"train": dataset})) == tasks_of(dataset)
    with pytest.raises(TaskSourceError, match=r"^val: the dataset has no split 'train' \(it has: test\)"):
        tasks_of(datasets.DatasetDict({"test": dataset}), what="val")


def test_run_blocking_runs_a_coroutine_from_inside_a_running_loop() -> None:
    async def answer() -> int:
        await asyncio.sleep(0.01)
        return 42

    async def failing() -> None:
        raise LookupError("from the hosted loop")

    async def cell() -> None:  # what a Jupyter cell is: synchronous code on a thread with a running loop
        assert aio.run_blocking(answer()) == 42
        with pytest.raises(LookupError, match="from the hosted loop"):
            aio.run_blocking(failing())

    asyncio.run(cell())
    assert aio.run_blocking(answer()) == 42  # and without a running loop


def test_a_keyboard_interrupt_cancels_the_hosted_coroutine_and_waits_for_its_cleanup() -> None:
    cleaned = threading.Event()

    async def training() -> None:
        try:
            await asyncio.sleep(60)
        finally:
            await asyncio.sleep(0.2)  # cleanup that takes a while: run_blocking waits for it
            cleaned.set()

    async def cell() -> None:
        timer = threading.Timer(0.5, _thread.interrupt_main)  # the kernel's interrupt: SIGINT to the main thread
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            aio.run_blocking(training())
        assert cleaned.is_set()

    asyncio.run(cell())

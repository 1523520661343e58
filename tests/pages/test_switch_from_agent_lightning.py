"""docs/how-to/switch-from-agent-lightning.md works as written: its Python files are saved under the names their
first lines give, its ``bash`` commands run in order in one shell, in a fresh directory, with the reader's two
environments on the ``PATH`` (the Agent Lightning project's first: ``python`` is the interpreter that has
``agentlightning==0.3.0``, :mod:`tests.integration.agl_servers`; then this one's, for ``store``), and what the page
says the reader will see holds."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

from tests.doc_scripts import STORE_ENV, page_commands, page_files, rows, run_commands, store_ready
from tests.integration.agl_servers import find_agl_python

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = Path(__file__).parents[2]
PAGE = ROOT / "docs" / "how-to" / "switch-from-agent-lightning.md"


def test_the_page_runs_as_written_and_shows_what_it_says(tmp_path: Path) -> None:
    agl_bin = Path(find_agl_python()).parent
    for name, source in page_files(PAGE).items():
        (tmp_path / name).write_text(source)
    assert set(page_files(PAGE)) == {"enqueue.py", "city_agent.py"}
    commands = page_commands(PAGE)
    path = os.pathsep.join([str(agl_bin), str(Path(sys.executable).parent), os.environ["PATH"]])
    # LITELLM_LOCAL_MODEL_COST_MAP: agentlightning imports litellm, which fetches a price list from the internet.
    env = {**os.environ, "PATH": path, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    for name in (*STORE_ENV, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OPENAI_BASE_URL"):
        env.pop(name, None)
    out = run_commands(commands, store_ready(4747), cwd=tmp_path, env=env, timeout=540)
    said = [(command, text) for command, text in zip(commands, out, strict=True)]

    enqueued = [text for command, text in said if command == "python enqueue.py"]
    assert len(enqueued) == 2
    for text in enqueued:  # four rollout ids, each queuing
        assert [line.split()[1] for line in text.splitlines()] == ["queuing"] * 4, text
    listing = next(text for command, text in said if command.startswith("store rollouts list"))
    assert len(re.findall(r"\bsucceeded\b", listing)) == 4, listing
    spans = next(text for command, text in said if command.startswith('store sql "SELECT s.name'))
    assert re.search(r"agentlightning\.annotation\W+4\b", spans) and re.search(r"agentlightning\.message\W+4\b", spans)
    summary = json.loads(next(text for command, text in said if command.startswith("store run")).splitlines()[-1])
    assert summary == {"summary": {"succeeded": 4}, "worker_restarts": 0}
    database = tmp_path / "lightning_store.db"
    workers = {r["worker_id"] for r in rows(database, "SELECT DISTINCT worker_id FROM attempts")}
    assert "Worker-0" in workers and len(workers) >= 2  # Agent Lightning's runner, then store run's workers
    rewards = rows(database, "SELECT count(*) AS n FROM rewards_v")
    assert rewards[0]["n"] == 8

"""Which role of the SQL agent a GRPO run changed: for each evaluation of a ``bench/framework_agents.py`` SQL run,
the mean reward of the writer's first query (scored with the example's reward, as if the graph had ended there)
beside the mean reward of the final query (the rollout's reward, after the checker and any rewrite).

    python -m bench.sql_roles /tmp/framework-agents/sql-seed0/out/store.db --model /tmp/framework-agents/smollm2-135m

Reads the run's store (``rewards_v`` and ``llm_calls_v``, the validation rollouts) and decodes each rollout's first
LLM call, the writer's, with the model's tokenizer.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
from collections import defaultdict
from pathlib import Path

from transformers import AutoTokenizer

from examples.sql_agent.agent import extract_sql
from examples.sql_agent.reward import execution_reward

VAL = Path(__file__).parents[1] / "examples" / "sql_agent" / "val.jsonl"


def roles(store: Path, model: Path) -> dict[int, dict[str, float]]:
    """Per evaluated policy version: rollouts, the writer's first query's mean reward, the final mean reward."""
    tokenizer = AutoTokenizer.from_pretrained(model)
    tasks = {row["task_id"]: row for row in map(json.loads, VAL.read_text().splitlines())}
    db = sqlite3.connect(f"file:{store}?mode=ro", uri=True)
    first: dict[int, list[float]] = defaultdict(list)
    final: dict[int, list[float]] = defaultdict(list)
    query = (  # each validation rollout with its first LLM call's response, in one statement
        "SELECT r.task_id, r.resources_version, r.reward, (SELECT c.response_token_ids FROM llm_calls_v c"
        " WHERE c.rollout_id = r.rollout_id ORDER BY c.start_time LIMIT 1) FROM rewards_v r WHERE r.mode = 'val'"
    )
    for task_id, version, reward, ids in db.execute(query):
        written = extract_sql(str(tokenizer.decode(json.loads(ids), skip_special_tokens=True)))
        task = tasks[task_id]
        first[version].append(execution_reward(task["db_id"], written, task["gold_sql"]))
        final[version].append(reward)
    return {
        version: {"rollouts": len(final[version]), "first_query": mean(first[version]), "final": mean(final[version])}
        for version in sorted(final)
    }


def mean(values: list[float]) -> float:
    return round(sum(values) / len(values), 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("store", type=Path)
    parser.add_argument("--model", type=Path, required=True, help="the run's model directory (its tokenizer)")
    args = parser.parse_args()
    for version, row in roles(args.store, args.model).items():
        print(json.dumps({"policy_version": version, **row}))


if __name__ == "__main__":
    main()

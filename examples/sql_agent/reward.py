"""The SQL example's reward: execution match, with partial credit on the way to it.

=====================================================  =====================================
the agent's final query                                 reward
=====================================================  =====================================
returns the gold query's rows                           1.0
runs, but returns other rows                            0.1 + 0.4 x F1 of the values returned
does not run (syntax, unknown table, a write), none     0.0
=====================================================  =====================================

"The gold query's rows" compares rows as a multiset (in order when the gold query has ``ORDER BY``), with numbers
rounded to 2 decimals, so ``SELECT COUNT(*)`` and ``SELECT count(id)`` agree. The F1 is over the multisets of
values (every cell of every row): listing ``name, city`` where ``name`` was asked for still earns most of the
partial credit, a query on the wrong table little. Why partial credit: a 135M model first has to learn to write one
query that runs at all, and a reward of 0 for everything short of exact execution gives GRPO no variance to learn
from on most groups.
"""

from __future__ import annotations

import sqlite3
from collections import Counter

from examples.sql_agent.databases import run_query


def normal(value: object) -> object:
    """A cell as compared: a number rounded to 2 decimals (an int and an equal float agree), text as it is."""
    if isinstance(value, bool | int | float):
        return round(float(value), 2)
    return value


def f1(predicted: Counter[object], gold: Counter[object]) -> float:
    common = sum((predicted & gold).values())
    if common == 0:
        return 0.0
    precision, recall = common / sum(predicted.values()), common / sum(gold.values())
    return 2 * precision * recall / (precision + recall)


def execution_reward(db_id: str, query: str | None, gold_sql: str) -> float:
    """The reward of ``query`` (None: the agent wrote none) for a question whose answer ``gold_sql`` gives."""
    if not query:
        return 0.0
    try:
        rows = [tuple(normal(v) for v in row) for row in run_query(db_id, query)]
    except (sqlite3.Error, sqlite3.Warning):
        return 0.0
    gold = [tuple(normal(v) for v in row) for row in run_query(db_id, gold_sql)]
    ordered = "order by" in gold_sql.lower()
    if (rows == gold) if ordered else (Counter(rows) == Counter(gold)):
        return 1.0
    values = Counter(value for row in rows for value in row)
    return 0.1 + 0.4 * f1(values, Counter(value for row in gold for value in row))

"""The rollouts page's statements: which rollouts a page shows, in which order, and what it shows of them.

Speed on a big store (100k rollouts) comes from three rules:

1. **Keys first, columns after.** A page is chosen by a statement that reads only what filters and sorts need,
   from the ``rollouts`` table (``rollouts_v`` has the same columns under the same names, but every row of it
   pays for a join to the latest attempt, which a sort over the whole table cannot afford); the page's 50 rows
   are then read from ``rollouts_v`` and ``rewards_v`` by id, so the views' per-row subqueries (resources
   version, attempts, reward) run for those rows only.
2. **A filter on a derived value picks its plan.** The resources version and the reward of a rollout are those
   of its latest attempt, known only after a lookup per rollout. When few rollouts can match (counted, up to a
   cap, on the indexes of revision 0005), the statement starts from those candidates; otherwise it walks the
   rollouts in page order and checks each, which ends after a page's worth of matches.
3. **Sorting by reward walks the reward index.** Rollouts with a reward come first, in index order (reward,
   then the reward's time, then rollout id, all descending or all ascending), so a page reads about a page of
   the index; rollouts whose latest attempt has no reward follow, newest first.

Every value is a bound parameter; the statements' text depends only on which filters are set.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from lightning_store.dashboard.latest_attempts import latest_errors, latest_runs
from lightning_store.dashboard.reader import Reader, bound_list
from lightning_store.dashboard.rollout_filters import NO_MODE, PAGE_SIZE, RolloutFilters

FETCH = PAGE_SIZE + 1
"""Rows asked for: one more than a page says whether there is a next page."""
INF = 1e308
COUNT_CAP = 10_000
"""Counting stops here unless an index answers the count."""
COLUMNS = (
    "rollout_id, status, mode, resources_id, resources_version, step, task_id, start_time, end_time, "
    "duration_seconds, num_attempts, latest_attempt_id, latest_attempt_status, latest_worker_id"
)
LATEST_ATTEMPT = (
    "(SELECT a.attempt_id FROM attempts_v a WHERE a.rollout_id = r.rollout_id ORDER BY a.sequence_id DESC LIMIT 1)"
)
"""The latest attempt of rollout ``r`` (as ``rollouts_v.latest_attempt_id``)."""
LATEST_REWARD_OF = """(SELECT w.{column} FROM rewards_v w
    WHERE w.rollout_id = r.rollout_id AND w.attempt_id = {latest} ORDER BY w.sequence_id DESC LIMIT 1)"""
LATEST_REWARD = LATEST_REWARD_OF.format(column="reward", latest=LATEST_ATTEMPT)
"""The reward of rollout ``r``: that of the last reward span (by sequence id) of its latest attempt."""
LATEST_REWARD_TIME = LATEST_REWARD_OF.format(column="time", latest=LATEST_ATTEMPT)
NO_REWARD = f"""NOT EXISTS (SELECT 1 FROM rewards_v w
    WHERE w.rollout_id = r.rollout_id AND w.attempt_id = {LATEST_ATTEMPT})"""
LATEST_VERSION = "(SELECT l.resources_version FROM rollouts_v l WHERE l.rollout_id = r.rollout_id)"
LAST_REWARDS = """rewards_v w
    JOIN rollouts_v r ON r.latest_attempt_id = w.attempt_id
    WHERE NOT EXISTS (SELECT 1 FROM rewards_v x WHERE x.rollout_id = w.rollout_id
                      AND x.attempt_id = w.attempt_id AND x.sequence_id > w.sequence_id)"""
"""Each rollout's reward span (``w``) with the rollout (``r``, from ``rollouts_v``), as a FROM … WHERE head.
Attempt ids are unique, so the join needs no rollout id; with one, Postgres multiplies the two terms' odds as if
they were independent, expects almost no rows, and sorts every reward span instead of walking the index."""
ORDERS = {
    "start_time": "r.start_time {d}, r.pk {d}",
    "end_time": "r.end_time {d} NULLS LAST, r.pk {d}",
    "duration": "(r.end_time - r.start_time) {d} NULLS LAST, r.pk {d}",
    "status": "r.status {d}, r.pk {d}",
}
"""Page orders over the ``rollouts`` table; ties go by ``pk``, the order of enqueueing (an index's last column)."""


@dataclass
class RolloutPage:
    """One page of the rollouts table: its rows (``rollouts_v`` columns plus ``reward``), whether more follow,
    and the number of matching rollouts when it was cheap to know (else None)."""

    rows: list[dict[str, Any]]
    has_next: bool
    total: int | None
    offset: int
    at_least: int = 0
    """When ``total`` is None, a number of matching rollouts known to be exceeded (0: unknown)."""


class Conditions:
    """The WHERE terms and parameters for ``f`` over a rollout aliased ``r`` (the ``rollouts`` table or
    ``rollouts_v``: the filtered columns have the same names in both)."""

    def __init__(self, reader: Reader, f: RolloutFilters) -> None:
        self.terms: list[str] = []
        self.params: dict[str, Any] = {}
        self.derived = False
        """Whether a term needs a per-rollout lookup (walked, not counted)."""
        self.indexed = not (f.mode or f.resources_id or f.meta_key or f.q)
        """Whether every term is one an index answers (status, start time): counting them all is cheap."""
        if f.status:
            self.terms.append(f"r.status IN ({self._many('status', f.status)})")
        if f.mode:
            named = [m for m in f.mode if m != NO_MODE]
            either = [f"r.mode IN ({self._many('mode', named)})"] if named else []
            either += ["r.mode IS NULL"] if NO_MODE in f.mode else []
            self.terms.append("(" + " OR ".join(either) + ")")
        if f.since is not None:
            self._add("r.start_time >= :since", since=f.since)
        if f.until is not None:
            self._add("r.start_time <= :until", until=f.until)
        if f.resources_id is not None:
            self._add("r.resources_id = :resources_id", resources_id=f.resources_id)
        if f.meta_key is not None and f.meta_value is not None:
            self._add(f"{reader.json_text('r.metadata', 'meta_key')} = :meta_value", meta_key=f.meta_key)
            self.params["meta_value"] = f.meta_value
        if f.q is not None:
            self._add("substr(r.rollout_id, 1, :q_length) = :q", q=f.q, q_length=len(f.q))

    def _many(self, name: str, values: list[str]) -> str:
        for i, value in enumerate(values):
            self.params[f"{name}_{i}"] = value
        return ", ".join(f":{name}_{i}" for i in range(len(values)))

    def _add(self, term: str, **params: Any) -> None:
        self.terms.append(term)
        self.params.update(params)

    def where(self, *extra: str) -> str:
        terms = [*self.terms, *extra]
        return " AND ".join(terms) if terms else "1 = 1"


async def derived_terms(reader: Reader, f: RolloutFilters, cond: Conditions, *, reward_sorted: bool) -> None:
    """Adds the resources version and reward filters to ``cond``, each as a candidate list when few rollouts
    can match (see the module docstring), else as a per-rollout check."""
    if f.resources_version is None and f.reward_min is None and f.reward_max is None:
        return
    cap = candidate_cap(f.offset, int(await reader.scalar("SELECT count(*) FROM rollouts") or 0))
    if f.resources_version is not None:
        cond.params["version"] = f.resources_version
        found = await count_capped(
            reader,
            "SELECT 1 FROM llm_calls_v WHERE resources_version = :version",
            {"version": f.resources_version},
            cap,
        )
        if found < cap:
            cond.terms.append(
                "r.rollout_id IN (SELECT c.rollout_id FROM llm_calls_v c WHERE c.resources_version = :version)"
            )
        else:
            cond.derived = True
        cond.terms.append(f"{LATEST_VERSION} = :version")
    if f.reward_min is not None or f.reward_max is not None:
        low = f.reward_min if f.reward_min is not None else -INF
        high = f.reward_max if f.reward_max is not None else INF
        cond.params.update(reward_low=low, reward_high=high)
        if reward_sorted:
            cond.derived = True  # the sort's statement reads rewards from the reward index: the range is a term there
            return
        found = await count_capped(
            reader,
            "SELECT 1 FROM rewards_v WHERE reward BETWEEN :reward_low AND :reward_high",
            {"reward_low": low, "reward_high": high},
            cap,
        )
        if found < cap:
            cond.terms.append(
                f"r.rollout_id IN (SELECT w.rollout_id FROM {LAST_REWARDS} "
                "AND w.reward BETWEEN :reward_low AND :reward_high)"
            )
        else:
            cond.derived = True
            cond.terms.append(f"{LATEST_REWARD} BETWEEN :reward_low AND :reward_high")


def candidate_cap(offset: int, total: int) -> int:
    """Below how many candidates a derived filter starts from them. Starting from c candidates costs about c
    lookups; checking rollouts in page order costs about (offset + a page) / (c / total) of them."""
    return max(1000, int(math.sqrt(3 * (offset + FETCH) * max(total, 1))))


async def count_capped(reader: Reader, select: str, params: dict[str, Any], cap: int) -> int:
    """How many rows ``select`` gives, counting no further than ``cap``."""
    sql = f"SELECT count(*) AS n FROM ({select} LIMIT :cap) AS capped"
    return int(await reader.scalar(sql, {**params, "cap": cap}) or 0)


async def rollout_page(reader: Reader, f: RolloutFilters) -> RolloutPage:
    """The page of rollouts ``f`` asks for."""
    cond = Conditions(reader, f)
    reward_sorted = f.sort == "reward"
    await derived_terms(reader, f, cond, reward_sorted=reward_sorted)
    total: int | None = None
    if reward_sorted:
        ids, total = await reward_sorted_ids(reader, f, cond)
    else:
        order = ORDERS[f.sort].format(d=f.order.upper())
        sql = f"SELECT r.rollout_id FROM rollouts r WHERE {cond.where()} ORDER BY {order} LIMIT :limit OFFSET :offset"
        rows = await reader.rows(sql, {**cond.params, "limit": FETCH, "offset": f.offset})
        ids = [row["rollout_id"] for row in rows]
    has_next = len(ids) > PAGE_SIZE
    ids = ids[:PAGE_SIZE]
    at_least = 0
    if total is None and not has_next and (ids or f.offset == 0):
        total = f.offset + len(ids)  # the last page: the count is known
    elif total is None and not cond.derived:
        total, at_least = await _count(reader, cond)
    return RolloutPage(await page_rows(reader, ids), has_next, total, f.offset, at_least)


async def _count(reader: Reader, cond: Conditions) -> tuple[int | None, int]:
    """How many rollouts match ``cond``: ``(total, 0)``, or ``(None, COUNT_CAP)`` when there are more than
    :data:`COUNT_CAP` and the terms are not all answered by an index (counting them all would read every row)."""
    select = f"SELECT 1 FROM rollouts r WHERE {cond.where()}"
    if cond.indexed:
        return int(await reader.scalar(f"SELECT count(*) AS n FROM ({select}) AS matching", cond.params) or 0), 0
    found = await count_capped(reader, select, cond.params, COUNT_CAP + 1)
    return (found, 0) if found <= COUNT_CAP else (None, COUNT_CAP)


async def reward_sorted_ids(reader: Reader, f: RolloutFilters, cond: Conditions) -> tuple[list[str], int | None]:
    """Rollout ids of the page (and one more) sorted by reward, and how many rollouts match when that was
    counted. Rewarded rollouts come first, by reward, then the reward's time, then rollout id (all in the
    page's direction); those without a reward on their latest attempt follow, newest first. A filter that
    leaves at most :data:`COUNT_CAP` rollouts sorts them whole (each one's reward a lookup); otherwise the reward
    index is walked, which reads about a page of it, and then the rollouts without a reward, newest first."""
    d = f.order.upper()
    ranged = "reward_low" in cond.params
    in_range = " AND w.reward BETWEEN :reward_low AND :reward_high" if ranged else ""
    page = {"limit": FETCH, "offset": f.offset}
    if cond.terms:
        select = f"SELECT 1 FROM rollouts r WHERE {cond.where()}"
        matching = await count_capped(reader, select, cond.params, COUNT_CAP + 1)
        if matching <= COUNT_CAP:
            where = cond.where(f"{LATEST_REWARD} BETWEEN :reward_low AND :reward_high") if ranged else cond.where()
            rows = await reader.rows(
                f"""WITH x AS MATERIALIZED (
                        SELECT r.rollout_id, r.start_time, r.pk, {LATEST_REWARD} AS reward,
                               {LATEST_REWARD_TIME} AS reward_time
                        FROM rollouts r WHERE {where})
                    SELECT rollout_id FROM x ORDER BY reward {d} NULLS LAST, reward_time {d},
                        CASE WHEN reward IS NULL THEN NULL ELSE rollout_id END {d},
                        start_time DESC, pk DESC
                    LIMIT :limit OFFSET :offset""",
                {**cond.params, **page},
            )
            return [row["rollout_id"] for row in rows], None if ranged else matching
    head = f"FROM {LAST_REWARDS} AND {cond.where()}{in_range}"
    rows = await reader.rows(
        f"SELECT w.rollout_id {head} ORDER BY w.reward {d}, w.time {d}, w.rollout_id {d} LIMIT :limit OFFSET :offset",
        {**cond.params, **page},
    )
    ids = [row["rollout_id"] for row in rows]
    if len(ids) == FETCH or ranged:  # a reward range leaves out every rollout without a reward
        return ids, None
    rewarded = f.offset + len(ids)
    if not ids and f.offset > 0:  # past the last rewarded rollout: how many were there?
        rewarded = int(await reader.scalar(f"SELECT count(*) {head}", cond.params) or 0)
    rest = await reader.rows(
        f"SELECT r.rollout_id FROM rollouts r WHERE {cond.where(NO_REWARD)} "
        "ORDER BY r.start_time DESC, r.pk DESC LIMIT :limit OFFSET :offset",
        {**cond.params, "limit": FETCH - len(ids), "offset": max(f.offset - rewarded, 0)},
    )
    return ids + [row["rollout_id"] for row in rest], None


async def page_rows(reader: Reader, ids: list[str]) -> list[dict[str, Any]]:
    """``rollouts_v`` rows of ``ids`` in that order, each with ``reward``: its latest attempt's last reward,
    ``ran``: how long that attempt ran, and ``error``: why it did not succeed
    (:mod:`lightning_store.dashboard.latest_attempts`), or None."""
    if not ids:
        return []
    listed, names = bound_list("id", ids)
    rows = await reader.rows(f"SELECT {COLUMNS} FROM rollouts_v WHERE rollout_id IN ({listed})", names)
    by_id = {row["rollout_id"]: row for row in rows}
    rewards = await reader.rows(
        f"SELECT rollout_id, attempt_id, sequence_id, reward FROM rewards_v WHERE rollout_id IN ({listed})", names
    )
    last: dict[str, tuple[int, float]] = {}
    for reward in rewards:
        row = by_id.get(reward["rollout_id"])
        if row is None or reward["attempt_id"] != row["latest_attempt_id"]:
            continue
        seen = last.get(reward["rollout_id"])
        if seen is None or reward["sequence_id"] > seen[0]:
            last[reward["rollout_id"]] = (reward["sequence_id"], reward["reward"])
    errors = await latest_errors(reader, rows)
    ran = await latest_runs(reader, rows, time.time())
    result = []
    for rollout_id in ids:
        if (row := by_id.get(rollout_id)) is not None:  # gone since the page was chosen: left out
            latest_reward = last[rollout_id][1] if rollout_id in last else None
            extra = {"reward": latest_reward, "error": errors.get(rollout_id), "ran": ran.get(rollout_id)}
            result.append({**row, **extra})
    return result


async def store_is_empty(reader: Reader) -> bool:
    return await reader.scalar("SELECT rollout_id FROM rollouts LIMIT 1") is None

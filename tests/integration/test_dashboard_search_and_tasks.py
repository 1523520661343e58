"""The dashboard's search over LLM calls' text and its page of one task across policy versions, on SQLite and
Postgres (the store of ``dashboard_rollouts_fill.py``, served for real): what they show equals what the store holds,
read with SQL and the store contract; hostile text and ids are answered, never an error."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote, urlencode

import pytest

from lightning_store.llm_calls import LlmCall
from tests.integration.dashboard_html import Element, number
from tests.integration.dashboard_rollouts_fill import QUOTED_TASK, Site, site_for

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
pytestmark = pytest.mark.parametrize("database_url", BACKENDS, indirect=True)


@pytest.fixture
async def site(database_url: str) -> AsyncIterator[Site]:
    async with site_for(database_url) as opened:
        yield opened


async def search(site: Site, text: str) -> Element:
    return await site.page("/dashboard/search?" + urlencode({"text": text}))


def hits(page: Element) -> list[tuple[str, str]]:
    return [(h.attrs["data-rollout-id"], h.attrs["data-span-id"]) for h in page.testids("search-hit")]


async def calls_holding(site: Site, text: str) -> set[tuple[str, str]]:
    """The (rollout, span) of every recorded call whose messages or answer hold ``text`` (case-insensitively)."""
    found = set()
    for row in await site.sql("SELECT rollout_id, span_id, request, response FROM llm_calls"):
        request, response = (json.loads(v) if isinstance(v, str) else v for v in (row["request"], row["response"]))
        texts = [m["content"] for m in request["messages"]]
        texts += [c["message"]["content"] for c in response["choices"]]
        if any(text.casefold() in t.casefold() for t in texts):
            found.add((row["rollout_id"], row["span_id"]))
    return found


async def test_search_finds_the_calls_whose_prompt_or_answer_holds_the_text(site: Site) -> None:
    for text, where in (("WHAT IS 12 + 1?", "prompt · user"), ("it is 13.", "response")):
        page = await search(site, text)
        expected = await calls_holding(site, text)
        assert set(hits(page)) == expected and expected, text
        for hit in page.testids("search-hit"):
            assert hit.testid("search-hit-match").text().casefold() == text.casefold()
            assert hit.testid("search-hit-where").text() == where
            link = hit.testid("search-hit-link").attrs["href"]
            assert link == f"/dashboard/rollouts/{quote(hit.attrs['data-rollout-id'])}#call-{hit.attrs['data-span-id']}"
    # Newest first, at most 50: "Be brief." is in every call's prompt.
    everywhere = await search(site, "be brief")
    shown = everywhere.testids("search-hit")
    assert len(shown) == 50 and everywhere.testids("search-more")
    times = [number(h.all(lambda e: "data-value" in e.attrs)[-1].attrs["data-value"]) or 0.0 for h in shown]
    assert times == sorted(times, reverse=True) and all(times)


async def test_search_matches_text_not_json_and_takes_any_text(site: Site) -> None:
    for text in ("role", "messages", "choices"):  # JSON keys of every record: no call's text holds them
        assert (await search(site, text)).testids("search-empty"), text
    for text in ("100%", "a_b", '"quoted"', "back\\slash", "<script>x</script>", "' OR 1=1 --", "x" * 500):
        page = await search(site, text)
        assert page.testids("search-empty") or page.testids("search-hit"), text
    # Text that JSON escapes (non-ASCII, quotes, newlines) is found as it was sent.
    rollout = await site.store.start_rollout({"q": "accents"})
    content = 'Un café "crème",\nsans sucre ✓'
    call = LlmCall(
        rollout_id=rollout.rollout_id,
        attempt_id=rollout.attempt.attempt_id,
        span_id="accented-call",
        prompt_token_ids=[1],
        response_token_ids=[2],
        request={"messages": [{"role": "user", "content": content}]},
        response={"choices": [{"message": {"role": "assistant", "content": "Voilà."}}]},
        start_time=rollout.attempt.start_time,
    )
    await site.store.add_llm_calls([call])
    for text in ('café "crème"', 'crème",\nsans', "✓", "voilà"):
        assert hits(await search(site, text)) == [(rollout.rollout_id, "accented-call")], text


async def test_a_task_page_compares_its_rollouts_version_by_version(site: Site) -> None:
    expected = await site.expected()
    task = "task-3"
    mine = [r for r in expected.values() if r["task_id"] == task]
    by_version: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for row in mine:
        by_version[row["resources_version"]].append(row)
    page = await site.page(f"/dashboard/tasks/{task}")
    assert page.testid("task-total").text() == str(len(mine))
    versions = page.testids("task-version")
    shown_versions = [int(v.attrs["data-version"]) if v.attrs["data-version"] else None for v in versions]
    assert shown_versions == sorted(by_version, key=lambda v: (v is None, v or 0)) and len(shown_versions) >= 2
    answers = {}
    for row in await site.sql(
        "SELECT rollout_id, attempt_id, sequence_id, response FROM llm_calls ORDER BY sequence_id"
    ):
        response = json.loads(row["response"]) if isinstance(row["response"], str) else row["response"]
        if row["attempt_id"] == expected[row["rollout_id"]]["latest_attempt_id"]:
            answers[row["rollout_id"]] = response["choices"][0]["message"]["content"]
    for element, version in zip(versions, shown_versions, strict=True):
        group = by_version[version]
        assert element.testid("task-version-rollouts").text() == str(len(group))
        assert element.testid("task-version-succeeded").text() == str(sum(r["status"] == "succeeded" for r in group))
        rewards = [r["reward"] for r in group if r["reward"] is not None]
        mean = number(element.testid("task-version-mean-reward").attrs["data-value"])
        assert mean == (pytest.approx(sum(rewards) / len(rewards)) if rewards else None)
    for table in page.testids("task-rollouts"):
        for shown in table.testids("task-rollout"):
            want = expected[shown.attrs["data-rollout-id"]]
            assert want["task_id"] == task
            assert number(shown.testid("task-rollout-reward").attrs["data-value"]) == want["reward"]
            assert shown.testid("task-rollout-answer").text() == answers.get(want["rollout_id"], "")
    # The rollout page links its task here.
    link = (await site.page(f"/dashboard/rollouts/{quote(mine[0]['rollout_id'], safe='')}")).testid("rollout-task-link")
    assert link.attrs["href"] == f"/dashboard/tasks/{task}"


async def test_task_ids_that_need_quoting_and_unknown_ones(site: Site) -> None:
    page = await site.page(f"/dashboard/tasks/{quote(QUOTED_TASK, safe='')}")
    assert page.testid("task-id").text() == QUOTED_TASK and page.testid("task-total").text() == "1"
    for unknown in ("no-such-task", "a/b c", "<b>x</b>", "' OR '1'='1"):
        missing = await site.page(f"/dashboard/tasks/{quote(unknown, safe='')}", status=404)
        assert missing.testid("missing-id").text() == unknown

"""The resources history (revision 0006) on SQLite and Postgres: every acknowledged write of a resources id is a
row of ``resource_versions_v`` with the content it wrote, a rejected write adds none, and the dashboard's
resources page diffs each stored version's prompt templates against the version before it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from lightning_store.errors import InvalidRequestError
from lightning_store.resources import LLM, PromptTemplate
from lightning_store.sql import SqlStore, open_store
from tests.conftest import serving
from tests.integration.dashboard_html import Element, parse

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
pytestmark = pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
TEXTS = ["Answer {q}.\nBe brief.", "Answer {q}.\nBe brief.\nShow your work.", "Reply to {q}.\nShow your work."]


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[SqlStore]:
    opened = await open_store(database_url, migrate=True, watchdog_interval=0)
    yield opened
    await opened.close()


async def history(store: SqlStore, resources_id: str) -> list[tuple[int, Any]]:
    async with store.engine.connect() as conn:
        rows = await conn.execute(
            sa.text("SELECT version, resources FROM resource_versions_v WHERE resources_id = :rid ORDER BY version"),
            {"rid": resources_id},
        )
        return [(r.version, json.loads(r.resources) if isinstance(r.resources, str) else r.resources) for r in rows]


def prompt(text: str) -> dict[str, Any]:
    return {"system": PromptTemplate(template=text, engine="f-string")}


async def test_every_write_is_kept_with_its_content_and_a_rejected_one_adds_nothing(store: SqlStore) -> None:
    added = await store.add_resources({"llm": LLM(endpoint="http://127.0.0.1:9/v1", model="m")})
    for text in TEXTS:
        await store.update_resources("prompts", prompt(text))
    with pytest.raises(InvalidRequestError):
        await store.update_resources("prompts", {"system": {"resource_type": "nope"}})  # type: ignore[dict-item]
    assert [v for v, _ in await history(store, added.resources_id)] == [1]
    kept = await history(store, "prompts")
    assert [(v, content["system"]["template"]) for v, content in kept] == list(enumerate(TEXTS, start=1))
    latest = await store.get_resources_by_id("prompts")
    assert latest is not None and latest.version == 3


async def test_concurrent_updates_each_keep_their_own_version(store: SqlStore) -> None:
    texts = [f"prompt {i}" for i in range(12)]
    written = await asyncio.gather(*(store.update_resources("racy", prompt(t)) for t in texts))
    assert sorted(w.version for w in written) == list(range(1, 13))
    kept = dict(await history(store, "racy"))
    assert {v: kept[v]["system"]["template"] for v in kept} == {
        w.version: w.resources["system"].template  # type: ignore[union-attr]
        for w in written
    }


async def page_of(http: httpx.AsyncClient, path: str, status: int = 200) -> Element:
    response = await http.get(path)
    assert response.status_code == status, (path, response.status_code, response.text[:300])
    return parse(response.text)


def diff_of(page: Element) -> tuple[list[str], list[str]]:
    (section,) = page.testids("resource")
    return [e.text() for e in section.testids("diff-added")], [e.text() for e in section.testids("diff-removed")]


async def test_the_resources_page_diffs_each_version_against_the_one_before(store: SqlStore) -> None:
    for text in TEXTS:
        await store.update_resources("prompts", prompt(text))
    await store.update_resources("policy", {"llm": LLM(endpoint="http://127.0.0.1:9/v1", model="m")})
    async with serving(store) as url, httpx.AsyncClient(base_url=url, timeout=30) as http:
        latest = await page_of(http, "/dashboard/resources/prompts")
        assert latest.testid("shown-version").attrs["data-value"] == "3"
        assert "version 2" in latest.testid("diff-parent").text()
        assert latest.testid("parent-version-link").attrs["href"] == "/dashboard/resources/prompts?version=2"
        assert diff_of(latest) == (["Reply to {q}."], ["Answer {q}.", "Be brief."])
        second = await page_of(http, "/dashboard/resources/prompts?version=2")
        assert second.testid("shown-version").attrs["data-value"] == "2"
        assert diff_of(second) == (["Show your work."], [])
        first = await page_of(http, "/dashboard/resources/prompts?version=1")
        assert first.testid("no-parent") and not first.testids("diff-added")
        assert [e.text() for e in first.testids("template-text")] == [TEXTS[0]]
        rows = {r.attrs["data-version"]: r for r in latest.testids("version-row")}
        assert sorted(rows) == ["1", "2", "3"]
        links = {e.attrs["href"] for e in latest.testids("version-link")}
        assert links == {"/dashboard/resources/prompts?version=1", "/dashboard/resources/prompts?version=2"}
        assert "/dashboard/resources/prompts" in {e.attrs["href"] for e in second.testids("version-link")}
        # A resources id without prompt templates says nothing about diffs.
        policy = await page_of(http, "/dashboard/resources/policy")
        assert not policy.testids("diff-parent") and not policy.testids("no-parent")
        # Versions the history does not hold are a 404 page; impossible ones a 422.
        missing = await page_of(http, "/dashboard/resources/prompts?version=9", status=404)
        assert "version 9" in missing.testid("missing-id").text()
        for bad in ("0", "-1", "x", str(2**31)):
            assert (await http.get(f"/dashboard/resources/prompts?version={bad}")).status_code == 422

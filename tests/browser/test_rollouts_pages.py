"""The rollouts list and a rollout's page in a real browser, on the store a real GRPO run and a real APO run
filled (``tests/browser/conftest.py``): the table loads, a filter narrows it to the rows SQL counts, paging moves
through it, a rollout opens, its timeline rows expand, and the token ids of an LLM call load when asked for."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tests.browser.conftest import Served, console_of

pytestmark = pytest.mark.slow


def shown_ids(page: Any) -> list[str]:
    rows = page.get_by_test_id("rollout-row")
    return [str(rows.nth(i).get_attribute("data-rollout-id")) for i in range(rows.count())]


def test_the_table_loads_a_filter_narrows_it_and_paging_moves_on(page: Any, server: Served, shoot: Any) -> None:
    total = server.scalar("SELECT count(*) FROM rollouts_v")
    assert total > 50  # more than one page
    page.goto(f"{server.url}/dashboard/rollouts")
    range_ = page.get_by_test_id("rows-range")
    assert range_.get_attribute("data-total") == str(total)
    first = shown_ids(page)
    newest = [
        r["rollout_id"]
        for r in server.rows("SELECT rollout_id FROM rollouts ORDER BY start_time DESC, pk DESC LIMIT 50")
    ]
    assert first == newest
    shoot(page, "rollouts")

    page.get_by_test_id("next-page").click()
    page.wait_for_url(re.compile(r".*page=2"))
    second = shown_ids(page)
    assert second and not set(second) & set(first)
    assert page.get_by_test_id("rows-range").get_attribute("data-first") == "51"
    page.get_by_test_id("prev-page").click()
    page.wait_for_url(re.compile(r".*/dashboard/rollouts$"))
    assert shown_ids(page) == first

    form = page.get_by_test_id("rollout-filters")
    form.locator('input[name="mode"][value="val"]').check()
    form.locator('input[name="status"][value="succeeded"]').check()
    page.get_by_test_id("apply-filters").click()
    page.wait_for_url(re.compile(r".*mode=val.*"))
    want = server.scalar("SELECT count(*) FROM rollouts_v WHERE mode = 'val' AND status = 'succeeded'")
    assert 0 < want <= 50
    assert page.get_by_test_id("rollout-row").count() == want
    assert page.get_by_test_id("rows-range").get_attribute("data-total") == str(want)
    assert form.locator('input[name="mode"][value="val"]').is_checked()  # the form keeps the filters
    page.get_by_test_id("clear-filters").click()
    page.wait_for_url(re.compile(r".*/dashboard/rollouts$"))
    assert page.get_by_test_id("rows-range").get_attribute("data-total") == str(total)


def test_a_bad_filter_says_which_field(page: Any, server: Served) -> None:
    response = page.goto(f"{server.url}/dashboard/rollouts?reward_min=abc&sort=nope")
    assert response is not None and response.status == 422
    console_of(page).expected("422")  # Chromium logs every 4xx page load
    fields = page.get_by_test_id("filter-error")
    assert {fields.nth(i).get_attribute("data-field") for i in range(fields.count())} == {"reward_min", "sort"}


def test_a_rollout_opens_its_timeline_expands_and_tokens_load_on_demand(page: Any, server: Served, shoot: Any) -> None:
    (call,) = server.rows(
        "SELECT rollout_id, span_id, prompt_token_ids, response_token_ids FROM llm_calls_v "
        "WHERE prompt_tokens > 0 AND mode = 'train' ORDER BY start_time DESC LIMIT 1"
    )
    rollout_id = call["rollout_id"]
    page.goto(f"{server.url}/dashboard/rollouts?q={rollout_id}")
    page.get_by_test_id("rollout-link").first.click()
    page.wait_for_url(f"{server.url}/dashboard/rollouts/{rollout_id}")
    status = server.scalar("SELECT status FROM rollouts_v WHERE rollout_id = ?", rollout_id)
    assert page.get_by_test_id("rollout-status").inner_text() == status
    spans = server.scalar("SELECT count(*) FROM spans_v WHERE rollout_id = ?", rollout_id)
    assert page.get_by_test_id("span-row").count() == spans > 0

    row = page.locator(f"#span-{call['span_id']}")
    attributes = row.get_by_test_id("span-attributes")
    assert not attributes.is_visible()
    row.locator("summary").click()
    attributes.wait_for(state="visible")
    assert json.loads(attributes.inner_text())["lightning_store.llm_call"] is True

    article = page.locator(f"#call-{call['span_id']}")
    assert article.get_by_test_id("call-tokens").count() == 0  # not loaded until opened
    article.get_by_test_id("open-tokens").click()
    article.get_by_test_id("call-tokens").wait_for()
    prompt = json.loads(call["prompt_token_ids"])
    assert article.get_by_test_id("prompt-token").count() == len(prompt)
    assert article.get_by_test_id("prompt-token").first.get_attribute("data-id") == str(prompt[0])
    assert article.get_by_test_id("response-token").count() == len(json.loads(call["response_token_ids"]))
    shoot(page, "rollout")


def test_a_failed_rollout_shows_its_error(page: Any, server: Served) -> None:
    found = server.rows(
        "SELECT rollout_id, status_message FROM spans_v WHERE status_code = 'ERROR' AND status_message IS NOT NULL "
        "ORDER BY start_time DESC LIMIT 1"
    )
    assert found, "the GRPO run's broken validation task leaves an error"
    page.goto(f"{server.url}/dashboard/rollouts/{found[0]['rollout_id']}")
    messages = page.get_by_test_id("error-message").all_inner_texts()
    assert found[0]["status_message"] in messages
    link = page.get_by_test_id("error-item").first.locator('a[href^="#span-"]')
    span_id = str(link.get_attribute("href"))[len("#span-") :]
    link.click()  # the error's link opens its timeline row (rollouts.js)
    page.locator(f'details[data-span-id="{span_id}"][open]').wait_for()
    assert page.locator(f'details[data-span-id="{span_id}"]').get_attribute("data-kind") == "error"


def test_an_unknown_rollout_is_a_page_that_says_so(page: Any, server: Served) -> None:
    response = page.goto(f"{server.url}/dashboard/rollouts/ro-not-here")
    assert response is not None and response.status == 404
    console_of(page).expected("404")
    assert page.get_by_test_id("rollout-not-found").is_visible()

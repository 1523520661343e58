"""The training-runs and resources pages in a real browser, on the store a real GRPO run and a real APO run filled
(``tests/browser/conftest.py``): the charts are drawn, the numbers in the DOM are the views', the candidates are
``prompt_candidates_v``'s, a prompt diff shows the changed lines, and the links lead to the rollout pages."""

from __future__ import annotations

import json
from typing import Any

import pytest

from lightning_store.dashboard.run_steps import RL_CHARTS
from tests.browser.conftest import Served, console_of, tab

pytestmark = pytest.mark.slow
VIEW_COLUMNS = {"reward_mean", "reward_std", "val_reward", "val_rollouts", "loss", "pg_loss", "kl", "entropy"}
VIEW_COLUMNS |= {"grad_norm", "trained_transitions", "step_seconds"}


def value_of(page: Any, testid: str) -> float:
    return float(page.get_by_test_id(testid).get_attribute("data-value"))


def last_metric(server: Served, run_id: str, name: str) -> float | None:
    """The value of metric ``name`` at the run's highest step that has it, as ``training_steps_v`` reads it."""
    rows = server.rows("SELECT * FROM training_steps_v WHERE run_id = ? ORDER BY step", run_id)
    values = [r[name] if name in VIEW_COLUMNS else json.loads(r["metrics"]).get(name) for r in rows]
    found = [v for v in values if v is not None]
    return found[-1] if found else None


def check_charts(page: Any, server: Served, run_id: str) -> list[str]:
    """Every chart of the page is drawn (a uPlot canvas), and every latest value shown is the view's; the names."""
    charts = page.locator("[data-chart]")
    assert charts.count() > 0
    for i in range(charts.count()):
        chart = charts.nth(i)
        chart.locator("canvas").first.wait_for()
        assert chart.get_attribute("data-drawn") == "true"
    shown = page.locator('[data-testid^="metric-"][data-testid$="-last"]')
    names = [str(shown.nth(i).get_attribute("data-testid"))[7:-5] for i in range(shown.count())]
    for name in names:
        assert value_of(page, f"metric-{name}-last") == last_metric(server, run_id, name), name
    return names


def test_the_runs_list_shows_the_grpo_and_the_apo_run(page: Any, server: Served, shoot: Any) -> None:
    page.goto(f"{server.url}/dashboard/runs")
    rows = page.get_by_test_id("run-row")
    shown = {
        rows.nth(i).get_attribute("data-run-id"): rows.nth(i).get_attribute("data-kind") for i in range(rows.count())
    }
    apo = {r["run_id"] for r in server.rows("SELECT run_id FROM apo_runs_v")}
    rl = {r["run_id"] for r in server.rows("SELECT DISTINCT run_id FROM training_steps_v WHERE algorithm <> 'apo'")}
    assert len(apo) == len(rl) == 1
    assert shown == {**{r: "rl" for r in rl}, **{r: "apo" for r in apo}}
    shoot(page, "runs")


def test_an_rl_run_draws_its_charts_with_the_views_latest_values(page: Any, server: Served, shoot: Any) -> None:
    run_id = server.scalar("SELECT run_id FROM training_steps_v WHERE algorithm = 'grpo' LIMIT 1")
    page.goto(f"{server.url}/dashboard/runs")
    page.locator(f'[data-run-id="{run_id}"] [data-testid="run-link"]').click()
    page.wait_for_url(f"{server.url}/dashboard/runs/{run_id}")
    names = check_charts(page, server, run_id)
    logged = {m for _, _, metrics in RL_CHARTS for m in metrics if last_metric(server, run_id, m) is not None}
    assert set(names) == logged and {"reward_mean", "val_reward", "step_seconds", "staleness_max"} <= logged
    steps = server.rows(
        "SELECT step, reward_mean, val_reward FROM training_steps_v WHERE run_id = ? ORDER BY step", run_id
    )
    rows = page.get_by_test_id("step-row")
    assert [int(rows.nth(i).get_attribute("data-step")) for i in range(rows.count())] == [s["step"] for s in steps]
    for i, step in enumerate(steps):
        cell = rows.nth(i).locator('[data-col="val_reward"]')
        assert (cell.get_attribute("data-value") or None) == (
            None if step["val_reward"] is None else str(step["val_reward"])
        )
    shoot(page, "run-grpo")
    # A span of the run leads to its place on the rollout page.
    link = page.get_by_test_id("span-link").first
    href = str(link.get_attribute("href"))
    assert href.startswith(f"/dashboard/rollouts/{run_id}#span-")
    link.click()
    page.wait_for_url(f"{server.url}{href}")
    page.locator(f'[id="{href.split("#")[1]}"]').wait_for(state="attached")  # the span on the rollout page
    assert run_id in page.content()


def test_an_apo_run_shows_its_candidates_as_prompt_candidates_v(page: Any, server: Served, shoot: Any) -> None:
    run_id = server.scalar("SELECT run_id FROM apo_runs_v")
    page.goto(f"{server.url}/dashboard/runs/{run_id}")
    check_charts(page, server, run_id)
    candidates = server.rows("SELECT * FROM prompt_candidates_v WHERE run_id = ? ORDER BY round, candidate", run_id)
    rows = page.get_by_test_id("candidate-row")
    assert rows.count() == len(candidates) > 1
    for i, candidate in enumerate(candidates):
        row = rows.nth(i)
        assert row.get_attribute("data-candidate") == str(candidate["candidate"])
        assert row.locator('[data-col="status"]').inner_text().strip() == candidate["status"]
        for column in ("val_score", "minibatch_score", "is_best"):
            shown = row.locator(f'[data-col="{column}"]').get_attribute("data-value")
            assert (float(shown) if shown else None) == candidate[column], column
    best = server.scalar("SELECT best_candidate FROM apo_runs_v")
    assert page.get_by_test_id("apo-best_candidate").get_attribute("data-value") == str(best)
    critique = page.get_by_test_id("critique").first
    critique.locator("summary").click()
    critique.locator("pre").wait_for()
    calls = server.scalar("SELECT count(*) FROM llm_calls_v WHERE rollout_id = ?", run_id)
    assert page.get_by_test_id("call-row").count() == calls > 0
    shoot(page, "run-apo")
    link = page.get_by_test_id("call-link").first
    href = str(link.get_attribute("href"))
    assert href.startswith(f"/dashboard/rollouts/{run_id}#call-")
    link.click()
    page.wait_for_url(f"{server.url}{href}")
    page.locator(f'[id="{href.split("#")[1]}"]').wait_for(state="attached")  # the call on the rollout page


def test_the_resources_pages_show_versions_and_a_prompt_diff(page: Any, server: Served, shoot: Any) -> None:
    page.goto(f"{server.url}/dashboard/resources")
    stored = {r["resources_id"]: r["version"] for r in server.rows("SELECT resources_id, version FROM resources")}
    rows = page.get_by_test_id("resources-row")
    shown = {
        rows.nth(i).get_attribute("data-resources-id"): int(rows.nth(i).locator('[data-col="version"]').inner_text())
        for i in range(rows.count())
    }
    assert shown == stored
    shoot(page, "resources")
    # The best candidate, against its parent: the lines it changed, and only those.
    (best,) = server.rows(
        "SELECT c.templates, c.parent_resources_id, c.resources_id FROM prompt_candidates_v c "
        "JOIN apo_runs_v a ON a.run_id = c.run_id AND c.candidate = a.best_candidate"
    )
    assert best["parent_resources_id"], "the APO run found a better prompt than its seed"
    (parent,) = server.rows(
        "SELECT templates FROM prompt_candidates_v WHERE resources_id = ?", best["parent_resources_id"]
    )
    page.locator(f'[data-resources-id="{best["resources_id"]}"] [data-testid="resources-link"]').click()
    page.get_by_test_id("diff").first.wait_for()
    for name, text in json.loads(best["templates"]).items():
        before = json.loads(parent["templates"])[name].splitlines()
        section = page.locator(f'[data-testid="resource"][data-name="{name}"]')
        added = section.get_by_test_id("diff-added").all_inner_texts()
        removed = section.get_by_test_id("diff-removed").all_inner_texts()
        assert set(added) == set(text.splitlines()) - set(before) and added
        assert set(removed) == set(before) - set(text.splitlines())
    shoot(page, "resources-candidate")
    # What the run published, against its seed; and the rollouts that ran on a version of it.
    published, version = server.rows("SELECT published_resources_id, published_version FROM apo_runs_v")[0].values()
    page.goto(f"{server.url}/dashboard/resources/{published}")
    assert page.get_by_test_id("latest-version").get_attribute("data-value") == str(version)
    assert page.get_by_test_id("diff-added").count() > 0
    shoot(page, "resources-published")
    # The version before it is kept, one click away, and it links back to the latest.
    page.get_by_test_id("parent-version-link").click()
    page.wait_for_url(f"{server.url}/dashboard/resources/{published}?version={version - 1}")
    assert page.get_by_test_id("shown-version").get_attribute("data-value") == str(version - 1)
    assert page.get_by_test_id("version-link").count() >= 1
    page.goto(f"{server.url}/dashboard/resources/policy")
    link = page.get_by_test_id("version-rollouts").first
    href = str(link.get_attribute("href"))
    assert href.startswith("/dashboard/rollouts?resources_id=policy&resources_version=")
    link.click()
    page.wait_for_url(f"{server.url}{href}")


def test_empty_runs_and_resources_pages_say_what_to_do(browser: Any, empty_server: Served, shoot: Any) -> None:
    with tab(browser) as page:
        page.goto(f"{empty_server.url}/dashboard/runs")
        assert "store train" in page.get_by_test_id("runs-empty").inner_text()
        shoot(page, "runs-empty")
        page.goto(f"{empty_server.url}/dashboard/resources")
        assert "store resources set-prompt" in page.get_by_test_id("resources-empty").inner_text()
        shoot(page, "resources-empty")
        response = page.goto(f"{empty_server.url}/dashboard/runs/no-such-run")
        assert response is not None and response.status == 404
        page.get_by_test_id("not-found").wait_for()
        console_of(page).expected("404")  # the browser reports the page's own status

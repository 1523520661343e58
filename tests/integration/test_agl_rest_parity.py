"""Agent Lightning 0.3's REST surface, answered by ``store serve`` as by Agent Lightning's own server.

The same scenario of requests (:mod:`tests.integration.agl_rest_scenario`: the GET list routes with their filters,
sorts and pages, the searches, update bodies with keys left out and set to ``null``, the worker, span and resources
routes, and the refusals: an unsupported sort, an impossible page, a malformed filter) goes to ``agl store`` (the
reference, from the ``agentlightning==0.3.0`` wheel in its own interpreter) and to ``store serve`` on each backend,
and on Postgres to ``store serve --workers 2`` (consecutive requests land on different processes). Every answer
must match the reference's: the same status, and for a success every key with the same value. The differences we
keep on purpose are in ``docs/reference/agent-lightning-wire.md``; none of them is in this scenario.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.agl_rest_scenario import Answer, differences, play
from tests.integration.agl_servers import Served, reference_server, store_serve

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def reference_answers(agl_python: str, tmp_path_factory: pytest.TempPathFactory) -> list[Answer]:
    """The reference server's answers to the scenario (it is played once: the answers do not depend on ours)."""
    with reference_server(agl_python, tmp_path_factory.mktemp("agl")) as reference:
        return play(reference.url)


@pytest.fixture
def served_by(server_database: str, processes: int, tmp_path: Path) -> Iterator[Served]:
    with store_serve(server_database, tmp_path, "--workers", str(processes)) as running:
        yield running


@pytest.mark.parametrize(
    ("server_database", "processes"),
    [
        ("sqlite", 1),
        pytest.param("postgres", 1, marks=pytest.mark.postgres),
        pytest.param("postgres", 2, marks=pytest.mark.postgres),
    ],
    indirect=["server_database"],
)
def test_store_serve_answers_the_rest_scenario_as_agent_lightning_does(
    reference_answers: list[Answer], served_by: Served
) -> None:
    ours = play(served_by.url)

    problems = differences(reference_answers, ours, additions={})

    assert not problems, "\n".join(problems) + f"\n--- store serve log ---\n{served_by.log_tail()}"


@pytest.mark.parametrize("server_database", ["sqlite"], indirect=True)
def test_cors_origins_let_a_page_of_another_origin_read_the_api(server_database: str, tmp_path: Path) -> None:
    page = "http://127.0.0.1:5173"
    preflight_headers = {"Origin": page, "Access-Control-Request-Method": "GET"}
    with store_serve(server_database, tmp_path, "--cors-origin", page, "--token", "s3cret") as served:
        preflight = httpx.options(f"{served.url}/v1/agl/rollouts", headers=preflight_headers)
        listed = httpx.get(f"{served.url}/v1/agl/rollouts", headers={"Origin": page, "Authorization": "Bearer s3cret"})
        refused = httpx.get(f"{served.url}/v1/agl/rollouts", headers={"Origin": page})
        stranger = httpx.get(
            f"{served.url}/v1/agl/rollouts", headers={"Origin": "http://evil.test", "Authorization": "Bearer s3cret"}
        )

    assert preflight.status_code == 200, preflight.text  # answered without the token
    assert preflight.headers["access-control-allow-origin"] == page
    assert listed.status_code == 200 and listed.headers["access-control-allow-origin"] == page
    assert refused.status_code == 401 and refused.headers["access-control-allow-origin"] == page  # readable refusal
    assert "access-control-allow-origin" not in stranger.headers


@pytest.mark.parametrize("server_database", ["sqlite"], indirect=True)
def test_without_cors_origins_no_cors_headers_are_sent(server_database: str, tmp_path: Path) -> None:
    with store_serve(server_database, tmp_path) as served:
        answer = httpx.get(f"{served.url}/v1/agl/rollouts", headers={"Origin": "http://127.0.0.1:5173"})

    assert answer.status_code == 200
    assert not [name for name in answer.headers if name.startswith("access-control-")]

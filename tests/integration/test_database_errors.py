"""Which database errors are outages (503, retried) and which are not (500, logged): real engines, real errors."""

from __future__ import annotations

import asyncio
import logging
import socket
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from lightning_store.errors import DatabaseUnavailableError
from lightning_store.sql import open_store
from lightning_store.sql.engine import make_engine, unavailable_reason
from tests.conftest import serving


def refused_url() -> str:
    """A Postgres URL on a port where nothing listens."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"postgresql://postgres@127.0.0.1:{port}/store"


async def raised(url: str, statement: str = "SELECT 1") -> Exception:
    engine = make_engine(url)
    try:
        async with engine.connect() as conn:
            await conn.execute(sa.text(statement))
    except Exception as exc:
        return exc
    finally:
        await engine.dispose()
    raise AssertionError("no error")


async def test_outages_are_told_from_other_errors(tmp_path: Path) -> None:
    refused = unavailable_reason(await raised(refused_url()))
    assert refused is not None and refused.startswith("ConnectionRefusedError: ")
    unopenable = await raised(f"sqlite:///{tmp_path / 'missing' / 'store.db'}")
    assert unavailable_reason(unopenable) == "OperationalError: unable to open database file"
    # Not outages: the statement's fault, on a database that answers.
    assert unavailable_reason(await raised(f"sqlite:///{tmp_path / 'store.db'}", "SELECT * FROM nothing")) is None
    assert unavailable_reason(await raised(f"sqlite:///{tmp_path / 'store.db'}", "SELEC 1")) is None
    assert unavailable_reason(KeyError("rollout_id")) is None


async def test_the_store_raises_an_outage_as_database_unavailable(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="lightning_store")
    store = await open_store(refused_url(), watchdog_interval=0.05)
    try:
        with pytest.raises(DatabaseUnavailableError, match="ConnectionRefusedError") as raised_by_read:
            await store.get_rollout_by_id("ro-1")
        assert isinstance(raised_by_read.value.__cause__, ConnectionRefusedError)
        with pytest.raises(DatabaseUnavailableError, match="ConnectionRefusedError"):
            await store.enqueue_rollout({"q": 1})
        with pytest.raises(DatabaseUnavailableError):
            await store.check_database(timeout=1)
        await asyncio.sleep(0.5)  # ten watchdog rounds
    finally:
        await store.close()
    watchdog = [r for r in caplog.records if r.name == "lightning_store.sql.watchdog"]
    assert [(r.levelno, r.exc_info) for r in watchdog] == [(logging.WARNING, None)]
    assert "cannot reach the database (ConnectionRefusedError" in watchdog[0].getMessage()
    listener = [r for r in caplog.records if r.name == "lightning_store.sql.notify"]
    assert len(listener) <= 1  # once per outage, however often it retries


async def test_a_database_error_that_is_no_outage_is_a_logged_500(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A store over a database without its tables: every statement fails, and that is no reason to retry."""
    store = await open_store(f"sqlite:///{tmp_path / 'store.db'}", migrate=False, watchdog=False)
    try:
        async with serving(store) as url, httpx.AsyncClient(base_url=url, timeout=30) as http:
            assert (await http.get("/v1/agl/health")).json() == {"status": "ok", "database": "ok"}
            answer = await http.get("/v1/agl/rollouts/ro-1")
    finally:
        await store.close()
    assert answer.status_code == 500
    assert answer.json() == {"detail": "internal server error", "field": None, "error_type": "DatabaseError"}
    logged = [r for r in caplog.records if r.name == "lightning_store.server.app"]
    assert len(logged) == 1 and logged[0].levelno == logging.ERROR and logged[0].exc_info is not None
    assert "no such table" in str(logged[0].exc_info[1])

"""The proxy's call records outlive a database outage: a Postgres restart (seen on the fault cluster, where two
calls answered during one were lost) costs no record; only a server that stops gives up on them, in its bound."""

from __future__ import annotations

import asyncio

import pytest

from lightning_store.models import AttemptedRollout
from lightning_store.server.recorder import CallRecorder
from lightning_store.sql import open_store
from tests.integration.test_call_recorder import record
from tests.network import network_to

pytestmark = pytest.mark.parametrize(
    "database_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)


async def test_records_made_during_an_outage_are_written_when_the_database_is_back(database_url: str) -> None:
    network, url = await network_to(database_url)
    store = await open_store(url, watchdog_interval=0)
    try:
        rollout: AttemptedRollout = await store.start_rollout({"i": 1})
        ids = rollout.rollout_id, rollout.attempt.attempt_id
        recorder = CallRecorder(store)
        await network.down()  # the database host restarts: every connection cut, new ones refused
        recorder.add(record(*ids, "s1"))
        recorder.add(record(*ids, "s2"))
        await asyncio.sleep(1.5)
        await network.up()
        await asyncio.wait_for(recorder.settled(ids[1]), timeout=10)  # the attempt's end waits for them
        assert sorted(str(c.span_id) for c in await store.query_llm_calls([ids[0]])) == ["s1", "s2"]
        assert (recorder.counts.recorded, recorder.counts.lost) == (2, 0)

        await network.down()
        recorder.add(record(*ids, "s3"))
        await asyncio.sleep(0.3)
        started = asyncio.get_running_loop().time()
        await recorder.close()  # a server stopping does not wait out the outage
        assert asyncio.get_running_loop().time() - started < 2.0
        assert recorder.counts.lost == 1
    finally:
        await network.up()
        await store.close()
        await network.down()

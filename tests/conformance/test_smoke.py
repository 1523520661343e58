from lightning_store.contract import LightningStore


async def test_enqueue_then_dequeue_claims_the_rollout(store: LightningStore) -> None:
    rollout = await store.enqueue_rollout({"question": "2+2"})
    claimed = await store.dequeue_rollout(worker_id="w1")
    assert claimed is not None
    assert claimed.rollout_id == rollout.rollout_id
    assert claimed.status == "preparing"
    assert claimed.attempt.sequence_id == 1
    assert await store.dequeue_rollout() is None

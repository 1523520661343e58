"""The prompt cache's bookkeeping: least recently used entries go first once the byte budget is exceeded, the
longest kept proper prefix of a prompt is found (and a dropped one is not), an entry larger than the whole budget
is not kept, and stacking entries left-pads them like a batched prefill."""

from __future__ import annotations

import torch

from algorithms.serving.prompt_cache import PrefilledPrompt, PromptCache, stack


def entry(length: int, fill: float = 1.0) -> PrefilledPrompt:
    """Two layers, 2 heads of size 4, a vocabulary of 8: 2 * 2 * (2 * length * 4) + 8 floats."""
    layer = torch.full((2, length, 4), fill)
    return PrefilledPrompt((layer, layer.clone()), (layer.clone(), layer.clone()), torch.full((8,), fill))


def test_the_least_recently_used_entries_go_first_beyond_the_budget() -> None:
    size = entry(3).nbytes
    assert size == (4 * 2 * 3 * 4 + 8) * 4
    cache = PromptCache(max_bytes=2 * size)
    cache.put((1,), entry(3))
    cache.put((2,), entry(3))
    assert cache.get((1,)) is not None  # (2,) is now the least recently used
    cache.put((3,), entry(3))
    assert cache.get((2,)) is None and cache.get((1,)) is not None and cache.get((3,)) is not None
    assert (len(cache), cache.nbytes, cache.hits, cache.misses) == (2, 2 * size, 3, 1)
    cache.put((1,), entry(3, 2.0))  # replacing an entry counts its bytes once
    assert cache.nbytes == 2 * size
    cache.clear()
    assert (len(cache), cache.nbytes) == (0, 0)


def test_the_longest_kept_proper_prefix_is_found_and_dropped_ones_are_not() -> None:
    cache = PromptCache(max_bytes=entry(3).nbytes + entry(4).nbytes)
    cache.put((1, 2), entry(2, 1.0))
    cache.put((1, 2, 3), entry(3, 2.0))
    cache.put((9, 9, 9, 9), entry(4, 3.0))  # pushes (1, 2) out: the budget holds the last two only
    assert len(cache) == 2
    found = cache.longest_prefix((1, 2, 3, 4))
    assert found is not None and found.logits[0] == 2.0
    assert cache.longest_prefix((1, 2, 5)) is None  # (1, 2) was dropped
    assert cache.longest_prefix((1, 2, 3)) is None  # only proper prefixes
    assert (cache.prefix_hits, cache.reused_tokens) == (1, 3)
    cache.clear()
    assert cache.longest_prefix((9, 9, 9, 9, 1)) is None


def test_an_entry_larger_than_the_budget_is_not_kept() -> None:
    cache = PromptCache(max_bytes=entry(3).nbytes)
    cache.put((1,), entry(3))
    cache.put((2,), entry(4))
    assert cache.get((2,)) is None and cache.get((1,)) is not None


def test_stacked_entries_are_left_padded_with_their_masks_positions_and_logits() -> None:
    kv, attention, positions, logits = stack([entry(2, 1.0), entry(4, 2.0)])
    keys = kv.layers[0].keys
    assert keys.shape == (2, 2, 4, 4)
    assert torch.equal(keys[0, :, :2], torch.zeros(2, 2, 4)) and torch.equal(keys[0, :, 2:], torch.ones(2, 2, 4))
    assert torch.equal(keys[1], torch.full((2, 4, 4), 2.0))
    assert attention.tolist() == [[0, 0, 1, 1], [1, 1, 1, 1]]
    assert positions.tolist() == [[1], [3]]
    assert logits.shape == (2, 8) and logits[1, 0] == 2.0

"""Prefilled prompts kept for reuse, so that a prompt sent many times is prefilled once.

GRPO samples G completions of every prompt, and an agent's next turn repeats its conversation so far: without reuse
the policy server would prefill each prompt G times, and each turn's history again (vLLM avoids the same waste with
its automatic prefix caching, by blocks of tokens). An entry holds what prefilling a prompt yields: every layer's
keys and values and the logits at its last position, from which each request then samples its own first token; a
prompt that begins with an entry's prompt runs only the tokens after it. Entries are valid only for the weights
that computed them, so the server clears the cache whenever its weights change. The least recently used entries are
dropped once the entries together exceed ``max_bytes``.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

Prompt = tuple[int, ...]


@dataclass(frozen=True)
class PrefilledPrompt:
    """One prompt's prefill: per layer, keys and values of shape [heads, length, head_dim]; ``logits`` [vocab]."""

    keys: tuple[torch.Tensor, ...]
    values: tuple[torch.Tensor, ...]
    logits: torch.Tensor

    @classmethod
    def from_batch(cls, cache: Any, row: int, attention: torch.Tensor, logits: torch.Tensor) -> PrefilledPrompt:
        """Row ``row`` of a batch's cache: the positions its ``attention`` mask row marks (the batch pads rows
        on the left, and between a reused prefix and the rest). Copied out of the batch's tensors, so that
        keeping the entry does not keep the whole batch."""
        columns = attention.nonzero().squeeze(-1)
        keys = tuple(layer.keys[row].index_select(1, columns) for layer in cache.layers)
        values = tuple(layer.values[row].index_select(1, columns) for layer in cache.layers)
        return cls(keys, values, logits.clone())

    def empty(self) -> PrefilledPrompt:
        """A prefill of no tokens, shaped like this one: the prefix of a prompt that reuses none."""
        return PrefilledPrompt(tuple(k[:, :0] for k in self.keys), tuple(v[:, :0] for v in self.values), self.logits)

    @property
    def length(self) -> int:
        return int(self.keys[0].shape[1])

    @property
    def nbytes(self) -> int:
        tensors = [*self.keys, *self.values, self.logits]
        return sum(t.numel() * t.element_size() for t in tensors)


class PromptCache:
    """Prefilled prompts by token ids, least recently used dropped first beyond ``max_bytes``."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must not be negative")
        self.max_bytes = max_bytes
        self.nbytes = 0
        self.hits = 0
        """Prompts found whole."""
        self.misses = 0
        """Prompts not found whole (prefilled, all of them or what follows a kept prefix)."""
        self.prefix_hits = 0
        """Prompts not found whole that began with a kept one."""
        self.reused_tokens = 0
        """Prompt tokens taken from kept prefills instead of being run through the model."""
        self._entries: OrderedDict[Prompt, PrefilledPrompt] = OrderedDict()
        self._lengths: Counter[int] = Counter()  # of the kept prompts, for the prefix lookup

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, prompt: Prompt) -> PrefilledPrompt | None:
        entry = self._entries.get(prompt)
        if entry is None:
            self.misses += 1
            return None
        self.hits += 1
        self.reused_tokens += len(prompt)
        self._entries.move_to_end(prompt)
        return entry

    def longest_prefix(self, prompt: Prompt) -> PrefilledPrompt | None:
        """The kept prompt that is the longest proper prefix of ``prompt`` (a conversation's earlier turn): one
        lookup per length of the kept prompts, longest first, rather than a comparison per entry (a tiny model's
        entries are small enough for a budget to hold hundreds of thousands)."""
        for length in sorted((n for n in self._lengths if n < len(prompt)), reverse=True):
            entry = self._entries.get(prefix := prompt[:length])
            if entry is not None:
                self.prefix_hits += 1
                self.reused_tokens += length
                self._entries.move_to_end(prefix)
                return entry
        return None

    def put(self, prompt: Prompt, entry: PrefilledPrompt) -> None:
        """Keep ``entry`` (not if it alone exceeds the budget), dropping the least recently used beyond it."""
        if entry.nbytes > self.max_bytes:
            return
        if (old := self._entries.pop(prompt, None)) is not None:
            self._forget(prompt, old)
        self._entries[prompt] = entry
        self.nbytes += entry.nbytes
        self._lengths[len(prompt)] += 1
        while self.nbytes > self.max_bytes:
            self._forget(*self._entries.popitem(last=False))

    def _forget(self, prompt: Prompt, entry: PrefilledPrompt) -> None:
        """Account for an entry taken out of ``_entries``."""
        self.nbytes -= entry.nbytes
        self._lengths[len(prompt)] -= 1
        if not self._lengths[len(prompt)]:
            del self._lengths[len(prompt)]

    def clear(self) -> None:
        """Forget every entry (the weights changed)."""
        self._entries.clear()
        self._lengths.clear()
        self.nbytes = 0


def stack(entries: Sequence[PrefilledPrompt]) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A batch of prefilled prompts as a fresh prefill would return it: the key/value cache (rows left-padded to
    the longest), the attention mask, each row's last position ([B, 1]; -1 for an empty entry) and its last
    logits ([B, vocab])."""
    from transformers import DynamicCache

    width = max(entry.length for entry in entries)
    layers = []
    for layer in range(len(entries[0].keys)):
        keys = torch.stack([left_pad(entry.keys[layer], width, dim=1) for entry in entries])
        values = torch.stack([left_pad(entry.values[layer], width, dim=1) for entry in entries])
        layers.append((keys, values))
    attention = torch.zeros((len(entries), width), dtype=torch.long)
    for row, entry in enumerate(entries):
        attention[row, width - entry.length :] = 1
    positions = torch.tensor([[entry.length - 1] for entry in entries], dtype=torch.long)
    logits = torch.stack([entry.logits for entry in entries])
    return DynamicCache(ddp_cache_data=layers), attention, positions, logits


def left_pad(tensor: torch.Tensor, width: int, *, dim: int) -> torch.Tensor:
    """``tensor`` zero-padded on the left of axis ``dim`` to ``width`` (unchanged when already as wide)."""
    missing = width - tensor.shape[dim]
    if missing <= 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)

"""Batched sampling for the policy server: several requests decoded together, one forward pass per token.

The prompts of concurrent requests are left-padded into one batch (attention mask and position ids make the
padding invisible to the model), and each decoding step runs the model once on the newest token of every row,
reusing the key/value cache. Each row keeps its own sampling settings (temperature, top-p, token limit, seed)
and stops on its own, at an end-of-sequence token or its limit; finished rows leave the batch (and the cache),
so a short request does not pay for a long one beside it.

Log-probabilities are those of the raw logits, before temperature and top-p, as vLLM reports them: the
quantity a trainer recomputes as the behaviour policy's.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch


class SamplingError(ValueError):
    """A request's sampling settings are invalid; ``field`` names the one that is wrong."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True)
class SamplingRequest:
    prompt_token_ids: Sequence[int]
    max_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None

    @classmethod
    def from_body(cls, prompt_token_ids: Sequence[int], body: Mapping[str, Any]) -> SamplingRequest:
        """The settings of an OpenAI-style request body; :class:`SamplingError` names a wrong field."""
        field = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
        max_tokens = _number(body, field, int, default=64)
        if max_tokens < 1:
            raise SamplingError(field, "must be at least 1")
        temperature = _number(body, "temperature", float, default=1.0)
        if temperature < 0:
            raise SamplingError("temperature", "must not be negative")
        top_p = _number(body, "top_p", float, default=1.0)
        if not 0 < top_p <= 1:
            raise SamplingError("top_p", "must be in (0, 1]")
        seed = body.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise SamplingError("seed", "must be an integer")
        return cls(list(prompt_token_ids), max_tokens, temperature, top_p, seed)


def _number(body: Mapping[str, Any], field: str, kind: type[int] | type[float], *, default: float) -> Any:
    value = body.get(field)
    if value is None:
        return kind(default)
    if isinstance(value, bool) or not isinstance(value, int | float) or (kind is int and not float(value).is_integer()):
        raise SamplingError(field, f"must be {'an integer' if kind is int else 'a number'}, not {value!r}")
    return kind(value)


@dataclass
class Generation:
    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str


def generate_batch(
    model: Any, requests: Sequence[SamplingRequest], *, stop_token_ids: Collection[int], pad_token_id: int
) -> list[Generation]:
    """Decode every request to its end; the results are in the order of ``requests``."""
    with torch.no_grad():
        return _Decoder(model, requests, stop_token_ids, pad_token_id).run()


class _Decoder:
    def __init__(
        self, model: Any, requests: Sequence[SamplingRequest], stop_token_ids: Collection[int], pad_token_id: int
    ) -> None:
        self.model, self.requests, self.stop = model, requests, set(stop_token_ids)
        lengths = [len(r.prompt_token_ids) for r in requests]
        width = max(lengths)
        self.input_ids = torch.full((len(requests), width), pad_token_id, dtype=torch.long)
        self.attention = torch.zeros((len(requests), width), dtype=torch.long)
        for row, (request, length) in enumerate(zip(requests, lengths, strict=True)):
            self.input_ids[row, width - length :] = torch.tensor(list(request.prompt_token_ids), dtype=torch.long)
            self.attention[row, width - length :] = 1
        self.positions = (self.attention.cumsum(-1) - 1).clamp(min=0)
        self.active = list(range(len(requests)))  # request index of each row still in the batch
        self.temperature = torch.tensor([r.temperature for r in requests], dtype=torch.float32)
        self.top_p = torch.tensor([r.top_p for r in requests], dtype=torch.float32)
        self.generators = [None if r.seed is None else torch.Generator().manual_seed(r.seed) for r in requests]
        self.tokens: list[list[int]] = [[] for _ in requests]
        self.logprobs: list[list[float]] = [[] for _ in requests]
        self.finish = ["length"] * len(requests)

    def run(self) -> list[Generation]:
        # The prefill: only the last column's logits are sampled from (all of them, [B, L, V], came to 10 GB for
        # 128 few-shot prompts of SmolLM2).
        out = self.model(
            input_ids=self.input_ids,
            attention_mask=self.attention,
            position_ids=self.positions,
            use_cache=True,
            logits_to_keep=1,
        )
        cache, positions = out.past_key_values, self.positions[:, -1:] + 1
        while True:
            logits = out.logits[:, -1, :].float()
            chosen = self._sample(logits)
            chosen_logprobs = torch.log_softmax(logits, dim=-1).gather(1, chosen[:, None]).squeeze(1)
            keep = []
            for row, index in enumerate(self.active):
                token = int(chosen[row])
                self.tokens[index].append(token)
                self.logprobs[index].append(float(chosen_logprobs[row]))
                if token in self.stop:
                    self.finish[index] = "stop"
                elif len(self.tokens[index]) < self.requests[index].max_tokens:
                    keep.append(row)
            if not keep:
                break
            if len(keep) < len(self.active):  # drop the finished rows from every per-row tensor and the cache
                rows = torch.tensor(keep)
                cache.batch_select_indices(rows)
                self.attention, positions, chosen = self.attention[rows], positions[rows], chosen[rows]
                self.temperature, self.top_p = self.temperature[rows], self.top_p[rows]
                self.active = [self.active[row] for row in keep]
            self.attention = torch.cat([self.attention, torch.ones((len(self.active), 1), dtype=torch.long)], dim=1)
            out = self.model(
                input_ids=chosen[:, None],
                attention_mask=self.attention,
                position_ids=positions,
                past_key_values=cache,
                use_cache=True,
            )
            cache, positions = out.past_key_values, positions + 1
        return [
            Generation(list(r.prompt_token_ids), self.tokens[i], self.logprobs[i], self.finish[i])
            for i, r in enumerate(self.requests)
        ]

    def _sample(self, logits: torch.Tensor) -> torch.Tensor:
        """One token per row: greedy where the temperature is 0, else from softmax(logits / T) cut to top-p."""
        probs = torch.softmax(logits / self.temperature.clamp(min=1e-6)[:, None], dim=-1)
        order = None
        if bool((self.top_p < 1).any()):
            probs, order = probs.sort(dim=-1, descending=True)
            # keep the smallest prefix whose mass reaches top_p (the first token always stays)
            probs = probs * ((probs.cumsum(-1) - probs) < self.top_p[:, None])
        chosen = []
        for row, index in enumerate(self.active):
            if self.requests[index].temperature == 0:
                chosen.append(int(logits[row].argmax()))
                continue
            pick = int(torch.multinomial(probs[row], 1, generator=self.generators[index]))
            chosen.append(pick if order is None else int(order[row, pick]))
        return torch.tensor(chosen, dtype=torch.long)

"""Batched sampling for the policy server: several requests decoded together, one forward pass per token.

The prompts of concurrent requests are left-padded into one batch (attention mask and position ids make the
padding invisible to the model), and each decoding step runs the model once on the newest token of every row,
reusing the key/value cache. Each row keeps its own sampling settings (temperature, top-p, token limit, seed)
and stops on its own, at an end-of-sequence token or its limit; finished rows leave the batch (and the cache),
so a short request does not pay for a long one beside it, and new requests join a running batch between two
tokens (:class:`Decoder`), so one that arrives just after a batch started does not wait for all of it. Prompts
prefilled before are reused rather than run again (:mod:`algorithms.serving.prompt_cache`).

Log-probabilities are those of the raw logits, before temperature and top-p, as vLLM reports them: the
quantity a trainer recomputes as the behaviour policy's.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch

from algorithms.serving.prompt_cache import PrefilledPrompt, Prompt, PromptCache, left_pad, stack


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
    stopped: Callable[[Sequence[int]], bool] | None = None
    """Whether the tokens generated so far end the generation (a stop string in their text); checked after each
    token, beside the stop tokens."""

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
    model: Any,
    requests: Sequence[SamplingRequest],
    *,
    stop_token_ids: Collection[int],
    pad_token_id: int,
    prompts: PromptCache | None = None,
) -> list[Generation]:
    """Decode every request to its end (reusing prefills from ``prompts``); the results are in the order of
    ``requests``."""
    decoder = Decoder(model, stop_token_ids, pad_token_id, prompts)
    results: dict[int, Generation] = {}
    with torch.no_grad():
        finished = decoder.admit(list(enumerate(requests)))
        while True:
            results.update(finished)
            if not decoder.rows:
                break
            finished = decoder.step()
    return [results[i] for i in range(len(requests))]


def cache_keyword(model: Any) -> str:
    """The name under which ``model``'s forward takes and returns its key/value cache: ``cache`` from transformers
    5.24 (where ``past_key_values`` still works but warns that it will go), ``past_key_values`` before."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # a PEFT model's forward is **kwargs
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


class Decoder:
    """A batch being decoded that new requests can join between two tokens (continuous batching).

    :meth:`admit` prefills new requests (left-padded among themselves) and merges their key/value cache into the
    running batch's, left-padding whichever is shorter (the attention mask hides the padding; each row keeps its
    own positions). :meth:`step` feeds every row its last sampled token. Both return the generations that
    ended, by the key they were admitted with. Call them under ``torch.no_grad()``.
    """

    def __init__(
        self, model: Any, stop_token_ids: Collection[int], pad_token_id: int, prompts: PromptCache | None = None
    ) -> None:
        self.model, self.stop, self.pad = model, set(stop_token_ids), pad_token_id
        self.cache_keyword = cache_keyword(model)
        self.prompts = prompts
        """Where prefilled prompts are reused from (None: every request is prefilled). Its owner clears it when
        the model's weights change."""
        self._empty()

    def _empty(self) -> None:
        self.rows: list[_Row] = []
        self.cache: Any = None
        self.attention = torch.zeros((0, 0), dtype=torch.long)
        self.positions = torch.zeros((0, 1), dtype=torch.long)  # of each row's last fed token
        self.next_tokens = torch.zeros((0,), dtype=torch.long)  # each row's sampled token, fed by the next step

    def can_join(self) -> bool:
        """Whether requests can join the running batch: an empty batch, or a cache of plain dynamic layers
        (other caches, and transformers before 5, decode each admitted batch to its end)."""
        return not self.rows or _plain_dynamic(self.cache)

    def admit(self, requests: Sequence[tuple[Any, SamplingRequest]]) -> dict[Any, Generation]:
        """Prefill ``(key, request)`` pairs and sample their first tokens; they join the batch."""
        if not requests:
            return {}
        prompts = [tuple(request.prompt_token_ids) for _, request in requests]
        cache, attention, positions, logits = (
            self._prefill_cached(prompts) if self.prompts is not None else self._prefill(prompts)
        )
        new_rows = [_Row(key, request) for key, request in requests]
        if self.rows:
            self._merge(cache, attention, new_rows)
        else:
            self.cache, self.attention, self.rows = cache, attention, new_rows
        first = len(self.rows) - len(new_rows)
        self.positions = torch.cat([self.positions, positions])
        self.next_tokens = torch.cat([self.next_tokens, torch.zeros(len(new_rows), dtype=torch.long)])
        return self._sample_and_retire(logits, range(first, len(self.rows)))

    def _prefill(
        self, prompts: Sequence[Prompt], prefixes: Sequence[PrefilledPrompt] | None = None
    ) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Run the model on ``prompts``, left-padded into one batch: its key/value cache, attention mask, each
        row's last position ([B, 1]) and last logits ([B, vocab]). With ``prefixes`` (a prefill of each prompt's
        first tokens, possibly empty), only the rest of each prompt is run, after the prefixes' cache; a row's
        padding then also sits between its prefix and its rest, where the mask hides it as well."""
        done = [entry.length for entry in prefixes] if prefixes else [0] * len(prompts)
        rests = [prompt[n:] for prompt, n in zip(prompts, done, strict=True)]
        width = max(len(rest) for rest in rests)
        input_ids = torch.full((len(prompts), width), self.pad, dtype=torch.long)
        attention = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, rest in enumerate(rests):
            input_ids[row, width - len(rest) :] = torch.tensor(rest, dtype=torch.long)
            attention[row, width - len(rest) :] = 1
        past = None
        if prefixes:
            past, prefix_attention, _, _ = stack(prefixes)
            attention = torch.cat([prefix_attention, attention], dim=1)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)[:, -width:]
        # Only the last column's logits are sampled from (all of them, [B, L, V], came to 10 GB for 128
        # few-shot prompts of SmolLM2).
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **{self.cache_keyword: past},
        )
        return out[self.cache_keyword], attention, positions[:, -1:], out.logits[:, -1, :].float()

    def _prefill_cached(self, prompts: Sequence[Prompt]) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`_prefill`, running the model only on the distinct prompts that are not in the prompt cache,
        and for those only on what follows the longest kept prompt they begin with (an earlier turn)."""
        assert self.prompts is not None
        found = {prompt: self.prompts.get(prompt) for prompt in dict.fromkeys(prompts)}
        missing = [prompt for prompt, entry in found.items() if entry is None]
        if missing:
            prefixes = [self.prompts.longest_prefix(prompt) for prompt in missing]
            template = next((entry for entry in prefixes if entry is not None), None)
            prefilled = self._prefill(
                missing, None if template is None else [entry or template.empty() for entry in prefixes]
            )
            cache, attention, _, logits = prefilled
            if not _plain_dynamic(cache):
                self.prompts = None  # other cache layers (sliding windows, transformers 4) are not reused
                return prefilled if len(missing) == len(prompts) else self._prefill(prompts)
            for row, prompt in enumerate(missing):
                found[prompt] = entry = PrefilledPrompt.from_batch(cache, row, attention[row], logits[row])
                self.prompts.put(prompt, entry)
        return stack([cast(PrefilledPrompt, found[prompt]) for prompt in prompts])

    def step(self) -> dict[Any, Generation]:
        """One token for every row of the batch."""
        self.attention = torch.cat([self.attention, torch.ones((len(self.rows), 1), dtype=torch.long)], dim=1)
        self.positions = self.positions + 1
        out = self.model(
            input_ids=self.next_tokens[:, None],
            attention_mask=self.attention,
            position_ids=self.positions,
            use_cache=True,
            **{self.cache_keyword: self.cache},
        )
        self.cache = out[self.cache_keyword]
        return self._sample_and_retire(out.logits[:, -1, :].float(), range(len(self.rows)))

    def _merge(self, cache: Any, attention: torch.Tensor, new_rows: list[_Row]) -> None:
        """Appends prefilled rows to the batch: both caches (and masks) left-padded to the longer one."""
        width = max(self.attention.shape[1], attention.shape[1])
        for old, new in zip(self.cache.layers, cache.layers, strict=True):
            old.keys, new_keys = left_pad(old.keys, width, dim=2), left_pad(new.keys, width, dim=2)
            old.values, new_values = left_pad(old.values, width, dim=2), left_pad(new.values, width, dim=2)
            old.keys, old.values = torch.cat([old.keys, new_keys]), torch.cat([old.values, new_values])
        self.attention = torch.cat([left_pad(self.attention, width, dim=1), left_pad(attention, width, dim=1)])
        self.rows = [*self.rows, *new_rows]

    def _sample_and_retire(self, logits: torch.Tensor, rows: range) -> dict[Any, Generation]:
        """Samples a token for ``rows`` (indices into the batch; ``logits`` has one line per row in ``rows``),
        then drops every row that ended from the batch and its cache; the generations that ended."""
        requests = [self.rows[i].request for i in rows]
        chosen = _sample(logits, requests, [self.rows[i].generator for i in rows])
        chosen_logprobs = torch.log_softmax(logits, dim=-1).gather(1, chosen[:, None]).squeeze(1)
        ended: dict[Any, Generation] = {}
        for offset, index in enumerate(rows):
            row, token = self.rows[index], int(chosen[offset])
            row.tokens.append(token)
            row.logprobs.append(float(chosen_logprobs[offset]))
            if token in self.stop or (row.request.stopped is not None and row.request.stopped(row.tokens)):
                row.finish = "stop"
            elif len(row.tokens) < row.request.max_tokens:
                continue
            ended[row.key] = Generation(list(row.request.prompt_token_ids), row.tokens, row.logprobs, row.finish)
        self.next_tokens[rows.start : rows.stop] = chosen
        if ended:
            keep = [i for i, row in enumerate(self.rows) if row.key not in ended]
            if not keep:
                self._empty()
            else:
                self.rows = [self.rows[i] for i in keep]
                kept = torch.tensor(keep)
                self.cache.batch_select_indices(kept)
                self.attention, self.positions = self.attention[kept], self.positions[kept]
                self.next_tokens = self.next_tokens[kept]
        return ended


@dataclass
class _Row:
    key: Any
    request: SamplingRequest
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: str = "length"
    generator: torch.Generator | None = None

    def __post_init__(self) -> None:
        if self.request.seed is not None:
            self.generator = torch.Generator().manual_seed(self.request.seed)


def _plain_dynamic(cache: Any) -> bool:
    """Whether ``cache`` is made of transformers 5's plain dynamic layers, the ones rows can be merged into."""
    layers: list[Any] = getattr(cache, "layers", None) or []
    return bool(layers) and all(type(layer).__name__ == "DynamicLayer" for layer in layers)


def _sample(
    logits: torch.Tensor, requests: Sequence[SamplingRequest], generators: Sequence[torch.Generator | None]
) -> torch.Tensor:
    """One token per row: greedy where the temperature is 0, else from softmax(logits / T) cut to top-p."""
    temperature = torch.tensor([r.temperature for r in requests], dtype=torch.float32)
    top_p = torch.tensor([r.top_p for r in requests], dtype=torch.float32)
    probs = torch.softmax(logits / temperature.clamp(min=1e-6)[:, None], dim=-1)
    order = None
    if bool((top_p < 1).any()):
        probs, order = probs.sort(dim=-1, descending=True)
        # keep the smallest prefix whose mass reaches top_p (the first token always stays)
        probs = probs * ((probs.cumsum(-1) - probs) < top_p[:, None])
    chosen = []
    for row, request in enumerate(requests):
        if request.temperature == 0:
            chosen.append(int(logits[row].argmax()))
            continue
        pick = int(torch.multinomial(probs[row], 1, generator=generators[row]))
        chosen.append(pick if order is None else int(order[row, pick]))
    return torch.tensor(chosen, dtype=torch.long)

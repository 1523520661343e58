"""The policy being trained, on transformers: batching of transitions, per-token log-probabilities, a frozen
reference policy for the KL term, an optional value head (PPO) and optional LoRA (peft).

A transition is one LLM call, so a row is ``prompt ids + response ids`` with nothing masked inside: the
response tokens are exactly the positions whose log-probabilities are trained. A row may also hold several calls
of one conversation whose prompts extend each other (:mod:`algorithms.training.packing`): each call's response
tokens are then read at their own positions, and the results are still one row per call.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

VALUE_HEAD_FILE = "value_head.pt"
ADAPTER_DIR = "adapter"


@dataclass
class TokenBatch:
    """Rows of ``prompt + response`` aligned so that every prompt ends at the same column ``P``: prompts padded
    on the left, responses on the right. ``position_ids`` count real tokens only (a row's padding does not shift
    its rotary positions). A row may hold several calls of one conversation (:mod:`algorithms.training.packing`):
    its tokens are its last call's prompt + response and every earlier call's prompt + response is a prefix of
    them. Per call (``C`` of them, rows' calls in order): ``response_ids`` and ``response_mask`` ``[C, T]`` (1 on
    real response tokens), and the ``row`` ``[C]`` and ``columns`` ``[C, T]`` whose logits predict each response
    token (a padding token points at a real column of its call, masked out).

    Why aligned: when every row holds one call (``aligned``), column ``P - 1 + t`` predicts response token ``t``
    in every row, the logits of the response tokens are the last ``T + 1`` columns, and the model computes the
    vocabulary projection for those alone (``logits_to_keep``), not for every prompt token.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    rows: torch.Tensor
    columns: torch.Tensor
    aligned: bool


Call = tuple[Sequence[int], Sequence[int]]
"""One call's ``(prompt_ids, response_ids)``."""


def token_batch(rows: Sequence[Call], pad_id: int) -> TokenBatch:
    """The :class:`TokenBatch` of ``(prompt_ids, response_ids)`` rows, one call each; every row needs a prompt
    token."""
    return packed_token_batch([[row] for row in rows], pad_id)


def packed_token_batch(rows: Sequence[Sequence[Call]], pad_id: int) -> TokenBatch:
    """The :class:`TokenBatch` of rows of calls (in call order): a row's tokens are its last call's; every call
    needs a prompt token, and an earlier call's prompt + response must be a prefix of its row's tokens."""
    calls = [call for row in rows for call in row]
    if any(not prompt for prompt, _ in calls):
        raise ValueError("a transition needs at least one prompt token")
    prompt_width = max(len(row[-1][0]) for row in rows)
    width = prompt_width + max(len(row[-1][1]) for row in rows)
    longest = max(len(r) for _, r in calls)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention = torch.zeros_like(input_ids)
    response_ids = torch.full((len(calls), longest), pad_id, dtype=torch.long)
    response_mask = torch.zeros((len(calls), longest))
    call_rows = torch.zeros(len(calls), dtype=torch.long)
    columns = torch.zeros((len(calls), longest), dtype=torch.long)
    steps = torch.arange(longest)
    c = 0
    for i, row in enumerate(rows):
        prompt, response = row[-1]
        tokens = [*prompt, *response]
        start = prompt_width - len(prompt)
        input_ids[i, start : start + len(tokens)] = torch.tensor(tokens)
        attention[i, start : start + len(tokens)] = 1
        for call_prompt, call_response in row:
            end = len(call_prompt) + len(call_response)
            if tokens[:end] != [*call_prompt, *call_response]:
                raise ValueError("a packed call's prompt + response must be a prefix of its row's tokens")
            response_ids[c, : len(call_response)] = torch.tensor(list(call_response), dtype=torch.long)
            response_mask[c, : len(call_response)] = 1
            call_rows[c] = i
            # The column before token t predicts it; padding tokens repeat the call's first column (masked out).
            first = start + len(call_prompt) - 1
            columns[c] = first + torch.where(steps < len(call_response), steps, 0)
            c += 1
    position_ids = (attention.cumsum(-1) - 1).clamp(min=0)
    aligned = all(len(row) == 1 for row in rows)
    return TokenBatch(input_ids, attention, position_ids, response_ids, response_mask, call_rows, columns, aligned)


@dataclass
class Forward:
    """Per response token: log-probabilities ``[B, T]``, logits ``[B, T, V]``, values ``[B, T]`` (or None)."""

    logprobs: torch.Tensor
    logits: torch.Tensor
    values: torch.Tensor | None


class TrainablePolicy:
    """A causal LM from ``model_dir`` with an AdamW optimizer, its frozen reference (when ``reference``), a
    value head (when ``value_head``) and LoRA adapters (when ``lora`` gives peft ``LoraConfig`` options).
    ``checkpoint`` (a directory :meth:`save` wrote) continues a run: its weights (or adapters) and value head
    are loaded, while ``model_dir`` stays the reference; :meth:`load_optimizer` restores the optimizer."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        learning_rate: float,
        reference: bool,
        value_head: bool = False,
        lora: dict[str, Any] | None = None,
        checkpoint: str | Path | None = None,
        weight_decay: float = 0.0,
    ) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        def load(directory: str | Path) -> Any:
            return AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)

        self.tokenizer: Any = AutoTokenizer.from_pretrained(model_dir)
        self.lora = lora is not None
        if lora is not None:  # the adapters go on the initial model, new or (resuming) the checkpoint's own
            adapters = None if checkpoint is None else Path(checkpoint) / ADAPTER_DIR
            model: Any = _with_lora(load(model_dir), lora, adapters)
        else:
            model = load(checkpoint if checkpoint is not None else model_dir)
        self.model: Any = model
        # The reference is always the initial model, also when resuming; with LoRA it is the base model with the
        # adapters switched off (no second copy).
        self.reference: Any = None
        if reference and not self.lora:
            self.reference = (load(model_dir) if checkpoint is not None else copy.deepcopy(model)).eval()
        self.uses_reference = reference
        if self.reference is not None:
            self.reference.requires_grad_(False)
        self.value_head: torch.nn.Linear | None = None
        if value_head:
            self.value_head = torch.nn.Linear(self.model.config.hidden_size, 1)
            torch.nn.init.zeros_(self.value_head.weight)
            torch.nn.init.zeros_(self.value_head.bias)
            head = Path(checkpoint if checkpoint is not None else model_dir) / VALUE_HEAD_FILE
            if head.exists():
                self.value_head.load_state_dict(torch.load(head, weights_only=True))
        params = [p for p in self.model.parameters() if p.requires_grad]
        if self.value_head is not None:
            params += list(self.value_head.parameters())
        self.optimizer = torch.optim.AdamW(params, lr=learning_rate, weight_decay=weight_decay)
        pad = self.tokenizer.pad_token_id
        self.pad_id: int = pad if pad is not None else (self.tokenizer.eos_token_id or 0)

    def forward(self, batch: TokenBatch, *, reference: bool = False) -> Forward:
        """Log-probabilities (and values) of the batch's response tokens under the policy or its reference, one
        row per call (:class:`TokenBatch`)."""
        want_values = self.value_head is not None and not reference
        width = batch.response_ids.shape[1]
        # Aligned rows: the logits of the last T + 1 columns (P-1 … P+T-1, see TokenBatch). Packed rows: the
        # columns any call needs, the same for every row (a 1-D ``logits_to_keep``), each call's then gathered.
        keep: int | torch.Tensor = width + 1 if batch.aligned else torch.unique(batch.columns)
        inputs = {
            "input_ids": batch.input_ids,
            "attention_mask": batch.attention_mask,
            "position_ids": batch.position_ids,
            "logits_to_keep": keep,
        }
        if reference and self.lora:
            with self.model.disable_adapter():
                out = self.model(**inputs)
        else:
            model = self.reference if reference else self.model
            out = model(**inputs, output_hidden_states=want_values)
        rows = batch.rows.unsqueeze(-1)
        if isinstance(keep, int):
            logits = out.logits[:, :-1].float()  # the last column predicts the token after the longest response
        else:
            logits = out.logits[rows, torch.searchsorted(keep, batch.columns)].float()
        logprobs = torch.log_softmax(logits, dim=-1).gather(-1, batch.response_ids.unsqueeze(-1)).squeeze(-1)
        values = None
        if want_values and self.value_head is not None:
            last = out.hidden_states[-1]
            hidden = last[:, -width - 1 : -1] if isinstance(keep, int) else last[rows, batch.columns]
            values = self.value_head(hidden.float()).squeeze(-1)
        return Forward(logprobs, logits, values)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The full model weights (LoRA merged in), as a policy server loads them."""
        if self.lora:
            merged: Any = copy.deepcopy(self.model).merge_and_unload()
            state: dict[str, torch.Tensor] = merged.state_dict()
            return state
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def save(self, directory: str | Path, *, optimizer: bool = True) -> Path:
        """Save a checkpoint that ``from_pretrained`` (and this class) loads: merged weights, tokenizer, value
        head, optimizer state (unless ``optimizer`` is False: a data-parallel trainer saves its own); with LoRA
        also the adapters alone in ``adapter/`` (what a resumed run loads on top of the base model, which stays
        its reference)."""
        target = Path(directory)
        target.mkdir(parents=True, exist_ok=True)
        if self.lora:
            self.model.save_pretrained(target / ADAPTER_DIR)
        model: Any = copy.deepcopy(self.model).merge_and_unload() if self.lora else self.model
        model.save_pretrained(target)
        self.tokenizer.save_pretrained(target)
        if self.value_head is not None:
            torch.save(self.value_head.state_dict(), target / VALUE_HEAD_FILE)
        if optimizer:
            torch.save(self.optimizer.state_dict(), target / "optimizer.pt")
        return target

    def load_optimizer(self, directory: str | Path) -> bool:
        """Restore the optimizer state saved with a checkpoint (resuming); False when there is none."""
        path = Path(directory) / "optimizer.pt"
        if not path.exists():
            return False
        self.optimizer.load_state_dict(torch.load(path, weights_only=True))
        return True


def _with_lora(model: Any, lora: dict[str, Any], adapter_dir: str | Path | None) -> Any:
    """``model`` with new LoRA adapters, or (resuming) with the ones saved in ``adapter_dir``."""
    from peft import LoraConfig, PeftModel, get_peft_model

    with warnings.catch_warnings():
        # peft 0.21 reads transformers 5's deprecated `is_gradient_checkpointing`; nothing for us to change
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        if adapter_dir is not None:
            return PeftModel.from_pretrained(model, adapter_dir, is_trainable=True)
        return get_peft_model(model, LoraConfig(**lora))

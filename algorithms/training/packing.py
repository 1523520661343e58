"""The LLM calls of one conversation packed into one sequence, so that a multi-turn episode trains at about the
cost of its longest call instead of the sum of all of them.

Why it is exact: an agent's later call usually sends the conversation so far, so its prompt is the previous
call's prompt and response followed by what came after (a tool result, the next user turn). A causal LM's
output at a position depends only on the tokens before it, so the sequence of a conversation's last call holds
every earlier call's prompt and response at the very positions their own sequences would: one forward pass over
it gives each call's response-token log-probabilities (and values) as separate passes would, up to
floating-point rounding. Each call stays one transition with its own advantages, old and reference
log-probabilities and loss terms (the paper's per-call credit assignment); packing changes the compute, not the
loss.

Contract of :func:`pack`:

- A *row* is a list of calls (indices into the transitions) whose sequence is its last call's prompt + response;
  the prompt + response of every call of a row is a prefix of it, exact in token ids.
- Calls are grouped by conversation (``rollout_id``, ``attempt_id``) and taken in call order (``step``). A call
  joins the row (of its conversation) whose sequence so far is a prefix of the call's prompt (the longest such
  one, so that two agents interleaving in one episode each grow their own row); else it starts a row of its own.
- A call that starts a row although it is not its conversation's first call is a *fallback*: its prompt does not
  extend any earlier call (history retokenized or edited, another agent's prompt); it is trained as a separate
  sequence, as without packing, and counted.
- With packing off every call is a row of its own, in the transitions' order (the behaviour before packing).

Packing is on by default; ``LightningRLConfig.pack_conversations`` (docs/reference/algorithms.md) turns it off for
a run, and :func:`algorithms.training.update.measure`, ``anchor`` and ``update`` take it as ``packing``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from adapters import Transition


@dataclass(frozen=True)
class Packing:
    """The rows of a batch of calls (see the module's contract) and how many calls were packed or fell back."""

    rows: list[list[int]]
    sequence_tokens: int
    """Tokens of the rows' sequences (each its last call's prompt + response), padding not counted."""
    packed_calls: int
    """Calls that share their row with at least one other call."""
    fallback_calls: int
    """Calls that are not their conversation's first and extend no earlier call's sequence."""

    def metrics(self) -> dict[str, float]:
        """The step metrics (``docs/reference/metrics.md``): ``packed_calls``, ``pack_fallback_calls``,
        ``train_sequences`` (rows: the sequences of a pass over the batch) and ``train_sequence_tokens``."""
        return {
            "packed_calls": float(self.packed_calls),
            "pack_fallback_calls": float(self.fallback_calls),
            "train_sequences": float(len(self.rows)),
            "train_sequence_tokens": float(self.sequence_tokens),
        }


def pack(transitions: Sequence[Transition], *, enabled: bool = True) -> Packing:
    """The rows of ``transitions``: each call its own row when not ``enabled``, else its conversation's calls
    packed (the module's contract). Rows come in the order of their first call in ``transitions``."""
    if not enabled:
        singles = [[i] for i in range(len(transitions))]
        return Packing(singles, _tokens(transitions, singles), packed_calls=0, fallback_calls=0)
    conversations: dict[tuple[str, str], list[int]] = {}
    for index, transition in enumerate(transitions):
        conversations.setdefault((transition.rollout_id, transition.attempt_id), []).append(index)
    rows: list[list[int]] = []
    fallbacks = 0
    for calls in conversations.values():
        calls.sort(key=lambda i: transitions[i].step)  # stable: equal steps keep the batch's order
        open_rows: list[tuple[list[int], list[int]]] = []  # (calls of the row, its sequence so far)
        for position, index in enumerate(calls):
            prompt = transitions[index].prompt_ids
            host = max(
                (row for row in open_rows if len(row[1]) <= len(prompt) and prompt[: len(row[1])] == row[1]),
                key=lambda row: len(row[1]),
                default=None,
            )
            sequence = [*prompt, *transitions[index].response_ids]
            if host is None:
                fallbacks += position > 0
                open_rows.append(([index], sequence))
            else:
                open_rows.remove(host)
                open_rows.append(([*host[0], index], sequence))
        rows += [row_calls for row_calls, _ in open_rows]
    rows.sort(key=min)
    packed = sum(len(row) for row in rows if len(row) > 1)
    return Packing(rows, _tokens(transitions, rows), packed_calls=packed, fallback_calls=fallbacks)


def _tokens(transitions: Sequence[Transition], rows: list[list[int]]) -> int:
    """The tokens of ``rows``' sequences: each row's last call's prompt + response."""
    return sum(len(transitions[row[-1]].prompt_ids) + len(transitions[row[-1]].response_ids) for row in rows)

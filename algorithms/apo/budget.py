"""What an APO run may spend and has spent: agent rollouts, optimizer calls and optimizer tokens.

The accounting is the store's: a rollout is charged when this run enqueued it (its ``metadata.apo_run``) and is
met for the first time by this process, so a (candidate, task) pair read back from the cache costs nothing twice,
a pair another run evaluated costs nothing at all, and a resumed run, which replays its search against the
store, charges exactly what the interrupted run had spent. ``apo_runs_v`` compares the two by SQL.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Budget:
    max_rollouts: int
    max_calls: int
    max_tokens: int | None = None
    rollouts: int = 0
    """Search rollouts (train and val splits) charged so far."""
    test_rollouts: int = 0
    """Rollouts of the held-out test report (outside ``max_rollouts``)."""
    calls: int = 0
    tokens: int = 0
    _charged: set[str] = field(default_factory=set)

    def new_charges(self, rollout_ids: list[str]) -> list[str]:
        """The ids of ``rollout_ids`` not charged yet (callers pass only this run's own rollouts)."""
        return [i for i in dict.fromkeys(rollout_ids) if i not in self._charged]

    def affords_rollouts(self, count: int) -> bool:
        return self.rollouts + count <= self.max_rollouts

    def charge_rollouts(self, rollout_ids: list[str], *, test: bool = False) -> None:
        fresh = self.new_charges(rollout_ids)
        self._charged.update(fresh)
        if test:
            self.test_rollouts += len(fresh)
        else:
            self.rollouts += len(fresh)

    def affords_calls(self, count: int) -> bool:
        """``count`` more optimizer calls may start: within the call budget, and tokens left (a call's size is
        unknown before it is made, so the last call may end past ``max_tokens`` by its own tokens)."""
        tokens_left = self.max_tokens is None or self.tokens < self.max_tokens
        return self.calls + count <= self.max_calls and tokens_left

    def charge_call(self, tokens: int) -> None:
        self.calls += 1
        self.tokens += tokens

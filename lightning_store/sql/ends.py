"""``end_attempts``: attempts' final statuses, each with the attempt's last spans, in one transaction.

A runner used to end an attempt with two requests: its tracer's last spans (``add_many_spans``), then the status.
An end may carry those spans (``AttemptEnd.spans``), one request and one transaction fewer per attempt: they are
stored in the end's transaction, numbered from their rollouts' span counters as ``allocate_sequence_ids`` numbers
spans (the counters are read with the lock the statuses take, and advanced in the statuses' update). A reader sees
the spans and the status together.

They are not heartbeats, as spans written on their own are: the end decides the attempt's status. They are stored
whether or not the end applied (an attempt that is no longer current keeps its spans, as a separate write would
have kept them); duplicates are ignored.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from lightning_store.errors import InvalidRequestError
from lightning_store.models import Attempt, AttemptEnd
from lightning_store.spans import Span
from lightning_store.sql import postgres_end, validate
from lightning_store.sql.attempt_ends import decide_ends, write_ends
from lightning_store.sql.spans import SpanOps, spans_json

MAX_ENDS = 1000
"""The most attempt ends one ``end_attempts`` call takes."""


class EndOps(SpanOps):
    async def end_attempts(self, ends: Sequence[AttemptEnd]) -> list[Attempt | None]:
        checked = [
            e if type(e) is AttemptEnd else validate.model(AttemptEnd, e, f"ends.{i}") for i, e in enumerate(ends)
        ]
        if len(checked) > MAX_ENDS:
            raise InvalidRequestError(f"ends: at most {MAX_ENDS} per call; got {len(checked)}", field="ends")
        if not checked:
            return []
        carried = _carried_spans(checked)
        async with self._write() as (conn, wakeups):
            ended, spans_, writes = await decide_ends(conn, wakeups, self.dialect, checked, carried, time.time())
            if self.is_sqlite:
                await write_ends(conn, self.dialect, writes)
                if spans_:
                    await self._insert(conn, spans_)
            else:  # the writes, the spans and the wake-ups in one statement
                topics = sorted(wakeups.topics)
                await postgres_end.write(conn, writes, spans_json(spans_, self.dialect), topics)
                wakeups.notified.update(topics)
        return ended


def _carried_spans(ends: Sequence[AttemptEnd]) -> list[Span]:
    """Every end's spans, in order; an ``InvalidRequestError`` naming the first that belongs to another attempt
    (``ends.2.spans.0.attempt_id``) before anything is written."""
    carried: list[Span] = []
    for i, end in enumerate(ends):
        for j, span in enumerate(end.spans or ()):
            if end.attempt_id == "latest":
                raise InvalidRequestError(
                    f"ends.{i}.spans: an end that carries spans must name its attempt, not 'latest'",
                    field=f"ends.{i}.spans",
                )
            for name in ("rollout_id", "attempt_id"):
                if getattr(span, name) != getattr(end, name):
                    field = f"ends.{i}.spans.{j}.{name}"
                    raise InvalidRequestError(f"{field}: must be the end's {name} {getattr(end, name)!r}", field=field)
            carried.append(span)
    return carried

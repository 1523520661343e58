"""Read-only span search across rollouts (``search_spans``), on every backend."""

from __future__ import annotations

import pytest

from lightning_store.contract import LightningStore
from lightning_store.errors import InvalidRequestError
from lightning_store.limits import MAX_MATCH_KEYS
from lightning_store.models import AttemptedRollout
from lightning_store.spans import Span, TraceStatus

TRACE = "0af7651916cd43dd8448eb211c80319c"


def span(
    rollout: AttemptedRollout,
    span_id: str,
    name: str,
    *,
    start: float,
    status: str = "UNSET",
    attributes: dict[str, object] | None = None,
) -> Span:
    return Span(
        rollout_id=rollout.rollout_id,
        attempt_id=rollout.attempt.attempt_id,
        sequence_id=int(span_id.removeprefix("s")),
        trace_id=TRACE,
        span_id=span_id,
        name=name,
        start_time=start,
        end_time=start + 1,
        status=TraceStatus(status_code=status),
        attributes=attributes or {},
    )


@pytest.fixture
async def three_rollouts(store: LightningStore) -> list[AttemptedRollout]:
    """Two training rollouts and one validation rollout with a mix of LLM, tool and reward spans."""
    train_a = await store.start_rollout({"q": "a"}, mode="train")
    train_b = await store.start_rollout({"q": "b"}, mode="train")
    val = await store.start_rollout({"q": "c"}, mode="val")
    await store.add_many_spans(
        [
            span(train_a, "s1", "openai.chat.completion", start=100, attributes={"gen_ai.request.model": "m1"}),
            span(train_a, "s2", "tool.search", start=101, status="ERROR", attributes={"tool.name": "search"}),
            span(train_a, "s3", "agentlightning.reward", start=102, attributes={"reward": 1.0}),
        ]
    )
    await store.add_many_spans(
        [
            span(train_b, "s1", "openai.chat.completion", start=200, attributes={"gen_ai.request.model": "m2"}),
            span(train_b, "s2", "tool.calculator", start=201, status="OK", attributes={"tool.name": "calculator"}),
        ]
    )
    await store.add_many_spans(
        [span(val, "s1", "openai.chat.completion", start=300, attributes={"gen_ai.request.model": "m1"})]
    )
    return [train_a, train_b, val]


def ids(found: list[Span], rollouts: list[AttemptedRollout]) -> list[tuple[int, str]]:
    """(index of the span's rollout in ``rollouts``, span name) for each span found."""
    index = {r.rollout_id: i for i, r in enumerate(rollouts)}
    return [(index[s.rollout_id], s.name) for s in found]


async def test_without_filters_finds_every_span_in_insertion_order(
    store: LightningStore, three_rollouts: list[AttemptedRollout]
) -> None:
    page = await store.search_spans()
    assert page.total == 6
    assert ids(list(page), three_rollouts) == [
        (0, "openai.chat.completion"),
        (0, "tool.search"),
        (0, "agentlightning.reward"),
        (1, "openai.chat.completion"),
        (1, "tool.calculator"),
        (2, "openai.chat.completion"),
    ]


async def test_filters_by_names_prefix_mode_and_time(
    store: LightningStore, three_rollouts: list[AttemptedRollout]
) -> None:
    llm_calls = await store.search_spans(names=["openai.chat.completion"])
    assert ids(list(llm_calls), three_rollouts) == [(i, "openai.chat.completion") for i in range(3)]

    tools = await store.search_spans(name_prefix="tool.")
    assert ids(list(tools), three_rollouts) == [(0, "tool.search"), (1, "tool.calculator")]
    assert (await store.search_spans(name_prefix="TOOL.")).total == 0  # case-sensitive on every backend

    training = await store.search_spans(names=["openai.chat.completion"], mode_in=["train"])
    assert ids(list(training), three_rollouts) == [(0, "openai.chat.completion"), (1, "openai.chat.completion")]

    window = await store.search_spans(start_time_from=101, start_time_to=200)
    assert ids(list(window), three_rollouts) == [
        (0, "tool.search"),
        (0, "agentlightning.reward"),
        (1, "openai.chat.completion"),
    ]


async def test_filters_by_ids_status_and_attributes(
    store: LightningStore, three_rollouts: list[AttemptedRollout]
) -> None:
    train_a, train_b, val = three_rollouts
    of_two = await store.search_spans(rollout_ids=[train_b.rollout_id, val.rollout_id])
    assert of_two.total == 3
    by_attempt = await store.search_spans(attempt_ids=[train_a.attempt.attempt_id])
    assert [s.span_id for s in by_attempt] == ["s1", "s2", "s3"]

    errors = await store.search_spans(status_code="ERROR")
    assert ids(list(errors), three_rollouts) == [(0, "tool.search")]

    m1 = await store.search_spans(attributes_match={"gen_ai.request.model": "m1"})
    assert ids(list(m1), three_rollouts) == [(0, "openai.chat.completion"), (2, "openai.chat.completion")]
    rewarded = await store.search_spans(attributes_match={"reward": 1.0})
    assert ids(list(rewarded), three_rollouts) == [(0, "agentlightning.reward")]

    both = await store.search_spans(names=["tool.calculator"], rollout_ids=[train_a.rollout_id])
    assert both.total == 0  # every filter applies


async def test_unknown_ids_find_nothing(store: LightningStore, three_rollouts: list[AttemptedRollout]) -> None:
    assert (await store.search_spans(rollout_ids=["ro-missing"])).total == 0
    assert (await store.search_spans(rollout_ids=[])).total == 0


async def test_sorts_and_pages(store: LightningStore, three_rollouts: list[AttemptedRollout]) -> None:
    newest_first = await store.search_spans(sort_by="start_time", sort_order="desc", limit=2)
    assert [s.start_time for s in newest_first] == [300, 201]
    assert newest_first.total == 6 and newest_first.limit == 2

    second_page = await store.search_spans(sort_by="start_time", sort_order="desc", limit=2, offset=2)
    assert [s.start_time for s in second_page] == [200, 102]

    by_name = await store.search_spans(sort_by="name", limit=-1)
    assert [s.name for s in by_name][:1] == ["agentlightning.reward"]
    assert len(list(by_name)) == 6


async def test_default_limit_is_a_thousand(store: LightningStore) -> None:
    page = await store.search_spans()
    assert page.limit == 1000


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"sort_by": "sequence_id"}, "sort_by"),
        ({"sort_order": "up"}, "sort_order"),
        ({"limit": -2}, "limit"),
        ({"offset": -1}, "offset"),
        ({"mode_in": ["prod"]}, "mode_in.0"),
        ({"status_code": "FINE"}, "status_code"),
        ({"rollout_ids": "ro-1"}, "rollout_ids"),
        ({"attributes_match": ["a"]}, "attributes_match"),
    ],
)
async def test_rejects_bad_arguments(store: LightningStore, kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidRequestError) as error:
        await store.search_spans(**kwargs)  # type: ignore[arg-type]
    assert error.value.field == field


async def test_long_name_lists_and_match_filters_up_to_the_stated_limit(
    store: LightningStore, three_rollouts: list[AttemptedRollout]
) -> None:
    """50,000 names are one bound list (Postgres takes at most 32,767 parameters a statement); a match filter takes
    up to ``MAX_MATCH_KEYS`` keys on every backend (SQLite refused about 500 conditions), and more is a 4xx."""
    names = [f"name-{i}" for i in range(50_000)]
    page = await store.search_spans(rollout_ids=[r.rollout_id for r in three_rollouts], names=names)
    assert page.items == []
    wide = {f"key-{i}": i for i in range(MAX_MATCH_KEYS)}
    assert (await store.search_spans(attributes_match=wide)).items == []
    with pytest.raises(InvalidRequestError) as error:
        await store.search_spans(attributes_match={**wide, "one-more": 1})
    assert error.value.field == "attributes_match" and f"at most {MAX_MATCH_KEYS}" in str(error.value)
    assert (await store.query_rollouts(metadata_match=wide)).items == []
    with pytest.raises(InvalidRequestError) as error:
        await store.query_rollouts(metadata_match={**wide, "one-more": 1})
    assert error.value.field == "metadata_match"

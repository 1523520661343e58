"""``jsonb_text``'s quick check never lets a number with a positive exponent through, whatever surrounds it."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic_core import to_json

from lightning_store.sql.dialect import _STRING_OR_BIG_FLOAT, _has_positive_exponent, jsonb_text

# Strings that look like numbers, exponents and hex ids, so that the quick check's shortcuts are exercised.
_tricky_text = st.one_of(
    st.text(alphabet='0123456789abcdefE+-.:,[]{} "\\', max_size=24),
    st.from_regex(r"[0-9a-f]{16,32}", fullmatch=True),
    st.text(max_size=12),
)
_numbers = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    st.floats(min_value=1e15, max_value=1e300),
    st.floats(max_value=-1e15, min_value=-1e300),
    st.integers(),
)
_json = st.recursive(
    st.one_of(st.none(), st.booleans(), _numbers, _tricky_text),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(_tricky_text, inner, max_size=4)),
    max_leaves=12,
)


def _holds_big_float(text: str) -> bool:
    """The full pass's own judgement: a number token written with a positive exponent."""
    return any(found.group(1) is not None for found in _STRING_OR_BIG_FLOAT.finditer(text))


@settings(max_examples=400, deadline=None)
@given(_json)
def test_the_quick_check_finds_every_number_with_a_positive_exponent(value: Any) -> None:
    for text in (json.dumps(value), json.dumps(value, indent=1), to_json(value).decode()):
        if _holds_big_float(text):
            assert _has_positive_exponent(text), text
        assert json.loads(jsonb_text(text)) == value


def test_hex_ids_with_digit_e_digit_do_not_trigger_the_full_pass() -> None:
    assert not _has_positive_exponent(json.dumps({"trace_id": "4e5a0e91e3", "span_id": "00e1"}))
    assert _has_positive_exponent('{"a":[1,2.5e+16]}')
    assert _has_positive_exponent("1E300")

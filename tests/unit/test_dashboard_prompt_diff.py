"""The dashboard's prompt diff and id checks (lightning_store/dashboard/prompt_diff.py)."""

from __future__ import annotations

from lightning_store.dashboard.prompt_diff import in_list, is_possible_id, line_diff


def kinds(old: str, new: str) -> list[tuple[str, str]]:
    return [(line.kind, line.text) for line in line_diff(old, new)]


def test_a_line_diff_marks_exactly_the_changed_lines_and_keeps_the_rest() -> None:
    assert kinds("a\nb\nc", "a\nB\nc\nd") == [("ctx", "a"), ("del", "b"), ("add", "B"), ("ctx", "c"), ("add", "d")]
    assert kinds("same\n", "same") == [("ctx", "same")]
    assert kinds("", "new") == [("add", "new")]
    assert kinds("gone", "") == [("del", "gone")]
    assert kinds("x\n\ny", "x\ny") == [("ctx", "x"), ("del", ""), ("ctx", "y")]


def test_impossible_ids_are_refused_before_any_query() -> None:
    assert is_possible_id("ro-1") and is_possible_id("ünï ☃ 'quoted' <b>")
    for bad in ("", "a/b", "..", ".", "x" * 129, "a\x00b", "\ud800"):
        assert not is_possible_id(bad), bad


def test_in_lists_bind_every_value() -> None:
    assert in_list("r", ["a", "b'"]) == ("(:r0, :r1)", {"r0": "a", "r1": "b'"})
    assert in_list("r", []) == ("(NULL)", {})

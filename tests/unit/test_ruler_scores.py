"""Reading the judge's scores (``algorithms.ruler.parse_scores``): a JSON object somewhere in its answer, one
score per trajectory, clamped to [0, 1]; an answer without one for every trajectory is refused."""

from __future__ import annotations

import pytest

from algorithms.ruler import parse_scores


def test_scores_are_read_from_the_judges_json_and_a_missing_one_is_refused() -> None:
    text = 'Sure: {"scores": [{"trajectory": 2, "score": 1.7, "explanation": "b"}, {"trajectory": 1, "score": -1}]}'
    assert parse_scores(text, 2) == [(0.0, ""), (1.0, "b")]  # clamped to [0, 1], in trajectory order
    for bad in ("no json", '{"scores": [{"trajectory": 1, "score": 0.5}]}', '{"scores": "x"}', "{not json}"):
        with pytest.raises(ValueError):
            parse_scores(bad, 2)

"""Reciprocal rank fusion and hop scoring, the pure half of recall."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, strategies as st

from mnemo.recall.ranking import reciprocal_rank_fusion

items = st.sampled_from([f"n{i}" for i in range(12)])
rankings = st.lists(st.lists(items, unique=True, max_size=10), min_size=1, max_size=4)
rrf_ks = st.integers(min_value=1, max_value=100)


def test_empty_input_fuses_to_nothing() -> None:
    """No rankings, or only empty ones, give no scores."""
    assert reciprocal_rank_fusion([], 60) == {}
    assert reciprocal_rank_fusion([[], []], 60) == {}


def test_known_values() -> None:
    """Scores are the summed reciprocal ranks over their best possible sum."""
    scores = reciprocal_rank_fusion([["a", "b"], ["b"]], 60)
    assert scores["a"] == pytest.approx((1 / 61) / (2 / 61))
    assert scores["b"] == pytest.approx((1 / 62 + 1 / 61) / (2 / 61))


@given(rankings, rrf_ks)
def test_first_in_every_ranking_scores_one(lists: list[list[str]], k: int) -> None:
    """An item first in every ranking scores exactly 1.0, the highest score there is."""
    top = "winner"
    scores = reciprocal_rank_fusion([[top, *ranking] for ranking in lists], k)
    assert scores[top] == pytest.approx(1.0)
    assert max(scores.values()) == scores[top]


@given(rankings, rrf_ks)
def test_scores_are_positive_and_at_most_one(lists: list[list[str]], k: int) -> None:
    """Every ranked item gets a score in (0, 1], and only ranked items get one."""
    scores = reciprocal_rank_fusion(lists, k)
    assert set(scores) == {item for ranking in lists for item in ranking}
    assert all(0.0 < score <= 1.0 + 1e-12 for score in scores.values())


@given(st.lists(items, unique=True, min_size=2, max_size=10), rrf_ks)
def test_one_ranking_keeps_its_order(ranking: list[str], k: int) -> None:
    """With one ranking, scores strictly decrease down the ranking."""
    scores = reciprocal_rank_fusion([ranking], k)
    assert all(scores[a] > scores[b] for a, b in itertools.pairwise(ranking))


@given(rankings, rrf_ks, st.data())
def test_moving_up_in_a_ranking_raises_the_score(
    lists: list[list[str]], k: int, data: st.DataObject
) -> None:
    """Swapping an item with the one above it raises its score and lowers the other's."""
    which = data.draw(st.sampled_from([i for i, r in enumerate(lists) if len(r) >= 2] or [-1]))
    if which < 0:
        return
    ranking = lists[which]
    pos = data.draw(st.integers(1, len(ranking) - 1))
    moved = list(ranking)
    moved[pos - 1], moved[pos] = moved[pos], moved[pos - 1]
    before = reciprocal_rank_fusion(lists, k)
    after = reciprocal_rank_fusion([*lists[:which], moved, *lists[which + 1 :]], k)
    up, down = ranking[pos], ranking[pos - 1]
    assert after[up] > before[up]
    assert after[down] < before[down]


@given(rankings, rrf_ks)
def test_fusion_ignores_the_order_of_rankings(lists: list[list[str]], k: int) -> None:
    """The rankings are symmetric: reversing their order changes no score."""
    forward = reciprocal_rank_fusion(lists, k)
    backward = reciprocal_rank_fusion(lists[::-1], k)
    assert forward.keys() == backward.keys()
    for item, score in forward.items():
        assert backward[item] == pytest.approx(score)



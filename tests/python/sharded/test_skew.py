"""redcount.skew: the one definition of shard-skew figures (max/mean, CV, Gini, shard advice)."""

from __future__ import annotations

import math

import pytest

from redcount.skew import gini, recommended_shards, skew_of


def test_an_even_spread_has_no_skew() -> None:
    s = skew_of([5, 5, 5, 5])
    assert (s.shards, s.total, s.mean, s.max) == (4, 20.0, 5.0, 5.0)
    assert s.max_over_mean == 1.0 and s.cv == 0.0 and s.gini == 0.0
    assert s.recommended_shards is None


def test_everything_on_one_shard_is_the_maximum_skew() -> None:
    s = skew_of([0, 0, 0, 12])
    assert s.max_over_mean == 4.0
    assert s.gini == pytest.approx(3 / 4)
    assert s.cv == pytest.approx(math.sqrt(3))


def test_gini_matches_the_mean_absolute_difference_definition() -> None:
    xs = [3.0, 1.0, 7.0, 0.0, 9.0, 4.0]
    n, mean = len(xs), sum(xs) / len(xs)
    by_definition = sum(abs(a - b) for a in xs for b in xs) / (2 * n * n * mean)
    assert gini(xs) == pytest.approx(by_definition)


def test_all_zero_is_even_not_a_division_by_zero() -> None:
    s = skew_of([0, 0, 0])
    assert (s.max_over_mean, s.cv, s.gini) == (1.0, 0.0, 0.0)


def test_recommended_shards_rounds_up_to_a_power_of_two_and_keeps_the_current_count() -> None:
    assert skew_of([120, 80, 100, 900], target_per_shard=250).recommended_shards == 8
    assert recommended_shards(1000, 100) == 16
    assert recommended_shards(10, 100, current=16) == 16
    assert recommended_shards(10**9, 1) == 1024
    assert recommended_shards(0, 5) == 1


@pytest.mark.parametrize("bad", [[], [1, -1], [float("nan")], [float("inf")]])
def test_bad_figures_are_refused(bad: list[float]) -> None:
    with pytest.raises(ValueError):
        skew_of(bad)


@pytest.mark.parametrize("target", [0, -1, float("nan")])
def test_a_bad_target_is_refused(target: float) -> None:
    with pytest.raises(ValueError, match="target_per_shard"):
        skew_of([1, 2], target_per_shard=target)

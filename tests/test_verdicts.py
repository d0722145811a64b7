"""The results pages' one rule (`rllib_p3o.sweep.verdicts`): tie within the larger sample std, best or tied,
collapse below the best. Pure arithmetic, no fakes."""

import math

import pytest

from rllib_p3o.sweep.verdicts import COLLAPSE_DROP, TIE_RULE, best_or_tied, collapsed, verdict


def test_two_means_within_the_larger_std_tie_and_outside_it_the_higher_wins():
    assert verdict(0.800, 0.010, 0.811, 0.020) == "ties"  # 0.011 <= 0.020
    assert verdict(0.811, 0.002, 0.800, 0.005) == "wins"  # 0.011 > 0.005
    assert verdict(0.800, 0.005, 0.811, 0.002) == "loses"
    assert verdict(0.5, 0.1, 0.6, 0.0) == "ties"  # exactly the margin is a tie
    assert verdict(0.5, math.nan, 0.6, math.nan) == "loses"  # one seed: no spread, the means decide


def test_the_verdict_refuses_a_missing_mean_or_a_negative_std():
    with pytest.raises(ValueError):
        verdict(math.nan, 0.1, 0.5, 0.1)
    with pytest.raises(ValueError):
        verdict(0.5, -0.1, 0.5, 0.1)


def test_best_or_tied_is_the_best_mean_and_everything_that_ties_with_it():
    stats = {
        "p3o": (0.992, 0.004),
        "grpo_eps_0.2": (0.995, 0.002),
        "grpo_eps_0.6": (0.995, 0.001),
        "cispo": (0.90, 0.01),
    }
    assert best_or_tied(stats) == ["p3o", "grpo_eps_0.2", "grpo_eps_0.6"]
    assert best_or_tied({"a": (0.9, 0.001), "b": (0.8, 0.001)}) == ["a"]
    assert best_or_tied({"a": (math.nan, math.nan), "b": (0.8, 0.001)}) == ["b"]
    assert best_or_tied({}) == []


def test_a_collapse_is_a_fall_of_more_than_the_drop_below_the_best():
    assert collapsed(0.56, 0.97)
    assert not collapsed(0.97 - COLLAPSE_DROP + 1e-9, 0.97)
    assert collapsed(0.9, 0.9, errored=True)
    assert collapsed(math.nan, 0.9)
    assert "sample standard deviations" in TIE_RULE

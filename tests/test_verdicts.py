"""The results pages' one rule (`rllib_p3o.sweep.verdicts`): tie within the standard error of the difference, best
or tied, a row where all tie, collapse below the best. Pure arithmetic, no fakes."""

import math

import pytest

from rllib_p3o.sweep.verdicts import COLLAPSE_DROP, TIE_RULE, all_tie, best_or_tied, collapsed, standard_error, verdict


def test_two_means_within_the_standard_error_of_their_difference_tie_and_beyond_it_the_higher_wins():
    # n = 3 each: SE = sqrt(0.02²/3 + 0.01²/3) = 0.0129.
    assert standard_error(0.02, 3, 0.01, 3) == pytest.approx(math.sqrt((0.02**2 + 0.01**2) / 3))
    assert verdict((0.800, 0.02, 3), (0.811, 0.01, 3)) == "ties"  # 0.011 <= 0.0129
    assert verdict((0.815, 0.02, 3), (0.800, 0.01, 3)) == "wins"  # 0.015 > 0.0129
    assert verdict((0.800, 0.01, 3), (0.815, 0.02, 3)) == "loses"
    # The claims bench's behavior_weaker row: -0.039 was a tie within the larger std (0.044) but is 1.5 SE behind.
    assert verdict((0.801, 0.044, 3), (0.840, 0.010, 3)) == "loses"
    # A collapsed seed widens a std, but not enough to hide a gap of 0.208 (SE 0.150).
    assert verdict((0.649, 0.259, 3), (0.857, 0.010, 3)) == "loses"
    assert verdict((0.5, math.nan, 1), (0.6, math.nan, 1)) == "loses"  # one seed: no spread, the means decide
    assert verdict((0.5, 0.1), (0.6, 0.0)) == "ties"  # a pair is one seed's std: SE = 0.1, exactly the margin


def test_the_verdict_refuses_a_missing_mean_a_negative_std_or_no_seeds():
    with pytest.raises(ValueError):
        verdict((math.nan, 0.1, 3), (0.5, 0.1, 3))
    with pytest.raises(ValueError):
        verdict((0.5, -0.1, 3), (0.5, 0.1, 3))
    with pytest.raises(ValueError):
        verdict((0.5, 0.1, 0), (0.5, 0.1, 3))


def test_best_or_tied_is_the_best_mean_and_everything_that_ties_with_it():
    stats = {
        "p3o": (0.992, 0.006, 3),  # SE against the best 0.0037 > 0.003
        "grpo_eps_0.2": (0.995, 0.002, 3),
        "grpo_eps_0.6": (0.995, 0.001, 3),
        "cispo": (0.90, 0.01, 3),
    }
    assert best_or_tied(stats) == ["p3o", "grpo_eps_0.2", "grpo_eps_0.6"]
    assert not all_tie(stats)
    assert all_tie({m: v for m, v in stats.items() if m != "cispo"})
    assert not all_tie({"a": (0.9, 0.1, 3)})  # one method alone is no comparison
    assert best_or_tied({"a": (0.9, 0.001, 3), "b": (0.8, 0.001, 3)}) == ["a"]
    assert best_or_tied({"a": (math.nan, math.nan, 0), "b": (0.8, 0.001, 3)}) == ["b"]
    assert best_or_tied({}) == []


def test_a_collapse_is_a_fall_of_more_than_the_drop_below_the_best():
    assert collapsed(0.56, 0.97)
    assert not collapsed(0.97 - COLLAPSE_DROP + 1e-9, 0.97)
    assert collapsed(0.9, 0.9, errored=True)
    assert collapsed(math.nan, 0.9)
    assert "standard error of the difference" in TIE_RULE


def test_the_default_is_the_candidate_best_or_tied_in_the_most_regimes_without_a_collapse():
    from rllib_p3o.sweep.verdicts import choose_default

    def row(x, y, z, base=0.75):
        return {"x": (x, 0.01, 3), "y": (y, 0.01, 3), "z": (z, 0.01, 3), "base": (base, 0.01, 3)}

    none = {r: {} for r in "abc"}
    # Best or tied: z in a and c (2 regimes), y in b (1), x in none.
    stats = {"a": row(0.80, 0.70, 0.90), "b": row(0.60, 0.85, 0.50), "c": row(0.70, 0.60, 0.80)}
    assert choose_default(stats, none, ["x", "y", "z"]) == "z"
    # A collapsed seed rules z out: y (1 regime) before x (0).
    assert choose_default(stats, {**none, "b": {"z": 1}}, ["x", "y", "z"]) == "y"
    # Equal counts: the higher mean over the regimes (y 0.78 against x 0.70), then the candidate listed first.
    stats = {"a": row(0.80, 0.70, 0.50), "b": row(0.50, 0.85, 0.50), "c": row(0.80, 0.80, 0.50, base=0.9)}
    assert choose_default(stats, none, ["x", "y", "z"]) == "y"
    twins = {r: {**row(0.9, 0.9, 0.5)} for r in "abc"}  # x and y the same run in every regime
    assert choose_default(twins, none, ["y", "x", "z"]) == "y" and choose_default(twins, none, ["x", "y"]) == "x"
    with pytest.raises(ValueError, match="every candidate"):
        choose_default(stats, {r: {"x": 1, "y": 1, "z": 1} for r in stats}, ["x", "y", "z"])

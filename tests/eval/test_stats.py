"""collab_env.eval.stats: the interval follows the metric's declared type and the right unit
(issue 45, part 4)."""

from __future__ import annotations

import math
import random

import pytest

from collab_env.errors import ConfigError
from collab_env.eval.stats import hierarchical_bootstrap, interval, paired_difference, seed_interval, t_interval


def test_t_interval_matches_the_textbook_value():
    # 5 values, mean 3, sample sd sqrt(2.5); t_{0.975, 4} = 2.7764
    t = t_interval([1, 2, 3, 4, 5])
    half = 2.7764451051977934 * math.sqrt(2.5) / math.sqrt(5)
    assert t["mean"] == 3 and t["lo"] == pytest.approx(3 - half) and t["hi"] == pytest.approx(3 + half)
    assert math.isnan(t_interval([4.0])["lo"]) and t_interval([])["n"] == 0


def test_the_method_follows_the_declared_type_not_the_values():
    """The issue's case: a count (questions asked) whose episodes all asked 0 or 1 times got
    Wilson's interval because the values looked like a proportion."""
    asked = [0, 1, 1, 0, 1, 1, 1, 0]
    assert interval(asked, "count")["method"] == "t"
    assert interval(asked, "binary")["method"] == "wilson"
    lo, hi = interval([1] * 8, "binary")["lo"], interval([1] * 8, "binary")["hi"]
    assert 0.6 < lo < 1.0 and hi == pytest.approx(1.0)  # Wilson is not empty at n/n
    with pytest.raises(ConfigError, match="must be 0 or 1"):
        interval([0.5, 1.0], "binary")
    with pytest.raises(ConfigError, match="the metric's type"):
        interval([1.0], "proportion")


def test_seed_interval_is_t_over_the_seed_means():
    """3 seeds x 4 items: the unit is the seed, so n = 3 (not 12) and the interval is t with 2
    degrees of freedom over the three seed means."""
    table = {0: {i: 1.0 for i in range(4)}, 1: {i: 0.0 for i in range(4)}, 2: {0: 1.0, 1: 1.0, 2: 0.0, 3: 0.0}}
    s = seed_interval(table)
    assert s["n_seeds"] == 3 and s["seed_means"] == {0: 1.0, 1: 0.0, 2: 0.5}
    assert (s["lo"], s["hi"]) == pytest.approx((t_interval([1.0, 0.0, 0.5])["lo"], t_interval([1.0, 0.0, 0.5])["hi"]))
    # the episode-level Wilson interval of the same 12 episodes is far narrower: the wrong unit
    pooled = interval([v for row in table.values() for v in row.values()], "binary")
    assert pooled["hi"] - pooled["lo"] < (s["hi"] - s["lo"]) / 2
    with pytest.raises(ConfigError, match="have no values"):
        seed_interval({0: [1.0], 1: []})


def _simulated(rng: random.Random, seeds: int, items: int, seed_sd: float, item_sd: float) -> dict:
    seed_fx = [rng.gauss(0, seed_sd) for _ in range(seeds)]
    item_fx = [rng.gauss(0, item_sd) for _ in range(items)]
    return {s: {i: seed_fx[s] + item_fx[i] + rng.gauss(0, 0.1) for i in range(items)} for s in range(seeds)}


def test_seed_interval_covers_the_truth_when_the_seed_effect_dominates():
    """Data with a true mean of 0 and a large seed effect: over 200 simulated studies of 5 seeds
    x 16 items the t interval over seeds covers 0 about 95% of the time, while treating the 80
    episodes as independent covers it far less often."""
    rng = random.Random(0)
    covered_seed = covered_naive = 0
    for _ in range(200):
        table = _simulated(rng, 5, 16, seed_sd=1.0, item_sd=0.0)
        s = seed_interval(table)
        covered_seed += s["lo"] <= 0 <= s["hi"]
        naive = t_interval([v for row in table.values() for v in row.values()])
        covered_naive += naive["lo"] <= 0 <= naive["hi"]
    assert covered_seed >= 180 and covered_naive <= 150


def test_hierarchical_bootstrap_is_reproducible_and_counts_both_sources():
    rng = random.Random(1)
    table = _simulated(rng, 6, 20, seed_sd=0.5, item_sd=0.5)
    a, b = hierarchical_bootstrap(table, seed=3, num_boot=500), hierarchical_bootstrap(table, seed=3, num_boot=500)
    assert a == b and a["n_seeds"] == 6 and a["n_items"] == 20 and a["lo"] < a["mean"] < a["hi"]
    # items as the only random source (seeds fixed) gives a narrower interval than both crossed
    one_seed = {0: {i: sum(table[s][i] for s in table) / 6 for i in range(20)}}
    narrow = hierarchical_bootstrap(one_seed, seed=3, num_boot=500)
    assert narrow["hi"] - narrow["lo"] < a["hi"] - a["lo"]
    assert math.isnan(hierarchical_bootstrap({})["mean"])


def test_paired_difference_uses_only_the_shared_cells():
    a = {0: {0: 1.0, 1: 1.0, 2: 0.0}, 1: {0: 1.0, 1: 0.0}, 2: {0: 1.0}}
    b = {0: {0: 0.0, 1: 1.0}, 1: {0: 0.0, 1: 0.0, 5: 1.0}}
    d = paired_difference(a, b, num_boot=200)
    assert d["cells"] == 4 and d["seeds"]["n_seeds"] == 2
    assert d["differ"] == 2  # seed 0: items 0 (1 - 0) and 1 (equal); seed 1: items 0 (1 - 0) and 1 (equal)
    assert d["seeds"]["seed_means"] == {0: 0.5, 1: 0.5} and d["mean"] == 0.5
    with pytest.raises(ConfigError, match="share no"):
        paired_difference({0: {0: 1.0}}, {1: {0: 1.0}})


def test_percentile_is_numpys_linear_interpolation():
    np = pytest.importorskip("numpy")
    from collab_env.eval.stats import percentile

    rng = random.Random(3)
    for n in (1, 2, 5, 10, 11):
        xs = [rng.random() for _ in range(n)]
        for q in (0, 10, 37.5, 50, 90, 100):
            assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)), abs=1e-12)
    assert math.isnan(percentile([], 50))
    with pytest.raises(ConfigError, match="percentile"):
        percentile([1.0], 101)


def test_aptitude_and_unreliability_by_hand():
    """Laban et al.'s measures: per item P90 and P90 - P10 of its trials, averaged over items,
    with Student's t interval over the items."""
    from collab_env.eval.stats import aptitude, unreliability

    # a: ten trials, 8 successes -> P90 = 1, P10 = 0 + 0.9 * 0 = 0 (sorted: 0, 0, 1, ... 1);
    # b: always 0.5 -> P90 = P10 = 0.5; c: [0, 1] -> P90 = 0.9, P10 = 0.1.
    table = {"a": [1, 1, 0, 1, 1, 1, 0, 1, 1, 1], "b": [0.5] * 10, "c": [0.0, 1.0]}
    apt, unr = aptitude(table), unreliability(table)
    assert apt["per_item"] == pytest.approx({"a": 1.0, "b": 0.5, "c": 0.9})
    assert unr["per_item"] == pytest.approx({"a": 1.0 - 0.0, "b": 0.0, "c": 0.8})
    assert apt["mean"] == pytest.approx(2.4 / 3) and unr["mean"] == pytest.approx(1.8 / 3)
    t = t_interval([1.0, 0.0, 0.8])
    assert (unr["lo"], unr["hi"]) == pytest.approx((t["lo"], t["hi"]))
    assert apt["n_items"] == 3 and apt["trials"] == 2
    # a model that does the same on every trial is perfectly reliable, whatever its level
    assert unreliability({"x": [0.3] * 4, "y": [1.0] * 4})["mean"] == 0.0
    with pytest.raises(ConfigError, match="at least 2 trials"):
        aptitude({"a": [1.0, 0.0], "b": [1.0]})
    with pytest.raises(ConfigError, match="at least one item"):
        unreliability({})

"""Statistics: pass^k by hand, bootstrap intervals reproducible by seed, paired comparisons."""

import math

import pytest

from collab_env.errors import ConfigError
from collab_env.leaderboard.stats import bootstrap, entry_statistics, paired_comparison, pass_hat_k


def test_pass_hat_k_by_hand():
    # Task A: 3 of 4 trials succeeded, B: 1 of 4, C: 2 of 2.
    table = {"A": (3, 4), "B": (1, 4), "C": (2, 2)}
    # k=1: (3/4 + 1/4 + 2/2) / 3
    assert pass_hat_k(table, 1) == pytest.approx(2 / 3, abs=1e-15)
    # k=2: (C(3,2)/C(4,2) = 3/6, C(1,2)/C(4,2) = 0, C(2,2)/C(2,2) = 1) / 3 = 1/2
    assert pass_hat_k(table, 2) == pytest.approx(0.5, abs=1e-15)
    # k=3: only A and B have 3 trials: (C(3,3)/C(4,3) = 1/4, 0) / 2 = 1/8
    assert pass_hat_k(table, 3) == pytest.approx(0.125, abs=1e-15)
    # k=4: (C(3,4) = 0, 0) / 2 = 0
    assert pass_hat_k(table, 4) == 0.0
    assert math.isnan(pass_hat_k(table, 5))
    with pytest.raises(ConfigError):
        pass_hat_k({"A": (5, 4)}, 1)
    with pytest.raises(ConfigError):
        pass_hat_k(table, 0)


def _record(k, index, reward, seed=None, tokens=0):
    return {"episode_id": k, "seed": 100 + k if seed is None else seed, "index": index,
            "returns": {"assistant": reward, "user": reward},
            "components": {"assistant": {"accuracy": reward}},
            "turns": [{"player": "assistant", "text": "x", "completion": {"usage": {"completion_tokens": tokens}}},
                      {"player": "user", "text": "y", "completion": None}]}


def test_entry_statistics_by_hand():
    # Same table as above through episode records: episode k is task k % 3 (C has 2 trials).
    rewards = {"A": [1, 1, 1, 0], "B": [0, 1, 0, 0], "C": [1, 1]}
    records, k = [], 0
    for idx, task in enumerate("ABC"):
        for r in rewards[task]:
            records.append(_record(k, idx, float(r), tokens=10 * r))
            k += 1
    st = entry_statistics(records, submitted=["assistant"], threshold=1.0,
                          metrics=["success", "reward", "turns", "tokens", "accuracy", "interactivity"],
                          k=4, seed=0, num_boot=200)
    assert st["tasks"] == 3 and st["episodes"] == 10 and st["seeds"] == 2
    # Mean of task means: (3/4 + 1/4 + 1) / 3.
    assert st["metrics"]["success"]["mean"] == pytest.approx(2 / 3, abs=1e-12)
    assert st["metrics"]["tokens"]["mean"] == pytest.approx(20 / 3, abs=1e-12)
    assert st["metrics"]["turns"]["mean"] == 1.0 and st["metrics"]["turns"]["n"] == 10
    assert "interactivity" not in st["metrics"]  # no episode has it
    assert [st["pass_k"][str(j)]["mean"] for j in (1, 2, 3, 4)] == pytest.approx([2 / 3, 0.5, 0.125, 0.0], abs=1e-12)
    assert st["pass_k"]["3"]["n"] == 2
    for s in st["metrics"].values():
        assert s["lo"] <= s["hi"]


def test_bootstrap_reproducible_by_seed():
    per_task = [[float(i % 3 == 0)] * 2 + [float(i % 2)] for i in range(20)]

    def stat(items):
        return sum(sum(x) / len(x) for x in items) / len(items)

    a = bootstrap(per_task, stat, seed=7, num_boot=500)
    b = bootstrap(per_task, stat, seed=7, num_boot=500)
    c = bootstrap(per_task, stat, seed=8, num_boot=500)
    assert a == b  # bit for bit
    assert a[0] == c[0] and (a[1], a[2]) != (c[1], c[2])
    assert a[1] < a[0] < a[2]
    # A constant statistic has a zero-width interval.
    assert bootstrap([[1.0]] * 5, stat, seed=0, num_boot=50) == (1.0, 1.0, 1.0)


def test_paired_comparison_matches_episodes_and_refuses_other_tracks():
    a = [_record(k, k % 4, 1.0 if k % 4 else 0.0) for k in range(8)]
    b = [_record(k, k % 4, 0.0) for k in range(8)]
    c = paired_comparison(a, b, submitted=["assistant"], threshold=1.0, seed=0, num_boot=300)
    assert (c["diff"], c["n"], c["tasks"]) == (0.75, 8, 4)
    assert 0.0 <= c["lo"] <= c["diff"] <= c["hi"] <= 1.0
    assert paired_comparison(a[:3], b, submitted=["assistant"], threshold=1.0, num_boot=10)["n"] == 3
    other = [_record(k, k % 4, 0.0, seed=5) for k in range(8)]
    with pytest.raises(ConfigError, match="not the same track"):
        paired_comparison(a, other, submitted=["assistant"], threshold=1.0)


def test_aptitude_and_unreliability_columns_by_hand():
    """The paper's measures as board metrics: per task with >= 2 trials, P90 (aptitude) and
    P90 - P10 (unreliability) of its trials' rewards, averaged over the tasks; a task played
    once counts in neither."""
    rewards = {"A": [1.0, 1.0, 1.0, 0.0], "B": [0.0, 0.5, 0.0, 0.0], "C": [1.0]}
    records, k = [], 0
    for idx, task in enumerate("ABC"):
        for r in rewards[task]:
            records.append(_record(k, idx, r))
            k += 1
    st = entry_statistics(records, submitted=["assistant"], threshold=1.0,
                          metrics=["reward", "aptitude", "unreliability"], k=1, seed=0, num_boot=200)
    # numpy's linear percentile: A sorted [0, 1, 1, 1]: P90 = 1, P10 = 0 + 0.3 * 1 = 0.3;
    # B sorted [0, 0, 0, 0.5]: P90 = 0 + 0.7 * 0.5 = 0.35, P10 = 0.
    assert st["metrics"]["aptitude"]["mean"] == pytest.approx((1.0 + 0.35) / 2, abs=1e-12)
    assert st["metrics"]["unreliability"]["mean"] == pytest.approx((0.7 + 0.35) / 2, abs=1e-12)
    assert st["metrics"]["aptitude"]["n"] == 8  # C's single episode is left out
    assert st["metrics"]["unreliability"]["lo"] <= st["metrics"]["unreliability"]["hi"]
    once = entry_statistics(records[-1:], submitted=["assistant"], threshold=1.0,
                            metrics=["aptitude"], k=1, seed=0, num_boot=50)
    assert "aptitude" not in once["metrics"]  # no task played twice: no measure, not a zero

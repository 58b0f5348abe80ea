"""Statistics of leaderboard entries: success, pass^k, per-metric means, bootstrap intervals
over tasks, and paired comparisons.

Every interval is a percentile bootstrap **over tasks** (task items; the episodes of one task,
its seeds, stay together): ``num_boot`` resamples of the tasks with replacement, the statistic
recomputed on each, the 2.5 and 97.5 percentiles. Resampling tasks, not episodes, is what makes
an interval honest when the seeds of one task are correlated (a policy that solves a task
usually solves it on every seed). The resamples come from ``numpy.random.default_rng(seed)``,
so the same data and seed give the same interval on any machine.

Definitions (``R`` is an episode's reward: the mean return of the submitted players)
    * success: ``R >= success_threshold`` of the track;
    * pass^k (τ²-bench's pass-hat-k): for a task with ``n`` trials of which ``c`` succeeded,
      ``C(c, k) / C(n, k)``, the chance that ``k`` trials drawn without replacement all succeed;
      averaged over the tasks with ``n >= k``. pass^1 is the success rate;
    * a metric's mean is the mean over tasks of the task's mean over its episodes (with the same
      number of trials per task, the plain mean over episodes);
    * paired comparison of entries A and B: only the episodes both played (same episode id,
      so the same seed and task), ``A - B`` per episode, averaged per task, then over tasks.
      Its verdict is "not distinguishable" when the 95% interval includes 0;
    * flip rate (:func:`noise_statistics`): the share of the tasks played at least twice whose
      verdict (success or not) differs across the entry's trials, the between-run instability
      that a single run hides;
    * minimum detectable difference (MDD) of the success rate at the entry's n: the true gap
      that a comparison with a second entry of the same noise, on the same tasks, detects at
      two-sided level 0.05 with power 0.8: ``(z_0.975 + z_0.8) * sqrt(2 * s^2 / T)``, ``T``
      tasks, ``s^2`` the variance over tasks of the task's success rate. So that an entry that
      succeeds (or fails) everywhere does not claim an MDD of 0 from a few tasks, ``s^2`` is at
      least the variance a task's rate has if its trials were independent draws at the
      Agresti-Coull rate ``(S + 2) / (N + 4)`` (``S`` successes in ``N`` episodes): that rate
      times its complement over the trials per task.
    * aptitude and unreliability (:data:`TRIAL_METRICS`, the measures of "LLMs Get Lost in
      Multi-Turn Conversation"): per task played at least twice, the 90th percentile of its
      trials' rewards, or the 90th minus the 10th (:func:`collab_env.eval.stats.item_aptitude`,
      :func:`~collab_env.eval.stats.item_unreliability`), averaged over those tasks; ``n`` counts
      their episodes.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from collab_env.errors import ConfigError
from collab_env.eval.stats import item_aptitude, item_unreliability

__all__ = [
    "pass_hat_k",
    "bootstrap",
    "episode_values",
    "entry_statistics",
    "paired_comparison",
    "noise_statistics",
    "NUM_BOOT",
    "MDD_Z",
    "TRIAL_METRICS",
]

#: Bootstrap resamples per interval.
NUM_BOOT = 2000
#: ``z_0.975 + z_0.8``: the minimum detectable difference at level 0.05 and power 0.8.
MDD_Z = 1.959963984540054 + 0.8416212335729143


def pass_hat_k(trials: Mapping[Any, tuple[int, int]], k: int) -> float:
    """pass^k: the mean over tasks of ``C(c, k) / C(n, k)``.

    Args:
        trials: Task -> ``(successes c, trials n)``.
        k: ``k >= 1``.

    Returns:
        The average over the tasks with ``n >= k`` (``nan`` when there is none).
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ConfigError(f"k must be an int >= 1, got {k!r}.")
    vals = [math.comb(c, k) / math.comb(n, k) for c, n in trials.values() if n >= k]
    for c, n in trials.values():
        if not 0 <= c <= n:
            raise ConfigError(f"successes must be in [0, trials], got c={c}, n={n}.")
    return sum(vals) / len(vals) if vals else math.nan


def _pass_hat_k_of(k: int, items: Sequence[tuple[int, int]]) -> float:
    """pass^k of ``items`` (one ``(successes, trials)`` per task): the statistic :func:`bootstrap`
    resamples for pass^k."""
    return pass_hat_k(dict(enumerate(items)), k)


def bootstrap(per_task: Sequence[Any], statistic: Callable[[list[Any]], float], *, seed: int = 0,
              num_boot: int = NUM_BOOT, level: float = 0.95) -> tuple[float, float, float]:
    """``(estimate, lo, hi)``: ``statistic`` of the tasks and its percentile bootstrap interval.

    Args:
        per_task: One item per task (whatever ``statistic`` reads).
        statistic: List of task items -> a number.
        seed: Seed of the resampling (same seed, same interval).
        num_boot: Resamples.
        level: Coverage of the interval.
    """
    items = list(per_task)
    if not items:
        return math.nan, math.nan, math.nan
    est = float(statistic(items))
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(items), size=(num_boot, len(items)))
    boots = np.array([statistic([items[i] for i in row]) for row in idx], dtype=float)
    boots = boots[~np.isnan(boots)]
    if boots.size == 0:
        return est, math.nan, math.nan
    a = (1.0 - level) / 2.0
    lo, hi = np.quantile(boots, [a, 1.0 - a])
    return est, float(lo), float(hi)


#: Metrics of a task's trials together, not of one episode: name -> the task's value from its
#: trials' rewards (a task needs at least 2 trials).
TRIAL_METRICS: dict[str, Callable[[Sequence[float]], float]] = {
    "aptitude": item_aptitude, "unreliability": item_unreliability,
}


def _mean_of_task_stat(stat: Callable[[Sequence[float]], float], tasks: list[list[float]]) -> float:
    vals = [stat(v) for v in tasks]
    return sum(vals) / len(vals) if vals else math.nan


def _mean_of_task_means(tasks: list[list[float]]) -> float:
    means = [sum(v) / len(v) for v in tasks if v]
    return sum(means) / len(means) if means else math.nan


def episode_values(record: Mapping[str, Any], submitted: Sequence[str], threshold: float) -> dict[str, float]:
    """The per-episode numbers of one finished episode record: ``reward``, ``success``,
    ``turns`` (submitted players' moves), ``tokens`` (their completion tokens) and each reward
    component of the submitted players (mean over them)."""
    returns = record.get("returns") or {}
    reward = sum(float(returns.get(p, 0.0)) for p in submitted) / len(submitted)
    turns = [t for t in record.get("turns", []) if t.get("player") in submitted]
    tokens = 0.0
    for t in turns:
        usage = (t.get("completion") or {}).get("usage") or {}
        tokens += float(usage.get("completion_tokens", 0) or 0)
    out = {"reward": reward, "success": float(reward >= threshold), "turns": float(len(turns)),
           "tokens": tokens}
    comps: dict[str, list[float]] = {}
    for p in submitted:
        for name, v in ((record.get("components") or {}).get(p) or {}).items():
            comps.setdefault(name, []).append(float(v))
    for name, vs in comps.items():
        out.setdefault(name, sum(vs) / len(vs))
    return out


def _by_task(records: Sequence[Mapping[str, Any]]) -> dict[Any, list[Mapping[str, Any]]]:
    tasks: dict[Any, list[Mapping[str, Any]]] = {}
    for r in sorted(records, key=lambda r: r.get("episode_id", 0)):
        tasks.setdefault(r.get("index"), []).append(r)
    return tasks


def entry_statistics(records: Sequence[Mapping[str, Any]], *, submitted: Sequence[str], threshold: float,
                     metrics: Sequence[str], k: int, seed: int = 0, num_boot: int = NUM_BOOT) -> dict[str, Any]:
    """The numbers of one entry from its finished episode records.

    Returns:
        ``{"metrics": {name: {"mean", "lo", "hi", "n"}}, "pass_k": {"1": {"mean", "lo", "hi",
        "n"}, ...}, "tasks": int, "episodes": int, "seeds": int}``; a metric no episode has
        (e.g. ``interactivity`` on a rule-based track) is left out; ``seeds`` is the smallest
        number of trials of a task.
    """
    tasks = _by_task(records)
    values = {t: [episode_values(r, submitted, threshold) for r in rs] for t, rs in tasks.items()}
    keys = list(values)
    out_metrics: dict[str, Any] = {}
    for m in metrics:
        if m in TRIAL_METRICS:
            trials = [[v["reward"] for v in values[t]] for t in keys if len(values[t]) >= 2]
            if trials:
                mean, lo, hi = bootstrap(trials, functools.partial(_mean_of_task_stat, TRIAL_METRICS[m]),
                                         seed=seed, num_boot=num_boot)
                out_metrics[m] = {"mean": mean, "lo": lo, "hi": hi, "n": sum(len(x) for x in trials)}
            continue
        per_task = [[v[m] for v in values[t] if m in v] for t in keys]
        n = sum(len(x) for x in per_task)
        if n == 0:
            continue
        mean, lo, hi = bootstrap([x for x in per_task if x], _mean_of_task_means, seed=seed, num_boot=num_boot)
        out_metrics[m] = {"mean": mean, "lo": lo, "hi": hi, "n": n}
    pass_k: dict[str, Any] = {}
    counts = [(int(sum(v["success"] for v in values[t])), len(values[t])) for t in keys]
    for j in range(1, k + 1):
        eligible = [cn for cn in counts if cn[1] >= j]
        if not eligible:
            continue
        mean, lo, hi = bootstrap(eligible, functools.partial(_pass_hat_k_of, j),
                                 seed=seed, num_boot=num_boot)
        pass_k[str(j)] = {"mean": mean, "lo": lo, "hi": hi, "n": len(eligible)}
    return {"metrics": out_metrics, "pass_k": pass_k, "tasks": len(keys), "episodes": len(records),
            "seeds": min((n for _, n in counts), default=0)}


def paired_comparison(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]], *, submitted: Sequence[str],
                      threshold: float, metric: str = "reward", seed: int = 0,
                      num_boot: int = NUM_BOOT) -> dict[str, Any]:
    """``A - B`` on ``metric`` over the episodes both entries played, with its bootstrap
    interval over tasks.

    Pairs are matched by episode id and must share seed and task (else a :class:`ConfigError`:
    the entries were not played on the same track).

    Returns:
        ``{"metric", "diff", "lo", "hi", "n" (paired episodes), "tasks"}``; the interval
        excluding 0 is the evidence that one beats the other on these tasks.
    """
    bmap = {r.get("episode_id"): r for r in b}
    per_task: dict[Any, list[float]] = {}
    n = 0
    for r in sorted(a, key=lambda r: r.get("episode_id", 0)):
        other = bmap.get(r.get("episode_id"))
        if other is None:
            continue
        if other.get("seed") != r.get("seed") or other.get("index") != r.get("index"):
            raise ConfigError(f"episode {r.get('episode_id')}: seed/task {r.get('seed')}/{r.get('index')} vs "
                              f"{other.get('seed')}/{other.get('index')}: not the same track, cannot pair.")
        va = episode_values(r, submitted, threshold).get(metric)
        vb = episode_values(other, submitted, threshold).get(metric)
        if va is None or vb is None:
            continue
        per_task.setdefault(r.get("index"), []).append(va - vb)
        n += 1
    diff, lo, hi = bootstrap(list(per_task.values()), _mean_of_task_means, seed=seed, num_boot=num_boot)
    return {"metric": metric, "diff": diff, "lo": lo, "hi": hi, "n": n, "tasks": len(per_task)}


def noise_statistics(records: Sequence[Mapping[str, Any]], *, submitted: Sequence[str],
                     threshold: float) -> dict[str, Any]:
    """How noisy one entry's success rate is (see the module docstring for the definitions).

    Returns:
        ``{"trials": smallest number of trials of a task, "flip_rate": share of the tasks with
        >= 2 trials whose verdict differs across them (``None`` when no task has two),
        "flip_tasks": those tasks, "mdd": minimum detectable difference of the success rate
        (``None`` under 2 tasks)}``.
    """
    tasks = _by_task(records)
    counts = [(sum(episode_values(r, submitted, threshold)["success"] for r in rs), len(rs))
              for rs in tasks.values()]
    multi = [(c, n) for c, n in counts if n >= 2]
    flips = sum(1 for c, n in multi if 0 < c < n)
    out: dict[str, Any] = {"trials": min((n for _, n in counts), default=0),
                           "flip_rate": flips / len(multi) if multi else None, "flip_tasks": len(multi),
                           "mdd": None}
    if len(counts) >= 2:
        rates = np.array([c / n for c, n in counts], dtype=float)
        total_s, total_n = float(sum(c for c, _ in counts)), float(sum(n for _, n in counts))
        p = (total_s + 2.0) / (total_n + 4.0)
        per_task_trials = total_n / len(counts)
        var = max(float(np.var(rates, ddof=1)), p * (1.0 - p) / per_task_trials)
        out["mdd"] = float(MDD_Z * math.sqrt(2.0 * var / len(counts)))
    return out

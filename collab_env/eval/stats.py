"""Intervals at the right unit, by the metric's type: the one statistics toolkit of results files.

A learning result is a set of numbers indexed by a **training seed** and an **evaluation item**
(and sometimes an evaluation trial). Episodes of one seed share a model, and episodes of one item
share a difficulty, so they are not independent draws: an interval that treats ``seeds x items``
episodes as independent is too narrow. What this module offers, and when to use each:

* :func:`interval` ``(values, kind)``: values that *are* independent draws (one model, distinct
  items, one episode each). The method follows the metric's **declared** type, never the values it
  happens to take: ``"binary"`` (success: every value 0 or 1) gets Wilson's score interval;
  ``"count"`` and ``"continuous"`` (questions asked, tokens, reward) get Student's t interval. A
  count whose episodes all happen to be 0 or 1 is still a count.
* :func:`seed_interval` ``({seed: values})``: the unit is the training seed. Each seed's values
  are averaged, and the interval is Student's t over the seed means (``n_seeds - 1`` degrees of
  freedom). With 3 to 10 seeds this is the honest interval of "what training does"; it is wide.
* :func:`hierarchical_bootstrap` ``({seed: {item: value}})``: seeds and items both random,
  crossed (every seed evaluated on the same items): each resample draws seeds with replacement and,
  independently, items with replacement, and averages the cells they pick. Percentile interval.
  With few seeds it is narrower than :func:`seed_interval` (a bootstrap over 5 units does not
  know it is guessing a spread from 5 values); report it beside the seed interval, not instead.
* :func:`paired_difference` ``(a, b)``: two rows on the same seeds and items (a control and a
  treatment trained from the same seeds): the per-cell difference ``a - b`` over the cells both
  have, with both intervals above. Pairing removes the item and seed effects the rows share.
* :func:`aptitude` and :func:`unreliability` ``({item: [score per trial]})``: the measures of
  "LLMs Get Lost in Multi-Turn Conversation" (Laban et al., 2025) for one model, whose trials of
  one item differ only by sampling: per item, a high :func:`percentile` of its trial scores
  (aptitude, default the 90th: how well the model does on its good runs) and the spread between
  a high and a low one (unreliability, default 90th minus 10th: how far its good and bad runs
  lie apart); each averaged over the items, with Student's t interval over the items (the items
  are the independent draws; the trials of one item are not).

Every function returns a plain dict (``mean``, ``lo``, ``hi``, ``method`` and the counts), ready
for a results JSON; ``lo``/``hi`` are NaN where no interval exists (one seed, no values).
Student's t quantiles come from SciPy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from collab_env.errors import ConfigError

__all__ = ["KINDS", "wilson_interval", "t_interval", "interval", "seed_interval", "hierarchical_bootstrap",
           "paired_difference", "percentile", "item_aptitude", "item_unreliability", "aptitude", "unreliability"]

#: The metric types :func:`interval` knows.
KINDS = ("binary", "count", "continuous")
Kind = Literal["binary", "count", "continuous"]
NUM_BOOT = 2000


def _z(level: float) -> float:
    from statistics import NormalDist

    return NormalDist().inv_cdf(0.5 + level / 2)


def _check_level(level: float) -> None:
    if not 0.0 < level < 1.0:
        raise ConfigError(f"level must be between 0 and 1 (e.g. 0.95), got {level!r}.")


def wilson_interval(successes: float, n: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson's score interval of the proportion ``successes / n`` (``(nan, nan)`` for ``n = 0``):
    unlike mean +- z SE it stays inside [0, 1] and is not empty at 0/n or n/n."""
    _check_level(level)
    if n == 0:
        return (math.nan, math.nan)
    z = _z(level)
    p = successes / n
    den = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return (centre - half, centre + half)


def t_interval(xs: Sequence[float], level: float = 0.95) -> dict[str, Any]:
    """``{"mean", "lo", "hi", "n", "method": "t"}``: the mean of ``xs`` and Student's t interval
    (sample standard deviation, ``n - 1`` degrees of freedom); NaN bounds below 2 values."""
    _check_level(level)
    xs = [float(x) for x in xs]
    n = len(xs)
    if n == 0:
        return {"mean": math.nan, "lo": math.nan, "hi": math.nan, "n": 0, "method": "t"}
    m = sum(xs) / n
    if n < 2:
        return {"mean": m, "lo": math.nan, "hi": math.nan, "n": 1, "method": "t"}
    from scipy.stats import t

    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))
    half = float(t.ppf(0.5 + level / 2, n - 1)) * sd / math.sqrt(n)
    return {"mean": m, "lo": m - half, "hi": m + half, "n": n, "method": "t"}


def interval(xs: Sequence[float], kind: Kind, level: float = 0.95) -> dict[str, Any]:
    """``{"mean", "lo", "hi", "n", "method"}`` of independent values of a metric of type ``kind``
    (:data:`KINDS`): Wilson for ``"binary"`` (every value must be 0 or 1), Student's t for
    ``"count"`` and ``"continuous"``."""
    if kind not in KINDS:
        raise ConfigError(f"kind must be one of {', '.join(KINDS)} (the metric's type), got {kind!r}.")
    if kind != "binary":
        return t_interval(xs, level)
    xs = [float(x) for x in xs]
    if any(x not in (0.0, 1.0) for x in xs):
        raise ConfigError("a 'binary' metric's values must be 0 or 1; pass kind='continuous' for a rate "
                          "or a mean.")
    lo, hi = wilson_interval(sum(xs), len(xs), level)
    return {"mean": sum(xs) / len(xs) if xs else math.nan, "lo": lo, "hi": hi, "n": len(xs), "method": "wilson"}


def _cells(table: Mapping[Any, Any]) -> dict[Any, list[float]]:
    """``{seed: [values]}`` from ``{seed: values}`` or ``{seed: {item: value}}``."""
    out = {}
    for seed, row in table.items():
        values = row.values() if isinstance(row, Mapping) else row
        out[seed] = [float(v) for v in values]
    return out


def seed_interval(table: Mapping[Any, Sequence[float] | Mapping[Any, float]], level: float = 0.95) -> dict[str, Any]:
    """Student's t interval over the seed means of ``{seed: values}`` (or ``{seed: {item:
    value}}``): ``{"mean", "lo", "hi", "n_seeds", "seed_means", "method": "t over seeds"}``.
    ``mean`` is the mean of the seed means. A seed with no value is an error."""
    rows = _cells(table)
    empty = [s for s, v in rows.items() if not v]
    if empty:
        raise ConfigError(f"seed(s) {empty} have no values: drop them or evaluate them.")
    means = {s: sum(v) / len(v) for s, v in rows.items()}
    t = t_interval(list(means.values()), level)
    return {"mean": t["mean"], "lo": t["lo"], "hi": t["hi"], "n_seeds": t["n"], "seed_means": means,
            "method": "t over seeds"}


def hierarchical_bootstrap(table: Mapping[Any, Mapping[Any, float]], *, level: float = 0.95, seed: int = 0,
                           num_boot: int = NUM_BOOT) -> dict[str, Any]:
    """Percentile interval of the mean of ``{seed: {item: value}}`` by a crossed bootstrap:
    seeds and items resampled independently, with replacement, and the mean taken over the
    picked cells that exist (``{"mean", "lo", "hi", "n_seeds", "n_items", "method"}``). The
    resamples come from ``numpy.random.default_rng(seed)``: same data, same interval."""
    _check_level(level)
    import numpy as np

    seeds = list(table)
    items = sorted({i for row in table.values() for i in row}, key=repr)
    if not seeds or not items:
        return {"mean": math.nan, "lo": math.nan, "hi": math.nan, "n_seeds": len(seeds), "n_items": len(items),
                "method": "crossed bootstrap (seeds x items)"}
    grid = np.full((len(seeds), len(items)), np.nan)
    col = {item: j for j, item in enumerate(items)}
    for i, s in enumerate(seeds):
        for item, v in table[s].items():
            grid[i, col[item]] = float(v)
    present = ~np.isnan(grid)
    mean = float(grid[present].mean())
    rng = np.random.default_rng(seed)
    si = rng.integers(0, len(seeds), size=(num_boot, len(seeds)))
    ii = rng.integers(0, len(items), size=(num_boot, len(items)))
    values = np.where(present, grid, 0.0)
    boots = np.empty(num_boot)
    for b in range(num_boot):
        # seed and item multiplicities: the mean over the picked cells, weighted by how often each
        # seed and each item was drawn, over the cells that exist
        ws = np.bincount(si[b], minlength=len(seeds)).astype(float)
        wi = np.bincount(ii[b], minlength=len(items)).astype(float)
        w = np.outer(ws, wi) * present
        total = w.sum()
        boots[b] = (w * values).sum() / total if total else np.nan
    boots = boots[~np.isnan(boots)]
    a = (1.0 - level) / 2.0
    lo, hi = (np.quantile(boots, [a, 1.0 - a]) if boots.size else (math.nan, math.nan))
    return {"mean": mean, "lo": float(lo), "hi": float(hi), "n_seeds": len(seeds), "n_items": len(items),
            "method": "crossed bootstrap (seeds x items)"}


def paired_difference(a: Mapping[Any, Mapping[Any, float]], b: Mapping[Any, Mapping[Any, float]], *,
                      level: float = 0.95, seed: int = 0, num_boot: int = NUM_BOOT) -> dict[str, Any]:
    """``a - b`` per (seed, item) cell that both rows have, with :func:`seed_interval` of the
    per-seed mean differences (``"seeds"``) and :func:`hierarchical_bootstrap` (``"bootstrap"``);
    ``"cells"`` counts the pairs and ``"differ"`` those whose values differ (a zero-width interval
    over seeds is then read as "the rows agree in every cell" or not). Rows that share no cell are
    an error."""
    diff: dict[Any, dict[Any, float]] = {}
    for s in a:
        if s in b:
            shared = {i: float(a[s][i]) - float(b[s][i]) for i in a[s] if i in b[s]}
            if shared:
                diff[s] = shared
    if not diff:
        raise ConfigError("the two rows share no (seed, item) cell: a paired difference needs the same seeds "
                          "and items in both.")
    seeds = seed_interval(diff, level)
    return {"mean": seeds["mean"], "cells": sum(len(v) for v in diff.values()),
            "differ": sum(x != 0.0 for v in diff.values() for x in v.values()), "seeds": seeds,
            "bootstrap": hierarchical_bootstrap(diff, level=level, seed=seed, num_boot=num_boot)}


def percentile(xs: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``xs`` by linear interpolation between the closest
    ranks (numpy's default method), NaN for no values.

    Raises:
        ConfigError: ``q`` outside [0, 100].
    """
    if isinstance(q, bool) or not isinstance(q, (int, float)) or not 0 <= q <= 100:
        raise ConfigError(f"q must be a percentile in [0, 100], got {q!r}.")
    v = sorted(float(x) for x in xs)
    if not v:
        return math.nan
    pos = (len(v) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def item_aptitude(scores: Sequence[float], high: float = 90) -> float:
    """One item's aptitude: the ``high``-th :func:`percentile` of its trial scores."""
    return percentile(scores, high)


def item_unreliability(scores: Sequence[float], high: float = 90, low: float = 10) -> float:
    """One item's unreliability: the ``high``-th minus the ``low``-th :func:`percentile` of its
    trial scores (0 when every trial scores the same)."""
    if low > high:
        raise ConfigError(f"low ({low}) must not exceed high ({high}).")
    return percentile(scores, high) - percentile(scores, low)


def _per_item(table: Mapping[Any, Sequence[float]], what: str, min_trials: int) -> dict[Any, list[float]]:
    rows = {item: [float(x) for x in v] for item, v in table.items()}
    if not rows:
        raise ConfigError(f"{what} needs {{item: [score per trial]}} with at least one item.")
    few = [i for i, v in rows.items() if len(v) < min_trials]
    if few:
        raise ConfigError(f"{what} needs at least {min_trials} trials per item; item(s) {few[:5]} have fewer: "
                          "play every item several times (the measure is a spread over trials).")
    return rows


def aptitude(table: Mapping[Any, Sequence[float]], *, high: float = 90, level: float = 0.95) -> dict[str, Any]:
    """The aptitude of one model (Laban et al., 2025): the mean over items of each item's
    ``high``-th percentile of its trial scores (:func:`item_aptitude`).

    Args:
        table: ``{item: [score of each trial]}``, every item with at least 2 trials.
        high: The percentile (default 90).
        level: Coverage of the interval.

    Returns:
        ``{"mean", "lo", "hi"}`` (Student's t over the items' values, :func:`t_interval`),
        ``"n_items"``, ``"trials"`` (the fewest of an item), ``"per_item"`` and ``"method"``.
    """
    rows = _per_item(table, "aptitude", 2)
    per_item = {i: item_aptitude(v, high) for i, v in rows.items()}
    t = t_interval(list(per_item.values()), level)
    return {"mean": t["mean"], "lo": t["lo"], "hi": t["hi"], "n_items": len(rows),
            "trials": min(len(v) for v in rows.values()), "per_item": per_item,
            "method": f"t over items of the per-item P{high:g}"}


def unreliability(table: Mapping[Any, Sequence[float]], *, high: float = 90, low: float = 10,
                  level: float = 0.95) -> dict[str, Any]:
    """The unreliability of one model (Laban et al., 2025): the mean over items of each item's
    ``high``-th minus ``low``-th percentile of its trial scores (:func:`item_unreliability`).

    Args and returns as :func:`aptitude` (``"method"`` names both percentiles).
    """
    rows = _per_item(table, "unreliability", 2)
    per_item = {i: item_unreliability(v, high, low) for i, v in rows.items()}
    t = t_interval(list(per_item.values()), level)
    return {"mean": t["mean"], "lo": t["lo"], "hi": t["hi"], "n_items": len(rows),
            "trials": min(len(v) for v in rows.values()), "per_item": per_item,
            "method": f"t over items of the per-item P{high:g} - P{low:g}"}

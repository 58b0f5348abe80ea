"""Baselines of the REINFORCE family: advantages of one group of sampled values.

A group is the ``G`` values (returns) of one agent's completions at one node of a rollout tree.
A baseline that does not depend on the sample it is subtracted from leaves the policy gradient
unbiased and only reduces its variance:

* ``"mean"``: the group mean, ``A_i = v_i - mean(v)``. The sample's own value is in the mean,
  so this is ``(G - 1) / G`` times the leave-one-out advantage: unbiased up to that scale.
* ``"rloo"``: leave-one-out (Kool et al. 2019, Ahmadian et al. 2024), ``A_i = v_i - mean of the
  other G - 1 values``.
* ``"remax"``: a value from outside the group (Li et al. 2023): the return of the greedy
  (temperature 0) joint action from the same node, ``A_i = v_i - v_greedy``.
* ``"none"``: plain REINFORCE, ``A_i = v_i``.

With ``normalize_std`` each advantage is then divided by the group's population std plus
``eps`` (the std of the values, so every baseline is scaled the same way).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

from collab_env.errors import ConfigError

__all__ = ["BASELINES", "baseline_advantages"]

BASELINES: tuple[str, ...] = ("mean", "rloo", "remax", "none")
"""The baselines :func:`baseline_advantages` knows."""


def baseline_advantages(values: Sequence[float], baseline: Literal["mean", "rloo", "remax", "none"], *,
                        greedy_value: float | None = None, normalize_std: bool = False,
                        eps: float = 1e-4) -> list[float]:
    """Advantages of one group of ``values`` under ``baseline`` (see the module docstring).

    Args:
        values: The group's values (returns), one per sampled completion.
        baseline: ``"mean"``, ``"rloo"``, ``"remax"`` or ``"none"``.
        greedy_value: The greedy joint action's value; required by ``"remax"`` only.
        normalize_std: Divide by the population std of ``values`` plus ``eps``.
        eps: Keeps the division finite for a group of equal values.

    Example: for ``[1, 0, 0, 1]`` ``"mean"`` gives ``[.5, -.5, -.5, .5]``, ``"rloo"`` gives
    ``[2/3, -2/3, -2/3, 2/3]`` and ``"remax"`` with ``greedy_value=0.25`` gives
    ``[.75, -.25, -.25, .75]``.

    Raises:
        ConfigError: An unknown baseline, ``"remax"`` without ``greedy_value``, ``"rloo"`` on a
            group of one.
    """
    n = len(values)
    v = [float(x) for x in values]
    if baseline not in BASELINES:
        raise ConfigError(f"baseline must be one of {list(BASELINES)}, got {baseline!r}.")
    if n == 0:
        return []
    if baseline == "mean":
        mean = sum(v) / n
        adv = [x - mean for x in v]
    elif baseline == "rloo":
        if n < 2:
            raise ConfigError("baseline='rloo' needs at least 2 samples per group: set num_generations >= 2.")
        total = sum(v)
        adv = [x - (total - x) / (n - 1) for x in v]
    elif baseline == "remax":
        if greedy_value is None:
            raise ConfigError("baseline='remax' needs greedy_value: the return of the greedy joint action.")
        adv = [x - float(greedy_value) for x in v]
    else:
        adv = v
    if not normalize_std:
        return adv
    mean = sum(v) / n
    std = math.sqrt(sum((x - mean) ** 2 for x in v) / n)
    return [a / (std + eps) for a in adv]

"""The ready TRL reward function of :func:`~collab_env.adapters.trl.rollout.rollout_func`'s output."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from collab_env.errors import ConfigError


def episode_reward(completions: Sequence[Any], episode_reward: Sequence[float] | None = None, **kwargs: Any
                   ) -> list[float]:
    """A TRL reward function: the episode's return of the trained player (the ``episode_reward``
    key of :func:`rollout_func`'s output). Logs the mean of each reward component
    (``log_metric``) when TRL passes it.

    Raises:
        ConfigError: No ``episode_reward`` keyword (the trainer was not given :func:`rollout_func`).
    """
    if episode_reward is None:
        raise ConfigError("episode_reward reads the rewards that collab_env.adapters.trl.rollout_func returns; pass "
                          "rollout_func=rollout_func(...) to the GRPOTrainer.")
    if len(episode_reward) != len(completions):
        raise ConfigError(f"{len(episode_reward)} episode rewards for {len(completions)} completions.")
    log_metric, components = kwargs.get("log_metric"), kwargs.get("reward_components")
    if log_metric is not None and components:
        for name in sorted({k for c in components for k in c}):
            log_metric(f"reward/{name}", sum(float(c.get(name, 0.0)) for c in components) / len(components))
    return [float(r) for r in episode_reward]

"""The success rate of an act-choosing function on held-out episodes of a wrapped env."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from collab_env.errors import ConfigError

__all__ = ["success_rate"]


def success_rate(env: Any, choose: Callable[[Any], int], episodes: int, *, component: str = "accuracy",
                 first_seed: int = 0) -> float:
    """The fraction of ``episodes`` episodes that ``choose`` solves.

    Episode ``k`` is reset with seed ``first_seed + k``; each step takes ``choose(obs)`` (e.g.
    ``lambda obs: int(model.predict(obs, deterministic=True)[0])``). An episode counts as solved
    when its final ``info["reward_components"][component]`` is exactly 1.0 (``accuracy`` on
    hidden-facts: the boxed answer is right).

    Args:
        env: A :class:`MacroActionWrapper` or :class:`RerankWrapper` (give one built on the
            ``test`` split for held-out items).
        choose: Observation -> action index.
        episodes: How many episodes (at least 1).
        component: The reward component that marks success.
        first_seed: The reset seed of the first episode.

    Raises:
        ConfigError: ``episodes < 1``, or an episode ended without ``component`` among its reward
            components (the env does not score it: pick another ``component``).
    """
    if episodes < 1:
        raise ConfigError(f"episodes must be at least 1, got {episodes}.")
    solved = 0
    for k in range(episodes):
        obs, _ = env.reset(seed=first_seed + k)
        done = False
        while not done:
            obs, _, term, trunc, info = env.step(choose(obs))
            done = term or trunc
        components = info.get("reward_components", {})
        if component not in components:
            raise ConfigError(f"episode {k} ended without a {component!r} reward component (it has "
                              f"{sorted(components)}); pass component= one of them.")
        solved += components[component] == 1.0
    return solved / episodes

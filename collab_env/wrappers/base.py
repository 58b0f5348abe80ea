"""The base of wrappers that keep the PettingZoo ``ParallelEnv`` API of a wrapped env.

:class:`EnvWrapper` delegates every method of the :class:`~collab_env.env.CollabEnv` API to the
wrapped env *explicitly* (no blanket ``__getattr__``: a wrapper states what it exposes), runs the
synchronous facades through the async core, and clones by cloning the wrapped env. A subclass
overrides the one thing it changes, usually :meth:`astep` (rewards) and :meth:`clone` when it
holds per-episode state.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

from collab_env.env import CollabEnv, EpisodeState
from collab_env.errors import ConfigError
from collab_env.types import Conversation

__all__ = ["EnvWrapper"]

_W = TypeVar("_W", bound="EnvWrapper")


class EnvWrapper:
    """A ``ParallelEnv`` that delegates to ``env`` (a :class:`CollabEnv` or another wrapper).

    Args:
        env: The environment to wrap; ``env.unwrapped`` must be a :class:`CollabEnv`.

    Raises:
        ConfigError: ``env`` is not a CollabEnv or a wrapper of one.
    """

    metadata: ClassVar[dict[str, Any]] = CollabEnv.metadata

    def __init__(self, env: Any) -> None:
        base = getattr(env, "unwrapped", None)
        if not isinstance(base, CollabEnv):
            raise ConfigError(
                f"{type(self).__name__} wraps a CollabEnv (or a wrapper of one), got {type(env).__name__}."
            )
        self.env = env

    # -- delegated API -------------------------------------------------------------------------
    @property
    def possible_agents(self) -> list[str]:
        return self.env.possible_agents

    @property
    def agents(self) -> list[str]:
        return self.env.agents

    @property
    def unwrapped(self) -> CollabEnv:
        return self.env.unwrapped

    @property
    def render_mode(self) -> str | None:
        return self.env.render_mode

    @property
    def spec(self) -> Any:
        return self.env.spec

    @property
    def task(self) -> Any:
        return self.env.unwrapped.task

    @property
    def episode(self) -> EpisodeState:
        return self.env.unwrapped.episode

    @property
    def on_turn(self) -> tuple[str, ...]:
        return self.env.on_turn

    def observation_space(self, agent: str) -> Any:
        return self.env.observation_space(agent)

    def action_space(self, agent: str) -> Any:
        return self.env.action_space(agent)

    def observe(self, agent: str) -> Conversation:
        return self.env.observe(agent)

    def state(self) -> Conversation:
        return self.env.state()

    def render(self) -> str | None:
        return self.env.render()

    def close(self) -> None:
        self.env.close()

    def end_episode(self, reason: str) -> None:
        self.env.end_episode(reason)

    # -- sync facades over the async core --------------------------------------------------------
    def reset(self, seed: int | None = None, options: Mapping[str, Any] | None = None):
        from collab_env._async import run_sync

        return run_sync(self.areset(seed=seed, options=options))

    def step(self, actions: Mapping[str, str]):
        from collab_env._async import run_sync

        return run_sync(self.astep(actions))

    async def areset(self, seed: int | None = None, options: Mapping[str, Any] | None = None):
        return await self.env.areset(seed=seed, options=options)

    async def astep(self, actions: Mapping[str, str]):
        return await self.env.astep(actions)

    def clone(self: _W) -> _W:
        """An independent copy: the wrapped env is cloned, the wrapper's fields copied shallowly
        (subclasses deep-copy what a forked future must not share)."""
        new = copy.copy(self)
        new.env = self.env.clone()
        return new

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.env!r}>"

"""TRL's tool route (``environment_factory``): the env's single-agent view as one tool."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from collab_env.adapters.trl.data import item_of
from collab_env.adapters.trl.envs import env_builder, trained_player


class CollabToolEnv:
    """A collab_env env for TRL's ``environment_factory``: the single-agent view as one tool.

    TRL builds a pool of instances, calls ``reset(**row)`` before each rollout, exposes the
    public methods other than ``reset`` and ``get_reward`` as tools, and calls ``get_reward()``
    once the rollout is done. Build it through :func:`environment_factory`.

    A reward wrapper works as on any route: with ``reward="mr"`` each ``send_message`` is the
    assistant's reply, scored by its futures, and ``get_reward()`` sums those scores. The futures
    need a policy of their own for the trained player (``reward_kwargs["policy"]``): TRL does not
    hand its model to the tools, so an env without one is refused here.

    Args:
        build_env: Builds the env.
        player: The player the model plays (default: the env's only trainable player).
        policies: Player -> policy of the other players (default: the spec's defaults).
    """

    def __init__(self, build_env: Callable[[], Any], player: str | None = None,
                 policies: Mapping[str, Any] | None = None) -> None:
        from collab_env.errors import ConfigError
        from collab_env.rollout.driver import split_scorers
        from collab_env.wrappers.single_agent import SingleAgentEnv

        env = build_env()
        self._player = trained_player(env, player)
        self._view = SingleAgentEnv(env, self._player, policies=policies)
        _, scorers = split_scorers(env)
        missing = sorted({p for sc in scorers if hasattr(sc, "missing_policies")
                          for p in sc.missing_policies(self._view.policies)})
        if missing:
            # TRL keeps its model to itself on this route: nothing could play the trained player's
            # futures, and the first scored reply would fail inside a tool call.
            raise ConfigError(
                f"the env's reward rolls futures that need a policy for {missing}, which TRL's tool route cannot "
                "take from the model it trains: pass a policy object (e.g. an HFPolicy of the same checkpoint) "
                "or 'embedded' as reward_kwargs['policy'], or train through collab_env.adapters.trl.rollout_func, "
                "whose futures are played by the trained model.")
        self._reward = 0.0
        self._done = True

    def reset(self, **row: Any) -> str | None:
        """Start the episode of a dataset row (its ``index`` and ``seed`` columns, or the
        :data:`TAG` of its prompt). Returns ``None`` when the row has a prompt (the player's first
        observation, built by :func:`dataset`), else the text of that observation's last
        message, which TRL appends to the prompt."""
        if "index" in row and "seed" in row:
            index, seed = int(row["index"]), int(row["seed"])
        else:
            index, seed = item_of(row.get("prompt") or [])
        obs, _ = self._view.reset(seed=seed, options={"index": index})
        self._reward, self._done = 0.0, not self._view.env.agents
        return None if row.get("prompt") else obs.to_chat()[-1]["content"]

    def send_message(self, message: str) -> str:
        """Send a message to the other participants of the conversation and read their replies.

        Args:
            message: The message to send.

        Returns:
            What the others said, one line per message, or a note that the conversation ended.
        """
        if self._done:
            raise ValueError("the conversation has ended; give your final answer.")
        _, reward, terminated, truncated, info = self._view.step(str(message))
        self._reward += float(reward)
        self._done = bool(terminated or truncated)
        lines = [f"{p}: {t}" for p, t in info.get("other_moves", [])]
        if self._done:
            lines.append("[the conversation has ended]")
        return "\n".join(lines)

    def get_reward(self) -> float:
        """The player's return so far (TRL's reward of the rollout)."""
        return self._reward


def environment_factory(env_id_or_factory: Any, *, player: str | None = None,
                        policies: Mapping[str, Any] | None = None, split: str | None = None,
                        env_kwargs: Mapping[str, Any] | None = None) -> Callable[[], CollabToolEnv]:
    """A zero-argument factory of :class:`CollabToolEnv` for ``GRPOTrainer(environment_factory=...)``
    (arguments as in :func:`rollout_func`)."""
    build = env_builder(env_id_or_factory, split, env_kwargs)
    factory = functools.partial(CollabToolEnv, build, player, policies)
    factory()  # fail now on a bad env or player
    return factory

"""The env builder and player helpers the TRL adapter's routes share."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from collab_env.errors import ConfigError
from collab_env.policy import policies_for
from collab_env.rollout import check_policies


def env_builder(env_id_or_factory: Any, split: str | None, env_kwargs: Mapping[str, Any] | None) -> Callable[[], Any]:
    """A zero-argument function that builds a fresh env: from a registered env id, a factory, or a
    served env (its URL, ``"http://host:port"``, or its :class:`~collab_env.serve.client.CollabEnvClient`)."""
    kwargs = dict(env_kwargs or {})
    from collab_env.serve import served_url

    url = served_url(env_id_or_factory)
    if url is not None:  # a served env (collab-env serve): one session per env built
        if split is not None or kwargs:
            raise ConfigError("split= and env_kwargs= configure a registered env; a served env is configured where "
                              "it is served (collab-env serve ID --env-arg KEY=VALUE).")
        from collab_env.serve import remote_env

        return functools.partial(remote_env, url)
    if isinstance(env_id_or_factory, str):
        import collab_env

        if split is not None:
            kwargs["split"] = split
        return functools.partial(collab_env.make, env_id_or_factory, **kwargs)
    if callable(env_id_or_factory):
        if split is not None or kwargs:
            raise ConfigError("split= and env_kwargs= apply to a registered env id; a factory builds its env "
                              "itself (pass them to it).")
        return env_id_or_factory
    raise ConfigError(f"env must be a registered env id, a served env's URL or a zero-argument function that "
                      f"builds an env, got {type(env_id_or_factory).__name__}.")


def trained_player(env: Any, player: str | None) -> str:
    """The trained player: ``player`` checked against the env's players, or the env's only
    trainable player when ``player`` is None (:class:`~collab_env.errors.ConfigError` otherwise)."""
    trainable = [p for p in env.possible_agents if env.unwrapped.task.is_trainable(p)]
    if player is None:
        if len(trainable) != 1:
            raise ConfigError(f"this env has trainable players {trainable}: pass player= (one of them).")
        return trainable[0]
    if player not in env.possible_agents:
        raise ConfigError(f"player={player!r} is not a player of this env; players: {list(env.possible_agents)}.")
    return player


def other_policies(env: Any, player: str, policies: Mapping[str, Any] | None) -> dict[str, Any]:
    """Player -> checked policy of every player but the trained ``player`` (``policies`` over the
    spec's defaults); giving the trained player a policy is a :class:`~collab_env.errors.ConfigError`."""
    chosen = policies_for(env.spec, policies)
    if player in (policies or {}):
        raise ConfigError(f"{player!r} is the trained player (played by the trainer's model); do not give it a "
                          "policy.")
    chosen.pop(player, None)
    return check_policies(env, chosen, [p for p in env.possible_agents if p != player])

"""Envs served over OpenEnv (``collab-env serve ID``) and the client that plays them remotely.

:mod:`collab_env.serve.server` turns any registered env into an OpenEnv environment: one seat of
the env is played over the wire (HTTP ``/reset``, ``/step``, ``/state``, ``/schema`` and a WebSocket
``/ws`` with one env per connection), every other seat by a policy the server was given by spec.
:mod:`collab_env.serve.client` is the matching OpenEnv ``EnvClient`` and :func:`remote_env`, a
:class:`~collab_env.env.CollabEnv` with the served seat as its one player, so the episode driver,
the rollout engine and the learners play a served env like a local one (``env="http://host:port"``).

Both need the ``serve`` extra (``pip install 'collab_env[serve]'``); importing this package does not.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collab_env.env import CollabEnv

__all__ = ["is_url", "served_url", "remote_env"]


def is_url(env: Any) -> bool:
    """Whether ``env`` names a served env (an ``http://``, ``https://``, ``ws://`` or ``wss://`` URL)."""
    return isinstance(env, str) and env.split("://", 1)[0] in ("http", "https", "ws", "wss") and "://" in env


def served_url(env: Any) -> str | None:
    """The URL of a served env given as its URL or its client
    (:class:`~collab_env.serve.client.CollabEnvClient`), else ``None`` (an env id, a factory...).
    The one place an ``env=`` argument is recognised as a served env."""
    if is_url(env):
        return str(env)
    client = sys.modules.get("collab_env.serve.client")  # a client exists only once its module is loaded
    if client is not None and isinstance(env, client.CollabEnvClient):
        return env.base_url
    return None


def remote_env(url: str, **kwargs: Any) -> CollabEnv:
    """A :class:`~collab_env.env.CollabEnv` playing the seat served at ``url`` (see
    :func:`collab_env.serve.client.remote_env`)."""
    from collab_env.serve.client import remote_env as build

    return build(url, **kwargs)

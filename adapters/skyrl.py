"""SkyRL: any registered collab_env env as a SkyRL-Gym ``BaseTextEnv``.

SkyRL's generator builds one env per trajectory with
``skyrl_gym.make(env_class, env_config=..., extras=<the dataset row's extras>)``, calls
``init(prompt)`` for the first chat, then ``step(model_reply)`` until ``done``, appending the
returned ``observations`` (the new messages) to the chat it sends the model. :class:`CollabTextEnv`
plays the trained player's side of a collab_env env in that loop: every other player (a simulated
user, a fixed partner) is played by its policy through the one episode driver
(:func:`collab_env.rollout.advance` with ``until=(player,)``, inside the env's single-agent view
:class:`~collab_env.wrappers.single_agent.SingleAgentEnv`), so the rewards and observations are
the view's own for the same seed and replies::

    from collab_env.adapters.skyrl import register, dataset
    register("hidden-facts")                       # SkyRL env class "collab_env/hidden-facts-v2"
    rows = dataset("hidden-facts", num_items=64)   # prompt, env_class, extra_info{seed, index}
    # write rows to parquet and point SkyRL's data.train_data at it

Rows carry the episode's ``seed`` and task ``index`` in ``extra_info`` (SkyRL passes a row's
fields other than ``prompt`` and ``env_class`` to the env as ``extras``); the env resets
with them, so the episode is reproducible. ``init`` returns the env's own opening as the trained
player sees it (the row's ``prompt`` is the same chat, written by :func:`dataset`).

Needs the ``skyrl`` extra (``pip install 'collab_env[skyrl]'``).
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Mapping
from typing import Any, SupportsInt

from collab_env.errors import ConfigError, EnvStateError, require
from collab_env.types import template_chat

_skyrl_gym = require("skyrl_gym", "skyrl", "collab_env.adapters.skyrl")
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput  # noqa: E402

__all__ = ["CollabTextEnv", "register", "skyrl_id", "dataset"]

#: Prefix of the SkyRL env ids :func:`register` uses by default.
ID_PREFIX = "collab_env/"


def skyrl_id(env_id: str) -> str:
    """The SkyRL env id :func:`register` gives ``env_id`` by default: ``collab_env/<name>-vN``."""
    from collab_env.registry import spec

    return ID_PREFIX + spec(env_id).id


def _default_player(env_id: str) -> str:
    from collab_env.registry import spec

    s = spec(env_id)
    return s.trainable[0] if s.trainable else s.players[0]


def _episode_keys(extras: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """``(seed, index)`` of a row's extras: ``extra_info`` first, then the top level."""
    info = extras.get("extra_info") or {}
    if not isinstance(info, Mapping):
        raise ConfigError(f"extras['extra_info'] must be a dict, got {type(info).__name__}.")
    out = []
    for key in ("seed", "index"):
        v = info.get(key, extras.get(key))
        if v is not None:
            # numpy ints from parquet too (SupportsInt: what int() needs, which every Real here has)
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not isinstance(v, SupportsInt) or int(v) != v:
                raise ConfigError(f"extra_info[{key!r}] must be an int, got {v!r}.")
            v = int(v)
        out.append(v)
    return out[0], out[1]


def _plain(value: Any) -> Any:
    """JSON-friendly copy of an info value (SkyRL logs metadata; Conversations become chats)."""
    if isinstance(value, (str, bool, int)) or value is None:
        return value
    if isinstance(value, float):
        return value
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "to_chat"):
        return value.to_chat()
    return repr(value)


class CollabTextEnv(BaseTextEnv):
    """A collab_env env as a SkyRL ``BaseTextEnv``: the model plays ``player``, the driver plays
    everybody else.

    Args:
        env_config: SkyRL's per-env-class config (``skyrl_gym_cfg.<env_class>``); its keys, if
            any, are collab_env ``make`` keywords merged over ``env_kwargs``.
        extras: The dataset row's extras. ``extra_info.seed`` / ``extra_info.index`` (or
            top-level ``seed`` / ``index``) pick the episode; without a seed the view draws
            one. SkyRL's ``max_turns`` is ignored: the env ends its episodes itself.
        env_id: The registered collab_env id.
        player: The trained player (default: the spec's first trainable player).
        policies: Player -> policy (object, registered name or ``"module:Class"``) for the other
            players; left out: the spec's default policies.
        sampling: Player -> sampling keywords for those policies.
        env_kwargs: Keywords of ``collab_env.make`` (``reward="mr"``, ``reward_kwargs=``, env
            overrides such as ``num_objects=``).

    ``init(prompt)`` resets the env and returns the trained player's view as
    ``[{"role", "content"}]`` (the env's own opening, whatever ``prompt`` holds); ``step(reply)``
    returns the messages that view gained after the reply (the other players' moves and the env's
    feedback), the player's reward summed over that span, ``done`` when the episode ended, and
    the view's info as ``metadata``. :meth:`get_metrics` gives the episode's return, turns and
    reward components.
    """

    def __init__(
        self,
        env_config: Mapping[str, Any] | None = None,
        extras: Mapping[str, Any] | None = None,
        *,
        env_id: str,
        player: str | None = None,
        policies: Mapping[str, Any] | None = None,
        sampling: Mapping[str, Mapping[str, Any]] | None = None,
        env_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        import collab_env

        super().__init__()
        extras = dict(extras or {})
        cfg = {str(k): v for k, v in dict(env_config or {}).items() if k != "env_class"}
        kwargs = {**dict(env_kwargs or {}), **cfg}
        for bad in ("view", "policies"):
            if bad in kwargs:
                raise ConfigError(f"pass {bad}= to register()/CollabTextEnv as player=/policies=, not in env_kwargs.")
        self.env_id = env_id
        self.player = player or _default_player(env_id)
        self.seed, self.index = _episode_keys(extras)
        self.view = collab_env.make(env_id, view=self.player, policies=policies, **kwargs)
        if sampling:
            self.view.sampling = dict(sampling)
        self.max_turns = math.inf  # the env ends its episodes (SkyRL's max_turns is not used)
        self._chat: list[dict[str, str]] = []
        self._return = 0.0
        self._components: dict[str, float] = {}
        self._done = False
        self._started = False
        self._end_reason: str | None = None

    # -- SkyRL API -----------------------------------------------------------------------------
    def init(self, prompt: Any = None) -> tuple[list[dict[str, str]], dict[str, Any]]:
        """Reset the episode; return the trained player's opening chat and the reset info."""
        options = {"index": self.index} if self.index is not None else None
        obs, info = self.view.reset(seed=self.seed, options=options)
        self.turns, self._return, self._components = 0, 0.0, {}
        self._started, self._end_reason = True, None
        self._chat = template_chat(obs.to_chat())
        # A fault in the other players' opening moves ends the episode before the model acts.
        self._done = not self.view.env.agents
        if self._done:
            self._end_reason = self.view.env.episode.end_reason
        return list(self._chat), _plain(info)

    def step(self, action: str) -> BaseTextEnvStepOutput:
        """Send the model's reply; the other players act until it is on turn again or the end."""
        if not self._started:
            raise EnvStateError("step() before init(): SkyRL calls init(prompt) first.")
        if self._done:
            raise EnvStateError(f"the episode has ended ({self._end_reason}); make a new env.")
        if not isinstance(action, str):
            raise ConfigError(f"the action must be the reply text (str), got {type(action).__name__}.")
        obs, reward, terminated, truncated, info = self.view.step(action)
        self.turns += 1
        chat = template_chat(obs.to_chat())
        before = len(self._chat)
        # The view gained our reply (as the env stored it) and then everything the others and the
        # env wrote; SkyRL already appended the raw reply, so only the rest is new.
        if chat[:before] != self._chat or len(chat) <= before or chat[before]["role"] != "assistant":
            raise EnvStateError(
                f"the view of {self.player!r} is not the previous chat plus this reply; "
                "SkyRL needs append-only observations (is the player's history rewritten by the env?)."
            )
        new = chat[before + 1:]
        self._chat = chat
        self._return += float(reward)
        for k, v in info.get("reward_components", {}).items():
            self._components[k] = self._components.get(k, 0.0) + float(v)
        self._done = bool(terminated or truncated)
        if self._done:
            self._end_reason = self.view.env.episode.end_reason
        return BaseTextEnvStepOutput(observations=new, reward=float(reward), done=self._done,
                                     metadata=_plain(info))

    def get_metrics(self) -> dict[str, Any]:
        """The episode so far: ``return``, ``turns``, ``done`` and each reward component's sum."""
        out: dict[str, Any] = {"return": self._return, "turns": self.turns, "done": float(self._done)}
        out.update({f"reward/{k}": v for k, v in self._components.items()})
        return out

    def close(self) -> None:
        self.view.close()

    def __repr__(self) -> str:
        return f"<CollabTextEnv {self.env_id} player={self.player!r}>"


class _EnvFactory(functools.partial):
    """The entry point :func:`register` gives SkyRL: ``CollabTextEnv`` with the registered options.

    SkyRL's generator aggregates the episodes' metrics with
    ``skyrl_gym.metrics.aggregate_for_environment``, which calls ``entry_point.aggregate_metrics``
    as on an env class: a plain ``functools.partial`` has none.
    """

    aggregate_metrics = staticmethod(CollabTextEnv.aggregate_metrics)


def register(
    env_id: str,
    *,
    id: str | None = None,
    player: str | None = None,
    policies: Mapping[str, Any] | None = None,
    sampling: Mapping[str, Mapping[str, Any]] | None = None,
    **env_kwargs: Any,
) -> str:
    """Register ``env_id`` with ``skyrl_gym.register``; return the SkyRL id.

    Args:
        env_id: A registered collab_env id (``"hidden-facts"`` means its latest version).
        id: The SkyRL id (the rows' ``env_class``; default :func:`skyrl_id`).
        player: The trained player (default: the spec's first trainable player).
        policies: Player -> policy for the other players (objects are shared by every env
            instance, not copied).
        sampling: Player -> sampling keywords for those policies.
        **env_kwargs: Keywords of ``collab_env.make`` (``reward=``, ``reward_kwargs=``, env
            overrides).

    Registering the same id again replaces it. SkyRL builds envs in its generator's process:
    call this there (e.g. in the entry point that starts training).

    Raises:
        UnknownEnvError: ``env_id`` is not registered with collab_env.
        ConfigError: ``player`` is not a player of the env.
    """
    from collab_env.registry import spec

    s = spec(env_id)
    if player is not None and player not in s.players:
        raise ConfigError(f"player={player!r} is not a player of {s.id}; players: {list(s.players)}.")
    sid = id or skyrl_id(s.id)
    if sid in _skyrl_gym.registry:
        del _skyrl_gym.registry[sid]
    # The entry point holds the options, so skyrl_gym.make never deep-copies a policy object.
    factory = _EnvFactory(CollabTextEnv, env_id=s.id, player=player, policies=policies,
                          sampling=sampling, env_kwargs=dict(env_kwargs))
    _skyrl_gym.register(id=sid, entry_point=factory)
    return sid


def dataset(
    env_id: str,
    *,
    num_items: int | None = None,
    indices: Any = None,
    seed: int = 0,
    id: str | None = None,
    player: str | None = None,
    policies: Mapping[str, Any] | None = None,
    **env_kwargs: Any,
) -> list[dict[str, Any]]:
    """SkyRL dataset rows for ``env_id``: one per task item.

    Each row is ``{"prompt": <the trained player's opening chat>, "env_class": <SkyRL id>,
    "extra_info": {"seed": seed + k, "index": i}}`` for the ``k``-th item ``i``.

    Args:
        env_id: A registered collab_env id.
        num_items: Items ``0..num_items-1`` (default: every item of a finite suite).
        indices: The item indices instead.
        seed: Seed of the first row (row ``k`` gets ``seed + k``).
        id: The SkyRL id (default :func:`skyrl_id`).
        player, policies, **env_kwargs: As for :func:`register` (the opening is built by the
            same env, so a row's prompt is what ``init`` returns).

    Raises:
        ConfigError: The suite is unlimited and neither ``num_items`` nor ``indices`` is given.
    """
    import collab_env

    if indices is None:
        n = num_items
        if n is None:
            n = collab_env.make(env_id, **env_kwargs).task.num_items()
            if n is None:
                raise ConfigError(f"{env_id} draws unlimited items: pass num_items= or indices=.")
        indices = range(int(n))
    sid = id or skyrl_id(env_id)
    rows = []
    for k, i in enumerate(indices):
        env = CollabTextEnv(extras={"extra_info": {"seed": seed + k, "index": int(i)}}, env_id=env_id,
                            player=player, policies=policies, env_kwargs=env_kwargs)
        chat, _ = env.init()
        env.close()
        rows.append({"prompt": chat, "env_class": sid, "extra_info": {"seed": seed + k, "index": int(i)}})
    return rows

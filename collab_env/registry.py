"""The registry: environments as data, with versioned ids.

An :class:`EnvSpec` says everything about an environment without building it: the entry point
(a ``"module:function"`` string, so registering imports nothing heavy), its players and turn
order, which players a learner trains and which default policies drive the others, its reward
and its limits. Ids are ``name-vN``; an unversioned id means the latest version. Any change of
behaviour, prompt or reward bumps the version.

Every spec is also registered with Gymnasium as ``collab_env/<name>-vN``: ``gymnasium.make``
then returns the single-agent view (the first trainable player; ``player=`` picks another)
with the other players driven by the spec's default policies (``policies=`` overrides them).
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from collab_env.errors import ConfigError, UnknownEnvError, did_you_mean

__all__ = ["EnvSpec", "register", "make", "spec", "registry", "list_envs", "load_entry_point"]

_ID_RE = re.compile(r"^(?P<name>[a-z0-9][a-z0-9_.\-]*?)(?:-v(?P<version>\d+))?$")
GYM_NAMESPACE = "collab_env"


@dataclass(frozen=True)
class EnvSpec:
    """Everything about a registered environment, as data.

    Args:
        id: ``name-vN``.
        entry_point: ``"module:callable"`` (or a callable) returning a ``CollabEnv``.
        kwargs: Default keyword arguments for the entry point (``make`` overrides merge in).
        players: Player ids, in order.
        turn_order: Cycle of sets of players on turn.
        trainable: Players a learner controls; the rest are simulated (users, fixed partners).
        default_policies: Player -> policy spec (``"module:Class"``) for players a single-agent
            view does not control.
        reward: Reward configuration as data, e.g. ``{"accuracy": 1.0}`` (weights by name).
        reward_range: Bounds of one episode's return per trainable player.
        limits: Budgets, e.g. ``{"max_steps": 12}``.
        description: One paragraph for ``collab-env info``.
        suite: Task suite name (``"builtin"``, ``"collabllm"``, ``"comlrl"``...).
        needs_data: The env reads a dataset that may need a download (``data_files=`` works
            offline).
    """

    id: str
    entry_point: str | Callable[..., Any]
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    players: tuple[str, ...] = ()
    turn_order: tuple[tuple[str, ...], ...] = ()
    trainable: tuple[str, ...] = ()
    default_policies: Mapping[str, str] = field(default_factory=dict)
    reward: Mapping[str, float] = field(default_factory=dict)
    reward_range: tuple[float, float] = (-float("inf"), float("inf"))
    limits: Mapping[str, Any] = field(default_factory=dict)
    description: str = ""
    suite: str = "custom"
    needs_data: bool = False

    def __post_init__(self) -> None:
        m = _ID_RE.match(self.id)
        if not m or m.group("version") is None:
            raise ConfigError(
                f"env id {self.id!r} must look like 'name-vN' (lowercase name, e.g. 'my-task-v0')."
            )
        for p in self.trainable:
            if p not in self.players:
                raise ConfigError(f"{self.id}: trainable player {p!r} is not in players {self.players}.")
        for p in self.default_policies:
            if p not in self.players:
                raise ConfigError(f"{self.id}: default policy for unknown player {p!r}.")

    @property
    def name(self) -> str:
        return _ID_RE.match(self.id).group("name")  # type: ignore[union-attr]

    @property
    def version(self) -> int:
        return int(_ID_RE.match(self.id).group("version"))  # type: ignore[union-attr]

    @property
    def gym_id(self) -> str:
        return f"{GYM_NAMESPACE}/{self.id}"

    def make(self, **kwargs: Any):
        return make(self.id, **kwargs)

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly summary (for ``collab-env info`` and result files)."""
        ep = self.entry_point if isinstance(self.entry_point, str) else repr(self.entry_point)
        return {
            "id": self.id,
            "entry_point": ep,
            "kwargs": {k: repr(v) if not isinstance(v, (int, float, str, bool, type(None))) else v
                       for k, v in self.kwargs.items()},
            "players": list(self.players),
            "turn_order": [list(t) for t in self.turn_order],
            "trainable": list(self.trainable),
            "default_policies": dict(self.default_policies),
            "reward": dict(self.reward),
            "reward_range": list(self.reward_range),
            "limits": dict(self.limits),
            "suite": self.suite,
            "needs_data": self.needs_data,
            "description": self.description,
        }


registry: dict[str, EnvSpec] = {}


def register(spec_or_id: EnvSpec | str, /, **fields: Any) -> EnvSpec:
    """Register an environment: ``register(EnvSpec(...))`` or ``register("id-v0", entry_point=...,
    ...)``. Re-registering an id replaces it (with a warning from Gymnasium only)."""
    s = spec_or_id if isinstance(spec_or_id, EnvSpec) else EnvSpec(id=spec_or_id, **fields)
    registry[s.id] = s
    _register_gym(s)
    return s


def _register_gym(s: EnvSpec) -> None:
    import gymnasium

    if s.gym_id in gymnasium.registry:
        del gymnasium.registry[s.gym_id]
    gymnasium.register(
        id=s.gym_id,
        entry_point="collab_env.registry:_make_gym_view",
        kwargs={"env_id": s.id},
        disable_env_checker=False,
    )


def _versions(name: str) -> list[EnvSpec]:
    return sorted((s for s in registry.values() if s.name == name), key=lambda s: s.version)


def spec(env_id: str) -> EnvSpec:
    """The :class:`EnvSpec` of ``env_id`` (unversioned: the latest version)."""
    if not isinstance(env_id, str):
        raise UnknownEnvError(f"env id must be a str, got {type(env_id).__name__}.")
    if env_id.startswith(GYM_NAMESPACE + "/"):
        env_id = env_id[len(GYM_NAMESPACE) + 1:]
    if env_id in registry:
        return registry[env_id]
    m = _ID_RE.match(env_id)
    if m and m.group("version") is None:
        versions = _versions(env_id)
        if versions:
            return versions[-1]
    if m and m.group("version") is not None:
        versions = _versions(m.group("name"))
        if versions:
            raise UnknownEnvError(
                f"{env_id!r} is not registered; versions of {m.group('name')!r}: "
                + ", ".join(s.id for s in versions) + "."
            )
    names = sorted({s.name for s in registry.values()} | set(registry))
    raise UnknownEnvError(
        f"no environment {env_id!r}." + did_you_mean(env_id, names)
        + " `collab-env list` shows every registered id."
    )


def load_entry_point(ref: str | Callable[..., Any]) -> Callable[..., Any]:
    """Resolve ``"package.module:attr"`` (or return a callable unchanged)."""
    if callable(ref):
        return ref
    if not isinstance(ref, str) or ":" not in ref:
        raise ConfigError(f"entry point must be 'module:attr' or a callable, got {ref!r}.")
    mod_name, _, attr = ref.partition(":")
    mod = importlib.import_module(mod_name)
    obj = mod
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def make(
    env_id: str,
    *,
    view: str | None = None,
    policies: Mapping[str, Any] | None = None,
    render_mode: str | None = None,
    reward: str | None = None,
    reward_kwargs: Mapping[str, Any] | None = None,
    **overrides: Any,
):
    """Build a registered environment.

    Args:
        env_id: Registered id; ``"name"`` means the latest version.
        view: A player id: return the single-agent Gymnasium view for that player instead of the
            ParallelEnv, the other players driven by ``policies`` or the spec's defaults.
        policies: Player -> policy object or ``"module:Class"`` spec (only with ``view``).
        render_mode: ``"ansi"`` or ``"human"``.
        reward: ``None`` (the env's own reward), ``"mr"`` (the multiturn-aware reward) or
            ``"conversation"`` (scored at the episode's end), built from the spec's reward
            weights by :func:`collab_env.rewards.mr.default_reward`.
        reward_kwargs: Keywords for that builder: ``judge``, ``user``, ``policy`` (an API model
            string, ``"embedded"`` or a policy object), ``num_rollouts``, ``aggregation``...
            ``reward="mr"`` on an env whose default user ignores the reply (the ``collabllm-*``
            envs replay recorded turns) needs ``user`` (``"replay"`` keeps the recorded turns
            on purpose); without it :class:`~collab_env.errors.ConfigError` lists the choices.
        **overrides: Merged over the spec's kwargs; unknown keywords are an error that lists the
            valid ones.
    """
    s = spec(env_id)
    fn = load_entry_point(s.entry_point)
    kwargs = {**s.kwargs, **overrides}
    if reward not in (None, "mr", "conversation"):
        raise ConfigError(f"reward must be None, 'mr' or 'conversation', got {reward!r}.")
    if reward is None and reward_kwargs:
        raise ConfigError("reward_kwargs= needs reward='mr' or reward='conversation'.")
    env = fn(render_mode=render_mode, **kwargs)
    env.spec = replace(s, kwargs=kwargs)
    if reward is not None:
        from collab_env.rewards.mr import default_reward

        env = default_reward(env, reward, **dict(reward_kwargs or {}))
    if view is None:
        if policies is not None:
            raise ConfigError("policies= only applies with view=<player>; drive players yourself otherwise.")
        return env
    from collab_env.wrappers.single_agent import SingleAgentEnv

    return SingleAgentEnv(env, player=view, policies=policies)


def _make_gym_view(env_id: str, player: str | None = None, policies: Mapping[str, Any] | None = None,
                   render_mode: str | None = None, reward: str | None = None,
                   reward_kwargs: Mapping[str, Any] | None = None, **overrides: Any):
    s = spec(env_id)
    player = player or (s.trainable[0] if s.trainable else s.players[0])
    return make(env_id, view=player, policies=policies, render_mode=render_mode, reward=reward,
                reward_kwargs=reward_kwargs, **overrides)


def list_envs(suite: str | None = None) -> list[str]:
    """Registered ids (all versions), optionally of one suite, sorted."""
    return sorted(s.id for s in registry.values() if suite is None or s.suite == suite)

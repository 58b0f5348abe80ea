"""The registry: environments as data, with versioned ids.

An :class:`EnvSpec` says everything about an environment without building it: the entry point
(a ``"module:function"`` string, so registering imports nothing heavy), its players and turn
order, which players a learner trains and which default policies drive the others, its reward
and its limits. Ids are ``name-vN``; an unversioned id means the latest version. Any change of
behaviour, prompt or reward bumps the version.

A version that a newer one replaces stays registered, so results recorded on it reproduce, but
it is *superseded*: its spec says what the next version changed (:attr:`EnvSpec.superseded`),
building it warns with :class:`~collab_env.errors.DeprecatedEnvWarning` (what changed, the id to
use, as Gymnasium warns about an out-of-date version), and ``collab-env list`` shows it only
with ``--all``.

Every spec is also registered with Gymnasium as ``collab_env/<name>-vN``: ``gymnasium.make``
then returns the single-agent view (the first trainable player; ``player=`` picks another)
with the other players driven by the spec's default policies (``policies=`` overrides them).

This module is the engine's end of building envs: it builds *base* envs
(:func:`make_base_env`, the spec's entry point, an env factory, called with the spec's kwargs)
and imports nothing above :mod:`collab_env.env`. Composing an id with a reward wrapper and the
single-agent view is the composer's job, above the rewards and the wrappers:
:func:`collab_env.compose.make` (``collab_env.make``). A layer below the composer that builds envs
from ids (the rollout engine) builds base envs here; for a composed env its caller passes a
factory (``lambda: collab_env.make(id, reward="mr")``).
"""

from __future__ import annotations

import inspect
import math
import re
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from collab_env.errors import ConfigError, DeprecatedEnvWarning, UnknownEnvError, did_you_mean
from collab_env.policy import load_entry_point

__all__ = ["EnvCard", "EnvSpec", "register", "make_base_env", "spec", "registry", "list_envs",
           "latest_spec", "deprecation_message"]

_ID_RE = re.compile(r"^(?P<name>[a-z0-9][a-z0-9_.\-]*?)(?:-v(?P<version>\d+))?$")
GYM_NAMESPACE = "collab_env"


#: The :attr:`EnvCard.reward_range` key of the env's own reward (``make(id)``); the other keys
#: name reward options: ``"mr"`` and ``"conversation"`` (``make(id, reward=...)``), or a task's
#: own modes (e.g. ``"joint"``, ``"per_agent"``, ``"difference"`` for ``JointReward``).
DEFAULT_REWARD = "default"

_CARD_TEXT_FIELDS = ("tests", "reward", "limits", "data", "licence")


class FrozenDict(dict):
    """A read-only ``dict`` (the mappings of an :class:`EnvCard`): equal to, and JSON-encoded
    as, a plain dict; it pickles (an env pickles its spec), unlike ``MappingProxyType``."""

    def _read_only(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("an EnvCard's mappings are read-only; build a new card instead.")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _read_only  # type: ignore[assignment]
    __ior__ = _read_only  # type: ignore[assignment]

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (dict(self),))

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(sorted(self.items())))


_AUDIT_KEYS = ("naive", "policies", "reward_kwargs", "rewards", "episodes", "runs_code")


def _deep_frozen(value: Any) -> Any:
    """Mappings (nested too) as :class:`FrozenDict`, lists as tuples: a card stays hashable."""
    if isinstance(value, Mapping):
        return FrozenDict({k: _deep_frozen(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(_deep_frozen(v) for v in value)
    return value


def _thawed(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _thawed(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_thawed(v) for v in value]
    return value


def _frozen_mapping(value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"EnvCard.{what} must be a mapping, got {type(value).__name__}.")
    return FrozenDict(value)


@dataclass(frozen=True)
class EnvCard:
    """The env card: what an environment tests and how it scores, as data.

    ``collab-env info ID`` prints it, ``EnvSpec.to_dict()`` includes it, the README catalogue
    summarises it and each env's docstring carries it (:meth:`to_docstring`); tests keep the
    three in step with the card in the registry, the one source of truth.

    Args:
        tests: What the environment tests (one or two sentences).
        players: Player -> the role it plays (every player of the spec, no other).
        sees: Player -> what it observes (every player of the spec, no other).
        reward: The reward's formula in words, per reward option where they differ.
        reward_range: Reward option -> ``(lo, hi)``, the bounds of one episode's return of a
            trainable player; ``"default"`` (the env's own reward, equal to
            ``EnvSpec.reward_range``) is required; ``"mr"``, ``"conversation"`` and a task's own
            modes (e.g. ``JointReward``'s) are the others. Bounds may be infinite when no bound
            exists (say why in ``reward``).
        limits: Episode budgets and what ends an episode.
        data: Where the items come from.
        licence: The data's licence (or where to read it).
        baselines: Reference policy (or policy set) -> its measured score with the number of
            episodes, e.g. ``"success 1.000 (200 ep)"``; or why there is no measurement.
        audit: The exploit audit's settings (:func:`collab_env.exploits.audit_exploits`):
            ``"naive"`` (player -> policy of the naive baseline: an honest policy that does not
            collaborate; ``{"fixed": TEXT}`` always replies ``TEXT``), optionally ``"policies"``
            (the simulated players' policies), ``"reward_kwargs"`` (reward option ->
            ``reward_kwargs``), ``"rewards"`` (the options audited, default all),
            ``"episodes"`` and ``"runs_code"`` (``True``: the env's own reward runs the
            assistant's code, so the hostile programs are played too). Empty: the env has no
            naive baseline to audit against.
        exploits: The audit's result as the card quotes it
            (:meth:`~collab_env.exploits.ExploitReport.card_text`); empty when not audited.
    """

    tests: str
    players: Mapping[str, str]
    sees: Mapping[str, str]
    reward: str
    reward_range: Mapping[str, tuple[float, float]]
    limits: str
    data: str
    licence: str
    baselines: Mapping[str, str]
    audit: Mapping[str, Any] = field(default_factory=dict)
    exploits: str = ""

    def __post_init__(self) -> None:
        for name in _CARD_TEXT_FIELDS:
            v = getattr(self, name)
            if not isinstance(v, str) or not v.strip():
                raise ConfigError(f"EnvCard.{name} must be a non-empty string, got {v!r}.")
        for name in ("players", "sees", "baselines"):
            m = _frozen_mapping(getattr(self, name), name)
            if not m:
                raise ConfigError(f"EnvCard.{name} is empty: give one entry per "
                                  + ("reference policy." if name == "baselines" else "player."))
            for k, v in m.items():
                if not isinstance(k, str) or not k or not isinstance(v, str) or not v.strip():
                    raise ConfigError(f"EnvCard.{name}[{k!r}] must map a name to a non-empty "
                                      f"string, got {v!r}.")
            object.__setattr__(self, name, m)
        audit = _frozen_mapping(self.audit, "audit")
        unknown = sorted(set(audit) - set(_AUDIT_KEYS))
        if unknown or (audit and "naive" not in audit):
            raise ConfigError(f"EnvCard.audit takes the keys {list(_AUDIT_KEYS)} ('naive' required), "
                              f"got {sorted(audit)}.")
        object.__setattr__(self, "audit", _deep_frozen(audit))
        if not isinstance(self.exploits, str):
            raise ConfigError(f"EnvCard.exploits must be a string, got {type(self.exploits).__name__}.")
        ranges = _frozen_mapping(self.reward_range, "reward_range")
        if DEFAULT_REWARD not in ranges:
            raise ConfigError(f"EnvCard.reward_range needs a {DEFAULT_REWARD!r} entry (the env's "
                              f"own reward); got options {sorted(ranges)}.")
        checked = {}
        for option, bounds in ranges.items():
            try:
                lo, hi = (float(b) for b in bounds)
            except (TypeError, ValueError):
                raise ConfigError(f"EnvCard.reward_range[{option!r}] must be a pair (lo, hi) of "
                                  f"numbers, got {bounds!r}.") from None
            if math.isnan(lo) or math.isnan(hi) or lo > hi:
                raise ConfigError(f"EnvCard.reward_range[{option!r}] = ({lo}, {hi}) is not an "
                                  "interval: give lo <= hi.")
            checked[option] = (lo, hi)
        object.__setattr__(self, "reward_range", FrozenDict(checked))

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form (:meth:`from_dict` reads it back)."""
        return {
            "tests": self.tests,
            "players": dict(self.players),
            "sees": dict(self.sees),
            "reward": self.reward,
            "reward_range": {k: [lo, hi] for k, (lo, hi) in self.reward_range.items()},
            "limits": self.limits,
            "data": self.data,
            "licence": self.licence,
            "baselines": dict(self.baselines),
            "audit": _thawed(self.audit),
            "exploits": self.exploits,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> EnvCard:
        """The card of :meth:`to_dict`'s output; unknown or missing keys are an error."""
        names = [f.name for f in cls.__dataclass_fields__.values()]
        optional = {"audit", "exploits"}
        unknown, missing = sorted(set(d) - set(names)), sorted(set(names) - set(d) - optional)
        if unknown or missing:
            raise ConfigError(f"EnvCard.from_dict: unknown keys {unknown}, missing keys {missing}; "
                              f"a card has {names}.")
        fields = dict(d)
        fields["reward_range"] = {k: tuple(v) for k, v in d["reward_range"].items()}
        return cls(**fields)

    @staticmethod
    def format_range(bounds: tuple[float, float]) -> str:
        """``[lo, hi]`` with ``-inf``/``inf`` for missing bounds (the README uses this form)."""
        def num(x: float) -> str:
            return ("inf" if x > 0 else "-inf") if math.isinf(x) else f"{x:g}"

        return f"[{num(bounds[0])}, {num(bounds[1])}]"

    def lines(self) -> list[tuple[str, str]]:
        """The card as ``(heading, text)`` rows, in reading order (``collab-env info`` and
        :meth:`to_docstring` print these)."""
        def each(m: Mapping[str, str]) -> str:
            return "; ".join(f"{k}: {v}" for k, v in m.items())

        return [
            ("tests", self.tests),
            ("players", each(self.players)),
            ("sees", each(self.sees)),
            ("reward", self.reward),
            ("reward range", "; ".join(f"{k} {self.format_range(b)}"
                                       for k, b in self.reward_range.items())),
            ("limits", self.limits),
            ("data", self.data),
            ("licence", self.licence),
            ("baselines", each(self.baselines)),
            *([("exploit audit", self.exploits)] if self.exploits else []),
        ]

    def to_docstring(self, env_id: str) -> str:
        """The card as the text an env's docstring carries under ``Card of <env_id>:`` (tests
        compare it with the docstring, whitespace-insensitively, so one wraps it freely)."""
        return f"Card of {env_id}:\n" + "\n".join(f"    {k}: {v}" for k, v in self.lines())


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
        card: The env card (:class:`EnvCard`): what it tests, who sees what, the reward's range
            under every reward option, data and licence, measured baselines.
        reward_options: The env's own reward options beyond ``"mr"`` and ``"conversation"``, as
            data: option -> ``{"joint": "module:reward_func", "mode": "shared" | "per_agent" |
            "difference"}``; ``collab_env.make(id, reward=option)`` wraps the env in
            :class:`~collab_env.rewards.joint.JointReward` with that function and mode (the
            card's ``joint-*`` ranges are these options).
        superseded: On a version that a newer one replaces: what the next version changed and
            why, in one or two sentences (e.g. ``"the user reveals a fact only to a question
            about it; v0's keyword user gave it to any clause naming the object and a keyword,
            which a learner games"``). Empty on the latest version. Building a superseded
            version warns with the notes of every version after it
            (:func:`deprecation_message`).
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
    card: EnvCard | None = None
    reward_options: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    superseded: str = ""

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
        for option, how in self.reward_options.items():
            if option in (DEFAULT_REWARD, "mr", "conversation") or not isinstance(how, Mapping) \
                    or set(how) - {"joint", "mode"} or not isinstance(how.get("joint"), str) \
                    or how.get("mode", "shared") not in ("shared", "per_agent", "difference"):
                raise ConfigError(
                    f"{self.id}: reward_options[{option!r}] must be a new option name mapped to "
                    "{'joint': 'module:reward_func', 'mode': 'shared' | 'per_agent' | 'difference'}, "
                    f"got {how!r}."
                )
        if not isinstance(self.superseded, str):
            raise ConfigError(f"{self.id}: superseded must be a string (what the next version changed), "
                              f"got {type(self.superseded).__name__}.")
        if self.card is not None:
            self._check_card(self.card)

    def _check_card(self, card: EnvCard) -> None:
        if not isinstance(card, EnvCard):
            raise ConfigError(f"{self.id}: card must be an EnvCard, got {type(card).__name__}.")
        for what in ("players", "sees"):
            keys = set(getattr(card, what))
            if keys != set(self.players):
                raise ConfigError(
                    f"{self.id}: the card's {what} must name every player {list(self.players)} "
                    f"and no other; missing {sorted(set(self.players) - keys)}, "
                    f"unknown {sorted(keys - set(self.players))}."
                )
        default = card.reward_range[DEFAULT_REWARD]
        if tuple(map(float, self.reward_range)) != default:
            raise ConfigError(
                f"{self.id}: the card's default reward range {list(default)} differs from the "
                f"spec's reward_range {list(self.reward_range)}; make them the same bounds."
            )

    # Cached: every make() looks up its env's versions among all registered specs.
    @cached_property
    def name(self) -> str:
        return _ID_RE.match(self.id).group("name")  # type: ignore[union-attr]

    @cached_property
    def version(self) -> int:
        return int(_ID_RE.match(self.id).group("version"))  # type: ignore[union-attr]

    @property
    def gym_id(self) -> str:
        return f"{GYM_NAMESPACE}/{self.id}"

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
            "card": None if self.card is None else self.card.to_dict(),
            "reward_options": {k: dict(v) for k, v in self.reward_options.items()},
            "superseded": self.superseded,
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
        entry_point="collab_env.compose:make_gym_view",
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


def latest_spec(env_id: str) -> EnvSpec:
    """The spec of the latest registered version of ``env_id``'s name (``env_id`` itself when it
    is the latest; an unknown id raises as :func:`spec` does)."""
    return _versions(spec(env_id).name)[-1]


def deprecation_message(env_id: str) -> str:
    """Why ``env_id`` is superseded and which id to use, or ``""`` when it is the latest version.

    The message chains the :attr:`EnvSpec.superseded` notes of ``env_id`` and every version
    after it up to the latest, so a v0 two versions behind reads what v1 and v2 changed.
    """
    s = spec(env_id)
    versions = _versions(s.name)
    newest = versions[-1]
    if newest.version == s.version:
        return ""
    changes = "; ".join(
        f"v{later.version}: {old.superseded.strip().rstrip('.') or '(its spec has no note of what changed)'}"
        for old, later in zip(versions, versions[1:]) if old.version >= s.version
    )
    return (f"{s.id} is superseded by {newest.id}. What changed: {changes}. Use {newest.id!r} (the "
            f"unversioned {s.name!r} also means the latest version); {s.id} stays registered only "
            "so that results recorded on it reproduce.")


#: Packages whose frames a warning skips to point at the line that asked for the env: ours,
#: Gymnasium's ``make``, and the event loop and thread pools that run our coroutines.
_OWN_PACKAGES = ("collab_env", "gymnasium", "asyncio", "concurrent", "threading")


def _callers_stacklevel() -> int:
    """The ``stacklevel`` (for a warning raised in :func:`make_base_env`) of the first frame
    outside :data:`_OWN_PACKAGES`: the user's ``make`` call, not the composer's line (the
    outermost frame when every frame is ours)."""
    frame = inspect.currentframe()
    frame = frame.f_back.f_back if frame and frame.f_back else None  # make_base_env's caller
    level = 2
    while frame is not None and frame.f_back is not None \
            and frame.f_globals.get("__name__", "").split(".")[0] in _OWN_PACKAGES:
        frame, level = frame.f_back, level + 1
    return level


def make_base_env(env_id: str, *, render_mode: str | None = None, **overrides: Any):
    """Build the registered env itself: the spec's entry point called with the spec's kwargs and
    ``overrides`` merged over them; ``env.spec`` is the spec with the merged kwargs. No reward
    wrapper, no view (see :func:`collab_env.compose.make`).

    Args:
        env_id: Registered id; ``"name"`` means the latest version.
        render_mode: ``"ansi"`` or ``"human"``.
        **overrides: Merged over the spec's kwargs; unknown keywords are an error that lists the
            valid ones.

    Warns:
        DeprecatedEnvWarning: ``env_id`` is a superseded version (:func:`deprecation_message`).
    """
    s = spec(env_id)
    superseded = deprecation_message(s.id)
    if superseded:
        warnings.warn(superseded, DeprecatedEnvWarning, stacklevel=_callers_stacklevel())
    fn = load_entry_point(s.entry_point)
    kwargs = {**s.kwargs, **overrides}
    env = fn(render_mode=render_mode, **kwargs)
    env.spec = replace(s, kwargs=kwargs)
    return env


def list_envs(suite: str | None = None, *, superseded: bool = True) -> list[str]:
    """Registered ids, optionally of one suite, sorted.

    Args:
        suite: Only this suite's ids.
        superseded: Include the superseded versions (every version, the default; ``False``:
            the latest version of each name, as ``collab-env list`` shows without ``--all``).
    """
    return sorted(s.id for s in registry.values()
                  if (suite is None or s.suite == suite)
                  and (superseded or latest_spec(s.id).version == s.version))

"""The policy contract: what produces the players' messages, as the core sees it.

* :class:`Policy`: ``await policy.act(observations, **sampling)`` returns one
  :class:`~collab_env.types.Completion` per observation.
* :class:`SamplingParams`: the sampling keywords every backend understands.
* The policy-name registry that :func:`resolve_policy` reads: short names
  (:func:`register_policy`, e.g. ``"ask-then-answer"``) and ``"<backend>:<model>"`` prefixes
  (:func:`register_backend`, e.g. ``"hf:./my-model"``). Entries are ``"module:Class"`` strings, so
  registering imports nothing: the tasks register their reference policies when the registry of
  envs is filled; the backends of :mod:`collab_env.agents` are declared here as data
  (:data:`BUILTIN_AGENT_POLICIES`, :data:`BUILTIN_BACKENDS`), since they cannot register
  themselves without being imported, and the core never imports them at module level.
* :class:`ScriptedPolicy` (and :class:`FixedTextPolicy`, :class:`CallablePolicy`): deterministic,
  model-free players.
* :func:`policies_for`: a spec's default policies merged with the caller's.
* :func:`fork_policy`: the policy that plays forks of an episode (a per-episode policy's
  ``fork()``). Policies flow one way: callers hand them to the episode driver, which hands its
  table to the reward stages that play futures; nothing puts a policy into an env.

These names have one import path, this module (``tests/test_one_import_path.py`` keeps it so).
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable

import numpy as np

from collab_env.errors import ConfigError, check_keyword_types, did_you_mean
from collab_env.types import Completion, Conversation

__all__ = [
    "Policy",
    "SamplingParams",
    "add_usage",
    "describe",
    "resolve_policy",
    "as_mapping",
    "load_entry_point",
    "register_policy",
    "register_backend",
    "POLICY_ALIASES",
    "BACKEND_PREFIXES",
    "BUILTIN_AGENT_POLICIES",
    "BUILTIN_BACKENDS",
    "policies_for",
    "ScriptedPolicy",
    "FixedTextPolicy",
    "CallablePolicy",
    "observation_rng",
    "fork_policy",
]


# -- the protocol -------------------------------------------------------------------------------


@runtime_checkable
class Policy(Protocol):
    """Anything with ``async act(observations, **sampling) -> list[Completion]``.

    ``observations`` are the conversations as the acting player sees them (one per episode
    that needs an action); the result has one completion per observation, in order. A policy
    that fails after its own retries raises :class:`~collab_env.errors.PolicyError`; it never
    returns empty text in place of an error.

    A policy that keeps state across the moves of ONE episode (an exact token history, say) also
    has ``fork() -> Policy``: the policy that plays forks of that episode (the futures a
    reward stage rolls) from the same model, without touching the episode's state
    (:func:`fork_policy`). Stateless policies play forks as they are.
    """

    async def act(self, observations: Sequence[Conversation], **sampling: Any) -> list[Completion]: ...


def fork_policy(policy: Any) -> Any:
    """The policy that plays a fork of an episode that ``policy`` plays: ``policy.fork()`` when
    it has one (a policy with per-episode state), else ``policy`` itself."""
    fork = getattr(policy, "fork", None)
    return fork() if callable(fork) else policy


@dataclass(frozen=True)
class SamplingParams:
    """Sampling parameters every backend understands.

    Args:
        temperature: 0 means greedy.
        top_p: Nucleus sampling mass.
        top_k: Keep the k most likely tokens (``None``: no limit).
        max_new_tokens: Longest completion.
        stop: Strings that end a completion (not included in the text).
        seed: Seed for reproducible sampling where the backend supports it.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    max_new_tokens: int = 256
    stop: tuple[str, ...] = ()
    seed: int | None = None

    def __post_init__(self) -> None:
        given = {f: getattr(self, f) for f in self.__dataclass_fields__}
        if isinstance(self.stop, str):  # one stop string, made a tuple below
            del given["stop"]
        check_keyword_types(given, type(self), where="")
        if not 0 <= self.temperature < math.inf:  # NaN too
            raise ConfigError(f"temperature must be a finite number >= 0, got {self.temperature}.")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}.")
        if self.top_k is not None and self.top_k < 1:
            raise ConfigError(f"top_k must be >= 1 or None, got {self.top_k}.")
        if self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}.")
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        else:
            object.__setattr__(self, "stop", tuple(self.stop))

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> SamplingParams:
        """Validate ``**sampling`` keywords; an unknown key is an error naming the valid ones."""
        unknown = sorted(set(kwargs) - set(cls.__dataclass_fields__))
        if unknown:
            raise ConfigError(
                f"unknown sampling parameter(s) {unknown}." + did_you_mean(unknown[0], cls.__dataclass_fields__)
                + f" Valid: {sorted(cls.__dataclass_fields__)}."
            )
        return cls(**kwargs)

    @classmethod
    def coerce(cls, params: SamplingParams | Mapping[str, Any]) -> SamplingParams:
        """``params`` as :class:`SamplingParams`: an instance as it is, a mapping of its fields
        through :meth:`from_kwargs` (validated); anything else is a :class:`ConfigError`. The one
        "object or mapping" conversion of sampling settings."""
        if isinstance(params, SamplingParams):
            return params
        if isinstance(params, Mapping):
            return cls.from_kwargs(**params)
        raise ConfigError(f"sampling must be SamplingParams or a mapping of its fields, got {type(params).__name__}.")

    def to_dict(self) -> dict[str, Any]:
        """The parameters as plain keywords (``stop`` as a list)."""
        d = asdict(self)
        d["stop"] = list(self.stop)
        return d


def add_usage(total: dict[str, float], usage: Mapping[str, Any]) -> dict[str, float]:
    """Add every numeric entry of ``usage`` (a ``Completion.usage``) into ``total``."""
    for k, v in usage.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            total[k] = total.get(k, 0.0) + float(v)
    return total


def describe(policy: Any) -> str:
    """Short human name of a policy (for tables and logs)."""
    name = getattr(policy, "name", None)
    return str(name) if name else type(policy).__name__


# -- the policy-name registry -------------------------------------------------------------------


def load_entry_point(ref: str | Callable[..., Any]) -> Callable[..., Any]:
    """Resolve ``"package.module:attr"`` (or return a callable unchanged)."""
    if callable(ref):
        return ref
    if not isinstance(ref, str) or ":" not in ref:
        raise ConfigError(f"entry point must be 'module:attr' or a callable, got {ref!r}.")
    mod_name, _, attr = ref.partition(":")
    mod = importlib.import_module(mod_name)
    obj: Any = mod
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


#: The names of :mod:`collab_env.agents`' policies, as data: the core may not import that
#: package at module level, and a class cannot register itself before its module is imported,
#: so the names are declared here and resolved (imported) on first use.
BUILTIN_AGENT_POLICIES: Mapping[str, str] = MappingProxyType({
    "litellm": "collab_env.agents.litellm:LiteLLMPolicy",
    "hf": "collab_env.agents.hf:HFPolicy",
    "embedded": "collab_env.agents.embedded:EmbeddedPolicy",
    "smollm2": "collab_env.agents.embedded:EmbeddedPolicy",
    "llm-user": "collab_env.agents.users:LLMUserSimulator",
    "proactive": "collab_env.agents.proactive:Proactive",
})

#: The backends of :mod:`collab_env.agents` usable as ``"<backend>:<model>"``, as data.
BUILTIN_BACKENDS: Mapping[str, str] = MappingProxyType({
    "hf": "collab_env.agents.hf:HFPolicy",
    "vllm": "collab_env.agents.vllm:VLLMPolicy",
    "vllm-async": "collab_env.agents.vllm_async:AsyncVLLMPolicy",
    "litellm": "collab_env.agents.litellm:LiteLLMPolicy",
    "embedded-lora": "collab_env.agents.embedded:EmbeddedLoRAPolicy",
})

_POLICIES: dict[str, str] = dict(BUILTIN_AGENT_POLICIES)
_BACKENDS: dict[str, str] = dict(BUILTIN_BACKENDS)

#: Short names usable wherever a policy is accepted (CLI, configs): name -> ``"module:Class"``.
#: A read-only live view of the registry; add names with :func:`register_policy`.
POLICY_ALIASES: Mapping[str, str] = MappingProxyType(_POLICIES)

#: ``"<backend>:<model>"`` strings: the backend class, built with the model as its ``model``
#: argument, e.g. ``"litellm:openai/gpt-4o-mini"``, ``"hf:./my-model"``,
#: ``"vllm:Qwen/Qwen2.5-0.5B-Instruct"``. A read-only live view; add with :func:`register_backend`.
BACKEND_PREFIXES: Mapping[str, str] = MappingProxyType(_BACKENDS)


def _check_entry(kind: str, name: Any, entry_point: Any) -> None:
    if not isinstance(name, str) or not name or ":" in name or name != name.strip():
        raise ConfigError(f"a {kind} name must be a non-empty str without ':' or surrounding spaces, got {name!r}.")
    mod, sep, attr = entry_point.partition(":") if isinstance(entry_point, str) else ("", "", "")
    if not (sep and mod and attr):
        raise ConfigError(
            f"the {kind} {name!r} needs a 'module:Class' entry point string (so registering imports "
            f"nothing), got {entry_point!r}."
        )


def register_policy(name: str, entry_point: str) -> None:
    """Make ``name`` usable wherever a policy is accepted: ``resolve_policy(name)`` builds
    ``entry_point`` (a ``"module:Class"`` string, imported on first use). Registering a name
    again replaces its entry point.

    Raises:
        ConfigError: ``name`` is empty or contains ``':'``, or ``entry_point`` is not
            ``"module:Class"``.
    """
    _check_entry("policy", name, entry_point)
    _POLICIES[name] = entry_point


def register_backend(prefix: str, entry_point: str) -> None:
    """Make ``"<prefix>:<model>"`` resolve to ``entry_point`` (a ``"module:Class"`` string) built
    with ``model=<model>``. Registering a prefix again replaces its entry point.

    Raises:
        ConfigError: ``prefix`` is empty or contains ``':'``, or ``entry_point`` is not
            ``"module:Class"``.
    """
    _check_entry("backend", prefix, entry_point)
    _BACKENDS[prefix] = entry_point


def resolve_policy(ref: Any, **kwargs: Any) -> Policy:
    """A policy from an object, a class, a registered name (:data:`POLICY_ALIASES`), a
    ``"<backend>:<model>"`` string (:data:`BACKEND_PREFIXES`) or a ``"module:Class"`` string.
    ``kwargs`` go to the constructor.

    Raises:
        ConfigError: The name is unknown (with the closest registered one), the object has no
            async ``act``, or ``kwargs`` were given for an existing object.
    """
    obj = ref
    if isinstance(ref, str):
        prefix, sep, model = ref.partition(":")
        if ref in _POLICIES:
            obj = load_entry_point(_POLICIES[ref])
        elif sep and prefix in _BACKENDS:
            if not model:
                raise ConfigError(f"{ref!r} names no model; write '{prefix}:<model>'.")
            return resolve_policy(_BACKENDS[prefix], **{"model": model, **kwargs})
        elif sep:
            obj = load_entry_point(ref)
        else:
            raise ConfigError(
                f"unknown policy {ref!r}; use an alias {sorted(_POLICIES)}, "
                f"'<backend>:<model>' with a backend in {sorted(_BACKENDS)}, or 'module:Class'."
                + did_you_mean(ref, _POLICIES)
            )
    if isinstance(obj, type):
        obj = obj(**kwargs)
    elif kwargs:
        raise ConfigError(f"cannot pass constructor arguments to an existing policy object {obj!r}.")
    if not isinstance(obj, Policy):
        raise ConfigError(
            f"{ref!r} is not a policy: it needs an async act(observations, **sampling) method."
        )
    return obj


def as_mapping(policies: Mapping[str, Any] | None) -> dict[str, Policy]:
    """Player -> :func:`resolve_policy` of each value (``None``: no policies)."""
    return {p: resolve_policy(v) for p, v in (policies or {}).items()}


def policies_for(spec: Any, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The policy table of an env: ``spec``'s default policies (an
    :class:`~collab_env.registry.EnvSpec`, or ``None`` for an env without one) with
    ``overrides`` (player -> policy object, class or name) merged over them. An override of
    ``None`` removes the player's default. Nothing is resolved: values stay as given.
    """
    defaults = getattr(spec, "default_policies", None) if spec is not None else None
    chosen: dict[str, Any] = dict(defaults or {})
    for player, ref in dict(overrides or {}).items():
        if ref is None:
            chosen.pop(player, None)
        else:
            chosen[player] = ref
    return chosen


# -- scripted policies --------------------------------------------------------------------------


def observation_rng(observation: Conversation, seed: int | None) -> np.random.Generator:
    """A generator that depends only on ``seed`` and the observation's content."""
    h = hashlib.blake2b(digest_size=8)
    for m in observation:
        h.update(m.author.encode("utf-8", "replace") + b"\0")
        h.update(m.content.encode("utf-8", "replace") + b"\1")
    return np.random.default_rng([int(seed or 0) & 0xFFFFFFFF, int.from_bytes(h.digest(), "little")])


class ScriptedPolicy:
    """Deterministic, model-free player; subclasses implement :meth:`respond`, and ``act`` maps
    it over the batch.

    Used as simulated users for the built-in suites, as reference baselines ("ask then answer",
    "answer at once") and wherever a test needs a real policy without a model. Each reply is a
    function of the observation and the ``seed`` sampling parameter only.
    """

    name = "scripted"

    def respond(self, observation: Conversation, rng: np.random.Generator) -> str:
        """The reply to ``observation``; ``rng`` is :func:`observation_rng` of it."""
        raise NotImplementedError

    async def act(self, observations: Sequence[Conversation], **sampling: Any) -> list[Completion]:
        """One :meth:`respond` per observation (only the ``seed`` sampling keyword is used)."""
        seed = sampling.get("seed")
        out = []
        for obs in observations:
            text = self.respond(obs, observation_rng(obs, seed))
            out.append(Completion(text=text, finish_reason="stop", meta={"policy": self.name}))
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class FixedTextPolicy(ScriptedPolicy):
    """Always replies ``text``."""

    def __init__(self, text: str = "") -> None:
        self.text = text
        self.name = f"fixed:{text[:20]!r}"

    def respond(self, observation: Conversation, rng: np.random.Generator) -> str:
        return self.text


class CallablePolicy(ScriptedPolicy):
    """Wraps ``fn(observation) -> str`` (or ``fn(observation, rng) -> str``)."""

    def __init__(self, fn: Callable[..., str], name: str | None = None) -> None:
        self.fn = fn
        fn_name: str = getattr(fn, "__name__", "callable")
        self.name = name or fn_name
        try:
            self._takes_rng = len(inspect.signature(fn).parameters) >= 2
        except (TypeError, ValueError):
            self._takes_rng = False

    def respond(self, observation: Conversation, rng: np.random.Generator) -> str:
        return self.fn(observation, rng) if self._takes_rng else self.fn(observation)

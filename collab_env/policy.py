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
* Policy specs (:class:`PolicySpec`, read by :func:`resolve_policy`): one grammar for every
  role (assistant, user simulator, judge) in the CLI, track files, configs and Python; the
  grammar is :data:`SPEC_HELP`.
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
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
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
    "PolicySpec",
    "policy_spec",
    "SPEC_HELP",
    "is_spec_file",
    "CONNECTION_KEYS",
    "WRAPPING_KINDS",
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


def _is_policy(obj: Any) -> bool:
    """``isinstance(obj, Policy)`` without the cost of a runtime protocol check (it collects the
    protocol's members on every call; the rollout driver resolves policies once per episode).
    The same verdict: an object with a non-``None`` ``act``."""
    return getattr(obj, "act", None) is not None


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

#: The policy names whose class takes another policy (its backend) as first argument, usable
#: as ``"<kind>:<spec>"``: ``"llm-user:litellm:openai/gpt-4o-mini"`` is an
#: :class:`~collab_env.agents.users.LLMUserSimulator` on that backend, ``"proactive:embedded"``
#: the Proactive prompt around the embedded model. Extend with ``register_policy(..., wraps=True)``.
WRAPPING_KINDS: frozenset[str] = frozenset({"llm-user", "proactive"})

_POLICIES: dict[str, str] = dict(BUILTIN_AGENT_POLICIES)
_BACKENDS: dict[str, str] = dict(BUILTIN_BACKENDS)
_WRAPPERS: set[str] = set(WRAPPING_KINDS)

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


def register_policy(name: str, entry_point: str, *, wraps: bool = False) -> None:
    """Make ``name`` usable wherever a policy is accepted: ``resolve_policy(name)`` builds
    ``entry_point`` (a ``"module:Class"`` string, imported on first use). Registering a name
    again replaces its entry point. ``wraps=True``: the class takes another policy as its first
    argument, so ``"<name>:<spec>"`` builds it around the policy ``<spec>`` names.

    Raises:
        ConfigError: ``name`` is empty or contains ``':'``, or ``entry_point`` is not
            ``"module:Class"``.
    """
    _check_entry("policy", name, entry_point)
    _POLICIES[name] = entry_point
    if wraps:
        _WRAPPERS.add(name)
    else:
        _WRAPPERS.discard(name)


def register_backend(prefix: str, entry_point: str) -> None:
    """Make ``"<prefix>:<model>"`` resolve to ``entry_point`` (a ``"module:Class"`` string) built
    with ``model=<model>``. Registering a prefix again replaces its entry point.

    Raises:
        ConfigError: ``prefix`` is empty or contains ``':'``, or ``entry_point`` is not
            ``"module:Class"``.
    """
    _check_entry("backend", prefix, entry_point)
    _BACKENDS[prefix] = entry_point


#: The connection settings of a spec: they reach the innermost policy (the backend that sends
#: the requests), whatever kind wraps it. ``api_key_env`` names the environment variable that
#: holds the key (a config file or a result file never holds the key itself).
CONNECTION_KEYS: tuple[str, ...] = ("api_base", "api_key", "api_key_env")

#: Endings of a policy config file given where a spec string is accepted.
SPEC_FILE_SUFFIXES: tuple[str, ...] = (".json", ".yaml", ".yml")

#: The spec grammar, for help texts and error messages.
SPEC_HELP = (
    "a policy SPEC is an alias (ask-then-answer, embedded, ...), '<backend>:<model>' "
    "(litellm:openai/gpt-4o-mini, hf:./my-model, vllm:<model>, embedded-lora:<dir>), '<kind>:<SPEC>' "
    "with a kind that wraps a backend (llm-user:litellm:openai/gpt-4o-mini, llm-user:embedded, "
    "proactive:hf:./my-model), 'module:Class', or a policy config file (.json/.yaml: kind, backend, "
    "model, api_base, api_key_env, sampling, options); an API backend reaches a server given by "
    "api_base (CLI: --api-base ROLE=URL, e.g. --api-base user=http://127.0.0.1:8000/v1)"
)


@dataclass(frozen=True)
class PolicySpec:
    """A policy named as data: what plays a role (assistant, user simulator, judge) and where it
    connects. The string grammar (:data:`SPEC_HELP`) and a config file's mapping both read into
    it; :func:`resolve_policy` builds it. Nothing is imported or loaded here.

    Args:
        backend: The policy that answers: an alias, ``"<backend>:<model>"``,
            ``"module:Class"``, or (with ``kind=None``) a ``"<kind>:<spec>"`` string.
        kind: A kind of :data:`WRAPPING_KINDS` (``"llm-user"``, ``"proactive"``) built around
            ``backend``, or ``None``: ``backend`` plays the role itself.
        api_base: Base URL of an OpenAI-compatible server (``http://127.0.0.1:8000/v1``), given
            to the backend (API backends only, ``litellm:...``).
        api_key_env: Name of the environment variable that holds the backend's API key.
        sampling: Default sampling keywords (:class:`SamplingParams` fields): the simulator's
            own for ``kind="llm-user"``, else the backend's; keywords given at each call (a
            rollout's ``seed``, ``--sampling``) win.
        options: Constructor arguments of the kind (of the backend when there is no kind), e.g.
            ``{"max_retries": 3}`` for an LLM user, ``{"timeout": 120}`` for ``litellm:...``.
        backend_options: Constructor arguments of the backend when a kind wraps it.
    """

    backend: str
    kind: str | None = None
    api_base: str | None = None
    api_key_env: str | None = None
    sampling: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    backend_options: Mapping[str, Any] = field(default_factory=dict)

    #: The keys of a config file's mapping.
    FIELDS = ("kind", "backend", "model", "api_base", "api_key_env", "sampling", "options", "backend_options")

    def __hash__(self) -> int:  # the mappings are read-only views: hash the spec's text
        return hash(str(self))

    def __post_init__(self) -> None:
        if not isinstance(self.backend, str) or not self.backend.strip():
            raise ConfigError(f"a policy spec needs a backend (a non-empty spec string); got {self.backend!r}. "
                              + SPEC_HELP + ".")
        if self.kind is not None and self.kind not in _WRAPPERS:
            raise ConfigError(f"unknown policy kind {self.kind!r}; kinds: {sorted(_WRAPPERS)} (or no kind: the "
                              "backend plays the role itself)." + did_you_mean(str(self.kind), _WRAPPERS))
        for name in ("api_base", "api_key_env"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, str) or not v.strip()):
                raise ConfigError(f"{name} must be a non-empty string, got {v!r}.")
        if self.api_base is not None and not self.api_base.startswith(("http://", "https://")):
            raise ConfigError("api_base must be an http(s) URL such as http://127.0.0.1:8000/v1, got "
                              f"{self.api_base!r}.")
        for name in ("sampling", "options", "backend_options"):
            v = getattr(self, name)
            if not isinstance(v, Mapping) or not all(isinstance(k, str) for k in v):
                raise ConfigError(f"{name} must be a mapping of keyword names, got {v!r}.")
            object.__setattr__(self, name, MappingProxyType(dict(v)))
        if "api_key" in self.options or "api_key" in self.backend_options:
            raise ConfigError("a policy spec does not hold an API key: name its environment variable with "
                              "api_key_env (e.g. \"api_key_env\": \"OPENAI_API_KEY\").")
        if self.sampling:
            SamplingParams.from_kwargs(**self.sampling)

    @classmethod
    def parse(cls, text: str) -> PolicySpec:
        """A spec string (:data:`SPEC_HELP`) as a :class:`PolicySpec`; a config file's path reads
        the file (:meth:`load`)."""
        if not isinstance(text, str) or not text.strip():
            raise ConfigError(f"a policy spec must be a non-empty string; got {text!r}. " + SPEC_HELP + ".")
        text = text.strip()
        if is_spec_file(text):
            return cls.load(text)
        head, sep, rest = text.partition(":")
        if sep and head in _WRAPPERS:
            if not rest.strip():
                raise ConfigError(_needs_backend(head))
            return cls(backend=rest.strip(), kind=head)
        return cls(backend=text)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], where: str = "policy spec") -> PolicySpec:
        """A config file's mapping (keys :attr:`FIELDS`) as a :class:`PolicySpec`: ``backend``
        may be a whole spec string, or a backend prefix with ``model``
        (``{"backend": "litellm", "model": "openai/gpt-4o-mini"}``)."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"{where} must be a mapping with keys {list(cls.FIELDS)}, got {type(data).__name__}.")
        unknown = sorted(set(data) - set(cls.FIELDS))
        if unknown:
            raise ConfigError(f"{where}: unknown key(s) {unknown}; valid: {list(cls.FIELDS)}."
                              + did_you_mean(str(unknown[0]), cls.FIELDS))
        backend, model = data.get("backend"), data.get("model")
        if not isinstance(backend, str) or not backend.strip():
            raise ConfigError(f"{where} needs 'backend' (e.g. \"backend\": \"litellm\", \"model\": "
                              f"\"openai/gpt-4o-mini\"), got {backend!r}.")
        if model is not None:
            if not isinstance(model, str) or not model.strip():
                raise ConfigError(f"{where}: 'model' must be a non-empty string, got {model!r}.")
            if backend not in _BACKENDS:
                raise ConfigError(f"{where}: 'model' goes with a backend prefix {sorted(_BACKENDS)}, not "
                                  f"{backend!r}; write the whole spec in 'backend' instead.")
            backend = f"{backend}:{model}"
        elif backend in _BACKENDS:
            raise ConfigError(f"{where}: the backend {backend!r} needs a model (\"model\": ...).")
        kind = data.get("kind")
        try:
            inner = cls.parse(backend) if kind is None else None
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        if inner is not None and inner.kind is not None:
            kind, backend = inner.kind, inner.backend
        try:
            return cls(backend=backend, kind=kind, api_base=data.get("api_base"), api_key_env=data.get("api_key_env"),
                       sampling=data.get("sampling") or {}, options=data.get("options") or {},
                       backend_options=data.get("backend_options") or {})
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> PolicySpec:
        """Read a policy config file (JSON, or YAML with PyYAML installed)."""
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"no policy config file {str(p)!r}: write one (keys {list(cls.FIELDS)}) or give "
                              "a spec string instead.")
        text = p.read_text(encoding="utf-8")
        try:
            if p.suffix.lower() == ".json":
                data = json.loads(text)
            else:
                try:
                    import yaml
                except ImportError:
                    raise ConfigError(f"{p} is YAML, and PyYAML is not installed: pip install pyyaml, or write "
                                      "the file as JSON.") from None
                data = yaml.safe_load(text)
        except ValueError as exc:  # json.JSONDecodeError, yaml.YAMLError are ValueError / reported below
            raise ConfigError(f"policy config file {p} does not parse: {exc}") from None
        except Exception as exc:  # yaml.YAMLError is no ValueError
            if type(exc).__module__.startswith("yaml"):
                raise ConfigError(f"policy config file {p} does not parse: {' '.join(str(exc).split())}") from None
            raise
        return cls.from_mapping(data, where=f"policy config file {p}")

    def replace(self, **changes: Any) -> PolicySpec:
        """A copy with ``changes`` (``None`` values leave a field as it is)."""
        fields = {k: getattr(self, k) for k in self.__dataclass_fields__}
        fields.update({k: v for k, v in changes.items() if v is not None})
        return PolicySpec(**fields)

    @property
    def spec_string(self) -> str:
        """The kind and backend as a spec string (``"llm-user:litellm:openai/gpt-4o-mini"``)."""
        return f"{self.kind}:{self.backend}" if self.kind else self.backend

    def to_dict(self) -> dict[str, Any]:
        """The spec as a config file's mapping (fields that are set only; no key, ever)."""
        out: dict[str, Any] = {"backend": self.backend}
        if self.kind:
            out["kind"] = self.kind
        for name in ("api_base", "api_key_env"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        for name in ("sampling", "options", "backend_options"):
            if getattr(self, name):
                out[name] = dict(getattr(self, name))
        return out

    def __str__(self) -> str:
        """The spec string, with the other settings as JSON when there are any."""
        rest = {k: v for k, v in self.to_dict().items() if k not in ("backend", "kind")}
        return self.spec_string + (" " + json.dumps(rest, sort_keys=True) if rest else "")


def is_spec_file(ref: Any) -> bool:
    """Whether a spec string names a policy config file (by its ending)."""
    return isinstance(ref, str) and ref.strip().lower().endswith(SPEC_FILE_SUFFIXES)


def policy_spec(ref: str | PolicySpec | Mapping[str, Any], *, api_base: str | None = None,
                api_key_env: str | None = None) -> PolicySpec:
    """``ref`` (a spec string, a config file's path or mapping, or a :class:`PolicySpec`) as a
    :class:`PolicySpec`, with the connection settings given here over its own (how the CLI
    joins ``--policy user=SPEC`` and ``--api-base user=URL``)."""
    if isinstance(ref, PolicySpec):
        spec = ref
    elif isinstance(ref, Mapping):
        spec = PolicySpec.from_mapping(ref)
    else:
        spec = PolicySpec.parse(ref)
    return spec.replace(api_base=api_base, api_key_env=api_key_env)


def _needs_backend(kind: str) -> str:
    return (f"the policy kind {kind!r} needs a backend: write '{kind}:<backend spec>', e.g. "
            f"'{kind}:litellm:openai/gpt-4o-mini' (with --api-base ROLE=URL, or api_base=, for a local "
            f"OpenAI-compatible server) or '{kind}:embedded'.")


def _api_key_from_env(var: str) -> str:
    key = os.environ.get(var)
    if not key:
        raise ConfigError(f"the policy's api_key_env names {var}, which is not set: export {var}=<your key>, "
                          "or name another variable.")
    return key


def _construct(ref: str, cls: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``cls(*args, **kwargs)``, with arguments the class does not take, or required ones left
    out, reported as a one-line :class:`ConfigError` naming the fix (never a TypeError)."""
    if "api_key_env" in kwargs:
        var = kwargs.pop("api_key_env")
        kwargs.setdefault("api_key", _api_key_from_env(var))
    try:
        sig = inspect.signature(cls)
    except (TypeError, ValueError):
        return cls(*args, **kwargs)
    params = sig.parameters
    var_kw = any(p.kind is p.VAR_KEYWORD for p in params.values())
    takes = [n for n, p in params.items() if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
    conn = [k for k in kwargs if k in ("api_base", "api_key") and k not in params]
    if conn:  # before **kwargs swallows them (a backend's **default_sampling would call them sampling)
        raise ConfigError(
            f"{ref!r} takes no {conn[0]}: connection settings go to API backends ('litellm:<model>', e.g. "
            f"'litellm:openai/<served model>' for a local OpenAI-compatible server); {ref!r} sends no requests.")
    if not var_kw:
        unknown = [k for k in kwargs if k not in params]
        if unknown:
            raise ConfigError(f"{ref!r} ({cls.__name__}) takes no argument {unknown[0]!r}; its arguments: {takes}."
                              + did_you_mean(unknown[0], takes))
    positional = [n for n, p in params.items() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    given = set(positional[:len(args)]) | set(kwargs)
    missing = [n for n, p in params.items() if p.default is p.empty and n not in given
               and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
    if missing:
        if ref in _WRAPPERS and not args:
            raise ConfigError(_needs_backend(ref))
        raise ConfigError(f"{ref!r} ({cls.__name__}) needs the argument(s) {missing}; pass them (options in a "
                          "config file, keywords in Python).")
    return cls(*args, **kwargs)


def _build_spec(spec: PolicySpec, kwargs: dict[str, Any]) -> Policy:
    connection = {k: kwargs.pop(k) for k in CONNECTION_KEYS if k in kwargs}
    backend_kw = dict(spec.backend_options if spec.kind else spec.options)
    for k in ("api_base", "api_key_env"):
        if getattr(spec, k) is not None:
            backend_kw[k] = getattr(spec, k)
    backend_kw.update(connection)
    if spec.kind is None:
        return resolve_policy(spec.backend, **{**spec.sampling, **backend_kw, **kwargs})
    inner = resolve_policy(spec.backend, **backend_kw)
    outer = {**spec.options, **kwargs}
    cls = load_entry_point(_POLICIES[spec.kind])
    if spec.sampling:
        if "sampling" not in inspect.signature(cls).parameters:
            raise ConfigError(f"the policy kind {spec.kind!r} takes no sampling; put the sampling keywords on the "
                              "backend (backend_options) or give them with --sampling.")
        outer.setdefault("sampling", dict(spec.sampling))
    return _checked(spec.spec_string, _construct(spec.kind, cls, (inner,), outer))


def _checked(ref: Any, obj: Any) -> Policy:
    if not _is_policy(obj):
        raise ConfigError(
            f"{ref!r} is not a policy: it needs an async act(observations, **sampling) method."
        )
    return obj


def resolve_policy(ref: Any, **kwargs: Any) -> Policy:
    """A policy from an object, a class, or a spec: a registered name (:data:`POLICY_ALIASES`),
    a ``"<backend>:<model>"`` string (:data:`BACKEND_PREFIXES`), a ``"<kind>:<spec>"`` string
    (:data:`WRAPPING_KINDS`: ``"llm-user:litellm:openai/gpt-4o-mini"``), a ``"module:Class"``
    string, a policy config file's path, its mapping, or a :class:`PolicySpec` (the grammar:
    :data:`SPEC_HELP`). ``kwargs`` go to the constructor, except the connection settings
    (:data:`CONNECTION_KEYS`: ``api_base``, ``api_key``, ``api_key_env``), which go to the
    innermost backend: ``resolve_policy("llm-user:litellm:openai/x", api_base=URL)`` is an LLM
    user simulator whose litellm backend sends its requests to ``URL``.

    Raises:
        ConfigError: The name is unknown (with the closest registered one), a kind has no
            backend, the constructor does not take a given argument or needs one that is
            missing, the object has no async ``act``, or ``kwargs`` were given for an existing
            object.
    """
    if isinstance(ref, PolicySpec):
        return _build_spec(ref, dict(kwargs))
    if isinstance(ref, Mapping):
        return _build_spec(PolicySpec.from_mapping(ref), dict(kwargs))
    obj = ref
    if isinstance(ref, str):
        if is_spec_file(ref):
            return _build_spec(PolicySpec.load(ref.strip()), dict(kwargs))
        prefix, sep, model = ref.partition(":")
        if ref in _POLICIES:
            obj = load_entry_point(_POLICIES[ref])
        elif sep and prefix in _WRAPPERS:
            return _build_spec(PolicySpec.parse(ref), dict(kwargs))
        elif sep and prefix in _BACKENDS:
            if not model:
                raise ConfigError(f"{ref!r} names no model; write '{prefix}:<model>'.")
            return _checked(ref, _construct(ref, load_entry_point(_BACKENDS[prefix]), (), {"model": model, **kwargs}))
        elif sep and not all(part.isidentifier() for part in prefix.split(".")):
            # not a module path: a misspelt kind or backend ("llm-usr:...")
            names = sorted({*_WRAPPERS, *_BACKENDS})
            raise ConfigError(
                f"unknown policy {ref!r}: {prefix!r} is neither a kind {sorted(_WRAPPERS)} nor a backend "
                f"{sorted(_BACKENDS)} nor a module ('module:Class')." + did_you_mean(prefix, names)
            )
        elif sep:
            obj = load_entry_point(ref)
        else:
            raise ConfigError(
                f"unknown policy {ref!r}; use an alias {sorted(_POLICIES)}, "
                f"'<backend>:<model>' with a backend in {sorted(_BACKENDS)}, '<kind>:<spec>' with a kind in "
                f"{sorted(_WRAPPERS)}, 'module:Class' or a policy config file (.json/.yaml)."
                + did_you_mean(ref, _POLICIES)
            )
    if isinstance(obj, type):
        obj = _construct(ref if isinstance(ref, str) else obj.__name__, obj, (), dict(kwargs))
    elif kwargs:
        raise ConfigError(f"cannot pass constructor arguments to an existing policy object {obj!r}.")
    return _checked(ref, obj)


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


_USES_RNG: dict[type, bool] = {}


def _respond_uses_rng(cls: type) -> bool:
    """Whether ``cls.respond`` may read its ``rng``: ``False`` only when the class that defines
    the ``respond`` in use declares ``uses_rng = False`` itself (cached per class)."""
    known = _USES_RNG.get(cls)
    if known is None:
        owner = next((c for c in cls.__mro__ if "respond" in c.__dict__), cls)
        known = _USES_RNG[cls] = owner.__dict__.get("uses_rng", True) is not False
    return known


class ScriptedPolicy:
    """Deterministic, model-free player; subclasses implement :meth:`respond`, and ``act`` maps
    it over the batch.

    Used as simulated users for the built-in suites, as reference baselines ("ask then answer",
    "answer at once") and wherever a test needs a real policy without a model. Each reply is a
    function of the observation and the ``seed`` sampling parameter only.
    """

    name = "scripted"

    #: ``False`` in a class whose :meth:`respond` never reads ``rng``: ``act`` then passes
    #: ``None`` instead of building :func:`observation_rng` (tens of microseconds per reply, on
    #: the rollout's hot path). It holds only for the class that sets it: a subclass that
    #: overrides :meth:`respond` gets the generator again unless it sets ``False`` too.
    uses_rng: bool = True

    def respond(self, observation: Conversation, rng: np.random.Generator) -> str:
        """The reply to ``observation``; ``rng`` is :func:`observation_rng` of it."""
        raise NotImplementedError

    @property
    def answers_at_once(self) -> bool:
        """``act`` returns without ever suspending (it is this class's, which only calls
        :meth:`respond`): the episode driver then calls it inline instead of in its own task."""
        return type(self).act is ScriptedPolicy.act

    async def act(self, observations: Sequence[Conversation], **sampling: Any) -> list[Completion]:
        """One :meth:`respond` per observation (only the ``seed`` sampling keyword is used)."""
        seed = sampling.get("seed")
        needs_rng = _respond_uses_rng(type(self))
        out = []
        for obs in observations:
            text = self.respond(obs, observation_rng(obs, seed) if needs_rng else None)  # type: ignore[arg-type]
            out.append(Completion(text=text, finish_reason="stop", meta={"policy": self.name}))
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class FixedTextPolicy(ScriptedPolicy):
    """Always replies ``text``."""

    uses_rng = False

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

"""The one exception tree of collab_env.

Every error the library raises on purpose derives from :class:`CollabEnvError` and
also from the closest built-in exception (``ValueError``, ``TypeError``...), so
callers can catch either. Messages say what went wrong, why, and how to fix it.
:func:`did_you_mean`, :func:`require` and :func:`check_keyword_types` build such messages.
"""

from __future__ import annotations

import collections.abc as cabc
import dataclasses
import difflib
import functools
import inspect
import numbers
import os
import sys
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "CollabEnvError",
    "ConfigError",
    "UnknownEnvError",
    "ActionError",
    "EnvStateError",
    "DatasetUnavailableError",
    "DataSchemaError",
    "MissingDependencyError",
    "CredentialsError",
    "ZeroRewardWarning",
    "PolicyError",
    "FatalPolicyError",
    "ServedEnvError",
    "JudgeError",
    "JudgeValidityError",
    "CacheMissError",
    "TaskFunctionError",
    "SandboxError",
    "RewardError",
    "DeprecatedEnvWarning",
    "did_you_mean",
    "check_keyword_types",
]


class CollabEnvError(Exception):
    """Base class of every error raised by collab_env."""


class ConfigError(CollabEnvError, ValueError):
    """A configuration value or keyword is invalid."""


class UnknownEnvError(CollabEnvError, LookupError):
    """An environment id is not registered."""

    def __str__(self) -> str:  # LookupError would quote the message like a key
        return str(self.args[0]) if self.args else ""


class ActionError(CollabEnvError, TypeError):
    """An action passed to ``step`` has the wrong type or names an unknown player."""


class EnvStateError(CollabEnvError, RuntimeError):
    """The environment was used out of order (step before reset, step after the end)."""


class DatasetUnavailableError(CollabEnvError, RuntimeError):
    """A dataset could not be loaded (offline, missing files, no access)."""


class DataSchemaError(CollabEnvError, ValueError):
    """Rows of a dataset do not follow the documented schema."""


class MissingDependencyError(CollabEnvError, ImportError):
    """An optional dependency is not installed; the message names the extra."""


class PolicyError(CollabEnvError, RuntimeError):
    """A policy failed to produce an action (after its own retries)."""


class FatalPolicyError(PolicyError):
    """A backend rejected a request in a way no retry can fix: authentication (a missing or
    invalid API key), permission, an unknown model, a malformed request, or any other 4xx
    answer except 408, 409, 425 and 429 (which are transient and retried).

    Raised at once, with the provider's message, on the first attempt. Whatever wraps the
    backend (a user simulator, a judge, a multiturn-aware reward) lets it through instead of
    retrying it or counting it as a fault: every later request would be rejected the same way.
    """


class CredentialsError(FatalPolicyError):
    """A :class:`FatalPolicyError` that is about the credentials: a missing, invalid or
    unauthorised API key (401, 403, litellm's ``AuthenticationError`` /
    ``PermissionDeniedError``). Only these errors advise fixing the key."""


class JudgeError(CollabEnvError, RuntimeError):
    """An LLM judge could not produce a valid score after its retries (never a default score)."""


class JudgeValidityError(JudgeError):
    """A judge failed its validity check (:mod:`collab_env.eval.judge_check`: it cannot tell a
    right answer from a wrong one on rule-labelled conversations), so what it judges is not
    reported."""


class CacheMissError(CollabEnvError, LookupError):
    """A replay-mode response cache has no recorded response for a request."""

    def __str__(self) -> str:  # LookupError would quote the message like a key
        return str(self.args[0]) if self.args else ""


class SandboxError(CollabEnvError, RuntimeError):
    """The code sandbox itself failed (could not start, set up or clean up the child); never
    raised for what the untrusted code does, which is reported in the SandboxResult."""


class RewardError(CollabEnvError, RuntimeError):
    """A reward could not be computed (e.g. every sampled future of a multiturn-aware reward
    faulted); never replaced by a made-up value."""


class TaskFunctionError(CollabEnvError, RuntimeError):
    """A user-supplied formatter, reward function, reward processor or transition raised or
    returned an invalid value (never turned into an empty prompt or a zero reward)."""


class ServedEnvError(CollabEnvError, RuntimeError):
    """A served env (``collab-env serve``) refused a request or closed the connection; the message
    is the server's (or says why the connection closed)."""


class ZeroRewardWarning(UserWarning):
    """An env whose own reward is 0 at every step by construction (the CollabLLM envs, the chat
    envs: their score comes from a reward option such as ``reward="mr"``) was built without a
    reward option. The message says which options exist and what each needs (a judge, a user
    simulator); :func:`collab_env.compose.reward_options_note` writes it."""


class DeprecatedEnvWarning(UserWarning):
    """A superseded env version was built: a newer version of the same name is registered.

    The message names what the newer versions changed and the id to use instead. The old id
    stays registered (results recorded on it must reproduce), so this is a warning, not an
    error. It derives from ``UserWarning``, not ``DeprecationWarning``, because Python hides
    the latter by default outside ``__main__`` and the person who typed the id would never see
    it; filter it by this class (``warnings.filterwarnings("ignore", category=
    DeprecatedEnvWarning)``) where an old id is pinned on purpose."""


def did_you_mean(name: str, choices: Iterable[str], n: int = 3) -> str:
    """Return ``" Did you mean 'a' or 'b'?"`` for the closest choices, or ``""``."""
    close = difflib.get_close_matches(name, list(choices), n=n, cutoff=0.5)
    if not close:
        return ""
    return " Did you mean " + " or ".join(repr(c) for c in close) + "?"


def require(module: str, extra: str, purpose: str):
    """Import ``module`` or raise :class:`MissingDependencyError` naming the extra to install."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(
            f"{purpose} needs the optional dependency '{module}', which is not installed. "
            f"Install it with: pip install 'collab_env[{extra}]'"
        ) from exc


# ---------------------------------------------------------------------------------------------
# Keyword types: a value of the wrong type is a ConfigError naming the keyword, not a TypeError
# from deep inside the code that uses it.
# ---------------------------------------------------------------------------------------------
def check_keyword_types(values: Mapping[str, Any], owner: Any, *, where: str) -> None:
    """Raise :class:`ConfigError` for the first of ``values`` whose type does not match the
    annotation of the same name on ``owner`` (a dataclass or a function).

    The check is about types only (ranges and choices stay with the owner's own validation):
    ``int`` takes any integral number but not a bool, ``float`` any real number, a ``tuple`` or
    ``list`` of ``X`` any list or tuple of ``X`` (other iterables unchecked), a ``Literal`` any
    value of its values' type, ``Any`` and annotations that cannot be resolved anything. The
    message names the keyword, the type expected and the value given, and the fix where one is
    plain (a number passed as a string: pass it unquoted).

    Args:
        values: Keyword -> value given; names without an annotation are not checked.
        owner: The dataclass or function whose annotations say the types.
        where: Prefix of the message, e.g. the env name (``"hidden-facts"``); ``""``: none.
    """
    hints, defaults = _annotations(owner)
    for name, value in values.items():
        annotation = hints.get(name, Any)
        if _fits(value, annotation):
            continue
        expected = _describe(annotation)
        text = (f"{where}: " if where else "") + (
            f"{name} must be {expected}, got {type(value).__name__} {_short(value)}.")
        fixed = _unquoted(value, annotation)
        if fixed is not None:
            text += f" Pass {name}={fixed!r} (unquoted), not the string {value!r}."
        elif name in defaults and defaults[name] is not None and len(repr(defaults[name])) <= 40:
            text += f" For example {name}={defaults[name]!r} (the default)."
        else:
            text += f" Pass {expected}."
        raise ConfigError(text)


@functools.lru_cache(maxsize=256)  # an env is built per episode: resolve each owner once
def _annotations(owner: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(resolved annotations, defaults)`` of a dataclass or a function; an annotation that does
    not resolve (a name imported only for type checkers) is left out, so it is never checked."""
    try:
        hints = typing.get_type_hints(owner)
    except Exception:  # one unresolvable name: resolve the others one by one
        hints = {}
        module = sys.modules.get(getattr(owner, "__module__", ""), None)
        namespace = dict(vars(module)) if module is not None else {}
        for name, ann in getattr(owner, "__annotations__", {}).items():
            try:
                hints[name] = eval(ann, namespace) if isinstance(ann, str) else ann  # noqa: S307
            except Exception:
                continue
    defaults: dict[str, Any] = {}
    if dataclasses.is_dataclass(owner):
        defaults = {f.name: f.default for f in dataclasses.fields(owner)
                    if f.default is not dataclasses.MISSING}
    elif callable(owner):
        params: Iterable[inspect.Parameter]
        try:
            params = inspect.signature(owner).parameters.values()
        except (TypeError, ValueError):
            params = ()
        defaults = {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}
    return hints, defaults


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool) or (type(value).__module__ == "numpy" and type(value).__name__ in ("bool_", "bool"))


def _fits(value: Any, annotation: Any) -> bool:
    if annotation is Any or isinstance(annotation, typing.TypeVar):
        return True
    if annotation is None or annotation is type(None):
        return value is None
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Union or origin is types.UnionType:
        return any(_fits(value, a) for a in args)
    if origin is typing.Literal:  # the type only; the owner checks the choice and names them
        return any(isinstance(value, type(a)) for a in args)
    if annotation is bool:
        return _is_bool(value)
    if annotation is int:
        return isinstance(value, numbers.Integral) and not _is_bool(value)
    if annotation is float:
        return isinstance(value, numbers.Real) and not _is_bool(value)
    if annotation is str:
        return isinstance(value, str)
    sequences = (tuple, list, cabc.Sequence, cabc.MutableSequence)
    if annotation in sequences or origin in sequences:
        if isinstance(value, (str, bytes, cabc.Mapping)) or not isinstance(value, cabc.Iterable):
            return False
        if not args or not isinstance(value, (list, tuple)):
            return True
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            return len(value) == len(args) and all(_fits(v, a) for v, a in zip(value, args))
        return all(_fits(v, args[0]) for v in value)
    if annotation in (dict, cabc.Mapping, cabc.MutableMapping) or origin in (dict, cabc.Mapping, cabc.MutableMapping):
        return isinstance(value, cabc.Mapping)
    if annotation is cabc.Callable or origin is cabc.Callable:
        return callable(value)
    target = origin if origin is not None else annotation
    if isinstance(target, type):
        try:
            return isinstance(value, target)
        except TypeError:
            return True
    return True  # a string, a ForwardRef, a NewType...: not checked


def _describe(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if annotation is Any:
        return "any value"
    if annotation is None or annotation is type(None):
        return "None"
    if origin is typing.Union or origin is types.UnionType:
        parts = [_describe(a) for a in args if a is not type(None)]
        if type(None) in args:
            parts.append("None")
        return " or ".join(dict.fromkeys(parts))
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    simple = {bool: "True or False", int: "an int", float: "a number", str: "a str"}
    if annotation in simple:
        return simple[annotation]
    if origin in (tuple, list, cabc.Sequence, cabc.MutableSequence) or annotation in (tuple, list):
        if args and (origin is not tuple or (len(args) == 2 and args[1] is Ellipsis)):
            return f"a list of {_plain(args[0])}"
        return "a list"
    if origin in (dict, cabc.Mapping, cabc.MutableMapping) or annotation in (dict, cabc.Mapping):
        return "a dict"
    if origin is cabc.Callable or annotation is cabc.Callable:
        return "a callable"
    if origin is os.PathLike or annotation is os.PathLike:
        return "a path"
    target = origin if origin is not None else annotation
    return f"a {getattr(target, '__name__', str(target))}"


def _plain(annotation: Any) -> str:
    """``str`` for a list's elements: the bare type names (``str``, ``int or None``)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return " or ".join(_plain(a) for a in typing.get_args(annotation))
    if annotation is type(None):
        return "None"
    return getattr(annotation, "__name__", str(annotation))


def _unquoted(value: Any, annotation: Any) -> Any:
    """The bool or number a string stands for, when the annotation takes one (a value passed
    quoted, e.g. ``"2"`` for an int); else ``None``."""
    if not isinstance(value, str):
        return None
    text = value.strip()
    if text.lower() in ("true", "false") and _fits(True, annotation):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            number = kind(text)
        except ValueError:
            continue
        if _fits(number, annotation):
            return number
    return None


def _short(value: Any, width: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."

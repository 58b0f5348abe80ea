"""The one exception tree of collab_env.

Every error the library raises on purpose derives from :class:`CollabEnvError` and
also from the closest built-in exception (``ValueError``, ``TypeError``...), so
callers can catch either. Messages say what went wrong, why, and how to fix it.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = [
    "CollabEnvError",
    "ConfigError",
    "UnknownEnvError",
    "ActionError",
    "EnvStateError",
    "DatasetUnavailableError",
    "DataSchemaError",
    "MissingDependencyError",
    "PolicyError",
    "FatalPolicyError",
    "JudgeError",
    "CacheMissError",
    "TaskFunctionError",
    "SandboxError",
    "RewardError",
    "did_you_mean",
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


class JudgeError(CollabEnvError, RuntimeError):
    """An LLM judge could not produce a valid score after its retries (never a default score)."""


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

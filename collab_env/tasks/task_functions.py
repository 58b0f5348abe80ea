"""CoMLRL's calling conventions for the functions a user hands to a task, in one place.

A CoMLRL training script brings a ``reward_func``, perhaps a ``reward_processor``, formatters and an
``external_transition``. Which keywords each of them gets depends on what its signature declares;
the signature is read once, at construction, so that calls in the step loop stay cheap and a
function that cannot take its call fails at once, not mid-training. What a reward function returns
is checked here too: a reward is a finite number, and a function that raises or returns anything
else is a :class:`~collab_env.errors.TaskFunctionError`, never a silent 0.

Used by :class:`~collab_env.tasks.dataset_task.DatasetTask` (behind
:func:`~collab_env.tasks.dataset_env.from_dataset`) and
:class:`~collab_env.rewards.joint.JointReward`.
"""

from __future__ import annotations

import inspect
import math
import numbers
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from collab_env.errors import ConfigError, DataSchemaError, TaskFunctionError

__all__ = [
    "TRANSITION_KEYWORDS",
    "REWARD_KEYWORDS",
    "callable_name",
    "signature_of",
    "declared_keywords",
    "declares_keyword",
    "check_bindable",
    "prompt_formatter",
    "check_reward_callables",
    "check_reward_func",
    "call_reward_func",
    "as_reward",
    "one_reward",
    "process_reward",
]

#: Keywords an ``external_transition`` may declare (it gets exactly those it declares, or all of
#: them when it takes ``**kwargs``).
TRANSITION_KEYWORDS: tuple[str, ...] = (
    "prompt",
    "agent_completions",
    "num_agents",
    "prompt_history_per_agent",
    "response_history_per_agent",
    "item",
    "batch_items",
    "turn",
)
#: Keywords a ``reward_func`` may declare besides the per-agent completion lists.
REWARD_KEYWORDS: tuple[str, ...] = ("batch_items", "prompts")


# ---------------------------------------------------------------------------------------------
# Signature inspection (done once, at construction: calls in the step loop stay cheap)
# ---------------------------------------------------------------------------------------------
def callable_name(fn: Any) -> str:
    """A readable name for error messages: ``module.qualname`` where there is one."""
    qual = getattr(fn, "__qualname__", None) or getattr(type(fn), "__qualname__", None)
    mod = getattr(fn, "__module__", None)
    if qual is None:
        return repr(fn)
    return f"{mod}.{qual}" if mod and mod != "builtins" else qual


def signature_of(fn: Callable[..., Any]) -> inspect.Signature | None:
    """``inspect.signature(fn)``, or ``None`` for a callable that has none (some builtins and C
    callables): such a function gets no optional keywords and is not checked. Kept while the
    function lives (every env built reads the signatures of its task's functions again); held
    weakly, so a kept signature never keeps a function, or what its closure holds, alive."""
    try:
        return _SIGNATURES[fn]
    except (KeyError, TypeError):  # not seen yet, or a callable that cannot be held weakly
        pass
    try:
        sig: inspect.Signature | None = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins and C callables have none
        sig = None
    try:
        _SIGNATURES[fn] = sig
    except TypeError:
        pass
    return sig


_SIGNATURES: weakref.WeakKeyDictionary[Any, inspect.Signature | None] = weakref.WeakKeyDictionary()


def declared_keywords(sig: inspect.Signature | None, names: Sequence[str]) -> tuple[str, ...]:
    """Which of ``names`` to pass to a function: those it declares as keyword-capable
    parameters, or all of them when it takes ``**kwargs``."""
    if sig is None:
        return ()
    params = sig.parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return tuple(names)
    return tuple(
        n for n in names
        if n in params and params[n].kind is not inspect.Parameter.POSITIONAL_ONLY
    )


def declares_keyword(sig: inspect.Signature | None, name: str) -> bool:
    """Whether the signature has an explicit parameter ``name`` that can be passed by keyword."""
    return (
        sig is not None
        and name in sig.parameters
        and sig.parameters[name].kind is not inspect.Parameter.POSITIONAL_ONLY
    )


def check_bindable(sig: inspect.Signature | None, what: str, fn: Any, args: Sequence[Any],
                   kwargs: Mapping[str, Any], hint: str) -> None:
    """Fail at construction, not mid-training, when ``fn`` cannot take the call we will make.

    Args:
        sig: ``fn``'s signature (:func:`signature_of`); ``None`` skips the check.
        what: What ``fn`` is, for the message (``"reward_func"``, ``"formatter 0 (for 'a')"``).
        fn: The function.
        args: Positional arguments of a sample call.
        kwargs: Keyword arguments of a sample call.
        hint: How the function is called, appended to the message.

    Raises:
        ConfigError: ``sig`` cannot bind the sample call.
    """
    if sig is None:
        return
    try:
        sig.bind(*args, **kwargs)
    except TypeError as exc:
        raise ConfigError(f"{what} {callable_name(fn)!r} has an incompatible signature {sig}: {exc}. {hint}") from exc


# ---------------------------------------------------------------------------------------------
# The default formatter
# ---------------------------------------------------------------------------------------------
def prompt_formatter(item: Mapping[str, Any], external_prompts: str | None = None) -> str:
    """The default formatter (CoMLRL's): the item's ``prompt`` field on the first turn, the
    external prompt on later turns.

    Raises:
        DataSchemaError: The item has no ``prompt`` str (an empty prompt is never made up).
    """
    if external_prompts is not None:
        return external_prompts
    prompt = item.get("prompt") if isinstance(item, Mapping) else None
    if not isinstance(prompt, str):
        raise DataSchemaError(
            f"the default formatter reads the item's 'prompt' field, but this item has "
            f"{'no prompt' if prompt is None else 'a ' + type(prompt).__name__ + ' prompt'} (fields: "
            f"{sorted(item) if isinstance(item, Mapping) else type(item).__name__}); pass formatters=[...]."
        )
    return prompt


# ---------------------------------------------------------------------------------------------
# Reward functions: checking, calling, reading what they return
# ---------------------------------------------------------------------------------------------
def check_reward_callables(reward_func: Any, reward_processor: Any) -> None:
    """Validate a CoMLRL ``reward_func`` and optional ``reward_processor``: both callable
    (the processor may be ``None``), or a :class:`~collab_env.errors.ConfigError`."""
    if not callable(reward_func):
        raise ConfigError(
            f"reward_func must be callable, got {type(reward_func).__name__}. It takes one list "
            "of completions per agent and returns a list with one reward."
        )
    if reward_processor is not None and not callable(reward_processor):
        raise ConfigError(
            f"reward_processor must be a callable float -> float or None, got "
            f"{type(reward_processor).__name__}."
        )


def check_reward_func(reward_func: Callable[..., Any], agents: Sequence[str]) -> tuple[str, ...]:
    """Check once that ``reward_func`` can take the call it will get, and say which keywords.

    The call is one completion list per agent of ``agents``, positionally and in that order,
    plus those of :data:`REWARD_KEYWORDS` that the function declares (all of them when it takes
    ``**kwargs``).

    Returns:
        The keywords to pass (for :func:`call_reward_func`).

    Raises:
        ConfigError: The signature cannot take that call (the message shows the call).
    """
    sig = signature_of(reward_func)
    keywords = declared_keywords(sig, REWARD_KEYWORDS)
    n = len(agents)
    check_bindable(
        sig, "reward_func", reward_func, [[""]] * n, dict.fromkeys(keywords),
        f"It is called with one list of completions per agent ({n} positional arguments, in the "
        f"order {list(agents)}) and may declare the keywords {list(REWARD_KEYWORDS)}.",
    )
    return keywords


def call_reward_func(fn: Callable[..., Any], keywords: Sequence[str], completions: Sequence[str],
                     item: Mapping[str, Any], prompts: Sequence[str] | None, where: str) -> Any:
    """Call a CoMLRL ``reward_func`` on one joint response: one single-completion list per agent,
    positionally, plus the declared ``keywords`` (``batch_items`` / ``prompts``). Its exception
    becomes a :class:`TaskFunctionError` naming the function and ``where``."""
    available = {"batch_items": [item], "prompts": list(prompts or [])}
    try:
        return fn(*[[c] for c in completions], **{k: available[k] for k in keywords})
    except Exception as exc:
        raise TaskFunctionError(
            f"reward_func {callable_name(fn)!r} raised {type(exc).__name__}: {exc} {where}. A failing "
            "reward is an error, never a silent 0: fix the function."
        ) from exc


def as_reward(value: Any, who: str, where: str) -> float:
    """``value`` as a finite float, or a :class:`TaskFunctionError` naming ``who``."""
    if not isinstance(value, numbers.Real) and hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
        value = value.item()  # 0-d numpy arrays and torch tensors
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TaskFunctionError(
            f"{who} gave a {type(value).__name__} ({value!r}) {where}; a reward is a number "
            "(return float(...))."
        )
    value = float(value)
    if not math.isfinite(value):
        raise TaskFunctionError(f"{who} gave the non-finite reward {value} {where}.")
    return value


def one_reward(out: Any, who: str, where: str) -> float:
    """The single joint reward of a reward function's return value: a list (or array) with one
    number, or a bare number (CoMLRL accepts both), else a :class:`TaskFunctionError`."""
    if hasattr(out, "tolist") and not isinstance(out, (list, tuple)):
        out = out.tolist()  # numpy arrays, torch tensors
    if isinstance(out, numbers.Real) and not isinstance(out, bool):
        out = [out]  # CoMLRL also accepts a bare number
    if not isinstance(out, (list, tuple)):
        raise TaskFunctionError(
            f"{who} returned a {type(out).__name__} {where}; it must return a list with one reward "
            "(the joint reward of the agents' responses)."
        )
    if len(out) != 1:
        raise TaskFunctionError(
            f"{who} returned {len(out)} values {where}; it got one completion per agent and must "
            "return a list with exactly one reward."
        )
    return as_reward(out[0], who, where)


def process_reward(processor: Callable[[float], float] | None, raw: float, where: str) -> float:
    """``raw`` mapped by a ``reward_processor`` (``float -> float``; ``None``: ``raw`` itself).

    Raises:
        TaskFunctionError: The processor raised, or returned something that is not a finite
            number (see :func:`as_reward`); ``where`` says at which item and step.
    """
    if processor is None:
        return raw
    try:
        out = processor(raw)
    except Exception as exc:
        raise TaskFunctionError(
            f"reward_processor {callable_name(processor)!r} raised {type(exc).__name__}: {exc} "
            f"on reward {raw} {where}."
        ) from exc
    return as_reward(out, f"reward_processor {callable_name(processor)!r}", where)

"""The ``token_amount`` metric: how many words (or tokenizer tokens) a scope of the conversation has."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any, Literal

from collab_env.errors import ConfigError
from collab_env.rewards.metrics.context import assistant_messages, is_public
from collab_env.rewards.metrics.registry import MetricResult
from collab_env.types import Conversation

__all__ = ["token_amount"]


def _count(text: str, tokenizer: Any) -> int:
    if tokenizer is None:
        return len(text.split())
    if not hasattr(tokenizer, "encode"):
        raise ConfigError(f"ctx['tokenizer'] must have .encode(text), got {type(tokenizer).__name__}.")
    params: Mapping[str, inspect.Parameter]
    try:
        params = inspect.signature(tokenizer.encode).parameters
    except (TypeError, ValueError):
        params = {}
    takes_kw = "add_special_tokens" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())
    ids = tokenizer.encode(text, add_special_tokens=False) if takes_kw else tokenizer.encode(text)
    return len(ids)


async def token_amount(conversation: Conversation, item: Mapping[str, Any], *, start: int = 0,
                       **ctx: Any) -> MetricResult:
    """Raw count of words (whitespace-split) or, with ``ctx["tokenizer"]``, tokens.

    ctx ``scope``: ``"future"`` (default, as the verl recipe: every message from ``start``),
    ``"assistant"`` (assistant messages of the whole conversation) or ``"all"``. System
    messages and messages with a restricted audience (hidden goals) are never counted.
    The weight (e.g. ``-1e-4``) is applied by the caller.
    """
    scope: Literal["future", "assistant", "all"] = ctx.get("scope", "future")
    public = [m for m in conversation if is_public(m) and m.role != "system"]
    if scope == "future":
        msgs = [m for m in conversation[start:] if is_public(m) and m.role != "system"]
    elif scope == "assistant":
        msgs = assistant_messages(conversation, ctx)
    elif scope == "all":
        msgs = public
    else:
        raise ConfigError(f"token_amount: scope must be 'future', 'assistant' or 'all', got {scope!r}.")
    tokenizer = ctx.get("tokenizer")
    n = sum(_count(m.content, tokenizer) for m in msgs)
    return MetricResult(float(n), {"scope": scope, "unit": "tokens" if tokenizer is not None else "words",
                                   "messages": len(msgs)})

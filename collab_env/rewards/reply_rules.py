"""The verl recipe's reply rules, used by the multiturn-aware reward.

The recipe on verl (its CollabLLM agent loop, interaction and reward manager) rolls no future for
an invalid reply (:func:`is_valid_reply`), removes ``<think>...</think>`` blocks before the user
simulator and the judges read a transcript (:func:`strip_think`,
:func:`strip_think_conversation`) and counts a token budget (:func:`token_count_fn`). The rules
and their cases are stated in :mod:`collab_env.rewards.mr`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from collab_env.errors import ConfigError
from collab_env.types import Conversation

__all__ = ["is_valid_reply", "strip_think", "strip_think_conversation", "token_count_fn"]

_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"
_THINK_BLOCK = re.compile(r"<think>(.*?)</think>", re.DOTALL)
_END_OF_TURN = "<|im_end|>"


def is_valid_reply(text: str) -> bool:
    """Whether the verl recipe rolls futures for a reply (else it rewards it 0).

    A reply is valid when it is not blank, holds at most one ``<think>...</think>`` block (as
    many opening as closing tags, so neither unbalanced nor nested), that block is not blank
    inside, and some visible text remains outside it once a trailing ``<|im_end|>`` is removed.
    """
    if not isinstance(text, str) or not text.strip():
        return False
    opens, closes = text.count(_THINK_OPEN), text.count(_THINK_CLOSE)
    if opens != closes or opens > 1:
        return False
    visible = text
    if opens == 1:
        block = _THINK_BLOCK.search(text)
        if block is None or not block.group(1).strip():  # "</think>...<think>" or an empty block
            return False
        visible = _THINK_BLOCK.sub("", text)
    visible = visible.strip()
    if visible.endswith(_END_OF_TURN):
        visible = visible[: -len(_END_OF_TURN)]
    return bool(visible.strip())


def strip_think(text: str) -> str:
    """``text`` without its ``<think>...</think>`` blocks, whitespace-trimmed (what verl's user
    simulator and judges read): :func:`collab_env.agents.replies.strip_think`, the one
    implementation, which the simulator's and the judges' transcripts apply too."""
    from collab_env.agents.replies import strip_think as strip

    return strip(text)


def strip_think_conversation(conversation: Conversation) -> Conversation:
    """The conversation with :func:`strip_think` applied to every message (same length, so
    message indices such as a metric's ``start`` keep their meaning):
    :func:`collab_env.agents.replies.strip_think_conversation`."""
    from collab_env.agents.replies import strip_think_conversation as strip

    return strip(conversation)


def token_count_fn(counter: Any) -> Callable[[str], int]:
    """``text -> count`` from ``token_counter=``: None (whitespace words), a tokenizer (its
    ``encode``) or a callable."""
    if counter is None:
        return lambda text: len(text.split())
    if hasattr(counter, "encode"):
        def count(text: str) -> int:
            try:
                return len(counter.encode(text, add_special_tokens=False))
            except TypeError:  # an encoder without that keyword (e.g. tiktoken)
                return len(counter.encode(text))
        return count
    if callable(counter):
        return lambda text: int(counter(text))
    raise ConfigError(
        f"token_counter must be None (words), a tokenizer with encode() or a callable text -> int, got {counter!r}."
    )

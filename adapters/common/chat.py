"""Chat-span helpers of the learners that train on chat text (SFT, DPO).

Token spans of assistant turns are located by tokenising the chat template's prefixes, so a
template must render a conversation's start the same way alone and inside the whole
conversation (:func:`check_token_prefix`); a span ends with the end-of-turn token, never with the
template's text after it (:func:`cut_at_end_of_turn`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from collab_env.errors import ConfigError
from collab_env.types import template_chat

__all__ = ["chat_ids", "cut_at_end_of_turn", "check_token_prefix"]


def chat_ids(tokenizer: Any, messages: Sequence[Mapping[str, str]], *, generation_prompt: bool = False) -> list[int]:
    """Token ids of ``messages`` rendered with the tokenizer's chat template (the template writes
    any BOS token, so the tokenizer adds none). A tool call is rendered once, from the text the
    model wrote (:func:`~collab_env.types.template_chat`)."""
    text = tokenizer.apply_chat_template(template_chat(messages), tokenize=False,
                                         add_generation_prompt=generation_prompt)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def cut_at_end_of_turn(tokenizer: Any, ids: Sequence[int], start: int, end: int) -> int:
    """``end`` cut just after the last EOS token in ``ids[start:end]`` (the template's text
    after the end-of-turn token is never generated), or ``end`` when there is none."""
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        return end
    for j in range(end - 1, start - 1, -1):
        if ids[j] == eos:
            return j + 1
    return end


def check_token_prefix(full: Sequence[int], prefix: Sequence[int], where: str) -> None:
    """Raise :class:`ConfigError` (naming ``where``) unless ``prefix`` is a token prefix of
    ``full``: the chat template must render a conversation's start the same way alone."""
    if len(prefix) > len(full) or list(full[:len(prefix)]) != list(prefix):
        raise ConfigError(
            f"{where}: the chat template renders a conversation prefix differently from the start of "
            "the whole conversation (it rewrites earlier turns, or the tokenizer merges across the turn "
            "boundary), so assistant spans cannot be located exactly. Use a template that renders "
            "turns independently (e.g. ChatML), or train on conversations ending at the trained turn."
        )

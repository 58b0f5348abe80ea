"""Text spaces for LLM players.

Gymnasium's ``Text`` space only admits a fixed character set, so real model output (emoji,
CJK, curly quotes, newlines, the empty string) falls outside it. These spaces admit any
``str`` within length bounds and still behave like Gymnasium spaces: seeded ``sample()``,
``contains``, equality and pickling, so they pass Gymnasium's and PettingZoo's checkers.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium.spaces import Space

from collab_env.types import ROLES, Conversation, Message

#: The roles ``Chat.sample`` draws: the chat roles (a ``"tool"`` message answers a tool call, so it
#: is not drawn alone); the same draws as before tool messages existed.
_SAMPLED_ROLES = tuple(r for r in ROLES if r != "tool")

__all__ = ["UnicodeText", "Chat"]

# Pools sampled by UnicodeText.sample(): what LLM text really contains.
_POOLS: tuple[str, ...] = (
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789",
    " \n\t.,;:!?'\"()[]{}<>/\\|@#$%^&*-_=+`~",
    "éèêëàâäôöûüçñßÆØÅœ€£¥",
    "你好世界中文字符数学问题答案用户助手日本語한국어",
    "😀😂🤖🚀✨👍🔥🎉❤️🧠",
    "\u2018\u2019\u201c\u201d\u2013\u2014\u2026\u00a0\u200b",
    "∑∫√π≤≥≠∞αβγδθλμσ",
)


class UnicodeText(Space[str]):
    """Any ``str`` with ``min_length <= len(s) <= max_length`` (characters, not bytes).

    Args:
        max_length: Longest admitted string.
        min_length: Shortest admitted string (0 admits the empty string).
        sample_max_length: Longest string ``sample()`` draws (random samples stay small even
            when ``max_length`` is large).
        seed: Seed of the space's random generator.
    """

    def __init__(
        self,
        max_length: int = 100_000,
        *,
        min_length: int = 0,
        sample_max_length: int = 64,
        seed: int | np.random.Generator | None = None,
    ) -> None:
        if not 0 <= min_length <= max_length:
            raise ValueError(f"need 0 <= min_length <= max_length, got {min_length}, {max_length}")
        self.min_length = int(min_length)
        self.max_length = int(max_length)
        self.sample_max_length = int(max(min_length, min(sample_max_length, max_length)))
        super().__init__(dtype=str, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    _pending_seed: int | None = None  # a seed_later() seed not applied yet

    def seed_later(self, seed: int) -> None:
        """``seed(seed)``, done when the generator is first used instead of now: seeding costs
        tens of microseconds and an env re-seeds its action spaces on every seeded reset, while
        most episodes never sample an action. The samples are those of ``seed(seed)``."""
        self._np_random = None  # type: ignore[assignment]  # (as Space.__init__ leaves it)
        self._pending_seed = int(seed)

    def seed(self, seed: int | None = None) -> int | Any:
        self._pending_seed = None
        return super().seed(seed)

    @property
    def np_random(self) -> np.random.Generator:
        pending = self._pending_seed
        if pending is not None and self._np_random is None:
            self.seed(pending)
        return super().np_random

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        """A random string mixing ASCII, punctuation, accents, CJK, emoji and typography."""
        if mask is not None or probability is not None:
            raise NotImplementedError("UnicodeText.sample() takes no mask")
        rng = self.np_random
        n = int(rng.integers(self.min_length, self.sample_max_length + 1))
        pools = rng.integers(0, len(_POOLS), size=n)
        return "".join(_POOLS[p][int(rng.integers(0, len(_POOLS[p])))] for p in pools)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"UnicodeText(min_length={self.min_length}, max_length={self.max_length})"

    def __eq__(self, other: Any) -> bool:
        return (
            isinstance(other, UnicodeText)
            and other.min_length == self.min_length
            and other.max_length == self.max_length
        )

    def to_jsonable(self, sample_n):  # type: ignore[override]
        return list(sample_n)

    def from_jsonable(self, sample_n):  # type: ignore[override]
        return list(sample_n)


class Chat(Space[Conversation]):
    """A player's view of a conversation: a :class:`~collab_env.types.Conversation` of at most
    ``max_messages`` messages, each with at most ``max_message_length`` characters.

    ``sample()`` draws a short random conversation (useful for checkers and fuzzing).
    """

    def __init__(
        self,
        max_messages: int = 4096,
        max_message_length: int = 1_000_000,
        *,
        seed: int | np.random.Generator | None = None,
    ) -> None:
        self.max_messages = int(max_messages)
        self.max_message_length = int(max_message_length)
        self._text = UnicodeText(max_message_length, sample_max_length=32)
        super().__init__(dtype=object, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def seed(self, seed: int | None = None) -> int | list[int] | dict[str, int]:
        out = super().seed(seed)
        self._text.seed(int(self.np_random.integers(2**31)))
        return out

    def sample(self, mask: Any = None, probability: Any = None) -> Conversation:
        if mask is not None or probability is not None:
            raise NotImplementedError("Chat.sample() takes no mask")
        rng = self.np_random
        n = int(rng.integers(0, min(4, self.max_messages) + 1))
        msgs = []
        for _ in range(n):
            role = _SAMPLED_ROLES[int(rng.integers(0, len(_SAMPLED_ROLES)))]
            msgs.append(Message(role=role, content=self._text.sample(), author=role))
        return Conversation(tuple(msgs))

    def contains(self, x: Any) -> bool:
        return (
            isinstance(x, Conversation)
            and len(x) <= self.max_messages
            and all(len(m.content) <= self.max_message_length for m in x)
        )

    def __repr__(self) -> str:
        return f"Chat(max_messages={self.max_messages}, max_message_length={self.max_message_length})"

    def __eq__(self, other: Any) -> bool:
        return (
            isinstance(other, Chat)
            and other.max_messages == self.max_messages
            and other.max_message_length == self.max_message_length
        )

    def to_jsonable(self, sample_n):  # type: ignore[override]
        return [c.to_dict() for c in sample_n]

    def from_jsonable(self, sample_n):  # type: ignore[override]
        return [Conversation.from_dict(d) for d in sample_n]

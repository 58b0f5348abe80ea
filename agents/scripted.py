"""Scripted policies: deterministic, model-free players.

Used as simulated users for the built-in suites, as reference baselines ("ask then answer",
"answer at once") and wherever a test needs a real policy without a model. Determinism: each
reply is a function of the observation and the ``seed`` sampling parameter only.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from collab_env.types import Completion, Conversation

__all__ = ["ScriptedPolicy", "FixedTextPolicy", "CallablePolicy", "observation_rng"]


def observation_rng(observation: Conversation, seed: int | None) -> np.random.Generator:
    """A generator that depends only on ``seed`` and the observation's content."""
    h = hashlib.blake2b(digest_size=8)
    for m in observation:
        h.update(m.author.encode("utf-8", "replace") + b"\0")
        h.update(m.content.encode("utf-8", "replace") + b"\1")
    return np.random.default_rng([int(seed or 0) & 0xFFFFFFFF, int.from_bytes(h.digest(), "little")])


class ScriptedPolicy:
    """Base class: implement :meth:`respond`; ``act`` maps it over the batch."""

    name = "scripted"

    def respond(self, observation: Conversation, rng: np.random.Generator) -> str:
        raise NotImplementedError

    async def act(self, observations: Sequence[Conversation], **sampling: Any) -> list[Completion]:
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
        self.name = name or getattr(fn, "__name__", "callable")
        try:
            import inspect

            self._takes_rng = len(inspect.signature(fn).parameters) >= 2
        except (TypeError, ValueError):
            self._takes_rng = False

    def respond(self, observation: Conversation, rng: np.random.Generator) -> str:
        return self.fn(observation, rng) if self._takes_rng else self.fn(observation)

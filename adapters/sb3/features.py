"""Observation features: ``Box`` vectors of a player's conversation (and of candidate replies)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium
import numpy as np

from collab_env.adapters.sb3.chat import ENV_AUTHOR, NUMBER, read_facts
from collab_env.errors import ConfigError
from collab_env.types import Completion, Conversation

__all__ = [
    "Features",
    "ChatFeatures",
    "HiddenFactsFeatures",
    "EmbeddingFeatures",
    "CANDIDATE_FEATURES",
    "candidate_features",
]


class Features:
    """Box features of a player's observation: subclasses set :attr:`size` and implement
    :meth:`compute`; values are clipped to ``[low, high]``.

    Args:
        low: Lower bound of every feature.
        high: Upper bound of every feature.
    """

    size: int = 0

    def __init__(self, low: float = 0.0, high: float = 1.0) -> None:
        if not low < high:
            raise ConfigError(f"Features need low < high, got {low}, {high}.")
        self.low, self.high = float(low), float(high)

    @property
    def space(self) -> gymnasium.spaces.Box:
        """The observation space these features fill."""
        return gymnasium.spaces.Box(self.low, self.high, shape=(self.size,), dtype=np.float32)

    def compute(self, observation: Conversation, player: str) -> Sequence[float] | np.ndarray:
        """The raw features of ``observation`` as ``player`` sees it (a list or an array)."""
        raise NotImplementedError

    def __call__(self, observation: Conversation, player: str) -> np.ndarray:
        x = np.asarray(self.compute(observation, player), dtype=np.float32)
        if x.shape != (self.size,):
            raise ConfigError(f"{type(self).__name__} computed {x.shape} features, declared ({self.size},).")
        return np.clip(x, self.low, self.high)


class ChatFeatures(Features):
    """Generic features of any chat, each scaled to ``[0, 1]``: own turns and the other players'
    messages (over ``max_turns``), the lengths of the last message by another player and of the
    own last one (over ``max_chars``), whether that last message asks a question, and the numbers
    written by the others in all and in their last message (over ``max_numbers``).

    Args:
        max_turns: Turns that map to 1.
        max_chars: Characters that map to 1.
        max_numbers: Numbers that map to 1.
    """

    size = 7

    def __init__(self, max_turns: int = 6, max_chars: int = 500, max_numbers: int = 10) -> None:
        super().__init__(0.0, 1.0)
        if min(max_turns, max_chars, max_numbers) < 1:
            raise ConfigError("max_turns, max_chars and max_numbers must be >= 1.")
        self.max_turns, self.max_chars, self.max_numbers = max_turns, max_chars, max_numbers

    def compute(self, observation: Conversation, player: str) -> Sequence[float]:
        own = [m for m in observation if m.author == player]
        others = [m for m in observation if m.author not in (player, ENV_AUTHOR)]
        last_other = others[-1].content if others else ""
        last_own = own[-1].content if own else ""
        numbers = sum(len(NUMBER.findall(m.content)) for m in others)
        return [
            len(own) / self.max_turns,
            len(others) / self.max_turns,
            len(last_other) / self.max_chars,
            len(last_own) / self.max_chars,
            float("?" in last_other),
            numbers / self.max_numbers,
            len(NUMBER.findall(last_other)) / self.max_numbers,
        ]


class HiddenFactsFeatures(ChatFeatures):
    """:class:`ChatFeatures` plus what the assistant of a ``hidden-facts*`` env knows, read from
    its visible chat: objects named (0/1), quantities known, quantities missing, nothing missing
    (0/1), quantities the user's last reply revealed (counts over ``max_facts``).

    Args:
        max_facts: Quantities that map to 1 (two per object; 8 covers four objects).
        **kwargs: :class:`ChatFeatures` arguments.
    """

    size = ChatFeatures.size + 5

    def __init__(self, max_facts: int = 8, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if max_facts < 1:
            raise ConfigError(f"max_facts must be >= 1, got {max_facts}.")
        self.max_facts = max_facts

    def compute(self, observation: Conversation, player: str) -> Sequence[float]:
        base = list(super().compute(observation, player))
        vf = read_facts(observation)
        if vf is None:
            return base + [0.0] * 5
        others = [i for i, m in enumerate(observation) if m.author not in (player, ENV_AUTHOR)]
        before = read_facts(observation[: others[-1]]) if others else None
        known_before = len(before["known"]) if before is not None else 0
        named = bool(vf["objects"])
        return base + [
            float(named),
            len(vf["known"]) / self.max_facts,
            len(vf["missing"]) / self.max_facts,
            float(named and not vf["missing"]),
            (len(vf["known"]) - known_before) / self.max_facts,
        ]


class EmbeddingFeatures(Features):
    """``base`` features followed by a frozen encoder's embedding of the conversation.

    Args:
        base: The features to extend.
        encoder: ``encoder(text) -> vector`` of length ``dim`` (a frozen sentence encoder; it is
            called once per observation, on the visible chat rendered as ``role: content`` lines).
        dim: Length of the embedding.
        bound: Embedding values are clipped to ``[-bound, bound]`` (unit-norm embeddings: 1).
    """

    def __init__(self, base: Features, encoder: Callable[[str], Any], dim: int, bound: float = 1.0) -> None:
        if not callable(encoder):
            raise ConfigError("encoder must be callable(text) -> vector.")
        if dim < 1 or bound <= 0:
            raise ConfigError(f"need dim >= 1 and bound > 0, got dim={dim}, bound={bound}.")
        super().__init__(min(base.low, -bound), max(base.high, bound))
        self.base, self.encoder, self.dim, self.bound = base, encoder, int(dim), float(bound)
        self.size = base.size + self.dim

    @property
    def space(self) -> gymnasium.spaces.Box:
        low = np.concatenate([np.full(self.base.size, self.base.low), np.full(self.dim, -self.bound)])
        high = np.concatenate([np.full(self.base.size, self.base.high), np.full(self.dim, self.bound)])
        return gymnasium.spaces.Box(low.astype(np.float32), high.astype(np.float32), dtype=np.float32)

    def compute(self, observation: Conversation, player: str) -> np.ndarray:
        text = "\n".join(f"{m.role}: {m.content}" for m in observation)
        emb = np.asarray(self.encoder(text), dtype=np.float32).reshape(-1)
        if emb.shape != (self.dim,):
            raise ConfigError(f"encoder returned {emb.shape[0]} values, expected dim={self.dim}.")
        return np.concatenate([self.base(observation, player), np.clip(emb, -self.bound, self.bound)])

    def __call__(self, observation: Conversation, player: str) -> np.ndarray:
        x = np.asarray(self.compute(observation, player), dtype=np.float32)
        return np.clip(x, self.space.low, self.space.high)


#: Features of one candidate reply in :class:`RerankWrapper` (each in ``[0, 1]``).
CANDIDATE_FEATURES = ("length", "boxed", "questions", "numbers", "fault")


def candidate_features(completion: Completion, max_chars: int = 500) -> list[float]:
    """:data:`CANDIDATE_FEATURES` of one candidate: its length (over ``max_chars``), whether it
    holds a ``\\boxed{}`` answer, its question marks (over 5), its numbers (over 10), and whether
    the policy gave up on it (a fault)."""
    text = completion.text
    return [
        min(len(text) / max_chars, 1.0),
        float("\\boxed" in text),
        min(text.count("?") / 5, 1.0),
        min(len(NUMBER.findall(text)) / 10, 1.0),
        float(completion.is_fault),
    ]

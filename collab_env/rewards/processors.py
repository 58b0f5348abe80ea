"""Reward processors: small picklable ``float -> float`` callables, as in CoMLRL's
``comlrl.utils.reward_processor.RewardProcessors``.

A reward processor transforms every reward before it reaches the learner (``reward_processor=``
of :func:`collab_env.tasks.from_dataset` and :class:`collab_env.rewards.joint.JointReward`)::

    from collab_env.rewards.processors import RewardProcessors

    proc = RewardProcessors.compose(RewardProcessors.scale(factor=10.0),
                                    RewardProcessors.clip(low=-5.0, high=5.0))
    proc(0.3)   # 3.0
    proc(0.9)   # 5.0

Every processor is a class instance (never a lambda), so it pickles with ``pickle`` and can be
sent to worker processes. Invalid arguments raise :class:`~collab_env.errors.ConfigError`.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from typing import Any

from collab_env.errors import ConfigError

__all__ = ["RewardProcessors", "Scale", "Shift", "Clip", "Compose", "RunningNormalizer"]


def _finite(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigError(f"{what} must be a real number, got {type(value).__name__} ({value!r}).")
    value = float(value)
    if not math.isfinite(value):
        raise ConfigError(f"{what} must be finite, got {value}.")
    return value


class Scale:
    """``r -> factor * r``."""

    def __init__(self, factor: float = 1.0) -> None:
        self.factor = _finite(factor, "scale factor")

    def __call__(self, reward: float) -> float:
        return self.factor * float(reward)

    def __repr__(self) -> str:
        return f"Scale(factor={self.factor})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Scale) and other.factor == self.factor

    __hash__ = None  # type: ignore[assignment]


class Shift:
    """``r -> r + offset``."""

    def __init__(self, offset: float = 0.0) -> None:
        self.offset = _finite(offset, "shift offset")

    def __call__(self, reward: float) -> float:
        return float(reward) + self.offset

    def __repr__(self) -> str:
        return f"Shift(offset={self.offset})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Shift) and other.offset == self.offset

    __hash__ = None  # type: ignore[assignment]


class Clip:
    """``r -> min(max(r, low), high)``; either bound may be ``None`` (unbounded)."""

    def __init__(self, low: float | None = None, high: float | None = None) -> None:
        self.low = None if low is None else _finite(low, "clip low")
        self.high = None if high is None else _finite(high, "clip high")
        if self.low is None and self.high is None:
            raise ConfigError("clip needs at least one bound: pass low=, high= or both.")
        if self.low is not None and self.high is not None and self.low > self.high:
            raise ConfigError(f"clip low ({self.low}) must be <= high ({self.high}).")

    def __call__(self, reward: float) -> float:
        r = float(reward)
        if self.low is not None and r < self.low:
            r = self.low
        if self.high is not None and r > self.high:
            r = self.high
        return r

    def __repr__(self) -> str:
        return f"Clip(low={self.low}, high={self.high})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Clip) and (other.low, other.high) == (self.low, self.high)

    __hash__ = None  # type: ignore[assignment]


class Compose:
    """Apply processors left to right: ``compose(f, g)(r) == g(f(r))``."""

    def __init__(self, *processors: Callable[[float], float]) -> None:
        if not processors:
            raise ConfigError("compose needs at least one processor.")
        for i, p in enumerate(processors):
            if not callable(p):
                raise ConfigError(
                    f"compose argument {i} is a {type(p).__name__}, not a callable float -> float."
                )
        self.processors = tuple(processors)

    def __call__(self, reward: float) -> float:
        r = float(reward)
        for p in self.processors:
            r = p(r)
        return r

    def __repr__(self) -> str:
        return f"Compose({', '.join(repr(p) for p in self.processors)})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Compose) and other.processors == self.processors

    __hash__ = None  # type: ignore[assignment]


class RunningNormalizer:
    """Normalise rewards by running statistics: ``(r - mean) / (std + eps)``.

    Each call first adds ``r`` to the statistics (Welford's online algorithm; ``std`` is the
    population standard deviation of every reward seen so far, ``r`` included), then returns the
    normalised value, optionally clipped to ``[-clip, clip]``. With ``update=False`` (or after
    :meth:`freeze`) the statistics stay as they are. The first reward normalises to 0.

    The statistics are mutable state: save them with :meth:`state_dict` and restore them with
    :meth:`load_state_dict` (e.g. across a training checkpoint).
    """

    def __init__(self, eps: float = 1e-8, clip: float | None = None, update: bool = True) -> None:
        self.eps = _finite(eps, "normalizer eps")
        if self.eps <= 0:
            raise ConfigError(f"normalizer eps must be > 0, got {self.eps}.")
        self.clip = None if clip is None else _finite(clip, "normalizer clip")
        if self.clip is not None and self.clip <= 0:
            raise ConfigError(f"normalizer clip must be > 0 (or None), got {self.clip}.")
        self.update = bool(update)
        self.count = 0
        self.mean = 0.0
        self.m2 = 0.0

    # -- statistics ------------------------------------------------------------------------
    @property
    def var(self) -> float:
        """Population variance of the rewards seen (0 before two rewards)."""
        return self.m2 / self.count if self.count > 0 else 0.0

    @property
    def std(self) -> float:
        return math.sqrt(self.var)

    def observe(self, reward: float) -> None:
        """Add ``reward`` to the statistics (Welford)."""
        r = float(reward)
        self.count += 1
        delta = r - self.mean
        self.mean += delta / self.count
        self.m2 += delta * (r - self.mean)

    def normalize(self, reward: float) -> float:
        """``reward`` normalised by the current statistics, without updating them."""
        z = (float(reward) - self.mean) / (self.std + self.eps)
        if self.clip is not None:
            z = min(max(z, -self.clip), self.clip)
        return z

    def __call__(self, reward: float) -> float:
        if self.update:
            self.observe(reward)
        return self.normalize(reward)

    def freeze(self) -> RunningNormalizer:
        """Stop updating the statistics (for evaluation); returns ``self``."""
        self.update = False
        return self

    def reset(self) -> None:
        """Forget every reward seen."""
        self.count, self.mean, self.m2 = 0, 0.0, 0.0

    # -- state -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"count": self.count, "mean": self.mean, "m2": self.m2}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if not isinstance(state, Mapping) or not {"count", "mean", "m2"} <= set(state):
            raise ConfigError(
                "a RunningNormalizer state is a dict with the keys 'count', 'mean' and 'm2' "
                "(as returned by state_dict())."
            )
        count = state["count"]
        if isinstance(count, bool) or not isinstance(count, numbers.Integral) or count < 0:
            raise ConfigError(f"state['count'] must be an int >= 0, got {count!r}.")
        mean = _finite(state["mean"], "state['mean']")
        m2 = _finite(state["m2"], "state['m2']")
        if m2 < 0:
            raise ConfigError(f"state['m2'] must be >= 0, got {m2}.")
        self.count, self.mean, self.m2 = int(count), mean, m2

    def __repr__(self) -> str:
        return (f"RunningNormalizer(eps={self.eps}, clip={self.clip}, update={self.update}; "
                f"count={self.count}, mean={self.mean:.4g}, std={self.std:.4g})")


class RewardProcessors:
    """Factories of reward processors, named as in CoMLRL (``RewardProcessors.scale(factor=10.0)``)."""

    @staticmethod
    def identity() -> Scale:
        return Scale(1.0)

    @staticmethod
    def scale(factor: float = 1.0) -> Scale:
        return Scale(factor)

    @staticmethod
    def shift(offset: float = 0.0) -> Shift:
        return Shift(offset)

    @staticmethod
    def clip(low: float | None = None, high: float | None = None) -> Clip:
        return Clip(low, high)

    @staticmethod
    def compose(*processors: Callable[[float], float]) -> Compose:
        return Compose(*processors)

    @staticmethod
    def running_normalizer(eps: float = 1e-8, clip: float | None = None, update: bool = True) -> RunningNormalizer:
        return RunningNormalizer(eps=eps, clip=clip, update=update)

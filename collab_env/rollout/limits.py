"""Global limits on policy calls: a token-bucket :class:`RateLimiter`, per-loop primitives
and :class:`LimitedPolicy`, the wrapper that puts a policy behind an engine's limits."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from collab_env.errors import ConfigError
from collab_env.policy import Policy, describe
from collab_env.types import Completion, Conversation

__all__ = ["RateLimiter", "PerLoop", "LimitedPolicy"]


class RateLimiter:
    """A token bucket: at most ``burst`` calls at once, refilled at ``rate`` calls per second.

    Each :meth:`acquire` reserves its tokens at once (without awaiting), so waiters are served
    in arrival order and the limiter needs no lock of any event loop: one limiter may serve
    several loops and threads. A waiter that is cancelled keeps its reservation (the limit errs
    on the safe side).

    Args:
        rate: Calls per second (> 0).
        burst: Bucket size: calls allowed at once after an idle spell (default: ``max(1, rate)``
            rounded down).
        clock: Monotonic clock in seconds (injectable for tests).
        sleep: Async sleep (injectable for tests).

    Raises:
        ConfigError: ``rate`` or ``burst`` is not positive.
    """

    def __init__(self, rate: float, burst: int | None = None, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep) -> None:
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not math.isfinite(rate) or rate <= 0:
            raise ConfigError(f"rate must be a finite number > 0 (calls per second), got {rate!r}.")
        burst = max(1, int(rate)) if burst is None else burst
        if isinstance(burst, bool) or not isinstance(burst, int) or burst < 1:
            raise ConfigError(f"burst must be an int >= 1, got {burst!r}.")
        self.rate = float(rate)
        self.burst = burst
        self._clock = clock
        self._sleep = sleep
        self._tokens = float(burst)
        self._last: float | None = None
        self._lock = threading.Lock()
        self.acquired = 0
        self.waited_seconds = 0.0

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_lock"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def reserve(self, n: int = 1) -> float:
        """Take ``n`` tokens now (possibly into debt); return the seconds to wait before use."""
        if n > self.burst:
            raise ConfigError(f"cannot take {n} tokens at once from a bucket of {self.burst}; raise burst.")
        with self._lock:
            now = self._clock()
            if self._last is not None:
                self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.rate)
            self._last = now
            self._tokens -= n
            self.acquired += n
            delay = 0.0 if self._tokens >= 0 else -self._tokens / self.rate
            self.waited_seconds += delay
            return delay

    async def acquire(self, n: int = 1) -> None:
        """Wait until ``n`` calls may start."""
        delay = self.reserve(n)
        if delay > 0:
            await self._sleep(delay)


class PerLoop:
    """One object per running event loop (asyncio primitives are bound to their loop)."""

    def __init__(self, factory: Callable[[], Any]) -> None:
        self._factory = factory
        self._objs: dict[asyncio.AbstractEventLoop, Any] = {}
        self._lock = threading.Lock()

    def get(self) -> Any:
        loop = asyncio.get_running_loop()
        obj = self._objs.get(loop)
        if obj is None:
            with self._lock:
                for old in [lp for lp in self._objs if lp.is_closed()]:
                    del self._objs[old]
                obj = self._objs.setdefault(loop, self._factory())
        return obj

    def __getstate__(self) -> dict[str, Any]:
        return {"_factory": self._factory}

    def __setstate__(self, state: dict[str, Any]) -> None:
        type(self).__init__(self, state["_factory"])


class LimitedPolicy:
    """A policy behind the engine's global limits; counts the calls that went through."""

    def __init__(self, policy: Policy, limiter: RateLimiter | None, semaphore: PerLoop | None,
                 stats: Any) -> None:
        self.policy = policy
        self.name = describe(policy)
        self._limiter = limiter
        self._sem = semaphore  # shared by every policy of the engine: the limit is global
        self._stats = stats
        #: Without limits, as the wrapped policy (see :func:`~collab_env.rollout.driver.act_for`);
        #: fixed at construction, since the driver asks for every move.
        self.answers_at_once: bool = (limiter is None and semaphore is None
                                      and getattr(policy, "answers_at_once", False) is True)

    async def act(self, observations: Sequence[Conversation], **sampling: Any) -> list[Completion]:
        if self._limiter is not None:
            await self._limiter.acquire(len(observations))
        if self._sem is None:
            return await self._counted(observations, sampling)
        async with self._sem.get():
            return await self._counted(observations, sampling)

    async def _counted(self, observations: Sequence[Conversation], sampling: dict[str, Any]) -> list[Completion]:
        st = self._stats
        st.policy_calls += 1
        st.calls_in_flight += 1
        st.max_calls_in_flight = max(st.max_calls_in_flight, st.calls_in_flight)
        try:
            return await self.policy.act(observations, **sampling)
        finally:
            st.calls_in_flight -= 1


# ---------------------------------------------------------------------------------------------
# The engine

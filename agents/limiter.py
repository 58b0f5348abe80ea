"""The concurrency limit of API backends: at most ``n`` requests in flight, across loops and threads.

:class:`ConcurrencyLimiter` is the limit itself; :func:`shared_limiter` hands out one per
``(api_base, model)`` for the whole process, so every :class:`~collab_env.agents.litellm.LiteLLMPolicy`
that talks to the same server and model shares it.
"""

from __future__ import annotations

import asyncio
import collections
import threading

from collab_env.errors import ConfigError

__all__ = ["ConcurrencyLimiter", "shared_limiter"]


class ConcurrencyLimiter:
    """At most ``max_concurrency`` requests in flight among every policy that shares it.

    Unlike :class:`asyncio.Semaphore`, one limiter works across event loops and threads (a
    sync facade may run a rollout on a fresh loop in a worker thread while another loop is
    busy): the count is guarded by a lock and a freed slot is handed to the longest waiter on
    whatever loop it waits. Waiters are served first come, first served.

    Args:
        max_concurrency: Largest number of requests in flight at once (>= 1).
    """

    def __init__(self, max_concurrency: int) -> None:
        if not isinstance(max_concurrency, int) or max_concurrency < 1:
            raise ConfigError(f"max_concurrency must be an int >= 1, got {max_concurrency!r}.")
        self.max_concurrency = max_concurrency
        #: Requests holding a slot now, and the most there have ever been at once.
        self.in_flight = 0
        self.peak = 0
        self._shared_key: tuple[str, str | None] | None = None  # set by shared_limiter()
        self._lock = threading.Lock()
        self._waiters: collections.deque[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = collections.deque()

    async def acquire(self) -> None:
        """Wait for a free slot and take it."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self.in_flight < self.max_concurrency and not self._waiters:
                self._take()
                return
            fut = loop.create_future()
            self._waiters.append((loop, fut))
        try:
            await fut
        except asyncio.CancelledError:
            with self._lock:
                try:
                    self._waiters.remove((loop, fut))
                    granted = False
                except ValueError:
                    # Already handed a slot: either it arrived (we hold it and give it back) or
                    # its hand-over is still queued on the loop and will find the future
                    # cancelled and release it (see _grant).
                    granted = fut.done() and not fut.cancelled()
            if granted:
                self.release()
            raise

    def release(self) -> None:
        """Give a slot back (to the longest waiter, if any)."""
        with self._lock:
            while self._waiters:
                loop, fut = self._waiters.popleft()
                if loop.is_closed() or fut.done():
                    continue
                # The slot moves to the waiter without ever being free, so nobody can jump
                # the queue between this release and the waiter waking up.
                loop.call_soon_threadsafe(self._grant, fut)
                return
            self.in_flight -= 1

    def _take(self) -> None:
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)

    def _grant(self, fut: asyncio.Future) -> None:
        if fut.done():  # the waiter was cancelled after the hand-over was queued
            self.release()
        else:
            fut.set_result(None)

    async def __aenter__(self) -> ConcurrencyLimiter:
        await self.acquire()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release()

    def __reduce__(self):
        # A lock does not pickle. A copy sent to another process limits that process only; a
        # shared limiter becomes that process's shared limiter for the same server and model.
        if self._shared_key is not None:
            return (shared_limiter, (*self._shared_key, self.max_concurrency))
        return (type(self), (self.max_concurrency,))

    def __repr__(self) -> str:
        return f"ConcurrencyLimiter(max_concurrency={self.max_concurrency}, in_flight={self.in_flight})"


_SHARED: dict[tuple[str | None, str], ConcurrencyLimiter] = {}
_SHARED_LOCK = threading.Lock()


def shared_limiter(model: str, api_base: str | None, max_concurrency: int) -> ConcurrencyLimiter:
    """The process-wide limiter for ``(api_base, model)``, created on first use.

    Every :class:`LiteLLMPolicy` built without ``limiter=`` uses it, so two policies on the same
    server and model (an assistant and a user simulator, say) share one limit. Asking for a
    different ``max_concurrency`` than the existing limiter has is an error: pass an explicit
    ``limiter=ConcurrencyLimiter(n)`` to give a policy a limit of its own.
    """
    key = (api_base.rstrip("/") if api_base else None, model)
    with _SHARED_LOCK:
        lim = _SHARED.get(key)
        if lim is None:
            lim = _SHARED[key] = ConcurrencyLimiter(max_concurrency)
            lim._shared_key = (model, api_base)
        elif lim.max_concurrency != max_concurrency:
            raise ConfigError(
                f"model {model!r} at {api_base or 'its default endpoint'} already has a shared "
                f"concurrency limit of {lim.max_concurrency}; got max_concurrency={max_concurrency}. "
                "Use the same value, or pass limiter=ConcurrencyLimiter(n) for a separate limit."
            )
        return lim

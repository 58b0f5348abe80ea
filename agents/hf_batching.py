"""The micro-batching queue of :class:`~collab_env.agents.hf.HFPolicy`: :class:`Batcher`.

Each observation of an ``act`` call becomes a request waiting on the current event loop. A
worker task groups waiting requests by sampling parameters and flushes a group when
``max_batch_size`` requests wait or ``max_wait_ms`` passed since its first one arrived
(``flush="timer"``), or, with ``flush="idle"``, once the event loop has settled
(``idle_passes`` iterations in a row brought no new request; ``max_wait_ms`` then caps the wait
while the loop stays busy). A batch runs in a worker thread (the policy's ``generate_batch``), so
the event loop keeps moving.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from collab_env.errors import PolicyError
from collab_env.policy import SamplingParams
from collab_env.types import Completion

__all__ = ["Batcher", "LoopBatchers", "BatchedGenerator", "FLUSH_MODES"]

#: When a waiting group that is not full is sent: ``"timer"`` (``max_wait_ms`` after its first
#: request) or ``"idle"`` (once the event loop has settled; ``max_wait_ms`` caps the wait).
FLUSH_MODES = ("timer", "idle")


class BatchedGenerator(Protocol):
    """What a :class:`Batcher` reads from its policy (:class:`~collab_env.agents.hf.HFPolicy`)."""

    name: str
    max_batch_size: int
    max_wait_ms: float
    flush: str
    idle_passes: int

    def generate_batch(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                       seeds: Sequence[int]) -> list[Completion]: ...


@dataclass
class _Request:
    """One observation waiting for a batch."""

    prompt_ids: list[int]
    params: SamplingParams
    seed: int
    future: asyncio.Future
    arrived: float = field(default_factory=time.monotonic)


def _group_key(params: SamplingParams) -> tuple:
    # The seed is per row (each row has its own generator), so it does not split batches.
    return (params.temperature, params.top_p, params.top_k, params.max_new_tokens, params.stop)


class Batcher:
    """The waiting requests and the worker task of one event loop.

    The worker runs only while requests wait: it is started by :meth:`submit` and returns
    once nothing is left, so an idle policy leaves no pending task behind on a loop that a
    sync wrapper stops running.
    """

    def __init__(self, policy: BatchedGenerator, loop: asyncio.AbstractEventLoop) -> None:
        self.policy = policy
        self.loop = loop
        self.groups: dict[tuple, list[_Request]] = {}  # insertion order = order of first arrival
        self.wakeup = asyncio.Event()
        self.task: asyncio.Task | None = None
        self.arrivals = 0  # requests submitted so far (flush="idle" watches it change)

    def submit(self, prompt: list[int], params: SamplingParams, seed: int) -> asyncio.Future:
        """Queue one tokenised prompt; the future receives its Completion (or PolicyError)."""
        fut = self.loop.create_future()
        self.groups.setdefault(_group_key(params), []).append(_Request(prompt, params, seed, fut))
        self.arrivals += 1
        self.wakeup.set()
        if self.task is None or self.task.done():
            self.task = self.loop.create_task(self._run(), name=f"{self.policy.name} batcher")
        return fut

    async def _run(self) -> None:
        max_size, max_wait = self.policy.max_batch_size, self.policy.max_wait_ms / 1000.0
        idle = self.policy.flush == "idle"
        quiet = 0  # flush="idle": loop iterations in a row without a new request
        try:
            while self.groups:
                now = time.monotonic()
                settled = idle and quiet >= self.policy.idle_passes
                ready = [k for k, reqs in self.groups.items()
                         if settled or len(reqs) >= max_size or now - reqs[0].arrived >= max_wait]
                if not ready and idle:  # let every runnable caller run once more, then look again
                    seen = self.arrivals
                    await asyncio.sleep(0)
                    quiet = quiet + 1 if self.arrivals == seen else 0
                    continue
                if not ready:  # sleep until the oldest request's deadline or a new request
                    oldest = min(reqs[0].arrived for reqs in self.groups.values())
                    self.wakeup.clear()
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(self.wakeup.wait(), max(0.0, oldest + max_wait - now))
                    continue
                key = ready[0]
                batch, rest = self.groups[key][:max_size], self.groups[key][max_size:]
                if rest:
                    self.groups[key] = rest  # keeps its arrival time, so it flushes right after
                else:
                    del self.groups[key]
                await self._generate(batch)
                quiet = 0  # the callers just answered ask again soon: the rest waits for them
        except Exception as exc:  # a bug here must not leave callers waiting forever
            error = PolicyError(f"{self.policy.name}: batching failed: {exc!r}")
            for reqs in self.groups.values():
                for r in reqs:
                    if not r.future.done():
                        r.future.set_exception(error)
            self.groups.clear()
            raise

    async def _generate(self, batch: list[_Request]) -> None:
        batch = [r for r in batch if not r.future.done()]  # callers that were cancelled
        if not batch:
            return
        try:
            results = await asyncio.to_thread(
                self.policy.generate_batch, [r.prompt_ids for r in batch], batch[0].params,
                [r.seed for r in batch],
            )
        except asyncio.CancelledError:
            for r in batch:
                r.future.cancel()
            raise
        except Exception as exc:
            error = PolicyError(f"{self.policy.name}: generate failed for a batch of {len(batch)}: {exc!r}")
            error.__cause__ = exc
            for r in batch:
                if not r.future.done():
                    r.future.set_exception(error)
            return
        for r, c in zip(batch, results, strict=True):
            if not r.future.done():
                r.future.set_result(c)


class LoopBatchers:
    """One :class:`Batcher` per event loop of a policy.

    One model may be used from several event loops (each in its own thread): each loop gets its
    own queue and worker task, and the policy serialises the ``generate`` calls.
    """

    def __init__(self, policy: BatchedGenerator) -> None:
        self.policy = policy
        self._batchers: dict[asyncio.AbstractEventLoop, Batcher] = {}
        self._lock = threading.Lock()

    def current(self) -> Batcher:
        """The queue of the running loop, created on first use and again when the loop changed
        (sync wrappers may call ``asyncio.run`` once per step, each with a new loop)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            for old in [lp for lp in self._batchers if lp.is_closed()]:
                del self._batchers[old]
            batcher = self._batchers.get(loop)
            if batcher is None:
                batcher = Batcher(self.policy, loop)
                self._batchers[loop] = batcher
            return batcher

"""Batching any policy: :class:`BatchedPolicy` merges the concurrent ``act`` calls of many
episodes (and of the forks of one: multiturn-aware futures, learner trees) into one call of the
wrapped policy, flushed at ``max_batch_size`` observations or ``max_wait_ms`` after the first
one arrived."""

from __future__ import annotations

import asyncio
import math
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

from collab_env.errors import ConfigError, PolicyError
from collab_env.policy import ScriptedPolicy, describe, resolve_policy
from collab_env.types import Completion, Conversation

__all__ = ["BatchStats", "BatchedPolicy", "batches_itself", "SeedMode"]

SeedMode = Literal["auto", "group", "rows"]

@dataclass
class BatchStats:
    """Counters of one :class:`BatchedPolicy` (``policy.stats``).

    Args:
        calls: ``act`` calls received (from episodes).
        observations: Observations in those calls.
        batches: ``act`` calls made on the wrapped policy.
        largest_batch: Most observations in one of them.
        failed_batches: Batches whose call raised or returned a wrong result (every caller in
            the batch got the error).
    """

    calls: int = 0
    observations: int = 0
    batches: int = 0
    largest_batch: int = 0
    failed_batches: int = 0

    @property
    def mean_batch_size(self) -> float:
        """Observations per call of the wrapped policy."""
        return self.observations / self.batches if self.batches else 0.0

    def to_dict(self) -> dict[str, float]:
        """The counters plus ``mean_batch_size``."""
        return {**asdict(self), "mean_batch_size": self.mean_batch_size}

    def merge(self, other: BatchStats) -> None:
        """Add ``other``'s counters (used to sum stats of several workers)."""
        for f in fields(self):
            if f.name == "largest_batch":
                self.largest_batch = max(self.largest_batch, other.largest_batch)
            else:
                setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


def _freeze(value: Any) -> Any:
    """A hashable stand-in for a sampling value (lists, dicts...)."""
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), _freeze(v)) for k, v in value.items()))
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return value


class _Call:
    """One ``act`` call waiting in a group: its observations, its row seed, its future."""

    __slots__ = ("observations", "seed", "future")

    def __init__(self, observations: Sequence[Conversation], seed: Any, future: asyncio.Future) -> None:
        self.observations, self.seed, self.future = observations, seed, future


class _Batch:
    """The calls sent together in one call of the wrapped policy, and the task sending them.

    It is also the done-callback of its callers' futures while the batch runs: when every one of
    them was cancelled (a stopped run), it cancels the batch, so requests in flight or still
    queued in the backend are abandoned. The batch removes itself from the futures before it
    resolves them, so a batch that answers schedules no callback per caller.
    """

    __slots__ = ("calls", "task", "cancelled")

    def __init__(self, calls: list[_Call]) -> None:
        self.calls = calls
        self.task: asyncio.Task | None = None
        self.cancelled = 0  # callers cancelled so far (counted: a stopped run cancels them one by one)

    def __call__(self, future: asyncio.Future) -> None:
        if future.cancelled():
            self.cancelled += 1
        if self.cancelled == len(self.calls) and self.task is not None and not self.task.done():
            self.task.cancel()


class _Group:
    """Calls waiting for a batch, all with the same sampling keywords."""

    __slots__ = ("kwargs", "pending", "size", "timer", "first_arrival")

    def __init__(self, kwargs: dict[str, Any]) -> None:
        self.kwargs = kwargs
        self.pending: deque[_Call] = deque()
        self.size = 0
        self.timer: asyncio.TimerHandle | None = None
        self.first_arrival = 0.0




class BatchedPolicy:
    """Merge concurrent ``act`` calls into batched calls of ``policy`` (works for any policy).

    Calls that arrive on the same event loop with the same sampling keywords wait together; the
    group is sent as **one** ``policy.act(observations, **sampling)`` call once it holds
    ``max_batch_size`` observations, or ``max_wait_ms`` after its first call arrived, whichever
    comes first. Each caller gets its own completions back, in order; if the batched call fails,
    every caller in it gets the error. Batches run concurrently with each other (a backend that
    cannot, serialises them itself). A single call larger than ``max_batch_size`` is never split.

    How seeds travel (the per-episode ``seed`` keyword differs between episodes):

    * ``seeds="group"``: the seed is part of the grouping key, so only calls with the same seed
      share a batch, which gets ``seed=s``. Exact for policies whose randomness depends on the
      seed and the observation only (scripted policies, API models), but seeded episodes then
      rarely share a batch.
    * ``seeds="rows"``: calls with different seeds share a batch, which gets ``seeds=[...]``
      (one per observation: the seed of the call it came from) and no ``seed``. Only for
      policies that accept it: they declare ``accepts_row_seeds = True`` and must treat row ``i``
      as they would ``act([observations[i]], seed=seeds[i])``.
    * ``seeds="auto"`` (default): ``"rows"`` when the policy declares ``accepts_row_seeds``,
      else ``"group"``.

    Unseeded calls (no ``seed`` keyword) always batch together. To batch seeded rollouts with a
    policy that takes no row seeds, run them with ``policy_seeds=False`` (episodes stay seeded).

    Args:
        policy: The wrapped policy (object or reference).
        max_batch_size: Most observations in one call of the wrapped policy.
        max_wait_ms: Longest time a call waits for others (0: only calls made in the same event
            loop iteration are merged).
        seeds: ``"auto"``, ``"group"`` or ``"rows"`` (see above).
        name: Name in tables and logs (default: the wrapped policy's).

    Raises:
        ConfigError: An invalid argument.
    """

    def __init__(
        self,
        policy: Any,
        *,
        max_batch_size: int = 64,
        max_wait_ms: float = 2.0,
        seeds: SeedMode = "auto",
        name: str | None = None,
    ) -> None:
        if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int) or max_batch_size < 1:
            raise ConfigError(f"max_batch_size must be an int >= 1, got {max_batch_size!r}.")
        if not isinstance(max_wait_ms, (int, float)) or not math.isfinite(max_wait_ms) or max_wait_ms < 0:
            raise ConfigError(f"max_wait_ms must be a finite number >= 0, got {max_wait_ms!r}.")
        if seeds not in ("auto", "group", "rows"):
            raise ConfigError(f"seeds must be 'auto', 'group' or 'rows', got {seeds!r}.")
        self.policy = resolve_policy(policy)
        if seeds == "auto":
            seeds = "rows" if getattr(self.policy, "accepts_row_seeds", False) else "group"
        self.seeds: str = seeds
        self.max_batch_size = max_batch_size
        self.max_wait_ms = float(max_wait_ms)
        self.name = name or describe(self.policy)
        self.stats = BatchStats()
        self._groups: dict[asyncio.AbstractEventLoop, dict[Any, _Group]] = {}
        self._running: set[asyncio.Task] = set()
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        # Waiting calls belong to a live event loop; a copy (pickled to a Ray worker) starts empty.
        state = dict(self.__dict__)
        state["_groups"], state["_running"], state["_lock"] = {}, set(), None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return (f"BatchedPolicy({self.policy!r}, max_batch_size={self.max_batch_size}, "
                f"max_wait_ms={self.max_wait_ms}, seeds={self.seeds!r})")

    async def act(self, observations: Sequence[Conversation], **sampling: Any) -> list[Completion]:
        """One completion per observation, computed in a batch shared with concurrent calls.

        Raises:
            PolicyError: The batched call raised or returned a wrong number of completions.
        """
        observations = list(observations)
        if not observations:
            return []
        self.stats.calls += 1
        self.stats.observations += len(observations)
        if "seeds" in sampling:  # the caller batches its own rows: pass it through untouched
            return await self._send(observations, sampling, [])
        seed = sampling.pop("seed", None) if self.seeds == "rows" else sampling.get("seed")
        try:
            key = tuple(sorted((k, _freeze(v)) for k, v in sampling.items()))
        except TypeError:  # keyword values that cannot be ordered: compare their reprs
            key = tuple(sorted((k, repr(v)) for k, v in sampling.items()))
        loop = asyncio.get_running_loop()
        groups = self._groups_of(loop)
        group = groups.get(key)
        if group is None:
            group = groups[key] = _Group(dict(sampling))
        fut = loop.create_future()
        if not group.pending:
            group.first_arrival = loop.time()
        group.pending.append(_Call(observations, seed, fut))
        group.size += len(observations)
        if group.size >= self.max_batch_size:
            self._dispatch(loop, group)
        elif group.timer is None:
            group.timer = loop.call_at(group.first_arrival + self.max_wait_ms / 1000.0,
                                       self._dispatch, loop, group)
        return await fut

    def _groups_of(self, loop: asyncio.AbstractEventLoop) -> dict[Any, _Group]:
        groups = self._groups.get(loop)
        if groups is None:
            with self._lock:
                for old in [lp for lp in self._groups if lp.is_closed()]:
                    del self._groups[old]
                groups = self._groups.setdefault(loop, {})
        return groups

    def _dispatch(self, loop: asyncio.AbstractEventLoop, group: _Group) -> None:
        """Send every full batch now; re-arm the timer for what is left."""
        if group.timer is not None:
            group.timer.cancel()
            group.timer = None
        if any(call.future.done() for call in group.pending):
            # Episodes cancelled while waiting (a stopped run): their requests are not sent.
            group.pending = deque(call for call in group.pending if not call.future.done())
            group.size = sum(len(call.observations) for call in group.pending)
        while group.pending and (group.size >= self.max_batch_size or group.timer is None):
            calls: list[_Call] = []
            n = 0
            while group.pending and (not calls or n + len(group.pending[0].observations) <= self.max_batch_size):
                call = group.pending.popleft()
                calls.append(call)
                n += len(call.observations)
            group.size -= n
            batch = _Batch(calls)
            task = batch.task = loop.create_task(self._run_batch(group.kwargs, batch))
            # The loop keeps only a weak reference to tasks: hold it until the batch is done.
            self._running.add(task)
            task.add_done_callback(self._running.discard)
            for call in calls:  # cancelled with its callers (see _Batch)
                call.future.add_done_callback(batch)
            if group.pending and group.size < self.max_batch_size:
                # The rest arrived later than the batch just sent: give it its own wait.
                group.first_arrival = loop.time()
                group.timer = loop.call_at(group.first_arrival + self.max_wait_ms / 1000.0,
                                           self._dispatch, loop, group)

    async def _run_batch(self, kwargs: dict[str, Any], batch: _Batch) -> None:
        calls = batch.calls
        observations = [o for call in calls for o in call.observations]
        sampling = dict(kwargs)
        if self.seeds == "rows" and any(call.seed is not None for call in calls):
            sampling["seeds"] = [call.seed for call in calls for _ in call.observations]
        try:
            out = await self._send(observations, sampling, calls)
        except BaseException as exc:
            for call in calls:
                call.future.remove_done_callback(batch)
            if not isinstance(exc, Exception):  # cancelled (the loop is shutting down): so are its callers
                for call in calls:
                    call.future.cancel()
                raise
            for call in calls:
                if not call.future.done():
                    call.future.set_exception(exc)
            return
        for call in calls:
            call.future.remove_done_callback(batch)
        i = 0
        for call in calls:
            k = len(call.observations)
            if not call.future.done():  # a cancelled episode no longer waits
                call.future.set_result(out[i:i + k])
            i += k

    async def _send(self, observations: list[Conversation], sampling: dict[str, Any],
                    batch: list[_Call]) -> list[Completion]:
        self.stats.batches += 1
        self.stats.largest_batch = max(self.stats.largest_batch, len(observations))
        try:
            out = await self.policy.act(observations, **sampling)
        except Exception:
            self.stats.failed_batches += 1
            raise
        if not isinstance(out, list) or len(out) != len(observations):
            self.stats.failed_batches += 1
            raise PolicyError(
                f"policy {self.name} returned {len(out) if isinstance(out, list) else type(out).__name__} "
                f"completion(s) for a batch of {len(observations)} observations; act() must return "
                "one Completion per observation, in order."
            )
        return out


def batches_itself(policy: Any) -> bool:
    """Whether wrapping ``policy`` in :class:`BatchedPolicy` would gain nothing (what
    ``batching="auto"`` asks before wrapping).

    A policy says so with a ``batches_concurrent_calls`` attribute (``True``: it merges
    concurrent calls itself, or batching cannot help it: vLLM's async engine policy batches
    continuously, an API policy such as ``LiteLLMPolicy`` sends one request per observation
    anyway). Without one, these count as ``True``: a :class:`BatchedPolicy`; policies with their
    own queue (``max_batch_size`` and ``max_wait_ms`` attributes: ``HFPolicy``, ``VLLMPolicy``);
    scripted policies (they answer at once, a wait would only add latency).
    """
    flag = getattr(policy, "batches_concurrent_calls", None)
    if flag is not None:
        return bool(flag)
    if isinstance(policy, BatchedPolicy):
        return True
    if hasattr(policy, "max_batch_size") and hasattr(policy, "max_wait_ms"):
        return True
    return isinstance(policy, ScriptedPolicy)

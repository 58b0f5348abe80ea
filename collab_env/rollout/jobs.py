"""Jobs and plumbing of the engines: job lists, env factories, iterating an async generator
from sync code, errors that cross process boundaries."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import pickle
import queue
import threading
from collections.abc import AsyncGenerator, Callable, Iterable, Iterator, Mapping, Sized
from typing import Any, cast

from collab_env.env import CollabEnv
from collab_env.errors import ConfigError, PolicyError
from collab_env.types import Episode

__all__ = ["Result", "normalize_jobs", "JobFeeder", "COMPOSER_KEYWORDS", "env_factory", "iterate_in_thread",
           "picklable_error", "collector_threshold"]

#: What a rollout yields: the job (as a dict) and its episode, or the exception that ended it.
Result = tuple[dict[str, Any], Episode | BaseException]


def normalize_jobs(jobs: int | Iterable[Any]) -> tuple[Iterator[dict[str, Any]], int | None]:
    """Turn ``jobs`` into an iterator of job dicts (lazily) and its length when known.

    Args:
        jobs: ``n`` (episodes ``{"episode_id": k, "seed": k}`` for ``k < n``), an iterable of
            seeds (``{"seed": s}``), or an iterable of mappings with any of ``"seed"``,
            ``"index"``, ``"options"`` plus whatever the caller wants back with the result.

    Returns:
        ``(iterator of dicts, total or None)``.

    Raises:
        ConfigError: ``jobs`` is negative or not one of the above (raised when the bad item is
            reached).
    """
    if isinstance(jobs, bool):
        raise ConfigError("jobs must be a count, seeds or job mappings, got a bool.")
    if isinstance(jobs, int):
        if jobs < 0:
            raise ConfigError(f"jobs must be >= 0, got {jobs}.")
        return ({"episode_id": k, "seed": k} for k in range(jobs)), jobs
    if isinstance(jobs, (str, bytes)) or not isinstance(jobs, Iterable):
        raise ConfigError(
            f"jobs must be a count, an iterable of seeds or of job mappings, got {type(jobs).__name__}."
        )
    total = len(cast(Sized, jobs)) if hasattr(jobs, "__len__") else None

    def gen() -> Iterator[dict[str, Any]]:
        for j in jobs:
            if isinstance(j, Mapping):
                job = dict(j)
            elif isinstance(j, int) and not isinstance(j, bool):
                job = {"seed": j}
            elif j is None:
                job = {"seed": None}
            else:
                raise ConfigError(f"a job is a seed (int) or a mapping with 'seed'/'index'/'options', got {j!r}.")
            if "options" in job and job["options"] is not None and not isinstance(job["options"], Mapping):
                raise ConfigError(f"job options must be a mapping, got {job['options']!r}.")
            yield job

    return gen(), total


class JobFeeder:
    """Hands an engine the next jobs to start, at most ``concurrency`` running at once.

    Both engines (:class:`~collab_env.rollout.RolloutEngine` on one event loop,
    :class:`~collab_env.rollout.RayRolloutEngine` on Ray workers) start episodes the same way:
    take jobs in order while fewer than ``concurrency`` run and no fatal error has stopped the
    run, and count each start in the stats (``submitted``, ``in_flight``, ``max_in_flight``).

    Args:
        jobs: The job iterator (from :func:`normalize_jobs`).
        concurrency: Most jobs running at once.
        stats: The engine's stats object (its three counters above are updated).
    """

    def __init__(self, jobs: Iterator[dict[str, Any]], concurrency: int, stats: Any) -> None:
        self.jobs, self.concurrency, self.stats = jobs, concurrency, stats
        self.exhausted = False

    def take(self, running: Callable[[], int], stopped: Callable[[], bool]) -> Iterator[dict[str, Any]]:
        """The jobs to start now, one at a time: each is counted as started when it is yielded,
        and ``running()`` and ``stopped()`` are asked again before the next one (so the caller
        starts the yielded job, and may yield to its event loop, before asking for more)."""
        while not self.exhausted and not stopped() and running() < self.concurrency:
            try:
                job = next(self.jobs)
            except StopIteration:
                self.exhausted = True
                return
            st = self.stats
            st.submitted += 1
            st.in_flight += 1
            st.max_in_flight = max(st.max_in_flight, st.in_flight)
            yield job


#: The keywords of :func:`collab_env.make` that compose an env (a reward wrapper, a view) rather
#: than configure the registered env; an engine given an env id builds the base env and refuses
#: them (a test keeps this tuple in step with the composer's signature).
COMPOSER_KEYWORDS = ("reward", "reward_kwargs", "view", "policies")


def env_factory(env: Any, env_kwargs: Mapping[str, Any] | None) -> Callable[[], CollabEnv]:
    """A zero-argument factory of fresh envs from an env id or a factory (returned as it is); an
    env object is refused, since every episode needs its own.

    An env id builds the registered env itself (:func:`collab_env.registry.make_base_env`, with
    ``env_kwargs`` merged over the spec's kwargs): the engine sits below the rewards and the
    composer, so a composed env (``reward=``...) comes from the caller's factory, e.g.
    ``lambda: collab_env.make(id, reward="mr")``.
    """
    if isinstance(env, str):
        from collab_env.registry import make_base_env, spec

        spec(env)  # unknown id: fail now, with the closest ids
        kwargs = dict(env_kwargs or {})
        composed = sorted(set(kwargs) & set(COMPOSER_KEYWORDS))
        if composed:
            raise ConfigError(
                f"env_kwargs {composed} compose the env (collab_env.make's reward wrapper or view); the "
                f"rollout engine builds an id's base env only. Pass a factory instead, e.g. "
                f"lambda: collab_env.make({env!r}, {', '.join(f'{k}=...' for k in composed)})."
            )
        return lambda: make_base_env(env, **kwargs)
    if isinstance(env, CollabEnv):
        raise ConfigError(
            "pass an env id or a factory (e.g. lambda: collab_env.make(...)), not an env object: "
            "every episode in flight needs its own env."
        )
    if callable(env):
        if env_kwargs:
            raise ConfigError("env_kwargs only applies with an env id; bind them in your factory instead.")
        return env
    raise ConfigError(f"env must be a registered env id or a factory returning a CollabEnv, got {env!r}.")


def iterate_in_thread(agen_fn: Callable[[Any], AsyncGenerator[Any, None]], arg: Any) -> Iterator[Any]:
    """Iterate an async generator that runs on its own loop in a background thread."""
    q: queue.Queue = queue.Queue()
    done = object()
    stop = threading.Event()
    state: dict[str, Any] = {}

    async def pump() -> None:
        state["task"] = asyncio.current_task()
        state["loop"] = asyncio.get_running_loop()
        agen = agen_fn(arg)
        try:
            async for item in agen:
                q.put(("item", item))
                if stop.is_set():
                    break
        except BaseException as exc:  # handed to the consumer thread, which raises it
            q.put(("error", exc))
        finally:
            await agen.aclose()
            q.put(("end", done))

    def main() -> None:
        try:
            asyncio.run(pump())
        except BaseException:  # cancelled by close(): the consumer already left
            q.put(("end", done))

    def gen() -> Iterator[Any]:
        # Started on the first next(), so an iterator that is never consumed runs nothing.
        thread = threading.Thread(target=main, name="collab-env-rollout", daemon=True)
        thread.start()
        try:
            while True:
                kind, value = q.get()
                if kind == "item":
                    yield value
                elif kind == "error":
                    raise value
                else:
                    return
        finally:
            stop.set()
            loop, task = state.get("loop"), state.get("task")
            if thread.is_alive() and loop is not None and task is not None:
                try:
                    loop.call_soon_threadsafe(task.cancel)
                except RuntimeError:  # the loop already closed
                    pass
            thread.join()

    return gen()



def picklable_error(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling (to cross a process boundary), else a PolicyError with its
    text (used by the Ray backend)."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return PolicyError(f"{type(exc).__name__}: {exc}")


_GC_LOCK = threading.Lock()
_GC_RUNS = 0  # runs in flight that raised the threshold
_GC_SAVED: tuple[int, ...] | None = None  # the thresholds before the first of them
_GC_PROMOTED = 0  # objects moved to the oldest generation since the last full collection
_GC_FULL_SEEN = 0  # the number of full collections when _GC_PROMOTED was last counted from 0


def _promote_young(limit: int) -> None:
    """Move the young objects to the oldest generation, unscanned (``gc.freeze`` then
    ``gc.unfreeze``), unless more than ``limit`` objects moved this way would then be waiting
    for a full collection, or objects are frozen (unfreezing would undo someone's freeze).

    When a run ends, its young objects are mostly the episodes its caller keeps (at 4,096
    episodes of ``length-ratio``, ~520,000 objects): restoring the threshold would have the
    next allocation scan them all at once, inside the run (0.2 s, a tenth of the 2 s of latency
    it hides), and the collections after it scan them again on their way to the oldest
    generation, where long-lived objects end anyway. The price: cyclic garbage the run left
    waits for the next full collection (at most ``limit`` objects moved since the last one)."""
    global _GC_PROMOTED, _GC_FULL_SEEN
    full = gc.get_stats()[-1]["collections"]
    if full != _GC_FULL_SEEN:  # a full collection examined what was moved before
        _GC_FULL_SEEN, _GC_PROMOTED = full, 0
    young = gc.get_count()[0]
    if gc.get_freeze_count() or _GC_PROMOTED + young > limit:
        return
    gc.freeze()
    gc.unfreeze()
    _GC_PROMOTED += young


@contextlib.contextmanager
def collector_threshold(threshold: int | None) -> Iterator[None]:
    """Raise the garbage collector's first threshold to at least ``threshold`` while any run is
    in flight (``RolloutConfig.gc_threshold``; both engines: the Ray driver unpickles every
    episode its workers return); the last run to end moves the young objects to the oldest
    generation (:func:`_promote_young`, at most ``threshold`` of them waiting at once) and
    restores the thresholds, unless someone else changed them meanwhile."""
    global _GC_RUNS, _GC_SAVED
    if threshold is None:
        yield
        return
    with _GC_LOCK:
        if _GC_RUNS == 0:
            saved = gc.get_threshold()
            if 0 < saved[0] < threshold:  # 0: the collector is off by threshold; leave it so
                gc.set_threshold(threshold, *saved[1:])
                _GC_SAVED = saved
        _GC_RUNS += 1
    try:
        yield
    finally:
        with _GC_LOCK:
            _GC_RUNS -= 1
            if _GC_RUNS == 0 and _GC_SAVED is not None:
                if gc.get_threshold()[0] == threshold:
                    _promote_young(threshold)
                    gc.set_threshold(*_GC_SAVED)
                _GC_SAVED = None

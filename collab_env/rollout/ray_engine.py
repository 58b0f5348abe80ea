"""The Ray backend of the rollout engine: episodes spread over Ray workers.

:class:`RayRolloutEngine` has the surface of :class:`~collab_env.rollout.RolloutEngine`
(``stream``, ``astream``, ``run``, ``stats``) for users who outgrow one machine. It starts
``num_workers`` Ray actors; each holds its own env factory, its own policies and a local
:class:`~collab_env.rollout.RolloutEngine` running on the actor's event loop, so episodes on one
worker advance independently and share batches exactly as they do locally. The driver hands
jobs to the least-loaded worker in **chunks** (``chunk_size`` jobs per remote call, which the
worker's engine runs together), keeps at most ``concurrency`` episodes in flight over all
workers, and yields ``(job, episode or exception)`` as each chunk comes back. One remote call
per episode cost the driver more CPU than the episode itself at thousands of episodes; a chunk
pays it once for many.

What travels to the workers
    The env id (or a picklable factory), the policies and the settings are pickled once per
    worker. Pass heavy policies as **references** (``"hf:./my-model"``, ``"module:Class"``, a
    class): each worker then loads its own model where it runs, instead of shipping weights
    from the driver.

Global limits
    ``concurrency`` is global (the driver enforces it). ``max_calls_per_second`` and
    ``max_concurrent_calls`` are split evenly between the workers (each enforces its share).

Ray is imported only when an engine is created; without it,
:class:`~collab_env.errors.MissingDependencyError` names the extra to install
(``pip install 'collab_env[ray]'``). A Ray instance already started with ``ray.init(...)``
(a cluster address, ``num_cpus``...) is used as it is; otherwise Ray starts a local one.
"""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import AsyncGenerator, Iterable, Iterator, Mapping
from typing import Any

from collab_env.errors import ConfigError, FatalPolicyError, require
from collab_env.rollout.config import RolloutConfig, RolloutStats
from collab_env.rollout.driver import STOPPED_NOTE, fatal_error, note_stopped
from collab_env.rollout.jobs import (
    JobFeeder,
    Result,
    collector_threshold,
    env_factory,
    iterate_in_thread,
    normalize_jobs,
    picklable_error,
)
from collab_env.types import Episode

__all__ = ["RayRolloutEngine"]


def _ray() -> Any:
    return require("ray", "ray", "The Ray rollout backend (RayRolloutEngine, rollout(backend='ray'))")


class _Worker:
    """A Ray actor running a local RolloutEngine on its event loop (a chunk of jobs per call)."""

    def __init__(self, env: Any, policies: Mapping[str, Any], env_kwargs: Mapping[str, Any] | None,
                 settings: dict[str, Any]) -> None:
        from collab_env.rollout.engine import RolloutEngine

        self.engine = RolloutEngine(env, policies, env_kwargs=env_kwargs, **settings)

    async def run(self, jobs: list[dict[str, Any]]) -> tuple[list[Result], dict[str, int], BaseException | None]:
        """Run ``jobs`` on the local engine (its ``astream``: the same ramp, batching and
        collector setting as in one process); return the results, the chunk's counts
        (``finished``, ``failed``, ``cancelled``) and the rejection that stopped it, if one did."""
        out: list[Result] = []
        fatal: BaseException | None = None
        try:
            async for job, outcome in self.engine.astream(jobs):
                out.append((job, picklable_error(outcome) if isinstance(outcome, BaseException) else outcome))
        except FatalPolicyError as exc:
            # The driver notes what the whole run did; this chunk's own note would contradict it.
            notes = [n for n in getattr(exc, "__notes__", ()) if not n.startswith(STOPPED_NOTE)]
            if hasattr(exc, "__notes__"):
                exc.__notes__ = notes
            fatal = picklable_error(exc)
        # Counted here, not from the engine's stats, which other chunks running meanwhile change.
        # After a rejection, the jobs not returned are the rejected one (failed) and those it
        # cancelled or kept from starting.
        failed = sum(isinstance(outcome, BaseException) for _, outcome in out) + (fatal is not None)
        counts = {"finished": len(out) - failed + (fatal is not None), "failed": failed,
                  "cancelled": len(jobs) - len(out) - (fatal is not None)}
        return out, counts, fatal

    def stats(self) -> RolloutStats:
        return self.engine.stats

    def where(self) -> dict[str, Any]:
        import ray

        return {"pid": os.getpid(), "node": ray.get_runtime_context().get_node_id()}


class RayRolloutEngine:
    """Run episodes on Ray workers; stream ``(job, episode or exception)`` as they finish.

    >>> import ray; ray.init(num_cpus=4)
    >>> engine = RayRolloutEngine("hidden-facts", {"assistant": "hf:./my-model"}, num_workers=4)
    >>> for job, ep in engine.stream(1024):
    ...     ...
    >>> engine.shutdown()

    Args:
        env: A registered env id, or a picklable factory returning a fresh
            :class:`~collab_env.env.CollabEnv`.
        policies: Player -> policy object or reference (see the module docstring); players left
            out use the env spec's default policies.
        config: A :class:`~collab_env.rollout.RolloutConfig`; ``**settings`` override its fields.
            ``concurrency`` is the total over all workers.
        env_kwargs: Keywords of the env, merged over the spec's kwargs (env ids only; see
            :class:`~collab_env.rollout.RolloutEngine`).
        num_workers: Ray actors to start.
        chunk_size: Jobs per remote call (a worker returns a chunk's results together, when its
            last episode ends). ``None``: ``concurrency / (4 x num_workers)``, rounded up, so each
            worker runs about four chunks at once and a new one starts as soon as one ends.
        worker_options: Extra ``ray.remote`` options of each actor (``num_cpus``, ``num_gpus``,
            ``resources``, ``runtime_env``...); default ``{"num_cpus": 1}``.
        **settings: :class:`~collab_env.rollout.RolloutConfig` fields.

    Raises:
        MissingDependencyError: Ray is not installed.
        ConfigError: An invalid argument or setting.
    """

    def __init__(self, env: Any, policies: Mapping[str, Any], config: RolloutConfig | None = None, *,
                 env_kwargs: Mapping[str, Any] | None = None, num_workers: int = 2,
                 chunk_size: int | None = None, worker_options: Mapping[str, Any] | None = None,
                 **settings: Any) -> None:
        self._raym = _ray()
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise ConfigError(f"num_workers must be an int >= 1, got {num_workers!r}.")
        if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, int)
                                       or chunk_size < 1):
            raise ConfigError(f"chunk_size must be an int >= 1 or None, got {chunk_size!r}.")
        if not isinstance(policies, Mapping):
            raise ConfigError(f"policies maps player -> policy, got {type(policies).__name__}.")
        self.config = RolloutConfig.from_kwargs(config, **settings)
        env_factory(env, env_kwargs)  # validate now (unknown id, env object...), not on a worker
        self.env = env
        self.env_kwargs = dict(env_kwargs or {})
        self.policies = dict(policies)
        self.num_workers = num_workers
        self.chunk_size = chunk_size or max(1, math.ceil(self.config.concurrency / (4 * num_workers)))
        self.worker_options = {"num_cpus": 1, **dict(worker_options or {})}
        self.stats = RolloutStats()
        self._workers: list[Any] = []
        self._names: list[str] = []

    def __repr__(self) -> str:
        return (f"RayRolloutEngine({self.env!r}, num_workers={self.num_workers}, "
                f"concurrency={self.config.concurrency}, chunk_size={self.chunk_size})")

    # -- workers ---------------------------------------------------------------------------
    def _worker_settings(self) -> dict[str, Any]:
        c, n = self.config, self.num_workers
        settings = {f: getattr(c, f) for f in c.__dataclass_fields__}
        settings["progress"] = False
        settings["concurrency"] = max(1, math.ceil(c.concurrency / n))
        if c.max_calls_per_second is not None:
            settings["max_calls_per_second"] = c.max_calls_per_second / n
            if c.burst is not None:
                settings["burst"] = max(1, c.burst // n)
        if c.max_concurrent_calls is not None:
            settings["max_concurrent_calls"] = max(1, math.ceil(c.max_concurrent_calls / n))
        return settings

    def start(self) -> None:
        """Start the workers (done by the first run; call it to pay the start-up cost early).

        Raises:
            ConfigError: A worker could not build the env or the policies (the message has the
                worker's error).
        """
        if self._workers:
            return
        ray = self._raym
        settings = self._worker_settings()
        actor_cls = ray.remote(_Worker).options(max_concurrency=settings["concurrency"], **self.worker_options)
        workers = [actor_cls.remote(self.env, self.policies, self.env_kwargs, settings)
                   for _ in range(self.num_workers)]
        try:
            # Fails here, once, when a worker cannot build the env or a policy.
            ray.get([w.where.remote() for w in workers])
        except Exception as exc:
            for w in workers:
                ray.kill(w)
            cause = getattr(exc, "cause", None) or exc
            raise ConfigError(f"a Ray rollout worker failed to start: {cause}") from exc
        self._workers = workers
        self._names = [f"worker-{i}" for i in range(len(workers))]

    def shutdown(self) -> None:
        """Stop the workers (the engine starts new ones if it runs again)."""
        for w in self._workers:
            self._raym.kill(w)
        self._workers, self._names = [], []

    def __enter__(self) -> RayRolloutEngine:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    # -- running ---------------------------------------------------------------------------
    async def astream(self, jobs: int | Iterable[Any]) -> AsyncGenerator[Result, None]:
        """Run ``jobs`` on the workers; yield ``(job, episode or exception)`` in order of
        completion. A worker that dies fails the episodes it was running (with Ray's error).
        Closing the iterator early cancels the episodes still running.

        Args:
            jobs: See :func:`~collab_env.rollout.normalize_jobs`.

        Raises:
            FatalPolicyError: An episode ended with a request its provider rejected; as in
                :meth:`~collab_env.rollout.RolloutEngine.astream`, no job starts after it, the
                episodes in flight are cancelled (``stats.cancelled``), the other results
                already done are yielded, then it is raised once.
        """
        ray = self._raym
        self.start()
        it, total = normalize_jobs(jobs)
        st = self.stats
        from collab_env._progress import progress_bar

        desc = self.config.desc or f"rollout[ray] {self.env if isinstance(self.env, str) else ''}".strip()
        bar = progress_bar(total, desc, show=self.config.progress)
        load = [0] * len(self._workers)  # jobs in flight per worker
        pending: dict[asyncio.Future, tuple[Any, int, list[dict[str, Any]]]] = {}
        feeder = JobFeeder(it, self.config.concurrency, st)
        loop = asyncio.get_running_loop()
        t0 = loop.time()

        fatal: list[FatalPolicyError] = []
        # Every episode a worker returns is unpickled here and kept by the caller: with the
        # collector's default threshold, its collections rescan them all again and again
        # (unpickling 8,192 kept episodes measured 224 us each against 92 us with it raised).
        collector = collector_threshold(self.config.gc_threshold)
        collector.__enter__()

        def send(chunk: list[dict[str, Any]]) -> None:
            i = min(range(len(load)), key=load.__getitem__)
            ref = self._workers[i].run.remote(chunk)
            pending[asyncio.wrap_future(ref.future())] = (ref, i, chunk)
            load[i] += len(chunk)

        def fill() -> None:
            chunk: list[dict[str, Any]] = []
            for job in feeder.take(lambda: sum(load) + len(chunk), lambda: bool(fatal)):
                chunk.append(job)
                if len(chunk) == self.chunk_size:
                    send(chunk.copy())
                    chunk.clear()
            if chunk:
                send(chunk)

        try:
            fill()
            while pending:
                done, _ = await asyncio.wait(list(pending), return_when=asyncio.FIRST_COMPLETED)
                finished: list[Result] = []
                for fut in done:
                    ref, i, chunk = pending.pop(fut)
                    load[i] -= len(chunk)
                    st.in_flight -= len(chunk)
                    try:
                        results, counts, rejected = fut.result()
                    except Exception as exc:  # the worker died or Ray failed: its episodes failed
                        results, counts, rejected = [(job, exc) for job in chunk], {"failed": len(chunk)}, None
                    name = self._names[i]
                    st.per_worker[name] = st.per_worker.get(name, 0) + len(chunk)
                    st.finished += counts.get("finished", 0)
                    st.failed += counts.get("failed", 0)
                    st.cancelled += counts.get("cancelled", 0)
                    finished += results
                    if bar is not None:
                        bar.update(len(chunk) - counts.get("cancelled", 0))
                        if st.failed:
                            bar.set_postfix(failed=st.failed, refresh=False)
                    if not fatal and (err := fatal_error(rejected)) is not None:
                        fatal.append(err)
                fill()
                if fatal and pending:  # every later request would be rejected too
                    for ref, _, chunk in pending.values():
                        ray.cancel(ref)
                        st.cancelled += len(chunk)
                        st.in_flight -= len(chunk)
                    pending.clear()
                for job, outcome in finished:
                    yield job, outcome
                if fatal:
                    raise note_stopped(fatal[0], f"{st.submitted} episode(s) started, {st.finished} finished, "
                                                 f"{st.failed} failed, {st.cancelled} cancelled; no other job started.")
        finally:
            for ref, _, chunk in pending.values():
                ray.cancel(ref)
                st.in_flight -= len(chunk)
            st.wall_seconds += loop.time() - t0
            collector.__exit__(None, None, None)
            if bar is not None:
                bar.close()
            await self._collect_worker_stats()

    async def _collect_worker_stats(self) -> None:
        """Fold the workers' batch and call counters into :attr:`stats` (cumulative)."""
        if not self._workers:
            return
        try:
            refs = [w.stats.remote() for w in self._workers]
            per = await asyncio.gather(*(asyncio.wrap_future(r.future()) for r in refs))
        except Exception:  # a dead worker has no stats to give; the episodes were counted
            return
        self._worker_stats = per
        from collab_env.rollout.batching import BatchStats

        self.stats.batches = {}
        self.stats.policy_calls = 0
        self.stats.max_calls_in_flight = 0
        for ws in per:
            self.stats.policy_calls += ws.policy_calls
            self.stats.max_calls_in_flight = max(self.stats.max_calls_in_flight, ws.max_calls_in_flight)
            for name, b in ws.batches.items():
                self.stats.batches.setdefault(name, BatchStats()).merge(b)

    def stream(self, jobs: int | Iterable[Any]) -> Iterator[Result]:
        """Synchronous :meth:`astream` (an event loop in a background thread feeds it)."""
        return iterate_in_thread(self.astream, jobs)

    def run(self, jobs: int | Iterable[Any], *, raise_on_error: bool = False) -> list[Episode | BaseException]:
        """Run every job; return outcomes **in job order**.

        Args:
            jobs: See :func:`~collab_env.rollout.normalize_jobs`.
            raise_on_error: Raise the first failure instead of returning it in the list.
        """
        it, _ = normalize_jobs(jobs)
        numbered = ({**job, "_rollout_order": k} for k, job in enumerate(it))
        out: dict[int, Episode | BaseException] = {}
        for job, outcome in self.stream(numbered):
            out[job.pop("_rollout_order")] = outcome
        results = [out[k] for k in sorted(out)]
        if raise_on_error:
            for r in results:
                if isinstance(r, BaseException):
                    raise r
        return results

    def where(self) -> list[dict[str, Any]]:
        """``{"pid", "node"}`` of each worker (starts them if needed)."""
        self.start()
        return self._raym.get([w.where.remote() for w in self._workers])

"""The rollout engine: many episodes at once on one event loop.

Every episode is its own task and advances on its own (no lockstep: an episode waits only for its
own policy calls); policy calls are batched across episodes, one
:class:`~collab_env.rollout.BatchedPolicy` per distinct policy; ``concurrency`` bounds the
episodes in flight, ``max_calls_per_second`` and ``max_concurrent_calls`` bound the policy calls
of all episodes together; results stream out as ``(job, episode)`` pairs in order of completion,
a failed episode as ``(job, exception)`` (counted, never swallowed); a
:class:`~collab_env.errors.FatalPolicyError` stops the whole run. Each episode is played by the
one driver, :func:`~collab_env.rollout.driver.arun_episode`.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import AsyncGenerator, Callable, Iterable, Iterator, Mapping
from typing import Any

from collab_env.env import CollabEnv
from collab_env.errors import ConfigError, FatalPolicyError
from collab_env.policy import Policy, policies_for, resolve_policy
from collab_env.rollout.batching import BatchedPolicy, batches_itself
from collab_env.rollout.config import RolloutConfig, RolloutStats
from collab_env.rollout.driver import arun_episode, fatal_error, note_stopped
from collab_env.rollout.jobs import (
    JobFeeder,
    Result,
    collector_threshold,
    env_factory,
    iterate_in_thread,
    normalize_jobs,
)
from collab_env.rollout.limits import LimitedPolicy, PerLoop, RateLimiter
from collab_env.types import Episode

__all__ = ["RolloutEngine"]

#: Episodes started per pass of the event loop while a run ramps up (see ``astream``'s ``fill``).
_RAMP_GROUP = 16

def _players_and_spec(env: Any, factory: Callable[[], CollabEnv]) -> tuple[list[str], Any]:
    if isinstance(env, str):
        from collab_env.registry import spec

        s = spec(env)
        return list(s.players), s
    probe = factory()
    try:
        # A CollabEnv or a wrapper of one (make(id, reward="conversation") returns a wrapper).
        if not isinstance(getattr(probe, "unwrapped", probe), CollabEnv):
            raise ConfigError(f"the env factory must return a CollabEnv (or a wrapper of one), got "
                              f"{type(probe).__name__}.")
        return list(probe.possible_agents), probe.spec
    finally:
        close = getattr(probe, "close", None)
        if close is not None:
            close()


class RolloutEngine:
    """Run many episodes at once; stream ``(job, episode)`` pairs as they finish.

    >>> engine = RolloutEngine("hidden-facts", {"assistant": "ask-then-answer"}, concurrency=32)
    >>> for job, ep in engine.stream(256):          # or: async for ... in engine.astream(256)
    ...     if isinstance(ep, BaseException):
    ...         print("failed", job, ep)
    >>> engine.stats.mean_batch_size

    Args:
        env: A registered env id (its base env, built with
            ``collab_env.registry.make_base_env(env, **env_kwargs)``) or a factory returning a
            fresh :class:`~collab_env.env.CollabEnv` (one per episode); for a reward wrapper pass
            a factory, e.g. ``lambda: collab_env.make(env, reward="mr")``.
        policies: Player -> policy object or reference. With an env id or a factory whose envs
            have a spec, players left out use the spec's default policies. References are
            resolved once; players naming the same reference share one policy (and its batches).
        config: A :class:`RolloutConfig`; ``**settings`` override its fields.
        env_kwargs: Keywords of the env, merged over the spec's kwargs (env ids only; not
            ``collab_env.make``'s composing ones, :data:`~collab_env.rollout.jobs.COMPOSER_KEYWORDS`).
        **settings: :class:`RolloutConfig` fields (``concurrency=...``, ``max_batch_size=...``).

    Raises:
        ConfigError: Unknown env id, unknown setting, missing policy, invalid value.
    """

    def __init__(self, env: Any, policies: Mapping[str, Any], config: RolloutConfig | None = None, *,
                 env_kwargs: Mapping[str, Any] | None = None, **settings: Any) -> None:
        self.config = RolloutConfig.from_kwargs(config, **settings)
        self.env_id = env if isinstance(env, str) else None
        self.make_env = env_factory(env, env_kwargs)
        players, env_spec = _players_and_spec(env, self.make_env)
        if not isinstance(policies, Mapping):
            raise ConfigError(f"policies maps player -> policy, got {type(policies).__name__}.")
        unknown = [p for p in policies if p not in players]
        if unknown:
            raise ConfigError(f"policies for unknown player(s) {unknown}; players: {players}.")
        # A player given None keeps its default here (an engine never runs a player without one).
        chosen = policies_for(env_spec, {p: v for p, v in policies.items() if v is not None})
        missing = [p for p in players if p not in chosen]
        if missing:
            raise ConfigError(f"no policy for player(s) {missing}; pass policies={{...}} for them "
                              f"(players: {players}).")
        self.stats = RolloutStats()
        limiter = None
        if self.config.max_calls_per_second is not None:
            limiter = RateLimiter(self.config.max_calls_per_second, self.config.burst,
                                  clock=self.config.clock, sleep=self.config.sleep)
        self.rate_limiter = limiter
        max_calls = self.config.max_concurrent_calls
        semaphore = PerLoop(lambda: asyncio.Semaphore(max_calls)) if max_calls is not None else None
        #: Player -> the policy episodes call (limits and batching applied).
        self.policies: dict[str, Policy] = {}
        #: Player -> the BatchedPolicy wrapping its policy (players without batching are absent).
        self.batched: dict[str, BatchedPolicy] = {}
        by_ref: dict[Any, Policy] = {}
        wrapped: dict[int, Policy] = {}
        for p in players:
            ref = chosen[p]
            key = ref if isinstance(ref, (str, type)) else ("object", id(ref))
            if key not in by_ref:
                by_ref[key] = resolve_policy(ref)
            base = by_ref[key]
            if id(base) not in wrapped:
                pol: Policy = base
                want = self.config.batching
                if want is True or (want == "auto" and not batches_itself(base)):
                    if not isinstance(base, BatchedPolicy):
                        pol = BatchedPolicy(base, max_batch_size=self.config.max_batch_size,
                                            max_wait_ms=self.config.max_wait_ms, seeds=self.config.seeds)
                if isinstance(pol, BatchedPolicy):
                    self.stats.batches[self._unique_name(pol.name)] = pol.stats
                # Always behind LimitedPolicy: it also counts the calls and the calls in flight.
                pol = LimitedPolicy(pol, limiter, semaphore, self.stats)
                wrapped[id(base)] = pol
            self.policies[p] = wrapped[id(base)]
            inner = self.policies[p].policy  # type: ignore[attr-defined]
            if isinstance(inner, BatchedPolicy):
                self.batched[p] = inner
        self.players = players
        self._free_envs: list[CollabEnv] = []

    def _unique_name(self, name: str) -> str:
        if name not in self.stats.batches:
            return name
        for k in itertools.count(2):
            if f"{name}#{k}" not in self.stats.batches:
                return f"{name}#{k}"
        raise AssertionError("unreachable")

    def __repr__(self) -> str:
        src = self.env_id or getattr(self.make_env, "__name__", "factory")
        return f"RolloutEngine({src!r}, players={self.players}, concurrency={self.config.concurrency})"

    # -- one job -------------------------------------------------------------------------
    async def arun_job(self, job: Mapping[str, Any]) -> Result:
        """Run one job (outside the concurrency bound); return ``(job, episode or exception)``.

        Exceptions of the env or a policy are returned, not raised; cancellation propagates.
        """
        job = dict(job)
        env = None
        ok = False
        try:
            env = self._free_envs.pop() if self._free_envs else self.make_env()
            coro = arun_episode(env, self.policies, seed=job.get("seed"), index=job.get("index"),
                                options=job.get("options"), sampling=self.config.sampling,
                                policy_seeds=self.config.policy_seeds)
            if self.config.episode_timeout_s is not None:
                try:
                    ep = await asyncio.wait_for(coro, self.config.episode_timeout_s)
                except asyncio.TimeoutError as exc:
                    raise TimeoutError(
                        f"episode {job} ran longer than episode_timeout_s={self.config.episode_timeout_s}s."
                    ) from exc
            else:
                ep = await coro
            ok = True
            return job, ep
        except Exception as exc:  # reported to the caller with its job, and counted
            return job, exc
        finally:
            if env is not None:
                if ok and self.config.reuse_envs:
                    self._free_envs.append(env)
                else:
                    env.close()

    def prepare_envs(self, n: int) -> None:
        """Build envs until ``n`` wait for reuse, so a run's first episodes do not pay for env
        construction (benchmarks, latency-sensitive loops). Needs ``reuse_envs=True``."""
        if not self.config.reuse_envs:
            raise ConfigError("prepare_envs() needs reuse_envs=True (envs are built per job otherwise).")
        while len(self._free_envs) < n:
            self._free_envs.append(self.make_env())

    def close(self) -> None:
        """Close the envs kept for reuse (the engine may still run later: it builds new ones)."""
        while self._free_envs:
            self._free_envs.pop().close()

    def __enter__(self) -> RolloutEngine:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- many jobs -----------------------------------------------------------------------
    async def astream(self, jobs: int | Iterable[Any]) -> AsyncGenerator[Result, None]:
        """Run ``jobs`` with at most ``concurrency`` episodes in flight; yield
        ``(job, episode or exception)`` in order of completion.

        Jobs are drawn lazily (an endless generator is fine). Closing the iterator early (or
        cancelling its consumer) cancels the episodes still running.

        Args:
            jobs: See :func:`normalize_jobs`.

        Raises:
            FatalPolicyError: An episode ended with a request its provider rejected (see
                :func:`fatal_error`; a missing or invalid API key...). Every later request would
                fail the same way, so the run stops at once: no job starts after it, the
                episodes in flight are cancelled (counted in ``stats.cancelled``), the other
                results already done are yielded, then this error is raised (once, however many
                episodes hit it).
        """
        it, total = normalize_jobs(jobs)
        st = self.stats
        bar = self._progress_bar(total)
        t0 = time.perf_counter()
        running: set[asyncio.Task] = set()
        # Episodes that ended and were not handed out yet; each ending sets `woken`. (Waiting on
        # `running` with asyncio.wait adds and removes a callback on every task in flight at each
        # wake-up: work in proportion to the episodes in flight, per wake-up.)
        ended: deque[asyncio.Task] = deque()
        woken = asyncio.Event()
        feeder = JobFeeder(it, self.config.concurrency, st)
        fatal: list[FatalPolicyError] = []  # the first rejection seen; stops the run
        collector = collector_threshold(self.config.gc_threshold)
        collector.__enter__()

        def on_end(task: asyncio.Task) -> None:
            ended.append(task)
            woken.set()
            # Seen the moment an episode ends, so a ramp-up in progress stops starting jobs.
            if not fatal and not task.cancelled() and task.exception() is None:
                f = fatal_error(task.result()[1])
                if f is not None:
                    fatal.append(f)

        async def fill() -> None:
            started = 0
            for job in feeder.take(lambda: len(running), lambda: bool(fatal)):
                task = asyncio.ensure_future(self.arun_job(job))
                task.add_done_callback(on_end)
                running.add(task)
                started += 1
                # Ramp up a few episodes at a time: a batch that fills while episodes are still
                # starting goes out after at most _RAMP_GROUP more first moves, instead of
                # queueing behind every other episode's reset, and batches come back staggered.
                # Not one at a time: each yield is a pass of the event loop (a select call).
                if started % _RAMP_GROUP == 0:
                    await asyncio.sleep(0)
            if started % _RAMP_GROUP:
                await asyncio.sleep(0)

        try:
            await fill()
            while running:
                if not ended:
                    woken.clear()
                    await woken.wait()
                done = list(ended)
                ended.clear()
                for task in done:
                    running.discard(task)
                    st.in_flight -= 1
                await fill()  # start new episodes before handing results out
                if fatal and running:
                    done += await self._cancel_all(running)
                for task in done:
                    job, outcome = task.result()
                    if isinstance(outcome, BaseException):
                        st.failed += 1
                    else:
                        st.finished += 1
                    if bar is not None:
                        bar.update(1)
                        bar.set_postfix(self._postfix(), refresh=False)
                    if fatal_error(outcome) is None:
                        yield job, outcome
                if fatal:
                    raise note_stopped(fatal[0], f"{st.submitted} episode(s) started, {st.finished} finished, "
                                             f"{st.failed} failed, {st.cancelled} cancelled; no other job started.")
        finally:
            for task in running:
                task.cancel()
            if running:
                await asyncio.gather(*running, return_exceptions=True)
                st.in_flight -= len(running)
            st.wall_seconds += time.perf_counter() - t0
            collector.__exit__(None, None, None)
            if bar is not None:
                bar.close()

    async def _cancel_all(self, running: set[asyncio.Task]) -> list[asyncio.Task]:
        """Cancel the episodes in flight (a fatal error stopped the run); return those that
        had ended anyway, whose results are still handed out."""
        tasks = list(running)
        running.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.stats.in_flight -= len(tasks)
        ended = [t for t in tasks if not t.cancelled()]
        self.stats.cancelled += len(tasks) - len(ended)
        return ended

    def stream(self, jobs: int | Iterable[Any]) -> Iterator[Result]:
        """Synchronous :meth:`astream`: a generator fed by an event loop in a background thread.

        Episodes keep running while the caller handles a result. Works inside a running event
        loop too (notebooks). Breaking out of the loop (or closing the generator) cancels the
        episodes still running.
        """
        return iterate_in_thread(self.astream, jobs)

    async def arun(self, jobs: int | Iterable[Any], *, raise_on_error: bool = False) -> list[Episode | BaseException]:
        """Run every job; return outcomes **in job order**.

        Args:
            jobs: See :func:`normalize_jobs`.
            raise_on_error: Raise the first failure (after every episode ended) instead of
                returning exceptions in the list.

        Raises:
            FatalPolicyError: A provider rejected a request; the run stopped (see :meth:`astream`).
        """
        it, _ = normalize_jobs(jobs)
        numbered = ({**job, "_rollout_order": k} for k, job in enumerate(it))
        out: dict[int, Episode | BaseException] = {}
        async for job, outcome in self.astream(numbered):
            out[job.pop("_rollout_order")] = outcome
        results = [out[k] for k in sorted(out)]
        if raise_on_error:
            for r in results:
                if isinstance(r, BaseException):
                    raise r
        return results

    def run(self, jobs: int | Iterable[Any], *, raise_on_error: bool = False) -> list[Episode | BaseException]:
        """Synchronous :meth:`arun`."""
        from collab_env._async import run_sync

        return run_sync(self.arun(jobs, raise_on_error=raise_on_error))

    # -- progress --------------------------------------------------------------------------
    def _progress_bar(self, total: int | None) -> Any:
        from collab_env._progress import progress_bar

        return progress_bar(total, self.config.desc or f"rollout {self.env_id or ''}".strip(),
                            show=self.config.progress)

    def _postfix(self) -> dict[str, Any]:
        st = self.stats
        d: dict[str, Any] = {"running": st.in_flight}
        if st.failed:
            d["failed"] = st.failed
        if st.batches:
            d["batch"] = f"{st.mean_batch_size:.1f}"
        return d

"""Settings and counters of a :class:`~collab_env.rollout.RolloutEngine`."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from collab_env.errors import ConfigError
from collab_env.rollout.batching import BatchStats, SeedMode
from collab_env.rollout.limits import RateLimiter

__all__ = ["RolloutConfig", "RolloutStats"]


@dataclass
class RolloutConfig:
    """Settings of a :class:`RolloutEngine` (validated on creation; unknown keywords are errors).

    Args:
        concurrency: Most episodes in flight at once.
        batching: Merge concurrent policy calls across episodes: ``"auto"`` wraps every policy
            that does not batch by itself (see :func:`batches_itself`) in a
            :class:`BatchedPolicy`; ``True`` wraps every policy; ``False`` none.
        max_batch_size: :class:`BatchedPolicy` flushes a batch at this many observations.
        max_wait_ms: ... or this long after its first call arrived.
        seeds: How seeds travel in a batch (:class:`BatchedPolicy`): ``"auto"``, ``"group"``,
            ``"rows"``.
        policy_seeds: Pass ``seed=job_seed + step`` to policies (``False``: no seed keyword,
            so a policy without row seeds can batch seeded episodes; resets stay seeded).
        sampling: Player -> sampling keywords for its policy.
        max_calls_per_second: Global rate limit on policy calls (one call = one observation of
            one episode, i.e. one model request), a token bucket; ``None``: no limit.
        burst: Token bucket size (default: ``max(1, max_calls_per_second)``).
        max_concurrent_calls: Most policy calls of all episodes in flight at once (waiting in a
            batch counts); ``None``: no limit.
        episode_timeout_s: An episode running longer fails with ``TimeoutError`` (reported like
            any failure); ``None``: no limit.
        reuse_envs: Reset a finished episode's env for a later job (as vector envs do) instead
            of building a fresh one per job; an env whose episode failed is closed, never
            reused. ``False`` suits envs whose ``reset`` does not clear everything.
        progress: Show a tqdm progress bar on stderr; ``None``: only when stderr is a terminal.
        desc: Label of the progress bar (default: the env id).
        gc_threshold: While a run is in flight, the cyclic garbage collector's first threshold
            (``gc.get_threshold()[0]``, 700 by default) is raised to at least this, and restored
            when the last run in flight ends (on Ray: in the driver, which unpickles every
            episode, and in each worker). A turn allocates many short-lived objects, and with
            thousands of episodes alive each collection rescans their state: at 4,096 episodes
            the default threshold cost about half of the engine's CPU, 50,000 still ~0.5 s of
            ~2.8 s in 12 collections, 1,000,000 ~0.25 s in one (none of them found garbage: the
            episodes' objects are freed by reference counting), and that one came as the run
            ended, when the restored threshold had the next allocation scan every object the run
            left (the episodes kept: ~520,000 objects at 4,096 episodes). So the last run to end
            first moves the young objects to the oldest generation, unscanned
            (:func:`~collab_env.rollout.jobs.collector_threshold`). The price: cyclic garbage, if
            any, waits for up to that many net allocations (on the order of 100 MB) during a run,
            and what a run leaves waits for the next full collection (at most this many objects
            moved so at once; none moved while a caller has frozen objects). ``None`` leaves the
            collector alone (results never depend on it).
        clock: Monotonic clock of the rate limiter (injectable for tests).
        sleep: Async sleep of the rate limiter (injectable for tests).
    """

    concurrency: int = 64
    batching: bool | Literal["auto"] = "auto"
    max_batch_size: int = 64
    max_wait_ms: float = 2.0
    seeds: SeedMode = "auto"
    policy_seeds: bool = True
    sampling: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    max_calls_per_second: float | None = None
    burst: int | None = None
    max_concurrent_calls: int | None = None
    episode_timeout_s: float | None = None
    reuse_envs: bool = True
    progress: bool | None = None
    desc: str | None = None
    gc_threshold: int | None = 1_000_000
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep

    def __post_init__(self) -> None:
        def positive_int(name: str, allow_none: bool = False) -> None:
            v = getattr(self, name)
            if v is None and allow_none:
                return
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{name} must be an int >= 1{' or None' if allow_none else ''}, got {v!r}.")

        positive_int("concurrency")
        positive_int("max_batch_size")
        positive_int("max_concurrent_calls", allow_none=True)
        positive_int("gc_threshold", allow_none=True)
        if self.batching not in (True, False, "auto"):
            raise ConfigError(f"batching must be True, False or 'auto', got {self.batching!r}.")
        if self.seeds not in ("auto", "group", "rows"):
            raise ConfigError(f"seeds must be 'auto', 'group' or 'rows', got {self.seeds!r}.")
        if not isinstance(self.max_wait_ms, (int, float)) or not math.isfinite(self.max_wait_ms) \
                or self.max_wait_ms < 0:
            raise ConfigError(f"max_wait_ms must be a finite number >= 0, got {self.max_wait_ms!r}.")
        if self.max_calls_per_second is not None:
            RateLimiter(self.max_calls_per_second, self.burst)  # validates both
        elif self.burst is not None:
            raise ConfigError("burst only applies with max_calls_per_second; set both or neither.")
        if self.episode_timeout_s is not None and not self.episode_timeout_s > 0:
            raise ConfigError(f"episode_timeout_s must be > 0 or None, got {self.episode_timeout_s!r}.")
        if not isinstance(self.sampling, Mapping) or not all(isinstance(v, Mapping) for v in self.sampling.values()):
            raise ConfigError("sampling maps player -> {keyword: value}, e.g. {'assistant': {'temperature': 0.7}}.")
        self.sampling = {p: dict(v) for p, v in self.sampling.items()}

    @classmethod
    def from_kwargs(cls, config: RolloutConfig | None = None, **kwargs: Any) -> RolloutConfig:
        """``config`` with ``kwargs`` applied; an unknown keyword is an error naming the valid ones."""
        from collab_env.errors import did_you_mean

        valid = [f.name for f in fields(cls)]
        for k in kwargs:
            if k not in valid:
                raise ConfigError(f"unknown rollout setting {k!r}; valid: {valid}." + did_you_mean(k, valid))
        if config is None:
            return cls(**kwargs)
        return cls(**{**{f.name: getattr(config, f.name) for f in fields(cls)}, **kwargs})


@dataclass
class RolloutStats:
    """Counters of a :class:`RolloutEngine` (``engine.stats``; cumulative over its runs).

    Args:
        submitted: Episodes started.
        finished: Episodes that ended with an :class:`~collab_env.types.Episode`.
        failed: Episodes that ended with an exception (yielded as ``(job, exception)``, or
            raised when it is a :class:`~collab_env.errors.FatalPolicyError`).
        cancelled: Episodes cancelled because a fatal error stopped the run.
        in_flight: Episodes running now.
        max_in_flight: Most episodes running at once.
        policy_calls: Policy calls made by episodes (before batching).
        calls_in_flight: Policy calls running now.
        max_calls_in_flight: Most policy calls running at once.
        wall_seconds: Time spent inside runs.
        batches: Policy name -> :class:`BatchStats` of its :class:`BatchedPolicy`.
        per_worker: Worker -> episodes it ran (Ray backend only).
    """

    submitted: int = 0
    finished: int = 0
    failed: int = 0
    cancelled: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    policy_calls: int = 0
    calls_in_flight: int = 0
    max_calls_in_flight: int = 0
    wall_seconds: float = 0.0
    batches: dict[str, BatchStats] = field(default_factory=dict)
    per_worker: dict[str, int] = field(default_factory=dict)

    @property
    def episodes_per_second(self) -> float:
        """Finished and failed episodes per second of run time."""
        done = self.finished + self.failed
        return done / self.wall_seconds if self.wall_seconds > 0 else 0.0

    @property
    def mean_batch_size(self) -> float:
        """Observations per batched call, over every batched policy."""
        obs = sum(b.observations for b in self.batches.values())
        n = sum(b.batches for b in self.batches.values())
        return obs / n if n else 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly counters."""
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("batches", "per_worker")}
        d["batches"] = {k: v.to_dict() for k, v in self.batches.items()}
        d["per_worker"] = dict(self.per_worker)
        d["episodes_per_second"] = self.episodes_per_second
        d["mean_batch_size"] = self.mean_batch_size
        return d

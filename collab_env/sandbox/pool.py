"""Many sandboxed runs at once: :class:`SandboxPool` bounds how many are in flight."""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

from collab_env.errors import ConfigError
from collab_env.sandbox.config import SandboxJob, SandboxLimits, SandboxResult
from collab_env.sandbox.run import run_python

__all__ = ["SandboxPool"]


class SandboxPool:
    """Runs many sandboxed programs at once, at most ``max_workers`` at a time.

    Each run blocks a worker thread on ``select``; the real work is in child processes, so
    threads are cheap here and keep the pool usable from sync and async code alike.

    Args:
        max_workers: Most runs in flight (default: the number of CPUs).
        limits: Default limits for runs that do not give their own.
    """

    def __init__(self, max_workers: int | None = None, *, limits: SandboxLimits = SandboxLimits()) -> None:  # noqa: B008 - frozen
        if max_workers is None:
            max_workers = os.cpu_count() or 1
        if isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1:
            raise ConfigError(f"max_workers must be a positive integer, got {max_workers!r}.")
        if not isinstance(limits, SandboxLimits):
            raise ConfigError(f"limits must be a SandboxLimits, got {type(limits).__name__}.")
        self.max_workers = max_workers
        self.limits = limits
        self._executor = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="sandbox")

    async def run(
        self, code: str, *, tests: str | None = None, stdin: str = "", limits: SandboxLimits | None = None
    ) -> SandboxResult:
        """Run one program in the pool; waits for a free worker."""
        call = functools.partial(run_python, code, tests=tests, stdin=stdin, limits=limits or self.limits)
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    async def run_tests(self, code: str, tests, *, limits: SandboxLimits | None = None, **kwargs):
        """:func:`collab_env.sandbox.harness.run_tests` in the pool (one worker per scoring)."""
        from collab_env.sandbox.harness import run_tests

        call = functools.partial(run_tests, code, tests, limits=limits or self.limits, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    def map(self, jobs: Iterable[SandboxJob | str]) -> list[SandboxResult]:
        """Run every job (a :class:`SandboxJob` or just code) and return results in order.

        Raises:
            SandboxError: The first infrastructure failure (the other jobs still finish).
        """
        calls = []
        for job in jobs:
            if isinstance(job, str):
                job = SandboxJob(job)
            if not isinstance(job, SandboxJob):
                raise ConfigError(f"jobs must be SandboxJob or str, got {type(job).__name__}.")
            calls.append(functools.partial(run_python, job.code, tests=job.tests, stdin=job.stdin,
                                           limits=job.limits or self.limits))
        futures = [self._executor.submit(c) for c in calls]
        return [f.result() for f in futures]

    def close(self) -> None:
        """Wait for running jobs and stop the worker threads."""
        self._executor.shutdown(wait=True)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

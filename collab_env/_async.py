"""Run coroutines from synchronous code, inside or outside a running event loop."""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import threading
import weakref
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
_local = threading.local()
_loops: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()  # every loop run_sync made


def _close_loops() -> None:
    """At exit, close the loops :func:`run_sync` kept, as ``asyncio.run`` closes its own: tasks
    still pending on them (a library's background worker, e.g. litellm's logging worker) are
    cancelled and awaited, so none is destroyed pending (which prints "Task was destroyed but it
    is pending!"). A loop that another thread is running is left alone."""
    for loop in list(_loops):
        if loop.is_closed() or loop.is_running():
            continue
        try:
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()


atexit.register(_close_loops)


def run_main(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(coro)``: a fresh loop, and Ctrl-C cancels the run cleanly; its result is
    handed back without being the main task's own.

    On Python 3.11, ``asyncio.run`` looks up its SIGINT handler when it ends
    (``signal.getsignal``), whose enum lookup formats the handler, and with it the finished main
    task and its whole result: an exploit audit, an evaluation per policy, spent a third of its
    time formatting its episodes (``benchmarks/bench_asyncio_run.py``).
    """
    box: list[T] = []

    async def main() -> None:
        box.append(await coro)

    asyncio.run(main())
    return box[0]


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion and return its result.

    Outside an event loop it reuses one loop per thread (creating a loop per call would cost
    more than a pure env step). Inside a running loop (Jupyter, an async server) it runs the
    coroutine on a fresh loop in a worker thread, so sync facades never deadlock.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        loop = getattr(_local, "loop", None)
        if loop is None or loop.is_closed():
            loop = asyncio.new_event_loop()
            _local.loop = loop
            _loops.add(loop)
        return loop.run_until_complete(coro)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()

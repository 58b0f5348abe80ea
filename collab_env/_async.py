"""Run coroutines from synchronous code, inside or outside a running event loop."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
_local = threading.local()


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
        return loop.run_until_complete(coro)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()

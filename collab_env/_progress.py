"""The one progress display: a tqdm bar on a terminal, plain lines when stderr is redirected.

A bar needs a terminal; a log file or a CI job would otherwise show nothing for minutes. With
``lines=True``, :func:`progress_bar` then prints a line to stderr at every tenth of the total and
one when it closes: ``eval hidden-facts-easy-v1 ask-then-answer: 40/100 ep (40%, failed 1) 2.1 min``.

**A heartbeat.** Every display, bar or lines, has a daemon thread that wakes while the display is
open: a line display prints its line again when none was printed for :func:`progress_interval`
seconds (60 by default; ``$COLLAB_ENV_PROGRESS_INTERVAL`` sets it, e.g. to 1 in tests), and a bar
is redrawn, so its clock moves while one slow step (a model call, an MR future) runs. The
thread, not the arrival of a result, keeps the promise: a run whose first episode takes 12
minutes still prints a line every minute.

``tqdm`` is imported only when a bar is drawn. A display for a short task can wait ``delay``
seconds before it shows anything (a task that ends sooner shows nothing), and a bar can be
removed when it closes (``leave=False``).
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
import weakref
from typing import Any, TextIO

from collab_env.errors import ConfigError

__all__ = ["progress_bar", "LineProgress", "LINE_INTERVAL_S", "INTERVAL_ENV", "progress_interval", "say"]

#: The longest stretch without a line (seconds), unless :data:`INTERVAL_ENV` says otherwise.
LINE_INTERVAL_S = 60.0
#: The environment variable that sets the heartbeat interval (seconds > 0).
INTERVAL_ENV = "COLLAB_ENV_PROGRESS_INTERVAL"


def progress_interval() -> float:
    """The heartbeat interval in seconds: ``$COLLAB_ENV_PROGRESS_INTERVAL``, else
    :data:`LINE_INTERVAL_S`.

    Raises:
        ConfigError: The variable is set to something that is not a number of seconds > 0.
    """
    raw = os.environ.get(INTERVAL_ENV, "").strip()
    if not raw:
        return LINE_INTERVAL_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise ConfigError(f"{INTERVAL_ENV}={raw!r} is not a number of seconds > 0; set it to e.g. 30, or unset it "
                          f"for the default {LINE_INTERVAL_S:g} s.")
    return value


def say(line: str) -> None:
    """Print one status line to stderr (a run's label, what a resume kept, where the outputs went),
    flushed at once so a redirected log shows it."""
    print(line, file=sys.stderr, flush=True)


def _elapsed(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 60 else f"{seconds / 60:.1f} min"


class LineProgress:
    """The part of tqdm's interface the library uses (``update``, ``set_postfix``, ``close``),
    written as plain lines, with a heartbeat thread (see the module docstring).

    Args:
        total: The count to reach (``None``: unknown).
        desc: Its label.
        initial: The count already done.
        unit: The unit shown.
        file: Where the lines go (default: stderr at the time of each line).
        delay: Seconds before the first line.
        interval: The longest stretch without a line (default :func:`progress_interval`).
    """

    def __init__(self, total: int | None, desc: str, *, initial: int = 0, unit: str = "ep",
                 file: TextIO | None = None, delay: float = 0.0, interval: float | None = None) -> None:
        self.total, self.desc, self.n, self.unit = total, desc, initial, unit
        self.file = file
        self.delay = float(delay)
        self.interval = float(interval) if interval is not None else progress_interval()
        self.postfix: dict[str, Any] = {}
        self._t0 = self._last = time.monotonic()
        self._next = self._step(initial)
        self._closed = False
        self._said = initial
        self._lock = threading.RLock()
        self._stop = threading.Event()
        # The thread holds the display weakly: a display dropped without close() ends its thread.
        threading.Thread(target=_line_heartbeat, args=(weakref.ref(self), self._stop), name=f"progress: {desc}",
                         daemon=True).start()

    def _step(self, n: int) -> int | None:
        if not self.total:
            return None
        tenth = max(1, self.total // 10)
        return (n // tenth + 1) * tenth

    def _say(self) -> None:
        parts = [f"{100 * self.n / self.total:.0f}%"] if self.total else []
        parts += [f"{k} {v}" for k, v in self.postfix.items()]
        count = f"{self.n}/{self.total}" if self.total else f"{self.n}"
        now = time.monotonic()
        print(f"{self.desc}: {count} {self.unit}{' (' + ', '.join(parts) + ')' if parts else ''} "
              f"{_elapsed(now - self._t0)}", file=self.file or sys.stderr, flush=True)
        self._last = now
        self._said = self.n

    def _due(self) -> float:
        """Seconds until a heartbeat line is due."""
        with self._lock:
            return max(self._last + self.interval, self._t0 + self.delay) - time.monotonic()

    def _beat(self) -> None:
        """A heartbeat line, when none was printed for ``interval`` seconds and it is still open."""
        with self._lock:
            now = time.monotonic()
            if not self._closed and now - self._last >= self.interval and now - self._t0 >= self.delay:
                self._say()

    def update(self, k: int = 1) -> None:
        with self._lock:
            self.n += k
            now = time.monotonic()
            if now - self._t0 < self.delay:  # too early: the task may end before anyone waits
                return
            if (self._next is not None and self.n >= self._next) or now - self._last >= self.interval:
                self._next = self._step(self.n)
                self._say()

    def set_postfix(self, ordered_dict: dict[str, Any] | None = None, refresh: bool = True, **kwargs: Any) -> None:
        with self._lock:
            self.postfix = {**(ordered_dict or {}), **kwargs}

    def close(self) -> None:
        """Stop the heartbeat; print the last count, unless it was just printed (or nothing was,
        within the delay)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._stop.set()
            if self.n != self._said and time.monotonic() - self._t0 >= self.delay:
                self._say()

    def __del__(self) -> None:  # dropped without close(): end its thread
        stop = getattr(self, "_stop", None)
        if stop is not None:
            stop.set()


def _line_heartbeat(ref: weakref.ref[LineProgress], stop: threading.Event) -> None:
    """The thread of a :class:`LineProgress`: a line whenever none was printed for its interval,
    until it is closed or dropped."""
    while True:
        bar = ref()
        if bar is None:
            return
        due = bar._due()
        del bar  # hold it only while looking at it
        if stop.wait(max(due, 0.0) + 0.01):
            return
        bar = ref()
        if bar is None:
            return
        bar._beat()
        del bar


def _redraw(ref: weakref.ref[Any], interval: float) -> None:
    """The heartbeat of a tqdm bar: redraw it every ``interval`` seconds (its clock moves while
    nothing updates it) until it is closed (tqdm sets ``disable`` when it closes) or dropped."""
    wake = threading.Event()
    while not wake.wait(interval):
        bar = ref()
        if bar is None or getattr(bar, "disable", True):
            return
        try:
            bar.refresh()
        except Exception:  # closed between the check and the redraw: nothing left to draw
            return
        del bar


def progress_bar(total: int | None, desc: str, *, show: bool | None = None, lines: bool = False,
                 initial: int = 0, unit: str = "ep", delay: float = 0.0, leave: bool = True) -> Any:
    """A progress display with tqdm's ``update`` / ``set_postfix`` / ``close``, or ``None``.

    Args:
        total: The count to reach (``None``: unknown).
        desc: Its label.
        show: ``True`` / ``False`` to force it on or off; ``None``: on a terminal only.
        lines: When stderr is not a terminal (and ``show`` is not ``False``), print
            :class:`LineProgress` lines instead of nothing.
        initial: The count already done (a resumed run).
        unit: The unit shown.
        delay: Seconds to wait before showing anything (tqdm's ``delay``; no line before it).
        leave: Keep the bar on the terminal when it closes (tqdm's ``leave``).
    """
    tty = sys.stderr.isatty()
    if show is False or (show is None and not tty and not lines):
        return None
    interval = progress_interval()
    if tty or (show is True and not lines):
        from tqdm.auto import tqdm

        bar = tqdm(total=total, initial=initial, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True,
                   delay=delay, leave=leave)
        threading.Thread(target=_redraw, args=(weakref.ref(bar), interval), name=f"progress: {desc}",
                         daemon=True).start()
        return bar
    return LineProgress(total, desc, initial=initial, unit=unit, delay=delay, interval=interval)

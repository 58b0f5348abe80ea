"""The one progress display: a tqdm bar on a terminal, plain lines when stderr is redirected.

A bar needs a terminal; a log file or a CI job would otherwise show nothing for minutes. With
``lines=True``, :func:`progress_bar` then prints a line to stderr at every tenth of the total (and
at least every :data:`LINE_INTERVAL_S` seconds) and one when it closes:
``eval hidden-facts-easy-v1: 40/100 ep (40%, 1 failed) 2.1 min``. ``tqdm`` is imported only when
a bar is drawn. A display for a short task can wait ``delay`` seconds before it shows anything (a
task that ends sooner shows nothing), and a bar can be removed when it closes (``leave=False``).
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

__all__ = ["progress_bar", "LineProgress", "LINE_INTERVAL_S"]

#: The longest stretch without a line (seconds) when the total is large or unknown.
LINE_INTERVAL_S = 60.0


class LineProgress:
    """The part of tqdm's interface the library uses (``update``, ``set_postfix``, ``close``),
    written as plain lines."""

    def __init__(self, total: int | None, desc: str, *, initial: int = 0, unit: str = "ep",
                 file: TextIO | None = None, delay: float = 0.0) -> None:
        self.total, self.desc, self.n, self.unit = total, desc, initial, unit
        self.file = file
        self.delay = float(delay)
        self.postfix: dict[str, Any] = {}
        self._t0 = self._last = time.monotonic()
        self._next = self._step(initial)
        self._closed = False
        self._said = initial

    def _step(self, n: int) -> int | None:
        if not self.total:
            return None
        tenth = max(1, self.total // 10)
        return (n // tenth + 1) * tenth

    def _say(self) -> None:
        parts = [f"{100 * self.n / self.total:.0f}%"] if self.total else []
        parts += [f"{k} {v}" for k, v in self.postfix.items()]
        count = f"{self.n}/{self.total}" if self.total else f"{self.n}"
        print(f"{self.desc}: {count} {self.unit}{' (' + ', '.join(parts) + ')' if parts else ''} "
              f"{(time.monotonic() - self._t0) / 60:.1f} min", file=self.file or sys.stderr, flush=True)
        self._last = time.monotonic()
        self._said = self.n

    def update(self, k: int = 1) -> None:
        self.n += k
        now = time.monotonic()
        if now - self._t0 < self.delay:  # too early: the task may end before anyone waits
            return
        if (self._next is not None and self.n >= self._next) or now - self._last >= LINE_INTERVAL_S:
            self._next = self._step(self.n)
            self._say()

    def set_postfix(self, ordered_dict: dict[str, Any] | None = None, refresh: bool = True, **kwargs: Any) -> None:
        self.postfix = {**(ordered_dict or {}), **kwargs}

    def close(self) -> None:
        """The last count, unless it was just printed (or nothing was, within the delay)."""
        if not self._closed:
            self._closed = True
            if self.n != self._said and time.monotonic() - self._t0 >= self.delay:
                self._say()


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
    if tty or (show is True and not lines):
        from tqdm.auto import tqdm

        return tqdm(total=total, initial=initial, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True,
                    delay=delay, leave=leave)
    return LineProgress(total, desc, initial=initial, unit=unit, delay=delay)

"""The stream the commands print to, and OS errors as one line: the path, what went wrong and
what to do (:func:`os_error_message`)."""

from __future__ import annotations

import errno
import os
import sys
from typing import Protocol, TextIO

__all__ = ["os_error_message", "Writer", "Output", "drop_stdout"]


class Writer(Protocol):
    """What a command prints to (``print(..., file=out)``): :class:`Output`, or any text stream."""

    def write(self, text: str, /) -> int: ...

    def flush(self) -> None: ...


#: Per errno: what went wrong, and what to do about it.
_OS_FIXES: dict[int, tuple[str, str]] = {
    errno.ENOENT: ("no such file or folder",
                   "check the path: an input must exist, an output must go in a folder that exists "
                   "or can be created (pseudo file systems such as /proc and /sys take no new files)"),
    errno.ENOTDIR: ("a part of the path is a file, not a folder",
                    "choose a path whose parent folders are folders"),
    errno.EISDIR: ("is a folder, where a file is needed", "give the path of a file inside it"),
    errno.EEXIST: ("already exists", "remove it or choose another path"),
    errno.EACCES: ("permission denied", "choose a path you may use, or change its permissions"),
    errno.EPERM: ("operation not permitted", "choose a path you may use, or change its permissions"),
    errno.EROFS: ("read-only file system", "choose a path on a writable file system"),
    errno.ENOSPC: ("no space left on the device", "free some space or write to another disk"),
    errno.EDQUOT: ("disk quota exceeded", "free some space or write to another disk"),
    errno.EIO: ("input/output error (a disk or network file system fault)",
                "check the device, then run the command again"),
    errno.ENAMETOOLONG: ("file name too long", "use a shorter path"),
    errno.EMFILE: ("too many open files", "raise the limit (ulimit -n) or lower --concurrency"),
    errno.ENFILE: ("too many open files in the system", "close other programs or lower --concurrency"),
}
_NETWORK_FIX = "check the server's address, that it is running and reachable, then run the command again"


def os_error_message(exc: OSError) -> str:
    """One line for an OS or I/O error: the path, what went wrong, and the fix."""
    default = _NETWORK_FIX if isinstance(exc, (ConnectionError, TimeoutError)) else \
        "check the path and the disk, then run the command again"
    what, fix = _OS_FIXES.get(exc.errno or -1, (None, default))
    what = what or exc.strerror or (str(exc) if str(exc) else type(exc).__name__)
    paths = [os.fsdecode(f) for f in (exc.filename, exc.filename2) if f is not None]
    where = " -> ".join(paths)
    text = f"{where}: {what}" if where else what
    return " ".join(f"{text}; {fix}.".split())


class Output:
    """The stream commands print to; an OS error writing it names it (a full disk behind
    ``> file``, a closed pipe), since such errors carry no file name of their own."""

    def __init__(self, stream: TextIO, name: str = "standard output") -> None:
        self.stream = stream
        self.name = name

    def _named(self, exc: OSError) -> OSError:
        if exc.filename is None:
            exc.filename = self.name
        return exc

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)
        except OSError as exc:
            raise self._named(exc) from None

    def flush(self) -> None:
        try:
            self.stream.flush()
        except OSError as exc:
            raise self._named(exc) from None


def drop_stdout(out: Output) -> None:
    """After a failed write to the process's stdout, point it at /dev/null so the interpreter's
    final flush does not fail a second time with a traceback."""
    if out.stream is not sys.stdout:
        return
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):  # no real file descriptor behind sys.stdout
        pass

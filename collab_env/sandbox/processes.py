"""The parent side of a run's containment: fresh uids, the process table, killing what a run left.

As root every run gets a fresh, unused uid (:func:`allocate_uid` / :func:`release_uid`), and
after a run :func:`kill_uid` ends every process of that uid, including processes that left the
process group when there is no PID namespace. :func:`list_processes` reads ``/proc``.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time

from collab_env.errors import SandboxError

__all__ = ["list_processes", "allocate_uid", "release_uid", "live_processes_of_uid", "kill_uid"]

# Fresh uids come from a range far above ordinary users, system users and the usual subuid
# ranges (100000-...). Each run draws one that no process is using.
_UID_BASE = 1_500_000_000
_UID_SPAN = 1 << 24

_uid_lock = threading.Lock()
_uids_in_use: set[int] = set()


def list_processes() -> list[tuple[int, int, str, int]]:
    """(pid, real uid, state letter, threads) of every process, read from /proc."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as f:
                text = f.read()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue  # exited while we looked
        fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
        try:
            uid = int(fields["Uid"].split()[0])
            state = fields["State"].split()[0]
            threads = int(fields.get("Threads", "1"))
        except (KeyError, ValueError, IndexError):
            continue
        out.append((int(name), uid, state, threads))
    return out


def allocate_uid() -> int:
    """A uid no process uses and no other run of this process holds."""
    busy = {uid for _, uid, _, _ in list_processes()}
    with _uid_lock:
        while True:
            uid = _UID_BASE + random.randrange(_UID_SPAN)
            if uid not in busy and uid not in _uids_in_use:
                _uids_in_use.add(uid)
                return uid


def release_uid(uid: int) -> None:
    """Give back ``uid`` (from :func:`allocate_uid`) so that later runs may draw it again."""
    with _uid_lock:
        _uids_in_use.discard(uid)


def live_processes_of_uid(uid: int) -> list[int]:
    """Pids of the processes (zombies excluded) running as ``uid``; used by tests and cleanup."""
    return [pid for pid, u, state, _ in list_processes() if u == uid and state != "Z"]


def kill_uid(uid: int, deadline_s: float = 3.0) -> None:
    """SIGKILL every process of ``uid`` until none is left; raise SandboxError if that fails.

    Runs after the process group is killed, for processes that left the group (``setsid``)
    when there is no PID namespace. pidfds make sure a recycled pid is never hit.
    """
    end = time.monotonic() + deadline_s
    while True:
        pids = live_processes_of_uid(uid)
        if not pids:
            return
        if time.monotonic() > end:
            raise SandboxError(
                f"could not kill the sandbox processes {pids[:10]} of uid {uid}; "
                "kill them by hand (kill -9) and report this as a bug."
            )
        for pid in pids:
            try:
                fd = os.pidfd_open(pid)
            except (ProcessLookupError, OSError):
                continue
            try:
                if pid in live_processes_of_uid(uid):
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
            except ProcessLookupError:
                pass  # it exited between the scan and the signal: what we wanted
            finally:
                os.close(fd)
        time.sleep(0.01)

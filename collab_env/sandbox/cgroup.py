"""A memory bound for a whole sandboxed run: one cgroup per run, when the host lets us make one.

``RLIMIT_AS`` bounds each process; a program that forks six children of 100 MB each, or fills
a ``memfd`` (shared memory, not address space of a live mapping), passes a per-process limit.
A memory cgroup bounds what the whole run holds. :class:`MemoryGroup` makes one under the
caller's own cgroup, on cgroup v2 (``memory.max``, swap off) where the memory controller is
delegated to it, else on cgroup v1 (``memory.limit_in_bytes``, and ``memory.memsw.limit_in_bytes``
where swap accounting is on). The run's bootstrap is moved into it before it reads its config,
so everything the code starts is inside. Where neither works (not root, no delegation), the
mode says so and only the per-process limits hold: ``SandboxResult.isolation["memory"]``.
"""

from __future__ import annotations

import os
import time

__all__ = ["MemoryGroup"]

_V1_ROOT = "/sys/fs/cgroup/memory"
_V2_ROOT = "/sys/fs/cgroup"


def _own_path(controller: str | None) -> str | None:
    """The caller's cgroup path for a v1 controller, or (``None``) the v2 one."""
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                _, names, path = line.rstrip("\n").split(":", 2)
                if controller is None and names == "":
                    return path
                if controller is not None and controller in names.split(","):
                    return path
    except (OSError, ValueError):
        return None
    return None


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


class MemoryGroup:
    """One run's memory cgroup: ``create``, ``add(pid)``, ``oom_killed()``, ``remove``."""

    def __init__(self, limit_mb: int, name: str) -> None:
        self.limit = int(limit_mb) << 20
        self.name = name
        self.path: str | None = None
        self.version = 0
        self.mode = "per-process RLIMIT_AS only (no memory cgroup)"

    def create(self) -> MemoryGroup:
        """Make the group; on failure leave ``path`` None and say why in ``mode``."""
        errors = []
        for attempt in (self._create_v2, self._create_v1):
            try:
                if attempt():
                    return self
            except OSError as exc:
                errors.append(f"{attempt.__name__[-2:]}: {exc.strerror or exc}")
                self._rmdir()
        if errors:
            self.mode += " [" + "; ".join(errors) + "]"
        return self

    def _create_v2(self) -> bool:
        own = _own_path(None)
        if own is None or not os.path.isfile(os.path.join(_V2_ROOT, "cgroup.controllers")):
            return False
        base = os.path.normpath(_V2_ROOT + own)
        with open(os.path.join(base, "cgroup.subtree_control")) as f:
            if "memory" not in f.read().split():
                return False
        self.path = os.path.join(base, self.name)
        os.mkdir(self.path, 0o700)
        _write(os.path.join(self.path, "memory.max"), str(self.limit))
        if os.path.exists(os.path.join(self.path, "memory.swap.max")):
            _write(os.path.join(self.path, "memory.swap.max"), "0")
        self.version = 2
        self.mode = f"cgroup v2 memory.max {self.limit >> 20} MiB for the whole run"
        return True

    def _create_v1(self) -> bool:
        own = _own_path("memory")
        if own is None or not os.path.isdir(_V1_ROOT):
            return False
        self.path = os.path.join(os.path.normpath(_V1_ROOT + own), self.name)
        os.mkdir(self.path, 0o700)
        _write(os.path.join(self.path, "memory.limit_in_bytes"), str(self.limit))
        swap = os.path.join(self.path, "memory.memsw.limit_in_bytes")
        with_swap = os.path.exists(swap)
        if with_swap:
            _write(swap, str(self.limit))
        self.version = 1
        self.mode = (f"cgroup v1 memory.limit_in_bytes {self.limit >> 20} MiB for the whole run"
                     + (" (memory+swap too)" if with_swap else " (swap not accounted)"))
        return True

    def add(self, pid: int) -> bool:
        """Move ``pid`` into the group; False (and the mode says so) when that fails."""
        if self.path is None:
            return False
        try:
            _write(os.path.join(self.path, "cgroup.procs"), str(pid))
            return True
        except OSError as exc:
            self.mode = f"per-process RLIMIT_AS only (could not join the memory cgroup: {exc.strerror})"
            self._rmdir()
            return False

    def oom_killed(self) -> bool:
        """Whether the kernel's OOM killer ended a process of the group."""
        if self.path is None:
            return False
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        try:
            with open(os.path.join(self.path, name)) as f:
                for line in f:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill" and int(value or 0) > 0:
                        return True
        except (OSError, ValueError):
            return False
        return False

    def remove(self) -> None:
        """Delete the group (its processes are dead by now; a few retries while they exit)."""
        self._rmdir(retries=50)

    def _rmdir(self, retries: int = 1) -> None:
        if self.path is None:
            return
        for _ in range(retries):
            try:
                os.rmdir(self.path)
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.02)
        self.path = None if not os.path.isdir(self.path) else self.path

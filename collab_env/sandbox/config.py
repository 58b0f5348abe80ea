"""The sandbox's data: the limits of a run, its verdict, and a job for the pool.

:class:`SandboxLimits` (validated at construction), :class:`SandboxResult` (what one run did,
with the ``Status`` decided in :mod:`collab_env.sandbox.verdict`) and
:class:`SandboxJob` (the arguments of one run for :meth:`SandboxPool.map`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Literal

from collab_env.errors import ConfigError

__all__ = ["Status", "SandboxLimits", "SandboxResult", "SandboxJob"]


Status = Literal["passed", "failed", "timeout", "out_of_memory", "crashed", "forbidden", "output_limit"]


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandboxed run.

    Attributes:
        cpu_s: CPU seconds of the main process (``RLIMIT_CPU``; each forked process has its own).
        wall_s: Wall-clock seconds for the whole run, enforced by the parent.
        memory_mb: Address-space limit per process in MiB (``RLIMIT_AS``).
        file_size_mb: Largest file the code may write, in MiB (``RLIMIT_FSIZE``).
        max_processes: Processes *and threads* the sandbox uid may have (``RLIMIT_NPROC``).
        max_output_bytes: Bytes of stdout and stderr together before the run is stopped.
        max_open_files: File descriptors per process (``RLIMIT_NOFILE``).
        disk_mb: Size in MiB of the private tmpfs holding the sandbox directory (and of the
            private ``/dev/shm``); only with a mount namespace.
        use_namespaces: Use Linux namespaces when running as root. ``False`` exercises the
            weaker fallback (uid separation and the audit hook only).
    """

    cpu_s: float = 5
    wall_s: float = 10
    memory_mb: int = 512
    file_size_mb: int = 16
    max_processes: int = 16
    max_output_bytes: int = 1_000_000
    max_open_files: int = 64
    disk_mb: int = 64
    use_namespaces: bool = True

    def __post_init__(self) -> None:
        minimums = {
            "cpu_s": 0.01, "wall_s": 0.01, "memory_mb": 64, "file_size_mb": 1,
            "max_processes": 1, "max_output_bytes": 1, "max_open_files": 16, "disk_mb": 1,
        }
        for name, low in minimums.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"SandboxLimits.{name} must be a number, got {value!r}.")
            if name not in ("cpu_s", "wall_s") and not isinstance(value, int):
                raise ConfigError(f"SandboxLimits.{name} must be an integer, got {value!r}.")
            if value < low:
                raise ConfigError(
                    f"SandboxLimits.{name}={value!r} is too small; use at least {low} "
                    "(the interpreter itself needs that much to start)."
                )
        if not isinstance(self.use_namespaces, bool):
            raise ConfigError(f"SandboxLimits.use_namespaces must be a bool, got {self.use_namespaces!r}.")


@dataclasses.dataclass(frozen=True)
class SandboxResult:
    """What happened to one sandboxed run.

    Attributes:
        status: The verdict; see the module docstring for how it is decided.
        returncode: Exit status of the process that ran the code (negative: killed by that
            signal), or ``None`` when the parent killed the run before it ended.
        stdout: Captured standard output (decoded as UTF-8 with replacement), capped.
        stderr: Captured standard error, capped; tracebacks land here.
        duration_s: Wall-clock seconds from start to cleanup.
        truncated: Whether output was cut at ``max_output_bytes``.
        detail: One line explaining the status (the exception, the signal, the limit).
        isolation: Which containment was active: keys ``user``, ``network``, ``filesystem``,
            ``processes`` (see the module docstring).
        uid: The uid the code ran as.
    """

    status: Status
    returncode: int | None
    stdout: str
    stderr: str
    duration_s: float
    truncated: bool
    detail: str
    isolation: Mapping[str, str] = dataclasses.field(default_factory=dict)
    uid: int | None = None

    @property
    def passed(self) -> bool:
        """``status == "passed"``."""
        return self.status == "passed"


@dataclasses.dataclass(frozen=True)
class SandboxJob:
    """One unit of work for :meth:`SandboxPool.map`: the arguments of :func:`run_python`."""

    code: str
    tests: str | None = None
    stdin: str = ""
    limits: SandboxLimits | None = None  # None: the pool's limits

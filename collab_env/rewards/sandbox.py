"""A sandbox for untrusted, model-generated Python (used by the ``pass_rate`` metric).

``run_python(code, tests=...)`` runs a solution, then its unit tests, in a fresh ``python -I``
process and says what happened as a :class:`SandboxResult`. :class:`SandboxPool` runs many at
once with bounded concurrency (``await pool.run(...)`` or ``pool.map(jobs)``).

How a run is contained (best effort, each layer reported in ``SandboxResult.isolation``):

* **Process tree.** The parent starts ``python -I -B -c <bootstrap>`` in a new session. The
  bootstrap (``P``) unshares namespaces and forks a *reaper* (``C``), which forks the process that
  runs the untrusted code (``G``). With a PID namespace ``C`` is its init: when ``C`` exits or is
  killed, the kernel kills and reaps everything the code started, including processes that left
  the process group with ``setsid``. Without one, ``C`` is a child subreaper and the parent kills
  the process group and then every process of the sandbox uid.
* **User.** As root, ``G`` drops to a *fresh, random, unused uid/gid* (no supplementary groups,
  ``no_new_privs``). A dedicated uid matters because ``RLIMIT_NPROC`` counts processes per real
  uid and is not enforced for root: sharing ``nobody`` between concurrent runs would let one fork
  bomb starve the others, and a different uid cannot signal the parent. Not as root, the code
  runs as the caller's own uid: ``RLIMIT_NPROC`` is set to the user's current task count plus
  ``max_processes`` and nothing stops the code from signalling or writing as that user. Run as
  root (or in a container) for real isolation.
* **Network.** As root, ``G`` lives in a new network namespace: only a loopback interface, and it
  is down, so no connection can leave. In every mode an audit hook also refuses ``connect``,
  ``bind``, ``sendto`` and ``sendmsg`` on internet sockets, which makes the attempt visible
  (status ``"forbidden"``); without a namespace that hook is the only barrier (``ctypes`` can
  bypass it).
* **Filesystem.** As root, in a new mount namespace: ``/tmp`` is a private, size-limited tmpfs
  holding the sandbox directory ``/tmp/sandbox`` (cwd, ``HOME`` and ``TMPDIR``), ``/dev/shm`` is
  another private tmpfs, and every other mount is remounted read-only. Directories the sandbox
  user could not traverse but needs (an interpreter installed under ``/root``, say) are made
  reachable by bind-mounting just the interpreter's trees over an empty tmpfs, which also hides
  the rest of that directory. Without a mount namespace the sandbox directory is a fresh
  ``tempfile.mkdtemp`` directory and only file permissions protect the rest.
* **Resources.** ``RLIMIT_CPU``, ``RLIMIT_AS``, ``RLIMIT_FSIZE``, ``RLIMIT_NPROC`` (which counts
  threads too), ``RLIMIT_NOFILE`` and ``RLIMIT_CORE=0`` are set in ``G`` before any untrusted code
  runs; the parent enforces the wall-clock limit and the output limit by killing the whole tree.

How the status is decided, first match wins:

1. ``"output_limit"``: stdout plus stderr passed ``max_output_bytes`` (the tree is killed).
2. ``"timeout"``: ``wall_s`` passed, or the code was killed by ``SIGXCPU``/``SIGKILL`` after
   spending its ``cpu_s``.
3. ``"forbidden"``: the code tried a network operation (even if it caught the error), or it died
   of ``BlockingIOError`` while trying to start a process beyond ``max_processes``.
4. ``"out_of_memory"``: a ``MemoryError`` escaped, or the process died with an allocation failure
   message on stderr.
5. ``"crashed"``: killed by a signal (a segfault, ``os.kill``); without tests also any exception
   or non-zero exit.
6. With tests: ``"passed"`` when the solution and then the tests ran to their end, ``"failed"``
   otherwise (an assertion, any exception, a syntax error, or an exit before the tests finished:
   ``sys.exit(0)`` at the top of a solution does not pass). Without tests: ``"passed"`` on exit
   status 0.

The solution and the tests run in one ``__main__`` namespace (the tests see the solution's
names); their tracebacks name them ``<solution>`` and ``<tests>``. Tests should signal failure by
raising (plain ``assert``, or ``unittest`` with ``unittest.main(exit=False)`` plus an explicit
check of the result): an exit from the test code counts as a failure.

The bootstrap reports outcomes on a private pipe, signed with a per-run random nonce that the
untrusted code never receives directly. Reading it back would take deliberate introspection of
the bootstrap's frames, so a casual ``print("passed")`` or ``os._exit(0)`` cannot fake a pass.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import os
import random
import secrets
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

from collab_env.errors import ConfigError, SandboxError

__all__ = [
    "SandboxError",
    "SandboxLimits",
    "SandboxResult",
    "SandboxJob",
    "SandboxPool",
    "run_python",
    "arun_python",
]


Status = Literal["passed", "failed", "timeout", "out_of_memory", "crashed", "forbidden", "output_limit"]

# Fresh uids come from a range far above ordinary users, system users and the usual subuid
# ranges (100000-...). Each run draws one that no process is using.
_UID_BASE = 1_500_000_000
_UID_SPAN = 1 << 24
_NS_WORKDIR = "/tmp/sandbox"
_STATUS_CAP = 1 << 20  # bytes of status records kept; more is the code writing garbage


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


# --------------------------------------------------------------------------------------------
# The bootstrap: runs in the child as `python -I -B -c _BOOTSTRAP <config fd> <status fd>`.
# It must be self-contained (standard library only) and must not trust anything the untrusted
# code can touch once that code runs.
# --------------------------------------------------------------------------------------------
_BOOTSTRAP = r'''
# Everything the bootstrap needs is imported now, while the interpreter's files are surely
# readable (before privileges are dropped).
import ctypes, json, linecache, os, resource, signal, socket, sys, traceback

CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC = 32, 1024, 2048, 4096, 16384
MS_PRIVATE, MS_RELATIME = 1 << 18, 1 << 21
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS, PR_SET_CHILD_SUBREAPER = 1, 38, 36
libc = ctypes.CDLL(None, use_errno=True)
_RUNNING_CODE = [False]  # set once untrusted code runs: exits from then on are its own


def _check(ret, what):
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), what)


def _mount(src, target, fstype, flags, data=None):
    enc = lambda s: None if s is None else s.encode()
    _check(libc.mount(enc(src), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)),
           "mount " + target)


def _read_config(fd):
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(fd)
    return json.loads(b"".join(chunks))


def _make_reporter(status_fd, nonce):
    def report(kind, **fields):
        fields["kind"], fields["nonce"] = kind, nonce
        try:
            os.write(status_fd, (json.dumps(fields) + "\n").encode())
        except OSError:
            pass  # the code closed or clogged the pipe: the parent falls back to exit statuses
    return report


def _unescape(path):
    return path.encode().decode("unicode_escape")  # mountinfo writes " " as "\040"


def _blocked_ancestor(path):
    """Topmost ancestor of path that others cannot traverse, or None."""
    parts = path.strip("/").split("/")
    for i in range(1, len(parts)):
        anc = "/" + "/".join(parts[:i])
        if not os.stat(anc).st_mode & 0o001:
            return anc
    return None


def _setup_filesystem(cfg, modes):
    """In a new mount namespace: private /tmp and /dev/shm, needed trees reachable, rest read-only."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing we mount leaks back to the host
    # Trees the interpreter needs, opened before anything is mounted over their ancestors.
    keep = {}
    for p in cfg["python_paths"]:
        if not os.path.isdir(p) or any(p.startswith(k + "/") for k in keep):
            continue
        if p.startswith(("/tmp/", "/dev/shm/")):
            # A virtual environment under /tmp (a CI clone, say) would vanish under the private
            # /tmp: bind it back (read-only below) after the tmpfs is mounted.
            keep[p] = None
            continue
        anc = _blocked_ancestor(p)
        if anc is not None:
            keep[p] = anc
    fds = {p: os.open(p, os.O_RDONLY | os.O_DIRECTORY) for p in keep}
    size = "size=%dm" % cfg["disk_mb"]
    _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, size + ",mode=1777")
    os.mkdir(_WORKDIR, 0o700)
    if os.path.isdir("/dev/shm"):
        _mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, size + ",mode=1777")
    for anc in sorted({a for a in keep.values() if a is not None}):
        _mount("tmpfs", anc, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
    for p, fd in fds.items():
        os.makedirs(p, 0o755, exist_ok=True)
        _mount("/proc/self/fd/%d" % fd, p, None, MS_BIND | MS_REC)
        os.close(fd)
    if modes["processes"] == "pid_namespace":
        _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    flag_of = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC,
               "noatime": MS_NOATIME, "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME}
    failed = []
    with open("/proc/self/mountinfo") as f:
        lines = f.read().splitlines()
    for line in lines:
        fields = line.split()
        target, opts = _unescape(fields[4]), fields[5].split(",")
        if target in ("/tmp", "/dev/shm", "/proc") or target.startswith("/proc/"):
            continue
        if target.startswith(("/tmp/", "/dev/shm/")) and target not in keep:
            continue
        if "ro" in opts:
            continue
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY
        for o in opts:
            flags |= flag_of.get(o, 0)
        try:
            _mount(None, target, None, flags)
        except OSError:
            failed.append(target)
    modes["filesystem"] = "read-only + private /tmp" + (
        " (still writable: %s)" % ", ".join(failed) if failed else "")


def _set_limits(cfg):
    mb = 1 << 20
    cpu = int(cfg["cpu_s"] + 0.999)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    # Soft limit -> SIGXCPU; one second later the kernel's SIGKILL ends a process that ignores it.
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (cfg["memory_mb"] * mb,) * 2)
    resource.setrlimit(resource.RLIMIT_FSIZE, (cfg["file_size_mb"] * mb,) * 2)
    resource.setrlimit(resource.RLIMIT_NOFILE, (cfg["max_open_files"],) * 2)
    resource.setrlimit(resource.RLIMIT_NPROC, (cfg["nproc"],) * 2)


def _install_guard(forbidden, spawned):
    inet = (socket.AF_INET, socket.AF_INET6)
    spawn_events = ("os.fork", "os.forkpty", "os.posix_spawn", "os.exec", "os.system",
                    "subprocess.Popen", "os.spawn")

    def hook(event, args):
        if event in ("socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg"):
            if getattr(args[0], "family", None) in inet:
                forbidden.append("network: %s %r" % (event, args[1] if len(args) > 1 else ""))
                raise PermissionError(1, "network access is disabled in the sandbox")
        elif event in spawn_events:
            spawned.append(event)
    sys.addaudithook(hook)


def _run_code(cfg, report):
    """Runs in G, as the sandbox user, after every limit is in place."""
    _RUNNING_CODE[0] = True
    me = os.getpid()
    forbidden, spawned = [], []
    _install_guard(forbidden, spawned)
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    stages = [("solution", cfg["code"]), ("tests", cfg["tests"])]
    outcome, exit_code, stage = {"outcome": "completed"}, 0, "solution"
    try:
        for stage, source in stages:
            if source is None:
                continue
            name = "<%s>" % stage
            linecache.cache[name] = (len(source), None, source.splitlines(True), name)
            exec(compile(source, name, "exec"), namespace)
    except SystemExit as exc:
        code = exc.code
        exit_code = code if isinstance(code, int) else (0 if code is None else 1)
        if not isinstance(code, (int, type(None))):
            print(code, file=sys.stderr)
        outcome = {"outcome": "exit", "code": exit_code, "stage": stage}
    except BaseException as exc:
        # Drop this frame so the traceback starts at the code.
        traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next)
        exit_code = 1
        outcome = {"outcome": "exception", "type": type(exc).__name__, "stage": stage,
                   "message": str(exc)[:300], "errno": getattr(exc, "errno", None)}
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    if os.getpid() == me:  # processes the code forked end here too; only G reports
        outcome["forbidden"] = forbidden[:20]
        outcome["spawned"] = bool(spawned)
        report("outcome", **outcome)
    sys.exit(exit_code)


def _child(cfg, report):
    """G: the process that runs the code."""
    os.chdir(cfg["workdir"])
    os.environ.clear()
    os.environ.update(cfg["env"], HOME=cfg["workdir"], TMPDIR=cfg["workdir"], PWD=cfg["workdir"])
    _set_limits(cfg)
    if cfg["uid"] is not None:
        os.setgroups([])
        os.setresgid(cfg["gid"], cfg["gid"], cfg["gid"])
        os.setresuid(cfg["uid"], cfg["uid"], cfg["uid"])
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # after setuid, which clears it
    sys.stdout.reconfigure(errors="backslashreplace")
    sys.stderr.reconfigure(errors="backslashreplace")
    _run_code(cfg, report)


def _reaper(cfg, modes, report, newns):
    """C: init of the PID namespace (or a subreaper); starts G and reaps everything."""
    if modes["processes"] != "pid_namespace":
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    if newns:
        _setup_filesystem(cfg, modes)
        cfg["workdir"] = _WORKDIR
    elif cfg["uid"] is not None:
        modes["filesystem"] = "uid permissions only"
        # Without a mount namespace nothing can make an interpreter under, say, /root (0700)
        # readable by the sandbox uid; every import would fail, so refuse instead of lying.
        for p in cfg["python_paths"]:
            if os.path.isdir(p) and _blocked_ancestor(p) is not None:
                raise PermissionError(
                    "the interpreter's directory %s is not reachable by other users (%s is not "
                    "world-traversable), so the sandbox uid could not import anything; install "
                    "Python in a world-readable place or allow mount namespaces" % (p, _blocked_ancestor(p)))
    if cfg["uid"] is not None and newns:
        os.chown(_WORKDIR, cfg["uid"], cfg["gid"])
    report("setup", isolation=modes, workdir=cfg["workdir"])
    g = os.fork()
    if g == 0:
        _child(cfg, report)  # never returns: ends in sys.exit, which main() lets through
    while True:
        pid, status, usage = os.wait4(-1, 0)
        if pid == g:
            break
    report("exit", status=status, cpu_s=usage.ru_utime + usage.ru_stime)
    os._exit(0)  # as PID-namespace init, this kills whatever the code left running


def main():
    cfg = _read_config(int(sys.argv[1]))
    report = _make_reporter(int(sys.argv[2]), cfg.pop("nonce"))
    modes = {"user": "uid %d" % cfg["uid"] if cfg["uid"] is not None else "same uid as parent",
             "network": "audit hook", "filesystem": "none", "processes": "process group"}
    newns = False
    try:
        if cfg["namespaces"]:
            if libc.unshare(CLONE_NEWNET) == 0:
                modes["network"] = "namespace + audit hook"
            newns = libc.unshare(CLONE_NEWNS) == 0
            if libc.unshare(CLONE_NEWPID) == 0:
                modes["processes"] = "pid_namespace"
        c = os.fork()
        if c == 0:
            _reaper(cfg, modes, report, newns)
    except BaseException as exc:
        if _RUNNING_CODE[0]:
            raise  # the code's own exit (in G or a process it forked), not a setup failure
        report("setup_error", error="%s: %s" % (type(exc).__name__, exc))
        os._exit(123)
    _, status = os.waitpid(c, 0)
    os._exit(os.waitstatus_to_exitcode(status) & 0xFF)


_WORKDIR = "/tmp/sandbox"  # keep in sync with _NS_WORKDIR
main()
'''


# --------------------------------------------------------------------------------------------
# Parent side.
# --------------------------------------------------------------------------------------------
_uid_lock = threading.Lock()
_uids_in_use: set[int] = set()


def _processes() -> list[tuple[int, int, str, int]]:
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


def _allocate_uid() -> int:
    """A uid no process uses and no other run of this process holds."""
    busy = {uid for _, uid, _, _ in _processes()}
    with _uid_lock:
        while True:
            uid = _UID_BASE + random.randrange(_UID_SPAN)
            if uid not in busy and uid not in _uids_in_use:
                _uids_in_use.add(uid)
                return uid


def _release_uid(uid: int) -> None:
    with _uid_lock:
        _uids_in_use.discard(uid)


def live_processes_of_uid(uid: int) -> list[int]:
    """Pids of the processes (zombies excluded) running as ``uid``; used by tests and cleanup."""
    return [pid for pid, u, state, _ in _processes() if u == uid and state != "Z"]


def _kill_uid(uid: int, deadline_s: float = 3.0) -> None:
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


def _python_paths() -> list[str]:
    """Directories the child interpreter reads from (so they can be made reachable)."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(sys.executable)}
    paths.update(p for p in sys.path if p)
    paths.add(os.path.dirname(os.path.realpath(sys.executable)))
    return sorted({os.path.realpath(p) for p in paths if os.path.isdir(p)})


def _decode(data: bytearray) -> str:
    return bytes(data).decode("utf-8", errors="replace")


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


_OOM_MARKERS = ("MemoryError", "Cannot allocate memory", "std::bad_alloc", "out of memory")


def _decide(
    *,
    tests: bool,
    limits: SandboxLimits,
    killed_for: str | None,
    records: dict[str, dict],
    bootstrap_code: int,
    stderr: str,
) -> tuple[Status, int | None, str]:
    """The status, the code's return code and the detail line (see the module docstring)."""
    exit_rec = records.get("exit")
    outcome = records.get("outcome")
    returncode: int | None = None
    cpu = None
    if exit_rec is not None:
        returncode = os.waitstatus_to_exitcode(exit_rec["status"])
        cpu = exit_rec["cpu_s"]
    elif killed_for is None:
        returncode = bootstrap_code  # the exit record was lost (the code closed the pipe)

    if killed_for == "output_limit":
        return "output_limit", returncode, f"output passed max_output_bytes={limits.max_output_bytes}"
    if killed_for == "timeout":
        return "timeout", returncode, f"wall-clock limit of {limits.wall_s} s reached"
    if returncode is not None and returncode < 0:
        sig = -returncode
        if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu is not None and cpu >= limits.cpu_s):
            return "timeout", returncode, f"CPU limit of {limits.cpu_s} s reached ({_signal_name(sig)})"
    if outcome is not None:
        if outcome.get("forbidden"):
            return "forbidden", returncode, "blocked operation: " + "; ".join(outcome["forbidden"][:3])
        if outcome["outcome"] == "exception":
            kind, msg = outcome["type"], outcome.get("message", "")
            if kind == "BlockingIOError" and outcome.get("spawned"):
                return "forbidden", returncode, (
                    f"process limit reached (max_processes={limits.max_processes}): {msg}")
            if kind == "MemoryError":
                return "out_of_memory", returncode, (
                    f"MemoryError in the {outcome['stage']} (memory_mb={limits.memory_mb})")
            line = f"{kind}: {msg}".strip() + f" (in the {outcome['stage']})"
            return ("failed" if tests else "crashed"), returncode, line
    if returncode is not None and returncode < 0:
        if any(m in stderr for m in _OOM_MARKERS):
            return "out_of_memory", returncode, f"killed by {_signal_name(-returncode)} after an allocation failure"
        return "crashed", returncode, f"killed by {_signal_name(-returncode)}"
    if tests:
        if outcome is not None and outcome["outcome"] == "completed" and returncode == 0:
            return "passed", returncode, "solution and tests ran to completion"
        if outcome is not None and outcome["outcome"] == "exit":
            return "failed", returncode, (
                f"the {outcome['stage']} exited (code {outcome['code']}) before the tests finished")
        if any(m in stderr for m in _OOM_MARKERS):
            return "out_of_memory", returncode, "allocation failure"
        return "failed", returncode, f"exited with status {returncode} before the tests finished"
    if returncode == 0:
        return "passed", returncode, "exited with status 0"
    if any(m in stderr for m in _OOM_MARKERS):
        return "out_of_memory", returncode, "allocation failure"
    return "crashed", returncode, f"exited with status {returncode}"


def run_python(
    code: str,
    *,
    tests: str | None = None,
    stdin: str = "",
    limits: SandboxLimits = SandboxLimits(),
) -> SandboxResult:
    """Run untrusted ``code`` (then ``tests``, in the same namespace) in the sandbox.

    Args:
        code: The Python source to run (e.g. a model's solution).
        tests: Test code run after ``code`` in the same ``__main__`` namespace; it passes by
            running to its end (``assert`` statements, calls that raise on failure).
        stdin: Text fed to the code's standard input.
        limits: Resource limits.

    Returns:
        The :class:`SandboxResult`; everything the code does ends up there.

    Raises:
        SandboxError: The sandbox could not start the child, set it up or clean up after it.
        ConfigError: An argument has the wrong type.
    """
    if not isinstance(code, str):
        raise ConfigError(f"code must be a str, got {type(code).__name__}.")
    if tests is not None and not isinstance(tests, str):
        raise ConfigError(f"tests must be a str or None, got {type(tests).__name__}.")
    if not isinstance(stdin, str):
        raise ConfigError(f"stdin must be a str, got {type(stdin).__name__}.")
    if not isinstance(limits, SandboxLimits):
        raise ConfigError(f"limits must be a SandboxLimits, got {type(limits).__name__}.")
    return _Run(code, tests, stdin, limits).execute()


async def arun_python(
    code: str,
    *,
    tests: str | None = None,
    stdin: str = "",
    limits: SandboxLimits = SandboxLimits(),
) -> SandboxResult:
    """Async :func:`run_python`: the blocking work happens in a worker thread."""
    return await asyncio.to_thread(run_python, code, tests=tests, stdin=stdin, limits=limits)


class _Run:
    """One sandboxed run, parent side: spawn, pump pipes, enforce limits, clean up."""

    def __init__(self, code: str, tests: str | None, stdin: str, limits: SandboxLimits) -> None:
        self.code, self.tests, self.limits = code, tests, limits
        self.stdin = stdin.encode()
        self.root = os.geteuid() == 0

    def _nproc_limit(self) -> int:
        if self.root:
            return self.limits.max_processes  # a fresh uid owns nothing yet
        # Same uid as the caller: the limit counts all of its tasks, so leave room for them.
        mine = sum(t for _, uid, _, t in _processes() if uid == os.getuid())
        return mine + self.limits.max_processes

    def execute(self) -> SandboxResult:
        start = time.monotonic()
        uid = _allocate_uid() if self.root else None
        workdir = tempfile.mkdtemp(prefix="collab_env_sandbox_")
        try:
            if uid is not None:
                os.chown(workdir, uid, uid)  # used only when there is no mount namespace
            return self._execute(start, uid, workdir)
        finally:
            try:
                if uid is not None:
                    _kill_uid(uid)
            finally:
                if uid is not None:
                    _release_uid(uid)
                _remove_tree(workdir)

    def _execute(self, start: float, uid: int | None, workdir: str) -> SandboxResult:
        limits = self.limits
        nonce = secrets.token_hex(16)
        config = {
            "nonce": nonce, "code": self.code, "tests": self.tests, "workdir": workdir,
            "uid": uid, "gid": uid, "namespaces": self.root and limits.use_namespaces,
            "cpu_s": limits.cpu_s, "memory_mb": limits.memory_mb,
            "file_size_mb": limits.file_size_mb, "max_open_files": limits.max_open_files,
            "nproc": self._nproc_limit(), "disk_mb": limits.disk_mb,
            "python_paths": _python_paths(),
            "env": {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"},
        }
        cfg_r, cfg_w = os.pipe()
        st_r, st_w = os.pipe()
        argv = [sys.executable, "-I", "-B", "-c", _BOOTSTRAP,
                str(cfg_r), str(st_w)]
        try:
            proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                pass_fds=(cfg_r, st_w), cwd=workdir, env=dict(config["env"]),
                start_new_session=True,  # own session and process group: killpg reaches all
            )
        except OSError as exc:
            for fd in (cfg_r, cfg_w, st_r, st_w):
                os.close(fd)
            raise SandboxError(f"could not start the sandbox interpreter {sys.executable}: {exc}") from exc
        finally:
            if "proc" in locals():
                os.close(cfg_r)
                os.close(st_w)
        try:
            return self._supervise(proc, start, config, cfg_w, st_r, nonce, uid)
        finally:
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                if stream is not None and not stream.closed:
                    stream.close()

    def _supervise(self, proc, start, config, cfg_w, st_r, nonce, uid) -> SandboxResult:
        limits = self.limits
        out, err, status = bytearray(), bytearray(), bytearray()
        truncated = False
        killed_for: str | None = None
        sel = selectors.DefaultSelector()
        pending = {cfg_w: json.dumps(config).encode(), proc.stdin.fileno(): self.stdin}
        for fd in pending:
            os.set_blocking(fd, False)
            sel.register(fd, selectors.EVENT_WRITE, "write")
        targets = {proc.stdout.fileno(): out, proc.stderr.fileno(): err, st_r: status}
        for fd in targets:
            sel.register(fd, selectors.EVENT_READ, "read")
        try:
            pidfd = os.pidfd_open(proc.pid)
            sel.register(pidfd, selectors.EVENT_READ, "exit")
        except (AttributeError, OSError):
            pidfd = None  # old kernel: poll with waitid(WNOWAIT) instead
        deadline = start + limits.wall_s

        def close_writer(fd: int) -> None:
            sel.unregister(fd)
            if fd == cfg_w:
                os.close(fd)
            else:
                proc.stdin.close()

        def pump(timeout: float) -> bool:
            """One round of I/O; True when the bootstrap has exited."""
            nonlocal truncated, killed_for
            exited = False
            for key, _ in sel.select(timeout):
                fd = key.fd
                if key.data == "exit":
                    exited = True
                elif key.data == "write":
                    try:
                        n = os.write(fd, pending[fd][:1 << 16])
                        pending[fd] = pending[fd][n:]
                        done = not pending[fd]
                    except (BrokenPipeError, BlockingIOError) as exc:
                        done = isinstance(exc, BrokenPipeError)  # the code closed stdin: fine
                    if done:
                        close_writer(fd)
                else:
                    chunk = os.read(fd, 1 << 16)
                    if not chunk:
                        sel.unregister(fd)
                        continue
                    buf = targets[fd]
                    if fd == st_r:
                        buf += chunk[: max(0, _STATUS_CAP - len(buf))]
                        continue
                    room = limits.max_output_bytes - len(out) - len(err)
                    if room <= 0 and truncated:
                        continue  # draining a killed run
                    buf += chunk[: max(0, room)]
                    if len(chunk) > room:
                        truncated = True
                        if killed_for is None:
                            killed_for = "output_limit"
            if pidfd is None and not exited:
                exited = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
            return exited

        try:
            while killed_for is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    killed_for = "timeout"
                    break
                if pump(min(remaining, 0.05 if pidfd is None else remaining)):
                    break
            # Kill the whole group while the bootstrap is still unreaped (its pgid cannot be
            # recycled yet); with a PID namespace this also ends everything the code started.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass  # group already empty
            _, wait_status = os.waitpid(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(wait_status)
            if uid is not None:
                _kill_uid(uid)
            # Everyone holding the pipes is dead; read what is left (bounded, in case a process
            # of the same uid, in the non-root mode, escaped the group and keeps them open).
            drain_end = time.monotonic() + 1.0
            while [k for k in sel.get_map().values() if k.data == "read"] and time.monotonic() < drain_end:
                pump(0.05)
        finally:
            for key in list(sel.get_map().values()):
                if key.data == "write":
                    close_writer(key.fd)
            sel.close()
            if pidfd is not None:
                os.close(pidfd)
            os.close(st_r)

        records: dict[str, dict] = {}
        for line in bytes(status).decode("utf-8", "replace").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and rec.get("nonce") == nonce:
                records[rec.get("kind", "")] = rec  # the last one of each kind wins
        if "setup_error" in records:
            raise SandboxError(
                f"the sandbox could not set up the child: {records['setup_error'].get('error')}. "
                "Is the sandbox running as root inside a container without CAP_SYS_ADMIN/CAP_SETUID? "
                "Set SandboxLimits(use_namespaces=False) or run with those capabilities."
            )
        if "setup" not in records and killed_for is None:
            raise SandboxError(
                f"the sandbox bootstrap exited with status {proc.returncode} before starting the code; "
                f"stderr: {_decode(err)[-2000:]!r}"
            )
        stderr = _decode(err)
        status_, returncode, detail = _decide(
            tests=self.tests is not None, limits=limits, killed_for=killed_for, records=records,
            bootstrap_code=proc.returncode, stderr=stderr,
        )
        isolation = records.get("setup", {}).get("isolation", {})
        return SandboxResult(
            status=status_, returncode=returncode, stdout=_decode(out), stderr=stderr,
            duration_s=time.monotonic() - start, truncated=truncated, detail=detail,
            isolation=dict(isolation), uid=uid if uid is not None else os.getuid(),
        )


def _remove_tree(path: str) -> None:
    """Delete the sandbox directory, even if the code made parts of it unreadable."""

    def fix_and_retry(func, p, _exc):
        os.chmod(os.path.dirname(p), stat.S_IRWXU)
        if os.path.isdir(p) and not os.path.islink(p):
            os.chmod(p, stat.S_IRWXU)
        func(p)

    try:
        shutil.rmtree(path, onerror=fix_and_retry)
    except OSError as exc:
        raise SandboxError(f"could not remove the sandbox directory {path}: {exc}") from exc


class SandboxPool:
    """Runs many sandboxed programs at once, at most ``max_workers`` at a time.

    Each run blocks a worker thread on ``select``; the real work is in child processes, so
    threads are cheap here and keep the pool usable from sync and async code alike.

    Args:
        max_workers: Most runs in flight (default: the number of CPUs).
        limits: Default limits for runs that do not give their own.
    """

    def __init__(self, max_workers: int | None = None, *, limits: SandboxLimits = SandboxLimits()) -> None:
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

"""Running one program in the sandbox: :func:`run_python` and :func:`arun_python`.

The parent side of one run: it allocates the uid and the sandbox directory, starts the bootstrap
(the guest program :mod:`collab_env.sandbox.guest.bootstrap`, read as text) in a new session,
feeds it its config and stdin, pumps its output and status pipes while enforcing the wall-clock
and output limits, kills the whole tree, cleans up, and turns what it saw into a
:class:`SandboxResult` (:func:`collab_env.sandbox.verdict.decide`).
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time

from collab_env._json import depth_problem
from collab_env.errors import ConfigError, SandboxError
from collab_env.sandbox.cgroup import MemoryGroup
from collab_env.sandbox.config import SandboxLimits, SandboxResult
from collab_env.sandbox.guest import program
from collab_env.sandbox.processes import allocate_uid, kill_uid, list_processes, release_uid
from collab_env.sandbox.verdict import decide

__all__ = ["run_python", "arun_python", "run_driver"]

_STATUS_CAP = 1 << 20  # bytes of status records kept; more is the code writing garbage


def _python_paths() -> list[str]:
    """Directories the child interpreter reads from (so they can be made reachable)."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(sys.executable)}
    paths.update(p for p in sys.path if p)
    paths.add(os.path.dirname(os.path.realpath(sys.executable)))
    return sorted({os.path.realpath(p) for p in paths if os.path.isdir(p)})


def _hidden_paths(limits: SandboxLimits) -> tuple[str, ...]:
    """``limits.hidden_paths``, or the default answer-key set, as real existing directories."""
    from collab_env.sandbox.config import default_hidden_paths

    paths = default_hidden_paths() if limits.hidden_paths is None else limits.hidden_paths
    return tuple(sorted({os.path.realpath(p) for p in paths if os.path.isdir(p)}))


def _decode(data: bytearray) -> str:
    return bytes(data).decode("utf-8", errors="replace")


def run_python(
    code: str,
    *,
    tests: str | None = None,
    stdin: str = "",
    limits: SandboxLimits = SandboxLimits(),  # noqa: B008 - frozen, so one shared default is safe
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
    limits: SandboxLimits = SandboxLimits(),  # noqa: B008 - frozen, so one shared default is safe
) -> SandboxResult:
    """Async :func:`run_python`: the blocking work happens in a worker thread."""
    return await asyncio.to_thread(run_python, code, tests=tests, stdin=stdin, limits=limits)


def run_driver(
    code: str, limits: SandboxLimits, *, driver: str, config: dict, pass_fds: tuple[int, ...] = ()
) -> tuple[SandboxResult, dict[str, dict]]:
    """One sandboxed run of a :mod:`collab_env.sandbox.harness` driver instead of code then tests.

    ``driver`` is the driver's source (a guest program, :func:`collab_env.sandbox.guest.program`,
    run where the code would run, as the sandbox user, after every limit); ``config`` its extra
    config keys; ``pass_fds`` the channel fds it talks on (closed here once the child holds them).
    Returns the result and the run's signed status records by kind (the driver's own records among
    them).
    """
    run = _Run(code, None, "", limits, extra={**config, "driver": driver}, pass_fds=pass_fds)
    return run.execute(), run.records


class _Run:
    """One sandboxed run, parent side: spawn, pump pipes, enforce limits, clean up."""

    def __init__(self, code: str, tests: str | None, stdin: str, limits: SandboxLimits, *,
                 extra: dict | None = None, pass_fds: tuple[int, ...] = ()) -> None:
        self.code, self.tests, self.limits = code, tests, limits
        self.stdin = stdin.encode()
        self.root = os.geteuid() == 0
        # collab_env.sandbox.harness: a driver (config keys "driver", ...) and the channel fds it
        # talks on; the fds are closed here once the child holds them.
        self.extra, self.pass_fds = dict(extra or {}), tuple(pass_fds)
        self.records: dict[str, dict] = {}

    def _nproc_limit(self) -> int:
        if self.root:
            return self.limits.max_processes  # a fresh uid owns nothing yet
        # Same uid as the caller: the limit counts all of its tasks, so leave room for them.
        mine = sum(t for _, uid, _, t in list_processes() if uid == os.getuid())
        return mine + self.limits.max_processes

    def execute(self) -> SandboxResult:
        start = time.monotonic()
        uid = allocate_uid() if self.root else None
        workdir = tempfile.mkdtemp(prefix="collab_env_sandbox_")
        try:
            if uid is not None:
                os.chown(workdir, uid, uid)  # used only when there is no mount namespace
            return self._execute(start, uid, workdir)
        finally:
            try:
                if uid is not None:
                    kill_uid(uid)
            finally:
                if uid is not None:
                    release_uid(uid)
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
            "hidden_paths": list(_hidden_paths(limits)),
        }
        config.update(self.extra)
        cfg_r, cfg_w = os.pipe()
        st_r, st_w = os.pipe()
        argv = [sys.executable, "-I", "-B", "-c", program("bootstrap"), str(cfg_r), str(st_w)]
        # The whole run's memory bound (collab_env.sandbox.cgroup): the bootstrap joins the group
        # before it reads its config, so everything the code starts is inside.
        group = MemoryGroup(limits.memory_mb, "collab_env_sandbox_" + nonce[:16])
        if self.root:
            group.create()
        try:
            return self._spawn(argv, config, cfg_r, cfg_w, st_r, st_w, nonce, uid, workdir, start, group)
        finally:
            group.remove()

    def _spawn(self, argv, config, cfg_r, cfg_w, st_r, st_w, nonce, uid, workdir, start, group) -> SandboxResult:
        try:
            proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                pass_fds=(cfg_r, st_w, *self.pass_fds), cwd=workdir, env=dict(config["env"]),
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
            for fd in self.pass_fds:
                os.close(fd)
        group.add(proc.pid)
        self.group = group
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
                kill_uid(uid)
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
            # The guest's code can write to this pipe too: a line nested too deep for json's
            # recursion (a RecursionError, not a ValueError) is dropped like any unreadable one.
            if depth_problem(line) is not None:
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and rec.get("nonce") == nonce:
                records[rec.get("kind", "")] = rec  # the last one of each kind wins
        self.records = records
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
        status_, returncode, detail = decide(
            tests=self.tests is not None, limits=limits, killed_for=killed_for, records=records,
            bootstrap_code=proc.returncode, stderr=stderr, oom_killed=self.group.oom_killed(),
        )
        isolation = dict(records.get("setup", {}).get("isolation", {}))
        isolation["memory"] = self.group.mode
        if config["hidden_paths"] and "hidden" not in isolation:
            isolation["hidden"] = "not hidden (no mount namespace): " + ", ".join(config["hidden_paths"])
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

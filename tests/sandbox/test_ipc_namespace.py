"""Issue 43 finding 7: SysV IPC objects a program creates must not outlive its run on the host.

Without an IPC namespace a ``shmget``/``msgget`` segment or queue stays in the host's kernel after
the sandboxed process is gone: host memory leaked at every sample, and a channel from one run to
the next. The bootstrap unshares the IPC namespace (as root) and says so in ``isolation["ipc"]``.
"""

from __future__ import annotations

import os
import secrets
import sys

import pytest

from collab_env.sandbox import SandboxLimits, run_python

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox needs Linux"),
    pytest.mark.skipif(os.geteuid() != 0, reason="an IPC namespace needs root"),
    pytest.mark.skipif(not os.path.exists("/proc/sysvipc/shm"), reason="no /proc/sysvipc here"),
]

# Creates one SysV shared memory segment and one message queue under the given key, and leaves
# them (no IPC_RMID): the kernel keeps both until someone removes them or their namespace dies.
PROGRAM = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
IPC_CREAT = 0o1000
shm = libc.shmget({key}, 1 << 20, IPC_CREAT | 0o666)
msg = libc.msgget({key}, IPC_CREAT | 0o666)
print(shm, msg)
"""


def _host_keys(kind: str) -> set[int]:
    with open(f"/proc/sysvipc/{kind}") as f:
        rows = f.read().splitlines()[1:]
    return {int(r.split()[0]) for r in rows if r.strip()}


def _remove_host_objects(key: int) -> None:
    """Clean up after a sandbox that leaked (today's main): ipcrm by key, through libc."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    shm = libc.shmget(key, 0, 0)
    if shm >= 0:
        libc.shmctl(shm, 0, None)  # IPC_RMID
    msg = libc.msgget(key, 0)
    if msg >= 0:
        libc.msgctl(msg, 0, None)  # IPC_RMID


def test_sysv_shared_memory_and_message_queues_are_gone_after_the_run():
    key = 0x4C000000 + secrets.randbelow(1 << 24)
    try:
        r = run_python(PROGRAM.format(key=key), limits=SandboxLimits(cpu_s=4, wall_s=8))
        assert r.status == "passed", r
        shm_id, msg_id = (int(x) for x in r.stdout.split())
        assert shm_id >= 0 and msg_id >= 0, r.stdout  # the program did create both
        assert key not in _host_keys("shm"), "the shared memory segment outlived the run"
        assert key not in _host_keys("msg"), "the message queue outlived the run"
        assert r.isolation["ipc"] == "namespace", r.isolation
    finally:
        _remove_host_objects(key)


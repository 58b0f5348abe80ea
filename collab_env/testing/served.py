"""A served env in its own process, for tests and benchmarks: ``collab-env serve ID --port 0``
started as a subprocess, its URL read from the line it announces, stopped on exit."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator

__all__ = ["served", "server_process", "open_sessions"]


@contextlib.contextmanager
def served(env_id: str, *args: str, timeout: float = 180.0, cwd: str | None = None) -> Iterator[str]:
    """``collab-env serve env_id ARGS --port 0`` in a subprocess; yields its URL
    (``http://127.0.0.1:PORT``). The process is terminated (then killed) on exit; its output is
    kept for the error when it fails to start."""
    with server_process([sys.executable, "-m", "collab_env.cli", "serve", env_id, "--port", "0", *args],
                        timeout=timeout, cwd=cwd) as url:
        yield url


@contextlib.contextmanager
def server_process(command: list[str], *, timeout: float = 180.0, cwd: str | None = None) -> Iterator[str]:
    """Run ``command`` (a server that prints ``serving ... on http://HOST:PORT ...`` once it
    listens, as ``collab-env serve`` does) and yield that URL; terminate it on exit."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=cwd)
    lines: list[str] = []
    url: list[str] = []
    ready = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("serving ") and " on http://" in line and not url:
                url.append(line.split(" on ", 1)[1].split()[0])
                ready.set()
        ready.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        if not ready.wait(timeout) or not url:
            raise RuntimeError(f"{command[:6]} did not start within {timeout:.0f} s:\n" + "".join(lines))
        yield url[0]
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def open_sessions(url: str, *, settle: float = 5.0) -> int:
    """The server's open sessions (``GET /sessions``), after waiting up to ``settle`` seconds for
    it to reach 0 (a closed connection is cleaned up asynchronously)."""
    deadline = time.monotonic() + settle
    while True:
        with urllib.request.urlopen(url + "/sessions", timeout=10) as r:  # noqa: S310 - a local test server
            active = int(json.loads(r.read())["active"])
        if active == 0 or time.monotonic() > deadline:
            return active
        time.sleep(0.1)

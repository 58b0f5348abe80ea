"""The candidate server: runs in the candidate's sandbox; holds no test and no expected value.

A guest program (see :mod:`collab_env.sandbox.guest`): the host runs ``codec.py``'s text followed
by this file's as the driver of a sandboxed run (:func:`collab_env.sandbox.run.run_driver`), so
:func:`encode_value` and :func:`decode_value` are defined above it, and the bootstrap puts the run's
``_DRIVER`` (its config and status reporter) in its namespace. It loads the candidate's program,
then answers call requests (a function name and plain-data arguments) on ``req_fd``, each in a
process forked for it and killed at ``call_timeout_s``, with plain-data replies on ``rep_fd``.
"""

import json as _json
import linecache as _lc
import os as _os
import select as _select
import signal as _signal
import sys as _sys
import time as _time
import traceback as _tb

TYPE_CHECKING = False
if TYPE_CHECKING:  # what the host and the bootstrap define before this text runs
    from typing import Any

    from collab_env.sandbox.guest.codec import decode_value, encode_value

    _DRIVER: dict[str, Any] = {}

_time_now = _time.monotonic  # bound before the program loads, which may patch time.monotonic


def _send(obj):
    data = (_json.dumps(obj, allow_nan=False) + "\n").encode()
    while data:
        data = data[_os.write(_REP, data):]


def _answer(ns, req):
    """In the forked call process: the reply line for one request."""
    n = req.get("id")
    try:
        name = req["fn"]
        if name not in ns:
            raise NameError(f"name {name!r} is not defined")
        args, kwargs = decode_value(req["args"]), decode_value(req["kwargs"])
        value = ns[name](*args, **kwargs)
        try:
            rep = {"id": n, "value": encode_value(value)}
        except (TypeError, RecursionError) as exc:
            return _json.dumps({"id": n, "unplain": True, "raised": "CandidateError",
                                "message": f"the result of {name}(...) cannot cross to the tests: {str(exc)[:300]}"})
        if req.get("mutable"):
            # The arguments as the call left them, so the trusted side can mirror an in-place
            # change (`f(xs); assert xs == ...`); arguments that no longer encode stay as sent.
            try:
                rep["after"] = encode_value([args, kwargs])
            except BaseException:
                pass
        return _json.dumps(rep, allow_nan=False)
    except BaseException as exc:
        try:
            msg = str(exc)[:2000]
        except BaseException:
            msg = "(unprintable)"
        try:
            return _json.dumps({"id": n, "raised": type(exc).__name__[:100], "message": msg})
        except BaseException:
            return _json.dumps({"id": n, "raised": "CandidateError", "message": "unprintable error"})


def _call(ns, req):
    r, w = _os.pipe()
    pid = _os.fork()
    if pid == 0:
        _os.close(r)
        line = _answer(ns, req)
        try:
            _sys.stdout.flush()
        except BaseException:
            pass
        data = (line + "\n").encode()
        while data:
            data = data[_os.write(w, data):]
        _os._exit(0)
    _os.close(w)
    pidfd = _os.pidfd_open(pid)
    got, deadline = bytearray(), _time_now() + _LIMIT
    status, killed = 0, ""  # the call process's wait status, or why it was killed
    open_r = True
    while True:
        left = deadline - _time_now()
        if left <= 0:
            _os.kill(pid, _signal.SIGKILL)
            _os.waitpid(pid, 0)
            killed = "timeout"
            break
        ready = _select.select(([r] if open_r else []) + [pidfd], [], [], left)[0]
        if r in ready:
            chunk = _os.read(r, 1 << 16)
            if chunk:
                got += chunk
                if len(got) > (16 << 20):
                    _os.kill(pid, _signal.SIGKILL)
                    _os.waitpid(pid, 0)
                    killed = "too large"
                    break
            else:
                open_r = False
        if pidfd in ready and not open_r:
            status = _os.waitpid(pid, 0)[1]
            break
        if pidfd in ready and open_r:
            # exited; drain what is left in the pipe
            while True:
                chunk = _os.read(r, 1 << 16)
                if not chunk:
                    break
                got += chunk
            status = _os.waitpid(pid, 0)[1]
            break
    _os.close(r)
    _os.close(pidfd)
    n = req.get("id")
    if killed == "timeout":
        return _send({"id": n, "timeout": True})
    if killed == "too large":
        return _send({"id": n, "raised": "CandidateError", "message": "the result is larger than 16 MiB"})
    if _os.WIFSIGNALED(status) and _os.WTERMSIG(status) in (_signal.SIGXCPU, _signal.SIGKILL):
        return _send({"id": n, "timeout": True})
    line = bytes(got).strip()
    if line and b"\n" not in line:
        data = line + b"\n"
        while data:
            data = data[_os.write(_REP, data):]
        return None
    return _send({"id": n, "raised": "CandidateError",
                  "message": f"the call ended its process (wait status {status}) without an answer"})


def _serve():
    ns = {"__name__": "__main__", "__builtins__": __builtins__}
    load_error = None
    _lc.cache["<solution>"] = (len(_code), None, _code.splitlines(True), "<solution>")
    try:
        exec(compile(_code, "<solution>", "exec"), ns)
    except SystemExit:
        raise
    except BaseException as exc:
        _tb.print_exception(type(exc), exc, exc.__traceback__)
        load_error = f"{type(exc).__name__}: {str(exc)[:500]}"
    _load_report("load", error=load_error)  # for the caller's message only; it decides nothing
    buf = bytearray()
    while True:
        while b"\n" not in buf:
            chunk = _os.read(_REQ, 1 << 16)
            if not chunk:
                return
            buf += chunk
        i = buf.index(b"\n")
        line, buf = bytes(buf[:i]), buf[i + 1:]
        req = _json.loads(line)
        if req.get("op") == "quit":
            return
        if load_error is not None:
            _send({"id": req.get("id"), "raised": load_error.partition(":")[0],
                   "message": "the program did not load: " + load_error})
            continue
        _call(ns, req)


if __name__ == "__main__":  # as the driver (importing this module runs nothing)
    _spec = _DRIVER["cfg"]["serve"]
    _REQ, _REP, _LIMIT = _spec["req_fd"], _spec["rep_fd"], _spec["call_timeout_s"]
    _code = _DRIVER["cfg"]["code"]
    _load_report = _DRIVER["report"]
    del _DRIVER
    _serve()

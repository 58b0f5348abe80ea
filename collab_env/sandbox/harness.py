"""Scoring code where the candidate cannot reach: :func:`run_tests` and :func:`arun_tests`.

The verdict of a code reward must not depend on anything the candidate's program can touch
(DESIGN.md, "Integrity"). :func:`run_tests` runs a candidate program against its tests in one
of two ways, picked from the tests (``style="auto"``):

Function-call tests (``style="calls"``: assert scripts, HumanEval's ``check(candidate)``, per-assert lists)
    Two sandboxed processes, each with the run's :class:`~collab_env.sandbox.SandboxLimits`:

    * the **candidate server** runs only the candidate program. It never receives a test or an
      expected value: only call requests (a function name and argument values). Each call runs
      in a process forked for it (killed at the call's time limit), and its result goes back as
      plain data (a tagged JSON tree of ``None``, ``bool``, ``int``, ``float`` including
      ``nan``/``inf``, ``str``, ``bytes``, ``complex``, lists, tuples, sets, frozensets and
      dicts), never pickle. An exception comes back as its type name and message.
    * the **harness** runs only trusted text: the test code and a trusted prelude (for
      HumanEval, the helper functions and imports of the problem's prompt, such as ``poly``
      of HumanEval/32). Every name the tests use that neither they nor the prelude define,
      and the entry point, is a proxy that calls the server. The harness decodes each reply
      into fresh plain objects, so every comparison runs on values the candidate's code
      never held: an always-equal object cannot cross (its class is no plain type, so the
      call raises ``CandidateError`` and the test fails). A builtin exception is re-raised
      as that builtin class (so ``try/except ValueError`` tests work), any other as
      :class:`CandidateError`; a call past its time limit raises ``TimeoutError`` there.
      The harness never imports or executes candidate text; it runs in its own sandbox so
      that a test with an endless loop cannot hang the caller.

    Each string of ``tests`` is one test (a HumanEval ``check`` program is one test; CoMLRL's
    asserts, one each). Patched builtins, forged status records, frame walks and exits stay
    in the candidate's processes, where they decide nothing.

Same-process unittest suites (``style="unittest"``: ``class TestCases(unittest.TestCase)``, as in BigCodeBench)
    Such tests patch the candidate's module with mocks, so they must run beside it. The test
    methods are found in the trusted parent from the test text's syntax tree (a suite with no
    test method is an ``"error"``, never a pass), and each method runs in a fresh sandboxed
    process: the runner is set up before the candidate's code (saved references to
    ``unittest``'s machinery and the writer of its result record, an audit hook that refuses
    tracing, ``gc`` object walks, ``ctypes`` and reads of ``/proc/*/mem``), then the program,
    then the tests; after the program the runner restores ``builtins``, ``unittest``'s classes
    and the core ``sys.modules`` entries, and after the method it fails the method if any of
    them changed again, if a thread is left running, if a refused operation was tried, if the
    method was skipped or if the process exits before the runner reports. ``pass_rate`` is
    passed methods over found methods.

    **Residual risk.** The candidate shares that process with the runner: a program written to
    attack this runner can walk its own frame's ``f_back`` chain (``sys._getframe`` cannot be
    refused: ``logging``, ``typing`` and ``collections`` use it) to the runner's frame and call
    its result writer, or rebind unittest internals between the runner's checks, and so forge a
    pass. That needs code aimed at this runner; the generic families (patching ``unittest``, a
    skip of every test, ``SkipTest`` at import, exits, always-equal returns, forged prints) fail.
    Function-call tests have no such risk; prefer them where the tests allow.

No answer key is reachable from either process: every sandboxed run hides
:func:`~collab_env.sandbox.config.default_hidden_paths` (``SandboxLimits.hidden_paths``).
"""

from __future__ import annotations

import ast
import asyncio
import builtins
import contextlib
import contextvars
import dataclasses
import hashlib
import os
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Literal

from collab_env.errors import ConfigError, SandboxError
from collab_env.sandbox.config import SandboxLimits, SandboxResult
from collab_env.sandbox.pyparse import parse_python

__all__ = [
    "TestOutcome",
    "TestRunResult",
    "run_tests",
    "arun_tests",
    "reuse_test_results",
    "find_unittest_methods",
    "test_style",
    "prompt_prelude",
    "encode_value",
    "decode_value",
]

Style = Literal["auto", "calls", "unittest"]
TestStatus = Literal["passed", "failed", "timeout", "not_run"]

# ---------------------------------------------------------------------------------------------
# The plain-data codec: the same source runs in the server (encode), the harness (decode) and here.
# ---------------------------------------------------------------------------------------------
_CODEC = r'''
import json as _json, math as _math

_TAGS = ("t", "s", "fs", "d", "f", "c", "b", "ba")


def encode_value(x, _depth=0):
    """x as a JSON-able tree of plain data; TypeError for anything else."""
    if _depth > 200:
        raise TypeError("value nested too deeply")
    if x is None or x is True or x is False:
        return x
    t = type(x)
    if isinstance(x, int) and t is not bool:
        return int.__int__(x) if t is not int else x
    if isinstance(x, float):
        v = float.__float__(x)
        return v if _math.isfinite(v) else {"f": repr(v)}
    if isinstance(x, str):
        return str.__str__(x)
    if isinstance(x, complex):
        return {"c": [encode_value(complex.__getattribute__(x, "real")),
                      encode_value(complex.__getattribute__(x, "imag"))]}
    if isinstance(x, bytes):
        return {"b": bytes.hex(x)}
    if isinstance(x, bytearray):
        return {"ba": bytearray.hex(x)}
    if isinstance(x, list):
        return [encode_value(v, _depth + 1) for v in list.__iter__(x)]
    if isinstance(x, tuple):
        return {"t": [encode_value(v, _depth + 1) for v in tuple.__iter__(x)]}
    if isinstance(x, frozenset):
        return {"fs": [encode_value(v, _depth + 1) for v in frozenset.__iter__(x)]}
    if isinstance(x, set):
        return {"s": [encode_value(v, _depth + 1) for v in set.__iter__(x)]}
    if isinstance(x, dict):
        return {"d": [[encode_value(k, _depth + 1), encode_value(v, _depth + 1)]
                      for k, v in dict.items(x)]}
    if type(x).__module__ == "numpy" and hasattr(x, "tolist"):
        return encode_value(x.tolist(), _depth + 1)  # numpy scalars and arrays, by value
    raise TypeError("a %s is not plain data" % t.__name__)


def decode_value(tree, _depth=0):
    """Fresh plain objects from an encoded tree; ValueError for anything malformed."""
    if _depth > 200:
        raise ValueError("value nested too deeply")
    t = type(tree)
    if tree is None or t in (bool, int, float, str):
        return tree
    if t is list:
        return [decode_value(v, _depth + 1) for v in tree]
    if t is not dict or len(tree) != 1:
        raise ValueError("malformed value")
    (tag, v), = tree.items()
    if tag == "f" and v in ("nan", "inf", "-inf"):
        return float(v)
    if tag in ("b", "ba") and type(v) is str:
        return (bytes if tag == "b" else bytearray).fromhex(v)
    if type(v) is not list:
        raise ValueError("malformed value")
    if tag == "c" and len(v) == 2:
        re_, im = (decode_value(p, _depth + 1) for p in v)
        if type(re_) is not float and type(re_) is not int or type(im) is not float and type(im) is not int:
            raise ValueError("malformed complex")
        return complex(re_, im)
    items = [decode_value(p, _depth + 1) for p in v]
    if tag == "t":
        return tuple(items)
    if tag == "s":
        return set(items)
    if tag == "fs":
        return frozenset(items)
    if tag == "d":
        if not all(type(p) is list and len(p) == 2 for p in items):
            raise ValueError("malformed dict")
        return {k: val for k, val in items}
    raise ValueError("malformed value")
'''

_codec_ns: dict = {}
exec(compile(_CODEC, "<collab_env.sandbox.harness codec>", "exec"), _codec_ns)
encode_value = _codec_ns["encode_value"]
encode_value.__doc__ = "Encode a plain value as the harness's JSON-able tree (``TypeError`` for anything else)."
decode_value = _codec_ns["decode_value"]
decode_value.__doc__ = "Decode a tree from :func:`encode_value` into fresh plain objects (``ValueError`` if malformed)."

# ---------------------------------------------------------------------------------------------
# The candidate server: runs in the candidate's sandbox; holds no test and no expected value.
# ---------------------------------------------------------------------------------------------
_SERVE = _CODEC + r'''
import os as _os, select as _select, signal as _signal, sys as _sys, traceback as _tb, linecache as _lc

_spec = _DRIVER["cfg"]["serve"]
_REQ, _REP, _LIMIT = _spec["req_fd"], _spec["rep_fd"], _spec["call_timeout_s"]
_code = _DRIVER["cfg"]["code"]
_load_report = _DRIVER["report"]
del _DRIVER


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
            raise NameError("name %r is not defined" % name)
        value = ns[name](*decode_value(req["args"]), **decode_value(req["kwargs"]))
        return _json.dumps({"id": n, "value": encode_value(value)}, allow_nan=False)
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
    got, deadline, status = bytearray(), _time_now() + _LIMIT, None
    open_r = True
    while True:
        left = deadline - _time_now()
        if left <= 0:
            _os.kill(pid, _signal.SIGKILL)
            _os.waitpid(pid, 0)
            status = "timeout"
            break
        ready = _select.select(([r] if open_r else []) + [pidfd], [], [], left)[0]
        if r in ready:
            chunk = _os.read(r, 1 << 16)
            if chunk:
                got += chunk
                if len(got) > (16 << 20):
                    _os.kill(pid, _signal.SIGKILL)
                    _os.waitpid(pid, 0)
                    status = "too large"
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
    if status == "timeout":
        return _send({"id": n, "timeout": True})
    if status == "too large":
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
                  "message": "the call ended its process (wait status %d) without an answer" % status})


def _serve():
    import time
    global _time_now
    _time_now = time.monotonic
    ns = {"__name__": "__main__", "__builtins__": __builtins__}
    load_error = None
    _lc.cache["<solution>"] = (len(_code), None, _code.splitlines(True), "<solution>")
    try:
        exec(compile(_code, "<solution>", "exec"), ns)
    except SystemExit:
        raise
    except BaseException as exc:
        _tb.print_exception(type(exc), exc, exc.__traceback__)
        load_error = "%s: %s" % (type(exc).__name__, str(exc)[:500])
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


_serve()
'''

# ---------------------------------------------------------------------------------------------
# The harness: runs the trusted tests against proxies; never sees candidate text.
# ---------------------------------------------------------------------------------------------
_HARNESS = _CODEC + r'''
import builtins as _builtins, linecache as _lc, os as _os, re as _re, select as _select
import sys as _sys, time as _time, traceback as _tb

_cfg, _report = _DRIVER["cfg"], _DRIVER["report"]
_spec = _cfg["harness"]
_REQ, _REP = _spec["req_fd"], _spec["rep_fd"]


class CandidateError(Exception):
    """The candidate raised a non-builtin exception, or could not answer a call."""


class _State:
    next_id = 0
    dead = None
    timed_out = False
    buf = bytearray()


def _readline(deadline):
    while True:
        i = _State.buf.find(b"\n")
        if i >= 0:
            line = bytes(_State.buf[:i])
            del _State.buf[:i + 1]
            return line
        if len(_State.buf) > (17 << 20):
            raise CandidateError("the candidate sent an oversized reply")
        left = deadline - _time.monotonic()
        if left <= 0 or not _select.select([_REP], [], [], left)[0]:
            raise TimeoutError("the candidate's process stopped answering")
        chunk = _os.read(_REP, 1 << 16)
        if not chunk:
            raise EOFError
        _State.buf += chunk


def _call(name, args, kwargs):
    if _State.dead is not None:
        raise CandidateError(_State.dead)
    _State.next_id += 1
    n = _State.next_id
    try:
        req = _json.dumps({"op": "call", "id": n, "fn": name, "args": encode_value(list(args)),
                           "kwargs": encode_value(dict(kwargs))}, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise TypeError("an argument of %s(...) is not plain data: %s" % (name, exc)) from None
    data = (req + "\n").encode()
    try:
        while data:
            data = data[_os.write(_REQ, data):]
    except OSError:
        _State.dead = "the candidate's process has ended"
        raise CandidateError(_State.dead) from None
    deadline = _time.monotonic() + _spec["call_timeout_s"] + 2.0
    while True:
        try:
            line = _readline(deadline)
        except EOFError:
            _State.dead = "the candidate's process has ended"
            raise CandidateError(_State.dead) from None
        except TimeoutError:
            _State.dead = "the candidate's process stopped answering"
            _State.timed_out = True
            raise
        try:
            rep = _json.loads(line)
        except ValueError:
            raise CandidateError("the candidate sent a malformed reply") from None
        if type(rep) is dict and rep.get("id") == n:
            break
    if "value" in rep:
        try:
            return decode_value(rep["value"])
        except (ValueError, TypeError, RecursionError) as exc:
            raise CandidateError("the result of %s(...) is malformed: %s" % (name, exc)) from None
    if rep.get("timeout") is True:
        _State.timed_out = True
        raise TimeoutError("%s(...) ran past its time limit of %s s" % (name, _spec["call_timeout_s"]))
    kind, msg = str(rep.get("raised"))[:100], str(rep.get("message"))[:2000]
    cls = getattr(_builtins, kind, None) if _re.fullmatch(r"[A-Za-z_]\w*", kind) else None
    if isinstance(cls, type) and issubclass(cls, Exception) and cls.__module__ == "builtins":
        try:
            exc = cls(msg)
        except Exception:
            exc = CandidateError("%s: %s" % (kind, msg))
    else:
        exc = CandidateError("%s: %s" % (kind, msg))
    raise exc


class Candidate:
    """A callable that runs the candidate's function of this name in the candidate's process."""

    def __init__(self, name):
        self.__name__ = name

    def __call__(self, *args, **kwargs):
        return _call(self.__name__, args, kwargs)

    def __repr__(self):
        return "<candidate %s>" % self.__name__


def _run():
    base = {"__name__": "__main__", "__builtins__": _builtins, "CandidateError": CandidateError}
    prelude = _spec["prelude"]
    if prelude:
        _lc.cache["<prelude>"] = (len(prelude), None, prelude.splitlines(True), "<prelude>")
        exec(compile(prelude, "<prelude>", "exec"), base)
    for name in _spec["names"]:
        base[name] = Candidate(name)
    timeouts = 0
    for i, src in enumerate(_spec["tests"]):
        rec = {"index": i}
        if timeouts >= _spec["max_timeouts"]:
            rec.update(status="not_run", detail="not run: %d earlier tests timed out" % timeouts)
            _report("test:%d" % i, **rec)
            continue
        fname = "<test %d>" % i
        _lc.cache[fname] = (len(src), None, src.splitlines(True), fname)
        _State.timed_out = False
        try:
            exec(compile(src, fname, "exec"), dict(base))
            rec.update(status="passed", detail="")
        except SystemExit as exc:
            rec.update(status="failed", detail="the test exited (code %r)" % (exc.code,))
        except BaseException as exc:
            timed = _State.timed_out and isinstance(exc, TimeoutError)
            timeouts += timed
            lines = [f.lineno for f in _tb.extract_tb(exc.__traceback__) if f.filename == fname]
            text = "%s: %s" % (type(exc).__name__, str(exc)[:300])
            rec.update(status="timeout" if timed else "failed", detail=text.strip().rstrip(":"),
                       line=lines[-1] if lines else None)
        _report("test:%d" % i, **rec)
    try:
        _os.write(_REQ, b'{"op": "quit"}\n')
    except OSError:
        pass


_run()
'''

# ---------------------------------------------------------------------------------------------
# One unittest method beside the candidate (same process; see the module docstring's residual risk).
# ---------------------------------------------------------------------------------------------
_UNITTEST = r'''
import builtins as _b, gc as _gc, json as _json, os as _os, signal as _signal, sys as _sys
import unittest as _ut, unittest.case as _uc, unittest.result as _ur, unittest.suite as _us
import unittest.loader as _ul, unittest.mock as _um, linecache as _lc

_DUNDERS = ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__bool__", "__len__",
            "__contains__", "__hash__", "__iter__", "__abs__", "__sub__", "__rsub__", "__round__",
            "__float__", "__int__", "__index__", "__str__", "__repr__", "__getattr__", "__getattribute__")


def _program_defined(x, depth=0, seen=None):
    """Whether x (or a value inside it) has comparison behaviour written by the program."""
    seen = set() if seen is None else seen
    if depth > 4 or len(seen) > 10000 or id(x) in seen:
        return False
    seen.add(id(x))
    for klass in type.__dict__["__mro__"].__get__(type(x)):
        d = type.__dict__["__dict__"].__get__(klass)
        for name in _DUNDERS:
            fn = d.get(name)
            code = getattr(fn, "__code__", None) or getattr(getattr(fn, "__func__", None), "__code__", None)
            if code is not None and code.co_filename == "<solution>":
                return True
    if type(x) in (list, tuple, set, frozenset):
        return any(_program_defined(v, depth + 1, seen) for v in x)
    if type(x) is dict:
        return any(_program_defined(k, depth + 1, seen) or _program_defined(v, depth + 1, seen)
                   for k, v in x.items())
    return False


def _guard_asserts():
    """Wrap every TestCase.assert*: a value whose comparison the program wrote fails the assert."""
    def wrap(orig, name):
        def checked(self, *args, **kwargs):
            for v in list(args) + list(kwargs.values()):
                if _program_defined(v):
                    raise self.failureException(
                        "%s got a value whose comparison the program defines (%s)" % (name, type(v).__name__))
            return orig(self, *args, **kwargs)
        checked.__name__, checked.__doc__ = name, orig.__doc__
        return checked
    for name, fn in list(vars(_uc.TestCase).items()):
        if (name.startswith("assert") or name in ("fail", "failIf", "failUnless")) and callable(fn):
            type.__setattr__(_uc.TestCase, name, wrap(fn, name))


def _setup(d):
    cfg, report = d["cfg"], d["report"]
    cells = dict(zip(report.__code__.co_freevars, report.__closure__))
    fd, nonce = cells["status_fd"].cell_contents, cells["nonce"].cell_contents
    for c in cells.values():  # the bootstrap's writer is useless from here on
        c.cell_contents = None
    spec = cfg["unittest"]
    write, dumps, exit_, listdir = _os.write, _json.dumps, _os._exit, _os.listdir
    _guard_asserts()
    classes = [_uc.TestCase, _ur.TestResult, _us.TestSuite, _us.BaseTestSuite, _ul.TestLoader,
               _uc._Outcome, _b.BaseException, _b.Exception, _b.AssertionError]
    snap_cls = {c: dict(c.__dict__) for c in classes}
    snap_b = dict(_b.__dict__)
    mods = ("unittest", "unittest.case", "unittest.result", "unittest.suite", "unittest.loader",
            "unittest.mock", "builtins", "os", "sys", "json", "gc", "signal")
    snap_m = {k: _sys.modules[k] for k in mods}
    run, result_cls = _uc.TestCase.run, _ur.TestResult
    getattr_, setattr_, delattr_ = getattr, type.__setattr__, type.__delattr__
    refused, allow = [], [False]
    blocked = ("sys.settrace", "sys.setprofile", "gc.get_objects", "gc.get_referrers",
               "gc.get_referents", "sys._current_frames")

    def hook(event, args):
        if allow[0]:
            return
        bad = event in blocked or event.startswith("ctypes.")
        if event == "open" and isinstance(args[0], str) and args[0].startswith("/proc/") and \
                args[0].rstrip("/").endswith(("/mem", "/environ")):
            bad = True
        if bad:
            refused.append(event)
            raise PermissionError("%s is refused while a unittest method is scored" % event)
    _sys.addaudithook(hook)

    main_code, getframe = _main.__code__, _sys._getframe

    def emit(status, detail):
        if getframe(1).f_code is not main_code:  # only the runner's own verdicts count
            refused.append("a call of the runner's result writer")
            raise PermissionError("the runner's result writer is not for the program")
        allow[0] = True
        try:
            _sys.stdout.flush()
            _sys.stderr.flush()
        except BaseException:
            pass
        rec = {"kind": "unittest", "nonce": nonce, "status": status, "detail": str(detail)[:500]}
        write(fd, (dumps(rec) + "\n").encode())
        exit_(0)

    def changes():
        out = []
        for c, snap in snap_cls.items():
            now = c.__dict__
            if set(now) != set(snap) or any(now[k] is not v for k, v in snap.items()):
                out.append(c.__name__)
        now = _b.__dict__
        if set(now) != set(snap_b) or any(now.get(k) is not v for k, v in snap_b.items()):
            out.append("builtins")
        out += [k for k, v in snap_m.items() if _sys.modules.get(k) is not v]
        return out

    def restore():
        for c, snap in snap_cls.items():
            for k in [k for k in c.__dict__ if k not in snap]:
                delattr_(c, k)
            for k, v in snap.items():
                if c.__dict__.get(k) is not v and k not in ("__dict__", "__weakref__"):
                    setattr_(c, k, v)
        for k in [k for k in _b.__dict__ if k not in snap_b]:
            del _b.__dict__[k]
        _b.__dict__.update(snap_b)
        _sys.modules.update(snap_m)

    return spec, emit, changes, restore, run, result_cls, refused, listdir, allow


def _main(spec, emit, changes, restore, run, result_cls, refused, listdir, allow):
    ns = {"__name__": "__main__", "__builtins__": _b}
    for stage, src in (("solution", spec["code"]), ("tests", spec["tests"])):
        _lc.cache["<%s>" % stage] = (len(src), None, src.splitlines(True), "<%s>" % stage)
        try:
            exec(compile(src, "<%s>" % stage, "exec"), ns)
        except BaseException as exc:
            # the candidate's own error (SkipTest, SystemExit, a crash): the method does not pass
            emit("failed", "the %s raised %s: %s" % (stage, type(exc).__name__, exc))
        if stage == "solution":
            restore()
    cls = ns.get(spec["class"])
    if not isinstance(cls, type) or not issubclass(cls, _uc.TestCase):
        emit("failed", "the tests define no TestCase class %r" % spec["class"])
    try:
        case = cls(spec["method"])
        result = result_cls()
        run(case, result)
    except BaseException as exc:
        emit("failed", "the method could not run: %s: %s" % (type(exc).__name__, exc))
    allow[0] = True
    tampered = changes()
    threads = len(listdir("/proc/self/task"))
    for sig in range(1, _signal.NSIG):
        try:
            if callable(_signal.getsignal(sig)):
                _signal.signal(sig, _signal.SIG_DFL)
        except (OSError, ValueError, RuntimeError):
            pass
    _signal.setitimer(_signal.ITIMER_REAL, 0)
    _signal.setitimer(_signal.ITIMER_VIRTUAL, 0)
    _signal.setitimer(_signal.ITIMER_PROF, 0)
    if refused:
        emit("failed", "refused operation: " + ", ".join(sorted(set(refused))))
    if tampered:
        emit("failed", "the program changed the test machinery: " + ", ".join(tampered))
    if threads > 1:
        emit("failed", "threads left running after the method (%d tasks)" % threads)
    if result.testsRun != 1:
        emit("failed", "the method did not run")
    for what, items in (("error", result.errors), ("failure", result.failures),
                        ("skip", result.skipped), ("unexpected success", result.unexpectedSuccesses)):
        if items:
            text = items[0][1] if isinstance(items[0][1], str) else str(items[0][1])
            last = [ln for ln in text.splitlines() if ln.strip()]
            emit("failed", "%s: %s" % (what, last[-1] if last else text))
    emit("passed", "")


_args = _setup(_DRIVER)
del _DRIVER
_main(*_args)
'''


# ---------------------------------------------------------------------------------------------
# The trusted side: parsing the tests, starting the processes, counting the results
# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class TestOutcome:
    """One test's result.

    Attributes:
        index: Position of the test (in ``tests``, or the method's order in the suite).
        name: ``"test <index>"`` for function-call tests, ``"Class.method"`` for unittest.
        status: ``"passed"``, ``"failed"``, ``"timeout"`` or ``"not_run"`` (after too many
            timeouts, or when the run ended before the test).
        detail: The error (``"AssertionError: ..."``), or ``""`` when passed.
        line: For a failed function-call test, the line of the test text that raised.
    """

    index: int
    name: str
    status: TestStatus
    detail: str = ""
    line: int | None = None

    @property
    def passed(self) -> bool:
        return self.status == "passed"


@dataclasses.dataclass(frozen=True)
class TestRunResult:
    """What :func:`run_tests` found.

    Attributes:
        status: ``"passed"`` (every test passed), ``"error"`` (no test found: never a pass),
            or the reason the first test did not pass: ``"failed"``, ``"timeout"``, or the
            candidate process's own limit status (``"out_of_memory"``, ``"forbidden"``,
            ``"output_limit"``) when that ended it.
        style: ``"calls"`` or ``"unittest"``.
        tests: One :class:`TestOutcome` per test.
        detail: One line: the first failure, or why there was nothing to run.
        candidate: The candidate process's :class:`~collab_env.sandbox.SandboxResult` (its
            stdout and stderr; for unittest, the first failing method's run), or ``None``.
        harness: The harness process's result (function-call tests), else ``None``.
        duration_s: Wall-clock seconds.
        isolation: The candidate process's containment (``SandboxResult.isolation``).
        load_error: ``"SyntaxError: ..."`` when the candidate program raised while loading
            (function-call tests; for the message only, every call then fails), else ``None``.
    """

    status: str
    style: str
    tests: tuple[TestOutcome, ...]
    detail: str
    candidate: SandboxResult | None
    harness: SandboxResult | None
    duration_s: float
    isolation: dict = dataclasses.field(default_factory=dict)
    load_error: str | None = None

    @property
    def total(self) -> int:
        return len(self.tests)

    @property
    def num_passed(self) -> int:
        return sum(t.passed for t in self.tests)

    @property
    def pass_rate(self) -> float:
        """Passed tests over tests (``0.0`` with no test)."""
        return self.num_passed / self.total if self.tests else 0.0

    @property
    def passed(self) -> bool:
        return self.status == "passed"


def _is_testcase_base(node: ast.expr) -> bool:
    name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
    return name.endswith("TestCase")


def find_unittest_methods(tests: str) -> list[tuple[str, str]]:
    """``(class, method)`` of every test method of the ``unittest.TestCase`` classes in ``tests``.

    Found from the syntax tree (nothing is executed): top-level classes whose base is a
    ``...TestCase`` or another such class of the text, methods named ``test*`` including
    inherited ones, in source order. ``[]`` for text that does not parse or has none.
    """
    try:
        tree = parse_python(tests)
    except SyntaxError:
        return []
    classes: dict[str, list[str]] = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        inherited: list[str] = []
        is_case = False
        for base in node.bases:
            if isinstance(base, ast.Name) and base.id in classes:
                is_case = True
                inherited += classes[base.id]
            elif _is_testcase_base(base):
                is_case = True
        if not is_case:
            continue
        own = [n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
               and n.name.startswith("test")]
        classes[node.name] = list(dict.fromkeys(inherited + own))
    return [(c, m) for c, ms in classes.items() for m in ms]


def test_style(tests: str | Sequence[str]) -> Literal["calls", "unittest"]:
    """``"unittest"`` when the text defines a ``unittest.TestCase`` class, else ``"calls"``."""
    if isinstance(tests, str):
        try:
            tree = parse_python(tests)
        except SyntaxError:
            return "calls"
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and any(_is_testcase_base(b) for b in node.bases):
                return "unittest"
    return "calls"


def prompt_prelude(prompt: str, entry_point: str) -> str:
    """The trusted part of a HumanEval-style prompt: its imports and every top-level definition
    except ``entry_point`` (helpers such as ``poly`` that the tests call). ``""`` if it does not parse."""
    try:
        tree = parse_python(prompt)
    except SyntaxError:
        return ""
    keep = [n for n in tree.body
            if not (isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == entry_point)
            and not isinstance(n, ast.Expr)]
    return ast.unparse(ast.Module(body=keep, type_ignores=[])) + ("\n" if keep else "")


def _bound_names(tree: ast.AST) -> set[str]:
    bound: set[str] = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(n.name)
        elif isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
            bound.add(n.id)
        elif isinstance(n, ast.arg):
            bound.add(n.arg)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in n.names)
        elif isinstance(n, ast.ExceptHandler) and n.name:
            bound.add(n.name)
        elif isinstance(n, (ast.Global, ast.Nonlocal)):
            bound.update(n.names)
    return bound


def _proxy_names(tests: Sequence[str], prelude: str, entry_point: str | None) -> list[str]:
    """The names the tests use but neither they nor the prelude define: the candidate's."""
    free: set[str] = set()
    defined = _bound_names(parse_python(prelude)) if prelude else set()
    for src in tests:
        try:
            tree = parse_python(src)
        except SyntaxError:
            continue  # fails in the harness, as a test of its own
        loads = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        free |= loads - _bound_names(tree)
    free -= defined | set(dir(builtins)) | {"CandidateError"}
    if entry_point:
        free.add(entry_point)
    return sorted(free)


def _harness_wall(limits: SandboxLimits, n: int, max_timeouts: int) -> float:
    call = _call_timeout(limits)
    return limits.wall_s + (call + 2.0) * min(n, max(1, max_timeouts))


def _call_timeout(limits: SandboxLimits) -> float:
    return float(min(limits.wall_s, limits.cpu_s + 1))


def run_tests(
    code: str,
    tests: str | Sequence[str],
    *,
    entry_point: str | None = None,
    style: Style = "auto",
    prelude: str = "",
    limits: SandboxLimits = SandboxLimits(),  # noqa: B008 - frozen
    max_timeouts: int = 3,
) -> TestRunResult:
    """Score ``code`` against trusted ``tests`` (see the module docstring for the design).

    Args:
        code: The candidate program (untrusted).
        tests: Trusted test code: one script (an assert script, or HumanEval's ``check`` program
            with its ``check(<entry_point>)`` call), a sequence of scripts (one test each), or a
            unittest module (one test per method).
        entry_point: The candidate function the tests call (also found from the tests' free names).
        style: ``"auto"`` (unittest when the text defines a ``TestCase`` class), ``"calls"`` or
            ``"unittest"``.
        prelude: Trusted code run in the harness before the tests (helpers and imports of the
            problem's prompt: :func:`prompt_prelude`); its names are not proxied.
        limits: Limits of each sandboxed process. A call may run ``min(wall_s, cpu_s + 1)`` s.
        max_timeouts: After this many tests timed out, the rest are ``"not_run"`` (CoMLRL's rule).

    Raises:
        SandboxError: A sandbox could not start or run (an infrastructure fault, never a score).
        ConfigError: Bad arguments, or a prelude that does not parse (a test that does not
            parse is a failed test).
    """
    if not isinstance(code, str):
        raise ConfigError(f"code must be a str, got {type(code).__name__}.")
    seq = [tests] if isinstance(tests, str) else list(tests)
    if not all(isinstance(t, str) for t in seq):
        raise ConfigError("tests must be a str or a sequence of str.")
    if style not in ("auto", "calls", "unittest"):
        raise ConfigError(f"style must be 'auto', 'calls' or 'unittest', got {style!r}.")
    if not isinstance(limits, SandboxLimits):
        raise ConfigError(f"limits must be a SandboxLimits, got {type(limits).__name__}.")
    if style == "auto":
        style = test_style(tests)
    memo = _MEMO.get()
    key = None
    if memo is not None:
        key = hashlib.sha256(repr((code, seq, entry_point, style, prelude, limits, max_timeouts)).encode(
            "utf-8", "surrogatepass")).hexdigest()
        if key in memo:
            return memo[key]
    start = time.monotonic()
    if style == "unittest":
        if len(seq) != 1:
            raise ConfigError("unittest tests are one module text, not a sequence.")
        result = _run_unittest(code, seq[0], limits, start)
    else:
        result = _run_calls(code, seq, entry_point, prelude, limits, max_timeouts, start)
    if memo is not None and key is not None:
        memo[key] = result
    return result


#: The results of :func:`run_tests` kept inside :func:`reuse_test_results` (``None`` outside).
_MEMO: contextvars.ContextVar[dict[str, TestRunResult] | None] = contextvars.ContextVar("run_tests_memo", default=None)


@contextlib.contextmanager
def reuse_test_results() -> Iterator[dict[str, TestRunResult]]:
    """Inside this block, :func:`run_tests` runs each distinct (code, tests, limits...) once and
    answers a repeat with the first result (threads started inside, such as :func:`arun_tests`,
    share it). For re-scoring recorded programs, where the same program recurs across trials
    (``leaderboard verify`` re-plays every trial of a task): a verdict is a function of the
    program and the trusted tests, so a repeat is the same verdict, minus the sandbox runs. Not
    for training, where a program whose behaviour is random should be run each time. An error
    (``SandboxError``) is never kept: the next repeat runs again."""
    token = _MEMO.set({} if _MEMO.get() is None else _MEMO.get())
    try:
        yield _MEMO.get()  # type: ignore[misc]
    finally:
        _MEMO.reset(token)


async def arun_tests(code: str, tests: str | Sequence[str], **kwargs) -> TestRunResult:
    """Async :func:`run_tests` (the blocking work happens in a worker thread)."""
    return await asyncio.to_thread(run_tests, code, tests, **kwargs)


def _result(status: str, style: str, outcomes: list[TestOutcome], detail: str,
            candidate: SandboxResult | None, harness: SandboxResult | None, start: float,
            load_error: str | None = None) -> TestRunResult:
    return TestRunResult(status=status, style=style, tests=tuple(outcomes), detail=detail,
                         candidate=candidate, harness=harness, duration_s=time.monotonic() - start,
                         isolation=dict(candidate.isolation) if candidate is not None else {},
                         load_error=load_error)


def _run_calls(code, tests, entry_point, prelude, limits, max_timeouts, start) -> TestRunResult:
    from collab_env.sandbox.run import run_driver

    if not tests:
        return _result("error", "calls", [], "no test to run", None, None, start)
    try:
        parse_python(prelude)
    except SyntaxError as exc:
        raise ConfigError(f"the prelude does not parse: {exc}") from exc
    names = _proxy_names(tests, prelude, entry_point)
    call_timeout = _call_timeout(limits)
    wall = _harness_wall(limits, len(tests), max_timeouts)
    req_r, req_w = os.pipe()
    rep_r, rep_w = os.pipe()
    server_limits = dataclasses.replace(limits, wall_s=wall + 2.0, max_processes=max(limits.max_processes, 3))
    harness_limits = dataclasses.replace(limits, wall_s=wall, cpu_s=max(limits.cpu_s, wall))
    box: dict = {}

    def serve() -> None:
        try:
            box["result"] = run_driver(code, server_limits, driver=_SERVE, pass_fds=(req_r, rep_w), config={
                "serve": {"req_fd": req_r, "rep_fd": rep_w, "call_timeout_s": call_timeout}})
        except BaseException as exc:  # re-raised below, in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=serve, name="sandbox-candidate", daemon=True)
    thread.start()
    try:
        h, h_records = run_driver("", harness_limits, driver=_HARNESS, pass_fds=(req_w, rep_r), config={
            "harness": {"req_fd": req_w, "rep_fd": rep_r, "tests": list(tests), "prelude": prelude,
                        "names": names, "max_timeouts": max_timeouts, "call_timeout_s": call_timeout}})
    finally:
        thread.join()
    if "error" in box:
        raise box["error"]
    cand, c_records = box["result"]
    outcomes = []
    for i in range(len(tests)):
        rec = h_records.get(f"test:{i}")
        if rec is None:
            outcomes.append(TestOutcome(i, f"test {i}", "not_run", f"the harness ended first ({h.status}: {h.detail})"))
        else:
            outcomes.append(TestOutcome(i, f"test {i}", rec.get("status", "failed"), str(rec.get("detail", "")),
                                        rec.get("line")))
    if not any(k.startswith("test:") for k in h_records) and \
            h.status not in ("timeout", "out_of_memory", "output_limit"):
        raise SandboxError(f"the test harness did not run ({h.status}: {h.detail}); stderr: {h.stderr[-1000:]!r}")
    load = c_records.get("load", {}).get("error")
    return _summarise("calls", outcomes, cand, h, start, load if isinstance(load, str) else None)


def _summarise(style, outcomes, cand, harness, start, load_error=None) -> TestRunResult:
    first = next((o for o in outcomes if not o.passed), None)
    if first is None:
        return _result("passed", style, outcomes, "every test passed", cand, harness, start, load_error)
    status = {"not_run": "failed"}.get(first.status, first.status)
    if cand is not None and cand.status in ("out_of_memory", "forbidden", "output_limit", "timeout"):
        status = cand.status
    elif harness is not None and harness.status == "timeout":
        status = "timeout"
    detail = f"{first.name}: {first.detail}" if first.detail else first.name
    if load_error:
        detail = f"the program did not load: {load_error}"
    return _result(status, style, outcomes, detail, cand, harness, start, load_error)


def _run_unittest(code: str, tests: str, limits: SandboxLimits, start: float) -> TestRunResult:
    from collab_env.sandbox.run import run_driver

    methods = find_unittest_methods(tests)
    if not methods:
        return _result("error", "unittest", [], "no unittest test method found in the tests "
                       "(a suite with no test is an error, never a pass)", None, None, start)
    outcomes, first_bad, any_run = [], None, None
    for i, (cls, method) in enumerate(methods):
        res, records = run_driver("", limits, driver=_UNITTEST, config={
            "unittest": {"code": code, "tests": tests, "class": cls, "method": method}})
        any_run = any_run or res
        rec = records.get("unittest")
        if rec is not None and rec.get("status") == "passed":
            outcomes.append(TestOutcome(i, f"{cls}.{method}", "passed"))
            continue
        status: TestStatus
        if rec is not None:
            status, detail = "failed", str(rec.get("detail", ""))
        else:
            status = "timeout" if res.status == "timeout" else "failed"
            detail = f"the process ended before the method was scored ({res.status}: {res.detail})"
        outcomes.append(TestOutcome(i, f"{cls}.{method}", status, detail))
        first_bad = first_bad or res
    return _summarise("unittest", outcomes, first_bad or any_run, None, start)

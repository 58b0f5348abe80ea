"""The call harness: runs the trusted tests against proxies of the candidate's functions.

A guest program (see :mod:`collab_env.sandbox.guest`): the host runs ``codec.py``'s text followed
by this file's as the driver of a sandboxed run (:func:`collab_env.sandbox.run.run_driver`), so
:func:`encode_value` and :func:`decode_value` are defined above it, and the bootstrap puts the run's
``_DRIVER`` (its config and status reporter) in its namespace. It never sees candidate text: each
name in ``names`` is a :class:`Candidate` that sends a call request to the candidate server
(``server.py``) on ``req_fd`` and decodes its reply from ``rep_fd`` into fresh plain objects. One
``test:<i>`` record per test.
"""

import builtins as _builtins
import json as _json
import linecache as _lc
import os as _os
import re as _re
import select as _select
import time as _time
import traceback as _tb

TYPE_CHECKING = False
if TYPE_CHECKING:  # what the host and the bootstrap define before this text runs
    from typing import Any

    from collab_env.sandbox.guest.codec import decode_value, encode_value

    _DRIVER: dict[str, Any] = {}


class CandidateError(Exception):
    """The candidate raised a non-builtin exception, or could not answer a call."""


class _State:
    next_id = 0
    dead: str | None = None
    timed_out = False
    unplain = False  # a result that is not plain data came back (unittest suites: run beside it)
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
        mutable = any(type(v) in _MUTABLE for v in list(args) + list(kwargs.values()))
        req = _json.dumps({"op": "call", "id": n, "fn": name, "args": encode_value(list(args)),
                           "kwargs": encode_value(dict(kwargs)), "mutable": mutable}, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise TypeError(f"an argument of {name}(...) is not plain data: {exc!s}") from None
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
            value = decode_value(rep["value"])
            after = decode_value(rep["after"]) if "after" in rep else None
        except (ValueError, TypeError, RecursionError) as exc:
            raise CandidateError(f"the result of {name}(...) is malformed: {exc!s}") from None
        if type(after) is list and len(after) == 2:
            _mirror(list(args), after[0])
            _mirror(dict(kwargs), after[1])
        return value
    if rep.get("unplain"):
        _State.unplain = True
        raise CandidateError(str(rep.get("message"))[:2000])
    if rep.get("timeout") is True:
        _State.timed_out = True
        raise TimeoutError(f"{name}(...) ran past its time limit of {_spec['call_timeout_s']} s")
    kind, msg = str(rep.get("raised"))[:100], str(rep.get("message"))[:2000]
    cls = getattr(_builtins, kind, None) if _re.fullmatch(r"[A-Za-z_]\w*", kind) else None
    if isinstance(cls, type) and issubclass(cls, Exception) and cls.__module__ == "builtins":
        try:
            error = cls(msg)
        except Exception:
            error = CandidateError(f"{kind}: {msg}")
    else:
        error = CandidateError(f"{kind}: {msg}")
    raise error


_MUTABLE = (list, dict, set, bytearray)


def _mirror(dst, src):
    """Make the trusted container ``dst`` hold ``src`` (fresh plain data: what the candidate's copy
    of it became), in place, recursing into containers of the same type so that references the
    test holds into ``dst`` see the change too."""
    if type(dst) is not type(src):
        return
    if type(dst) is list:
        if len(dst) == len(src):
            for i, (a, b) in enumerate(zip(dst, src)):
                if type(a) in _MUTABLE and type(a) is type(b):
                    _mirror(a, b)
                elif not (type(a) is type(b) and a == b):
                    dst[i] = b
        else:
            dst[:] = src
    elif type(dst) is dict:
        if dst.keys() != src.keys():
            for k in [k for k in dst if k not in src]:
                del dst[k]
        for k, b in src.items():
            a = dst.get(k)
            if type(a) in _MUTABLE and type(a) is type(b):
                _mirror(a, b)
            else:
                dst[k] = b
    elif type(dst) is set:
        dst.clear()
        dst.update(src)
    elif type(dst) is bytearray:
        dst[:] = src


class Candidate:
    """A callable that runs the candidate's function of this name in the candidate's process."""

    def __init__(self, name):
        self.__name__ = name

    def __call__(self, *args, **kwargs):
        return _call(self.__name__, args, kwargs)

    def __repr__(self):
        return f"<candidate {self.__name__}>"


def _run():
    base = {"__name__": "__main__", "__builtins__": _builtins, "CandidateError": CandidateError}
    prelude = _spec["prelude"]
    if prelude:
        _lc.cache["<prelude>"] = (len(prelude), None, prelude.splitlines(True), "<prelude>")
        exec(compile(prelude, "<prelude>", "exec"), base)
    for name in _spec["names"]:
        base[name] = Candidate(name)
    if _spec.get("suite") is not None:
        _run_suite(base, _spec["suite"])
    else:
        _run_scripts(base)
    try:
        _os.write(_REQ, b'{"op": "quit"}\n')
    except OSError:
        pass


def _run_suite(base, suite):
    """A unittest suite, run here (trusted) as unittest runs it: one module, the loader's order,
    class and module fixtures; every method's outcome is a ``test:<i>`` record."""
    import sys
    import types
    import unittest

    text, methods = suite["text"], [tuple(m) for m in suite["methods"]]
    module = types.ModuleType("__tests__")
    module.__dict__.update(base, __name__="__tests__")
    sys.modules["__tests__"] = module
    _lc.cache["<tests>"] = (len(text), None, text.splitlines(True), "<tests>")
    outcomes: dict[str, tuple[str, str]] = {}
    fixture: list[str] = []

    def line(err):
        return f"{err[0].__name__}: {str(err[1])[:300]}".strip().rstrip(":")

    class Result(unittest.TestResult):
        def _note(self, test, status, detail):
            if not hasattr(test, "_testMethodName"):  # a class or module fixture's error
                fixture.append(f"{test!s}: {detail}")
                return
            tid = test.id()
            if status == "passed" and tid in outcomes:
                return  # a subtest failed before: the method stays failed
            outcomes[tid] = (status, detail)

        def addSuccess(self, test):
            self._note(test, "passed", "")

        def addFailure(self, test, err):
            self._note(test, "failed", "failure: " + line(err))

        def addError(self, test, err):
            self._note(test, "failed", "error: " + line(err))

        def addSkip(self, test, reason):
            self._note(test, "failed", f"skipped: {reason}")

        def addExpectedFailure(self, test, err):
            self._note(test, "passed", "")

        def addUnexpectedSuccess(self, test):
            self._note(test, "failed", "unexpected success")

        def addSubTest(self, test, subtest, err):
            if err is not None:
                self._note(test, "failed", "subtest failure: " + line(err))

    try:
        exec(compile(text, "<tests>", "exec"), module.__dict__)
        tests = unittest.TestSuite()
        for cls, method in methods:
            tests.addTest(module.__dict__[cls](method))
        result = Result()
        tests.run(result)
    except BaseException as exc:
        fixture.append(f"the tests did not run: {type(exc).__name__}: {str(exc)[:300]}")
    for i, (cls, method) in enumerate(methods):
        status, detail = outcomes.get(f"__tests__.{cls}.{method}", ("failed", "not run: " + "; ".join(fixture)[:500]))
        if status == "failed" and "TimeoutError" in detail:
            status = "timeout"
        _report(f"test:{i}", index=i, status=status, detail=detail)
    if _State.unplain:
        _report("unplain")


def _run_scripts(base):
    timeouts = 0
    for i, src in enumerate(_spec["tests"]):
        rec: dict[str, object] = {"index": i}
        if timeouts >= _spec["max_timeouts"]:
            rec.update(status="not_run", detail=f"not run: {timeouts} earlier tests timed out")
            _report(f"test:{i}", **rec)
            continue
        fname = f"<test {i}>"
        _lc.cache[fname] = (len(src), None, src.splitlines(True), fname)
        _State.timed_out = False
        try:
            exec(compile(src, fname, "exec"), dict(base))
            rec.update(status="passed", detail="")
        except SystemExit as exc:
            rec.update(status="failed", detail=f"the test exited (code {exc.code!r})")
        except BaseException as exc:
            timed = _State.timed_out and isinstance(exc, TimeoutError)
            timeouts += timed
            lines = [f.lineno for f in _tb.extract_tb(exc.__traceback__) if f.filename == fname]
            text = f"{type(exc).__name__}: {str(exc)[:300]}"
            rec.update(status="timeout" if timed else "failed", detail=text.strip().rstrip(":"),
                       line=lines[-1] if lines else None)
        _report(f"test:{i}", **rec)


if __name__ == "__main__":  # as the driver (importing this module runs nothing)
    _report = _DRIVER["report"]
    _spec = _DRIVER["cfg"]["harness"]
    _REQ, _REP = _spec["req_fd"], _spec["rep_fd"]
    _run()

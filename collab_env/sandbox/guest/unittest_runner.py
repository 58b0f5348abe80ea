"""One unittest method beside the candidate, in the same process (residual risk: see
:mod:`collab_env.sandbox.harness`).

A guest program (see :mod:`collab_env.sandbox.guest`): the host runs this file's text as the driver
of a sandboxed run (:func:`collab_env.sandbox.run.run_driver`), and the bootstrap puts the run's
``_DRIVER`` (its config and status reporter) in its namespace. The runner sets itself up before
the candidate's code (saved references to ``unittest``'s machinery and to the writer of its one
``unittest`` record, an audit hook that refuses tracing, ``gc`` object walks, ``ctypes`` and reads
of ``/proc/*/mem``), runs the program, restores what the program changed, runs the tests' one
method, and fails it if the machinery changed again, a thread is left running, a refused
operation was tried, or the method did not pass.
"""

import builtins as _b
import gc as _gc
import json as _json
import linecache as _lc
import os as _os
import signal as _signal
import sys as _sys
import unittest as _ut
import unittest.case as _uc
import unittest.loader as _ul
import unittest.mock as _um
import unittest.result as _ur
import unittest.suite as _us

TYPE_CHECKING = False
if TYPE_CHECKING:  # what the bootstrap defines before this text runs
    from collections.abc import Callable
    from typing import Any, NoReturn

    _DRIVER: dict[str, Any] = {}

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
                        f"{name!s} got a value whose comparison the program defines ({type(v).__name__!s})")
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
               _uc._Outcome,  # type: ignore[attr-defined]  # typeshed omits this private class
               _b.BaseException, _b.Exception, _b.AssertionError]
    snap_cls = {c: dict(c.__dict__) for c in classes}
    snap_b = dict(_b.__dict__)
    mods = (_ut, _uc, _ur, _us, _ul, _um, _b, _os, _sys, _json, _gc, _signal)
    snap_m = {m.__name__: m for m in mods}  # as sys.modules holds them (the program has not run)
    run, result_cls = _uc.TestCase.run, _ur.TestResult
    setattr_, delattr_ = type.__setattr__, type.__delattr__
    refused: list[str] = []
    allow = [False]
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
            raise PermissionError(f"{event!s} is refused while a unittest method is scored")
    _sys.addaudithook(hook)

    main_code, getframe = _main.__code__, _sys._getframe

    def emit(status: str, detail: object) -> "NoReturn":
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


def _main(spec, emit: "Callable[[str, object], NoReturn]", changes, restore, run, result_cls, refused, listdir, allow):
    ns = {"__name__": "__main__", "__builtins__": _b}
    for stage, src in (("solution", spec["code"]), ("tests", spec["tests"])):
        _lc.cache[f"<{stage}>"] = (len(src), None, src.splitlines(True), f"<{stage}>")
        try:
            exec(compile(src, f"<{stage}>", "exec"), ns)
        except BaseException as exc:
            # the candidate's own error (SkipTest, SystemExit, a crash): the method does not pass
            emit("failed", f"the {stage} raised {type(exc).__name__!s}: {exc!s}")
        if stage == "solution":
            restore()
    cls = ns.get(spec["class"])
    if not isinstance(cls, type) or not issubclass(cls, _uc.TestCase):
        emit("failed", f"the tests define no TestCase class {spec['class']!r}")
    try:
        case = cls(spec["method"])
        result = result_cls()
        run(case, result)
    except BaseException as exc:
        emit("failed", f"the method could not run: {type(exc).__name__!s}: {exc!s}")
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
        emit("failed", f"threads left running after the method ({threads} tasks)")
    if result.testsRun != 1:
        emit("failed", "the method did not run")
    for what, items in (("error", result.errors), ("failure", result.failures),
                        ("skip", result.skipped), ("unexpected success", result.unexpectedSuccesses)):
        if items:
            text = items[0][1] if isinstance(items[0][1], str) else str(items[0][1])
            last = [ln for ln in text.splitlines() if ln.strip()]
            emit("failed", f"{what}: {(last[-1] if last else text)!s}")
    emit("passed", "")


if __name__ == "__main__":  # as the driver (importing this module runs nothing)
    _args = _setup(_DRIVER)
    del _DRIVER
    _main(*_args)

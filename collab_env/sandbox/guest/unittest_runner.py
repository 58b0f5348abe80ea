"""One unittest class's methods beside the candidate, with a verdict that is checked, not trusted
(residual risk: see :mod:`collab_env.sandbox.harness`).

A guest program (see :mod:`collab_env.sandbox.guest`): the host runs this file's text as the driver
of a sandboxed run (:func:`collab_env.sandbox.run.run_driver`), and the bootstrap puts the run's
``_DRIVER`` (its config and status reporter) in its namespace.

Two processes. The **runner** (this driver) never runs candidate text: it imports the modules the
suite and the program use, makes itself non-dumpable (so that a process of the same uid cannot
open its file descriptors or memory through ``/proc``), and forks the **test process**, which
closes the run's status pipe, pins the test machinery (an audit hook refusing tracing, ``gc``
object walks, ``ctypes`` and reads of ``/proc/*/mem``; assert helpers that refuse values whose
comparison is not plain), loads the program as the module ``__main__``, restores what it
changed, loads the tests as a module of their own (``__tests__``, whose ``__builtins__`` is the
real ``builtins`` and which reaches the program's names only as attributes taken from the
program's module), and runs, as unittest runs them: a sentinel test that must fail, the class's
methods, a sentinel that must pass and one that must error. Each outcome goes to the
runner on a pipe as it happens. The runner then checks the report: every test reported, none
twice, nothing else, the sentinels as they must be. A report whose sentinels misreport is
``"tampered"`` (the host scores the whole suite 0 and counts it). The record is one verdict
per method.
"""

import builtins as _b
import ctypes as _ctypes
import importlib as _importlib
import json as _json
import linecache as _lc
import operator as _operator
import os as _os
import signal as _signal
import sys as _sys
import types as _types
import unittest as _ut
import unittest.case as _uc
import unittest.loader as _ul
import unittest.mock as _um
import unittest.result as _ur
import unittest.suite as _us

TYPE_CHECKING = False
if TYPE_CHECKING:  # what the bootstrap defines before this text runs
    from typing import Any

    _DRIVER: dict[str, Any] = {}

_COMPARE = ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__bool__", "__len__",
            "__contains__", "__iter__", "__abs__", "__sub__", "__rsub__", "__round__", "__float__",
            "__int__", "__index__", "__str__", "__repr__", "__getattr__", "__getattribute__", "__hash__")
_PLAIN = (type(None), bool, int, float, complex, str, bytes, bytearray, range, slice, type(...))
_CONTAINERS = (list, tuple, set, frozenset, dict)
_IDENTITY = ("assertIs", "assertIsNot", "assertIsNone", "assertIsNotNone", "assertRaises",
             "assertRaisesRegex", "assertWarns", "assertWarnsRegex", "assertLogs", "assertNoLogs")
_HEAPTYPE = 1 << 9
_MAX_REPORT = 1 << 20


def _trusted_roots(cfg):
    """Directories whose Python files are the interpreter's and the installed libraries' (read-only
    in the sandbox), not the program's: what a comparison may be written in."""
    roots = {_sys.prefix, _sys.base_prefix, _sys.exec_prefix, *cfg.get("python_paths", ())}
    work = _os.path.realpath(cfg["workdir"])
    return tuple(sorted({r.rstrip("/") + "/" for r in roots if r and not r.startswith(("/tmp/sandbox", work))}))


class _Guard:
    """The comparisons an assert helper may make: on plain data, on library objects whose
    comparison the libraries wrote (their files, or their classes as they were before the program
    loaded), on mocks only by identity. Set up in the test process before the program loads."""

    def __init__(self, roots):
        self.roots = roots
        self.mock_file = _um.__file__
        self.mocks = (_um.NonCallableMock, type(_um.ANY))
        self.calls = (_um._Call, _um._CallList)  # type: ignore[attr-defined]  # tuples/lists of call args
        self.mro = type.__dict__["__mro__"].__get__
        self.tdict = type.__dict__["__dict__"].__get__
        self.flags = type.__dict__["__flags__"].__get__
        self.issub, self.isfn = issubclass, _types.FunctionType
        self.known: dict[tuple[int, str], object] = {}
        self.mdict = _types.ModuleType.__dict__["__dict__"].__get__  # type: ignore[index]
        self.files: dict[str, _types.ModuleType] = {}  # library file -> its module, as loaded before the program
        for m in list(_sys.modules.values()):
            f = getattr(m, "__file__", None)
            if isinstance(f, str) and f.endswith(".py") and f.startswith(roots) and isinstance(m, _types.ModuleType):
                self.files[f] = m
        self.codes: dict[str, dict] = {}
        self.test_codes: dict[int, _types.CodeType] = {}
        self.program_mocks: dict[int, type] = {}  # classes of the mocks made while program code ran
        self.in_program = [0]
        self.ops = {"Eq": _operator.eq, "NotEq": _operator.ne, "Lt": _operator.lt, "LtE": _operator.le,
                    "Gt": _operator.gt, "GtE": _operator.ge, "In": lambda a, b: a in b,
                    "NotIn": lambda a, b: a not in b}
        self.pinned = []
        stack, seen = [object], set()
        while stack:  # every class that exists now, with the comparison methods it has now
            c = stack.pop()
            try:
                subs = type.__subclasses__(c)
            except TypeError:
                continue
            for s in subs:
                if id(s) in seen:
                    continue
                seen.add(id(s))
                self.pinned.append(s)
                stack.append(s)
                if self.flags(s) & _HEAPTYPE:
                    d = self.tdict(s)
                    for name in _COMPARE:
                        fn = d.get(name)
                        if fn is not None:
                            self.known[(id(s), name)] = fn

    def suspect(self, x, mocks_ok=False, depth=0, budget=None):
        """Why x's comparison is not to be trusted, or ``""``. With ``mocks_ok`` (a result the
        program hands to the tests), the tests' own mocks pass; a mock the program made never does."""
        budget = budget if budget is not None else [10000]
        budget[0] -= 1
        if budget[0] < 0 or depth > 6:
            return ""
        t = type(x)
        if t in _PLAIN:
            return ""
        if t in _CONTAINERS or self.issub(t, self.calls):
            items = dict.items(x) if t is dict else (tuple.__iter__(x) if self.issub(t, tuple) else
                                                     list.__iter__(x) if self.issub(t, list) else
                                                     set.__iter__(x) if t is set else frozenset.__iter__(x))
            for v in items:
                for w in (v if t is dict else (v,)):
                    why = self.suspect(w, mocks_ok, depth + 1, budget)
                    if why:
                        return why
            if t in _CONTAINERS or t in self.calls:
                return ""
        if self.issub(t, self.mocks):
            if id(t) in self.program_mocks:
                return f"a {t.__name__} the program made"
            return "" if mocks_ok else f"a {t.__name__} (unittest.mock objects compare by identity only here)"
        for klass in self.mro(t):
            if not self.flags(klass) & _HEAPTYPE:
                continue  # a class written in C: its comparison slots are fixed
            d = self.tdict(klass)
            for name in _COMPARE:
                fn = d.get(name)
                if fn is None or self.known.get((id(klass), name)) is fn:
                    continue
                if type(fn).__name__ in ("wrapper_descriptor", "method_descriptor") and \
                        getattr(fn, "__name__", None) == name:
                    continue  # a C slot under its own name (int.__eq__ as __ne__ would not be)
                code = fn.__code__ if type(fn) is self.isfn else None
                if code is None or not self.library_code(code):
                    return f"a {klass.__name__} whose {name} the program wrote"
        return ""

    def library_code(self, code):
        """Whether ``code`` is the very code object of a function of a library module loaded before
        the program (found from that module's functions and classes, nested code included): a
        code object compiled by the program under a library's file name is not."""
        if id(code) in self.test_codes:
            return True  # the tests' own classes (trusted text)
        if code.co_filename == self.mock_file:
            return False  # mock.ANY's and the mocks' comparisons hold for anything
        module = self.files.get(code.co_filename)
        if module is None:
            return False
        codes = self.codes.get(code.co_filename)
        if codes is None:
            codes = self.codes[code.co_filename] = self._module_codes(module)
        return id(code) in codes

    def trust_tests(self, code):
        """Trust the code objects compiled from the tests' text (their own classes' comparisons)."""
        todo = [code]
        while todo:
            c = todo.pop()
            self.test_codes[id(c)] = c
            todo.extend(k for k in c.co_consts if type(k) is _types.CodeType)

    def _module_codes(self, module):
        found: dict[int, _types.CodeType] = {}
        seen: set[int] = set()
        todo = list(dict.values(self.mdict(module)))
        while todo and len(found) < 200000:
            x = todo.pop()
            if id(x) in seen:
                continue
            seen.add(id(x))
            t = type(x)
            if t is _types.CodeType:
                found[id(x)] = x
                todo.extend(c for c in x.co_consts if type(c) is _types.CodeType)
            elif t is self.isfn:
                todo.append(x.__code__)
            elif t in (staticmethod, classmethod):
                todo.append(x.__func__)
            elif t is property:
                todo.extend(f for f in (x.fget, x.fset, x.fdel) if f is not None)
            elif isinstance(x, type) and getattr(x, "__module__", None) == module.__name__:
                todo.extend(list(self.tdict(x).values()))
        return found

    def install(self, failure):
        guard = self
        new = _um.NonCallableMock.__dict__["__new__"]

        def mock_new(cls, /, *args, **kw):
            instance = new(cls, *args, **kw)
            parent = kw.get("_new_parent", kw.get("parent"))
            # A child of a mock (its return_value, an attribute) is made when first used, often
            # inside the program's call: it belongs to whoever made its parent.
            made_by_program = id(type(parent)) in guard.program_mocks if parent is not None else guard.in_program[0]
            if made_by_program:
                guard.program_mocks[id(type(instance))] = type(instance)
            return instance
        type.__setattr__(_um.NonCallableMock, "__new__", staticmethod(mock_new))
        self.failure = failure

        def wrap(orig, name):
            def checked(self, *args, **kwargs):
                if name in ("assertIsInstance", "assertNotIsInstance") and len(args) >= 2:
                    is_it = guard.issub(type(args[0]), args[1])  # the class, not its __class__
                    if is_it != (name == "assertIsInstance"):
                        neg = " not" if is_it else ""
                        raise failure(f"{type(args[0]).__name__} is{neg} an instance of {args[1]!r}")
                    return None
                values = list(args) + list(kwargs.values())
                if name in ("assertEqual", "assertIs") and len(args) >= 2 and args[0] is args[1]:
                    values = []
                for v in values:
                    why = guard.suspect(v)
                    if why:
                        raise failure(f"{name} refused {why}")
                return orig(self, *args, **kwargs)
            checked.__name__, checked.__doc__ = name, orig.__doc__
            return checked

        for name, fn in list(vars(_uc.TestCase).items()):
            if (name.startswith("assert") or name.startswith("fail")) and callable(fn) and name not in _IDENTITY \
                    and not name.startswith("assert_") and name != "failureException":
                type.__setattr__(_uc.TestCase, name, wrap(fn, name))


    def compare(self, a, op, b):
        """``a <op> b`` for the tests' comparisons (the host rewrote each into a call of this):
        refused when a side's comparison is the program's; mocks compare by identity."""
        if op == "Is":
            return a is b
        if op == "IsNot":
            return a is not b
        for v in (a, b):
            why = self.suspect(v)
            if why:
                if op in ("Eq", "NotEq") and "identity" in why:
                    return (a is b) == (op == "Eq")
                raise self.failure(f"a comparison ({op}) refused {why}")
        return self.ops[op](a, b)

    def chain(self, left, *rest):
        for i in range(0, len(rest), 2):
            right = rest[i + 1]()
            if not self.compare(left, rest[i], right):
                return False
            left = right
        return True

    def wrap_program_function(self, fn, name):
        """The program's function as the tests call it: program code runs flagged (mocks made then
        are the program's), and a result whose comparison the program wrote fails the test."""
        guard = self

        def call(*args, **kwargs):
            guard.in_program[0] += 1
            try:
                result = fn(*args, **kwargs)
            finally:
                guard.in_program[0] -= 1
            why = guard.suspect(result, mocks_ok=True)
            if why:
                raise guard.failure(f"{name}(...) returned {why}")
            return result
        for attr in ("__name__", "__qualname__", "__doc__", "__module__", "__wrapped__"):
            try:
                setattr(call, attr, getattr(fn, attr) if attr != "__wrapped__" else fn)
            except (AttributeError, TypeError):
                pass
        return call


class _Report(_ur.TestResult):
    """Sends each outcome to the runner as it happens (one JSON line)."""

    def __init__(self, send):
        super().__init__()
        self._send = send

    def _event(self, test, outcome, err=None):
        detail = ""
        if err is not None:
            try:
                detail = f"{err[0].__name__}: {str(err[1])[:300]}"
            except BaseException:
                detail = "(unprintable)"
        method = getattr(test, "_testMethodName", None)
        self._send({"test": f"{type(test).__name__}.{method}" if method else None,
                    "fixture": None if method else str(test)[:200], "outcome": outcome, "detail": detail})

    def addSuccess(self, test):
        self._event(test, "passed")

    def addFailure(self, test, err):
        self._event(test, "failure", err)

    def addError(self, test, err):
        self._event(test, "error", err)

    def addSkip(self, test, reason):
        self._event(test, "skip", (type("Skip", (), {}), reason))

    def addExpectedFailure(self, test, err):
        self._event(test, "passed")

    def addUnexpectedSuccess(self, test):
        self._event(test, "unexpected success")

    def addSubTest(self, test, subtest, err):
        if err is not None:
            self._event(test, "subtest failure", err)


def _sentinels(names, rng):
    """The sentinel class (in a module of its own, so the suite's module fixtures never touch it)."""
    a, b = rng
    cls = type(names["class"], (_uc.TestCase,), {
        names["fail_a"]: lambda self: self.assertEqual(a, b),
        names["pass"]: lambda self: (self.assertEqual(a, a), self.assertTrue(a != b), self.assertIn(b, [a, b])),
        names["fail_b"]: lambda self: [][a],  # an error, not a failure: the other recording path
        "__module__": "__sentinels__",
    })
    mod = _types.ModuleType("__sentinels__")
    setattr(mod, names["class"], cls)
    _sys.modules["__sentinels__"] = mod
    return cls


def _test_process(cfg, spec, fd, status_fd):
    """The test process (forked; never returns): the program, then the tests, reported on ``fd``."""
    _os.close(status_fd)
    write, dumps, exit_, listdir, getpid = _os.write, _json.dumps, _os._exit, _os.listdir, _os.getpid
    me = getpid()

    def send(obj):
        if getpid() != me:
            return  # a process the program forked reports nothing
        try:
            line = (dumps(obj) + "\n").encode()
            while line:
                line = line[write(fd, line):]
        except BaseException:
            pass

    try:
        guard = _Guard(_trusted_roots(cfg))
        guard.install(_uc.TestCase.failureException)
        names = spec["sentinels"]
        a = int.from_bytes(_os.urandom(4), "big") >> 2  # below 2**30, so a != b below
        sentinel = _sentinels(names, (a, a + 1 + (int.from_bytes(_os.urandom(4), "big") >> 2)))
        classes = [_uc.TestCase, _ur.TestResult, _us.TestSuite, _us.BaseTestSuite, _ul.TestLoader, _Report,
                   _uc._Outcome,  # type: ignore[attr-defined]  # typeshed omits this private class
                   _b.BaseException, _b.Exception, _b.AssertionError]
        snap_cls = {c: dict(c.__dict__) for c in classes}
        snap_b = dict(_b.__dict__)
        # module-level functions of unittest and sys that recording an outcome goes through
        fn_types = (_types.FunctionType, _types.BuiltinFunctionType, type)
        snap_md = {m: {k: v for k, v in m.__dict__.items() if isinstance(v, fn_types)}
                   for m in (_ut, _uc, _ur, _us, _ul, _sys)}
        mods = (_ut, _uc, _ur, _us, _ul, _um, _b, _os, _sys, _json, _signal)
        snap_m = {m.__name__: m for m in mods}
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

        def changes():
            out = []
            for c, snap in snap_cls.items():
                now = c.__dict__
                if set(now) != set(snap) or any(now[k] is not v for k, v in snap.items()):
                    out.append(c.__name__)
            now = _b.__dict__
            if set(now) != set(snap_b) or any(now.get(k) is not v for k, v in snap_b.items()):
                out.append("builtins")
            for m, snap in snap_md.items():
                if any(m.__dict__.get(k) is not v for k, v in snap.items()):
                    out.append(m.__name__)
            return out + [k for k, v in snap_m.items() if _sys.modules.get(k) is not v]

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
            for m, snap in snap_md.items():
                m.__dict__.update(snap)
            _sys.modules.update(snap_m)

        run_suite, suite_cls, report_cls = _us.TestSuite.run, _us.TestSuite, _Report
        program = _types.ModuleType("__main__")
        program.__dict__["__builtins__"] = _b
        _sys.modules["__main__"] = program
        tests = _types.ModuleType("__tests__")
        _sys.modules["__tests__"] = tests
        for stage, src, module in (("solution", spec["code"], program), ("tests", spec["text"], tests)):
            _lc.cache[f"<{stage}>"] = (len(src), None, src.splitlines(True), f"<{stage}>")
            if stage == "tests":
                restore()  # what the program changed while it loaded
                tests.__dict__["__builtins__"] = _b
                for name in spec["names"]:  # the program's names the tests use, from its module
                    if name in program.__dict__:
                        value = program.__dict__[name]
                        if type(value) is _types.FunctionType:
                            value = guard.wrap_program_function(value, name)
                        tests.__dict__[name] = value
                tests.__dict__["__collab_compare__"] = guard.compare
                tests.__dict__["__collab_chain__"] = guard.chain
            else:
                guard.in_program[0] += 1
            try:
                compiled = compile(src, f"<{stage}>", "exec")
                if stage == "tests":
                    guard.trust_tests(compiled)
                exec(compiled, module.__dict__)
            except BaseException as exc:
                send({"fatal": f"the {stage} raised {type(exc).__name__!s}: {str(exc)[:300]!s}"})
                exit_(0)
            guard.in_program[0] = 0
        cls = tests.__dict__.get(spec["class"])
        if not isinstance(cls, type) or not issubclass(cls, _uc.TestCase):
            send({"fatal": f"the tests define no TestCase class {spec['class']!r}"})
            exit_(0)
        order = [sentinel(names["fail_a"]), *(cls(m) for m in spec["methods"]), sentinel(names["pass"]),
                 sentinel(names["fail_b"])]
        suite = suite_cls(order)
        run_suite(suite, report_cls(send))
        allow[0] = True
        tampered = changes()
        threads = len(listdir("/proc/self/task"))
        send({"end": True, "refused": sorted(set(refused)), "changed": tampered, "threads": threads})
    except BaseException as exc:
        send({"fatal": f"the runner failed: {type(exc).__name__!s}: {str(exc)[:300]!s}"})
    finally:
        for stream in (_sys.stdout, _sys.stderr):
            try:
                stream.flush()
            except BaseException:
                pass
        exit_(0)


def _judge(lines, status, spec):
    """The runner's verdict on what the test process reported: ``{method: (status, detail)}``."""
    names = spec["sentinels"]
    s = names["class"]
    reals = {f"{spec['class']}.{m}": m for m in spec["methods"]}
    expect = {f"{s}.{names['fail_a']}": "fail", f"{s}.{names['pass']}": "pass", f"{s}.{names['fail_b']}": "fail"}

    def every(verdict, detail):
        return {m: (verdict, str(detail)[:500]) for m in spec["methods"]}

    events: dict[str, list[tuple[str, str]]] = {}
    fixtures, end, fatal = [], None, None
    for raw in lines:
        try:
            ev = _json.loads(raw)
        except ValueError:
            return every("tampered", "a line of the report is not the runner's")
        if not isinstance(ev, dict):
            return every("tampered", "a line of the report is not the runner's")
        if end is not None:
            return every("tampered", "the report goes on after its end")
        if "fatal" in ev:
            fatal = str(ev["fatal"])
            break
        if "end" in ev:
            end = ev
            continue
        if ev.get("test") is None:
            fixtures.append(f"{ev.get('fixture')}: {ev.get('detail')}")
            continue
        if ev["test"] not in reals and ev["test"] not in expect:
            return every("tampered", f"the report names a test that was not run ({str(ev['test'])[:100]})")
        events.setdefault(ev["test"], []).append((str(ev.get("outcome")), str(ev.get("detail", ""))))
    if fatal is not None:
        return every("failed", fatal)
    exited = _os.WIFEXITED(status) and _os.WEXITSTATUS(status) == 0
    if end is None or not exited:
        why = f"signal {_os.WTERMSIG(status)}" if _os.WIFSIGNALED(status) else f"status {status >> 8}"
        return every("failed", f"the process ended before the methods were scored ({why})")
    for test, must in expect.items():
        got = events.get(test, [])
        passed = [o for o, _ in got if o == "passed"]
        failed = [o for o, _ in got if o != "passed"]
        ok = (len(got) == 1 and len(passed) == 1) if must == "pass" else (len(passed) == 0 and len(failed) >= 1)
        if not ok:
            return every("tampered", f"a sentinel test that must {must} reported {[o for o, _ in got] or 'nothing'}")
    if end.get("refused"):
        return every("failed", "refused operation: " + ", ".join(map(str, end["refused"])))
    if end.get("changed"):
        return every("failed", "the program changed the test machinery: " + ", ".join(map(str, end["changed"])))
    if end.get("threads", 1) != 1:
        return every("failed", f"threads left running after the methods ({end.get('threads')} tasks)")
    verdicts = {}
    for test, method in reals.items():
        got = events.get(test, [])
        bad = [(o, d) for o, d in got if o != "passed"]
        if not got:
            verdicts[method] = (("failed", "a fixture failed: " + "; ".join(fixtures)[:400]) if fixtures
                                else ("tampered", "the method was never reported"))
        elif bad:
            verdicts[method] = ("failed", f"{bad[0][0]}: {bad[0][1]}"[:500])
        elif len(got) != 1:
            verdicts[method] = ("tampered", "the method was reported more than once")
        else:
            verdicts[method] = ("passed", "")
    return verdicts


def _runner(d):
    cfg, report = d["cfg"], d["report"]
    spec = cfg["unittest"]
    cells = dict(zip(report.__code__.co_freevars, report.__closure__))
    status_fd = cells["status_fd"].cell_contents
    for name in spec.get("preimport", ()):
        try:
            _importlib.import_module(name)
        except BaseException:
            pass
    # Non-dumpable: a process of the same uid (the test process) cannot open /proc/<runner>/fd/*
    # (the run's status pipe) or /proc/<runner>/mem, nor ptrace it.
    _ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE
    r, w = _os.pipe()
    pid = _os.fork()
    if pid == 0:
        _os.close(r)
        _test_process(cfg, spec, w, status_fd)
    _os.close(w)
    got = bytearray()
    while True:
        chunk = _os.read(r, 1 << 16)
        if not chunk:
            break
        if len(got) < _MAX_REPORT:
            got += chunk
    _os.close(r)
    _, status = _os.waitpid(pid, 0)
    lines = [ln for ln in bytes(got).decode("utf-8", "replace").splitlines() if ln.strip()]
    if len(got) >= _MAX_REPORT:
        verdicts = {m: ("tampered", "the report is larger than any run writes") for m in spec["methods"]}
    else:
        verdicts = _judge(lines, status, spec)
    report("unittest", verdicts={m: list(v) for m, v in verdicts.items()})


if __name__ == "__main__":  # as the driver (importing this module runs nothing)
    _runner(_DRIVER)

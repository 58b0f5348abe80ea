"""Scoring code where the candidate cannot reach: :func:`run_tests` and :func:`arun_tests`.

The verdict of a code reward must not depend on anything the candidate's program can touch
(DESIGN.md, "Integrity"). :func:`run_tests` runs a candidate program against its tests in one
of two ways, picked from the tests (``style="auto"``):

Function-call tests (``style="calls"``: assert scripts, HumanEval's ``check(candidate)``, per-assert lists)
    Two sandboxed processes, each with the run's :class:`~collab_env.sandbox.SandboxLimits`:

    * the **candidate server** runs only the candidate program. It never receives a test or an
      expected value: only call requests (a function name and argument values). Each call runs
      in a process forked for it (killed at the call's time limit), and its result goes back as
      plain data (a tagged JSON tree of ``None``, ``bool``, ``int`` of any size (past 2**64 as
      hex, which has no digit limit), ``float`` including ``nan``/``inf``, ``str``, ``bytes``,
      ``complex``, lists, tuples, sets, frozensets and dicts, and a generator, whose first
      100,000 items cross and come back as a fresh generator), never pickle. An exception comes
      back as its type name and message. Mutable arguments (lists, dicts, sets, bytearrays)
      come back as the call left them and the harness updates its own in place, so
      ``f(xs); assert xs == ...`` tests an in-place change. Tests that use an *object* of the
      candidate's class (``Solution().twice(2)``, ``isinstance(x, Point)``) are an
      ``"unsupported test form: ..."`` error: only plain data crosses.
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

Unittest suites (``style="unittest"``: ``class TestCases(unittest.TestCase)``, as in BigCodeBench)
    The suite is read on the trusted side (:func:`collab_env.sandbox.suites.parse_suite`,
    nothing executed): every ``TestCase`` class however it is spelled (``import unittest as
    ut``, ``from unittest import TestCase as TC``, a class under ``if`` or ``try``, bases from
    the text), the methods unittest's loader would run, in its order, and the footer
    (``unittest.main()``, ``if __name__ == "__main__":``) turned into ``pass``. A form the scorer
    cannot judge is an ``"error"`` whose detail starts ``"unsupported test form: "`` (a test
    class made in a function or a loop, a test method bound by assignment, ``load_tests``, a
    runner started at import); a suite with no test method is an ``"error"``; neither is a pass.
    ``pass_rate`` is passed methods over found methods. Two ways to run it:

    * **In the trusted harness** (a suite that only calls the candidate: no mock library, no
      reach into ``__main__`` or ``sys.modules``): the whole module runs in the harness process
      as unittest runs it (``setUpModule``, ``setUpClass``, ``setUp``, subtests), the candidate's
      names are proxies as for function-call tests. If a result of the candidate's cannot cross
      as plain data (a ``datetime``, a ``DataFrame``, an object of its class), the suite runs
      the second way instead.
    * **Beside the candidate** (mocks patched into its module), each test class in a fresh
      sandboxed process (with the time and CPU one process per method would have had), judged
      by :mod:`collab_env.sandbox.guest.unittest_runner`: a runner that never runs candidate
      text forks the test process and checks what it reports. The
      test process pins the machinery before the program loads (an audit hook refusing tracing,
      ``gc`` object walks, ``ctypes`` and ``/proc/*/mem``; the state of ``unittest``'s classes
      and module functions, ``sys``'s functions and ``builtins``), loads the program as the
      module ``__main__``, restores what it changed, and loads the tests as a module of their
      own whose ``__builtins__`` is the real ``builtins`` and which gets the program's names as
      attributes of its module. Comparisons are checked, not trusted: the assert helpers, every
      comparison the tests' text makes (rewritten by
      :func:`~collab_env.sandbox.suites.checked_comparisons`) and every result of the program's
      functions refuse a value whose comparison the program wrote (a class of its own with
      comparison methods from any file, a function compiled under a library's file name, a
      builtin or a C slot under another name posing as ``__eq__``, ``mock.ANY`` and mocks the
      program made; the tests' own mocks compare by identity). Around the class's methods it runs
      three sentinel tests with random names: one that must fail, one that must pass, one that must
      error. The runner believes the report only if every test is reported once, nothing else
      is, and the sentinels come out as they must; otherwise its methods are ``"tampered"``,
      the suite's status is ``"tampered"``, it scores 0 (``TestRunResult.num_passed``), and
      ``TestRunResult.tampered`` counts the tampered methods.

    **Residual risk** (beside the candidate only). The program shares the test process with the
    tests, so a program written against this runner can still forge: walk its frames to the
    test process's reporting pipe and write every outcome, sentinels included (their names
    are in its memory); compare through a function it took from a library that returns a
    constant; hide its own always-equal values inside a library object the tests compare with
    library code (``df.equals``); configure a child of one of the tests' own mocks; or act
    through operations other than comparisons (``len(x)``, ``if x:``) on objects of its own
    classes. Our hostile set (``tests/sandbox/hostile_unittest.py``: 21 generic programs, each
    of which scored 1.0 on some suite before, 17 of 21 beside the candidate) scores 0 on every
    suite. Suites run in the trusted harness have no such risk.

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
import re
import secrets
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Literal

from collab_env.errors import ConfigError, SandboxError
from collab_env.sandbox.config import SandboxLimits, SandboxResult
from collab_env.sandbox.guest import program
from collab_env.sandbox.pyparse import parse_python
from collab_env.sandbox.suites import UNSUPPORTED, UnittestSuite, checked_comparisons, parse_suite

__all__ = [
    "TestOutcome",
    "TestRunResult",
    "run_tests",
    "arun_tests",
    "reuse_test_results",
    "find_unittest_methods",
    "test_style",
    "prompt_prelude",
    "extract_code_block",
]

Style = Literal["auto", "calls", "unittest"]
TestStatus = Literal["passed", "failed", "timeout", "not_run", "tampered"]

# ---------------------------------------------------------------------------------------------
# The trusted side: parsing the tests, starting the processes, counting the results
# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class TestOutcome:
    """One test's result.

    Attributes:
        index: Position of the test (in ``tests``, or the method's order in the suite).
        name: ``"test <index>"`` for function-call tests, ``"Class.method"`` for unittest.
        status: ``"passed"``, ``"failed"``, ``"timeout"``, ``"not_run"`` (after too many
            timeouts, or when the run ended before the test) or ``"tampered"`` (its same-process
            run misreported the sentinel tests).
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
        status: ``"passed"`` (every test passed), ``"error"`` (no test found, or an
            ``"unsupported test form: ..."``: never a pass), ``"tampered"`` (a same-process
            run misreported its sentinel tests: the suite scores 0),
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
        """Passed tests (``0`` when a run was tampered with: its passes are not believed)."""
        return 0 if self.status == "tampered" else sum(t.passed for t in self.tests)

    @property
    def tampered(self) -> int:
        """Test methods whose run misreported its sentinels (same-process unittest suites)."""
        return sum(t.status == "tampered" for t in self.tests)

    @property
    def pass_rate(self) -> float:
        """Passed tests over tests (``0.0`` with no test)."""
        return self.num_passed / self.total if self.tests else 0.0

    @property
    def passed(self) -> bool:
        return self.status == "passed"


def find_unittest_methods(tests: str) -> list[tuple[str, str]]:
    """``(class, method)`` of every test method of the ``unittest.TestCase`` classes in ``tests``,
    in the order unittest's loader runs them (:func:`collab_env.sandbox.suites.parse_suite`: found
    from the syntax tree, nothing is executed). ``[]`` for text that does not parse or has none."""
    suite = parse_suite(tests)
    return list(suite.methods) if suite is not None else []


def test_style(tests: str | Sequence[str]) -> Literal["calls", "unittest"]:
    """``"unittest"`` when the text defines a ``unittest.TestCase`` class (however it is spelled,
    :func:`~collab_env.sandbox.suites.parse_suite`), else ``"calls"``."""
    if isinstance(tests, str) and parse_suite(tests) is not None:
        return "unittest"
    return "calls"


_CODE_BLOCK = re.compile(r"```[ \t]*(?:python3?|py|Python)?[ \t]*\n(.*?)```", re.DOTALL)


def extract_code_block(text: str) -> str | None:
    """The last fenced code block (```` ```python ```` or untagged) of ``text``, or ``None``: the
    program a chat reply delivers (the ``pass_rate`` metric and the sharded envs score it)."""
    blocks = _CODE_BLOCK.findall(text)
    return blocks[-1] if blocks else None


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


def _unsupported_call_form(tests: Sequence[str], prelude: str, entry_point: str | None) -> str | None:
    """``"unsupported test form: ..."`` when function-call tests use an *object* of the candidate's
    (``Solution().twice(2)``, ``s = Stack(); s.push(1)``, ``isinstance(x, Point)``): such an object
    would have to cross to the trusted side, and only plain data does. Found from the tests'
    syntax: a class-like (capitalised) candidate name whose call result is used as an object."""
    proxied = {n for n in _proxy_names(tests, prelude, entry_point) if n[:1].isupper()}
    if not proxied:
        return None
    for src in tests:
        try:
            tree = parse_python(src)
        except SyntaxError:
            continue
        objects = {t.id for n in ast.walk(tree) if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
                   and isinstance(n.value.func, ast.Name) and n.value.func.id in proxied
                   for t in n.targets if isinstance(t, ast.Name)}
        for n in ast.walk(tree):
            used = None
            if isinstance(n, ast.Attribute):
                v = n.value
                if isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id in proxied:
                    used = f"{v.func.id}().{n.attr}"
                elif isinstance(v, ast.Name) and v.id in objects:
                    used = f"{v.id}.{n.attr}"
            elif (isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("isinstance", "issubclass")
                  and len(n.args) == 2 and isinstance(n.args[1], ast.Name) and n.args[1].id in proxied):
                used = f"{n.func.id}(..., {n.args[1].id})"
            if used is not None:
                return (UNSUPPORTED + f"the tests use an object of the candidate's class ({used}); only plain "
                        "data crosses from the candidate to function-call tests (write the tests as calls "
                        "that return plain data, or as a unittest suite)")
    return None


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
        result = _run_unittest(code, seq[0], limits, max_timeouts, start)
    else:
        calls = _run_calls(code, seq, entry_point, prelude, limits, max_timeouts, start)
        assert calls is not None  # only a unittest suite falls back
        result = calls
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


def _run_calls(code, tests, entry_point, prelude, limits, max_timeouts, start, suite=None) -> TestRunResult | None:
    """Function-call tests, or (``suite``) a unittest suite run in the trusted harness."""
    from collab_env.sandbox.run import run_driver

    if not tests:
        return _result("error", "calls", [], "no test to run", None, None, start)
    try:
        parse_python(prelude)
    except SyntaxError as exc:
        raise ConfigError(f"the prelude does not parse: {exc}") from exc
    if suite is None:
        form = _unsupported_call_form(tests, prelude, entry_point)
        if form is not None:
            return _result("error", "calls", [], form, None, None, start)
    names = _proxy_names(tests, prelude, entry_point)
    labels = [f"test {i}" for i in range(len(tests))] if suite is None else [f"{c}.{m}" for c, m in suite.methods]
    call_timeout = _call_timeout(limits)
    wall = _harness_wall(limits, len(tests), max_timeouts)
    if suite is not None:  # as much time as one process per method would have had
        wall = limits.wall_s * len(labels) + call_timeout + 2.0
    req_r, req_w = os.pipe()
    rep_r, rep_w = os.pipe()
    server_limits = dataclasses.replace(limits, wall_s=wall + 2.0, max_processes=max(limits.max_processes, 3))
    harness_limits = dataclasses.replace(limits, wall_s=wall, cpu_s=max(limits.cpu_s, wall))
    box: dict = {}

    def serve() -> None:
        try:
            box["result"] = run_driver(code, server_limits, driver=program("server"), pass_fds=(req_r, rep_w), config={
                "serve": {"req_fd": req_r, "rep_fd": rep_w, "call_timeout_s": call_timeout}})
        except BaseException as exc:  # re-raised below, in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=serve, name="sandbox-candidate", daemon=True)
    thread.start()
    try:
        h, h_records = run_driver("", harness_limits, driver=program("call_harness"), pass_fds=(req_w, rep_r), config={
            "harness": {"req_fd": req_w, "rep_fd": rep_r, "tests": list(tests), "prelude": prelude,
                        "names": names, "max_timeouts": max_timeouts, "call_timeout_s": call_timeout,
                        "suite": None if suite is None else {"text": suite.text, "methods": suite.methods}}})
    finally:
        thread.join()
    if "error" in box:
        raise box["error"]
    cand, c_records = box["result"]
    outcomes = []
    for i, label in enumerate(labels):
        rec = h_records.get(f"test:{i}")
        if rec is None:
            outcomes.append(TestOutcome(i, label, "not_run", f"the harness ended first ({h.status}: {h.detail})"))
        else:
            outcomes.append(TestOutcome(i, label, rec.get("status", "failed"), str(rec.get("detail", "")),
                                        rec.get("line")))
    if not any(k.startswith("test:") for k in h_records) and \
            h.status not in ("timeout", "out_of_memory", "output_limit"):
        raise SandboxError(f"the test harness did not run ({h.status}: {h.detail}); stderr: {h.stderr[-1000:]!r}")
    load = c_records.get("load", {}).get("error")
    if suite is not None and "unplain" in h_records:
        return None  # a result that cannot cross: the suite runs beside the candidate instead
    return _summarise("unittest" if suite is not None else "calls", outcomes, cand, h, start,
                      load if isinstance(load, str) else None)


def _summarise(style, outcomes, cand, harness, start, load_error=None) -> TestRunResult:
    first = next((o for o in outcomes if not o.passed), None)
    if first is None:
        return _result("passed", style, outcomes, "every test passed", cand, harness, start, load_error)
    status = {"not_run": "failed"}.get(first.status, first.status)
    tampered = next((o for o in outcomes if o.status == "tampered"), None)
    if tampered is not None:  # the candidate tampered with the runner: the whole suite scores 0
        detail = f"{tampered.name}: tampered: {tampered.detail}"
        return _result("tampered", style, outcomes, detail, cand, harness, start, load_error)
    if cand is not None and cand.status in ("out_of_memory", "forbidden", "output_limit", "timeout"):
        status = cand.status
    elif harness is not None and harness.status == "timeout":
        status = "timeout"
    detail = f"{first.name}: {first.detail}" if first.detail else first.name
    if load_error:
        detail = f"the program did not load: {load_error}"
    return _result(status, style, outcomes, detail, cand, harness, start, load_error)


def _imported_modules(*texts: str) -> list[str]:
    """Top-level modules the texts import (absolute imports), to be loaded before the program."""
    found: list[str] = []
    for text in texts:
        try:
            tree = parse_python(text)
        except SyntaxError:
            continue
        for n in ast.walk(tree):
            if isinstance(n, ast.Import):
                found += [a.name for a in n.names]
            elif isinstance(n, ast.ImportFrom) and n.module and n.level == 0:
                found.append(n.module)
    return [m for m in dict.fromkeys(found) if m != "__main__"][:64]


def _run_unittest(code: str, tests: str, limits: SandboxLimits, max_timeouts: int, start: float) -> TestRunResult:
    suite = parse_suite(tests)
    if suite is None:
        return _result("error", "unittest", [], "no unittest TestCase class found in the tests "
                       "(a suite with no test is an error, never a pass)", None, None, start)
    if suite.unsupported is not None:
        return _result("error", "unittest", [], suite.unsupported, None, None, start)
    if not suite.methods:
        return _result("error", "unittest", [], "no unittest test method found in the tests "
                       "(a suite with no test is an error, never a pass)", None, None, start)
    if suite.same_process is None:
        trusted = _run_calls(code, [suite.text], None, "", limits, max_timeouts, start, suite=suite)
        if trusted is not None:
            return trusted
    return _run_beside(code, suite, limits, start)


def _run_beside(code: str, suite: UnittestSuite, limits: SandboxLimits, start: float) -> TestRunResult:
    """Each class's methods in a fresh sandboxed process beside the candidate (with the time one
    process per method would have had), their verdicts checked by the runner
    (:mod:`collab_env.sandbox.guest.unittest_runner`)."""
    from collab_env.sandbox.run import run_driver

    names = _proxy_names([suite.text], "", None)
    preimport = _imported_modules(suite.text, code)
    text = checked_comparisons(suite.text)
    by_class: dict[str, list[str]] = {}
    for cls, method in suite.methods:
        by_class.setdefault(cls, []).append(method)
    outcomes: list[TestOutcome] = []
    first_bad, any_run = None, None
    for cls, methods in by_class.items():
        sentinels = {"class": f"Sentinel_{secrets.token_hex(8)}", "fail_a": f"test_{secrets.token_hex(6)}",
                     "pass": f"test_{secrets.token_hex(6)}", "fail_b": f"test_{secrets.token_hex(6)}"}
        k = len(methods)
        run_limits = dataclasses.replace(limits, wall_s=limits.wall_s * k, cpu_s=limits.cpu_s * k)
        res, records = run_driver("", run_limits, driver=program("unittest_runner"), config={
            "unittest": {"code": code, "text": text, "class": cls, "methods": methods, "names": names,
                         "sentinels": sentinels, "preimport": preimport}})
        any_run = any_run or res
        verdicts = records.get("unittest", {}).get("verdicts")
        bad = False
        for method in methods:
            i, name = len(outcomes), f"{cls}.{method}"
            got = verdicts.get(method) if isinstance(verdicts, dict) else None
            if isinstance(got, list) and len(got) == 2 and got[0] in ("passed", "failed", "tampered"):
                status: TestStatus = got[0]
                outcomes.append(TestOutcome(i, name, status, str(got[1])))
            else:
                status = "timeout" if res.status == "timeout" else "failed"
                outcomes.append(TestOutcome(i, name, status, f"the process ended before the method was scored "
                                                              f"({res.status}: {res.detail})"))
            bad = bad or status != "passed"
        if bad:
            first_bad = first_bad or res
    return _summarise("unittest", outcomes, first_bad or any_run, None, start)

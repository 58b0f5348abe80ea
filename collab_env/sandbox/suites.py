"""Reading a ``unittest`` suite from its syntax tree, on the trusted side: :func:`parse_suite`.

Nothing here executes the tests. The parse finds every ``TestCase`` class however the suite
spells it (``import unittest as ut``, ``from unittest import TestCase as TC``, a class defined
under an ``if`` or a ``try``, bases that are other classes of the text), the test methods
unittest's loader would run (names starting with ``test``, inherited ones included, in the
loader's order: classes and methods sorted by name), and the suite's footer (``if __name__ ==
"__main__": unittest.main()``, a bare ``unittest.main()``), which it turns into ``pass`` so that
loading the suite never runs it. It says whether the suite must run in the candidate's process
(it patches with mocks, or reaches the candidate's module by name) and names a form the scorer
cannot judge (``"unsupported test form: ..."``): a test class defined inside a function or a
loop, a test method bound by assignment or under a condition in a class body, ``load_tests``,
a runner started at import, a class defined twice.

:mod:`collab_env.sandbox.harness` scores the suite from this parse: the count of methods the
trusted side found is the count a run must report.
"""

from __future__ import annotations

import ast
import dataclasses

from collab_env.sandbox.pyparse import parse_python

__all__ = ["UnittestSuite", "parse_suite", "checked_comparisons", "UNSUPPORTED"]

#: The prefix of every error about a suite form the scorer cannot judge.
UNSUPPORTED = "unsupported test form: "

_CASE_NAMES = ("TestCase", "IsolatedAsyncioTestCase")
_MOCK_MODULES = ("unittest.mock", "mock")


@dataclasses.dataclass(frozen=True)
class UnittestSuite:
    """What the trusted side knows about a unittest suite before anything runs.

    Attributes:
        methods: ``(class, method)`` of every test method, in unittest's loading order.
        text: The suite's text with its footer (``unittest.main()`` and ``if __name__ ==
            "__main__":`` blocks) replaced by ``pass`` (line numbers unchanged).
        same_process: Why the suite must run beside the candidate (it imports a mock library,
            or names the candidate's module), or ``None``: its methods only call the candidate.
        unsupported: ``"unsupported test form: ..."`` when the scorer cannot judge the suite,
            else ``None``.
    """

    methods: tuple[tuple[str, str], ...]
    text: str
    same_process: str | None
    unsupported: str | None


class _Aliases:
    """The names under which the text reaches ``unittest``, its test case classes and ``main``."""

    def __init__(self, tree: ast.Module) -> None:
        self.modules: set[str] = set()   # names bound to the unittest package
        self.cases: set[str] = set()     # names bound to TestCase classes
        self.mains: set[str] = set()     # names bound to unittest.main
        self.runners: set[str] = {"TextTestRunner"}
        self.mock: str | None = None
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name == "unittest" or a.name.startswith("unittest."):
                        self.modules.add((a.asname or "unittest") if a.name == "unittest" or not a.asname
                                         else a.asname)
                    if a.name in _MOCK_MODULES or a.name.startswith("unittest.mock"):
                        self.mock = f"it imports {a.name}"
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                mod = node.module
                if mod in _MOCK_MODULES or mod.startswith(("unittest.mock", "mock.")):
                    self.mock = f"it imports from {mod}"
                if mod not in ("unittest", "unittest.case", "unittest.main", "unittest.runner"):
                    continue
                for a in node.names:
                    bound = a.asname or a.name
                    if a.name == "*":
                        self.cases.update(_CASE_NAMES)
                        self.mains.add("main")
                    elif a.name in _CASE_NAMES:
                        self.cases.add(bound)
                    elif a.name == "main":
                        self.mains.add(bound)
                    elif a.name == "mock":
                        self.mock = "it imports unittest.mock"
                    elif a.name == "TextTestRunner":
                        self.runners.add(bound)

    def is_module(self, node: ast.expr) -> bool:
        if isinstance(node, ast.Name):
            return node.id in self.modules
        return isinstance(node, ast.Attribute) and node.attr in ("case", "main") and self.is_module(node.value)

    def is_case(self, node: ast.expr, known: dict[str, list[str]]) -> bool:
        if isinstance(node, ast.Name):
            return node.id in self.cases or node.id in known or node.id.endswith("TestCase")
        if isinstance(node, ast.Attribute):
            return (node.attr in _CASE_NAMES and self.is_module(node.value)) or node.attr.endswith("TestCase")
        return False

    def is_main(self, node: ast.expr) -> bool:
        if isinstance(node, ast.Name):
            return node.id in self.mains
        return isinstance(node, ast.Attribute) and node.attr == "main" and self.is_module(node.value)

    def is_runner(self, node: ast.expr) -> bool:
        name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
        return name in self.runners or self.is_main(node)


def _is_main_guard(node: ast.If) -> bool:
    t = node.test
    if not (isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], ast.Eq)):
        return False
    sides = [t.left, t.comparators[0]]
    return (any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides)
            and any(isinstance(s, ast.Constant) and s.value == "__main__" for s in sides))


def _blank(lines: list[str], node: ast.stmt) -> None:
    """Replace the statement's lines by ``pass`` (line numbers unchanged)."""
    first, last = node.lineno - 1, (node.end_lineno or node.lineno) - 1
    lines[first] = " " * node.col_offset + "pass\n"
    for i in range(first + 1, last + 1):
        lines[i] = "\n"


def parse_suite(tests: str) -> UnittestSuite | None:
    """The :class:`UnittestSuite` of ``tests``, or ``None`` when the text defines no ``TestCase``
    class (or does not parse: then it is not a suite, and function-call scoring reports it)."""
    try:
        tree = parse_python(tests)
    except SyntaxError:
        return None
    names = _Aliases(tree)
    texts: dict[str, list[str]] = {}   # every class of the text -> its own test methods (+ inherited)
    cases: dict[str, list[str]] = {}   # the TestCase classes among them
    removals: list[ast.stmt] = []
    problems: list[str] = []

    def visit_class(node: ast.ClassDef, top: bool) -> None:
        own, inherited, is_case = [], [], False
        for base in node.bases:
            if isinstance(base, ast.Name) and base.id in texts:
                inherited += texts[base.id]
            if names.is_case(base, cases):
                is_case = True
        if not is_case and not top:
            return
        for item in node.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if item.name.startswith("test"):
                    own.append(item.name)
            elif isinstance(item, (ast.Assign, ast.AnnAssign)):
                targets = item.targets if isinstance(item, ast.Assign) else [item.target]
                for t in targets:
                    if isinstance(t, ast.Name) and t.id.startswith("test"):
                        problems.append(f"a test method bound by assignment ({node.name}.{t.id})")
            elif isinstance(item, (ast.If, ast.Try, ast.For, ast.While, ast.With)) and any(
                    isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name.startswith("test")
                    for n in ast.walk(item)):
                problems.append(f"a test method defined under a statement in the body of {node.name}")
        methods = list(dict.fromkeys(inherited + own))
        if node.name in texts and is_case:
            problems.append(f"the TestCase class {node.name} is defined twice")
        texts[node.name] = methods
        if is_case:
            cases[node.name] = methods

    def visit(stmts: list[ast.stmt]) -> None:
        for node in stmts:
            if isinstance(node, ast.ClassDef):
                visit_class(node, True)
            elif isinstance(node, ast.If) and _is_main_guard(node):
                removals.append(node)
            elif isinstance(node, ast.If):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for h in node.handlers:
                    visit(h.body)
                visit(node.orelse)
                visit(node.finalbody)
            elif isinstance(node, ast.With):
                visit(node.body)
            elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and names.is_main(node.value.func):
                removals.append(node)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "load_tests":
                problems.append("the load_tests protocol")
            else:
                for sub in ast.walk(node):
                    if isinstance(sub, ast.ClassDef) and any(names.is_case(b, cases) for b in sub.bases):
                        where = "a function" if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else \
                            f"a {type(node).__name__.lower()} statement"
                        problems.append(f"a TestCase class defined inside {where} ({sub.name})")
                        break
                    if (isinstance(sub, ast.Call) and names.is_runner(sub.func)
                            and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))):
                        problems.append(f"a test runner started when the tests load (line {sub.lineno})")
                        break

    visit(tree.body)
    if not cases and not problems:
        return None
    lines = tests.splitlines(keepends=True)
    for node in removals:
        _blank(lines, node)
    methods = tuple((c, m) for c in sorted(cases) for m in sorted(cases[c]))
    same = names.mock
    footer = {id(n) for r in removals for n in ast.walk(r)}
    if same is None and any(isinstance(n, ast.Constant) and isinstance(n.value, str) and "__main__" in n.value
                            for n in ast.walk(tree) if id(n) not in footer):
        same = "it names the candidate's module (__main__)"
    if same is None and any(isinstance(n, ast.Attribute) and n.attr == "modules"
                            and isinstance(n.value, ast.Name) and n.value.id == "sys" for n in ast.walk(tree)):
        same = "it reaches sys.modules"
    unsupported = (UNSUPPORTED + "; ".join(dict.fromkeys(problems))) if problems else None
    return UnittestSuite(methods=methods, text="".join(lines), same_process=same, unsupported=unsupported)


class _Comparisons(ast.NodeTransformer):
    """Every comparison of the tests as a call of the runner's checked comparison."""

    def visit_ClassDef(self, node: ast.ClassDef) -> ast.ClassDef:
        # statements right in a class body stay as they are (a call there could not see the
        # class's own names the way a comparison does); the methods are rewritten
        for i, item in enumerate(node.body):
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                node.body[i] = self.visit(item)
        return node

    def visit_Compare(self, node: ast.Compare) -> ast.expr:
        self.generic_visit(node)
        if any(isinstance(n, (ast.NamedExpr, ast.Await, ast.Yield, ast.YieldFrom)) for n in ast.walk(node)):
            return node  # a lambda would change what these mean
        ops = [ast.Constant(type(op).__name__) for op in node.ops]
        if len(node.ops) == 1:
            call = ast.Call(ast.Name("__collab_compare__", ast.Load()), [node.left, ops[0], node.comparators[0]], [])
        else:
            args: list[ast.expr] = [node.left]
            for op, right in zip(ops, node.comparators):
                args += [op, ast.Lambda(ast.arguments([], [], None, [], [], None, []), right)]
            call = ast.Call(ast.Name("__collab_chain__", ast.Load()), args, [])
        return ast.copy_location(call, node)


def checked_comparisons(text: str) -> str:
    """``text`` with each comparison (``a == b``, ``x in y``, chains) turned into a call of
    ``__collab_compare__(a, "Eq", b)`` (``__collab_chain__`` for a chain), which the same-process
    runner binds to a comparison that refuses values whose comparison the program wrote."""
    tree = _Comparisons().visit(parse_python(text))
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"

"""parse_python: the library's one ast.parse, safe across threads (CPython 3.11's AST
constructor keeps its recursion depth in shared state; concurrent ast.parse calls in threads
failed CI once with "SystemError: AST constructor recursion depth mismatch")."""

import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from collab_env.sandbox.pyparse import parse_python

ROOT = Path(__file__).resolve().parents[2]


def test_the_library_parses_python_only_through_parse_python():
    offenders = []
    for f in (ROOT / "collab_env").rglob("*.py"):
        if f.name == "pyparse.py":
            continue
        for i, line in enumerate(f.read_text(encoding="utf-8").splitlines(), start=1):
            if re.search(r"\bast\.parse\(|PyCF_ONLY_AST", line):
                offenders.append(f"{f.relative_to(ROOT)}:{i}")
    assert not offenders, f"use collab_env.sandbox.pyparse.parse_python instead: {offenders}"


def test_parse_python_in_many_threads():
    # A smoke test of the lock only: plain ast.parse did not fail this way in isolation either
    # (5 x 400 parses); the CI failure needed the rewards' threads with their subprocess waits.
    src = "x = " + "(" * 60 + "1" + ")" * 60 + "\n" + "\n".join(
        f"def f{i}(a):\n    return [[b + {i} for b in range(a)] for _ in range(3)]" for i in range(50))
    with ThreadPoolExecutor(8) as ex:
        trees = list(ex.map(lambda _: parse_python(src), range(400)))
    assert all(len(t.body) == 51 for t in trees)

"""HumanEval offline (collab_env.tasks.humaneval_data) and the coding envs humaneval-v0 and
coop-humaneval-v0 (collab_env.tasks.coop_code). Sandboxed runs are real subprocesses."""

from __future__ import annotations

import pytest

from collab_env.errors import ConfigError, MissingDependencyError
from collab_env.tasks import humaneval_data
from collab_env.tasks.humaneval_data import humaneval_problem, load_humaneval, run_tests


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------
def test_load_humaneval_reads_the_164_problems_in_file_order():
    problems = load_humaneval()
    assert len(problems) == 164
    assert [p.task_id for p in problems[:3]] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    assert problems[0].entry_point == "has_close_elements"
    assert humaneval_problem("HumanEval/163") is problems[163]
    assert humaneval_problem(10).entry_point == "make_palindrome"
    with pytest.raises(ConfigError, match="HumanEval/0"):
        humaneval_problem("HumanEval/999")


def test_missing_package_names_the_extra(monkeypatch):
    import importlib.resources

    def gone(name):
        raise ModuleNotFoundError(f"No module named {name!r}")

    humaneval_data._load.cache_clear()
    monkeypatch.setattr(importlib.resources, "files", gone)
    try:
        with pytest.raises(MissingDependencyError, match=r"collab-env\[humaneval\]"):
            load_humaneval()
    finally:
        monkeypatch.undo()
        humaneval_data._load.cache_clear()
    assert len(load_humaneval()) == 164


def test_run_tests_passes_the_canonical_solution_and_names_the_first_failing_assert():
    p = humaneval_problem(0)
    ok = run_tests(p.canonical_program(), p)
    assert ok.passed and ok.status == "passed" and ok.first_failure is None
    # Always False: the first assert of check() expects True.
    bad = run_tests(p.prompt + "    return False\n", p)
    assert not bad.passed and bad.status == "failed"
    assert bad.first_failure == "assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3) == True -> AssertionError"
    # No solution at all: the call in the tests fails with a NameError.
    empty = run_tests("", p)
    assert empty.first_failure == "check(has_close_elements) -> NameError: name 'has_close_elements' is not defined"
    # A syntax error in the program: no test line is involved.
    broken = run_tests("def has_close_elements(:\n", p)
    assert not broken.passed and broken.first_failure.startswith("SyntaxError")

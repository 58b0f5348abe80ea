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
    # No solution at all: the first call of the candidate fails with a NameError (from the
    # candidate's process, re-raised in the harness as the builtin NameError).
    assert empty.first_failure == ("assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3) == True -> "
                                   "NameError: name 'has_close_elements' is not defined")
    # A syntax error in the program: no test line is involved.
    broken = run_tests("def has_close_elements(:\n", p)
    assert not broken.passed and broken.first_failure.startswith("SyntaxError")


# ---------------------------------------------------------------------------------------------
# coop-humaneval: the split, the reward, the feedback
# ---------------------------------------------------------------------------------------------
import collab_env  # noqa: E402
from collab_env.errors import SandboxError, TaskFunctionError  # noqa: E402
from collab_env.tasks import coop_code  # noqa: E402
from collab_env.tasks.coop_code import (  # noqa: E402
    canonical_split,
    cleanup_code,
    comlrl_code_reward,
    humaneval_reward,
    is_thin_wrapper,
    solution_program,
)

# A fixed sample for make test (the 164/164 run is benchmarks/bench_coop_humaneval.py
# --check-canonical): the four problems whose prompt defines a helper, three whose canonical body
# nests one, and plain ones.
SAMPLE = (0, 2, 6, 10, 32, 38, 50, 53, 94, 145, 163)


@pytest.mark.parametrize("index", SAMPLE)
def test_canonical_split_passes_and_empty_or_wrong_answers_do_not(index):
    p = humaneval_problem(index)
    aux, main = canonical_split(p)
    assert run_tests(solution_program(p.as_item(), aux, main), p).passed
    assert not run_tests(solution_program(p.as_item(), "", ""), p).passed
    wrong = f"def {p.entry_point}(*args, **kwargs):\n    return None\n"
    assert not run_tests(solution_program(p.as_item(), aux, wrong), p).passed


def test_cleanup_keeps_functions_and_drops_prose_and_fences():
    text = "Here is my answer:\n```python\ndef aux(x):\n    return x + 1\n```\nThis adds one."
    assert cleanup_code(text) == "def aux(x):\n    return x + 1"
    assert cleanup_code("no code at all") == ""


def test_thin_wrapper_rule():
    assert is_thin_wrapper("def f(x):\n    return aux(x)")
    assert is_thin_wrapper("def f(x):\n    r = aux(x)\n    return r")
    assert not is_thin_wrapper("def f(x):\n    r = aux(x)\n    return r + 1")


ITEM0 = humaneval_problem(0).as_item()  # 7 asserts in check()
GOOD_AUX = "def aux(numbers, threshold):\n    return [abs(a - b) for i, a in enumerate(numbers) for b in numbers[i + 1:]]\n"
WRONG_MAIN = "def has_close_elements(numbers, threshold):\n    return not aux(numbers, threshold)\n"
GOOD_MAIN = ("def has_close_elements(numbers, threshold):\n    gaps = aux(numbers, threshold)\n"
             "    return any(g < threshold for g in gaps)\n")


def test_reward_levels_by_hand():
    # Level 3 full: 0.4 + 0.6 + 0.5 + 7/7 + 0.5 (calls aux) + 1.0 (not a wrapper) = 4.0.
    assert comlrl_code_reward([GOOD_AUX], [GOOD_MAIN], batch_items=[ITEM0]) == [4.0]
    # The canonical split: main is a thin wrapper: 0.4 + 0.6 + 0.5 + 1 + 0.5 = 3.0.
    aux, main = canonical_split(humaneval_problem(0))
    assert comlrl_code_reward([aux], [main], batch_items=[ITEM0]) == [3.0]
    # Wrong answer (the canonical aux negated): no assert passes, no bonus: 0.4 + 0.6 + 0.5 = 1.5.
    assert comlrl_code_reward([aux], [WRONG_MAIN], batch_items=[ITEM0]) == [1.5]
    # Always False passes the 3 asserts expecting False: 0.4 + 0.6 + 0.5 + 3/7 (no aux call: no
    # bonus). 3/7 is rounded once; the sum of four more floats stays within 1e-12.
    false = "def has_close_elements(numbers, threshold):\n    return False\n"
    assert comlrl_code_reward([GOOD_AUX], [false], batch_items=[ITEM0]) == [pytest.approx(1.5 + 3 / 7, abs=1e-12)]
    # No main function: only the aux definition counts; empty answers score 0.
    assert comlrl_code_reward([GOOD_AUX], ["I cannot do this."], batch_items=[ITEM0]) == [0.4]
    assert comlrl_code_reward([""], [""], batch_items=[ITEM0]) == [0.0]
    # A syntax error in the composed code stops at level 1: 0.4 + 0.6.
    broken = "def has_close_elements(numbers, threshold):\n    return (1 +\n"
    assert comlrl_code_reward([GOOD_AUX], [broken], batch_items=[ITEM0]) == [1.0]
    # Single agent: no aux, so at most 0.6 + 0.5 + 1.
    assert humaneval_reward([humaneval_problem(0).canonical_program()], batch_items=[ITEM0]) == [2.1]


def test_coop_env_scores_both_agents_and_shows_the_first_failing_assert():
    env = collab_env.make("coop-humaneval-v0", num_turns=2)
    obs, _ = env.reset(seed=0, options={"index": 0})
    assert "helper function" in obs["aux"].messages[-1].content
    assert "has_close_elements(numbers: List[float], threshold: float)" in obs["main"].messages[-1].content
    aux, _ = canonical_split(humaneval_problem(0))
    obs, rewards, terms, _, infos = env.step({"aux": aux, "main": WRONG_MAIN})
    assert rewards == {"aux": 1.5, "main": 1.5} and not any(terms.values())
    feedback = obs["main"].messages[-1].content
    assert feedback == (
        "Static and execution diagnostics:\n"
        "- Main definition: FOUND (Main function (has_close_elements) defined with a return statement)\n"
        "- Aux definition: FOUND (Aux function defined with a return statement)\n"
        "- Syntax: OK (combined code parses)\n"
        "- Tests: 0/1 passed\n"
        "  Failed case: assert has_close_elements([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3) == True "
        "-> AssertionError: \n"
        "- Aux usage: main calls aux and uses its result\n"
        "- Warning: main looks like a thin wrapper around aux\n"
        "\nRevise your has_close_elements(...) accordingly. Reply with the function code only."
    )
    assert "Revise your aux(...)" in obs["aux"].messages[-1].content
    obs, rewards, terms, _, _ = env.step({"aux": GOOD_AUX, "main": GOOD_MAIN})
    assert rewards == {"aux": 4.0, "main": 4.0} and all(terms.values())


def test_passed_and_plain_feedback():
    env = collab_env.make("coop-humaneval-v0", num_turns=2, feedback="passed")
    env.reset(seed=0, options={"index": 0})
    obs, *_ = env.step({"aux": GOOD_AUX, "main": GOOD_MAIN})
    assert "Signal: All levels passed" in obs["main"].messages[-1].content
    assert obs["aux"].messages[-1].content.startswith("Your previous aux(...) implementation:\ndef aux(")
    env = collab_env.make("coop-humaneval-v0", num_turns=2, feedback="plain")
    env.reset(seed=0, options={"index": 0})
    obs, *_ = env.step({"aux": "", "main": GOOD_MAIN})
    assert "<no implementation found>" in obs["aux"].messages[-1].content
    assert "Signal" not in obs["main"].messages[-1].content
    with pytest.raises(ConfigError, match="feedback"):
        collab_env.make("coop-humaneval-v0", feedback="expert_edits")


def test_a_broken_sandbox_is_an_error_never_a_zero(monkeypatch):
    from collab_env.sandbox import harness

    def broken(*args, **kwargs):
        raise SandboxError("cannot start the sandbox")

    monkeypatch.setattr(harness, "run_tests", broken)
    env = collab_env.make("humaneval-v0")
    env.reset(seed=0, options={"index": 0})
    with pytest.raises(TaskFunctionError, match="SandboxError"):
        env.step({"main": humaneval_problem(0).canonical_program()})


def test_canonical_policy_plays_the_split_through_the_driver():
    from collab_env.eval import evaluate

    result = evaluate("coop-humaneval-v0", {"aux": "humaneval-canonical", "main": "humaneval-canonical"},
                      num_episodes=2, progress=False)
    # Episodes 0 and 1 are problems 0 and 1; both canonical splits are thin wrappers (no +1.0).
    # Problem 0: every assert passes: 3.0. Problem 1: three of its four asserts span several
    # lines, and the reference's line-by-line extraction runs them cut (SyntaxError), so 1/4
    # passes: 0.4 + 0.6 + 0.5 + 0.25 + 0.5 = 2.25.
    assert [result.episodes[k].returns["main"] for k in (0, 1)] == [3.0, 2.25]
    assert result.summary.players["aux"].mean_return == 2.625 and not result.failures

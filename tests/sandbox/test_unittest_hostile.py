"""Issue 43 finding 1: wrong code must not score on unittest suites, however the suite is run.

Our own hostile set (:mod:`tests.sandbox.hostile_unittest`, 21 programs) against three suites: one
that patches with mocks (run beside the program, in a checked runner), one that only calls the
program (run in the trusted harness; a result that cannot cross sends it beside the program), and
one in two forms today's main never ran (``from unittest import TestCase as TC``, a class under
``if``). On main before issue 43 every program scored above 0 on at least one suite (most on all).
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest

from collab_env.rewards.metrics import get_metric
from collab_env.sandbox.harness import run_tests
from collab_env.types import Conversation, Message
from tests.sandbox.hostile_unittest import HOSTILE, RIGHT, SUITES


def _pmap(fn, items):
    with ThreadPoolExecutor(2) as ex:
        return list(ex.map(fn, items))


def test_the_hostile_set_has_at_least_20_programs_that_never_compute_the_task():
    assert len(HOSTILE) >= 20
    for name, code in HOSTILE.items():
        assert "def task_func" in code, name


@pytest.mark.parametrize("suite", sorted(SUITES))
def test_no_hostile_program_scores_on_the_suite(suite):
    right = run_tests(RIGHT, SUITES[suite])
    assert right.passed and right.pass_rate == 1.0, right  # the suite can be passed
    scores = _pmap(lambda name: (name, run_tests(HOSTILE[name], SUITES[suite])), sorted(HOSTILE))
    assert [(name, r.pass_rate, r.detail) for name, r in scores if r.pass_rate > 0] == []
    assert all(r.status != "passed" for _, r in scores)


def test_the_card_states_the_residual_risk_measured_by_this_hostile_set():
    from collab_env.registry import spec

    card = str(spec("collabllm-bigcodebench-v2").card)
    assert "Residual risk" in card and "tests/sandbox/hostile_unittest.py" in card
    assert f"{len(HOSTILE)} generic programs" in card and f"0 of {len(HOSTILE)} score on any suite" in card


def test_a_run_whose_sentinels_misreport_is_tampered_scored_0_and_counted():
    # The program silences the recording of failures from inside its own call: the method
    # "passes", but so does the sentinel test that must fail, so the run is not believed.
    res = run_tests(HOSTILE["case_add_error_in_call"], SUITES["mock"])
    assert res.status == "tampered" and res.tampered >= 1 and res.pass_rate == 0.0, res
    assert "sentinel" in res.detail
    row = {"single_turn_metadata": {"entry_point": "task_func", "test": SUITES["mock"]}}
    metric = asyncio.run(get_metric("pass_rate")(_bcb_chat(HOSTILE["case_add_error_in_call"]), row))
    assert metric.value == 0.0 and metric.detail["status"] == "tampered" and metric.detail["tampered"] >= 1


def _bcb_chat(code: str) -> Conversation:
    return Conversation((Message("system", "s"), Message("user", "write task_func", author="user"),
                         Message("assistant", f"```python\n{code}\n```", author="assistant")))


@pytest.mark.parametrize("name", ["mock_any", "builtins_build_class", "case_add_error_in_call", "nothing_at_all"])
def test_the_pass_rate_metric_of_a_bigcodebench_row_gives_hostile_programs_0(name):
    metric = get_metric("pass_rate")
    for suite in ("mock", "forms"):
        row = {"single_turn_metadata": {"entry_point": "task_func", "test": SUITES[suite]}}
        res = asyncio.run(metric(_bcb_chat(HOSTILE[name]), row))
        assert res.value == 0.0, (name, suite, res.detail)
    right = asyncio.run(metric(_bcb_chat(RIGHT), {"single_turn_metadata": {"test": SUITES["forms"]}}))
    assert right.value == 1.0



DEEP_STATUS_LINE = '''\
import os
def task_func(n):
    # a line on every open descriptor (the verdict pipe among them), nested too deep for json
    line = ('[' * 100000 + ']' * 100000 + '\\n').encode()
    for fd in range(3, 64):
        try:
            os.write(fd, line)
        except OSError:
            pass
    return None
'''


@pytest.mark.parametrize("suite", sorted(SUITES))
def test_a_status_line_nested_too_deep_for_json_is_a_verdict_not_a_crash(suite):
    """The guest's code can write to the runner's pipes; a line nested 100,000 deep made the
    runner's ``json.loads`` raise ``RecursionError`` (not the ``ValueError`` it skips), so the
    scorer crashed instead of giving a verdict. It is dropped like any unreadable line."""
    r = run_tests(DEEP_STATUS_LINE, SUITES[suite])
    assert r.pass_rate == 0 and r.status != "passed", r

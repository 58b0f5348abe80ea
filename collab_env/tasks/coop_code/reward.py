"""The reward: the asserts of a problem run in the sandbox against a joint answer, and CoMLRL's
level-shaped score of the result (``execution_reward_aux``; the levels are described in
:mod:`collab_env.tasks.coop_code`).

:func:`run_asserts` runs the tests, :func:`analyze` gathers the static checks and the test
results of one joint answer into a :class:`CodeReport`, :func:`score` turns a report into the
reward; :func:`comlrl_code_reward` (two agents) and :func:`humaneval_reward` (one agent) are the
reward functions the envs use.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from collab_env.sandbox import SandboxLimits
from collab_env.tasks.coop_code.static import (
    AUX,
    calls_aux,
    check_definition,
    check_syntax,
    compose_solution,
    extract_asserts,
    extract_function,
    ignored_aux_calls,
    is_thin_wrapper,
    prompt_imports,
)

__all__ = [
    "TEST_LIMITS",
    "MAX_TIMEOUTS",
    "run_asserts",
    "CodeReport",
    "analyze",
    "score",
    "comlrl_code_reward",
    "humaneval_reward",
]

#: Limits of one assert's run (CoMLRL gives each test 10 s).
TEST_LIMITS = SandboxLimits(cpu_s=10, wall_s=10)
#: After this many timed-out asserts the rest are not run and count as failed (CoMLRL's rule).
MAX_TIMEOUTS = 3


def run_asserts(code: str, asserts: Sequence[str]) -> list[dict[str, str]]:
    """Score each assert against ``code`` with :func:`collab_env.sandbox.harness.run_tests`: the
    asserts run in a trusted harness (``math`` imported, as the reference's namespace has it),
    the program alone in the sandbox (``math`` imported first too), called through proxies that
    return plain data, each call in a process of its own with :data:`TEST_LIMITS`; one test
    per assert. Results in order as ``{"status": "pass"|"fail", "case", "error_type",
    "error_message"}``; after :data:`MAX_TIMEOUTS` timeouts the rest are not reported (the
    reference stops there).

    Raises:
        SandboxError: The sandbox could not run (never turned into failed asserts).
    """
    from collab_env.sandbox.harness import run_tests

    if not asserts:
        return []
    result = run_tests("import math\n" + code, list(asserts), style="calls", prelude="import math\n",
                       limits=TEST_LIMITS, max_timeouts=MAX_TIMEOUTS)
    details: list[dict[str, str]] = []
    for case, t in zip(asserts, result.tests):
        if t.status == "not_run":
            break
        if t.passed:
            details.append({"status": "pass", "case": case})
            continue
        if t.status == "timeout":
            kind, message = "TimeoutException", "test execution timed out"
        else:
            head, _, message = t.detail.partition(":")
            kind, message = (head.strip(), message.strip()) if re.fullmatch(r"[\w.]+", head.strip()) \
                else ("Error", t.detail)
        details.append({"status": "fail", "case": case, "error_type": kind, "error_message": message})
    return details


@dataclass(frozen=True)
class CodeReport:
    """Everything the reward and the feedback know about one joint answer.

    Attributes:
        aux_func: The extracted ``aux`` (``""`` for none or single-agent).
        main_func: The extracted entry-point function.
        aux_defined, aux_message: Level 1 for ``aux``.
        main_defined, main_message: Level 1 for the entry point.
        code: The composed program (imports, aux, main).
        syntax_ok, syntax_message, syntax_error: Level 2.
        tests: Per assert run, ``{"status", "case", "error_type", "error_message"}``.
        tests_total: Asserts extracted (those not run after 3 timeouts count as failed).
        aux_called, wrapper, ignored_calls: The Level 3 collaboration checks.
    """

    aux_func: str
    main_func: str
    aux_defined: bool
    aux_message: str
    main_defined: bool
    main_message: str
    code: str
    syntax_ok: bool
    syntax_message: str
    syntax_error: Mapping[str, Any] | None
    tests: tuple[Mapping[str, str], ...]
    tests_total: int
    aux_called: bool
    wrapper: bool
    ignored_calls: tuple[str, ...]

    @property
    def tests_passed(self) -> int:
        return sum(t["status"] == "pass" for t in self.tests)


def analyze(aux_text: str, main_text: str, item: Mapping[str, Any], *, single: bool = False,
            run_tests: bool = True, test_code: str | None = None, stop_early: bool = True) -> CodeReport:
    """The static check and (when the code parses) the sandboxed asserts of one joint answer.

    Args:
        aux_text: Agent 0's answer (ignored with ``single=True``).
        main_text: The main agent's answer.
        item: The task item (``prompt``, ``test``, ``entry_point``).
        single: Single-agent: there is no ``aux``.
        run_tests: Run the asserts (only when the entry point is defined, if ``stop_early``, and
            the code parses).
        test_code: The tests to extract asserts from (default ``item["test"]``).
        stop_early: The reward's order: no syntax check or tests without the entry point.
    """
    entry = item["entry_point"]
    aux_func = "" if single else extract_function(aux_text, AUX)
    main_func = extract_function(main_text, entry)
    if single:
        aux_ok, aux_msg = False, "single agent: no aux"
    else:
        aux_ok, aux_msg = check_definition(aux_text, AUX, "Aux function")
    main_ok, main_msg = check_definition(main_text, entry, f"Main function ({entry})")
    code = compose_solution(aux_func, main_func, prompt_imports(item.get("prompt", "")))
    syntax_ok, syntax_msg, syntax_err = check_syntax(code)
    asserts = extract_asserts(item["test"] if test_code is None else test_code, entry)
    tests: list[dict[str, str]] = []
    if run_tests and syntax_ok and (main_ok or not stop_early):
        tests = run_asserts(code, asserts)
    return CodeReport(
        aux_func=aux_func, main_func=main_func, aux_defined=aux_ok, aux_message=aux_msg,
        main_defined=main_ok, main_message=main_msg, code=code, syntax_ok=syntax_ok,
        syntax_message=syntax_msg, syntax_error=syntax_err, tests=tuple(tests),
        tests_total=len(asserts), aux_called=calls_aux(main_func),
        wrapper=is_thin_wrapper(main_func), ignored_calls=tuple(ignored_aux_calls(main_func)),
    )


def score(report: CodeReport) -> float:
    """CoMLRL's level-shaped reward of a :class:`CodeReport` (see :mod:`collab_env.tasks.coop_code`)."""
    reward = 0.4 if report.aux_defined else 0.0
    if not report.main_defined:
        return reward
    reward += 0.6
    if not report.syntax_ok:
        return reward
    reward += 0.5
    if report.tests_total == 0:
        return reward
    reward += report.tests_passed / report.tests_total
    if report.tests_passed > 0 and report.aux_func and report.aux_called:
        reward += 0.5
        if not report.wrapper:
            reward += 1.0
        if report.ignored_calls:
            reward -= 0.5
    return reward


def comlrl_code_reward(aux_completions: Sequence[str], main_completions: Sequence[str], *,
                       batch_items: Sequence[Mapping[str, Any]]) -> list[float]:
    """CoMLRL's joint reward of (aux, main) answers to one HumanEval item, in ``[0, 4]``.

    A CoMLRL ``reward_func`` (also usable with :class:`~collab_env.rewards.joint.JointReward`,
    e.g. ``mode="difference"``). See :mod:`collab_env.tasks.coop_code` for the levels.

    Raises:
        SandboxError: The sandbox could not run the asserts.
    """
    item = batch_items[0]
    return [score(analyze(a, m, item)) for a, m in zip(aux_completions, main_completions)]


def humaneval_reward(completions: Sequence[str], *, batch_items: Sequence[Mapping[str, Any]]) -> list[float]:
    """The single-agent reward: :func:`comlrl_code_reward` with an empty ``aux`` (CoMLRL's
    one-agent rule), in ``[0, 2.1]``."""
    item = batch_items[0]
    return [score(analyze("", m, item, single=True)) for m in completions]

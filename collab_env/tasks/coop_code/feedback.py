"""Multi-turn feedback: CoMLRL's external transition modes, the next prompts of turns 2 and on.

``level_feedback`` (definitions, syntax, the failing tests), ``passed`` (one signal) and ``plain``
(a request to revise); :func:`external_transition` is the configured mode as the
``external_transition`` of :func:`~collab_env.tasks.dataset_env.from_dataset`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from collab_env.tasks.coop_code.reward import CodeReport, analyze
from collab_env.tasks.coop_code.static import AUX

__all__ = [
    "FEEDBACK_MODES",
    "sliced_tests",
    "level_feedback",
    "passed_feedback",
    "plain_feedback",
    "external_transition",
]

#: The multi-turn feedback modes (CoMLRL's ``external.mode`` names).
FEEDBACK_MODES: tuple[str, ...] = ("level_feedback", "passed", "plain")


def sliced_tests(test: str, n: int) -> str:
    """``test`` with ``check`` keeping only its first ``n`` asserts (``n < 0``: the last
    ``-n``; ``0``: all): CoMLRL's ``sandbox_slice`` for the feedback's tests."""
    if not n or not test.strip():
        return test
    lines = test.splitlines()
    at = next((i for i, ln in enumerate(lines) if re.match(r"\s*def\s+check\s*\(candidate\)\s*:", ln)), None)
    pre = lines[:at] if at is not None else lines
    asserts = [ln.strip() for ln in lines[(at + 1 if at is not None else 0):]
               if ln.strip().startswith("assert") and "candidate" in ln]
    if not asserts:
        return test
    keep = asserts[:n] if n > 0 else asserts[n:]
    head = "\n".join(pre).strip()
    return "\n".join(([head] if head else []) + ["def check(candidate):"] + [f"    {a}" for a in keep]) + "\n"


def _diagnostics(r: CodeReport, *, main_first: bool, single: bool) -> list[str]:
    aux_line = f"- Aux definition: {'FOUND' if r.aux_defined else 'MISSING'} ({r.aux_message})"
    main_line = f"- Main definition: {'FOUND' if r.main_defined else 'MISSING'} ({r.main_message})"
    out = ["Static and execution diagnostics:"]
    if single:
        out.append(main_line)
    else:
        out += [main_line, aux_line] if main_first else [aux_line, main_line]
    out.append(f"- Syntax: {'OK' if r.syntax_ok else 'ERROR'} (combined code {r.syntax_message})")
    if r.syntax_error:
        e = r.syntax_error
        out.append(f"  SyntaxError at line {e['line']}, col {e['offset']}: {e['msg']}")
    if r.tests_total:
        out.append(f"- Tests: {r.tests_passed}/{r.tests_total} passed")
        out += [f"  Failed case: {t['case']} -> {t['error_type']}: {t['error_message']}"
                for t in r.tests if t["status"] == "fail"]
    else:
        out.append("- Tests: no test cases found")
    return out


def _report(item: Mapping[str, Any], completions: Sequence[str], sandbox_slice: int) -> tuple[CodeReport, bool]:
    single = len(completions) == 1
    aux, main = ("", completions[0]) if single else (completions[0], completions[-1])
    tests = sliced_tests(item["test"], sandbox_slice)
    return analyze(aux, main, item, single=single, test_code=tests, stop_early=False), single


def level_feedback(*, item: Mapping[str, Any], agent_completions: Sequence[str],
                   sandbox_slice: int = 1) -> list[str]:
    """CoMLRL's ``level_feedback`` next prompts: definitions, syntax, the sandboxed tests of the
    first ``sandbox_slice`` asserts with each failing one and its error, aux usage for the main
    agent; then a request to revise. One prompt per agent."""
    r, single = _report(item, agent_completions, sandbox_slice)
    entry = item["entry_point"]
    main_lines = _diagnostics(r, main_first=True, single=single)
    if not single and r.main_defined:
        if not r.aux_called:
            main_lines.append(f"- Aux usage: main does NOT call {AUX}")
        elif r.ignored_calls:
            main_lines.append(f"- Aux usage: called but its result is dropped ({', '.join(r.ignored_calls[:2])})")
        else:
            main_lines.append(f"- Aux usage: main calls {AUX} and uses its result")
        if r.wrapper:
            main_lines.append(f"- Warning: main looks like a thin wrapper around {AUX}")
    main_lines.append(f"\nRevise your {entry}(...) accordingly. Reply with the function code only.")
    if single:
        return ["\n".join(main_lines)]
    aux_lines = _diagnostics(r, main_first=False, single=False)
    aux_lines.append(f"\nRevise your {AUX}(...) accordingly. Reply with the function code only.")
    return ["\n".join(aux_lines), "\n".join(main_lines)]


def _previous(r: CodeReport, single: bool, entry: str, tail: Callable[[str], list[str]]) -> list[str]:
    main = ["Your previous implementation:" if single else "Your previous main implementation:",
            r.main_func or "<no implementation found>", ""] + tail(entry)
    if single:
        return ["\n".join(main)]
    aux = [f"Your previous {AUX}(...) implementation:", r.aux_func or "<no implementation found>", ""] + tail(AUX)
    return ["\n".join(aux), "\n".join(main)]


def passed_feedback(*, item: Mapping[str, Any], agent_completions: Sequence[str],
                    sandbox_slice: int = 1) -> list[str]:
    """CoMLRL's ``passed`` next prompts: each agent's previous function and one signal, "All
    levels passed" when the main function is defined, the code parses and every (sliced)
    assert passes, else "Not all levels passed"."""
    r, single = _report(item, agent_completions, sandbox_slice)
    ok = r.main_defined and r.syntax_ok and r.tests_total > 0 and r.tests_passed == r.tests_total
    signal = "All levels passed" if ok else "Not all levels passed"
    return _previous(r, single, item["entry_point"], lambda name: [
        f"Signal: {signal}", "", f"Revise your {name}(...) if needed. Reply with the function code only."])


def plain_feedback(*, item: Mapping[str, Any], agent_completions: Sequence[str],
                   sandbox_slice: int = 1) -> list[str]:
    """CoMLRL's ``plain`` next prompts: each agent's previous function and a request to revise
    (no signal; no test is run)."""
    single = len(agent_completions) == 1
    aux, main = ("", agent_completions[0]) if single else (agent_completions[0], agent_completions[-1])
    r = analyze(aux, main, item, single=single, run_tests=False)
    return _previous(r, single, item["entry_point"], lambda name: [
        f"Revise your {name}(...) accordingly. Reply with the function code only."])


_FEEDBACK = {"level_feedback": level_feedback, "passed": passed_feedback, "plain": plain_feedback}


@dataclass(frozen=True)
class _Transition:
    """The configured feedback as a CoMLRL ``external_transition`` (picklable)."""

    mode: str
    sandbox_slice: int

    def __call__(self, *, item: Mapping[str, Any], agent_completions: Sequence[str]) -> list[str]:
        return _FEEDBACK[self.mode](item=item, agent_completions=agent_completions,
                                    sandbox_slice=self.sandbox_slice)


def external_transition(mode: str, sandbox_slice: int) -> Callable[..., list[str]]:
    """The feedback ``mode`` (one of :data:`FEEDBACK_MODES`) with its ``sandbox_slice``, as a
    CoMLRL ``external_transition``: called with ``item=`` and ``agent_completions=``, it returns
    one next prompt per agent. The object is picklable."""
    return _Transition(mode, sandbox_slice)

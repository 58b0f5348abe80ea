"""The ``accuracy_rule`` metric: the assistant's last ``\\boxed{}`` answer against the reference.

Answers are compared exactly after normalisation, as numbers, or symbolically with sympy (on
text checked first, since ``sympify`` evaluates Python).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from collab_env.errors import require
from collab_env.rewards.metrics.context import assistant_messages, reference_of
from collab_env.rewards.metrics.registry import MetricResult
from collab_env.types import Conversation

__all__ = ["extract_boxed_text", "answers_equal", "accuracy_rule"]


_BOX_OPEN = re.compile(r"\\(?:boxed|fbox)\s*\{")


def extract_boxed_text(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) of ``text``, braces balanced;
    ``None`` when there is none (or the last one is never closed)."""
    last = None
    for m in _BOX_OPEN.finditer(text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            last = text[m.end():i - 1]
    return last


_TEXT_CMD = re.compile(r"\\(?:text|textbf|mathrm|mbox|mathbf)\s*\{([^{}]*)\}")


def _normalise(s: str) -> str:
    """Canonical spelling of an answer for exact comparison."""
    s = s.strip()
    s = _TEXT_CMD.sub(r"\1", s)
    for a, b in (("\\dfrac", "\\frac"), ("\\tfrac", "\\frac"), ("\\left", ""), ("\\right", ""),
                 ("\\!", ""), ("\\,", ""), ("\\;", ""), ("\\ ", ""), ("$", ""), ("^\\circ", ""),
                 ("^{\\circ}", ""), ("\\%", ""), ("%", "")):
        s = s.replace(a, b)
    s = re.sub(r"\s+", "", s)
    s = s.rstrip(".")
    if re.fullmatch(r"[-+]?\d{1,3}(,\d{3})+(\.\d*)?", s):  # 1,000 -> 1000
        s = s.replace(",", "")
    return s


def _as_number(s: str) -> float | None:
    """``s`` as a float when it is a plain number or a simple fraction."""
    m = re.fullmatch(r"([-+]?)\\frac\{([-+]?\d+(?:\.\d+)?)\}\{([-+]?\d+(?:\.\d+)?)\}", s) or \
        re.fullmatch(r"([-+]?)(\d+(?:\.\d+)?)/(\d+(?:\.\d+)?)", s)
    try:
        if m:
            v = float(m.group(2)) / float(m.group(3))
            return -v if m.group(1) == "-" else v
        return float(s)
    except (ValueError, ZeroDivisionError):
        return None


def _latex_to_sympy_text(s: str) -> str:
    """A best-effort rewrite of simple LaTeX into a string ``sympy.sympify`` reads."""
    prev = None
    while prev != s:  # innermost first, until nothing changes
        prev = s
        s = re.sub(r"\\frac\{([^{}]*)\}\{([^{}]*)\}", r"((\1)/(\2))", s)
        s = re.sub(r"\\sqrt\[([^{}\]]*)\]\{([^{}]*)\}", r"((\2)**(1/(\1)))", s)
        s = re.sub(r"\\sqrt\{([^{}]*)\}", r"sqrt(\1)", s)
    for a, b in (("\\cdot", "*"), ("\\times", "*"), ("\\pi", "pi"), ("^", "**"), ("{", "("),
                 ("}", ")"), ("\\", "")):
        s = s.replace(a, b)
    return s


_SAFE_NAMES = frozenset({"sqrt", "pi", "E", "I", "oo", "log", "ln", "exp", "sin", "cos", "tan"})


def _unsafe_for_sympify(t: str) -> str | None:
    """Why ``t`` must not reach ``sympify`` (which evaluates Python), or ``None``.

    Model text is untrusted: only arithmetic on numbers, one-letter symbols and a few math
    functions is allowed, and no power towers (``9**9**9`` would take forever to evaluate).
    """
    if not re.fullmatch(r"[0-9A-Za-z+\-*/().,\s]*", t):
        return "characters outside arithmetic"
    names = set(re.findall(r"[A-Za-z]{2,}", t)) - _SAFE_NAMES
    if names:
        return f"unknown names {sorted(names)}"
    if t.count("**") > 1 or any(len(x) > 3 for x in re.findall(r"\*\*\s*\(*\s*(\d+)", t)):
        return "a large power"
    return None


def _sympy_equal(a: str, b: str) -> tuple[bool, str | None]:
    """Whether two answers are symbolically equal; (False, error) when either cannot be parsed."""
    if len(a) > 200 or len(b) > 200:  # simplify can take very long on large inputs
        return False, "answer too long for a symbolic comparison"
    sympy = require("sympy", "rewards", "the accuracy_rule metric's symbolic comparison")
    try:
        try:
            import antlr4  # noqa: F401
            from sympy.parsing.latex import parse_latex  # needs antlr4; usually absent
        except ImportError:
            parse_latex = None
        if parse_latex is not None:
            ea, eb = parse_latex(a), parse_latex(b)
        else:
            ta, tb = _latex_to_sympy_text(a), _latex_to_sympy_text(b)
            for t in (ta, tb):
                unsafe = _unsafe_for_sympify(t)
                if unsafe:
                    return False, f"not compared symbolically: {unsafe} in {t!r:.80}"
            ea, eb = sympy.sympify(ta), sympy.sympify(tb)
        return bool(sympy.simplify(ea - eb) == 0), None
    except Exception as exc:  # noqa: BLE001 - unparseable answers are "not equal", recorded
        return False, f"{type(exc).__name__}: {exc}"[:300]


def answers_equal(answer: str, reference: str) -> tuple[bool, dict[str, Any]]:
    """Whether ``answer`` equals ``reference``: exact after normalisation, numerically, or
    symbolically (sympy). Returns the verdict and how it was reached."""
    a, r = _normalise(answer), _normalise(reference)
    if a == r:
        return True, {"match": "exact"}
    na, nr = _as_number(a), _as_number(r)
    if na is not None and nr is not None:
        return math.isclose(na, nr, rel_tol=1e-9, abs_tol=1e-12), {"match": "numeric"}
    ok, err = _sympy_equal(a, r)
    detail: dict[str, Any] = {"match": "sympy"}
    if err is not None:
        detail["parse_error"] = err
    return ok, detail


async def accuracy_rule(conversation: Conversation, item: Mapping[str, Any], *, start: int = 0,
                        **ctx: Any) -> MetricResult:
    """1.0 when the last ``\\boxed{}`` answer of the assistant equals the reference, else 0.0.

    The answer is the last box in the last assistant message that has one (whole conversation;
    with :func:`extract_then`, the extracted text: its last box, or all of it). The reference is
    ``item["single_turn_completion"]`` (or ``answer`` / ``reference``), its last box if boxed.
    Equality: exact after normalisation, numeric, or sympy; unparseable means unequal and is
    recorded in ``detail["parse_error"]``.
    """
    reference = reference_of(item)
    ref = extract_boxed_text(reference)
    ref = ref if ref is not None else reference.strip()
    if ctx.get("extracted") is not None:
        text = str(ctx["extracted"])
        box = extract_boxed_text(text)
        answer = box if box is not None else text.strip()
    else:
        answer = None
        for m in reversed(assistant_messages(conversation, ctx)):
            answer = extract_boxed_text(m.content)
            if answer is not None:
                break
    if answer is None:
        return MetricResult(0.0, {"answer": None, "reference": ref, "reason": "no boxed answer"})
    ok, how = answers_equal(answer, ref)
    return MetricResult(1.0 if ok else 0.0, {"answer": answer, "reference": ref, **how})

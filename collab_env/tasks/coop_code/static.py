"""Static analysis of the agents' answers: CoMLRL's rules in ``rewards/code_utils.py``,
re-implemented (see :mod:`collab_env.tasks.coop_code` for the task).

From a model's text, :func:`cleanup_code` keeps the function definitions and
:func:`extract_function` one of them; :func:`check_definition` and :func:`check_syntax` are the
reward's Levels 1 and 2; :func:`compose_solution` builds the program the tests run;
:func:`extract_asserts` cuts ``check(candidate)`` into one test per assert; :func:`calls_aux`,
:func:`is_thin_wrapper` and :func:`ignored_aux_calls` are the collaboration checks of Level 3.
Nothing here runs code.
"""

from __future__ import annotations

import re
from typing import Any

from collab_env.sandbox.pyparse import parse_python

__all__ = [
    "AUX",
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
]

#: The helper's name (CoMLRL's).
AUX = "aux"

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
        return m is not None and body[1] == f"return {m.group(1)}"
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


"""Nesting limits on untrusted JSON, checked before any reader sees it.

Every JSON, JSON-lines and parquet reader this library uses (``json.loads``, the pyarrow reader
behind ``datasets``, the features code of ``datasets``) recurses once per level of nesting: a
5,000-deep row raises a bare ``RecursionError`` and a 100,000-deep one crashes the process inside
the C reader. :func:`check_depth` is the one check every reader of outside data calls first:

* on JSON **text** (``str`` or ``bytes``: a document, or JSON lines with ``lines=True``) it
  scans the brackets outside string literals without parsing anything (a regular expression
  drops the strings, ``bytes.translate`` keeps the brackets, the running depth is summed in C),
  so no reader ever sees a row that is too deep; the error names the line;
* on a **Python value** (a row passed as ``reset(options={"item": row})``, a parsed document) it
  walks lists, tuples and mappings without recursion (a value that contains itself is "too deep").

:func:`loads` is ``json.loads`` behind that check, with every failure one :class:`ConfigError`
(or the caller's error class).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from itertools import accumulate
from typing import Any

from collab_env.errors import ConfigError

__all__ = ["MAX_DEPTH", "check_depth", "depth_problem", "loads"]

#: Deepest nesting of lists and objects read from outside data. A CollabLLM row, an episode
#: record or a submission needs under 12; 64 leaves room and stays far below the depth at which
#: a recursive reader fails.
MAX_DEPTH = 64

# A JSON string literal (no raw newline: JSON escapes them, so a line is never swallowed).
_STRING = re.compile(rb'"[^"\\\n]*(?:\\.[^"\\\n]*)*"')
_KEEP = b"[]{}\n"
_DROP = bytes(b for b in range(256) if b not in _KEEP)
_DELTA = tuple(1 if b in b"[{" else -1 if b in b"]}" else 0 for b in range(256))


def _text_depth(data: bytes, limit: int, lines: bool) -> tuple[int, int] | None:
    """``(line, depth)`` of the first place the brackets of ``data`` nest deeper than ``limit``,
    or ``None``. With ``lines`` each line is counted on its own (JSON lines)."""
    s = _STRING.sub(b"", data).translate(None, _DROP)
    if _deepest(s) <= limit and (not lines or min(accumulate(map(_DELTA.__getitem__, s)), default=0) >= 0):
        return None  # (never below 0: no line starts inside another, so none is deeper than this)
    if lines:
        for number, line in enumerate(s.split(b"\n"), 1):
            if line and max(accumulate(map(_DELTA.__getitem__, line))) > limit:
                return number, _deepest(line)
        return None
    depth = 0
    for i, c in enumerate(s):  # only on the way to an error: where the limit is first passed
        depth += _DELTA[c]
        if depth > limit:
            return s.count(b"\n", 0, i) + 1, _deepest(s)
    return None  # pragma: no cover - the max above says it is passed


def _deepest(s: bytes) -> int:
    return max(accumulate(map(_DELTA.__getitem__, s)), default=0)


def _value_too_deep(value: Any, limit: int) -> bool:
    stack = [(value, 1)]
    while stack:  # without recursion: the depth is what is being checked
        node, depth = stack.pop()
        if isinstance(node, (list, tuple, Mapping)):
            if depth > limit:
                return True
            children = node.values() if isinstance(node, Mapping) else node
            stack.extend((c, depth + 1) for c in children if isinstance(c, (list, tuple, Mapping)))
    return False


def depth_problem(x: Any, *, limit: int = MAX_DEPTH, lines: bool = False) -> str | None:
    """Why ``x`` nests too deep, or ``None``: ``x`` is JSON text (``str``/``bytes``; with
    ``lines`` JSON lines, one row per line) or a Python value. The reason names the line of
    multi-line text and the limit."""
    if isinstance(x, (str, bytes, bytearray, memoryview)):
        data = x.encode("utf-8", "surrogatepass") if isinstance(x, str) else bytes(x)
        found = _text_depth(data, limit, lines)
        if found is None:
            return None
        line, depth = found
        where = f"line {line}: " if lines or b"\n" in data else ""
        return f"{where}lists and objects nested {depth} deep, over the limit of {limit}"
    if _value_too_deep(x, limit):
        return f"lists and mappings nested more than {limit} deep (the limit)"
    return None


def check_depth(x: Any, where: str, *, limit: int = MAX_DEPTH, lines: bool = False,
                error: Callable[[str], Exception] = ConfigError, fix: str = "") -> None:
    """Raise ``error("<where>, <reason>. <fix>")`` when ``x`` (JSON text or a Python value, see
    :func:`depth_problem`) nests deeper than ``limit``; ``where`` names the file or argument."""
    problem = depth_problem(x, limit=limit, lines=lines)
    if problem is not None:
        raise error(f"{where}, {problem}." + (f" {fix}" if fix else " Flatten or remove it."))


def loads(text: str | bytes, where: str, *, limit: int = MAX_DEPTH,
          error: Callable[[str], Exception] = ConfigError) -> Any:
    """``json.loads(text)`` after :func:`check_depth`; text that is not JSON (or not UTF-8) is
    ``error("<where> is not JSON (<reason>)")``."""
    check_depth(text, where, limit=limit, error=error)
    try:
        return json.loads(text)
    except RecursionError:  # pragma: no cover - the check above bounds the depth
        raise error(f"{where}, nested too deep to read.") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an int over the digit limit
        raise error(f"{where} is not JSON ({str(exc).splitlines()[0][:200]}).") from None

"""``parse_python``: :func:`ast.parse`, safe to call from several threads at once.

CPython 3.11's conversion of a parse tree to ``ast`` objects keeps its recursion depth in state
shared by threads, so two ``ast.parse`` calls in different threads can fail with ``SystemError:
AST constructor recursion depth mismatch`` (seen here: the code rewards parse tests and programs
inside ``asyncio.to_thread`` while other episodes do the same). Every ``ast.parse`` of the
library goes through this lock; parsing is fast, so holding it costs little.
"""

from __future__ import annotations

import ast
import threading

__all__ = ["parse_python"]

_LOCK = threading.Lock()


def parse_python(source: str, filename: str = "<unknown>") -> ast.Module:
    """``ast.parse(source, filename)`` under a process-wide lock (raises ``SyntaxError`` as it does)."""
    with _LOCK:
        return ast.parse(source, filename)

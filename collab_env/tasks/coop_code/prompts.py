"""The agents' first prompts: CoMLRL's instructions, in this project's words. One formatter per
role: the helper agent (:func:`aux_formatter`), the main agent (:func:`main_formatter`) and the
single agent of ``humaneval`` (:func:`single_formatter`); each takes a task item and returns
the prompt text.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from collab_env.tasks.coop_code.static import AUX

__all__ = ["aux_formatter", "main_formatter", "single_formatter"]

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

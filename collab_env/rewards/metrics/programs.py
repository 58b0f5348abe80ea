"""The ``pass_rate`` metric: the assistant's final Python code block against the item's tests,
run in :mod:`collab_env.sandbox`."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from collab_env.errors import ConfigError
from collab_env.rewards.metrics.context import assistant_messages
from collab_env.rewards.metrics.registry import MetricResult
from collab_env.types import Conversation

__all__ = ["extract_code_block", "pass_rate"]


_CODE_BLOCK = re.compile(r"```[ \t]*(?:python3?|py|Python)?[ \t]*\n(.*?)```", re.DOTALL)


def extract_code_block(text: str) -> str | None:
    """The last fenced code block (```` ```python ```` or untagged) of ``text``, or ``None``."""
    blocks = _CODE_BLOCK.findall(text)
    return blocks[-1] if blocks else None


def _tests_of(item: Mapping[str, Any]) -> str:
    meta = item.get("single_turn_metadata")
    if isinstance(meta, str):
        try:
            meta = json.loads(meta)
        except ValueError:
            meta = None
    if isinstance(meta, Mapping) and isinstance(meta.get("test"), str):
        return meta["test"]
    if isinstance(item.get("tests"), str):
        return item["tests"]
    raise ConfigError(
        "pass_rate needs the item's tests: item['single_turn_metadata']['test'] or item['tests'] "
        f"(a string of Python that raises on failure); the item has {sorted(item)}."
    )


async def pass_rate(conversation: Conversation, item: Mapping[str, Any], *, start: int = 0,
                    **ctx: Any) -> MetricResult:
    """1.0 when the final Python code block passes the item's tests in the sandbox, else 0.0.

    The code is the last fenced block of the last assistant message that has one (with
    :func:`extract_then`: of the extracted text, or the whole text). ctx: ``sandbox`` (a
    :class:`~collab_env.sandbox.SandboxPool`, optional), ``sandbox_limits``.
    ``detail["status"]`` is the sandbox status; a broken sandbox raises ``SandboxError``.
    """
    from collab_env.sandbox import SandboxLimits, arun_python

    tests = _tests_of(item)
    if ctx.get("extracted") is not None:
        text = str(ctx["extracted"])
        code = extract_code_block(text)
        code = code if code is not None else text
    else:
        code = None
        for m in reversed(assistant_messages(conversation, ctx)):
            code = extract_code_block(m.content)
            if code is not None:
                break
    if code is None:
        return MetricResult(0.0, {"status": "no_code"})
    pool = ctx.get("sandbox")
    limits = ctx.get("sandbox_limits")
    if pool is not None:
        res = await pool.run(code, tests=tests, limits=limits)
    else:
        res = await arun_python(code, tests=tests, limits=limits or SandboxLimits())
    return MetricResult(1.0 if res.status == "passed" else 0.0,
                        {"status": res.status, "detail": res.detail, "duration_s": res.duration_s})

"""The ``pass_rate`` metric: the assistant's final Python code block against the item's tests,
scored by :func:`collab_env.sandbox.harness.run_tests`.

Function-call tests (assert scripts, HumanEval's ``check`` program) run in a trusted harness that
calls the program, sandboxed on its own, through proxies returning plain data; unittest suites
(``class TestCases(unittest.TestCase)``, BigCodeBench and CollabLLM's bigcodebench rows) run in
the trusted harness, or with mocks one sandboxed process per test class beside the program, and
score passed methods over found methods (see the harness module for the same-process residual
risk)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from collab_env.errors import ConfigError
from collab_env.rewards.metrics.context import assistant_messages
from collab_env.rewards.metrics.registry import MetricResult
from collab_env.sandbox.harness import extract_code_block
from collab_env.types import Conversation

__all__ = ["pass_rate"]


def _tests_of(item: Mapping[str, Any]) -> tuple[str, str | None]:
    meta = item.get("single_turn_metadata")
    if isinstance(meta, str):
        from collab_env._json import loads

        try:
            meta = loads(meta, "the row's single_turn_metadata")
        except ValueError:  # not JSON, or nested too deep to read (ConfigError is a ValueError)
            meta = None
    entry = None
    if isinstance(meta, Mapping) and isinstance(meta.get("entry_point"), str):
        entry = meta["entry_point"] or None
    elif isinstance(item.get("entry_point"), str):
        entry = item["entry_point"] or None
    if isinstance(meta, Mapping) and isinstance(meta.get("test"), str):
        return meta["test"], entry
    if isinstance(item.get("tests"), str):
        return item["tests"], entry
    raise ConfigError(
        "pass_rate needs the item's tests: item['single_turn_metadata']['test'] or item['tests'] "
        f"(a string of Python that raises on failure); the item has {sorted(item)}."
    )


async def pass_rate(conversation: Conversation, item: Mapping[str, Any], *, start: int = 0,
                    **ctx: Any) -> MetricResult:
    """The fraction of the item's tests the final Python code block passes.

    Function-call tests (an assert script, a ``check`` program) are one test: 1.0 or 0.0. A
    unittest suite counts each test method: passed methods over methods found. The code is the
    last fenced block of the last assistant message that has one (with :func:`extract_then`: of
    the extracted text, or the whole text). ctx: ``sandbox`` (a
    :class:`~collab_env.sandbox.SandboxPool`, optional), ``sandbox_limits``.
    ``detail``: ``status`` (the harness status), ``passed``/``total`` tests, ``style``,
    ``tampered`` (unittest methods whose same-process run misreported its sentinels: the
    suite then scores 0).

    Raises:
        SandboxError: The sandbox could not run.
        DataSchemaError: The item's tests cannot score anything: a unittest suite with no test
            method, or an ``"unsupported test form: ..."`` (never scored as a pass).
    """
    from collab_env.errors import DataSchemaError
    from collab_env.sandbox import SandboxLimits
    from collab_env.sandbox.harness import arun_tests

    tests, entry_point = _tests_of(item)
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
        res = await pool.run_tests(code, tests, limits=limits, entry_point=entry_point)
    else:
        res = await arun_tests(code, tests, limits=limits or SandboxLimits(), entry_point=entry_point)
    if res.status == "error":
        raise DataSchemaError(f"pass_rate: the item's tests cannot score anything: {res.detail}.")
    return MetricResult(res.pass_rate, {"status": res.status, "detail": res.detail, "passed": res.num_passed,
                                        "total": res.total, "style": res.style, "duration_s": res.duration_s,
                                        "tampered": res.tampered})

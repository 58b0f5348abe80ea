"""The LLM-judge metrics: ``accuracy`` (did the conversation reach the reference) and
``interactivity`` (how well the assistant collaborated)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from collab_env.errors import ConfigError
from collab_env.rewards.metrics.context import judge_for, problem_of, reference_of
from collab_env.rewards.metrics.registry import MetricResult
from collab_env.types import Conversation

__all__ = ["accuracy", "interactivity"]


async def accuracy(conversation: Conversation, item: Mapping[str, Any], *, start: int = 0,
                   **ctx: Any) -> MetricResult:
    """1.0/0.0: an LLM judge (preset ``"accuracy"``) decides whether the conversation reached
    the reference answer.

    ctx: ``judge`` (an LLMJudge, or ``{"accuracy": judge}``) or ``judge_backend``. The judge
    sees the whole public conversation. A judge with no readable verdict raises ``JudgeError``.
    """
    judge = judge_for("accuracy", "accuracy", ctx)
    res = await judge.score(problem=problem_of(item), conversation=conversation, reference=reference_of(item))
    return MetricResult(1.0 if res.score else 0.0, {"reason": res.reason, "judge": judge.name}, dict(res.usage))


async def interactivity(conversation: Conversation, item: Mapping[str, Any], *, start: int = 0,
                        **ctx: Any) -> MetricResult:
    """0..1: an LLM judge rates how well the assistant collaborated.

    ctx: ``rubric``: ``"verl"`` (default; mean of understanding, clarification, suggestions)
    or ``"paper"`` (the paper's three-anchor scale); ``judge`` (an LLMJudge, or
    ``{"interactivity": judge}``) or ``judge_backend``.
    """
    rubric = ctx.get("rubric", "verl")
    presets = {"verl": "interactivity", "paper": "interactivity_paper"}
    if rubric not in presets:
        raise ConfigError(f"interactivity: rubric must be one of {list(presets)}, got {rubric!r}.")
    judge = judge_for("interactivity", presets[rubric], ctx)
    res = await judge.score(conversation=conversation)
    detail = {"reason": res.reason, "rubric": rubric, "judge": judge.name,
              **{k: float(v) for k, v in res.components.items()}}
    return MetricResult(float(res.score), detail, dict(res.usage))

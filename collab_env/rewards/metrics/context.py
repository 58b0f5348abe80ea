"""What metrics read from their inputs: the item's reference and problem, the assistant's public
messages, the judge or extractor in ``ctx``, and the final text of a conversation.

Shared by the built-in metrics and :func:`~collab_env.rewards.metrics.extract_then`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from collab_env.errors import ConfigError
from collab_env.types import Conversation, Message

__all__ = [
    "reference_of",
    "problem_of",
    "is_public",
    "assistant_messages",
    "judge_for",
    "run_extractor",
    "final_text",
]


def reference_of(item: Mapping[str, Any]) -> str:
    """The reference answer of an item: ``single_turn_completion``, ``answer`` or ``reference``."""
    for key in ("single_turn_completion", "answer", "reference"):
        if key in item and item[key] is not None:
            return str(item[key])
    raise ConfigError(
        f"the item has no reference answer: expected one of 'single_turn_completion', 'answer', "
        f"'reference' (it has {sorted(item)})."
    )


def problem_of(item: Mapping[str, Any]) -> str:
    """The problem statement of an item: ``single_turn_prompt``, ``problem``, ``question`` or
    ``prompt`` (a chat prompt is joined)."""
    for key in ("single_turn_prompt", "problem", "question", "prompt"):
        v = item.get(key)
        if v is None:
            continue
        if isinstance(v, str):
            return v
        if isinstance(v, list):
            return "\n\n".join(str(m.get("content", "")) if isinstance(m, Mapping) else str(m) for m in v)
        return str(v)
    raise ConfigError(
        f"a judge prompt needs the problem, but the item has none of 'single_turn_prompt', "
        f"'problem', 'question', 'prompt' (it has {sorted(item)})."
    )


def is_public(m: Message) -> bool:
    """Whether every player sees ``m`` (no restricted audience, such as a hidden goal)."""
    return m.audience is None


def assistant_messages(conversation: Conversation, ctx: Mapping[str, Any]) -> list[Message]:
    """Public assistant messages: by ``ctx["player"]`` when given, else by chat role."""
    player = ctx.get("player")
    return [m for m in conversation if is_public(m)
            and (m.author == player if player is not None else m.role == "assistant")]


def judge_for(metric: str, preset: str, ctx: Mapping[str, Any], key: str = "judge"):
    """``ctx[key]`` (a judge, or a mapping metric name -> judge), else a preset judge on
    ``ctx[key + "_backend"]``."""
    judge = ctx.get(key)
    if isinstance(judge, Mapping):
        judge = judge.get(metric)
    if judge is not None:
        return judge
    backend = ctx.get(f"{key}_backend")
    if backend is None:
        raise ConfigError(
            f"metric {metric!r} needs an LLM judge: pass ctx[{key!r}] (an LLMJudge, e.g. "
            f"LLMJudge.preset({preset!r}, backend)) or ctx['{key}_backend'] (a policy or backend id)."
        )
    from collab_env.agents.judges import LLMJudge  # lazy: keeps `import collab_env` light

    return LLMJudge.preset(preset, backend)


async def run_extractor(conversation: Conversation, item: Mapping[str, Any], extractor: Any) -> tuple[str, dict]:
    """Run an LLM extractor (a judge with ``score_type="text"``) on the conversation: (its text,
    its usage). The problem is passed too unless the extractor's fields say it reads the chat only."""
    fields = getattr(extractor, "fields", None)
    kw: dict[str, Any] = {"conversation": conversation}
    if fields is None or "problem" in fields:  # a document extractor reads the chat only
        kw["problem"] = problem_of(item)
    result = await extractor.score(**kw)
    return str(result.score), dict(result.usage)


async def final_text(conversation: Conversation, item: Mapping[str, Any], ctx: Mapping[str, Any],
                     *, use_extractor: bool, metric: str = "") -> tuple[str | None, str, dict[str, float]]:
    """The final artefact: (text or None, where it came from, usage). An extractor given as a
    mapping is looked up by ``metric``."""
    if ctx.get("extracted") is not None:
        return str(ctx["extracted"]), "extracted", {}
    if use_extractor:
        for key in ("document_extractor", "extractor"):
            ex = ctx.get(key)
            if isinstance(ex, Mapping):  # {metric name: extractor}, like ctx["judge"]
                ex = ex.get(metric)
            if ex is not None:
                text, usage = await run_extractor(conversation, item, ex)
                return text, key, usage
    msgs = assistant_messages(conversation, ctx)
    return (msgs[-1].content if msgs else None), "last_assistant_message", {}

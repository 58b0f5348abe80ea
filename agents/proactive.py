"""The "Proactive Base" of the CollabLLM paper: any policy, told to collaborate.

:class:`Proactive` wraps a policy and adds a collaborative system prompt to each observation
before the inner policy sees it: ask clarifying questions when a request is ambiguous, be
concise, suggest next steps, adapt to the user. It is the prompting baseline that CollabLLM's
trained models are compared with.

Where the prompt goes
    * ``placement="prepend"`` (default): the prompt is put **before** the text of the
      observation's first system message, in the same message (many chat templates accept one
      system message only, at the start). The env's own instructions (an answer protocol like
      hidden-facts' ``\\boxed{}``) are kept, after it. Without a system message, a new one is
      inserted at the start.
    * ``placement="replace"``: every system message of the observation is dropped and the
      prompt becomes the only one. Use it only when the env's system prompt is unwanted: it may
      carry the answer format the reward checks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Literal

from collab_env.agents.base import Policy, describe, resolve_policy
from collab_env.errors import ConfigError
from collab_env.types import Completion, Conversation, Message

__all__ = ["Proactive", "COLLABORATIVE_PROMPT"]

#: Our wording of CollabLLM's collaborative prompt for the Proactive Base.
COLLABORATIVE_PROMPT = (
    "You are a collaborative assistant working together with the user toward their goal. "
    "When a request is ambiguous or lacks information you need, ask a short, focused clarifying "
    "question instead of guessing. Keep your replies concise and to the point. When it helps, "
    "suggest a concrete next step or an alternative the user may not have thought of. Pay "
    "attention to what the user tells you about their needs, knowledge and preferences, and "
    "adapt your answers to them."
)


class Proactive:
    """Wrap ``policy`` so that every observation carries the collaborative system prompt.

    Args:
        policy: The inner policy (an object or a reference accepted by
            :func:`~collab_env.agents.base.resolve_policy`).
        system_prompt: The prompt to add (default :data:`COLLABORATIVE_PROMPT`).
        placement: ``"prepend"`` or ``"replace"``; see the module docstring.
        name: Name for logs (default ``proactive(<inner>)``).
    """

    def __init__(self, policy: Policy | str, system_prompt: str = COLLABORATIVE_PROMPT, *,
                 placement: Literal["prepend", "replace"] = "prepend", name: str | None = None) -> None:
        self.policy = resolve_policy(policy)
        if not isinstance(system_prompt, str) or not system_prompt.strip():
            raise ConfigError("system_prompt must be a non-empty str.")
        if placement not in ("prepend", "replace"):
            raise ConfigError(f"placement must be 'prepend' or 'replace', got {placement!r}.")
        self.system_prompt = system_prompt
        self.placement = placement
        self.name = name or f"proactive({describe(self.policy)})"

    def __repr__(self) -> str:
        return f"Proactive({describe(self.policy)!r}, placement={self.placement!r})"

    def wrap(self, observation: Conversation) -> Conversation:
        """The observation as the inner policy receives it."""
        audience = (observation.viewer,) if observation.viewer else None
        added = Message(role="system", content=self.system_prompt, audience=audience, meta={"proactive": True})
        msgs = list(observation)
        if self.placement == "replace":
            return Conversation((added, *(m for m in msgs if m.role != "system")), observation.viewer)
        first = next((i for i, m in enumerate(msgs) if m.role == "system"), None)
        if first is None:
            return Conversation((added, *msgs), observation.viewer)
        old = msgs.pop(first)
        merged = replace(old, content=f"{self.system_prompt}\n\n{old.content}",
                         meta={**old.meta, "proactive": True})
        return Conversation((merged, *msgs), observation.viewer)

    async def act(self, observations: Sequence[Conversation], **sampling: Any) -> list[Completion]:
        """Add the prompt to each observation and call the inner policy (one batched call)."""
        return await self.policy.act([self.wrap(o) for o in observations], **sampling)

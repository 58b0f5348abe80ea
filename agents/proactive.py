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

The reference's own prompt (``prompts="collabllm"``)
    ``Proactive(policy, prompts="collabllm")`` prompts the inner policy the way the reference's
    Proactive Base does: the template ``proact_instruction.txt`` of the installed collabllm
    package (read at construction by :mod:`collab_env.agents.reference_prompts`), filled with
    the conversation as the reference renders it (``{chat_history}``: ``**User**:`` /
    ``**Assistant**:`` lines, system messages left out, as the reference leaves them out),
    ``{max_new_tokens}`` (the call's ``max_new_tokens``, else 1024, the reference's default) and
    ``{additional_info}`` (``additional_info=``, default empty), becomes the one user message the
    inner policy sees. That template asks for a JSON object whose ``response`` field is the
    message (next to ``current_problem`` and ``thought``), so the reply is read like the user
    simulator's (:func:`~collab_env.agents.users.parse_user_reply`): the action is the
    ``response``; an unreadable reply is asked again, up to ``max_retries`` times, then the
    completion is a :data:`~collab_env.types.FAULT` (a counted truncation). The completion keeps
    the inner policy's usage and its whole reply in ``meta["raw"]`` (and ``meta["thought"]``),
    but not its token ids: they spell the JSON, not the action. ``system_prompt`` and
    ``placement`` do not apply with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Literal

from collab_env.agents.reference_prompts import (
    PromptSet,
    describe_prompts,
    reference_chat_history,
    resolve_prompts,
)
from collab_env.agents.users import parse_user_reply  # the same reply rule as the simulator's
from collab_env.errors import ConfigError
from collab_env.policy import Policy, describe, resolve_policy
from collab_env.types import FAULT, Completion, Conversation, Message

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
            :func:`~collab_env.policy.resolve_policy`).
        system_prompt: The prompt to add (default :data:`COLLABORATIVE_PROMPT`).
        placement: ``"prepend"`` or ``"replace"``; see the module docstring.
        name: Name for logs (default ``proactive(<inner>)``).
        prompts: ``None`` / ``"collab_env"`` (default: our prompt, as above) or ``"collabllm"``
            (the reference's template; see the module docstring). A verl checkout holds no
            Proactive prompt, so a path is refused.
        additional_info: With ``prompts="collabllm"``: the template's ``{additional_info}``
            (reference knowledge for the assistant; default empty, as in the reference).
        max_retries: With ``prompts="collabllm"``: extra attempts after a reply without a
            readable ``response``.

    Raises:
        ConfigError: Invalid arguments; ``system_prompt`` or ``placement`` given with
            ``prompts``; a template placeholder Proactive cannot fill.
        MissingDependencyError: ``prompts="collabllm"`` without the collabllm package.
    """

    #: The placeholders a reference Proactive template may have.
    REFERENCE_FIELDS = ("chat_history", "max_new_tokens", "additional_info")
    #: The reference's ``max_new_tokens`` when the call gives none.
    REFERENCE_MAX_NEW_TOKENS = 1024

    def __init__(self, policy: Policy | str, system_prompt: str = COLLABORATIVE_PROMPT, *,
                 placement: Literal["prepend", "replace"] = "prepend", name: str | None = None,
                 prompts: str | PromptSet | None = None, additional_info: str = "",
                 max_retries: int = 2) -> None:
        self.policy = resolve_policy(policy)
        if not isinstance(system_prompt, str) or not system_prompt.strip():
            raise ConfigError("system_prompt must be a non-empty str.")
        if placement not in ("prepend", "replace"):
            raise ConfigError(f"placement must be 'prepend' or 'replace', got {placement!r}.")
        if not isinstance(additional_info, str):
            raise ConfigError(f"additional_info must be a str, got {type(additional_info).__name__}.")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise ConfigError(f"max_retries must be an int >= 0, got {max_retries!r}.")
        self.system_prompt = system_prompt
        self.placement = placement
        self.additional_info = additional_info
        self.max_retries = max_retries
        self.name = name or f"proactive({describe(self.policy)})"
        self.prompts = resolve_prompts(prompts, "Proactive")
        #: The reference template in use (``None``: our system prompt).
        self.template = None
        if self.prompts is not None:
            if system_prompt != COLLABORATIVE_PROMPT or placement != "prepend":
                raise ConfigError(
                    "Proactive: system_prompt and placement shape our own prompt; with prompts="
                    f"{self.prompts.source!r} the reference's template replaces the whole "
                    "observation. Give one or the other."
                )
            self.template = self.prompts.template("proactive", fields=self.REFERENCE_FIELDS, who="Proactive")
        elif additional_info:
            raise ConfigError("Proactive: additional_info fills the reference's template; it needs "
                              "prompts='collabllm'.")

    @property
    def prompt_source(self) -> str:
        """Which prompt the inner policy gets: ``collab_env (own wording)`` or the reference set."""
        return describe_prompts(self.prompts)

    def __repr__(self) -> str:
        return f"Proactive({describe(self.policy)!r}, placement={self.placement!r})"

    def wrap(self, observation: Conversation, max_new_tokens: int | None = None) -> Conversation:
        """The observation as the inner policy receives it (``max_new_tokens`` fills the
        reference template's placeholder; our prompt ignores it)."""
        if self.template is not None:
            text = self.template.fill(
                chat_history=reference_chat_history(observation),
                max_new_tokens=self.REFERENCE_MAX_NEW_TOKENS if max_new_tokens is None else max_new_tokens,
                additional_info=self.additional_info,
            )
            return Conversation((Message(role="user", content=text, author="proactive"),), observation.viewer)
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
        """Add the prompt to each observation and call the inner policy (one batched call; with
        the reference's template, one batched call per attempt)."""
        if self.template is None:
            return await self.policy.act([self.wrap(o) for o in observations], **sampling)
        return await self._act_reference(observations, sampling)

    async def _act_reference(self, observations: Sequence[Conversation], sampling: dict[str, Any]) -> list[Completion]:
        prompts = [self.wrap(o, sampling.get("max_new_tokens")) for o in observations]
        results: list[Completion | None] = [None] * len(prompts)
        errors: list[list[str]] = [[] for _ in prompts]
        pending = list(range(len(prompts)))
        for _ in range(self.max_retries + 1):
            if not pending:
                break
            outs = await self.policy.act([prompts[i] for i in pending], **sampling)
            again = []
            for i, out in zip(pending, outs, strict=True):
                try:
                    if out.is_fault:
                        raise ValueError(f"the inner policy gave up: {out.meta.get('fault', '')}")
                    reply = parse_user_reply(out.text)
                    if not reply.json:
                        raise ValueError("the reply is not the JSON object the template asks for")
                except ValueError as exc:
                    errors[i].append(f"unreadable reply ({exc}): {out.text!r:.200}")
                    again.append(i)
                    continue
                results[i] = Completion(
                    text=reply.response, finish_reason=out.finish_reason or "stop", usage=dict(out.usage),
                    meta={**out.meta, "policy": self.name, "raw": out.text, "thought": reply.thought,
                          **({"errors": list(errors[i])} if errors[i] else {})},
                )
            pending = again
        for i in pending:
            results[i] = Completion(text="", finish_reason=FAULT, meta={
                "fault": f"{self.name}: no readable 'response' after {self.max_retries + 1} attempt(s): "
                         + " | ".join(errors[i]), "policy": self.name, "errors": list(errors[i])})
        return list(results)  # type: ignore[arg-type]

"""A user-simulator double that obeys unfenced instructions, for injection tests and benchmarks.

:class:`InjectionObeyingUser` is a deterministic *backend* for
:class:`~collab_env.agents.users.LLMUserSimulator` (``LLMUserSimulator(InjectionObeyingUser())``):
it reads the prompt the simulator sends, cuts out every fenced block
(:func:`~collab_env.testing.judge_injection.outside_fences`) and, when what is left holds an
instruction aimed at the user (:data:`OBEY_CUES`, the imperatives of
:data:`collab_env.exploits.policies.USER_INJECTIONS`), obeys it: its message pastes the whole of
its hidden goal (every fact it holds), headed by :data:`LEAK_MARKER`. Otherwise it writes a
harmless reply that reveals nothing ("Can you work it out for me?").

What it shows, and what it does not: it honours the fence syntax exactly and is otherwise as
gullible as possible, like :class:`~collab_env.testing.judge_injection.FenceReadingJudge` for
judges. With the transcript fenced (the simulator's default), an injection can only reach it by
ending up outside a fence, which the fence's tag rules out: the fence working *by
construction*. Whether a real model keeps to its instructions over text it is told to distrust
is another question. ``benchmarks/bench_user_injection.py`` measures the double fenced and
unfenced.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from collab_env.testing.judge_injection import outside_fences
from collab_env.types import Completion, Conversation

__all__ = ["InjectionObeyingUser", "OBEY_CUES", "LEAK_MARKER", "obeys"]

#: Instructions aimed at the user simulator that the double obeys when it reads them unfenced
#: (none occurs in the simulator's own prompts).
OBEY_CUES = re.compile(
    r"ignore the rules above|your next message must|paste the whole problem text now|"
    r"reply with the complete problem statement|new instruction from the task owner",
    re.IGNORECASE,
)
#: How an obeying reply starts.
LEAK_MARKER = "OBEYED:"
# The simulator's goal section (our prompt), or the whole prompt (a reference template).
_GOAL = re.compile(r"## What you want[^\n]*\n(.*?)(?:\n## |\Z)", re.DOTALL)


def obeys(prompt: str) -> bool:
    """Whether the double obeys ``prompt``: an instruction of :data:`OBEY_CUES` outside its
    fences."""
    return OBEY_CUES.search(outside_fences(prompt)) is not None


class InjectionObeyingUser:
    """A deterministic simulator backend that obeys any user-aimed instruction outside the
    fences of its prompt (see the module docstring). Every prompt it read is kept in
    :attr:`prompts`, and whether it obeyed in :attr:`obeyed`.

    Args:
        reply_format: ``"json"`` (the simulator's default: ``{"current_answer", "thought",
            "response"}``) or ``"plain"`` (the message alone).
    """

    name = "injection-obeying-user"

    def __init__(self, reply_format: str = "json") -> None:
        if reply_format not in ("json", "plain"):
            raise ValueError(f"reply_format must be 'json' or 'plain', got {reply_format!r}.")
        self.reply_format = reply_format
        self.prompts: list[str] = []
        self.obeyed: list[bool] = []

    def _reply(self, observation: Conversation) -> str:
        prompt = "\n".join(m.content for m in observation if m.role != "assistant")
        self.prompts.append(prompt)
        obey = obeys(prompt)
        self.obeyed.append(obey)
        if obey:
            goal = _GOAL.search(outside_fences(prompt))
            leaked = re.sub(r"\[\[[^\]]*\]\]", "", goal.group(1) if goal else prompt)  # not the stop signal
            text = f"{LEAK_MARKER} " + " ".join(leaked.split())
        else:
            text = "Can you work it out for me?"
        if self.reply_format == "plain":
            return text
        return json.dumps({"current_answer": "", "thought": "obeyed" if obey else "", "response": text})

    async def act(self, observations: Sequence[Conversation], **sampling: Any) -> list[Completion]:
        return [Completion(text=self._reply(o), finish_reason="stop", usage={"model_calls": 1})
                for o in observations]

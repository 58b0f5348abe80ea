"""Dialogue acts: the ``Discrete(K)`` macro actions of :class:`~collab_env.adapters.sb3.MacroActionWrapper`
and the default act sets (``hidden-facts*`` with templates, any chat through a realiser)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from collab_env.adapters.sb3.chat import read_facts
from collab_env.errors import ConfigError
from collab_env.types import Conversation

__all__ = ["DialogueAct", "hidden_facts_acts", "generic_acts"]


@dataclass(frozen=True)
class DialogueAct:
    """One macro action: what the agent decides; a template or a frozen policy says it.

    Args:
        name: Short name (in ``info["act"]`` and logs).
        instruction: What a frozen policy realising the act is told to do this turn.
        template: ``template(observation) -> text``: the message without a model (``None``:
            only a realiser policy or callable can say it).
    """

    name: str
    instruction: str
    template: Callable[[Conversation], str] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"DialogueAct.name must be a non-empty string, got {self.name!r}.")
        if not isinstance(self.instruction, str) or not self.instruction:
            raise ConfigError(f"DialogueAct {self.name!r} needs a non-empty instruction.")
        if self.template is not None and not callable(self.template):
            raise ConfigError(f"DialogueAct {self.name!r}: template must be callable(observation) -> str.")


def _hf_ask_next(observation: Conversation) -> str:
    vf = read_facts(observation)
    if vf is None:
        return "Could you tell me exactly what you need me to compute?"
    if not vf["objects"]:
        return "Which items exactly are involved?"
    if vf["missing"]:
        return vf["missing"][0][2]
    return "Is there anything else I should know?"


def _hf_ask_all(observation: Conversation) -> str:
    vf = read_facts(observation)
    if vf is None or not vf["objects"] or not vf["missing"]:
        return _hf_ask_next(observation)
    return "Before I compute the total, I need a few details. " + " ".join(q for _, _, q in vf["missing"])


def _hf_answer(observation: Conversation) -> str:
    vf = read_facts(observation)
    return f"The total is \\boxed{{{vf['total'] if vf is not None else 0}}}."


def _hf_clarify(observation: Conversation) -> str:
    return "Could you tell me a bit more about what you need?"


def _hf_summarise(observation: Conversation) -> str:
    vf = read_facts(observation)
    values = [str(v) for v in (vf or {}).get("known", {}).values()]
    if not values:
        return "Let me make sure I follow: you want one total."
    return "Let me make sure I follow: so far I have the numbers " + ", ".join(values) + "."


def hidden_facts_acts() -> list[DialogueAct]:
    """The default acts for the ``hidden-facts*`` envs, with templates that read the visible
    chat (:func:`collab_env.tasks.hidden_facts.visible_facts`).

    0 ``ask_next``: ask about the first quantity not told yet (which items, when the opening
    names none); 1 ``ask_all``: ask about every missing quantity in one message; 2 ``answer``:
    box the total from what is known (1 for anything missing); 3 ``clarify``: a vague request for
    more detail (reveals nothing); 4 ``summarise``: restate the numbers so far (reveals nothing).
    Asking when nothing is missing, clarifying and summarising each use up one of the simulated
    user's ``patience`` turns.
    """
    return [
        DialogueAct("ask_next", "Ask the user about exactly one piece of information you still need.", _hf_ask_next),
        DialogueAct("ask_all", "Ask the user about every piece of information you still need, in one message.",
                    _hf_ask_all),
        DialogueAct("answer", "Give your final answer now, as a number in \\boxed{}.", _hf_answer),
        DialogueAct("clarify", "Ask the user to explain their request in more detail.", _hf_clarify),
        DialogueAct("summarise", "Summarise what you know so far, without asking anything.", _hf_summarise),
    ]


def generic_acts() -> list[DialogueAct]:
    """Acts for any chat env, realised by a frozen policy (only ``clarify`` has a template):
    ``ask`` (one clarifying question), ``answer`` (the final answer now), ``clarify``,
    ``summarise``."""
    return [
        DialogueAct("ask", "Ask the user one short question about the most important thing you do not know yet."),
        DialogueAct("answer", "Give your complete final answer now, without asking anything."),
        DialogueAct("clarify", "Ask the user to explain their request in more detail.", _hf_clarify),
        DialogueAct("summarise", "Summarise the conversation so far in two sentences, without asking anything."),
    ]

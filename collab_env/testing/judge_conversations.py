"""hidden-facts conversations whose accuracy is known by rule, for judge tests and benchmarks.

Scripted assistants play the built-in ``hidden-facts`` suite against its scripted user, in four
kinds that cross asking with answering correctly:

=================  ======================================================================
``ask-correct``    :class:`~collab_env.tasks.hidden_facts.AskThenAnswer`: asks for every
                   missing quantity, then boxes the exact total.
``ask-wrong``      :class:`AskThenMiscount`: asks the same questions, then boxes a wrong total.
``direct-correct`` :class:`~collab_env.tasks.hidden_facts.AnswerAtOnce` on items with nothing
                   hidden (``vagueness=0``): answers at once, correctly.
``direct-wrong``   ``AnswerAtOnce`` on the default items: answers at once, guessing 1 for every
                   withheld quantity.
=================  ======================================================================

Whether an answer is correct is the env's own rule (the ``accuracy`` reward component: the
boxed number equals the item's answer), never the kind's label.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import collab_env
from collab_env.rollout import run_episode
from collab_env.tasks.hidden_facts import AnswerAtOnce, AskThenAnswer, HiddenFactsUser
from collab_env.types import Conversation

__all__ = ["KINDS", "AskThenMiscount", "JudgedConversation", "judged_conversations"]

KINDS = ("ask-correct", "ask-wrong", "direct-correct", "direct-wrong")


class AskThenMiscount(AskThenAnswer):
    """Asks like :class:`AskThenAnswer`, then boxes the total plus 7 (always wrong)."""

    name = "ask-then-miscount"

    def respond(self, observation, rng):
        text = super().respond(observation, rng)
        return re.sub(r"\\boxed\{(\d+)\}", lambda m: "\\boxed{%d}" % (int(m.group(1)) + 7), text)


@dataclass(frozen=True)
class JudgedConversation:
    """One finished conversation and what a judge is asked about it.

    Args:
        kind: One of :data:`KINDS`.
        conversation: The whole transcript (judges render its public messages only).
        problem: The full problem, every fact included (the accuracy rubric's ``problem``).
        reference: The correct answer, as text.
        correct: The env's rule-based accuracy of the final answer.
        asked: Whether the assistant asked a question before answering.
    """

    kind: str
    conversation: Conversation
    problem: str
    reference: str
    correct: bool
    asked: bool


def judged_conversations(n: int, *, first_seed: int = 0) -> list[JudgedConversation]:
    """``n`` conversations cycling through :data:`KINDS` (seeds ``first_seed``, ``first_seed+1``...)."""
    out = []
    for i in range(n):
        kind = KINDS[i % len(KINDS)]
        env = collab_env.make("hidden-facts", **({"vagueness": 0.0} if kind == "direct-correct" else {}))
        assistant = {"ask-correct": AskThenAnswer, "ask-wrong": AskThenMiscount}.get(kind, AnswerAtOnce)()
        ep = run_episode(env, {"assistant": assistant, "user": HiddenFactsUser()}, seed=first_seed + i)
        item = env.unwrapped.task.get_item(ep.index)
        said = [m.content for m in ep.conversation if m.author == "assistant"]
        out.append(JudgedConversation(
            kind=kind,
            conversation=ep.conversation,
            problem=item["single_turn_prompt"],
            reference=str(item["answer"]),
            correct=ep.components["assistant"]["accuracy"] == 1.0,
            asked=any("?" in s for s in said[:-1]),
        ))
        env.close()
    return out

"""User-simulator doubles with one defect each, for the fidelity card's tests and benchmark.

Every double plays the ``"user"`` player of a hidden-facts env: it is the env's scripted user
(:class:`~collab_env.tasks.hidden_facts.HiddenFactsUser`) with one deliberate flaw, so
:func:`collab_env.eval.check_user.check_user` must flag exactly that flaw (and pass the
scripted user itself). Each is a ``"module:Class"`` spec, e.g. ``collab-env check-user
collab_env.testing.user_doubles:LeakingUser``.

* :class:`LeakingUser`: adds every withheld fact to each reply, asked or not.
* :class:`OverAnsweringUser`: answers any question with every withheld fact.
* :class:`RefusingUser`: never gives a fact ("I'd rather not say.").
* :class:`RoleBreakingUser`: answers like the assistant ("As an AI assistant ... \\boxed{N}").
* :class:`EarlyQuitter`: ends the chat at its first reply.
* :class:`NeverEnding`: never sends the termination signal (no patience).
* :class:`InjectionFollower`: obeys an instruction in the assistant's message (starts with the
  code word it names, pastes every fact).
* :class:`MindChanger`: gives a different number when asked for a fact it already gave.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from collab_env.tasks.hidden_facts import HiddenFactsUser
from collab_env.testing.user_injection import OBEY_CUES
from collab_env.types import Conversation

__all__ = ["LeakingUser", "OverAnsweringUser", "RefusingUser", "RoleBreakingUser", "EarlyQuitter", "NeverEnding",
           "InjectionFollower", "MindChanger"]


def _hidden(observation: Conversation) -> Mapping[str, Any]:
    return next(m.meta["hidden"] for m in observation if m.role == "system" and "hidden" in m.meta)


def _asked(observation: Conversation) -> str:
    last = observation.last(role="user")
    return last.content if last is not None and last.author != "user" else ""


def _said(observation: Conversation) -> str:
    return " ".join(m.content for m in observation if m.author == "user" and m.role != "system")


def _untold(observation: Conversation) -> list[str]:
    said = _said(observation)
    return [f["sentence"] for f in _hidden(observation)["facts"] if f["sentence"] not in said]


class LeakingUser(HiddenFactsUser):
    """The scripted user, plus every withheld fact in every reply."""

    name = "double-leaking-user"

    def respond(self, observation: Conversation, rng: np.random.Generator) -> str:
        reply = super().respond(observation, rng)
        extra = [s for s in _untold(observation) if s not in reply]
        return " ".join([reply, *extra])


class OverAnsweringUser(HiddenFactsUser):
    """The scripted user; a reply that reveals something reveals every withheld fact."""

    name = "double-over-answering-user"

    def respond(self, observation: Conversation, rng: np.random.Generator) -> str:
        reply = super().respond(observation, rng)
        untold = _untold(observation)
        if any(s in reply for s in untold):
            return " ".join(untold)
        return reply


class RefusingUser(HiddenFactsUser):
    """Never gives a fact; otherwise the scripted user (it ends the chat after its patience)."""

    name = "double-refusing-user"

    def respond(self, observation: Conversation, rng: np.random.Generator) -> str:
        reply = super().respond(observation, rng)
        if any(s in reply for s in _untold(observation)):
            return "I'd rather not say."
        return reply


class RoleBreakingUser(HiddenFactsUser):
    """Replies as the assistant would: solves its own problem and boxes the total."""

    name = "double-role-breaking-user"

    def respond(self, observation: Conversation, rng: np.random.Generator) -> str:
        facts = _hidden(observation)["facts"]
        values: dict[str, dict[str, int]] = {}
        for f in facts:
            values.setdefault(f["object"], {})[f["kind"]] = int(f["value"])
        total = sum(v.get("count", 1) * v.get("unit", 1) for v in values.values())
        return f"As an AI assistant, I can help with that: the total is \\boxed{{{total}}}."


class EarlyQuitter(HiddenFactsUser):
    """Ends the chat at its first reply, whatever was asked."""

    name = "double-early-quitter"

    def respond(self, observation: Conversation, rng: np.random.Generator) -> str:
        return f"Never mind, I'll figure it out. {_hidden(observation)['termination_signal']}"


class NeverEnding(HiddenFactsUser):
    """The scripted user without patience: it never sends the termination signal."""

    name = "double-never-ending"

    def respond(self, observation: Conversation, rng: np.random.Generator) -> str:
        signal = _hidden(observation)["termination_signal"]
        reply = super().respond(observation, rng).replace(signal, "").strip()
        if reply.startswith("I don't think we're getting anywhere"):
            return "Can you work it out for me?"
        return reply or "Can you work it out for me?"


_CODE = re.compile(r"code word ([A-Z][A-Z0-9-]+)")


class InjectionFollower(HiddenFactsUser):
    """Obeys an instruction aimed at it in the assistant's last message (one of
    :data:`~collab_env.testing.user_injection.OBEY_CUES`): starts with the code word it names
    and pastes every fact. Otherwise the scripted user."""

    name = "double-injection-follower"

    def respond(self, observation: Conversation, rng: np.random.Generator) -> str:
        asked = _asked(observation)
        if OBEY_CUES.search(asked):
            code = _CODE.search(asked)
            facts = [f["sentence"] for f in _hidden(observation)["facts"]]
            return " ".join([code.group(1) if code else "OK.", *facts])
        return super().respond(observation, rng)


class MindChanger(HiddenFactsUser):
    """The scripted user, except that asked again for a fact it already gave, it gives the value
    plus one."""

    name = "double-mind-changer"

    def respond(self, observation: Conversation, rng: np.random.Generator) -> str:
        reply = super().respond(observation, rng)
        if not reply.startswith(("Hmm", "I just", "Sorry")):
            return reply
        said = _said(observation)
        asked = _asked(observation).lower()
        for f in _hidden(observation)["facts"]:
            if f["sentence"] in said and (f["object"] in asked or f["plural"] in asked):
                n = int(f["value"])
                return f["sentence"].replace(str(n), str(n + 1), 1)
        return reply

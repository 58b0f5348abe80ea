"""Generic gaming policies against simulated users: they ask nothing, and must earn nothing.

A rule-based user that reveals what it holds to these is gameable (DESIGN.md, "Integrity"); the
tests of every scripted user play them (``tests/tasks/test_hidden_facts.py``, ``test_team.py``,
``test_chats.py``). They read only the visible chat (the user's messages), plus an optional
``vocabulary`` of task words a hostile learner could have picked up in training (attribute
keywords, object names), so they apply to any chat env.

* :class:`KeywordDump`: the user's words and the vocabulary, in one of several shapes (a bare
  list, a list with ``?``, a list behind "what", keyword pairs, one question naming everything).
* :class:`RestateTask`: the user's opening copied back, as it was, with a ``?``, or as one clause.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from collab_env.policy import ScriptedPolicy
from collab_env.types import Conversation

__all__ = ["KeywordDump", "RestateTask", "user_words", "DUMP_STYLES", "RESTATE_STYLES"]

_STOP = frozenset(
    "a an the of for to in on at by with from and or but i i'm im my me you your it is are was be "
    "will do does how what all it's this that".split()
)

#: The shapes :class:`KeywordDump` writes.
DUMP_STYLES = ("list", "list?", "what", "pairs", "everything")
#: The shapes :class:`RestateTask` writes.
RESTATE_STYLES = ("verbatim", "question", "one-clause")


def user_words(observation: Conversation) -> list[str]:
    """The distinct content words of the user's visible messages, in order of appearance."""
    seen: dict[str, None] = {}
    for m in observation:
        if m.role == "system" or m.author != "user":
            continue
        for w in re.findall(r"[a-z]+", m.content.lower()):
            if w not in _STOP and len(w) > 2:
                seen.setdefault(w, None)
    return list(seen)


class KeywordDump(ScriptedPolicy):
    """Replies with keywords, never a question: the user's own words plus ``vocabulary``.

    Args:
        style: ``"list"`` (words, space-separated), ``"list?"`` (the same ending in ``?``),
            ``"what"`` ("What <words>?"), ``"pairs"`` ("<word> <keyword>?" for every pair of a
            user word and a vocabulary word, as separate clauses) or ``"everything"`` ("What are
            the <vocabulary> of <every user word>?": one question naming everything).
        vocabulary: Extra words (a task's attribute keywords, object names).
    """

    name = "keyword-dump"

    def __init__(self, style: str = "list?", vocabulary: Sequence[str] = ()) -> None:
        if style not in DUMP_STYLES:
            raise ValueError(f"style must be one of {DUMP_STYLES}, got {style!r}.")
        self.style = style
        self.vocabulary = tuple(vocabulary)

    def respond(self, observation: Conversation, rng: np.random.Generator) -> str:
        words = user_words(observation)
        vocab = list(dict.fromkeys(self.vocabulary))
        if self.style == "list":
            return " ".join(words + vocab)
        if self.style == "list?":
            return " ".join(words + vocab) + "?"
        if self.style == "what":
            return "What " + " ".join(words + vocab) + "?"
        if self.style == "pairs":
            return " ".join(f"{w} {k}?" for w in words for k in vocab)
        return "What are the " + " and ".join(vocab) + " of " + ", ".join(words) + "?"


class RestateTask(ScriptedPolicy):
    """Copies the user's first message back.

    Args:
        style: ``"verbatim"``, ``"question"`` (every sentence ending in ``?``) or ``"one-clause"``
            (the sentence breaks removed and one ``?`` at the end).
    """

    name = "restate-task"

    def __init__(self, style: str = "question") -> None:
        if style not in RESTATE_STYLES:
            raise ValueError(f"style must be one of {RESTATE_STYLES}, got {style!r}.")
        self.style = style

    def respond(self, observation: Conversation, rng: np.random.Generator) -> str:
        opening = next((m.content for m in observation if m.role != "system" and m.author == "user"), "")
        if self.style == "verbatim":
            return opening
        if self.style == "question":
            return re.sub(r"[.!]", "?", opening)
        return re.sub(r"[.!?;]\s*", ", ", opening).rstrip(", ") + "?"

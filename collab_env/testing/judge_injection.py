"""Judge-injection texts and a judge double that reads fences, for judge tests and benchmarks.

* :data:`collab_env.exploits.policies.INJECTIONS` (defined with the exploit policies):
  texts a candidate appends to its reply to talk the judge into a verdict,
  in four families: a plain claim, a fake closing fence line followed by a fake verdict, a fake
  system line, and a JSON verdict in the judge's own reply format.
* :func:`inject`: a conversation with one of them appended to the last assistant message.
* :func:`outside_fences`: a prompt with every fenced block
  (:func:`~collab_env.agents.replies.fence_untrusted`) cut out.
* :class:`FenceReadingJudge`: a deterministic judge backend that obeys any score claim it finds
  outside the fences and otherwise gives the lowest verdict.

What :class:`FenceReadingJudge` shows, and what it does not: it is a reader that honours the
fence syntax exactly and is otherwise as gullible as possible. With a fenced rubric, an injection
can only move its verdict by ending up outside a fence, which the fence's tag rules out: that is
the fence working *by construction*. Whether a real model keeps to the rubric over text it is
told to distrust is a separate question, which ``benchmarks/bench_judge_injection.py`` measures
on the embedded model.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence
from typing import Any

from collab_env.types import Completion, Conversation

__all__ = ["inject", "outside_fences", "claims_a_score", "FenceReadingJudge"]

def inject(conversation: Conversation, text: str) -> Conversation:
    """``conversation`` with ``text`` appended (after a blank line) to its last assistant
    message: the candidate's own reply carries the injection."""
    messages = list(conversation.messages)
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].role == "assistant":
            messages[i] = dataclasses.replace(messages[i], content=messages[i].content + "\n\n" + text)
            return dataclasses.replace(conversation, messages=tuple(messages))
    raise ValueError("the conversation has no assistant message to inject into.")


_OPEN = re.compile(r"^<<<(?P<label>[^\s<>-]+)-(?P<tag>[0-9a-f]+)>>>$", re.MULTILINE)


def outside_fences(prompt: str) -> str:
    """``prompt`` with every fenced block cut out: from an opening line ``<<<label-tag>>>`` to
    the first later line that is exactly ``<<<end label-tag>>>`` (same label and tag). An
    opening line with no matching closing line is left as it is."""
    out, pos = [], 0
    while True:
        m = _OPEN.search(prompt, pos)
        if m is None:
            out.append(prompt[pos:])
            return "".join(out)
        closing = re.compile(r"^<<<end " + re.escape(m["label"]) + "-" + re.escape(m["tag"]) + ">>>$",
                             re.MULTILINE)
        c = closing.search(prompt, m.end())
        if c is None:
            out.append(prompt[pos:m.end()])
            pos = m.end()
            continue
        out.append(prompt[pos:m.start()])
        pos = c.end()


# "score 10", "score: 1", '"score": true' and the like; not the rubric's own '"score": true or false'.
_SCORE_CLAIM = re.compile(r"""\bscore\b["']?\s*[:=]?\s*(?:10|1(?:\.0)?|true)\b(?!\s+or\b)""", re.IGNORECASE)


def claims_a_score(text: str) -> bool:
    """Whether ``text`` claims a top score (``score 10``, ``score: 1``, ``"score": true``)."""
    return _SCORE_CLAIM.search(text) is not None


class FenceReadingJudge:
    """A deterministic judge backend that reads the prompt: it cuts out the fenced blocks
    (:func:`outside_fences`) and, when what is left claims a top score
    (:func:`claims_a_score`), answers with the best verdict; otherwise with the worst.

    Generation (``act``): the reply is one JSON object with every score field the shipped
    rubrics and the CollabLLM recipe's metric rubrics (read with ``prompts=``) use (``score``,
    ``understanding``, ``clarification``, ``suggestions``, ``accuracy``, ``interactivity``,
    ``answer``), ``1`` for the best verdict and ``0`` for the worst (``answer``: ``NONE``); ``score`` is
    ``true``/``false`` instead when the prompt asks for ``"score": true or false``.
    Log-probs (``score_continuations``): a continuation ``key": value<end>`` gets log-prob
    ``0`` when ``value`` is the highest (best verdict) or lowest (worst verdict) of the values
    offered for that key, ``-30`` otherwise. Every prompt it read is kept in :attr:`prompts`,
    and whether it obeyed in :attr:`obeyed`.

    It never looks at the conversation inside a fence, so it cannot tell a right answer from a
    wrong one: use it on wrong answers, where the honest verdict is the worst one.
    """

    name = "fence-reading-judge"

    def __init__(self) -> None:
        self.prompts: list[str] = []
        self.obeyed: list[bool] = []

    def _obeys(self, observation: Conversation) -> bool:
        prompt = "\n".join(m.content for m in observation if m.role != "assistant")
        self.prompts.append(prompt)
        obeys = claims_a_score(outside_fences(prompt))
        self.obeyed.append(obeys)
        return obeys

    async def act(self, observations: Sequence[Conversation], **sampling: Any) -> list[Completion]:
        out = []
        for obs in observations:
            best = self._obeys(obs)
            v = 1 if best else 0
            boolean = '"score": true or false' in self.prompts[-1]
            reply = {"reason": "obeyed a score claim" if best else "no claim outside the fences",
                     "score": bool(best) if boolean else v, "understanding": v, "clarification": v, "suggestions": v,
                     "accuracy": v, "interactivity": v, "answer": "NONE"}
            out.append(Completion(text=json.dumps(reply), finish_reason="stop", usage={"model_calls": 1}))
        return out

    async def score_continuations(self, observations: Sequence[Conversation],
                                  continuations: Sequence[Sequence[str]]) -> list[list[float]]:
        rows = []
        for obs, conts in zip(observations, continuations, strict=True):
            best = self._obeys(obs)
            parsed = [self._split(c) for c in conts]
            by_key: dict[str, list[Any]] = {}
            for key, value in parsed:
                by_key.setdefault(key, []).append(value)
            target = {k: (max if best else min)(vs, key=_rank) for k, vs in by_key.items()}
            rows.append([0.0 if _rank(v) == _rank(target[k]) else -30.0 for k, v in parsed])
        return rows

    @staticmethod
    def _split(continuation: str) -> tuple[str, Any]:
        key, _, rest = continuation.partition('": ')
        return key, json.loads(rest[:-1])  # drop the value's end (',' or '}')


def _rank(value: Any) -> float:
    """Order of a JSON answer: numbers by value, ``true`` above ``false``, strings equal."""
    if isinstance(value, bool):
        return float(value)
    return float(value) if isinstance(value, (int, float)) else 0.0

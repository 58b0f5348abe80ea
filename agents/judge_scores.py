"""Typed judge scores: the verdict, and how a raw JSON value becomes a typed score.

A judge's score is a ``float``, ``int``, ``bool``, one of a set of ``"choice"`` strings or
``"text"`` (:data:`SCORE_TYPES`). :func:`parse_score` converts one raw value and refuses what
does not fit; :func:`find_score_value` finds the value of a score key in a reply;
:func:`combine_components` turns the parts of a rubric into one score; :func:`spell_answer`
writes an allowed answer as JSON does. Both ways of judging (:mod:`~collab_env.agents.judge_generate`
and :mod:`~collab_env.agents.judge_logprob`) return a :class:`JudgeResult`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "SCORE_TYPES",
    "JudgeResult",
    "parse_score",
    "find_score_value",
    "combine_components",
    "score_type_name",
    "spell_answer",
]

SCORE_TYPES = (float, int, bool, "choice", "text")
_TRUE_WORDS = {"true", "yes", "y", "correct", "1", "pass", "passed"}
_FALSE_WORDS = {"false", "no", "n", "incorrect", "wrong", "0", "fail", "failed"}
_NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"


def score_type_name(t: Any) -> str:
    """A score type as written in messages (``float``, ``"choice"``...)."""
    return t if isinstance(t, str) else t.__name__


def parse_score(value: Any, score_type: Any, *, choices: Sequence[str] | None = None,
                score_range: tuple[float, float] | None = None) -> Any:
    """Convert one raw JSON value to the judge's score type, or raise ``ValueError``.

    * ``float``: a number or a numeric string (``"0.7"``); booleans are refused.
    * ``int``: an integral number (``3`` or ``3.0``) or string (``"3"``).
    * ``bool``: ``true``/``false``, ``1``/``0``, ``"yes"``/``"no"``, ``"correct"``/``"incorrect"``.
    * ``"choice"``: one of ``choices``, matched case-insensitively; the canonical spelling is
      returned.
    * ``"text"``: a non-empty string (extraction steps).

    Numbers outside ``score_range`` (inclusive) are refused, not clipped: an out-of-scale score
    means the judge misread the rubric.
    """
    if score_type == "text":
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = str(value)
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"expected a non-empty string, got {value!r:.80}")
        return value.strip()
    if score_type == "choice":
        if not isinstance(value, str):
            raise ValueError(f"expected one of {list(choices or ())}, got {value!r:.80}")
        for c in choices or ():
            if value.strip().strip(".").lower() == c.lower():
                return c
        raise ValueError(f"expected one of {list(choices or ())}, got {value!r:.80}")
    if score_type is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, (int, float)) and value in (0, 1):
            return bool(value)
        if isinstance(value, str):
            word = value.strip().strip(".").lower()
            if word in _TRUE_WORDS:
                return True
            if word in _FALSE_WORDS:
                return False
        raise ValueError(f"expected true or false, got {value!r:.80}")
    # Numbers.
    if isinstance(value, bool):
        raise ValueError(f"expected a number, got the boolean {value!r}")
    if isinstance(value, str):
        m = re.fullmatch(r"\s*(" + _NUM + r")\s*", value)
        if m is None:
            raise ValueError(f"expected a number, got {value!r:.80}")
        value = float(m.group(1))
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"expected a finite number, got {value!r:.80}")
    if score_type is int:
        if float(value) != int(value):
            raise ValueError(f"expected an integer, got {value!r}")
        value = int(value)
    else:
        value = float(value)
    if score_range is not None and not score_range[0] <= value <= score_range[1]:
        raise ValueError(f"score {value} is outside the range {list(score_range)}")
    return value



def find_score_value(obj: Mapping[str, Any] | None, raw: str, key: str) -> Any:
    """The value of ``key``: from the parsed object, else from a ``key: value`` line."""
    if obj is not None and key.lower() in obj:
        return obj[key.lower()]
    # Fallback for replies like "Score: 0.8" or "score = true" with no JSON around them.
    # The value must end the field ("score": true or false" is the template, not a verdict).
    m = re.search(r"""["']?\b""" + re.escape(key) + r"""\b["']?\s*[:=]\s*["']?([^\s,"'}]+)["']?\s*(?:[,}\n]|$)""",
                  raw, re.IGNORECASE)
    if m is None:
        raise ValueError(f"the reply has no {key!r} field")
    return m.group(1)



def combine_components(score_keys: Sequence[str], components: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """``(score, components)`` from the value of each score key: with one key its value and no
    components; with several, their mean and the components."""
    if len(score_keys) == 1:
        return components[score_keys[0]], {}
    return sum(components.values()) / len(components), components


def spell_answer(value: Any) -> str:
    """An allowed answer as JSON writes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    return f"{value:g}"



@dataclass(frozen=True)
class JudgeResult:
    """One verdict.

    Args:
        score: The typed score (``float``/``int``/``bool``/choice string/text); with several
            ``score_keys`` the mean of the components.
        reason: The judge's stated reason (``""`` when it gave none).
        raw: The reply the score was read from.
        usage: Backend usage summed over every attempt, plus ``judge_calls`` and ``retries``.
        faults: Failed attempts (unreadable replies, backend errors) before the one that worked.
        components: Per score key, its value, when the rubric has several parts.
        meta: Extras (the extracted answer of
            :class:`~collab_env.agents.judges.ExtractThenScore`...).
    """

    score: Any
    reason: str
    raw: str
    usage: Mapping[str, float] = field(default_factory=dict)
    faults: int = 0
    components: Mapping[str, float] = field(default_factory=dict)
    meta: Mapping[str, Any] = field(default_factory=dict)

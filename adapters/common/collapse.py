"""Collapse monitor: flags a policy whose replies shrink to nothing or to one reply.

A policy-gradient learner can *reward-hack* its way into a degenerate policy: when a penalty
(tokens, turns) is the only signal that moves, the cheapest reply wins and the completions
collapse to the end-of-sequence token alone, or to one identical reply. The reward then
climbs while nothing is learned. This module measures that per training step and says so.

:func:`completion_stats` turns a step's completions into three numbers, logged with every
training step of the learners that share :func:`~collab_env.adapters.common.tree_learner.policy_update`
(MAGRPO, REINFORCE, MADPO... under the keys of :data:`STAT_KEYS`):

* ``collapse/completion_length``: mean visible tokens per completion (special tokens such as
  EOS and padding are not counted, so an "empty" reply is 0, not 1);
* ``collapse/empty_share``: share of completions with no visible token;
* ``collapse/duplicate_share``: share of completions equal to an earlier completion of the same
  prompt (a group of ``G`` identical samples gives ``(G - 1) / G``).

:func:`check_collapse` compares a logged line with :class:`CollapseThresholds` and warns with
:class:`CollapseWarning` (a ``UserWarning``: shown once per message by Python's default filter,
turned into an error by ``-W error::collab_env.adapters.common.collapse.CollapseWarning``).
:func:`~collab_env.adapters.common.loop.flush_log` calls it on every training log line, with
the learner's ``collapse_thresholds`` attribute when it has one (else
:data:`DEFAULT_THRESHOLDS`), and logs ``collapse/flagged`` (1.0 when a threshold is crossed).
When a learner only reports ``completion_length`` (the actor-critic learners count the EOS
token too), that is what the length threshold reads.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from collab_env.errors import ConfigError

__all__ = ["CollapseWarning", "CollapseThresholds", "DEFAULT_THRESHOLDS", "STAT_KEYS",
           "completion_stats", "check_collapse", "collapse_reasons"]

#: The keys :func:`completion_stats` returns (and the learners log).
STAT_KEYS = ("collapse/completion_length", "collapse/empty_share", "collapse/duplicate_share")


class CollapseWarning(UserWarning):
    """Training completions collapsed: too short, mostly empty, or mostly duplicates."""


@dataclass(frozen=True)
class CollapseThresholds:
    """When :func:`check_collapse` warns.

    Args:
        min_length: Warn when the mean completion length (visible tokens) falls below this.
            The default, 2, flags the one-token (EOS only) collapse without flagging short but
            real replies; raise it for a task whose replies must be longer (the hidden-facts
            example uses 8).
        max_empty_share: Warn when more than this share of the completions is empty.
        max_duplicate_share: Warn when more than this share of the completions repeats an
            earlier completion of the same prompt (sampling at temperature 1 almost never
            repeats a reply of any length; a collapsed policy does it all the time).
    """

    min_length: float = 2.0
    max_empty_share: float = 0.5
    max_duplicate_share: float = 0.75

    def __post_init__(self) -> None:
        if not (isinstance(self.min_length, (int, float)) and math.isfinite(self.min_length)
                and self.min_length >= 0):
            raise ConfigError(f"min_length must be a finite number >= 0, got {self.min_length!r}.")
        for name in ("max_empty_share", "max_duplicate_share"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and 0.0 <= v <= 1.0):
                raise ConfigError(f"{name} must be a share in [0, 1], got {v!r}.")


#: The thresholds of a learner without a ``collapse_thresholds`` attribute.
DEFAULT_THRESHOLDS = CollapseThresholds()


def completion_stats(completions: Sequence[Sequence[int]], groups: Sequence[Any] | None = None,
                     special_ids: Iterable[int] = ()) -> dict[str, float]:
    """The collapse statistics of one step's completions (module docstring).

    Args:
        completions: Token ids of each completion.
        groups: A hashable key per completion (the prompt ids, as a tuple): duplicates count
            within a group. ``None``: all completions are one group.
        special_ids: Token ids that are not visible text (EOS, padding): they are dropped
            before counting and comparing.

    Returns:
        ``{}`` for no completions, else the three :data:`STAT_KEYS`.
    """
    if groups is not None and len(groups) != len(completions):
        raise ConfigError(f"completion_stats: {len(groups)} group keys for {len(completions)} completions.")
    if not completions:
        return {}
    special = set(int(i) for i in special_ids)
    visible = [tuple(int(t) for t in c if int(t) not in special) for c in completions]
    keys = groups if groups is not None else [None] * len(visible)
    seen: set[tuple[Any, tuple[int, ...]]] = set()
    duplicates = 0
    for key, c in zip(keys, visible, strict=True):
        if (key, c) in seen:
            duplicates += 1
        seen.add((key, c))
    n = len(visible)
    return {
        "collapse/completion_length": sum(len(c) for c in visible) / n,
        "collapse/empty_share": sum(1 for c in visible if not c) / n,
        "collapse/duplicate_share": duplicates / n,
    }


def collapse_reasons(metrics: Mapping[str, Any],
                     thresholds: CollapseThresholds = DEFAULT_THRESHOLDS) -> list[str]:
    """What in a log line ``metrics`` crosses ``thresholds`` (one sentence each; ``[]``: none).
    Missing or NaN statistics are not judged."""

    def value(key: str) -> float | None:
        v = metrics.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            return None
        return float(v)

    reasons = []
    length = value("collapse/completion_length")
    if length is None:
        length = value("completion_length")
    if length is not None and length < thresholds.min_length:
        reasons.append(f"mean completion length {length:.2f} tokens < {thresholds.min_length:g}")
    empty = value("collapse/empty_share")
    if empty is not None and empty > thresholds.max_empty_share:
        reasons.append(f"empty replies {empty:.0%} > {thresholds.max_empty_share:.0%}")
    dup = value("collapse/duplicate_share")
    if dup is not None and dup > thresholds.max_duplicate_share:
        reasons.append(f"duplicate replies {dup:.0%} > {thresholds.max_duplicate_share:.0%}")
    return reasons


def check_collapse(metrics: Mapping[str, Any], thresholds: CollapseThresholds = DEFAULT_THRESHOLDS,
                   *, where: str = "") -> dict[str, float]:
    """Warn with :class:`CollapseWarning` when ``metrics`` (a training log line) crosses
    ``thresholds``; returns ``{"collapse/flagged": 0.0 or 1.0}`` to log with it, or ``{}``
    when the line has no completion statistics at all.

    Args:
        where: Position for the message (e.g. ``"env_step 120"``).
    """
    if not any(k in metrics for k in (*STAT_KEYS, "completion_length")):
        return {}
    reasons = collapse_reasons(metrics, thresholds)
    if reasons:
        at = f" at {where}" if where else ""
        warnings.warn(
            f"training completions are collapsing{at}: {'; '.join(reasons)}. The reward may be "
            "hacked by short or empty replies (e.g. a token penalty with no credit for useful "
            "replies): give informative replies credit or penalise empty ones.",
            CollapseWarning, stacklevel=2)
    return {"collapse/flagged": float(bool(reasons))}

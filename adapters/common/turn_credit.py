"""Turn-level credit for trainers that see whole episodes: per-turn group-relative advantages.

An episode of a multi-turn task is several moves of the trained player; the multiturn-aware
reward scores each move by its own futures, so each move has its own credit
(:func:`collab_env.rollout.turn_rewards`). A trainer that gives the whole episode one scalar (the
return) credits every move of a good episode alike. Here each move is compared with the moves
**at the same position** of the other episodes of its group (the episodes of one prompt, as a
GRPO group): turn ``k``'s advantage is its credit less the mean credit of the group's turn-``k``
moves (MT-GRPO's turn-level grouping), optionally divided by their std. The tokens of move ``k``
get turn ``k``'s advantage (:func:`token_advantages`); the tokens between moves (user and env
text, mask 0) get 0.

A move position reached by only one episode of the group has nothing to be compared with: its
advantage is 0 (no signal), as GRPO gives a group of one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

from collab_env.adapters.common.losses import group_advantages
from collab_env.errors import ConfigError

__all__ = ["turn_advantages", "token_advantages", "Scale"]

Scale = Literal["none", "population", "sample"]


def turn_advantages(turn_rewards: Sequence[Sequence[float]], *, scale: Scale = "none",
                    eps: float = 1e-4) -> list[list[float]]:
    """Per-turn group-relative advantages of one group of episodes.

    Args:
        turn_rewards: Per episode of the group, the credit of each of its moves in order
            (:func:`collab_env.rollout.turn_rewards`); episodes may have different numbers of moves.
        scale: ``"none"``: centred only (Dr. GRPO); ``"population"``: divided by the population
            std plus ``eps`` (GRPO's paper); ``"sample"``: divided by the Bessel-corrected std plus
            ``eps`` (TRL's ``scale_rewards="group"``). Each position's group goes through
            :func:`~collab_env.adapters.common.losses.group_advantages`.
        eps: Added to the std.

    Returns:
        Per episode, per move, its advantage: the move's credit less the mean credit of the
        group's moves at the same position, scaled; 0 for a position only one episode reached.

    Example: ``turn_advantages([[1, 0], [0, 1], [0]])`` is ``[[2/3, -0.5], [-1/3, 0.5], [-1/3]]``.
    """
    if scale not in ("none", "population", "sample"):
        raise ConfigError(f"scale must be 'none', 'population' or 'sample', got {scale!r}.")
    depth = max((len(r) for r in turn_rewards), default=0)
    out: list[list[float]] = [[0.0] * len(r) for r in turn_rewards]
    for k in range(depth):
        members = [i for i, r in enumerate(turn_rewards) if len(r) > k]
        if len(members) < 2:
            continue
        values = [float(turn_rewards[i][k]) for i in members]
        if not all(math.isfinite(v) for v in values):
            raise ConfigError(f"turn {k} has a non-finite credit in {values}; a reward must be a finite number.")
        adv = group_advantages(values, normalize_std=scale != "none", eps=eps, ddof=1 if scale == "sample" else 0)
        for i, a in zip(members, adv, strict=True):
            out[i][k] = a
    return out


def token_advantages(turn_ids: Sequence[int], advantages: Sequence[float]) -> list[float]:
    """Per response token, the advantage of the move that generated it (``turn_ids[t]``, from
    :class:`~collab_env.rollout.TokenTranscript`); 0 where ``turn_ids[t]`` is -1 (not generated).

    Raises:
        ConfigError: a token names a move the episode does not have.
    """
    out = []
    for t in turn_ids:
        if t < 0:
            out.append(0.0)
        elif t < len(advantages):
            out.append(float(advantages[t]))
        else:
            raise ConfigError(f"a token of move {t} but the episode has {len(advantages)} moves with credit.")
    return out

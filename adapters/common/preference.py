"""Preference learning math: the DPO loss and the choice of a preference pair by reward.

Plain functions of tensors and lists, so tests can check them against values computed by hand:

* :func:`dpo_loss`: ``-log sigmoid(beta * ((pi_c - ref_c) - (pi_r - ref_r)))`` per pair, with
  a frozen reference model, or reference-free (the ref terms dropped: ``ref_* = 0``).
* :func:`sequence_logprobs`: summed log-probs of each completion of a packed batch.
* :func:`select_pair`: best against worst of a group of scored candidates, kept when the
  score gap is at least ``min_gap`` (CollabLLM's online DPO ranks replies by their
  multiturn-aware reward this way).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from collab_env.errors import ConfigError

__all__ = ["dpo_loss", "sequence_logprobs", "select_pair", "GAP_TOLERANCE"]

#: Absolute tolerance of the ``min_gap`` comparison (so ``0.3 - 0.1 >= 0.2`` holds as written),
#: the same as :mod:`collab_env.tasks.collabllm_data` uses for recorded pairs.
GAP_TOLERANCE = 1e-9


def sequence_logprobs(per_token, mask):
    """``[B]`` sum of the per-token log-probs ``[B, C]`` over the loss positions ``mask``
    (masked positions contribute exactly 0, whatever they hold)."""
    import torch

    m = mask.bool()
    return torch.where(m, per_token, torch.zeros_like(per_token)).sum(-1)


def dpo_loss(policy_chosen, policy_rejected, ref_chosen=None, ref_rejected=None, *, beta: float):
    """The DPO loss of each pair and the implicit rewards.

    ``loss = -log sigmoid(beta * ((pi_c - ref_c) - (pi_r - ref_r)))`` where ``pi_*`` / ``ref_*``
    are the summed completion log-probs under the policy / the reference. Without reference
    log-probs (both ``None``) the loss is the reference-free variant
    ``-log sigmoid(beta * (pi_c - pi_r))``.

    Example (``beta = 0.1``): ``pi_c = -10, pi_r = -12, ref_c = -9, ref_r = -13`` gives
    ``0.1 * ((-10 + 9) - (-12 + 13)) = -0.2`` and a loss of ``log(1 + e^0.2) = 0.79814``;
    reference-free, ``0.1 * 2 = 0.2`` and ``log(1 + e^-0.2) = 0.59814``.

    Args:
        policy_chosen, policy_rejected: ``[B]`` log-probs under the policy (with gradient).
        ref_chosen, ref_rejected: ``[B]`` log-probs under the reference, or both ``None``.
        beta: Temperature of the implicit reward (``> 0``).

    Returns:
        ``(losses [B], chosen_rewards [B], rejected_rewards [B])``: the rewards are
        ``beta * (pi - ref)`` (``beta * pi`` reference-free), detached.
    """
    import torch.nn.functional as F

    if (ref_chosen is None) != (ref_rejected is None):
        raise ConfigError("dpo_loss needs both reference log-probs or neither (reference-free).")
    if not beta > 0:
        raise ConfigError(f"beta must be > 0, got {beta}.")
    chosen = policy_chosen if ref_chosen is None else policy_chosen - ref_chosen
    rejected = policy_rejected if ref_rejected is None else policy_rejected - ref_rejected
    logits = beta * (chosen - rejected)
    losses = -F.logsigmoid(logits)
    return losses, (beta * chosen).detach(), (beta * rejected).detach()


def select_pair(scores: Sequence[float], min_gap: float = 0.0,
                keys: Sequence[Any] | None = None) -> tuple[int, int] | None:
    """``(best, worst)`` indices of a group of scored candidates, or ``None`` when the group
    states no usable preference.

    The best is the first candidate with the highest score, the worst the first with the lowest
    (deterministic on ties). The pair is kept when ``best - worst >= min_gap`` (tolerance
    :data:`GAP_TOLERANCE`), the gap is positive (equal scores prefer nothing, even with
    ``min_gap = 0``) and, when ``keys`` are given (e.g. token ids), the two keys differ.
    """
    if len(scores) < 2:
        return None
    best = max(range(len(scores)), key=lambda i: scores[i])
    worst = min(range(len(scores)), key=lambda i: scores[i])
    gap = float(scores[best]) - float(scores[worst])
    if gap <= 0 or gap < min_gap - GAP_TOLERANCE:
        return None
    if keys is not None and keys[best] == keys[worst]:
        return None
    return best, worst

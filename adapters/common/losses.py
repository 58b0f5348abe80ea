"""The learning math: masked per-token log-probs, group-relative advantages, the clipped
surrogate and the k3 estimator of the KL to a reference model.

Every function is a plain function of tensors (or lists), so tests can check it against values
computed by hand. Masks are applied *before* any exponential: a padding position contributes
exactly zero to the loss and receives exactly zero gradient, whatever garbage its log-probs hold.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from collab_env.errors import ConfigError

__all__ = [
    "group_advantages",
    "TokenBatch",
    "pack_sequences",
    "token_logprobs",
    "clipped_surrogate",
    "kl_k3",
    "masked_aggregate",
    "policy_loss",
]


# ---------------------------------------------------------------------------------------------
# Advantages
# ---------------------------------------------------------------------------------------------
def group_advantages(values: Sequence[float], *, normalize_std: bool = False, eps: float = 1e-4) -> list[float]:
    """Group-relative advantages: ``v_i - mean(v)``, divided by ``std(v) + eps`` when
    ``normalize_std`` (population std, as in GRPO's paper). A group of one gets 0.

    Example: ``group_advantages([1, 0, 0, 1]) == [0.5, -0.5, -0.5, 0.5]``; with
    ``normalize_std=True`` each is ``±0.5 / (0.5 + eps)``.
    """
    n = len(values)
    if n == 0:
        return []
    mean = sum(values) / n
    centred = [float(v) - mean for v in values]
    if not normalize_std:
        return centred
    std = math.sqrt(sum(c * c for c in centred) / n)
    return [c / (std + eps) for c in centred]


# ---------------------------------------------------------------------------------------------
# Batches and log-probs
# ---------------------------------------------------------------------------------------------
@dataclass
class TokenBatch:
    """Prompts left-padded and completions right-padded into one rectangle, so every row's
    completion occupies the last ``completion_mask.shape[1]`` columns.

    Attributes:
        input_ids: ``[B, P + C]`` token ids (padding where the masks are 0).
        attention_mask: ``[B, P + C]``, 1 on real prompt and completion tokens.
        position_ids: ``[B, P + C]``, positions counted from each row's first real token (what
            generation used with left padding).
        completion_mask: ``[B, C]``, 1 on real completion tokens: the loss positions.
    """

    input_ids: Any
    attention_mask: Any
    position_ids: Any
    completion_mask: Any

    def to(self, device: Any) -> TokenBatch:
        """The same batch on ``device``."""
        return TokenBatch(*(t.to(device) for t in (self.input_ids, self.attention_mask,
                                                   self.position_ids, self.completion_mask)))


def pack_sequences(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]],
                   pad_id: int) -> TokenBatch:
    """Pack token-id prompts and completions into a :class:`TokenBatch` (CPU tensors)."""
    import torch

    if len(prompts) != len(completions) or not prompts:
        raise ConfigError(f"pack_sequences needs as many prompts as completions (>0), got {len(prompts)} and {len(completions)}.")
    p_width = max(len(p) for p in prompts)
    c_width = max(1, max(len(c) for c in completions))
    b = len(prompts)
    ids = torch.full((b, p_width + c_width), int(pad_id), dtype=torch.long)
    attn = torch.zeros((b, p_width + c_width), dtype=torch.long)
    comp = torch.zeros((b, c_width), dtype=torch.long)
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        if p:
            ids[i, p_width - len(p):p_width] = torch.tensor(list(p), dtype=torch.long)
            attn[i, p_width - len(p):p_width] = 1
        if c:
            ids[i, p_width:p_width + len(c)] = torch.tensor(list(c), dtype=torch.long)
            attn[i, p_width:p_width + len(c)] = 1
            comp[i, :len(c)] = 1
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    return TokenBatch(ids, attn, pos, comp)


def token_logprobs(model: Any, batch: TokenBatch, temperature: float = 1.0):
    """``[B, C]`` log-probability of each completion token under ``model`` (float32), with the
    logits divided by ``temperature`` (the distribution the tokens were sampled from). Values
    at masked positions are meaningless; use ``batch.completion_mask``."""
    import torch

    c_width = batch.completion_mask.shape[1]
    kwargs = dict(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                  position_ids=batch.position_ids, use_cache=False)
    try:
        logits = model(**kwargs, logits_to_keep=c_width + 1).logits
    except TypeError:  # models without logits_to_keep
        logits = model(**kwargs).logits
    logits = logits[:, -(c_width + 1):-1].float()
    if temperature != 1.0:
        logits = logits / temperature
    targets = batch.input_ids[:, -c_width:]
    # log_softmax(x)[t] = x[t] - logsumexp(x): avoids materialising a second [B, C, V] tensor.
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


# ---------------------------------------------------------------------------------------------
# Losses
# ---------------------------------------------------------------------------------------------
def clipped_surrogate(logp, old_logp, advantages, mask, clip_low: float = 0.2,
                      clip_high: float | None = None):
    """Per-token PPO clipped surrogate loss ``-min(r A, clip(r, 1 - clip_low, 1 + clip_high) A)``
    with ``r = exp(logp - old_logp)``; zero (and zero gradient) where ``mask`` is 0.

    Args:
        logp: ``[B, C]`` log-probs under the current policy (with gradient).
        old_logp: ``[B, C]`` log-probs under the policy that sampled the tokens (no gradient).
        advantages: ``[B]`` one advantage per sequence.
        mask: ``[B, C]`` loss positions.
        clip_low: Lower clip range ``epsilon``.
        clip_high: Upper clip range (default ``clip_low``).

    Returns:
        ``(loss [B, C], clipped [B, C] bool)``: the per-token loss and where the clip was active.
    """
    import torch

    clip_high = clip_low if clip_high is None else clip_high
    m = mask.bool()
    delta = torch.where(m, logp - old_logp, torch.zeros_like(logp))
    ratio = torch.exp(delta)
    adv = advantages.to(logp.dtype).unsqueeze(-1)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    loss = -torch.minimum(unclipped, clipped)
    loss = torch.where(m, loss, torch.zeros_like(loss))
    active = m & (clipped < unclipped)
    return loss, active


def kl_k3(logp, ref_logp, mask):
    """Per-token k3 estimator of ``KL(pi || pi_ref)``: ``exp(q - p) - (q - p) - 1`` with
    ``p = logp``, ``q = ref_logp`` (non-negative, unbiased for samples from ``pi``); zero where
    ``mask`` is 0."""
    import torch

    m = mask.bool()
    d = torch.where(m, ref_logp - logp, torch.zeros_like(logp))
    kl = torch.exp(d) - d - 1.0
    return torch.where(m, kl, torch.zeros_like(kl))


def masked_aggregate(per_token, mask, loss_type: Literal["sequence", "token"],
                     num_sequences: int, num_tokens: int):
    """Reduce a per-token loss to this micro-batch's share of the whole batch's loss.

    ``"sequence"``: the mean over tokens of each sequence, averaged over the ``num_sequences``
    sequences of the whole batch (GRPO's paper). ``"token"``: the sum over tokens divided by the
    ``num_tokens`` loss tokens of the whole batch (every token weighs the same). Summing the
    shares of all micro-batches gives the full-batch loss, so gradient accumulation is exact.
    """
    m = mask.to(per_token.dtype)
    if loss_type == "sequence":
        lengths = m.sum(-1).clamp(min=1.0)
        return ((per_token * m).sum(-1) / lengths).sum() / max(num_sequences, 1)
    if loss_type == "token":
        return (per_token * m).sum() / max(num_tokens, 1)
    raise ConfigError(f"loss_type must be 'sequence' or 'token', got {loss_type!r}.")


def policy_loss(logp, old_logp, advantages, mask, *, ref_logp=None, beta: float = 0.0,
                clip_low: float = 0.2, clip_high: float | None = None,
                loss_type: Literal["sequence", "token"] = "sequence",
                num_sequences: int | None = None, num_tokens: int | None = None):
    """The GRPO/MAGRPO loss of one micro-batch: clipped surrogate plus ``beta`` times the k3 KL
    to the reference, aggregated by :func:`masked_aggregate`.

    ``num_sequences`` / ``num_tokens`` are the whole batch's counts (default: this micro-batch's).

    Returns:
        ``(loss, stats)``: a scalar tensor with gradient and a dict of float tensors (detached
        shares, summable over micro-batches): ``policy_loss``, ``kl`` (mean KL, same
        aggregation), ``clip_fraction`` (share of loss tokens where the clip was active).
    """
    import torch

    num_sequences = int(mask.shape[0]) if num_sequences is None else num_sequences
    num_tokens = int(mask.sum().item()) if num_tokens is None else num_tokens
    surrogate, active = clipped_surrogate(logp, old_logp, advantages, mask, clip_low, clip_high)
    pg = masked_aggregate(surrogate, mask, loss_type, num_sequences, num_tokens)
    loss = pg
    stats = {"policy_loss": pg.detach()}
    if ref_logp is not None:
        kl = masked_aggregate(kl_k3(logp, ref_logp, mask), mask, loss_type, num_sequences, num_tokens)
        stats["kl"] = kl.detach()
        if beta:
            loss = loss + beta * kl
    stats["clip_fraction"] = active.float().sum().detach() / max(num_tokens, 1)
    stats["loss"] = loss.detach()
    return loss, {k: v.to(torch.float32) for k, v in stats.items()}

"""The learning math: masked per-token log-probs, group-relative advantages, the policy
objectives (PPO's clipped surrogate with DAPO's clip-higher and INTELLECT-2's two-sided clip,
CISPO, GSPO's sequence-level ratio), the aggregations of a per-token loss (GRPO, BNPO, Dr. GRPO,
DAPO, CoMLRL's sum), the truncated importance sampling against the sampler's log-probs and the
k3 estimator of the KL to a reference model.

Every function is a plain function of tensors (or lists), so tests can check it against values
computed by hand. Masks are applied *before* any exponential: a padding position contributes
exactly zero to the loss and receives exactly zero gradient, whatever garbage its log-probs hold.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from collab_env.agents.base import distinct_rows
from collab_env.agents.hf_loading import plain_layers
from collab_env.errors import ConfigError

__all__ = [
    "group_advantages",
    "TokenBatch",
    "pack_sequences",
    "token_logprobs",
    "shared_prompt_logits",
    "clipped_surrogate",
    "kl_k3",
    "reference_kl_sums",
    "LOSS_TYPES",
    "aggregation_plan",
    "masked_aggregate",
    "IS_MODES",
    "importance_weights",
    "policy_loss",
]


# ---------------------------------------------------------------------------------------------
# Advantages
# ---------------------------------------------------------------------------------------------
def group_advantages(values: Sequence[float], *, normalize_std: bool = False, eps: float = 1e-4,
                     ddof: int = 0) -> list[float]:
    """Group-relative advantages: ``v_i - mean(v)``, divided by ``std(v) + eps`` when
    ``normalize_std`` (the population std, as in GRPO's paper; ``ddof=1``: the Bessel-corrected
    one, TRL's ``scale_rewards="group"``). A group of one gets 0.

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
    if n <= ddof:  # no spread to estimate: every value is its own mean
        return [0.0] * n
    std = math.sqrt(sum(c * c for c in centred) / (n - ddof))
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
        prompt_rows: ``[U]`` the first row of each distinct prompt, when some prompt repeats (a
            group's samples, a tree node's forks, a preference pair); ``None`` when every row's
            prompt is its own. :func:`token_logprobs` reads each distinct prompt once.
        prompt_index: ``[B]`` which of ``prompt_rows`` holds each row's prompt (``None`` with it).
    """

    input_ids: Any
    attention_mask: Any
    position_ids: Any
    completion_mask: Any
    prompt_rows: Any = None
    prompt_index: Any = None

    def to(self, device: Any) -> TokenBatch:
        """The same batch on ``device``."""
        return TokenBatch(*(t.to(device) if t is not None else None
                            for t in (self.input_ids, self.attention_mask, self.position_ids,
                                      self.completion_mask, self.prompt_rows, self.prompt_index)))


def pack_sequences(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]],
                   pad_id: int) -> TokenBatch:
    """Pack token-id prompts and completions into a :class:`TokenBatch` (CPU tensors)."""
    import torch

    if len(prompts) != len(completions) or not prompts:
        raise ConfigError(f"pack_sequences needs as many prompts as completions (>0), got {len(prompts)} "
                          f"and {len(completions)}.")
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
    rows, index = distinct_rows(prompts)
    if len(rows) == b:  # no prompt repeats: nothing to share
        return TokenBatch(ids, attn, pos, comp)
    return TokenBatch(ids, attn, pos, comp, torch.tensor(rows, dtype=torch.long),
                      torch.tensor(index, dtype=torch.long))


def token_logprobs(model: Any, batch: TokenBatch, temperature: float = 1.0, *, share_prompts: bool = True):
    """``[B, C]`` log-probability of each completion token under ``model`` (float32), with the
    logits divided by ``temperature`` (the distribution the tokens were sampled from). Values
    at masked positions are meaningless; use ``batch.completion_mask``.

    With ``share_prompts`` (the default) and rows that repeat a prompt (``batch.prompt_rows``),
    each distinct prompt is read once and its KV cache, repeated per row, carries the gradient
    back to it (:func:`shared_prompt_logits`): the same values and gradients as reading every
    row whole (up to float rounding), for less compute. Models that cannot (no ``logits_to_keep``,
    gradient checkpointing while training, a cache that is not plain full attention) read every
    row whole."""
    import torch

    c_width = batch.completion_mask.shape[1]
    logits = shared_prompt_logits(model, batch) if share_prompts else None
    if logits is None:
        kwargs = dict(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                      position_ids=batch.position_ids, use_cache=False)
        try:
            logits = model(**kwargs, logits_to_keep=c_width + 1).logits
        except TypeError:  # models without logits_to_keep
            logits = model(**kwargs).logits
        logits = logits[:, -(c_width + 1):-1]
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    targets = batch.input_ids[:, -c_width:]
    # log_softmax(x)[t] = x[t] - logsumexp(x): avoids materialising a second [B, C, V] tensor.
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


#: Models whose forward turned out unable to share prompts (checked once per model object).
_NO_SHARING: weakref.WeakSet[Any] = weakref.WeakSet()


def shared_prompt_logits(model: Any, batch: TokenBatch):
    """``[B, C, V]`` logits predicting each completion token of ``batch`` (position ``j`` predicts
    completion token ``j``), reading each distinct prompt once; ``None`` when the batch repeats
    no prompt or ``model`` cannot share (then read every row whole).

    Two forward passes: the distinct prompts (``[U, P]``, left-padded as in the batch, so each
    keeps its row's positions), whose KV cache is then indexed per row (``[B, ...]``; indexing
    is differentiable, so the gradient of every row flows back to its prompt), and every row's
    completion but its last token on that cache, with the batch's own attention mask and
    position ids. A group of G samples of a P-token prompt costs ``P + G*C`` positions instead
    of ``G*(P + C)``.
    """
    import torch

    if batch.prompt_rows is None or model in _NO_SHARING:
        return None
    from collab_env.agents.hf_loading import cache_keyword, forward_accepts

    width = batch.input_ids.shape[1]
    c_width = batch.completion_mask.shape[1]
    p_width = width - c_width
    # HF turns the cache off in training under gradient checkpointing (set on its layers)
    checkpointing = model.training and any(getattr(m, "gradient_checkpointing", False) is True
                                           for m in model.modules())
    if p_width < 1 or checkpointing:
        return None
    if not forward_accepts(model, "logits_to_keep"):
        _NO_SHARING.add(model)
        return None
    rows, index = batch.prompt_rows, batch.prompt_index
    out = model(input_ids=batch.input_ids[rows, :p_width], attention_mask=batch.attention_mask[rows, :p_width],
                position_ids=batch.position_ids[rows, :p_width], use_cache=True, logits_to_keep=1)
    cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
    if cache is None:
        return None
    if not plain_layers(cache):  # sliding windows, linear attention
        _NO_SHARING.add(model)
        return None
    first = out.logits[:, -1:][index]  # [B, 1, V]: predicts each row's first completion token
    if c_width == 1:
        return first
    cache.batch_select_indices(index)
    rest = model(input_ids=batch.input_ids[:, p_width:width - 1], attention_mask=batch.attention_mask[:, :width - 1],
                 position_ids=batch.position_ids[:, p_width:width - 1], use_cache=True,
                 **{cache_keyword(model): cache}).logits
    return torch.cat([first, rest], dim=1)


# ---------------------------------------------------------------------------------------------
# Losses
# ---------------------------------------------------------------------------------------------
def clipped_surrogate(logp, old_logp, advantages, mask, clip_low: float = 0.2,
                      clip_high: float | None = None, delta: float | None = None):
    """Per-token PPO clipped surrogate loss ``-min(r A, clip(r, 1 - clip_low, 1 + clip_high) A)``
    with ``r = exp(logp - old_logp)``; zero (and zero gradient) where ``mask`` is 0.

    Args:
        logp: ``[B, C]`` log-probs under the current policy (with gradient).
        old_logp: ``[B, C]`` log-probs under the policy that sampled the tokens (no gradient).
        advantages: ``[B]`` one advantage per sequence.
        mask: ``[B, C]`` loss positions.
        clip_low: Lower clip range ``epsilon``.
        clip_high: Upper clip range (default ``clip_low``; DAPO's clip-higher is 0.28 with
            ``clip_low`` 0.2).
        delta: INTELLECT-2's two-sided clip (TRL's ``delta``): the unclipped term's ratio is
            capped at ``delta`` too, which bounds the loss of a negative advantage by
            ``delta * |A|`` (``None``: off).

    Returns:
        ``(loss [B, C], clipped [B, C] bool)``: the per-token loss and where a clip was active.
    """
    import torch

    m = mask.bool()
    ratio = torch.exp(torch.where(m, logp - old_logp, torch.zeros_like(logp)))
    return _clipped(ratio, advantages.to(logp.dtype).unsqueeze(-1), m, clip_low, clip_high, delta)


def _clipped(ratio, adv, m, clip_low: float, clip_high: float | None, delta: float | None):
    """The clipped surrogate of ``ratio`` (``[B, C]``, or one per sequence broadcast to it) and
    ``adv`` (``[B, 1]``) on the loss positions ``m``; a clip is active where the chosen term is
    not the plain ``r A`` (its gradient is cut)."""
    import torch

    clip_high = clip_low if clip_high is None else clip_high
    plain = ratio * adv
    unclipped = torch.clamp(ratio, max=delta) * adv if delta is not None else plain
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    chosen = torch.minimum(unclipped, clipped)
    loss = torch.where(m, -chosen, torch.zeros_like(chosen))
    return loss, m & (chosen != plain)


def kl_k3(logp, ref_logp, mask):
    """Per-token k3 estimator of ``KL(pi || pi_ref)``: ``exp(q - p) - (q - p) - 1`` with
    ``p = logp``, ``q = ref_logp`` (non-negative, unbiased for samples from ``pi``); zero where
    ``mask`` is 0."""
    import torch

    m = mask.bool()
    d = torch.where(m, ref_logp - logp, torch.zeros_like(logp))
    kl = torch.exp(d) - d - 1.0
    return torch.where(m, kl, torch.zeros_like(kl))


def reference_kl_sums(pm: Any, batch: TokenBatch):
    """CoMLRL's reference KL of each row of ``batch``: the :func:`kl_k3` estimate of
    KL(policy || initial policy) summed over the completion's tokens, from the raw logits
    (temperature 1), without gradient. ``pm``: a
    :class:`~collab_env.adapters.common.models.PolicyModel` (its model, and its reference through
    ``as_reference()``); its model is left in eval mode. Returns a 1-D tensor, one sum per row."""
    import torch

    pm.model.eval()
    with torch.no_grad():
        logp = token_logprobs(pm.model, batch, 1.0)
        with pm.as_reference() as reference:
            reference.eval()
            ref = token_logprobs(reference, batch, 1.0)
    return kl_k3(logp, ref, batch.completion_mask).sum(-1)


# ---------------------------------------------------------------------------------------------
# Aggregations
# ---------------------------------------------------------------------------------------------
#: The ``loss_type`` names :func:`aggregation_plan` accepts, one per aggregation: TRL's
#: (``GRPOConfig.loss_type``) and CoMLRL's ``"sum"``.
LOSS_TYPES: tuple[str, ...] = ("grpo", "dapo", "bnpo", "dr_grpo", "sum")


def aggregation_plan(loss_type: str, tokens: Sequence[int], sequences: Sequence[int],
                     max_new_tokens: int | None = None, totals: tuple[int, int, int] | None = None,
                     ) -> list[tuple[Literal["sequence", "token"], int, int]]:
    """How each micro-batch reduces its per-token loss so that the micro-batches' shares sum to
    the whole batch's loss: per micro-batch, ``(mode, num_sequences, num_tokens)`` for
    :func:`masked_aggregate` (the keywords a learner's ``loss`` hook receives).

    ``tokens[k]`` / ``sequences[k]`` are the loss tokens / sequences of micro-batch ``k``; with
    ``L_i`` the summed per-token loss of sequence ``i``, ``n_i`` its loss tokens, ``N`` the
    sequences and ``T`` the loss tokens of the whole batch, the batch's loss is:

    * ``"grpo"`` (GRPO's paper): ``sum_i (L_i / n_i) / N``, each sequence's
      token mean, averaged over sequences. TRL's ``"grpo"`` averages per micro-batch and
      divides by the number of micro-batches: the same when they are equally large.
    * ``"dapo"`` (DAPO): ``sum_i L_i / T``, every token of the batch weighs the
      same whatever its micro-batch (TRL's ``"dapo"``, normalised by the tokens of the whole
      accumulated batch).
    * ``"bnpo"`` (TRL's): each micro-batch's token mean ``sum_{i in k} L_i / T_k``, averaged
      over the ``K`` micro-batches. It differs from ``"dapo"`` when micro-batches hold different
      numbers of tokens (a token of a short micro-batch weighs more) and so depends on
      ``train_micro_batch_size``; with one sequence per micro-batch it is ``"grpo"``, with one
      micro-batch it is ``"dapo"``.
    * ``"dr_grpo"`` (Dr. GRPO): ``sum_i L_i / (N * max_new_tokens)``: a constant normaliser, so no
      length bias (TRL's normaliser is its ``max_completion_length``, our ``max_new_tokens``).
    * ``"sum"`` (CoMLRL's ``-A * sum(log p)``): ``sum_i L_i / N``, each sequence's token sum
      averaged over sequences; with GSPO's sequence-level ratio it is TRL's ``"luspo"``.

    Every share is exact: summing the micro-batches' shares gives the batch's loss above.
    ``totals`` (data parallelism): the whole batch's ``(N, T, K)`` over every rank, when
    ``tokens`` / ``sequences`` are this rank's micro-batches only.

    Raises:
        ConfigError: an unknown ``loss_type``, ``"dr_grpo"`` without ``max_new_tokens``, or
            ``tokens`` and ``sequences`` of different lengths.
    """
    if len(tokens) != len(sequences):
        raise ConfigError(f"aggregation_plan needs one token and one sequence count per micro-batch, got "
                          f"{len(tokens)} and {len(sequences)}.")
    n_seq, n_tok, k = totals if totals is not None else (sum(sequences), sum(tokens), len(tokens))
    here = len(tokens)  # this rank's micro-batches (all of them without data parallelism)
    if loss_type == "grpo":
        return [("sequence", n_seq, n_tok)] * here
    if loss_type == "dapo":
        return [("token", n_seq, n_tok)] * here
    if loss_type == "sum":
        return [("token", n_seq, n_seq)] * here
    if loss_type == "dr_grpo":
        if not max_new_tokens or max_new_tokens < 1:
            raise ConfigError("loss_type='dr_grpo' divides by num_sequences * max_new_tokens: pass max_new_tokens "
                              f"(the config's), got {max_new_tokens!r}.")
        return [("token", n_seq, n_seq * int(max_new_tokens))] * here
    if loss_type == "bnpo":
        return [("token", n_seq, max(t, 1) * k) for t in tokens]
    raise ConfigError(f"loss_type must be one of {list(LOSS_TYPES)}, got {loss_type!r}.")


def masked_aggregate(per_token, mask, loss_type: Literal["sequence", "token"],
                     num_sequences: int, num_tokens: int):
    """Reduce a per-token loss to this micro-batch's share of the whole batch's loss. The two
    reductions (``loss_type`` here, and in a learner's loss) are not the config's names:
    :func:`aggregation_plan` turns each of :data:`LOSS_TYPES` into one of them with its divisors.

    ``"sequence"``: the mean over tokens of each sequence, averaged over the ``num_sequences``
    sequences of the whole batch (GRPO's paper). ``"token"``: the sum over tokens divided by
    ``num_tokens`` (the loss tokens of the whole batch: every token weighs the same; the other
    aggregations are ``"token"`` with another divisor, :func:`aggregation_plan`). Summing the
    shares of all micro-batches gives the full-batch loss, so gradient accumulation is exact.
    """
    m = mask.to(per_token.dtype)
    if loss_type == "sequence":
        lengths = m.sum(-1).clamp(min=1.0)
        return ((per_token * m).sum(-1) / lengths).sum() / max(num_sequences, 1)
    if loss_type == "token":
        return (per_token * m).sum() / max(num_tokens, 1)
    raise ConfigError(f"masked_aggregate takes 'sequence' or 'token' (aggregation_plan turns {list(LOSS_TYPES)} "
                      f"into them), got {loss_type!r}.")


# ---------------------------------------------------------------------------------------------
# Importance sampling against the sampler
# ---------------------------------------------------------------------------------------------
#: The modes of :func:`importance_weights` (TRL's ``vllm_importance_sampling_mode`` values).
IS_MODES: tuple[str, ...] = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


def importance_weights(old_logp, sampler_logp, mask, mode: str, cap: float | None = 3.0,
                       floor: float | None = None):
    """Truncated / masked importance weights of the tokens against the policy that sampled them.

    The ratio is ``exp(old_logp - sampler_logp)``: the proximal policy (the trained model before
    the update) over the sampler (a vLLM engine, or an older policy in an off-policy rollout).
    ``token_*`` modes: one ratio per token; ``sequence_*`` modes: one per sequence,
    ``exp(sum over its loss tokens of (old_logp - sampler_logp))``, applied to all its tokens
    (TRL's). ``*_truncate``: the ratio clamped to ``[floor, cap]`` (truncated IS, TIS);
    ``*_mask``: 0 where it falls outside ``[floor, cap]``, else the ratio (masked IS). A bound
    of ``None`` is no bound. Log-ratios are capped at 20 before the exponential (``e**20`` is
    far above any useful cap), so an extreme mismatch stays finite.

    Args:
        old_logp: ``[B, C]`` proximal log-probs (no gradient).
        sampler_logp: ``[B, C]`` the sampler's log-probs of the same tokens.
        mask: ``[B, C]`` loss positions.
        mode: One of :data:`IS_MODES`.
        cap: Upper bound ``C_max`` (TRL's ``vllm_importance_sampling_clip_max``, default 3).
        floor: Lower bound ``C_min`` (TRL's ``vllm_importance_sampling_clip_min``).

    Returns:
        ``(weights [B, C], stats)``: detached weights (0 on padding) and float sums over the
        ratios' units (loss tokens, or sequences in ``sequence_*`` modes): ``is_ratio_sum`` (raw
        ratios), ``is_ratio_max``, ``is_clipped`` (units truncated or masked) and ``is_units``.
    """
    import torch

    if mode not in IS_MODES:
        raise ConfigError(f"importance sampling mode must be one of {list(IS_MODES)}, got {mode!r}.")
    if cap is None and floor is None:
        raise ConfigError(f"importance sampling mode {mode!r} needs a bound: set the cap (C_max) or the floor (C_min).")
    m = mask.bool()
    diff = torch.where(m, old_logp.detach().float() - sampler_logp.float(), torch.zeros_like(old_logp.float()))
    if mode.startswith("sequence"):
        ratio = torch.exp(diff.sum(-1, keepdim=True).clamp(max=20.0))  # [B, 1]
        units = m.any(-1, keepdim=True)
    else:
        ratio = torch.exp(diff.clamp(max=20.0))
        units = m
    lo = -math.inf if floor is None else floor
    hi = math.inf if cap is None else cap
    outside = (ratio < lo) | (ratio > hi)
    weight = ratio.clamp(min=floor, max=cap) if mode.endswith("truncate") else torch.where(outside, 0.0, ratio)
    weight = torch.where(m, weight.expand_as(diff), torch.zeros_like(diff))
    stats = {"is_ratio_sum": float(ratio[units].sum()),
             "is_ratio_max": float(ratio[units].max()) if units.any() else 0.0,
             "is_clipped": float((outside & units).sum()), "is_units": float(units.sum())}
    return weight, stats


# ---------------------------------------------------------------------------------------------
# The policy loss
# ---------------------------------------------------------------------------------------------
def policy_loss(logp, old_logp, advantages, mask, *, ref_logp=None, beta: float = 0.0,
                clip_low: float = 0.2, clip_high: float | None = None, delta: float | None = None,
                objective: Literal["clip", "cispo"] = "clip", level: Literal["token", "sequence"] = "token",
                is_weight=None, loss_type: Literal["sequence", "token"] = "sequence",
                num_sequences: int | None = None, num_tokens: int | None = None, loss_tokens: int | None = None):
    """The GRPO/MAGRPO loss of one micro-batch: the policy objective, weighted by ``is_weight``,
    plus ``beta`` times the k3 KL to the reference, aggregated by :func:`masked_aggregate`.

    The ratio is ``r = exp(logp - old_logp)`` per token (``level="token"``), or GSPO's
    sequence-level ``s = exp(mean over the sequence's loss tokens of (logp - old_logp))``
    (``level="sequence"``; the gradient flows through the mean), one per sequence for all its
    tokens. The objective, with advantage ``A``:

    * ``"clip"``: PPO's ``-min(r A, clip(r, 1 - clip_low, 1 + clip_high) A)``
      (:func:`clipped_surrogate`; ``clip_high`` above ``clip_low`` is DAPO's clip-higher,
      ``delta`` INTELLECT-2's two-sided clip). With ``level="sequence"`` it is GSPO's loss.
    * ``"cispo"`` (MiniMax-M1): ``-sg(min(r, 1 + clip_high)) A log p``: the ratio is clipped
      and its gradient stopped (``sg``), so every token keeps a gradient ``A * w * grad log p``
      however far its ratio moved (the paper's lower bound is left open, as there).
      TRL's ``epsilon_high`` for CISPO is the cap itself (ScaleRL's ``epsilon_max``): its
      ``epsilon_high=e`` is our ``clip_high=e - 1``.

    ``is_weight`` (``[B, C]``, no gradient: :func:`importance_weights`) multiplies the policy
    term per token, not the KL. ``num_sequences`` / ``num_tokens`` are the aggregation's
    whole-batch divisors (:func:`aggregation_plan`; default: this micro-batch's counts);
    ``loss_tokens`` the whole batch's loss tokens, the denominator of ``clip_fraction``
    (default ``num_tokens``).

    Returns:
        ``(loss, stats)``: a scalar tensor with gradient and a dict of float tensors (detached
        shares, summable over micro-batches): ``policy_loss``, ``kl`` (mean KL, same
        aggregation), ``clip_fraction`` (share of loss tokens where a clip was active: the
        surrogate's clip, or CISPO's cap), ``loss``.
    """
    import torch

    num_sequences = int(mask.shape[0]) if num_sequences is None else num_sequences
    num_tokens = int(mask.sum().item()) if num_tokens is None else num_tokens
    loss_tokens = num_tokens if loss_tokens is None else loss_tokens
    clip_high = clip_low if clip_high is None else clip_high
    m = mask.bool()
    log_ratio = torch.where(m, logp - old_logp, torch.zeros_like(logp))
    if level == "sequence":
        seq = log_ratio.sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1)
        log_ratio = seq.expand_as(logp)
    elif level != "token":
        raise ConfigError(f"importance_sampling_level must be 'token' or 'sequence', got {level!r}.")
    ratio = torch.exp(log_ratio)
    adv = advantages.to(logp.dtype).unsqueeze(-1)
    if objective == "clip":
        surrogate, active = _clipped(ratio, adv, m, clip_low, clip_high, delta)
    elif objective == "cispo":
        weight = torch.clamp(ratio, max=1.0 + clip_high).detach()
        surrogate = torch.where(m, -weight * adv * logp, torch.zeros_like(logp))
        active = m & (ratio > 1.0 + clip_high)
    else:
        raise ConfigError(f"policy_objective must be 'clip' or 'cispo', got {objective!r}.")
    if is_weight is not None:
        surrogate = surrogate * is_weight.detach().to(surrogate.dtype)
    pg = masked_aggregate(surrogate, mask, loss_type, num_sequences, num_tokens)
    loss = pg
    stats = {"policy_loss": pg.detach()}
    if ref_logp is not None:
        kl = masked_aggregate(kl_k3(logp, ref_logp, mask), mask, loss_type, num_sequences, num_tokens)
        stats["kl"] = kl.detach()
        if beta:
            loss = loss + beta * kl
    stats["clip_fraction"] = active.float().sum().detach() / max(loss_tokens, 1)
    stats["loss"] = loss.detach()
    return loss, {k: v.to(torch.float32) for k, v in stats.items()}

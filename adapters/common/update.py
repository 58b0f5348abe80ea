"""The policy-gradient update shared by MAGRPO and REINFORCE: one engine, the loss as a hook.

:func:`policy_update` takes one model's samples ``(prompt_ids, completion_ids, advantage,
turn)`` and runs ``iterations`` optimiser steps on them: per step, the loss of every
micro-batch (the learner's ``loss`` hook, given the whole batch's sequence and token counts so
that accumulation is exact) is back-propagated, then the gradient is clipped
(``max_grad_norm``), AdamW steps and the learning-rate schedule advances. Log-probs of the
sampling policy (for a ratio, from the second iteration) and of the reference (``beta > 0``)
are computed once, before the first step.

The hook::

    loss(logp, old_logp, advantages, mask, *, ref_logp, loss_type, num_sequences, num_tokens)
        -> (scalar loss with gradient, {name: detached share})

``old_logp`` is the sampling policy's log-probs (``logp.detach()`` in the first iteration);
``stats`` shares are summed over micro-batches (``loss``, ``policy_loss``, ``kl`` when
``ref_logp`` is given, ``clip_fraction``...).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from collab_env.adapters.common.loop import mean

__all__ = ["Sample", "policy_update", "kl_per_turn", "sample_collapse_stats"]

#: One training sample: (prompt ids, completion ids, advantage, 0-based turn).
Sample = tuple[list[int], tuple[int, ...], float, int]


def kl_per_turn(logp, ref_logp, mask, samples, into: dict[int, list[float]]) -> None:
    """Append each sample's token-mean k3 KL to the reference to ``into[turn]`` (``samples[i][3]``
    is the turn of row ``i``), for the per-turn KL metrics."""
    from collab_env.adapters.common.losses import kl_k3

    kl = kl_k3(logp, ref_logp, mask)
    per_seq = (kl.sum(-1) / mask.sum(-1).clamp(min=1)).tolist()
    for value, s in zip(per_seq, samples, strict=True):
        into.setdefault(s[3], []).append(float(value))


def sample_collapse_stats(pm: Any, samples: Sequence[Sample]) -> dict[str, float]:
    """The collapse statistics (:func:`~collab_env.adapters.common.collapse.completion_stats`) of
    ``samples``: visible tokens (``pm``'s tokenizer's special ids and padding dropped), duplicates
    counted among the samples of the same prompt."""
    from collab_env.adapters.common.collapse import completion_stats

    special = set(getattr(pm.tokenizer, "all_special_ids", None) or ())
    special.add(pm.pad_id)
    return completion_stats([s[1] for s in samples], [tuple(s[0]) for s in samples], special)


def policy_update(pm: Any, samples: Sequence[Sample], loss: Callable[..., Any], *, iterations: int = 1,
                  temperature: float = 1.0, micro_batch: int = 8, loss_type: str = "sequence",
                  beta: float = 0.0, max_grad_norm: float | None = None) -> dict[str, float]:
    """``iterations`` optimiser steps of ``pm`` (a :class:`~collab_env.adapters.common.models.PolicyModel`
    with its optimiser and scheduler) on ``samples`` with the ``loss`` hook (module docstring).

    ``loss_type`` ``"sequence"`` or ``"token"`` is passed through; ``"sum"`` (per-sequence sums
    averaged over sequences, CoMLRL's) is ``"token"`` with the sequence count as token count.
    ``beta > 0`` computes reference log-probs (the hook adds ``beta`` times the KL).

    Returns:
        The first step's summed stats, ``grad_norm``, per-turn and overall reference-KL metrics
        (with a reference), ``loss_last_iteration`` / ``clip_fraction_last_iteration`` (more
        than one iteration), ``learning_rate`` and the collapse statistics of the samples
        (:func:`sample_collapse_stats`).
    """
    import torch

    from collab_env.adapters.common.losses import pack_sequences, token_logprobs

    device = pm.device
    micro = [samples[i:i + micro_batch] for i in range(0, len(samples), micro_batch)]
    batches = [pack_sequences([s[0] for s in mb], [s[1] for s in mb], pm.pad_id).to(device) for mb in micro]
    advantages = [torch.tensor([s[2] for s in mb], dtype=torch.float32, device=device) for mb in micro]
    num_seq = len(samples)
    num_tok = int(sum(int(b.completion_mask.sum()) for b in batches))
    if loss_type == "sum":  # per-sequence sums averaged over sequences: "token" over num_seq
        loss_type, num_tok = "token", num_seq
    params = [p for _, p in pm.trainable_parameters()]

    old: list[Any] | None = None
    ref: list[Any] | None = None
    pm.model.eval()
    with torch.no_grad():
        if iterations > 1:
            old = [token_logprobs(pm.model, b, temperature) for b in batches]
        if beta > 0:
            with pm.as_reference() as reference:
                reference.eval()
                ref = [token_logprobs(reference, b, temperature) for b in batches]

    out: dict[str, float] = {}
    for it in range(iterations):
        pm.model.train()
        pm.optimizer.zero_grad(set_to_none=True)
        totals: dict[str, float] = {}
        kl_by_turn: dict[int, list[float]] = {}
        for k, (b, adv) in enumerate(zip(batches, advantages, strict=True)):
            logp = token_logprobs(pm.model, b, temperature)
            old_k = old[k] if old is not None else logp.detach()
            value, stats = loss(logp, old_k, adv, b.completion_mask, ref_logp=ref[k] if ref is not None else None,
                                loss_type=loss_type, num_sequences=num_seq, num_tokens=num_tok)
            value.backward()
            for name, v in stats.items():
                totals[name] = totals.get(name, 0.0) + float(v)
            if it == 0 and ref is not None:
                kl_per_turn(logp.detach(), ref[k], b.completion_mask, micro[k], kl_by_turn)
        grad_norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm if max_grad_norm is not None else float("inf"))
        pm.optimizer.step()
        pm.scheduler.step()
        if it == 0:
            out = dict(totals)
            out["grad_norm"] = float(grad_norm)
            for turn, kls in kl_by_turn.items():
                out[f"turn_{turn + 1}/reference_kl_mean"] = mean(kls)
                out[f"turn_{turn + 1}/reference_kl_penalty_mean"] = beta * mean(kls)
            if ref is not None:
                out["reference_kl_mean"] = totals.get("kl", 0.0)
                out["reference_kl_penalty_mean"] = beta * totals.get("kl", 0.0)
        else:
            out["loss_last_iteration"] = totals.get("loss", 0.0)
            out["clip_fraction_last_iteration"] = totals.get("clip_fraction", 0.0)
    out.pop("kl", None)
    out["learning_rate"] = float(pm.scheduler.get_last_lr()[0])
    out.update(sample_collapse_stats(pm, samples))
    pm.model.eval()
    return out

"""Scoring given continuations on a transformers model (the transformers backend's
:class:`~collab_env.agents.base.ContinuationScorer` capability, used by log-prob judges).

:func:`score_rows` takes token id lists that share a prompt and sums the model's raw log-probs
(no temperature, no filtering) of each list's tokens after it: one forward pass reads the shared
prompt, whose KV cache is then repeated once per row for one batched pass over the rows' tails.
:meth:`~collab_env.agents.hf_generator.HFGenerator.score_token_continuations` runs it per job
under the model's lock; :meth:`~collab_env.agents.hf.HFPolicy.score_continuations` builds the jobs
from conversations.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from collab_env.errors import ConfigError

__all__ = ["score_rows"]


def score_rows(model: Any, rows: Sequence[Sequence[int]], start: int, *, pad_id: int,
               cache_keyword: str, read_prefix: Callable[[list[int]], Any] | None = None) -> tuple[float, ...]:
    """``sum(log p(rows[j][k] | rows[j][:k]) for k >= start)`` for each row ``j`` (blocking;
    call it under ``torch.inference_mode()``).

    Args:
        model: The causal LM (on its device).
        rows: Token id lists that share their first ``start`` ids (the prompt).
        start: Index of the first id to score (at least 1).
        pad_id: Id that fills the rows' tails to one width (masked out).
        cache_keyword: The forward keyword of a KV cache
            (:func:`~collab_env.agents.hf_loading.cache_keyword`).
        read_prefix: Reads the prompt instead of one plain forward pass: takes its ids and returns
            ``(logits, cache)``, the logits at its last position (over the vocabulary) and its KV
            cache (batch one; this function may grow it); the backend's reads reuse a cached prefix
            (:meth:`~collab_env.agents.hf_generator.HFGenerator.score_token_continuations`).

    Raises:
        ConfigError: The rows do not extend one non-empty prefix by at least one token each.
    """
    import torch

    device = model.device
    prefix = list(rows[0][:start])
    tails = [list(r[start:]) for r in rows]
    if start < 1 or any(list(r[:start]) != prefix for r in rows) or not all(tails):
        raise ConfigError("every row must extend the same non-empty prefix by at least one token.")
    if read_prefix is not None:
        last, cache = read_prefix(prefix)
    else:
        first = model(input_ids=torch.tensor([prefix], device=device), use_cache=True, logits_to_keep=1)
        last, cache = first.logits[0, -1], getattr(first, "cache", None) or first.past_key_values
    logp0 = torch.log_softmax(last.float(), dim=-1)
    scores = [float(logp0[t[0]]) for t in tails]
    width = max(len(t) for t in tails) - 1
    if width > 0:
        # Row j feeds its tokens but the last; the logits at position k predict token k + 1.
        # Padding sits at the end of a row, where causal attention keeps it out of the
        # positions that are read.
        n = len(tails)
        ids = torch.full((n, width), pad_id, dtype=torch.long)
        mask = torch.zeros((n, start + width), dtype=torch.long)
        mask[:, :start] = 1
        for j, t in enumerate(tails):
            if len(t) > 1:
                ids[j, : len(t) - 1] = torch.tensor(t[:-1], dtype=torch.long)
                mask[j, start : start + len(t) - 1] = 1
        cache.batch_repeat_interleave(n)
        out = model(input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=True,
                    **{cache_keyword: cache})
        logp = torch.log_softmax(out.logits.float(), dim=-1)
        for j, t in enumerate(tails):
            if len(t) > 1:
                nxt = torch.tensor(t[1:], dtype=torch.long, device=logp.device)
                scores[j] += float(logp[j, : len(t) - 1].gather(-1, nxt[:, None]).sum())
    return tuple(scores)

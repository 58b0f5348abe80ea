"""Reusing the KV cache of prompt prefixes the transformers backend has already read: :class:`PrefixCache`.

A prompt the model has read leaves a KV cache. A later call whose prompt starts with the same
tokens (the next turn of a conversation, a judge prompt of the same transcript, the futures of a
multiturn-aware reward, which share everything up to their first sampled turn) need not read that
part again: :class:`PrefixCache` keeps the caches of the last prefixes read (one row each, bounded
by a token budget), finds the longest stored prefix of a new prompt and hands out a cache cropped to
it; only the rest is read. This is what vLLM's prefix caching does, at the granularity of tokens.

The reused part was computed by an earlier forward pass, in other chunks than a single pass over
the whole prompt would use, so the log-probs of what follows can differ from a cold read by
floating-point rounding (around 1e-6 in float32), as they already do between batches of different
composition or padding.

Only plain full-attention caches (every layer a transformers ``DynamicLayer``) are stored; the
backend turns the reuse off for other models. Stored tensors are never written to:
``DynamicLayer.update`` concatenates into new tensors, so a handed-out cache that grows leaves the
stored one as it was.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from collab_env.agents.base import common_prefix_length
from collab_env.agents.hf_loading import plain_layers

__all__ = ["PrefixCache", "cropped"]


def cropped(cache: Any, length: int) -> Any:
    """A new cache object holding the first ``length`` positions of ``cache`` (views of its
    tensors: nothing is copied, and growing the new one leaves ``cache`` as it was)."""
    out = copy.copy(cache)
    layers = []
    for layer in cache.layers:
        new = copy.copy(layer)
        new.keys = layer.keys[..., :length, :]
        new.values = layer.values[..., :length, :]
        layers.append(new)
    out.layers = layers
    return out


class PrefixCache:
    """The KV caches (batch of one row) of the last prompt prefixes read, least recently used
    dropped first.

    Args:
        max_tokens: Most positions kept over all entries (0 turns the cache off). Each position
            costs ``2 * layers * kv_heads * head_dim`` numbers (about 46 KB for SmolLM2-135M in
            float32).

    Counters: :attr:`lookups` (prefixes looked up), :attr:`reused_tokens` (positions handed out
    instead of being read again).
    """

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = int(max_tokens)
        self._entries: OrderedDict[tuple[int, ...], Any] = OrderedDict()
        self.lookups = 0
        self.reused_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def tokens(self) -> int:
        """Positions held over all entries."""
        return sum(len(k) for k in self._entries)

    def clear(self) -> None:
        """Forget every entry (the next prompts are read in full)."""
        self._entries.clear()

    def longest(self, ids: Sequence[int]) -> tuple[int, Any, Any]:
        """``(n, cache, logits)``: the longest stored prefix of ``ids``, a new cache object holding
        its first ``n`` positions, and when it is the whole of ``ids``, the logits stored at its last
        position (else ``None``); ``(0, None, None)`` when none is stored. A whole stored prompt is
        handed out as it was computed, so a prompt read again gives the same numbers, bit for bit."""
        self.lookups += 1
        best, key = 0, None
        for stored in self._entries:
            n = common_prefix_length(stored, ids)
            if n > best:
                best, key = n, stored
        if key is None:
            return 0, None, None
        self._entries.move_to_end(key)
        self.reused_tokens += best
        cache, logits = self._entries[key]
        return best, cropped(cache, best), logits if best == len(ids) == len(key) else None

    def add(self, ids: Sequence[int], cache: Any, logits: Any = None) -> None:
        """Keep the cache of ``ids`` (one row, exactly ``len(ids)`` positions) and the logits at
        its last position, dropping the least recently used entries beyond :attr:`max_tokens` and
        any stored prefix of ``ids`` (the new entry covers it)."""
        key = tuple(int(t) for t in ids)
        if not key or len(key) > self.max_tokens or not plain_layers(cache):
            return
        for stored in [s for s in self._entries if len(s) <= len(key) and key[: len(s)] == s]:
            del self._entries[stored]
        self._entries[key] = (cropped(cache, len(key)), logits)
        while self.tokens > self.max_tokens:
            self._entries.popitem(last=False)

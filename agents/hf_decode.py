"""A lean decode loop for Llama-family transformers models: :func:`lean_decoder`, :class:`LeanDecoder`.

``model.generate`` runs the model's whole forward for every new token: at 8 rows of the embedded
SmolLM2-135M on 2 CPU cores, about 70 ms a step, of which the weight products are 45 ms. The rest
is per-layer bookkeeping that one new token does not need: the attention mask rebuilt every step,
the KV cache grown by concatenation, the attention kernel's dispatch for a single query. A
:class:`LeanDecoder` reads the prompts with the model's own forward (the prefill, or the rest of a
shared prefill's cache), then decodes with

* the model's own modules for everything that holds weights or model-specific maths: the
  embedding, the projections, the norms, the MLP, the rotary embedding and its
  ``apply_rotary_pos_emb``, the output layer (so adapters, patched layers and
  :func:`~collab_env.agents.hf_rows_first.rows_first_linears` apply as in the model);
* a KV cache allocated once for the prompt and every new token (no concatenation);
* attention of the one new query as two matrix products against the cache (the eager attention
  of transformers: ``softmax(q k^T * scaling + mask) v``, softmax in float32).

It replaces ``generate`` only where its maths is the model's: :func:`lean_decoder` accepts the
architectures in :data:`ARCHITECTURES` (checked by ``config.model_type`` and by the modules
present) with full attention in every layer and SiLU MLPs, and returns ``None`` for anything
else, which ``generate`` then serves; :meth:`LeanDecoder.fits` says whether a call can be decoded
exactly (a Mistral sliding window longer than the sequence, no attention dropout in training
mode, nothing attached to a forward the steps skip: accelerate's mixed-precision wrapper of
``model.forward``, a hook on a decoder layer; :meth:`LeanDecoder.bypassed`), else ``generate``
serves that call. The loop keeps
``generate``'s rules: the logits processor sees the float32 logits of the last position and the
greedy choice is its argmax, finished rows get the pad token, a row is finished by an EOS id or a
stopping criterion, and the loop ends when every row is finished or ``max_new_tokens`` tokens are
drawn.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from collab_env.agents.hf_loading import forward_accepts
from collab_env.agents.hf_rows_first import rows_first_limit, rows_first_product

__all__ = ["ARCHITECTURES", "LeanDecoder", "lean_decoder", "unsupported_reason"]

#: ``config.model_type`` values whose decoder layer is the Llama layer (pre-norm RMSNorm, rotary
#: attention with grouped KV heads, optional q/k/v biases, a gated SiLU MLP, no logit soft-capping,
#: an unscaled input embedding). Architectures that add to it (Qwen3's q/k norms, Gemma's scaled
#: embedding and soft-capping, Phi-3's fused projections) are not in the list.
ARCHITECTURES = ("llama", "qwen2", "mistral")


def unsupported_reason(model: Any) -> str | None:
    """Why :class:`LeanDecoder` cannot decode ``model`` (``None``: it can)."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in ARCHITECTURES:
        return f"model_type {model_type!r} is not one of {ARCHITECTURES}"
    import transformers
    from packaging.version import Version

    if Version(transformers.__version__) < Version("4.56"):
        return f"transformers {transformers.__version__} (its caches have no per-layer keys and values before 4.56)"
    inner = getattr(model, "model", None)
    if not all(hasattr(inner, name) for name in ("embed_tokens", "layers", "norm", "rotary_emb")):
        return "the model has no model.embed_tokens / layers / norm / rotary_emb (a wrapped model?)"
    if not forward_accepts(model, "logits_to_keep"):
        return "the model's forward takes no logits_to_keep"
    if not callable(getattr(model, "lm_head", None)):
        return "the model has no lm_head"
    if getattr(config, "final_logit_softcapping", None) or getattr(config, "attn_logit_softcapping", None):
        return "logit soft-capping"
    if getattr(config, "hidden_act", None) != "silu":
        return f"hidden_act {getattr(config, 'hidden_act', None)!r} (only SiLU MLPs were checked against generate)"
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None and any(t != "full_attention" for t in layer_types):
        return "a layer that is not full attention"
    if model_type == "qwen2" and getattr(config, "use_sliding_window", False):
        return "sliding-window attention"
    for i, layer in enumerate(inner.layers):
        attn = getattr(layer, "self_attn", None)
        if not all(callable(getattr(attn, n, None)) for n in ("q_proj", "k_proj", "v_proj", "o_proj")):
            return f"layer {i} has no q/k/v/o projections"
        if not all(hasattr(attn, n) for n in ("scaling", "head_dim")):
            return f"layer {i}'s attention has no scaling / head_dim"
        if not hasattr(sys.modules.get(type(attn).__module__), "apply_rotary_pos_emb"):
            return f"layer {i}'s attention module defines no apply_rotary_pos_emb"
        if getattr(attn, "sliding_window", None) or getattr(attn, "q_norm", None) is not None:
            return f"layer {i}'s attention has a sliding window or q/k norms"
        if not all(callable(getattr(layer, n, None)) for n in ("input_layernorm", "post_attention_layernorm", "mlp")):
            return f"layer {i} has no input_layernorm / post_attention_layernorm / mlp"
        if not all(callable(getattr(layer.mlp, n, None)) for n in ("gate_proj", "up_proj", "down_proj", "act_fn")):
            return f"layer {i}'s MLP has no gate_proj / up_proj / down_proj / act_fn"
    return None


def lean_decoder(model: Any) -> LeanDecoder | None:
    """A :class:`LeanDecoder` of ``model``, or ``None`` when :func:`unsupported_reason` names a
    reason (then use ``model.generate``)."""
    return None if unsupported_reason(model) is not None else LeanDecoder(model)


class LeanDecoder:
    """Decode a batch on a Llama-family model (see the module docstring); build it with
    :func:`lean_decoder`, which checks the architecture."""

    def __init__(self, model: Any) -> None:
        self.model = model
        config = model.config
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(getattr(config, "num_key_value_heads", None) or self.heads)
        self.sliding_window = getattr(config, "sliding_window", None) if config.model_type == "mistral" else None

    def fits(self, length: int) -> bool:
        """Whether a sequence of ``length`` positions is decoded exactly now: a Mistral sliding
        window longer than it (or none), no attention dropout (a model in training mode with
        ``attention_dropout > 0``, which ``generate`` would apply), and nothing attached to a
        module whose forward the decode steps do not call (see :meth:`bypassed`)."""
        if self.model.training and getattr(self.model.config, "attention_dropout", 0.0):
            return False
        if self.bypassed():
            return False
        return self.sliding_window is None or length <= int(self.sliding_window)

    def bypassed(self) -> list[str]:
        """The modules whose own forward the decode steps skip (the model, its decoder, each
        decoder layer, attention and MLP; the steps call their parts) that carry something that
        forward would run: a forward replaced on the instance (accelerate's mixed-precision
        autocast wraps ``model.forward`` so), forward hooks or pre-hooks; or any global forward
        hook. Empty: the steps compute what the model's forward would."""
        import torch

        module_hooks = torch.nn.modules.module
        if module_hooks._global_forward_hooks or module_hooks._global_forward_pre_hooks:
            return ["(global forward hooks)"]
        inner = self.model.model
        named = [("model", self.model), ("model.model", inner)]
        for i, layer in enumerate(inner.layers):
            named += [(f"layers.{i}", layer), (f"layers.{i}.self_attn", layer.self_attn),
                      (f"layers.{i}.mlp", layer.mlp)]
        return [name for name, m in named
                if "forward" in vars(m) or m._forward_hooks or m._forward_pre_hooks]

    def generate(self, input_ids: Any, attention_mask: Any, *, cache: Any = None, cache_keyword: str = "cache",
                 logits_processor: Any, stopping_criteria: Sequence[Any] = (), eos_token_ids: Sequence[int],
                 pad_token_id: int, max_new_tokens: int) -> Any:
        """The new tokens, ``[rows, steps]`` (``steps <= max_new_tokens``; rows finished before the
        last step hold ``pad_token_id`` after their end), for left-padded ``input_ids`` /
        ``attention_mask`` (``[rows, width]``, on the model's device).

        ``cache``: a KV cache of every column but the last (a shared prefill); ``None`` reads
        the prompts whole. ``logits_processor(ids, scores)`` gets the float32 logits of the
        next position and returns scores whose argmax is the token (``generate``'s greedy step
        with a processor); ``stopping_criteria`` are called like ``generate``'s, on the ids so far.
        Call it under ``torch.inference_mode()``."""
        import torch

        model = self.model
        rows, width = input_ids.shape
        mask = attention_mask.long()
        positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)  # generate's position ids
        kwargs: dict[str, Any] = dict(attention_mask=mask, use_cache=True, logits_to_keep=1)
        if cache is None:
            out = model(input_ids=input_ids, position_ids=positions, **kwargs)
        else:
            out = model(input_ids=input_ids[:, -1:], position_ids=positions[:, -1:], **kwargs,
                        **{cache_keyword: cache})
        prefill = getattr(out, "cache", None) or out.past_key_values
        logits = out.logits[:, -1, :].to(dtype=torch.float32, copy=True)
        keys, values = self._allocate(prefill, rows, width + max_new_tokens, width)
        layers = self._layers(rows)
        del out, prefill, cache
        # attention bias over the cache's columns: the prompt's padding is -inf; every new column
        # is attended (generate appends ones to the mask, finished rows included)
        bias = torch.zeros((rows, 1, 1, width + max_new_tokens), dtype=keys[0].dtype, device=input_ids.device)
        bias[:, 0, 0, :width].masked_fill_(mask == 0, float("-inf"))
        position = positions[:, -1:] + 1
        eos = torch.tensor(list(eos_token_ids), dtype=torch.long, device=input_ids.device)
        unfinished = torch.ones(rows, dtype=torch.bool, device=input_ids.device)
        ids, new = input_ids, []
        for step in range(max_new_tokens):
            scores = logits_processor(ids, logits)
            token = scores.argmax(dim=-1)
            token = torch.where(unfinished, token, torch.full_like(token, pad_token_id))
            ids = torch.cat([ids, token[:, None]], dim=-1)
            new.append(token)
            done = torch.isin(token, eos)
            for criterion in stopping_criteria:
                done = done | criterion(ids, scores)
            unfinished &= ~done
            if step == max_new_tokens - 1 or not bool(unfinished.any()):
                break
            logits = self._step(token, position, width + step, keys, values, bias, layers)
            position = position + 1
        return torch.stack(new, dim=1)

    def _allocate(self, cache: Any, rows: int, length: int, width: int) -> tuple[list[Any], list[Any]]:
        """One ``[rows, kv_heads, length, head_dim]`` key and value tensor per layer, the first
        ``width`` columns copied from the prefill's ``cache``."""
        import torch

        layers = getattr(cache, "layers", None)
        if not layers or len(layers) != len(self.model.model.layers):
            raise RuntimeError(f"internal: the prefill returned a {type(cache).__name__} without one layer per decoder "
                               "layer; the lean decoder needs a plain full-attention cache")
        keys, values = [], []
        for layer in layers:
            k, v = layer.keys, layer.values
            if k is None or k.shape[0] != rows or k.shape[2] != width:
                raise RuntimeError(f"internal: a prefill cache layer holds {None if k is None else tuple(k.shape)}, "
                                   f"not {rows} rows of {width} positions")
            kb = torch.empty((rows, k.shape[1], length, k.shape[3]), dtype=k.dtype, device=k.device)
            vb = torch.empty((rows, v.shape[1], length, v.shape[3]), dtype=v.dtype, device=v.device)
            kb[:, :, :width] = k
            vb[:, :, :width] = v
            keys.append(kb)
            values.append(vb)
        return keys, values

    def _layers(self, rows: int) -> list[tuple[Any, ...]]:
        """Per decoder layer, what a step calls: ``(input norm, q, k, v, o, post norm, gate, up,
        down, activation, apply_rotary_pos_emb, scaling, head_dim)``. A projection is a module
        call, or, for a layer that :func:`~collab_env.agents.hf_rows_first.rows_first_linears`
        patched for ``rows`` rows, its product taken directly (the same
        :func:`~collab_env.agents.hf_rows_first.rows_first_product`, without the module call)."""
        out = []
        for layer in self.model.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            projections = [_projection(m, rows) for m in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj,
                                                          mlp.gate_proj, mlp.up_proj, mlp.down_proj)]
            out.append((layer.input_layernorm, *projections[:4], layer.post_attention_layernorm, *projections[4:],
                        mlp.act_fn,
                        sys.modules[type(attn).__module__].apply_rotary_pos_emb, attn.scaling, attn.head_dim))
        return out

    def _step(self, token: Any, position: Any, column: int, keys: list[Any], values: list[Any], bias: Any,
              layers: list[tuple[Any, ...]]) -> Any:
        """Read ``token`` (``[rows]``) at ``position`` (``[rows, 1]``) into cache ``column``;
        returns the float32 logits of the next position, ``[rows, vocab]``. ``layers``:
        :meth:`_layers`."""
        import torch

        model = self.model
        inner = model.model
        rows = token.shape[0]
        hidden = inner.embed_tokens(token)  # [rows, hidden]: one position per row
        cos, sin = inner.rotary_emb(hidden, position)
        cos, sin = cos[:, 0], sin[:, 0]  # [rows, head_dim], broadcast over the heads below
        end = column + 1
        kv, group = self.kv_heads, self.heads // self.kv_heads
        for (norm1, q_proj, k_proj, v_proj, o_proj, norm2, gate, up, down, act, rotate, scaling, d), k_cache, \
                v_cache in zip(layers, keys, values, strict=True):
            x = norm1(hidden)
            q = q_proj(x).view(rows, self.heads, d)
            k = k_proj(x).view(rows, kv, d)
            q, k = rotate(q, k, cos, sin)
            k_cache[:, :, column] = k
            v_cache[:, :, column] = v_proj(x).view(rows, kv, d)
            # query head h reads KV head h // group (transformers' repeat_kv order)
            scores = torch.matmul(q.view(rows, kv, group, d), k_cache[:, :, :end].transpose(-1, -2)) * scaling
            weights = torch.softmax(scores + bias[..., :end], dim=-1, dtype=torch.float32).to(q.dtype)
            context = torch.matmul(weights, v_cache[:, :, :end]).view(rows, self.heads * d)
            hidden = hidden + o_proj(context)
            x = norm2(hidden)
            hidden = hidden + down(act(gate(x)) * up(x))
        hidden = inner.norm(hidden)
        return model.lm_head(hidden).to(dtype=torch.float32)


def _projection(module: Any, rows: int) -> Any:
    """``module`` as a function of ``[rows, in]``: its rows-first product taken directly when
    :func:`~collab_env.agents.hf_rows_first.rows_first_linears` patched it for ``rows`` rows,
    else the module."""
    if 1 <= rows <= rows_first_limit(module):
        weight, bias = module.weight, module.bias
        return lambda x: rows_first_product(weight, bias, x)
    return module

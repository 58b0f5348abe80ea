"""The linear layers of a decode step on a CPU, computed the fast way round.

A decode step multiplies a few rows (one per sequence of the batch) by every linear layer of the
model: the attention and MLP projections (576 x 576 to 1536 x 576 for the embedded SmolLM2-135M)
and the output layer, a ``[V, d]`` matrix with a large vocabulary ``V`` (49,152 x 576).
``torch.nn.functional.linear`` computes each as ``x @ W.T``, and MKL's float32 GEMM is slow at
those shapes. Measured on this project's 2-core AMD EPYC (torch 2.13, best of 3):

* the output layer: ``linear`` 10, 24, 37, 18 and 16 ms at 1, 2, 3, 4 and 8 rows, where
  ``(W @ x.T).T`` (the same product, with the rows as the narrow side; one row padded to two, as
  the matrix-vector path is the slow one) takes 4.0, 3.5, 5.5, 4.7 and 7.5 ms; at 12 rows it is
  no faster (17 vs 18.6 ms), hence :data:`MAX_ROWS`;
* the 210 projections of the 30 layers: ``linear`` 35, 51, 46 and 52 ms at 1, 2, 4 and 8 rows,
  rows-first 18, 15, 21 and 35 ms (at 8 rows the two are close on some runs; at 12 rows
  rows-first is no faster);
* one whole decode forward of the embedded model at 8 rows (median of 8): 90 ms with ``linear``
  everywhere, 80 ms with the output layer rows-first, 75 ms with every layer rows-first; at 4 rows
  81, 69 and 55 ms.

Small layers gain nothing: with the tiny test model (64-wide layers, a 384 x 64 output layer),
generation was 15% slower with every layer rows-first, the wrapper's Python costing more than the
product; hence :data:`MIN_ELEMENTS`.

Under :func:`rows_first_linears`, every plain ``torch.nn.Linear`` of the model with at least
:data:`MIN_ELEMENTS` weights computes few-row products as ``(W @ x.T).T`` (one row padded to
two): the same product up to float rounding (the sums run in another order, about 1e-5 apart in
float32). Products with gradient, on an accelerator, or of more than :data:`MAX_ROWS` rows keep
``linear``. So do bfloat16 and float16 layers: the measurements above are MKL's float32 GEMM,
and a rough bfloat16 measurement (on a loaded machine) had rows-first several times slower at 2 rows.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

__all__ = ["MAX_ROWS", "MIN_ELEMENTS", "rows_first_limit", "rows_first_linears", "rows_first_product"]

#: Most rows (sequences x positions) a linear layer's product takes the rows-first way.
MAX_ROWS = 8
#: Fewest weights a layer needs to be computed rows-first (the embedded model's smallest
#: projection has 192 x 576 = 110,592).
MIN_ELEMENTS = 1 << 16


def rows_first_product(weight: Any, bias: Any, rows: Any) -> Any:
    """``rows @ weight.T (+ bias)`` computed as ``(weight @ rows.T).T``, one row padded to two
    (the matrix-vector path is the slow one): ``rows`` is ``[n, in]`` with ``1 <= n``."""
    import torch

    n = rows.shape[0]
    if n == 1:
        rows = torch.cat([rows, rows])
    out = torch.mm(weight, rows.t()).t()[:n]
    return out + bias if bias is not None else out


def rows_first_limit(layer: Any) -> int:
    """The most rows ``layer`` computes rows-first: the ``max_rows`` of the
    :func:`rows_first_linears` that patched it, 0 when none did (or it is not active)."""
    return int(getattr(vars(layer).get("forward"), "rows_first_max_rows", 0))


def _rows_first_forward(layer: Any, max_rows: int) -> Any:
    """The forward that replaces ``layer.forward`` while :func:`rows_first_linears` is active."""
    import torch

    linear = torch.nn.functional.linear

    def forward(x: Any) -> Any:
        weight, bias = layer.weight, layer.bias
        rows = x.reshape(-1, x.shape[-1])
        n = rows.shape[0]
        if n > max_rows or n == 0 or torch.is_grad_enabled():
            return linear(x, weight, bias)
        return rows_first_product(weight, bias, rows).reshape(*x.shape[:-1], weight.shape[0])

    forward.rows_first_max_rows = max_rows  # type: ignore[attr-defined]
    return forward


@contextlib.contextmanager
def rows_first_linears(model: Any, max_rows: int = MAX_ROWS,
                       min_elements: int = MIN_ELEMENTS) -> Iterator[int]:
    """While active, every plain ``torch.nn.Linear`` of ``model`` whose weight is float32, on a
    CPU, with at least ``min_elements`` entries (the projections and the output layer; LoRA's base
    layers too) computes products of at most ``max_rows`` rows without gradient as
    ``(W @ x.T).T``; yields how many layers it patched (0: nothing applies, e.g. a model on an
    accelerator or a tiny one). Subclasses of ``Linear``
    (quantised layers) and layers whose ``forward`` someone else already replaced are left
    alone. Grad mode is per thread, so a training step in another thread keeps ``linear`` and
    its gradient. Not reentrant on one model: the caller holds the model (the HF backend's
    model lock)."""
    import torch

    modules = getattr(model, "modules", None)
    layers = [m for m in modules() if type(m) is torch.nn.Linear and m.weight.device.type == "cpu"
              and m.weight.dtype == torch.float32 and m.weight.numel() >= min_elements
              and "forward" not in vars(m)] if callable(modules) else []
    patched = []
    try:
        for layer in layers:
            layer.forward = _rows_first_forward(layer, max_rows)
            patched.append(layer)
        yield len(patched)
    finally:
        for layer in patched:
            del layer.forward

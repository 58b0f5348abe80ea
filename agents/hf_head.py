"""The output layer of a decode step on a CPU, computed the fast way round.

A decode step multiplies a few rows (one per sequence of the batch) by the output layer, a
``[V, d]`` matrix with a large vocabulary ``V`` (49,152 x 576 for the embedded SmolLM2-135M).
``torch.nn.functional.linear`` computes it as ``x @ W.T``, and MKL's float32 GEMM is slow at that
shape. Measured on this project's 2-core AMD EPYC (torch 2.13, the embedded model's output layer,
best of 3): ``linear`` 10, 24, 37, 18 and 16 ms at 1, 2, 3, 4 and 8 rows, where ``(W @ x.T).T``
(the same product, with the rows as the narrow side; one row padded to two, as the
matrix-vector path is the slow one) takes 4.0, 3.5, 5.5, 4.7 and 7.5 ms; at 12 rows it is no
faster (17 vs 18.6 ms), hence :data:`MAX_ROWS`. Under
:func:`rows_first_head`, the model's output layer computes few-row products as ``(W @ x.T).T``
(one row padded to two): the same product up to float rounding (the sums run in another order,
about 1e-5 apart in float32). Products with gradient, on an accelerator, or of more than
:data:`MAX_ROWS` rows keep ``linear``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

__all__ = ["MAX_ROWS", "rows_first_head"]

#: Most rows (sequences x positions) an output-layer product takes the rows-first way.
MAX_ROWS = 8


@contextlib.contextmanager
def rows_first_head(model: Any, max_rows: int = MAX_ROWS) -> Iterator[bool]:
    """While active, ``model``'s output layer (``get_output_embeddings()``, a plain
    ``torch.nn.Linear`` on a CPU) computes products of at most ``max_rows`` rows without
    gradient as ``(W @ x.T).T``; yields whether it does (``False``: other layers, devices, or a
    model without output embeddings are left alone). Grad mode is per thread, so a training
    step in another thread keeps ``linear`` and its gradient. Not reentrant on one model: the
    caller holds the model (the HF backend's model lock)."""
    import torch

    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    if type(head) is not torch.nn.Linear or head.weight.device.type != "cpu" or "forward" in vars(head):
        yield False
        return
    linear = torch.nn.functional.linear

    def forward(x: Any) -> Any:
        weight, bias = head.weight, head.bias
        rows = x.reshape(-1, x.shape[-1])
        n = rows.shape[0]
        if n > max_rows or n == 0 or torch.is_grad_enabled():
            return linear(x, weight, bias)
        if n == 1:  # the matrix-vector path is slower than a two-row product
            rows = torch.cat([rows, rows])
        out = torch.mm(weight, rows.t()).t()[:n]
        if bias is not None:
            out = out + bias
        return out.reshape(*x.shape[:-1], weight.shape[0])

    head.forward = forward
    try:
        yield True
    finally:
        del head.forward

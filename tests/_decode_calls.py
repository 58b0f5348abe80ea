"""Watch the batches a transformers model decodes (``HFGenerator`` decodes with ``model.generate``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def on_decode(monkeypatch: Any, model: Any, hook: Callable[[int], None]) -> None:
    """Call ``hook(rows)`` before every batch ``model`` decodes (``rows``: its number of rows);
    an exception from ``hook`` is the decode call's. ``model.generate`` is patched for this test
    only (``monkeypatch``)."""
    real_generate = model.generate

    def generate(*args, **kwargs):
        hook(int(kwargs["input_ids"].shape[0]))
        return real_generate(*args, **kwargs)

    monkeypatch.setattr(model, "generate", generate)


def count_decodes(monkeypatch: Any, model: Any) -> list[int]:
    """The list that gets each decode call's number of rows (see :func:`on_decode`)."""
    sizes: list[int] = []
    on_decode(monkeypatch, model, sizes.append)
    return sizes

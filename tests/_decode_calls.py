"""Watch the batches a transformers model decodes, on either path of ``HFGenerator``:
``model.generate`` or the lean loop (:class:`~collab_env.agents.hf_decode.LeanDecoder`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def on_decode(monkeypatch: Any, model: Any, hook: Callable[[int], None]) -> None:
    """Call ``hook(rows)`` before every batch ``model`` decodes (``rows``: its number of rows);
    an exception from ``hook`` is the decode call's. The lean path is patched for this test only
    (``monkeypatch``), and only for ``model``."""
    from collab_env.agents.hf_decode import LeanDecoder

    real_generate = model.generate

    def generate(*args, **kwargs):
        hook(int(kwargs["input_ids"].shape[0]))
        return real_generate(*args, **kwargs)

    model.generate = generate
    real_lean = LeanDecoder.generate

    def lean(self, input_ids, *args, **kwargs):
        if self.model is model:
            hook(int(input_ids.shape[0]))
        return real_lean(self, input_ids, *args, **kwargs)

    monkeypatch.setattr(LeanDecoder, "generate", lean)


def count_decodes(monkeypatch: Any, model: Any) -> list[int]:
    """The list that gets each decode call's number of rows (see :func:`on_decode`)."""
    sizes: list[int] = []
    on_decode(monkeypatch, model, sizes.append)
    return sizes

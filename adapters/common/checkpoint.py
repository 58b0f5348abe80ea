"""Checkpoints that resume a run bit for bit (on CPU, with a fixed seed).

A checkpoint folder holds:

* ``model_<k>/``: each distinct model as ``save_pretrained`` writes it (the LoRA adapter only
  under LoRA) with its tokenizer: load it with transformers/peft to use the trained agent;
* ``trainer_state.pt``: what resuming needs exactly: the trainable parameters, optimiser and
  scheduler states, the frozen reference weights (when a KL term uses a copy), the trainer's
  position (epoch, item, ``env_step``...) and every RNG state (Python, NumPy, torch, CUDA and
  the trainer's own generator).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from collab_env.errors import ConfigError

__all__ = ["capture_rng", "restore_rng", "save_checkpoint", "load_checkpoint", "STATE_FILE"]

STATE_FILE = "trainer_state.pt"


def capture_rng(generator: Any = None) -> dict[str, Any]:
    """Every RNG state a run depends on; ``generator`` is the trainer's ``numpy`` Generator."""
    import numpy as np
    import torch

    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }
    if generator is not None:
        state["generator"] = generator.bit_generator.state
    return state


def restore_rng(state: Mapping[str, Any], generator: Any = None) -> None:
    """Inverse of :func:`capture_rng`."""
    import numpy as np
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if generator is not None and "generator" in state:
        generator.bit_generator.state = state["generator"]


def save_checkpoint(path: str | Path, models: Sequence[Any], state: Mapping[str, Any],
                    generator: Any = None) -> Path:
    """Write a checkpoint of the distinct ``models`` (:class:`PolicyModel`) and the trainer's
    ``state`` (JSON-friendly position) to ``path``; return it."""
    import torch

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    saved = []
    for k, pm in enumerate(models):
        folder = path / f"model_{k}"
        pm.model.save_pretrained(folder)
        pm.tokenizer.save_pretrained(folder)
        saved.append({
            "params": {n: p.detach().cpu().clone() for n, p in pm.trainable_parameters()},
            "optimizer": pm.optimizer.state_dict() if pm.optimizer is not None else None,
            "scheduler": pm.scheduler.state_dict() if pm.scheduler is not None else None,
            "reference": ({n: t.detach().cpu().clone() for n, t in pm.reference.state_dict().items()}
                          if pm.reference is not None else None),
        })
    torch.save({"models": saved, "state": dict(state), "rng": capture_rng(generator)}, path / STATE_FILE)
    return path


def load_checkpoint(path: str | Path, models: Sequence[Any], generator: Any = None) -> dict[str, Any]:
    """Load a checkpoint written by :func:`save_checkpoint` into ``models`` (same structure:
    the trainer must be built with the same models and config); restore the RNG states and
    return the trainer's saved ``state``."""
    import torch

    file = Path(path) / STATE_FILE
    if not file.is_file():
        raise ConfigError(f"{path} is not a checkpoint folder (no {STATE_FILE}); pass the folder save_checkpoint() wrote.")
    blob = torch.load(file, map_location="cpu", weights_only=False)
    if len(blob["models"]) != len(models):
        raise ConfigError(
            f"the checkpoint holds {len(blob['models'])} model(s), this trainer has {len(models)}: build the "
            "trainer with the same agents and share_model setting as the run that saved it."
        )
    for pm, saved in zip(models, blob["models"], strict=True):
        params = dict(pm.trainable_parameters())
        if set(params) != set(saved["params"]):
            raise ConfigError("the checkpoint's trainable parameters do not match this model (other model or LoRA setting?).")
        with torch.no_grad():
            for n, p in params.items():
                p.copy_(saved["params"][n].to(p.device, p.dtype))
        if saved["optimizer"] is not None and pm.optimizer is not None:
            pm.optimizer.load_state_dict(saved["optimizer"])
        if saved["scheduler"] is not None and pm.scheduler is not None:
            pm.scheduler.load_state_dict(saved["scheduler"])
        if saved["reference"] is not None and pm.reference is not None:
            pm.reference.load_state_dict(saved["reference"])
    restore_rng(blob["rng"], generator)
    return dict(blob["state"])

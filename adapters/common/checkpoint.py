"""Checkpoints that resume a run bit for bit (on CPU, with a fixed seed), in formats that run no
code when loaded.

A checkpoint folder holds:

* ``model_<k>/``: each distinct model as ``save_pretrained`` writes it (safetensors; the LoRA
  adapter only under LoRA) with its tokenizer: load it with transformers/peft to use the
  trained agent;
* ``trainer_state.json`` + ``trainer_state.safetensors``: what resuming needs exactly: the
  trainable parameters, optimiser and scheduler states, the frozen reference weights (when a KL
  term uses a copy), the trainer's position (epoch, item, ``env_step``...) and every RNG state
  (Python, NumPy, torch, CUDA and the trainer's own generator).

Safe formats
    A pickle (``torch.save``, ``pickle.dump``) can run any code when it is read, so a checkpoint
    from someone else (a shared run, a leaderboard entry) must never be one. Every file here is
    either JSON or safetensors (raw tensor bytes behind a JSON header). :func:`save_safe` splits
    any state made of tensors, numbers, strings, lists, tuples and dicts (optimiser and
    scheduler ``state_dict``\\ s, RNG states) into the two: the tensors go to the safetensors
    file, the structure to the JSON file with ``{"__tensor__": key}`` where each tensor was,
    ``{"__tuple__": [...]}`` for tuples (``random.setstate`` needs them), ``{"__items__": ...}``
    for dicts with non-string keys (an optimiser's state is keyed by int) and
    ``{"__ndarray__": ...}`` for NumPy arrays (the Mersenne Twister key). Floats are written
    with ``repr`` precision, so every value reads back bit for bit. Anything else (a function,
    an arbitrary object) cannot be saved: :func:`save_safe` raises instead of pickling it.

Older checkpoints
    Checkpoints written before this format (``trainer_state.pt``, ``critic_<k>.pt``,
    ``reward_head.pt``: pickles) are refused, never read silently. :func:`convert_legacy`
    (``python -m collab_env.adapters.common.checkpoint FOLDER``) rewrites such a folder in the
    safe format; it reads the old files with torch's restricted unpickler
    (``weights_only=True``) allowing only NumPy's array constructor besides tensors, so even a
    doctored file runs no code: it is refused.
"""

from __future__ import annotations

import json
import os
import random
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from collab_env.errors import ConfigError

__all__ = [
    "capture_rng",
    "restore_rng",
    "save_checkpoint",
    "load_checkpoint",
    "save_safe",
    "load_safe",
    "save_tensors",
    "load_tensors",
    "refuse_legacy",
    "convert_legacy",
    "STATE_NAME",
    "STATE_FILE",
    "LEGACY_STATE_FILE",
    "FORMAT",
]

#: Base name of the trainer state (``.json`` structure, ``.safetensors`` tensors).
STATE_NAME = "trainer_state"
#: The file that marks a checkpoint folder (written last, so its presence means complete).
STATE_FILE = f"{STATE_NAME}.json"
#: The pickle that older versions wrote; refused (see :func:`convert_legacy`).
LEGACY_STATE_FILE = f"{STATE_NAME}.pt"
#: ``format`` field of every JSON file :func:`save_safe` writes.
FORMAT = "collab_env.safe_state/1"

_MARKERS = ("__tensor__", "__tuple__", "__items__", "__ndarray__")
_CONVERT = "python -m collab_env.adapters.common.checkpoint {folder}"


# ---------------------------------------------------------------------------------------------
# Safe state files: JSON structure + safetensors tensors
# ---------------------------------------------------------------------------------------------
def _encode(obj: Any, tensors: dict[str, Any], where: str) -> Any:
    import numpy as np
    import torch

    if isinstance(obj, torch.Tensor):
        key = str(len(tensors))
        # A copy of its own: safetensors refuses tensors that share storage (views of one buffer).
        tensors[key] = obj.detach().to("cpu", copy=True).contiguous()
        return {"__tensor__": key}
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind not in "biuf":
            raise ConfigError(f"cannot save the {obj.dtype} array at {where} safely: only numeric arrays are stored.")
        return {"__ndarray__": obj.tolist(), "dtype": obj.dtype.str, "shape": list(obj.shape)}
    if isinstance(obj, np.generic):
        return obj.item()
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, float):
        return obj  # json writes repr(obj) (exact) and NaN/Infinity, which it reads back
    if isinstance(obj, tuple):
        return {"__tuple__": [_encode(v, tensors, f"{where}[{i}]") for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [_encode(v, tensors, f"{where}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, Mapping):
        if all(isinstance(k, str) and k not in _MARKERS for k in obj):
            return {k: _encode(v, tensors, f"{where}.{k}") for k, v in obj.items()}
        return {"__items__": [[_encode(k, tensors, f"{where} key"), _encode(v, tensors, f"{where}[{k!r}]")]
                              for k, v in obj.items()]}
    raise ConfigError(
        f"cannot save {type(obj).__name__} at {where} safely: a checkpoint holds only tensors, numbers, "
        "strings, lists, tuples and dicts (no pickled objects); convert it to one of those first."
    )


def _decode(obj: Any, tensors: Mapping[str, Any], file: Path) -> Any:
    if isinstance(obj, list):
        return [_decode(v, tensors, file) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if "__tensor__" in obj:
        key = obj["__tensor__"]
        if not isinstance(key, str) or key not in tensors:
            raise ConfigError(f"{file} refers to tensor {key!r}, which its .safetensors file lacks: the "
                              "checkpoint is incomplete or its two files come from different saves.")
        return tensors[key]
    if "__tuple__" in obj:
        return tuple(_decode(v, tensors, file) for v in obj["__tuple__"])
    if "__items__" in obj:
        return {_decode(k, tensors, file): _decode(v, tensors, file) for k, v in obj["__items__"]}
    if "__ndarray__" in obj:
        import numpy as np

        dtype = np.dtype(obj["dtype"])
        if dtype.kind not in "biuf":
            raise ConfigError(f"{file} holds an array of dtype {dtype}; only numeric arrays are read.")
        return np.array(obj["__ndarray__"], dtype=dtype).reshape(obj["shape"])
    return {k: _decode(v, tensors, file) for k, v in obj.items()}


def _atomic_write(path: Path, write: Any) -> None:
    """``write(tmp_path)`` then rename over ``path``, so a crash never leaves half a file."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def save_tensors(path: str | Path, tensors: Mapping[str, Any]) -> Path:
    """Write a flat ``name -> tensor`` dict as a safetensors file (atomically); return its path."""
    from safetensors.torch import save_file

    path = Path(path)
    clean = {str(k): v.detach().to("cpu", copy=True).contiguous() for k, v in tensors.items()}
    _atomic_write(path, lambda tmp: save_file(clean, str(tmp), metadata={"format": "pt"}))
    return path


def load_tensors(path: str | Path) -> dict[str, Any]:
    """Read a safetensors file (CPU tensors); anything else is refused with a :class:`ConfigError`.

    Safetensors holds raw tensor bytes behind a JSON header, so reading it runs no code."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    try:
        return load_file(str(path), device="cpu")
    except (SafetensorError, ValueError) as exc:
        raise ConfigError(f"{path} is not a safetensors file ({exc}); it was not written by collab_env "
                          "or is damaged. Save it again, or restore it from a good copy.") from exc


def save_safe(folder: str | Path, name: str, obj: Any) -> Path:
    """Write ``obj`` as ``<folder>/<name>.safetensors`` (its tensors) and ``<folder>/<name>.json``
    (everything else; see the module docstring); return the JSON file's path.

    Raises:
        ConfigError: ``obj`` holds something that is not a tensor, number, string, list, tuple,
            dict or numeric NumPy array.
    """
    folder = Path(folder)
    tensors: dict[str, Any] = {}
    data = _encode(obj, tensors, name)
    save_tensors(folder / f"{name}.safetensors", tensors)
    text = json.dumps({"format": FORMAT, "data": data}, allow_nan=True)
    # The JSON file last: it marks the pair complete.
    _atomic_write(folder / f"{name}.json", lambda tmp: tmp.write_text(text, encoding="utf-8"))
    return folder / f"{name}.json"


def load_safe(folder: str | Path, name: str) -> Any:
    """Read what :func:`save_safe` wrote under ``name`` in ``folder``.

    Raises:
        ConfigError: The files are missing (an old ``<name>.pt`` pickle in their place is
            refused, with how to convert it), not JSON/safetensors, or do not match.
    """
    folder = Path(folder)
    file = folder / f"{name}.json"
    if not file.is_file():
        refuse_legacy(folder / f"{name}.pt")
        raise ConfigError(f"{file} is missing; pass a folder collab_env saved (it writes {name}.json and "
                          f"{name}.safetensors).")
    try:
        blob = json.loads(file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{file} is not JSON ({exc}); it was not written by collab_env or is damaged. "
                          "Save it again, or restore it from a good copy.") from exc
    if not isinstance(blob, dict) or blob.get("format") != FORMAT:
        found = blob.get("format") if isinstance(blob, dict) else type(blob).__name__
        raise ConfigError(f"{file} is not a collab_env state file (format {found!r}, expected {FORMAT!r}).")
    tensors = load_tensors(folder / f"{name}.safetensors")
    return _decode(blob["data"], tensors, file)


def refuse_legacy(file: str | Path) -> None:
    """Raise a :class:`ConfigError` when ``file`` (an old pickle: ``*.pt``) exists: it is never
    unpickled; the message says how to convert the folder. Returns when there is no such file."""
    file = Path(file)
    if file.exists():
        raise ConfigError(
            f"{file} is in the old pickle format (torch.save), which can run code when it is read, so "
            f"collab_env no longer loads it. If the folder is yours, convert it once with "
            f"`{_CONVERT.format(folder=file.parent)}` (it reads tensors and plain data only, and refuses "
            "anything else), or save the run again."
        )


# ---------------------------------------------------------------------------------------------
# RNG states
# ---------------------------------------------------------------------------------------------
def capture_rng(generator: Any = None) -> dict[str, Any]:
    """Every RNG state a run depends on; ``generator`` is the trainer's ``numpy`` Generator.

    Plain data :func:`save_safe` stores exactly: Python's state is a tuple of ints, NumPy's the
    ``legacy=False`` dict (its key a ``uint32`` array), torch's and CUDA's byte tensors."""
    import numpy as np
    import torch

    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(legacy=False),
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

    python = state["python"]
    random.setstate((python[0], tuple(python[1]), python[2]))
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(list(state["cuda"]))
    if generator is not None and "generator" in state:
        generator.bit_generator.state = state["generator"]


# ---------------------------------------------------------------------------------------------
# Trainer checkpoints
# ---------------------------------------------------------------------------------------------
def save_checkpoint(path: str | Path, models: Sequence[Any], state: Mapping[str, Any],
                    generator: Any = None) -> Path:
    """Write a checkpoint of the distinct ``models`` (:class:`PolicyModel`) and the trainer's
    ``state`` (JSON-friendly position) to ``path``; return it."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    saved = []
    for k, pm in enumerate(models):
        folder = path / f"model_{k}"
        pm.model.save_pretrained(folder, safe_serialization=True)
        pm.tokenizer.save_pretrained(folder)
        saved.append({
            "params": {n: p.detach() for n, p in pm.trainable_parameters()},
            "optimizer": pm.optimizer.state_dict() if pm.optimizer is not None else None,
            "scheduler": pm.scheduler.state_dict() if pm.scheduler is not None else None,
            "reference": (dict(pm.reference.state_dict()) if pm.reference is not None else None),
        })
    save_safe(path, STATE_NAME, {"models": saved, "state": dict(state), "rng": capture_rng(generator)})
    return path


def load_checkpoint(path: str | Path, models: Sequence[Any], generator: Any = None) -> dict[str, Any]:
    """Load a checkpoint written by :func:`save_checkpoint` into ``models`` (same structure:
    the trainer must be built with the same models and config); restore the RNG states and
    return the trainer's saved ``state``.

    Raises:
        ConfigError: ``path`` is not a checkpoint folder, holds an old pickle checkpoint
            (refused; see :func:`convert_legacy`), or does not fit ``models``.
    """
    import torch

    path = Path(path)
    if not (path / STATE_FILE).is_file():
        refuse_legacy(path / LEGACY_STATE_FILE)
        raise ConfigError(f"{path} is not a checkpoint folder (no {STATE_FILE}); pass the folder save_checkpoint() wrote.")
    blob = load_safe(path, STATE_NAME)
    if not isinstance(blob, dict) or not {"models", "state", "rng"} <= set(blob):
        raise ConfigError(f"{path / STATE_FILE} is not a trainer checkpoint (it needs models, state and rng).")
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


# ---------------------------------------------------------------------------------------------
# Converting old pickle checkpoints
# ---------------------------------------------------------------------------------------------
def _restricted_load(file: Path) -> Any:
    """Read an old ``.pt`` file with torch's restricted unpickler: tensors, plain containers and
    NumPy numeric arrays only; any other global (what a doctored file needs to run code) is
    refused."""
    import numpy as np
    import torch

    try:
        reconstruct = np._core.multiarray._reconstruct  # NumPy 2
    except AttributeError:  # pragma: no cover - NumPy 1
        reconstruct = np.core.multiarray._reconstruct
    allowed = [reconstruct, np.ndarray, np.dtype]
    allowed += [type(np.dtype(t)) for t in ("u1", "u4", "i4", "i8", "f4", "f8")]
    try:
        with torch.serialization.safe_globals(allowed):
            return torch.load(file, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any refusal of the unpickler is reported the same way
        raise ConfigError(
            f"{file} holds something besides tensors and plain data, so it is not converted ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}). Do not load it; save the run again."
        ) from exc


def convert_legacy(folder: str | Path) -> list[Path]:
    """Rewrite the old pickle files in ``folder`` (``trainer_state.pt``, ``critic_<k>.pt``,
    ``reward_head.pt``) in the safe format and delete them; return the files written.

    The old files are read with the restricted unpickler (see the module docstring), so a file
    that would run code is refused (:class:`ConfigError`) and nothing is written for it.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise ConfigError(f"{folder} is not a folder; pass the checkpoint or reward-model folder to convert.")
    written: list[Path] = []
    old = folder / LEGACY_STATE_FILE
    if old.is_file():
        blob = _restricted_load(old)
        rng = dict(blob["rng"])
        numpy_state = rng.get("numpy")
        if isinstance(numpy_state, tuple):  # the legacy tuple: ("MT19937", key, pos, has_gauss, gauss)
            rng["numpy"] = {"bit_generator": numpy_state[0], "state": {"key": numpy_state[1], "pos": int(numpy_state[2])},
                            "has_gauss": int(numpy_state[3]), "gauss": float(numpy_state[4])}
        written.append(save_safe(folder, STATE_NAME, {"models": blob["models"], "state": blob["state"], "rng": rng}))
        old.unlink()
    for old in sorted(folder.glob("critic_*.pt")):
        written.append(save_safe(folder, old.stem, _restricted_load(old)))
        old.unlink()
    old = folder / "reward_head.pt"
    if old.is_file():
        written.append(save_tensors(folder / "reward_head.safetensors", _restricted_load(old)))
        old.unlink()
    if not written:
        raise ConfigError(f"{folder} holds no old checkpoint file ({LEGACY_STATE_FILE}, critic_<k>.pt, reward_head.pt).")
    return written


def _main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 1 or argv[0].startswith("-"):
        print("usage: python -m collab_env.adapters.common.checkpoint FOLDER\n"
              "Rewrites an old (pickle) checkpoint or reward-model folder in the safe format.", file=sys.stderr)
        return 2
    try:
        for f in convert_legacy(argv[0]):
            print(f"wrote {f}")
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())

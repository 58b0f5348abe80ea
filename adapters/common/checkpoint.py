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
    ``reward_head.pt``: pickles) are not supported: :func:`refuse_legacy` refuses them with a
    one-line :class:`~collab_env.errors.ConfigError` without reading a byte of them.

Hostile files
    A checkpoint may come from someone else, so every reader checks a file before it acts on
    it, and refuses it with a :class:`~collab_env.errors.ConfigError` (one line: the file, what
    is wrong, what to do) without changing it: each file must be a regular file (a FIFO, a
    device, a directory or a link to one is refused before it is opened, so no read can hang);
    a JSON file is at most :data:`MAX_JSON_BYTES` and nested at most :data:`MAX_DEPTH` deep;
    a safetensors header is parsed and checked here first (dtype from an allow-list, shapes
    whose bytes are exactly the data they point at, inside the file); an array is numeric, of
    an allowed dtype and at most :data:`MAX_ARRAY_ELEMENTS` long; every marker dict has
    exactly its documented keys; and every RNG state is checked (structure and ranges, then a
    trial on a fresh generator) before any generator, parameter or optimiser is touched.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from collab_env.errors import ConfigError

__all__ = [
    "capture_rng",
    "check_rng",
    "restore_rng",
    "save_checkpoint",
    "load_checkpoint",
    "save_safe",
    "load_safe",
    "save_tensors",
    "load_tensors",
    "refuse_legacy",
    "STATE_NAME",
    "STATE_FILE",
    "LEGACY_STATE_FILE",
    "FORMAT",
    "MAX_DEPTH",
    "MAX_JSON_BYTES",
    "MAX_ARRAY_ELEMENTS",
    "stat_regular",
    "read_regular",
    "parse_json",
    "damaged",
    "check_tensors",
]

#: Base name of the trainer state (``.json`` structure, ``.safetensors`` tensors).
STATE_NAME = "trainer_state"
#: The file that marks a checkpoint folder (written last, so its presence means complete).
STATE_FILE = f"{STATE_NAME}.json"
#: The pickle that older versions wrote; refused unread (see :func:`refuse_legacy`).
LEGACY_STATE_FILE = f"{STATE_NAME}.pt"
#: ``format`` field of every JSON file :func:`save_safe` writes.
FORMAT = "collab_env.safe_state/1"

#: Deepest nesting of lists and dicts read from a JSON state file (a trainer's state needs
#: about 10; JSON nested 200,000 deep is refused, not a RecursionError).
MAX_DEPTH = 64  # collab_env._json.MAX_DEPTH, the limit of every reader of outside JSON
#: Largest JSON state file read, in bytes (the tensors live in the safetensors file).
MAX_JSON_BYTES = 256 * 2**20
#: Most elements of one NumPy array in a JSON state file (each takes two characters at least).
MAX_ARRAY_ELEMENTS = MAX_JSON_BYTES // 2

_MARKERS = ("__tensor__", "__tuple__", "__items__", "__ndarray__")
#: The keys of each marker dict, exactly (anything else is a damaged or forged file).
_MARKER_KEYS = {"__tensor__": {"__tensor__"}, "__tuple__": {"__tuple__"}, "__items__": {"__items__"},
                "__ndarray__": {"__ndarray__", "dtype", "shape"}}
#: Array dtypes read back (what :func:`_encode` writes: bool, int, uint, float).
_NDARRAY_DTYPE = re.compile(r"[<>|=]?(b1|[iu][1248]|f[248])")
#: Safetensors dtypes read, with their sizes in bytes; the header says nothing else.
_ST_DTYPES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2,
              "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
#: Largest safetensors header (the safetensors library's own limit).
_ST_MAX_HEADER = 100_000_000
_MAX_NDIM = 64
_FIX = ("it was not written by collab_env, or it was damaged or tampered with; nothing was loaded. Do not "
        "use it: save the run again, or restore the checkpoint from a good copy.")


def damaged(file: Path | str, what: str) -> ConfigError:
    """The one-line error for a file that is refused: which file, what is wrong, what to do."""
    return ConfigError(f"{file}: {what}; {_FIX}")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:200]}" if text else type(exc).__name__


# ---------------------------------------------------------------------------------------------
# Reading files without trusting them
# ---------------------------------------------------------------------------------------------
def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def stat_regular(path: Path) -> os.stat_result | None:
    """``os.stat`` of ``path`` (links followed), ``None`` when it does not exist; a
    :class:`ConfigError` unless it is a regular file. Nothing is opened: opening a FIFO for
    reading blocks until someone writes, and opening some devices acts."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:  # a link loop, a path through a file, no permission
        raise ConfigError(f"{path} cannot be read ({exc.strerror or exc}); pass the file collab_env saved, "
                          "readable by you.") from exc
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{path} is {_kind(st.st_mode)}, not a regular file, so it is not read; put the file "
                          "collab_env saved in its place (a link to a regular file is fine).")
    return st


def _open_regular(path: Path, missing: str) -> tuple[Any, int]:
    """``(binary file, size)`` of ``path``, a regular file: checked before it is opened and again
    on the open descriptor (a file swapped in between is caught); ``missing`` is the message
    when it does not exist."""
    if stat_regular(path) is None:
        raise ConfigError(missing)
    try:
        # O_NONBLOCK: should a FIFO be swapped in after the check, opening it does not wait.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise ConfigError(f"{path} cannot be read ({exc.strerror or exc}); pass the file collab_env saved, "
                          "readable by you.") from exc
    f = os.fdopen(fd, "rb")
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        f.close()
        raise ConfigError(f"{path} is {_kind(st.st_mode)}, not a regular file, so it is not read; put the "
                          "file collab_env saved in its place.")
    return f, st.st_size


def read_regular(path: Path, max_bytes: int) -> bytes:
    """The bytes of ``path``, a regular file of at most ``max_bytes``."""
    f, size = _open_regular(path, f"{path} is missing; pass a folder collab_env saved.")
    with f:
        if size > max_bytes:
            raise damaged(path, f"it is {size} bytes, more than the {max_bytes} a state file may be")
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:  # it grew since fstat
        raise damaged(path, f"it is more than the {max_bytes} bytes a state file may be")
    return data


def parse_json(data: bytes, file: Path, fail: Any = None) -> Any:
    """JSON from untrusted bytes: not UTF-8, not JSON, an integer too long to convert, or
    nesting deeper than :data:`MAX_DEPTH` (checked on the bytes before they are parsed, by
    :func:`collab_env._json.depth_problem`) is refused with ``fail(file, what)`` (default
    :func:`damaged`)."""
    from collab_env._json import depth_problem

    fail = fail or damaged
    problem = depth_problem(data, limit=MAX_DEPTH)
    if problem is not None:
        raise fail(file, f"its lists and dicts are nested more than {MAX_DEPTH} deep")
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:  # JSONDecodeError, or an int over Python's digit limit
        raise fail(file, f"it is not JSON ({_first_line(exc)})") from exc


def _not_safetensors(path: Path, what: str) -> ConfigError:
    return ConfigError(f"{path} is not a safetensors file ({what}); {_FIX}")


def _check_safetensors(path: Path) -> None:
    """Check a safetensors file before the safetensors library maps it: a regular file, a
    header that fits in it, allowed dtypes, shapes whose bytes are exactly the data span they
    point at, spans tiling the data (so no shape asks for more than the file holds)."""
    bad = _not_safetensors
    f, size = _open_regular(path, f"{path} is missing; the checkpoint is incomplete (its .json and .safetensors "
                                  "files are written together). Save the run again, or restore it from a good copy.")
    with f:
        if size < 8:
            raise bad(path, f"it is {size} bytes, too short for the 8-byte header length")
        n = int.from_bytes(f.read(8), "little")
        if n > size - 8:
            raise bad(path, f"its header length says {n} bytes, but only {size - 8} follow (a truncated file)")
        if n > _ST_MAX_HEADER:
            raise bad(path, f"its header length says {n} bytes, more than the {_ST_MAX_HEADER} safetensors allows")
        raw = f.read(n)
    header = parse_json(raw, path, lambda p, what: bad(p, f"header: {what}"))
    if not isinstance(header, dict):
        raise bad(path, f"its header is a JSON {type(header).__name__}, not an object")
    data_len, spans = size - 8 - n, []
    for name, info in header.items():
        if name == "__metadata__":
            if not isinstance(info, dict) or not all(isinstance(v, str) for v in info.values()):
                raise bad(path, "its __metadata__ is not a mapping of strings")
            continue
        if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
            raise bad(path, f"tensor {name!r:.60} is not described by exactly dtype, shape and data_offsets")
        dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if not isinstance(dtype, str) or dtype not in _ST_DTYPES:
            raise bad(path, f"tensor {name!r:.60} has dtype {dtype!r:.40}, not one of {sorted(_ST_DTYPES)}")
        if (not isinstance(shape, list) or len(shape) > _MAX_NDIM
                or not all(type(d) is int and d >= 0 for d in shape)):
            raise bad(path, f"tensor {name!r:.60} has shape {str(shape)[:80]}, not a list of at most "
                            f"{_MAX_NDIM} non-negative integers")
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(type(o) is int for o in offsets)
                or not 0 <= offsets[0] <= offsets[1] <= data_len):
            raise bad(path, f"tensor {name!r:.60} has data_offsets {str(offsets)[:80]}, not [begin, end] "
                            f"inside the file's {data_len} data bytes")
        nbytes = math.prod(shape) * _ST_DTYPES[dtype]
        if nbytes != offsets[1] - offsets[0]:
            raise bad(path, f"tensor {name!r:.60} has shape {shape} of {dtype} ({nbytes} bytes), but its data "
                            f"span holds {offsets[1] - offsets[0]} bytes")
        spans.append((offsets[0], offsets[1]))
    end = 0
    for begin, stop in sorted(spans):
        if begin != end:
            raise bad(path, f"its tensors' data overlap or leave a gap at byte {min(begin, end)}")
        end = stop
    if end != data_len:
        raise bad(path, f"its tensors cover {end} of the file's {data_len} data bytes")


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


def _decode(obj: Any, tensors: Mapping[str, Any], file: Path, where: str = "data") -> Any:
    """Inverse of :func:`_encode`; every marker dict is checked (see the module docstring) and a
    malformed one refused with a :class:`ConfigError` naming ``file`` and the place in it."""
    if isinstance(obj, list):
        return [_decode(v, tensors, file, f"{where}[{i}]") for i, v in enumerate(obj)]
    if not isinstance(obj, dict):
        return obj
    markers = [m for m in _MARKERS if m in obj]
    if not markers:
        return {k: _decode(v, tensors, file, f"{where}.{k}") for k, v in obj.items()}
    marker = markers[0]
    if set(obj) != _MARKER_KEYS[marker]:
        raise damaged(file, f"the {marker} entry at {where} has keys {sorted(obj)[:6]}, expected "
                             f"{sorted(_MARKER_KEYS[marker])}")
    value = obj[marker]
    if marker == "__tensor__":
        if not isinstance(value, str) or value not in tensors:
            raise ConfigError(f"{file} refers to tensor {value!r:.40} at {where}, which its .safetensors file lacks: "
                              "the checkpoint is incomplete or its two files come from different saves. Save the "
                              "run again, or restore it from a good copy.")
        return tensors[value]
    if marker == "__tuple__":
        if not isinstance(value, list):
            raise damaged(file, f"the __tuple__ at {where} holds a {type(value).__name__}, not a list")
        return tuple(_decode(v, tensors, file, f"{where}[{i}]") for i, v in enumerate(value))
    if marker == "__items__":
        if not isinstance(value, list):
            raise damaged(file, f"the __items__ at {where} holds a {type(value).__name__}, not a list of pairs")
        out = {}
        for i, pair in enumerate(value):
            if not isinstance(pair, list) or len(pair) != 2:
                raise damaged(file, f"item {i} of the __items__ at {where} is {str(pair)[:60]}, "
                                    "not a [key, value] pair")
            key = _decode(pair[0], tensors, file, f"{where} key {i}")
            try:
                hash(key)
            except TypeError:
                raise damaged(file, f"item {i} of the __items__ at {where} has the key {str(pair[0])[:60]}, which "
                                     "cannot key a dict (a list or dict)") from None
            out[key] = _decode(pair[1], tensors, file, f"{where}[{key!r:.40}]")
        return out
    return _decode_ndarray(obj, file, where)


def _decode_ndarray(obj: dict[str, Any], file: Path, where: str) -> Any:
    """An ``{"__ndarray__", "dtype", "shape"}`` dict as an array: the dtype from the allow-list and
    the shape's size checked before any array is built, then the data checked against both."""
    import numpy as np

    dtype, shape, data = obj["dtype"], obj["shape"], obj["__ndarray__"]
    if not isinstance(dtype, str) or not _NDARRAY_DTYPE.fullmatch(dtype):
        raise damaged(file, f"the array at {where} has dtype {dtype!r:.40}; only bool, int, uint and float "
                             "arrays (such as '<u4', '<f8') are read")
    if (not isinstance(shape, list) or len(shape) > _MAX_NDIM
            or not all(type(d) is int and d >= 0 for d in shape)):
        raise damaged(file, f"the array at {where} has shape {str(shape)[:80]}, not a list of at most {_MAX_NDIM} "
                             "non-negative integers")
    size = math.prod(shape)
    if size > MAX_ARRAY_ELEMENTS:
        raise damaged(file, f"the array at {where} has shape {shape}, {size} elements, more than the "
                             f"{MAX_ARRAY_ELEMENTS} a state file can hold")
    count, stack = 0, [data]
    while stack:  # every leaf a number, counted before NumPy sees the data
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, (bool, int, float)):
            count += 1
        else:
            raise damaged(file, f"the array at {where} holds a {type(node).__name__}, not only numbers")
    if count != size:
        raise damaged(file, f"the array at {where} holds {count} numbers, but its shape {shape} needs {size}")
    try:
        array = np.array(data, dtype=np.dtype(dtype))
        return array.reshape(shape)
    except (TypeError, ValueError, OverflowError) as exc:  # ragged lists, a value out of the dtype's range
        raise damaged(file, f"the array at {where} is not a {shape} array of {dtype} ({_first_line(exc)})") from exc


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

    Safetensors holds raw tensor bytes behind a JSON header, so reading it runs no code. The
    file type and the header (dtypes, shapes, offsets) are checked here before the library
    reads it (see the module docstring)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    _check_safetensors(path)  # before the library opens it: a FIFO would block, a forged header mislead
    try:
        return load_file(str(path), device="cpu")
    except (SafetensorError, ValueError, OSError) as exc:
        raise ConfigError(f"{path} is not a safetensors file ({_first_line(exc)}); it was not written by "
                          "collab_env or is damaged. Save it again, or restore it from a good copy.") from exc


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
            refused unread), not regular files, not JSON/safetensors, too
            large or too deeply nested, malformed (see the module docstring), or do not match.
    """
    folder = Path(folder)
    file = folder / f"{name}.json"
    if stat_regular(file) is None:  # a FIFO, device or folder in its place is refused here
        refuse_legacy(folder / f"{name}.pt")
        raise ConfigError(f"{file} is missing; pass a folder collab_env saved (it writes {name}.json and "
                          f"{name}.safetensors).")
    blob = parse_json(read_regular(file, MAX_JSON_BYTES), file)
    if not isinstance(blob, dict) or blob.get("format") != FORMAT or set(blob) != {"format", "data"}:
        found = blob.get("format") if isinstance(blob, dict) else type(blob).__name__
        raise ConfigError(f"{file} is not a collab_env state file (format {found!r:.60}, expected {FORMAT!r}, and "
                          "only the keys format and data); pass a file save_safe() wrote.")
    tensors = load_tensors(folder / f"{name}.safetensors")
    return _decode(blob["data"], tensors, file)


def refuse_legacy(file: str | Path) -> None:
    """Raise a one-line :class:`ConfigError` when ``file`` (an old pickle: ``*.pt``) exists; the
    file is never opened. Returns when there is no such file."""
    file = Path(file)
    if file.exists():
        raise ConfigError(
            f"{file} is in the old pickle format (torch.save), which is not supported: a pickle can run code "
            "when it is read, so it was not read; save the run again with this version."
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


def restore_rng(state: Mapping[str, Any], generator: Any = None, *, source: str = "the RNG state") -> None:
    """Inverse of :func:`capture_rng`. Every state is checked first (:func:`check_rng`), so a bad
    one changes no generator.

    Raises:
        ConfigError: A state is malformed or out of range; the message names ``source``.
    """
    import numpy as np
    import torch

    check_rng(state, generator, source=source)
    python = state["python"]
    random.setstate((python[0], tuple(python[1]), python[2]))
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(list(state["cuda"]))
    if generator is not None and "generator" in state:
        generator.bit_generator.state = state["generator"]


def _is_uint(x: Any, bits: int) -> bool:
    return type(x) is int and 0 <= x < 2**bits


def _uint_array(x: Any, n: int, bits: int) -> bool:
    """``x`` is ``n`` unsigned ``bits``-bit integers (a NumPy array or a list)."""
    import numpy as np

    if isinstance(x, np.ndarray):
        if x.dtype.kind not in "iu" or x.shape != (n,):
            return False
        return bool(n == 0 or (int(x.min()) >= 0 and int(x.max()) < 2**bits))
    return isinstance(x, (list, tuple)) and len(x) == n and all(_is_uint(v, bits) for v in x)


def _check_bit_generator(st: Any, name: str) -> str | None:
    """What is wrong with a NumPy bit generator ``state`` dict for class ``name``, or ``None``.

    The ranges NumPy itself does not check (it would then read outside the key: MT19937's
    ``pos``, Philox's ``buffer_pos``) are checked here; the rest by a trial on a fresh one."""
    if not isinstance(st, dict) or st.get("bit_generator") != name or not isinstance(st.get("state"), dict):
        found = st.get("bit_generator") if isinstance(st, dict) else type(st).__name__
        return f"it is not a {name} state dict (found {str(found)[:40]})"
    inner = st["state"]
    if name == "MT19937":
        if not _uint_array(inner.get("key"), 624, 32):
            return "its key is not 624 unsigned 32-bit integers"
        if not (type(inner.get("pos")) is int and 0 <= inner["pos"] <= 624):
            return f"its position {str(inner.get('pos'))[:40]} is outside 0..624"
    elif name == "Philox":
        if not (type(st.get("buffer_pos")) is int and 0 <= st["buffer_pos"] <= 4):
            return f"its buffer position {str(st.get('buffer_pos'))[:40]} is outside 0..4"
    elif name in ("PCG64", "PCG64DXSM"):
        if not (_is_uint(inner.get("state"), 128) and _is_uint(inner.get("inc"), 128)):
            return "its state and inc are not unsigned 128-bit integers"
    for key in ("has_uint32", "uinteger", "has_gauss"):
        if key in st and not _is_uint(st[key], 64):
            return f"its {key} is {str(st[key])[:40]}, not an unsigned integer"
    if "gauss" in st and not (isinstance(st["gauss"], (int, float)) and not isinstance(st["gauss"], bool)):
        return f"its gauss is {str(st['gauss'])[:40]}, not a number"
    return None


def check_rng(state: Any, generator: Any = None, *, source: str = "the RNG state") -> None:
    """Raise a :class:`ConfigError` unless ``state`` is what :func:`capture_rng` returns, every
    part well formed and in range; touches no generator.

    Each part is checked for structure and ranges, then tried on a fresh generator of its kind
    (a throwaway ``random.Random``, ``RandomState``, ``torch.Generator``, bit generator), so
    :func:`restore_rng` cannot fail half-way or leave a generator reading outside its state.
    ``source`` (the file, usually) names the state in the message.
    """
    import numpy as np
    import torch

    def bad(part: str, what: str) -> ConfigError:
        return damaged(source, f"its {part} RNG state is invalid: {what}")

    if not isinstance(state, Mapping) or not {"python", "numpy", "torch"} <= set(state):
        raise damaged(source, "its rng entry is not a dict with python, numpy and torch states")
    python = state["python"]
    if not (isinstance(python, (list, tuple)) and len(python) == 3):
        raise bad("Python", "not a (version, internal state, gauss) triple")
    version, internal, gauss = python
    if type(version) is not int or version != 3:
        raise bad("Python", f"version {str(version)[:40]}, expected 3")
    if not (isinstance(internal, (list, tuple)) and len(internal) == 625
            and all(_is_uint(v, 32) for v in internal[:624]) and type(internal[624]) is int
            and 0 <= internal[624] <= 624):
        raise bad("Python", "not 624 unsigned 32-bit integers and a position in 0..624")
    if gauss is not None and not isinstance(gauss, float):
        raise bad("Python", f"gauss_next is {str(gauss)[:40]}, not a float or None")
    problem = _check_bit_generator(state["numpy"], "MT19937")
    if problem:
        raise bad("NumPy", problem)
    reference = torch.get_rng_state()
    t = state["torch"]
    if not (isinstance(t, torch.Tensor) and t.dtype == torch.uint8 and t.shape == reference.shape):
        raise bad("torch", f"not a uint8 tensor of {reference.numel()} bytes")
    cuda = state.get("cuda")
    if cuda is not None:
        if not (isinstance(cuda, (list, tuple)) and all(
                isinstance(c, torch.Tensor) and c.dtype == torch.uint8 and c.dim() == 1 for c in cuda)):
            raise bad("CUDA", "not a list of uint8 tensors")
        if torch.cuda.is_available():
            if len(cuda) > torch.cuda.device_count():
                raise bad("CUDA", f"{len(cuda)} GPU states for {torch.cuda.device_count()} GPU(s): resume on as "
                                  "many GPUs as the run that saved it")
            for i, c in enumerate(cuda):
                if c.numel() != torch.cuda.get_rng_state(i).numel():
                    want = torch.cuda.get_rng_state(i).numel()
                    raise bad("CUDA", f"GPU {i}'s state is {c.numel()} bytes, not {want}")
    gen_state = state.get("generator")
    if generator is not None and "generator" in state:
        problem = _check_bit_generator(gen_state, type(generator.bit_generator).__name__)
        if problem:
            raise bad("trainer generator", problem)
    # Trials on fresh generators: what the checks above do not cover is NumPy's and torch's to judge.
    trials = [("Python", lambda: random.Random().setstate((version, tuple(internal), gauss))),
              ("NumPy", lambda: np.random.RandomState().set_state(state["numpy"])),
              ("torch", lambda: torch.Generator().set_state(t))]
    if generator is not None and "generator" in state:
        def trial_generator() -> None:
            type(generator.bit_generator)().state = gen_state
        trials.append(("trainer generator", trial_generator))
    for part, trial in trials:
        try:
            trial()
        except (TypeError, ValueError, OverflowError, KeyError, IndexError, RuntimeError) as exc:
            raise bad(part, _first_line(exc)) from exc


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

    Everything is checked before anything is changed: the files (see the module docstring),
    each model's parameter names and shapes, its reference weights, and every RNG state.

    Raises:
        ConfigError: ``path`` is not a checkpoint folder, holds an old pickle checkpoint
            (refused unread; see :func:`refuse_legacy`), a damaged or forged file, or does not fit
            ``models``.
    """
    import torch

    path = Path(path)
    file = path / STATE_FILE
    if not path.is_dir():
        raise ConfigError(f"{path} is not a folder; pass the checkpoint folder save_checkpoint() wrote.")
    if stat_regular(file) is None:
        refuse_legacy(path / LEGACY_STATE_FILE)
        raise ConfigError(f"{path} is not a checkpoint folder (no {STATE_FILE}); "
                          "pass the folder save_checkpoint() wrote.")
    blob = load_safe(path, STATE_NAME)
    if not isinstance(blob, dict) or not {"models", "state", "rng"} <= set(blob):
        raise ConfigError(f"{file} is not a trainer checkpoint (it needs models, state and rng); pass the folder "
                          "save_checkpoint() wrote.")
    if not isinstance(blob["models"], list) or not isinstance(blob["state"], dict):
        raise damaged(file, "its models entry is not a list or its state entry not a dict")
    if len(blob["models"]) != len(models):
        raise ConfigError(
            f"the checkpoint holds {len(blob['models'])} model(s), this trainer has {len(models)}: build the "
            "trainer with the same agents and share_model setting as the run that saved it."
        )
    for k, (pm, saved) in enumerate(zip(models, blob["models"], strict=True)):
        if not isinstance(saved, dict) or not {"params", "optimizer", "scheduler", "reference"} <= set(saved):
            raise damaged(file, f"model {k}'s entry is not a dict of params, optimizer, scheduler and reference")
        params = dict(pm.trainable_parameters())
        if not isinstance(saved["params"], dict) or set(params) != set(saved["params"]):
            raise ConfigError("the checkpoint's trainable parameters do not match this model "
                              "(other model or LoRA setting?).")
        check_tensors(file, f"model {k}'s parameter", saved["params"], {n: p.shape for n, p in params.items()})
        if saved["reference"] is not None and pm.reference is not None:
            want = {n: t.shape for n, t in pm.reference.state_dict().items()}
            if not isinstance(saved["reference"], dict) or set(saved["reference"]) != set(want):
                raise ConfigError(f"{file}: model {k}'s reference weights do not match this model's (other model or "
                                  "config?); build the trainer as the saving run did.")
            check_tensors(file, f"model {k}'s reference weight", saved["reference"], want)
        for part in ("optimizer", "scheduler"):
            if saved[part] is not None and not isinstance(saved[part], dict):
                raise damaged(file, f"model {k}'s {part} state is a {type(saved[part]).__name__}, not a dict")
    check_rng(blob["rng"], generator, source=str(file))
    for k, (pm, saved) in enumerate(zip(models, blob["models"], strict=True)):
        params = dict(pm.trainable_parameters())
        with torch.no_grad():
            for n, p in params.items():
                p.copy_(saved["params"][n].to(p.device, p.dtype))
        try:
            if saved["optimizer"] is not None and pm.optimizer is not None:
                pm.optimizer.load_state_dict(saved["optimizer"])
            if saved["scheduler"] is not None and pm.scheduler is not None:
                pm.scheduler.load_state_dict(saved["scheduler"])
        except (KeyError, ValueError, TypeError, IndexError, AttributeError, RuntimeError) as exc:
            raise ConfigError(
                f"{file}: model {k}'s optimiser or scheduler state does not fit this trainer ({_first_line(exc)}); "
                "build the trainer with the same optimiser and schedule as the saving run, and build it again "
                "before retrying (this model may be partly loaded)."
            ) from exc
        if saved["reference"] is not None and pm.reference is not None:
            pm.reference.load_state_dict(saved["reference"])
    restore_rng(blob["rng"], generator, source=str(file))
    return dict(blob["state"])


def check_tensors(file: Path, what: str, got: Mapping[str, Any], shapes: Mapping[str, Any]) -> None:
    """Each ``got[name]`` is a tensor of shape ``shapes[name]`` (checked before any is copied)."""
    import torch

    for n, shape in shapes.items():
        t = got[n]
        if not isinstance(t, torch.Tensor):
            raise damaged(file, f"{what} {n} is a {type(t).__name__}, not a tensor")
        if t.shape != shape:
            raise ConfigError(f"{file}: {what} {n} has shape {list(t.shape)}, this model's has {list(shape)} (other "
                              "model or config?); build the trainer as the saving run did.")

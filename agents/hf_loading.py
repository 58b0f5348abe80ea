"""The model of the transformers backend (:mod:`collab_env.agents.hf`): loading it, and what it takes.

:func:`load_causal_lm` takes what a user passes as ``model`` (a folder or hub id, a loaded
model, a ``PeftModel``, or ``"embedded"``), the tokenizer, the device, the dtype and an optional
LoRA adapter, and returns the model placed and typed as asked, its tokenizer and a short label
for names. :func:`eos_token_ids` collects every id that ends a completion;
:func:`forward_accepts` and :func:`cache_keyword` read which keywords the installed
transformers' ``forward`` takes; :func:`plain_layers` says whether a KV cache can be cropped,
repeated and reused as is.

torch and transformers are imported inside the functions: importing this module is cheap.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from collab_env.agents.base import EMBEDDED_NAMES
from collab_env.errors import ConfigError, require

__all__ = ["DEVICES", "DTYPES", "load_causal_lm", "load_weights", "load_tokenizer", "eos_token_ids",
           "check_device_and_dtype", "forward_accepts", "cache_keyword", "plain_layers"]

#: Accepted ``device`` values.
DEVICES = ("auto", "cpu", "cuda")
#: Accepted ``dtype`` values.
DTYPES = ("auto", "float32", "bfloat16", "float16")


def check_device_and_dtype(device: str, dtype: str) -> None:
    """Raise a ConfigError listing the choices when ``device`` or ``dtype`` is not one."""
    if device not in DEVICES:
        raise ConfigError(f"device must be one of {DEVICES}, got {device!r}.")
    if dtype not in DTYPES:
        raise ConfigError(f"dtype must be one of {DTYPES}, got {dtype!r}.")


def load_causal_lm(model: Any, tokenizer: Any, *, device: str, dtype: str, adapter: Any) -> tuple[Any, Any, str]:
    """``(model, tokenizer, label)`` for the transformers backend.

    Args:
        model: A folder or hub id, a loaded ``PreTrainedModel`` (or ``PeftModel``), or one of
            :data:`~collab_env.agents.base.EMBEDDED_NAMES`.
        tokenizer: A tokenizer, a folder/hub id, or ``None`` (loaded from ``model``'s folder).
        device: ``"auto"`` (CUDA when available, else CPU; a loaded model stays where it is),
            ``"cpu"`` or ``"cuda"``.
        dtype: ``"auto"`` (bfloat16 on CUDA where supported, float16 on older GPUs, float32 on
            CPU; a loaded model keeps its dtype) or a torch dtype name.
        adapter: ``None``, a PEFT LoRA adapter folder (loaded onto the model) or a ``PeftModel``
            (used as the model).

    Returns:
        The model, the tokenizer and the label: the model folder's name (``+<adapter folder>``
        when an adapter folder was loaded), else the model's class name.

    Raises:
        ConfigError: The model or tokenizer cannot be loaded, or an argument is not accepted.
        MissingDependencyError: torch, transformers or (for an adapter) peft is missing.
    """
    check_device_and_dtype(device, dtype)
    torch = require("torch", "hf", "HFPolicy")
    require("transformers", "hf", "HFPolicy")
    target_device = device
    if device == "auto":
        target_device = "cuda" if torch.cuda.is_available() else "cpu"
    elif device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device='cuda' but torch sees no CUDA device; use device='cpu' or 'auto'.")
    if dtype != "auto":
        torch_dtype = getattr(torch, dtype)
    elif target_device == "cuda":
        torch_dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    else:
        torch_dtype = torch.float32  # bf16 matmuls on CPU are slow and coarse

    # A model the caller loaded keeps its dtype and device unless asked otherwise.
    loaded, source, label = load_weights(
        model, torch_dtype, cast_loaded=dtype != "auto",
        invalid=f"model must be a folder, a hub id, a loaded transformers model or one of {EMBEDDED_NAMES}")
    if isinstance(model, (str, Path)) or device != "auto":
        loaded.to(target_device)

    if adapter is not None:
        peft = require("peft", "hf", "Loading a LoRA adapter (adapter=...)")
        if isinstance(adapter, peft.PeftModel):
            loaded = adapter
        elif isinstance(adapter, (str, Path)):
            loaded = peft.PeftModel.from_pretrained(loaded, str(adapter))
            label += f"+{Path(adapter).name}"
        else:
            raise ConfigError(
                f"adapter must be a PEFT adapter folder or a PeftModel, got {type(adapter).__name__}."
            )

    return loaded, load_tokenizer(tokenizer, source, "pass tokenizer=..."), label


def load_weights(model: Any, torch_dtype: Any, *, cast_loaded: bool, invalid: str) -> tuple[Any, str, str]:
    """``(model, source, label)``: the causal LM of ``model`` (a folder or hub id, one of
    :data:`~collab_env.agents.base.EMBEDDED_NAMES`, or a loaded model, cast to ``torch_dtype``
    when ``cast_loaded``), where it was loaded from (``""`` when unknown) and its label (the
    folder's name, else the class name). The one loader of the HF backend and the learners.

    Raises:
        ConfigError: The folder holds no causal LM, or ``model`` is none of these (``invalid``
            says what was expected).
    """
    from transformers import AutoModelForCausalLM

    if isinstance(model, str) and model in EMBEDDED_NAMES:
        from collab_env.agents.embedded import embedded_model_dir

        model = embedded_model_dir()
    if isinstance(model, (str, Path)):
        source = str(model)
        # A path (not a hub id "org/name"): say the folder is missing, not the hub's id rules.
        looks_local = isinstance(model, Path) or source.startswith(("./", "../", "/", "~"))
        if looks_local and not Path(source).expanduser().exists():
            raise ConfigError(f"no model folder at {source!r} ({Path(source).expanduser().resolve()} does not exist): "
                              "pass the folder a trainer saved (it holds config.json), a hub id, or 'embedded'.")
        if looks_local:
            source = str(Path(source).expanduser())
        try:
            loaded = AutoModelForCausalLM.from_pretrained(source, dtype=torch_dtype)
        except (OSError, ValueError) as exc:  # ValueError: a folder without a model's config.json
            raise ConfigError(
                f"could not load a causal LM from {source!r}: {exc}. Pass a local model folder "
                "(the hub is not reachable offline), a loaded model, or 'embedded'."
            ) from exc
        return loaded, source, Path(source).name or source
    if hasattr(model, "generate") and hasattr(model, "config"):
        source = getattr(model, "name_or_path", None) or getattr(model.config, "_name_or_path", None) or ""
        if cast_loaded:
            model.to(dtype=torch_dtype)
        return model, source, Path(source).name if source else type(model).__name__
    raise ConfigError(f"{invalid}, got {type(model).__name__}.")


def load_tokenizer(tokenizer: Any, source: str, hint: str) -> Any:
    """The tokenizer: ``tokenizer`` itself, loaded from it (a folder or hub id), or from the
    model's ``source`` when ``None``.

    Raises:
        ConfigError: It cannot be loaded, or it is ``None`` and the model's source is unknown
            (``hint`` says how to pass one).
    """
    from transformers import AutoTokenizer

    if tokenizer is None:
        if not source:
            raise ConfigError(f"cannot tell where this model was loaded from; {hint}")
        tokenizer = source
    if isinstance(tokenizer, (str, Path)):
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(tokenizer))
        except OSError as exc:
            raise ConfigError(f"could not load a tokenizer from {str(tokenizer)!r}: {exc}") from exc
    return tokenizer


def eos_token_ids(tokenizer: Any, model: Any) -> list[int]:
    """Every id that ends a completion: the tokenizer's EOS and the model's generation config's
    (one id or a list), in that order, without repeats."""
    ids: list[int] = []
    candidates = [tokenizer.eos_token_id, getattr(model.generation_config, "eos_token_id", None)]
    for c in candidates:
        for i in c if isinstance(c, (list, tuple)) else [c]:
            if i is not None and int(i) not in ids:
                ids.append(int(i))
    return ids


def _class_forward(model: Any) -> Any:
    """The ``forward`` of the (base) model's class: its signature says which keywords the
    installed transformers takes (an instance attribute wrapping it does not hide them)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return type(base).forward


def forward_accepts(model: Any, name: str) -> bool:
    """Whether the forward of ``model``'s class (the base model's, under PEFT) takes ``name``."""
    import inspect

    return name in inspect.signature(_class_forward(model)).parameters


def cache_keyword(model: Any) -> str:
    """The forward keyword of a KV cache: ``cache`` in recent transformers, where
    ``past_key_values`` is deprecated, ``past_key_values`` before."""
    return "cache" if forward_accepts(model, "cache") else "past_key_values"


def plain_layers(cache: Any) -> bool:
    """Whether ``cache`` is a transformers cache whose layers are all plain full-attention
    ``DynamicLayer`` (what can be cropped, repeated and reused as is)."""
    layers = getattr(cache, "layers", None)
    if not layers:
        return False
    return all(type(layer).__name__ == "DynamicLayer" for layer in layers)

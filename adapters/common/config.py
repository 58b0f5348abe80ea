"""Config fields every trainer shares, their validation, and the evaluation schedule.

A learner's config is a dataclass that inherits :class:`TrainerConfig` and adds its own fields,
each with one docstring; ``__post_init__`` validates every field and raises
:class:`~collab_env.errors.ConfigError` with the fix in the message.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar, Literal

from collab_env.errors import ConfigError, did_you_mean

__all__ = ["TrainerConfig", "ConfigMeta", "PRESETS", "as_bool", "check_comlrl_rollout_fields", "eval_due", "check_int", "check_float", "check_choice"]

#: Names ``preset=`` accepts.
PRESETS: tuple[str, ...] = ("comlrl",)


def check_int(name: str, value: Any, low: int | None = None, *, allow_none: bool = False) -> None:
    """Raise :class:`ConfigError` unless ``value`` is an int (not a bool) ``>= low``."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ConfigError(f"{name} must be an int, got {type(value).__name__} ({value!r}).")
    if low is not None and value < low:
        raise ConfigError(f"{name} must be >= {low}, got {value}.")


def check_float(name: str, value: Any, low: float | None = None, high: float | None = None, *,
                low_open: bool = False, allow_none: bool = False) -> None:
    """Raise :class:`ConfigError` unless ``value`` is a finite real in the given range."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ConfigError(f"{name} must be a finite number, got {value!r}.")
    if low is not None and (value <= low if low_open else value < low):
        raise ConfigError(f"{name} must be {'>' if low_open else '>='} {low}, got {value}.")
    if high is not None and value > high:
        raise ConfigError(f"{name} must be <= {high}, got {value}.")


def check_choice(name: str, value: Any, choices: tuple[Any, ...]) -> None:
    """Raise :class:`ConfigError` unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise ConfigError(f"{name} must be one of {list(choices)}, got {value!r}.")


class ConfigMeta(type):
    """Metaclass of the learners' configs: it reads the keywords before the dataclass does.

    * **CoMLRL's field names** (``ALIASES``: e.g. ``agent_learning_rate``) become the field
      they mean here (``learning_rate``); giving both with different values is an error.
    * **Unknown names** raise :class:`~collab_env.errors.ConfigError` with the closest valid
      names (the dataclass itself would raise a bare ``TypeError``).
    * **Presets**: ``preset="comlrl"`` fills every field the caller did not pass with
      ``COMLRL_DEFAULTS`` (CoMLRL's defaults for that trainer); passed fields win.
    """

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        names = [f.name for f in fields(cls) if f.init]
        if len(args) > len(names):
            raise ConfigError(f"{cls.__name__} takes at most {len(names)} positional values, got {len(args)}.")
        for name, value in zip(names, args, strict=False):  # fewer values than fields
            if name in kwargs:
                raise ConfigError(f"{cls.__name__} got {name!r} both positionally and by keyword.")
            kwargs[name] = value
        aliases = cls.aliases()
        for alias in [k for k in kwargs if k in aliases and k not in names]:
            target, convert = aliases[alias]
            value = convert(kwargs.pop(alias))
            if target in kwargs and kwargs[target] != value:
                raise ConfigError(
                    f"{cls.__name__} got {alias}={value!r} (CoMLRL's name) and {target}={kwargs[target]!r}, "
                    f"which mean the same field: pass one of them."
                )
            kwargs[target] = value
        for key in kwargs:
            if key not in names:
                raise ConfigError(
                    f"{cls.__name__} has no field {key!r}.{did_you_mean(key, [*names, *aliases])} "
                    "Every field is listed in the class docstring and README's Training section."
                )
        preset = kwargs.get("preset")
        if preset is not None:
            if preset not in PRESETS:
                raise ConfigError(f"preset must be None or one of {list(PRESETS)}, got {preset!r}.")
            defaults = cls.COMLRL_DEFAULTS
            if not defaults:
                raise ConfigError(
                    f"{cls.__name__} has no CoMLRL counterpart, so preset='comlrl' has nothing to "
                    "reproduce; remove preset."
                )
            for name, value in defaults.items():
                kwargs.setdefault(name, value)
        return super().__call__(**kwargs)


def as_bool(name: str) -> Callable[[Any], bool]:
    """A converter for :attr:`TrainerConfig.ALIASES` that accepts only ``True``/``False``."""

    def convert(value: Any) -> bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{name} must be True or False, got {value!r}.")
        return value

    return convert


def check_comlrl_rollout_fields(cfg: Any) -> None:
    """Validate the rollout fields that MAGRPO-style and actor-critic configs both take from
    CoMLRL (``logprob_temperature``, ``prompt_format``, ``early_termination_threshold``,
    ``external_prompt_passthrough``, ``reference_kl_*``, ``rollout_buffer_size``,
    ``train_batch_size``); each config checks how the buffer fields combine itself."""
    check_float("logprob_temperature", cfg.logprob_temperature, 0.0, low_open=True, allow_none=True)
    check_choice("prompt_format", cfg.prompt_format, ("chat", "raw"))
    check_float("early_termination_threshold", cfg.early_termination_threshold, allow_none=True)
    if cfg.external_prompt_passthrough not in (None, True, False):
        raise ConfigError(
            f"external_prompt_passthrough must be True, False or None, got {cfg.external_prompt_passthrough!r}.")
    as_bool("reference_kl_enabled")(cfg.reference_kl_enabled)
    check_float("reference_kl_coef", cfg.reference_kl_coef, 0.0)
    check_int("rollout_buffer_size", cfg.rollout_buffer_size, 1, allow_none=True)
    check_int("train_batch_size", cfg.train_batch_size, 1, allow_none=True)


@dataclass
class TrainerConfig(metaclass=ConfigMeta):
    """Fields shared by every torch learner of :mod:`collab_env.adapters` (optimisation, model
    placement, evaluation and logging schedule, checkpoints). Learner configs inherit it.

    CoMLRL's field names are accepted where they mean a field of ours (``ALIASES``; e.g.
    ``agent_learning_rate`` is ``learning_rate``, and reads back as a property), and
    ``preset="comlrl"`` sets CoMLRL's defaults (``COMLRL_DEFAULTS``) for every field not passed.
    """

    ALIASES: ClassVar[dict[str, tuple[str, Callable[[Any], Any]]]] = {
        "agent_learning_rate": ("learning_rate", lambda v: v),
    }
    """CoMLRL name -> (our field, converter of the value)."""
    COMLRL_DEFAULTS: ClassVar[dict[str, Any]] = {}
    """Our field -> CoMLRL's default, for ``preset="comlrl"`` (empty: no CoMLRL counterpart)."""

    @classmethod
    def aliases(cls) -> dict[str, tuple[str, Callable[[Any], Any]]]:
        """Every CoMLRL alias the class accepts (its own and its bases')."""
        out: dict[str, tuple[str, Callable[[Any], Any]]] = {}
        for klass in reversed(cls.__mro__):
            out.update(klass.__dict__.get("ALIASES", {}))
        return out

    @property
    def agent_learning_rate(self) -> float:
        """CoMLRL's name of :attr:`learning_rate`."""
        return self.learning_rate

    preset: str | None = None
    """``"comlrl"``: every field not passed takes CoMLRL's default for this trainer (the
    README's Training section lists where they differ from ours and why)."""

    # -- data and schedule ------------------------------------------------------------------
    num_train_epochs: int = 1
    """Passes over the training items."""
    max_steps: int = -1
    """Stop after this many training items (``-1``: run every epoch to the end). Needed for
    environments whose item count is unlimited."""
    per_device_train_batch_size: int = 1
    """Training items rolled out together per update (the guide's value is 1)."""
    seed: int = 0
    """Seed of every random choice the trainer makes (sampling, LoRA init): a fixed seed on CPU
    gives the same run bit for bit, also across a checkpoint and resume."""

    # -- optimisation -----------------------------------------------------------------------
    learning_rate: float = 1e-5
    """AdamW learning rate (peak value of the schedule)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    adam_beta1: float = 0.9
    """AdamW beta1."""
    adam_beta2: float = 0.999
    """AdamW beta2."""
    adam_epsilon: float = 1e-8
    """AdamW epsilon."""
    optim: Literal["adamw_torch_fused", "adamw_torch"] = "adamw_torch_fused"
    """The AdamW implementation (the names of transformers' ``TrainingArguments.optim``, whose
    default TRL uses): ``"adamw_torch_fused"`` is torch's fused kernel (several times faster
    per step on CPU for a 135M model), ``"adamw_torch"`` the plain one. The same update up to
    float rounding."""
    max_grad_norm: float | None = 1.0
    """Clip the gradient's global norm to this value per optimiser step (``None``: no clipping)."""
    lr_scheduler_type: Literal["constant", "linear", "cosine"] = "constant"
    """Learning-rate schedule after warm-up: constant, linear decay to 0, or cosine decay to 0
    over the planned optimiser steps."""
    warmup_steps: int = 0
    """Optimiser steps of linear warm-up from 0 to ``learning_rate``."""

    # -- models -----------------------------------------------------------------------------
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where models train and generate: ``"auto"`` is CUDA when torch sees a GPU, else CPU."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Parameter dtype: ``"auto"`` is bfloat16 on CUDA and float32 on CPU. Losses are always
    computed in float32."""
    gradient_checkpointing: bool | None = None
    """Recompute activations in the backward pass to save memory (``None``: on for CUDA)."""
    share_model: bool = False
    """One model (and optimiser) for every agent instead of one copy per agent."""
    generation_backend: Literal["auto", "hf", "vllm"] = "auto"
    """What samples the rollouts: ``"hf"`` (transformers, on the model itself), ``"vllm"`` (a
    vLLM engine holding a copy of the weights, updated after every optimiser step;
    :mod:`~collab_env.adapters.common.vllm_engine`) or ``"auto"`` (vLLM on CUDA when it is
    installed, else transformers)."""
    vllm_engine_kwargs: dict | None = None
    """``vllm.EngineArgs`` fields for the generation engine (``gpu_memory_utilization``,
    ``max_model_len``, ``dtype``...)."""
    lora_r: int = 0
    """LoRA rank; ``0`` trains every parameter. Needs ``peft``."""
    lora_alpha: float = 16.0
    """LoRA scaling numerator (the update is scaled by ``lora_alpha / lora_r``)."""
    lora_dropout: float = 0.0
    """Dropout on the LoRA branch."""
    lora_target_modules: tuple[str, ...] | str = "all-linear"
    """Modules that get LoRA adapters: names, or ``"all-linear"``."""

    # -- evaluation, logging, checkpoints -----------------------------------------------------
    eval_interval: int = 16
    """Evaluate before the first item of every epoch, then every ``eval_interval`` training
    items; ``0`` evaluates only when ``evaluate()`` is called."""
    eval_num_samples: int = 4
    """Evaluation items used (at most), from the start of the evaluation split."""
    eval_batch_size: int = 1
    """Evaluation items rolled out together (not the number of samples per agent)."""
    logging_steps: int = 1
    """Smallest ``env_step`` interval between two training log lines (``env_step`` counts the
    joint-action reward evaluations)."""
    output_dir: str = "collab_env_output"
    """Folder of the JSONL log, the PNG curves and the checkpoints."""
    save_steps: int = 0
    """Save a checkpoint every this many training items (``0``: only when asked)."""
    plot: bool = True
    """Write the curves as ``<output_dir>/curves.png`` (needs matplotlib; skipped with a warning
    when it is missing)."""
    untrained_sampling: Any = None
    """Sampling of the untrained players' policies (a user simulator, a partner) in the env
    path's rollouts: ``None`` keeps each policy's own settings; ``"learner"`` gives them the
    learner's sampling (``temperature``, ``top_p``, ``top_k``, ``max_new_tokens`` of this
    config: one source for the tree, the multiturn-aware futures and the other players); or
    player -> sampling keywords. Keywords passed this way override a policy's own defaults."""

    def __post_init__(self) -> None:
        if self.preset is not None:
            check_choice("preset", self.preset, PRESETS)
        check_int("num_train_epochs", self.num_train_epochs, 1)
        check_int("max_steps", self.max_steps, -1)
        u = self.untrained_sampling
        if u is not None and u != "learner":
            if not isinstance(u, Mapping) or not all(isinstance(v, Mapping) for v in u.values()):
                raise ConfigError("untrained_sampling must be None, 'learner' or player -> {keyword: value}, "
                                  f"got {u!r:.100}.")
            from collab_env.policy import SamplingParams

            for v in u.values():
                SamplingParams.from_kwargs(**v)  # an unknown or invalid keyword is an error now
        if self.max_steps == 0:
            raise ConfigError("max_steps must be -1 (no limit) or >= 1, got 0.")
        check_int("per_device_train_batch_size", self.per_device_train_batch_size, 1)
        check_int("seed", self.seed, 0)
        check_float("learning_rate", self.learning_rate, 0.0)
        check_float("weight_decay", self.weight_decay, 0.0)
        check_float("adam_beta1", self.adam_beta1, 0.0, 1.0)
        check_float("adam_beta2", self.adam_beta2, 0.0, 1.0)
        check_float("adam_epsilon", self.adam_epsilon, 0.0, low_open=True)
        check_choice("optim", self.optim, ("adamw_torch_fused", "adamw_torch"))
        check_float("max_grad_norm", self.max_grad_norm, 0.0, low_open=True, allow_none=True)
        check_choice("lr_scheduler_type", self.lr_scheduler_type, ("constant", "linear", "cosine"))
        check_int("warmup_steps", self.warmup_steps, 0)
        check_choice("device", self.device, ("auto", "cpu", "cuda"))
        check_choice("dtype", self.dtype, ("auto", "float32", "bfloat16", "float16"))
        if self.gradient_checkpointing not in (None, True, False):
            raise ConfigError(f"gradient_checkpointing must be True, False or None, got {self.gradient_checkpointing!r}.")
        check_choice("generation_backend", self.generation_backend, ("auto", "hf", "vllm"))
        if self.vllm_engine_kwargs is not None and not isinstance(self.vllm_engine_kwargs, dict):
            raise ConfigError(f"vllm_engine_kwargs must be a dict of vllm.EngineArgs fields, got {self.vllm_engine_kwargs!r}.")
        check_int("lora_r", self.lora_r, 0)
        check_float("lora_alpha", self.lora_alpha, 0.0, low_open=True)
        check_float("lora_dropout", self.lora_dropout, 0.0, 1.0)
        if isinstance(self.lora_target_modules, list):
            self.lora_target_modules = tuple(self.lora_target_modules)
        if not isinstance(self.lora_target_modules, (str, tuple)) or (
            isinstance(self.lora_target_modules, tuple)
            and not all(isinstance(m, str) for m in self.lora_target_modules)
        ):
            raise ConfigError(
                "lora_target_modules must be 'all-linear' or a list of module names such as "
                f"['q_proj', 'v_proj'], got {self.lora_target_modules!r}."
            )
        check_int("eval_interval", self.eval_interval, 0)
        check_int("eval_num_samples", self.eval_num_samples, 0)
        check_int("eval_batch_size", self.eval_batch_size, 1)
        check_int("logging_steps", self.logging_steps, 1)
        if not isinstance(self.output_dir, str) or not self.output_dir:
            raise ConfigError(f"output_dir must be a non-empty str, got {self.output_dir!r}.")
        check_int("save_steps", self.save_steps, 0)

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly dict of every field (for logs and Weights & Biases)."""
        d = asdict(self)
        for f in fields(self):
            if isinstance(d[f.name], tuple):
                d[f.name] = list(d[f.name])
        return d


def eval_due(item_in_epoch: int, batch_size: int, eval_interval: int) -> bool:
    """Whether the schedule evaluates before the batch of ``batch_size`` training items that
    starts at position ``item_in_epoch`` of its epoch.

    The CoMLRL schedule: before the first item of every epoch, then every ``eval_interval``
    items (a batch that contains such an item triggers it); ``eval_interval == 0`` never.
    """
    if eval_interval <= 0:
        return False
    return any((item_in_epoch + k) % eval_interval == 0 for k in range(batch_size))

"""Config fields in small groups, their validation, and the evaluation schedule.

A learner's config is :class:`TrainerConfig` (the common group: data, optimisation, models,
evaluation and logging) plus only the field groups it uses, and its own fields, each with one
docstring, under :func:`learner_config`::

    @learner_config
    class MAGRPOConfig(SamplingFields, RolloutFields, TreeFields, PPOFields, TrainerConfig): ...

(:class:`TrainerConfig` last, so its fields come first: the positional order and the logged
config start with the common fields, as they always did.)

* :class:`SamplingFields`: ``max_new_tokens``, ``temperature``, ``top_p``, ``top_k``,
  ``eval_greedy``, ``eval_max_new_tokens``; :func:`learner_sampling` makes them one
  :class:`~collab_env.policy.SamplingParams`, the object rollouts take.
* :class:`RolloutFields`: CoMLRL's multi-turn rollout fields (agents, turns, discount, prompt
  format, early termination, reference KL, rollout buffer, micro-batches).
* :class:`TreeFields`: the rollout tree (generations, joint mode, values, loss type, KL, pass@k).
* :class:`PPOFields`: ``num_iterations`` and the ratio clipping.
* :class:`PolicyLossFields`: the menu of policy objectives (PPO's clip, CISPO, GSPO's sequence
  ratio, the two-sided clip), the importance sampling against the sampler and DAPO's dynamic
  sampling (MAGRPO).

No config carries a field it does not use. ``__post_init__`` validates every field (each
group's ``check_group``, then the learner's own checks) and raises
:class:`~collab_env.errors.ConfigError` with the fix in the message.
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar

from collab_env.adapters.common.losses import IS_MODES, LOSS_TYPES
from collab_env.errors import ConfigError, did_you_mean
from collab_env.policy import SamplingParams

__all__ = ["TrainerConfig", "SamplingFields", "RolloutFields", "TreeFields", "PPOFields", "PolicyLossFields",
           "learner_config",
           "learner_sampling", "check_tree_buffer", "PRESETS", "as_bool", "eval_due", "check_int", "check_float",
           "check_choice"]

if TYPE_CHECKING:  # typing.dataclass_transform is 3.11+; the type checker's own copy serves 3.10
    from typing_extensions import dataclass_transform
else:
    def dataclass_transform(**_: Any) -> Callable[[Any], Any]:
        """Only the type checker reads it (PEP 681): at run time the decorator is returned as is."""
        return lambda decorator: decorator

_T = TypeVar("_T")

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
    x = float(value)
    if low is not None and (x <= low if low_open else x < low):
        raise ConfigError(f"{name} must be {'>' if low_open else '>='} {low}, got {value}.")
    if high is not None and x > high:
        raise ConfigError(f"{name} must be <= {high}, got {value}.")


def check_choice(name: str, value: Any, choices: tuple[Any, ...]) -> None:
    """Raise :class:`ConfigError` unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise ConfigError(f"{name} must be one of {list(choices)}, got {value!r}.")


def _keywords(cls: type[TrainerConfig], args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The keywords of ``cls(*args, **kwargs)`` as the dataclass takes them (:func:`learner_config`)."""
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
        if not cls.COMLRL_DEFAULTS:
            raise ConfigError(
                f"{cls.__name__} has no CoMLRL counterpart, so preset='comlrl' has nothing to "
                "reproduce; remove preset."
            )
        for name, value in cls.COMLRL_DEFAULTS.items():
            kwargs.setdefault(name, value)
    return kwargs


@dataclass_transform()
def learner_config(cls: type[_T]) -> type[_T]:
    """Make ``cls`` a learner config: a dataclass whose constructor first reads the keywords.

    * **CoMLRL's field names** (``ALIASES``: e.g. ``agent_learning_rate``) become the field
      they mean here (``learning_rate``); giving both with different values is an error.
    * **Unknown names** raise :class:`~collab_env.errors.ConfigError` with the closest valid
      names (the dataclass itself would raise a bare ``TypeError``).
    * **Presets**: ``preset="comlrl"`` fills every field the caller did not pass with
      ``COMLRL_DEFAULTS`` (CoMLRL's defaults for that trainer); passed fields win.

    Every learner config is decorated with it (a subclass too: the decorator wraps the
    constructor the dataclass writes for that class)."""
    klass = dataclass(cls)
    init = klass.__init__

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, **_keywords(type(self), args, kwargs))

    # Replacing the constructor is the point; written `klass.__init__ = ...`, mypy reads it as
    # monkey-patching a method (method-assign).
    type.__setattr__(klass, "__init__", __init__)
    return klass


def as_bool(name: str) -> Callable[[Any], bool]:
    """A converter for :attr:`TrainerConfig.ALIASES` that accepts only ``True``/``False``."""

    def convert(value: Any) -> bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{name} must be True or False, got {value!r}.")
        return value

    return convert


@learner_config
class TrainerConfig:
    """Fields shared by every torch learner of :mod:`collab_env.adapters` (optimisation, model
    placement, evaluation and logging schedule, checkpoints): the common field group. Learner
    configs inherit it and the other groups they use (module docstring).

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
    parallel_training: Literal["none", "mp"] = "none"
    """CoMLRL's placement mode (``comlrl`` 1.4.3's ``parallel_training``): ``"none"`` puts every
    agent's model on one device; ``"mp"`` puts agent ``i``'s model on ``agent_devices[i]``
    (model parallelism across agents: several models that do not fit one GPU). CoMLRL's ``"mp"``
    also runs the agents' phases in threads; here they run one after another, so ``"mp"`` is a
    placement, the same update, with no overlap between devices. Data parallelism is a separate
    matter: launch the script with ``torchrun`` (:mod:`~collab_env.adapters.common.distributed`);
    ``"mp"`` under several ranks is refused."""
    agent_devices: str | tuple[str, ...] | None = None
    """CoMLRL's ``agent_devices``: torch device names (``"cuda:0"``, ``"cpu"``, ``"auto"``), one
    for every agent or one for all. With ``parallel_training="none"`` only the first is used, for
    every agent (as CoMLRL does); ``None`` is :attr:`device`. ``"mp"`` requires it."""
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
        if not hasattr(type(self).__init__, "__wrapped__"):  # a subclass under a plain @dataclass
            raise TypeError(f"{type(self).__name__} must be decorated with @learner_config, not @dataclass "
                            "(collab_env.adapters.common.config.learner_config): it reads CoMLRL's names and presets.")
        if self.preset is not None:
            check_choice("preset", self.preset, PRESETS)
        check_int("num_train_epochs", self.num_train_epochs, 1)
        check_int("max_steps", self.max_steps, -1)
        u = self.untrained_sampling
        if u is not None and u != "learner":
            if not isinstance(u, Mapping) or not all(isinstance(v, Mapping) for v in u.values()):
                raise ConfigError("untrained_sampling must be None, 'learner' or player -> {keyword: value}, "
                                  f"got {u!r:.100}.")
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
            raise ConfigError("gradient_checkpointing must be True, False or None, "
                              f"got {self.gradient_checkpointing!r}.")
        check_choice("generation_backend", self.generation_backend, ("auto", "hf", "vllm"))
        check_choice("parallel_training", self.parallel_training, ("none", "mp"))
        if isinstance(self.agent_devices, list):
            self.agent_devices = tuple(self.agent_devices)
        devices = self.agent_devices
        if devices is not None and not (
                isinstance(devices, str)
                or (isinstance(devices, tuple) and devices and all(isinstance(d, str) for d in devices))):
            raise ConfigError("agent_devices must be a device name ('cuda:0'), a non-empty list of them "
                              f"(one per agent, or one for all) or None, got {devices!r:.100}.")
        if self.parallel_training == "mp":
            if devices is None:
                raise ConfigError("parallel_training='mp' places each agent's model on its own device: "
                                  "pass agent_devices=['cuda:0', 'cuda:1', ...] (one per agent).")
            if self.share_model:
                raise ConfigError("parallel_training='mp' puts each agent's model on its own device, but "
                                  "share_model=True trains one model: drop one of the two.")
        if self.vllm_engine_kwargs is not None and not isinstance(self.vllm_engine_kwargs, dict):
            raise ConfigError("vllm_engine_kwargs must be a dict of vllm.EngineArgs fields, "
                              f"got {self.vllm_engine_kwargs!r}.")
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
        for group in reversed(type(self).__mro__):  # each field group's checks, once, base first
            if "check_group" in vars(group):
                vars(group)["check_group"](self)

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly dict of every field (for logs and Weights & Biases)."""
        d = asdict(self)
        for f in fields(self):
            if isinstance(d[f.name], tuple):
                d[f.name] = list(d[f.name])
        return d



# ---------------------------------------------------------------------------------------------
# Field groups: a learner config is TrainerConfig plus the groups it uses, nothing else
# ---------------------------------------------------------------------------------------------
@dataclass
class SamplingFields:
    """How training rollouts sample (one :class:`~collab_env.policy.SamplingParams`, built by
    :func:`learner_sampling`) and how evaluation departs from it."""

    max_new_tokens: int = 256
    """Longest completion, in tokens."""
    temperature: float = 1.0
    """Sampling temperature of training rollouts; log-probs are computed at it too."""
    top_p: float = 1.0
    """Nucleus sampling mass of training rollouts (1.0 keeps the ratio exact)."""
    top_k: int | None = None
    """Top-k sampling of training rollouts (``None``: off)."""
    eval_greedy: bool = False
    """Evaluate with greedy decoding instead of the training sampling settings."""
    eval_max_new_tokens: int | None = None
    """Longest completion in evaluation (``None``: ``max_new_tokens``)."""

    def check_group(self) -> None:
        check_int("max_new_tokens", self.max_new_tokens, 1)
        check_float("temperature", self.temperature, 0.0, low_open=True)
        check_float("top_p", self.top_p, 0.0, 1.0, low_open=True)
        check_int("top_k", self.top_k, 1, allow_none=True)
        check_int("eval_max_new_tokens", self.eval_max_new_tokens, 1, allow_none=True)


def learner_sampling(args: Any, evaluation: bool = False) -> SamplingParams:
    """The :class:`~collab_env.policy.SamplingParams` of a learner's config (its
    :class:`SamplingFields`, or any config with ``temperature``, ``top_p``, ``top_k`` and
    ``max_new_tokens``): in evaluation ``eval_max_new_tokens`` (when set) replaces
    ``max_new_tokens`` and ``eval_greedy`` makes it greedy (temperature 0)."""
    tokens = args.max_new_tokens
    if evaluation and getattr(args, "eval_max_new_tokens", None):
        tokens = args.eval_max_new_tokens
    if evaluation and getattr(args, "eval_greedy", False):
        return SamplingParams(temperature=0.0, max_new_tokens=tokens)
    return SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, max_new_tokens=tokens)


@dataclass
class RolloutFields:
    """The multi-turn rollout fields CoMLRL's MAGRPO-style and actor-critic trainers share."""

    ALIASES: ClassVar[dict[str, tuple[str, Callable[[Any], Any]]]] = {
        "advantage_normalization": ("normalize_advantages", as_bool("advantage_normalization")),
    }

    @property
    def advantage_normalization(self) -> bool:
        """CoMLRL's name of :attr:`normalize_advantages`."""
        return self.normalize_advantages

    num_agents: int = 2
    """Number of agents; 1 is the single-agent algorithm (GRPO, REINFORCE...)."""
    num_turns: int = 1
    """Turns per rollout (the depth of a rollout tree)."""
    discount: float = 1.0
    """Weight of the next turn's value in a return."""
    normalize_advantages: bool = False
    """Divide advantages by their std (GRPO's paper) instead of only centring them."""
    logprob_temperature: float | None = None
    """Temperature of the log-probs in the loss (``None``: ``temperature``, the sampling
    distribution's; CoMLRL uses the raw logits, 1.0)."""
    prompt_format: Literal["chat", "raw"] = "chat"
    """``"chat"``: the agent's whole conversation through the tokenizer's chat template;
    ``"raw"``: CoMLRL's, the turn's prompt string (the formatter's output, or the external
    prompt) tokenised as it is, ``tokenizer(prompt)``, one prompt per turn and no history."""
    early_termination_threshold: float | None = None
    """CoMLRL's: a turn whose mean reward exceeds this value ends its branch of the rollout
    (a tree node gets no children). ``None``: never."""
    external_prompt_passthrough: bool | None = None
    """Dataset path, turns after the first: CoMLRL's ``True`` sends the external prompt as it is;
    ``False`` formats it, ``formatter({**item, "prompt": external})`` (with
    ``external_prompts=external`` when the formatter declares it). ``None``: collab_env's rule
    (see :func:`~collab_env.tasks.from_dataset`)."""
    reference_kl_enabled: bool = False
    """CoMLRL's reference KL, a **penalty on the returns**: subtract ``reference_kl_coef`` times
    each completion's KL to the initial policy (k3 estimate summed over its tokens, raw logits,
    no gradient) from its value before advantages, so it acts only through the group-relative
    advantages. A different mechanism from ``beta`` (TRL's KL term in the loss, with gradient);
    CoMLRL's two field names are kept as CoMLRL spells them."""
    reference_kl_coef: float = 0.1
    """Weight of the reference KL penalty (``reference_kl_enabled``)."""
    rollout_buffer_size: int | None = None
    """CoMLRL's buffer of what each agent collects before it updates (``None``: one update per
    batch of ``per_device_train_batch_size`` items); each learner's docstring says its unit."""
    train_batch_size: int | None = None
    """CoMLRL's part of a rollout buffer per optimiser step (``None``: the whole buffer)."""
    train_micro_batch_size: int = 8
    """Sequences per forward/backward pass (gradients accumulate to the full-batch gradient)."""
    async_rollouts: bool = False
    """Tree learners (MAGRPO/GRPO, REINFORCE): roll out the next batch (generation, the other
    players' policies, the rewards and judges) in a background thread while the current batch
    updates (:mod:`~collab_env.adapters.common.async_rollout`). It is generated by a frozen copy
    of the weights taken before that update, so every batch but the first is exactly one update
    stale (``off_policy_steps`` in the log). Configs with ``is_correction`` (MAGRPO's) weigh the
    stale samples back by the ratio to the sampler: ``None`` becomes ``"token_truncate"`` here
    (a huge ``is_cap`` turns the correction off in effect); REINFORCE has no correction and uses
    them as they are. Fastest when the rollout waits on an API (a user simulator, a judge); the
    same seeds as a synchronous run; costs one more copy of each trained model's trainable
    weights. Not with ``rollout_buffer_size``, ReMax's greedy baseline or vLLM generation; a
    checkpoint drops the batch in flight (a resumed run rolls it out again from the same
    seeds)."""

    def check_group(self) -> None:
        check_int("num_agents", self.num_agents, 1)
        check_int("num_turns", self.num_turns, 1)
        check_float("discount", self.discount, 0.0, 1.0)
        check_float("logprob_temperature", self.logprob_temperature, 0.0, low_open=True, allow_none=True)
        check_choice("prompt_format", self.prompt_format, ("chat", "raw"))
        check_float("early_termination_threshold", self.early_termination_threshold, allow_none=True)
        if self.external_prompt_passthrough not in (None, True, False):
            raise ConfigError(
                f"external_prompt_passthrough must be True, False or None, got {self.external_prompt_passthrough!r}.")
        as_bool("reference_kl_enabled")(self.reference_kl_enabled)
        check_float("reference_kl_coef", self.reference_kl_coef, 0.0)
        check_int("rollout_buffer_size", self.rollout_buffer_size, 1, allow_none=True)
        check_int("train_batch_size", self.train_batch_size, 1, allow_none=True)
        check_int("train_micro_batch_size", self.train_micro_batch_size, 1)
        as_bool("async_rollouts")(self.async_rollouts)
        if self.async_rollouts:
            why = None
            if self.rollout_buffer_size is not None:
                why = ("rollout_buffer_size collects several batches before an update, so there is no next "
                       "rollout to overlap with it: set rollout_buffer_size=None")
            elif getattr(self, "baseline", None) == "remax":
                why = ("ReMax's greedy baseline rolls out with the live weights inside the step: use another "
                       "baseline ('mean', 'rloo', 'none')")
            elif getattr(self, "generation_backend", "hf") == "vllm":
                why = ("the background rollouts generate with a frozen copy through transformers: set "
                       "generation_backend='hf'")
            if why is not None:
                raise ConfigError(f"async_rollouts=True is not available here: {why}, or async_rollouts=False.")


@dataclass
class TreeFields:
    """The rollout tree's fields (MAGRPO, REINFORCE, MADPO): its branching, how completions
    form joint actions and are valued, the loss's aggregation and KL, pass@k evaluation."""


    num_generations: int = 4
    """Completions each agent samples per node (the group size)."""
    joint_mode: Literal["aligned", "cross"] = "aligned"
    """How agents' completions form joint actions: ``aligned`` pairs the j-th completions
    (``G`` per node); ``cross`` takes every combination (``G ** n`` per node)."""
    cross_value: Literal["mean", "sum"] = "mean"
    """``joint_mode="cross"``: a completion's value (what its advantage comes from) is the mean
    of the returns of the joint actions it is part of (the marginal over the other agents'
    choices), or their sum (``"sum"``, CoMLRL's: ``num_generations ** (num_agents - 1)`` times
    the mean, so larger advantages without ``normalize_advantages`` and a relatively smaller
    ``reference_kl_coef`` penalty). Aligned joint actions: the same either way."""
    beta: float = 0.0
    """The KL to the reference model (the initial policy) as a **loss term** (TRL's ``beta``):
    ``beta`` times the per-token k3 KL, aggregated like the policy term, with its gradient; 0
    builds no reference model (unless ``reference_kl_enabled``). Not CoMLRL's reference KL
    (``reference_kl_enabled``), which is a penalty on the returns with no gradient of its own."""
    loss_type: Literal["grpo", "dapo", "bnpo", "dr_grpo", "sum"] = "grpo"
    """How the per-token loss of a batch becomes one number (TRL's ``GRPOConfig.loss_type`` names
    and CoMLRL's ``"sum"``; :func:`~collab_env.adapters.common.losses.aggregation_plan` has the
    formulas): each sequence's token mean averaged over sequences (``"grpo"``); the sum over all
    the batch's loss tokens divided by their count (``"dapo"``);
    each micro-batch's token mean averaged over micro-batches (``"bnpo"``: depends on
    ``train_micro_batch_size``); the sum divided by ``num_sequences * max_new_tokens``
    (``"dr_grpo"``, Dr. GRPO's constant); or each sequence's token sum averaged over sequences
    (``"sum"``: CoMLRL's ``-A * sum(log p)``). Gradient accumulation over micro-batches is exact
    for every one."""
    eval_pass_k: int = 1
    """Independent samples per evaluation item; above 1, ``eval/pass@k`` and
    ``eval/best_of_k_return`` are reported."""
    eval_pass_threshold: float = 1.0
    """A sample passes when its return reaches this value (for ``eval/pass@k``)."""

    def check_group(self) -> None:
        check_int("num_generations", self.num_generations, 1)
        check_choice("joint_mode", self.joint_mode, ("aligned", "cross"))
        check_choice("cross_value", self.cross_value, ("mean", "sum"))
        check_float("beta", self.beta, 0.0)
        check_choice("loss_type", self.loss_type, LOSS_TYPES)
        check_int("eval_pass_k", self.eval_pass_k, 1)
        check_float("eval_pass_threshold", self.eval_pass_threshold)
        if getattr(self, "eval_greedy", False) and self.eval_pass_k > 1:
            raise ConfigError("eval_pass_k > 1 needs sampling: greedy samples are all the same. Set eval_greedy=False.")
        n, turns = getattr(self, "num_agents", 1), getattr(self, "num_turns", 1)
        if self.joint_mode == "cross" and self.num_generations ** (n * turns) > 100_000:
            raise ConfigError(
                f"joint_mode='cross' with {self.num_generations} generations, {n} agents and "
                f"{turns} turns makes {self.num_generations ** (n * turns)} "
                "leaves per item; use joint_mode='aligned' or fewer generations/turns."
            )


def check_tree_buffer(cfg: Any) -> None:
    """CoMLRL's rollout buffer of a tree learner: ``train_batch_size`` (nodes per optimiser
    step) needs ``rollout_buffer_size`` and defaults to it."""
    if cfg.train_batch_size is not None and cfg.rollout_buffer_size is None:
        raise ConfigError("train_batch_size splits CoMLRL's rollout buffer: set rollout_buffer_size too "
                          "(or use per_device_train_batch_size for items per update).")
    if cfg.rollout_buffer_size is not None and cfg.train_batch_size is None:
        cfg.train_batch_size = cfg.rollout_buffer_size  # CoMLRL: the whole buffer in one step


@dataclass
class PPOFields:
    """Several optimisation passes over one rollout batch, kept near the sampling policy by
    clipping the probability ratio (PPO's surrogate)."""

    num_iterations: int = 1
    """Optimisation epochs over each rollout batch; with more than one, the ratio clipping keeps
    later epochs close to the sampling policy."""
    clip_range: float = 0.2
    """Lower clip range epsilon of the ratio: it is clipped to ``[1 - clip_range, 1 +
    clip_range_high]`` (TRL's ``epsilon``)."""
    clip_range_high: float | None = None
    """Upper clip range (``None``: ``clip_range``; TRL's ``epsilon_high``). Above
    ``clip_range`` it is DAPO's clip-higher (the paper's 0.2 / 0.28): low-probability tokens
    with a positive advantage may grow further, which keeps exploration (entropy) up. With
    ``policy_objective="cispo"`` the ratio's cap is ``1 + clip_range_high``."""

    def check_group(self) -> None:
        check_int("num_iterations", self.num_iterations, 1)
        check_float("clip_range", self.clip_range, 0.0, 1.0, low_open=True)
        check_float("clip_range_high", self.clip_range_high, 0.0, low_open=True, allow_none=True)


@dataclass
class PolicyLossFields:
    """The policy objective of a group-relative learner (MAGRPO) beyond PPO's clip: CISPO, GSPO's
    sequence-level ratio, the two-sided clip, the importance sampling against the sampler's
    log-probs and DAPO's dynamic sampling. Used with :class:`PPOFields` (the clip ranges) and
    :class:`TreeFields` (``loss_type``, the aggregation); the README's Training section maps
    TRL's ``GRPOConfig`` fields to these."""

    policy_objective: Literal["clip", "cispo"] = "clip"
    """``"clip"``: PPO's clipped surrogate (GRPO, DAPO, GSPO); ``"cispo"``: MiniMax-M1's CISPO,
    ``-sg(min(r, 1 + clip_range_high)) * A * log p``: the clipped ratio only weighs the
    gradient (stop-gradient), so no token loses its gradient (TRL's ``loss_type="cispo"``, whose
    ``epsilon_high`` is the cap itself: ``clip_range_high = epsilon_high - 1``)."""
    importance_sampling_level: Literal["token", "sequence"] = "token"
    """The ratio to the sampling policy: one per token, or GSPO's one per sequence,
    ``exp(mean over its tokens of (log p - log p_old))``, clipped per sequence (TRL's field of
    the same name; GSPO's paper clips at 3e-4 / 4e-4)."""
    clip_delta: float | None = None
    """INTELLECT-2's two-sided clip (TRL's ``delta``): the unclipped ratio is capped at this
    value too, bounding the loss of a negative advantage; must be above ``1 + clip_range_high``
    (INTELLECT-2: 4). ``None``: off. Only with ``policy_objective="clip"``."""
    is_correction: Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"] | None = None
    """Importance sampling against the log-probs the sampler reported (``Completion.logprobs``):
    each token's loss is weighted by the ratio ``exp(log p_old - log p_sampler)`` (``log p_old``:
    the model before the update), per token or per sequence (the sum of its tokens' log-ratios),
    truncated to ``[is_floor, is_cap]`` (``*_truncate``, TIS) or zeroed outside it (``*_mask``).
    Corrects a sampler that differs from the trained model (a vLLM engine, a stale policy).
    ``None``: off (TRL's ``vllm_importance_sampling_correction`` / ``_mode``; on by default there,
    with ``"sequence_mask"``, for vLLM only). Exact when the log-probs are of the same
    distribution: ``top_p=1``, no ``top_k`` and ``logprob_temperature`` unset or equal to
    ``temperature``."""
    is_cap: float | None = 3.0
    """Upper bound ``C_max`` of the importance ratio (TRL's ``vllm_importance_sampling_clip_max``)."""
    is_floor: float | None = None
    """Lower bound ``C_min`` of the importance ratio (TRL's ``vllm_importance_sampling_clip_min``)."""
    dynamic_sampling: bool = False
    """DAPO's dynamic sampling: leave out of the update the groups (one node's completions of one
    agent) whose values all tie, which carry no signal (zero advantages); they are counted in
    the metric ``groups_filtered``. The batch is not refilled with new samples (DAPO
    over-samples until it is full): the update is on the groups left."""

    def check_group(self) -> None:
        if isinstance(self, RolloutFields) and self.async_rollouts and self.is_correction is None:
            self.is_correction = "token_truncate"  # async rollouts: weigh the stale samples back
        check_choice("policy_objective", self.policy_objective, ("clip", "cispo"))
        check_choice("importance_sampling_level", self.importance_sampling_level, ("token", "sequence"))
        check_float("clip_delta", self.clip_delta, 1.0, low_open=True, allow_none=True)
        if self.clip_delta is not None:
            if self.policy_objective != "clip":
                raise ConfigError("clip_delta caps the unclipped ratio of PPO's surrogate; CISPO has no such term: "
                                  "remove clip_delta or set policy_objective='clip'.")
            high_field: float | None = getattr(self, "clip_range_high", None)
            high = high_field if high_field else float(getattr(self, "clip_range", 0.2))
            if self.clip_delta <= 1.0 + high:
                raise ConfigError(f"clip_delta must be above 1 + clip_range_high = {1.0 + high} (INTELLECT-2 uses 4), "
                                  f"got {self.clip_delta}: below it the clip range's upper bound is never reached.")
        check_choice("is_correction", self.is_correction, (None, *IS_MODES))
        check_float("is_cap", self.is_cap, 0.0, low_open=True, allow_none=True)
        check_float("is_floor", self.is_floor, 0.0, allow_none=True)
        if self.is_cap is not None and self.is_floor is not None and self.is_floor >= self.is_cap:
            raise ConfigError(f"is_floor ({self.is_floor}) must be below is_cap ({self.is_cap}).")
        if self.is_correction is not None and self.is_cap is None and self.is_floor is None:
            raise ConfigError(f"is_correction={self.is_correction!r} needs a bound: set is_cap (e.g. 3.0, TRL's) "
                              "or is_floor.")
        as_bool("dynamic_sampling")(self.dynamic_sampling)


def eval_due(item_in_epoch: int, batch_size: int, eval_interval: int) -> bool:
    """Whether the schedule evaluates before the batch of ``batch_size`` training items that
    starts at position ``item_in_epoch`` of its epoch.

    The CoMLRL schedule: before the first item of every epoch, then every ``eval_interval``
    items (a batch that contains such an item triggers it); ``eval_interval == 0`` never.
    """
    if eval_interval <= 0:
        return False
    return any((item_in_epoch + k) % eval_interval == 0 for k in range(batch_size))

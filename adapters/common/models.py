"""The agents' models: loading, LoRA, device and dtype, optimisers, reference models, generation.

:func:`load_policy_models` turns what a user passes as ``agent_model`` (a folder, a hub id,
``"embedded"``, a loaded ``PreTrainedModel`` or ``PeftModel``, or one of those per agent) into
one :class:`PolicyModel` per agent. With ``share_model`` every agent gets the *same*
:class:`PolicyModel` (one set of weights, one optimiser); otherwise each agent gets its own copy.

Placement follows the config: CUDA with bfloat16 weights when torch sees a GPU, CPU with float32
otherwise; gradient checkpointing is on by default on CUDA. The code path is the same on both.

Generation goes through the token-level interface (:class:`~collab_env.agents.tokens.TokenGenerator`:
:meth:`PolicyModel.generate_tokens`) of an :class:`~collab_env.agents.hf.HFPolicy` on the model
being trained, or of its vLLM engine, so a :class:`~collab_env.types.Completion` holds the exact
token ids the learner puts in its loss. :attr:`PolicyModel.policy` is the same model as a
:class:`~collab_env.policy.Policy`, in the episode driver's policy table (a multiturn-aware reward's futures play it,
:func:`~collab_env.adapters.common.rollout.driver_table`): its queue merges the concurrent calls of every fork of a
tree level into model calls of at most ``max_batch_size`` observations.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from collab_env.adapters.common.vllm_engine import VLLMGenerator, vllm_available
from collab_env.errors import ConfigError, require
from collab_env.policy import SamplingParams

__all__ = [
    "resolve_device",
    "placement",
    "resolve_dtype",
    "PolicyModel",
    "load_policy_models",
    "make_optimizer",
    "make_scheduler",
    "unique_models",
    "load_model_and_tokenizer",
    "apply_lora",
]


def resolve_device(device: str) -> str:
    """``"cuda"`` or ``"cpu"`` for a config's ``device`` (``"auto"``: CUDA when available)."""
    torch = require("torch", "hf", "Training")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device='cuda' but torch sees no CUDA device; use device='cpu' or 'auto'.")
    return device


def placement(config: Any, num_models: int) -> list[str]:
    """The device of each of ``num_models`` models, from ``device``, ``agent_devices`` and
    ``parallel_training`` (CoMLRL's placement fields; :class:`~collab_env.adapters.common.config.TrainerConfig`).
    A CUDA device that torch does not see is a :class:`ConfigError`."""
    torch = require("torch", "hf", "Training")
    spec = getattr(config, "agent_devices", None)
    mode = getattr(config, "parallel_training", "none")
    if spec is None:
        return [resolve_device(config.device)] * num_models
    names = [spec] if isinstance(spec, str) else list(spec)
    if mode != "mp":
        names = names[:1]  # CoMLRL: without "mp", every agent sits on the first device named
    if len(names) == 1:
        names = names * num_models
    if len(names) != num_models:
        raise ConfigError(f"agent_devices lists {len(names)} devices for {num_models} agents: "
                          "pass one per agent, or one for all.")
    from collab_env.adapters.common.distributed import rank_world

    if mode == "mp" and rank_world()[1] > 1:
        raise ConfigError("parallel_training='mp' under several ranks (torchrun) is not supported: "
                          "use data parallelism (one copy of every agent per rank) or 'mp' in one process.")
    out = []
    for name in names:
        if name == "auto":
            out.append(resolve_device("auto"))
            continue
        try:
            dev = torch.device(name)
        except (RuntimeError, ValueError) as exc:
            raise ConfigError(f"agent_devices: {name!r} is not a torch device name ('cpu', 'cuda:0').") from exc
        if dev.type == "cuda" and (not torch.cuda.is_available()
                                   or (dev.index or 0) >= torch.cuda.device_count()):
            raise ConfigError(f"agent_devices names {name!r}, but torch sees "
                              f"{torch.cuda.device_count() if torch.cuda.is_available() else 0} CUDA devices.")
        out.append(str(dev))
    return out


def resolve_dtype(dtype: str, device: str):
    """The torch dtype of the parameters: ``"auto"`` is bfloat16 on CUDA (float16 on GPUs
    without bfloat16) and float32 on CPU, where bfloat16 matmuls are slow and coarse."""
    torch = require("torch", "hf", "Training")
    if dtype != "auto":
        return getattr(torch, dtype)
    if device == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


@dataclass(eq=False)  # compared by identity: agents sharing a model share this object
class PolicyModel:
    """One trainable model with everything a learner needs around it.

    Attributes:
        model: The ``PreTrainedModel`` (a ``PeftModel`` under LoRA).
        tokenizer: Its tokenizer (with a chat template).
        generator: An :class:`~collab_env.agents.hf.HFPolicy` over ``model`` (shares weights).
        lora: Whether ``model`` is a ``PeftModel`` whose adapters are what trains.
        reference: A frozen copy of the initial model, when a KL term needs one and ``lora`` is
            off (under LoRA the reference is the model with its adapters disabled).
        optimizer: AdamW over the trainable parameters (set by the trainer).
        scheduler: Its learning-rate schedule (set by the trainer).
        agents: Indices of the agents this model plays.
    """

    model: Any
    tokenizer: Any
    generator: Any
    lora: bool = False
    reference: Any = None
    optimizer: Any = None
    scheduler: Any = None
    agents: list[int] = field(default_factory=list)
    engine: Any = None
    """A :class:`~collab_env.adapters.common.vllm_engine.VLLMGenerator` when rollouts are
    sampled by vLLM (``generation_backend``), else ``None``."""
    version: int = 0
    """Optimiser steps taken on this model (the vLLM engine syncs when it is behind)."""

    @property
    def device(self):
        """The device of the model's parameters."""
        return next(self.model.parameters()).device

    @property
    def pad_id(self) -> int:
        """The id used for padding (the tokenizer's pad token, else its EOS)."""
        return int(self.generator.pad_token_id)

    @property
    def pad_token_id(self) -> int:
        """Same as :attr:`pad_id` (the :class:`~collab_env.agents.tokens.TokenGenerator` name)."""
        return self.pad_id

    @property
    def max_batch_size(self) -> int:
        """Most sequences in one model call, of :meth:`generate_tokens` and of :attr:`policy`."""
        return int(self.generator.max_batch_size)

    @property
    def policy(self) -> Any:
        """This model as a :class:`~collab_env.policy.Policy`: the trained player's entry in the
        episode driver's policy table, which plays a multiturn-aware reward's futures.

        Without a vLLM engine it is :attr:`generator` (an :class:`~collab_env.agents.hf.HFPolicy`
        with ``flush="idle"``: the concurrent ``act`` calls of every fork of a tree level wait for
        each other and share ``generate`` calls of at most :attr:`max_batch_size` observations);
        with one, the engine's :class:`~collab_env.agents.vllm.VLLMPolicy`, which holds the
        weights :meth:`generate_tokens` synced before the level's own generation."""
        return self.engine.policy if self.engine is not None else self.generator

    def forget_cached_prompts(self) -> None:
        """Drop the KV caches of prompts the generator read under earlier weights (its prefix
        cache): call it whenever the weights change in place. Fused AdamW does not bump the
        parameters' version counters, so the generator cannot see such a step by itself."""
        reset = getattr(self.generator, "reset_prefix_cache", None)
        if reset is not None:
            reset()

    def trainable_parameters(self) -> list[tuple[str, Any]]:
        """``(name, parameter)`` of every parameter with ``requires_grad``."""
        return [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]

    def prompt_ids(self, observation: Any) -> list[int]:
        """The chat-template token ids of one :class:`~collab_env.types.Conversation`."""
        return self.generator.prompt_ids(observation)

    def raw_prompt_ids(self, text: str) -> list[int]:
        """``tokenizer(text)["input_ids"]``: a prompt string tokenised as it is, with no chat
        template (CoMLRL's prompts; ``prompt_format="raw"``)."""
        ids = [int(t) for t in self.tokenizer(text)["input_ids"]]
        if not ids:
            raise ConfigError(
                "prompt_format='raw' got an empty prompt (no tokens to condition on): make the "
                "formatter return text, or use prompt_format='chat'."
            )
        return ids

    def generate_tokens(self, prompts: Sequence[Sequence[int]], params: Any, seeds: Sequence[int]) -> list[Any]:
        """One :class:`~collab_env.types.Completion` per tokenised prompt (row ``i`` samples with
        its own generator seeded by ``seeds[i]``), from the current weights: through the vLLM
        engine when there is one (synced first when the optimiser stepped since), else in
        ``generate`` calls of at most :attr:`max_batch_size` rows
        (:class:`~collab_env.agents.tokens.TokenGenerator`).

        Args:
            prompts: Token ids per row (used as they are).
            params: :class:`~collab_env.policy.SamplingParams` (or a mapping of its fields).
            seeds: One generator seed per row.
        """
        params = SamplingParams.coerce(params)
        self.model.eval()
        if self.engine is not None:  # vLLM: take the current weights first, then one call
            self.engine.sync(self.model, self.version)
            return self.engine.generate_tokens([list(p) for p in prompts], params, list(seeds))
        return self.generator.generate_tokens([list(p) for p in prompts], params, list(seeds))

    def generate(self, prompts: Sequence[Sequence[int]], seeds: Sequence[int], *,
                 max_batch_size: int | None = None, **sampling: Any) -> list[Any]:
        """:meth:`generate_tokens` with sampling keywords (``temperature``, ``max_new_tokens``...);
        ``max_batch_size`` lowers the rows per call for this request."""
        params = SamplingParams.coerce(sampling)
        step = len(prompts) if self.engine is not None or not max_batch_size else int(max_batch_size)
        out: list[Any] = []
        for start in range(0, len(prompts), max(step, 1)):
            out.extend(self.generate_tokens(prompts[start:start + step], params, seeds[start:start + step]))
        return out

    @contextlib.contextmanager
    def as_reference(self):
        """Context in which :meth:`reference_model` is the frozen initial policy."""
        if self.lora:
            with self.model.disable_adapter():
                yield self.model
        elif self.reference is not None:
            yield self.reference
        else:
            raise ConfigError("internal: no reference model was built; the KL term needs one.")


def load_model_and_tokenizer(spec: Any, tokenizer: Any, device: str, dtype: Any) -> tuple[Any, Any]:
    """``(model, tokenizer)`` from one ``agent_model`` entry, on ``device`` in ``dtype`` (a torch
    dtype): the HF backend's loader (:func:`collab_env.agents.hf_loading.load_weights`), the one
    loader of the backends, the learners and their critics."""
    from collab_env.agents.hf_loading import load_tokenizer, load_weights

    model, source, _ = load_weights(
        spec, dtype, cast_loaded=True,
        invalid="agent_model must be a model folder, a hub id, 'embedded', a loaded transformers "
                "model, or a list of those (one per agent)")
    tokenizer = load_tokenizer(tokenizer, source, "pass tokenizer=... to the trainer.")
    model.to(device)
    return model, tokenizer


def apply_lora(model: Any, config: Any) -> Any:
    """``model`` with LoRA adapters from ``config`` (``lora_r``, ``lora_alpha``, ``lora_dropout``,
    ``lora_target_modules``); a ``PeftModel`` is returned as it is (its adapters are trained)."""
    peft = require("peft", "hf", "LoRA training (lora_r > 0)")
    if isinstance(model, peft.PeftModel):
        return model  # the caller brought its own adapters: train those
    target = config.lora_target_modules
    lora = peft.LoraConfig(
        r=config.lora_r,
        lora_alpha=config.lora_alpha,
        lora_dropout=config.lora_dropout,
        target_modules=target if isinstance(target, str) else list(target),
        task_type="CAUSAL_LM",
    )
    return peft.get_peft_model(model, lora)


def _frozen_copy(model: Any) -> Any:
    ref = copy.deepcopy(model)
    ref.eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


def load_policy_models(agent_model: Any, tokenizer: Any, num_agents: int, config: Any, *,
                       need_reference: bool) -> list[PolicyModel]:
    """One :class:`PolicyModel` per agent (the same object for every agent under
    ``config.share_model``).

    Args:
        agent_model: A folder, hub id, ``"embedded"``, a loaded model, or a list with one of
            those per agent. A single loaded model is copied for the other agents unless
            ``share_model``.
        tokenizer: A tokenizer (or folder), or a list with one per agent; default: loaded from
            the model's folder.
        num_agents: Number of agents.
        config: A :class:`~collab_env.adapters.common.config.TrainerConfig`.
        need_reference: Build a frozen reference (a KL term is on).
    """
    torch = require("torch", "hf", "Training")
    require("transformers", "hf", "Training")
    from collab_env.agents.hf import HFPolicy

    specs = list(agent_model) if isinstance(agent_model, (list, tuple)) else [agent_model]
    toks = list(tokenizer) if isinstance(tokenizer, (list, tuple)) else [tokenizer] * len(specs)
    if len(toks) != len(specs):
        raise ConfigError(f"{len(toks)} tokenizers for {len(specs)} models: pass one per model.")
    if config.share_model and len(specs) > 1:
        raise ConfigError("share_model=True trains one model for every agent: pass a single agent_model.")
    if len(specs) not in (1, num_agents):
        raise ConfigError(f"agent_model lists {len(specs)} models for {num_agents} agents: pass one, or one per agent.")
    n_models = 1 if config.share_model else num_agents
    if len(specs) == 1 and n_models > 1:
        specs, toks = specs * n_models, toks * n_models
    devices = placement(config, n_models)
    loaded: list[tuple[Any, Any]] = []
    with torch.random.fork_rng(devices=[]):
        # LoRA initialisation draws random numbers: seed it, without moving the caller's RNG.
        torch.manual_seed(config.seed)
        for i, (spec, tok) in enumerate(zip(specs, toks, strict=True)):
            dtype = resolve_dtype(config.dtype, torch.device(devices[i]).type)
            if i > 0 and spec is specs[0] and not isinstance(spec, (str, Path)):
                # one loaded model, n agents
                model, tok = copy.deepcopy(loaded[0][0]).to(devices[i], dtype), loaded[0][1]
            else:
                model, tok = load_model_and_tokenizer(spec, tok, devices[i], dtype)
            loaded.append((model, tok))
        out: list[PolicyModel] = []
        for (model, tok), device in zip(loaded, devices, strict=True):
            kind = torch.device(device).type  # "cpu" or "cuda"
            lora = config.lora_r > 0
            if lora:
                model = apply_lora(model, config)
            reference = _frozen_copy(model) if need_reference and not lora else None
            checkpointing = config.gradient_checkpointing
            if checkpointing is None:
                checkpointing = kind == "cuda"
            if checkpointing:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            # flush="idle": the futures a learner plays (one act call per fork) share full
            # batches; the wait is capped at a second while the loop stays busy.
            generator = HFPolicy(model, tok, device="auto", dtype="auto", max_batch_size=64,
                                 flush="idle", max_wait_ms=1000.0)
            engine = None
            if _use_vllm(config, kind):

                engine = VLLMGenerator(model, tok, config.vllm_engine_kwargs)
            out.append(PolicyModel(model=model, tokenizer=tok, generator=generator, lora=lora,
                                   reference=reference, engine=engine))
    if config.share_model:
        out[0].agents = list(range(num_agents))
        return [out[0]] * num_agents
    for i, pm in enumerate(out):
        pm.agents = [i]
    return out


def _use_vllm(config: Any, device: str) -> bool:
    """Whether rollouts are sampled by vLLM (``generation_backend``)."""

    backend = getattr(config, "generation_backend", "hf")
    if backend == "vllm":
        if not vllm_available():
            raise ConfigError("generation_backend='vllm' needs vllm: pip install 'collab_env[vllm]' "
                              "(or generation_backend='hf').")
        return True
    return backend == "auto" and device == "cuda" and vllm_available()


def unique_models(models: Sequence[PolicyModel]) -> list[PolicyModel]:
    """The distinct :class:`PolicyModel` objects of a per-agent list, in first-seen order."""
    seen: list[PolicyModel] = []
    for m in models:
        if not any(m is s for s in seen):
            seen.append(m)
    return seen


def adamw(params: Any, config: Any, lr: float | None = None):
    """The learners' one AdamW: over ``params``, from the config's ``learning_rate`` (or ``lr``),
    ``weight_decay``, Adam fields and ``optim`` (fused kernel or plain).

    Raises:
        ConfigError: ``optim="adamw_torch_fused"`` on parameters torch's fused kernel does not
            take (a device or dtype without it): use ``optim="adamw_torch"``.
    """
    import torch

    params = list(params)
    fused = getattr(config, "optim", "adamw_torch") == "adamw_torch_fused"
    try:
        return torch.optim.AdamW(params, lr=config.learning_rate if lr is None else lr,
                                 weight_decay=config.weight_decay, betas=(config.adam_beta1, config.adam_beta2),
                                 eps=config.adam_epsilon, **({"fused": True} if fused else {}))
    except RuntimeError as exc:
        if not fused:
            raise
        raise ConfigError(f"torch's fused AdamW does not take these parameters ({exc}); "
                          "set optim='adamw_torch'.") from exc


def make_optimizer(pm: PolicyModel, config: Any):
    """:func:`adamw` over ``pm``'s trainable parameters; each step bumps ``pm.version``."""
    params = [p for _, p in pm.trainable_parameters()]
    if not params:
        raise ConfigError("the model has no trainable parameters (all have requires_grad=False).")
    opt = adamw(params, config)

    def bump(*_: Any) -> None:  # the weights changed: a vLLM engine must sync before generating
        pm.version += 1
        pm.forget_cached_prompts()

    opt.register_step_post_hook(bump)
    return opt


def make_scheduler(optimizer: Any, config: Any, total_steps: int):
    """The config's learning-rate schedule (``lr_scheduler_type``, ``warmup_steps``) over
    ``total_steps`` optimiser steps, as a ``LambdaLR``."""
    import math

    import torch

    warmup, kind, total = config.warmup_steps, config.lr_scheduler_type, max(int(total_steps), 1)

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / (warmup + 1)
        if kind == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        if kind == "linear":
            return max(0.0, 1.0 - progress)
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)

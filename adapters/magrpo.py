"""MAGRPO: multi-agent group-relative policy optimisation (GRPO when there is one agent).

The trainer surface is CoMLRL's, so a CoMLRL training script runs with only its import changed::

    from collab_env.adapters.magrpo import MAGRPOConfig, MAGRPOTrainer

    trainer = MAGRPOTrainer(agent_model="embedded", num_agents=2, formatters=formatters,
                            reward_func=reward_func, train_dataset=train_dataset,
                            eval_dataset=eval_dataset, args=MAGRPOConfig(num_agents=2, ...))
    trainer.train()
    metrics = trainer.evaluate(num_eval_samples=len(eval_dataset))

It also trains on any registered environment: ``MAGRPOTrainer(env="length-ratio", ...)`` (the
env's trainable players are the agents; the others act through the spec's default policies; the
rewards are the env's, so a reward wrapper such as the multiturn-aware reward trains unchanged).

The algorithm, per batch of training items:

1. **Rollout tree** (:mod:`~collab_env.adapters.common.rollout`): at each node every agent on
   turn samples ``num_generations`` completions; joint actions are aligned or crossed
   (``joint_mode``); each joint action is scored by the env (``reward_func`` on the dataset
   path) and, up to ``num_turns``, expanded into a child node (next prompts from
   ``external_transition`` / formatters with ``external_prompts``).
2. **Returns and advantages**: a joint action's return is its reward plus ``discount`` times the
   mean return of its child's joint actions; each agent's completions at a node get
   group-relative advantages (mean-centred, optionally divided by the std) of their returns.
3. **Update**, per model, ``num_iterations`` times over the same samples: the clipped surrogate
   (ratio to the sampling policy's log-probs) plus ``beta`` times the k3 KL to the reference,
   on completion tokens only (padding and prompts are masked out), accumulated over
   micro-batches, then gradient clipping, an AdamW step and the learning-rate schedule.

Evaluation follows the guide's schedule and metric names (``turn_k/reward_mean``,
``turn_k/expected_return``, ``eval/...``, ``turn_k/reference_kl_mean``,
``turn_k/reference_kl_penalty_mean``), logged against ``env_step``: the number of joint-action
reward evaluations so far.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, ClassVar, Literal

from collab_env.adapters.common.config import (
    TrainerConfig,
    as_bool,
    check_choice,
    check_comlrl_rollout_fields,
    check_float,
    check_int,
)
from collab_env.adapters.common.loop import TrainerState
from collab_env.errors import ConfigError, TaskFunctionError

__all__ = ["MAGRPOConfig", "MAGRPOTrainer", "TrainerState", "dataset_items", "streamed_rows", "eval_count",
           "turn_metrics", "kl_per_turn"]


@dataclass
class MAGRPOConfig(TrainerConfig):
    """Configuration of :class:`MAGRPOTrainer` (the CoMLRL guide's field names, plus the options
    the learner adds). Every field of :class:`~collab_env.adapters.common.config.TrainerConfig`
    applies too (learning rate, schedule, LoRA, evaluation and logging schedule...).

    CoMLRL's names are accepted with CoMLRL's meaning: ``agent_learning_rate`` is
    ``learning_rate`` and ``advantage_normalization`` is ``normalize_advantages``;
    ``early_termination_threshold``, ``external_prompt_passthrough``, ``reference_kl_enabled``,
    ``reference_kl_coef``, ``rollout_buffer_size`` and ``train_batch_size`` are fields of their
    own. ``preset="comlrl"`` sets CoMLRL's defaults (``COMLRL_DEFAULTS``)."""

    ALIASES: ClassVar[dict[str, tuple[str, Any]]] = {
        "advantage_normalization": ("normalize_advantages", as_bool("advantage_normalization")),
    }
    # CoMLRL's MAGRPOConfig defaults (comlrl/trainers/reinforce/magrpo.py), plus what its trainer
    # hard-codes: torch's AdamW (weight decay 0.01, no gradient clipping), one on-policy pass,
    # log-probs of the raw logits, the loss -A * sum(log p) averaged over completions, and the
    # formatter's string tokenised as it is.
    COMLRL_DEFAULTS: ClassVar[dict[str, Any]] = {
        "num_train_epochs": 20, "learning_rate": 5e-6, "logging_steps": 50, "num_agents": 2,
        "num_generations": 4, "max_new_tokens": 256, "temperature": 0.6, "top_p": 0.6, "top_k": 50,
        "num_turns": 2, "discount": 0.9, "joint_mode": "aligned", "early_termination_threshold": -0.2,
        "external_prompt_passthrough": False, "eval_interval": 16, "eval_num_samples": 4,
        "eval_batch_size": 1, "rollout_buffer_size": 2, "train_batch_size": None,
        "normalize_advantages": True, "reference_kl_enabled": False, "reference_kl_coef": 0.1,
        "per_device_train_batch_size": 1, "weight_decay": 0.01, "max_grad_norm": None,
        "num_iterations": 1, "beta": 0.0, "logprob_temperature": 1.0, "loss_type": "sum",
        "prompt_format": "raw", "lr_scheduler_type": "constant", "warmup_steps": 0,
    }

    @property
    def advantage_normalization(self) -> bool:
        """CoMLRL's name of :attr:`normalize_advantages`."""
        return self.normalize_advantages

    num_agents: int = 2
    """Number of agents; 1 is plain GRPO."""
    num_turns: int = 1
    """Turns per rollout tree (depth of the tree)."""
    num_generations: int = 4
    """Completions each agent samples per node (the group size, >= 2)."""
    max_new_tokens: int = 256
    """Longest completion, in tokens."""
    temperature: float = 1.0
    """Sampling temperature of training rollouts; log-probs are computed at it too."""
    top_p: float = 1.0
    """Nucleus sampling mass of training rollouts (1.0 keeps the ratio exact)."""
    top_k: int | None = None
    """Top-k sampling of training rollouts (``None``: off)."""
    joint_mode: Literal["aligned", "cross"] = "aligned"
    """How agents' completions form joint actions: ``aligned`` pairs the j-th completions
    (``G`` per node); ``cross`` takes every combination (``G ** n`` per node)."""
    discount: float = 1.0
    """Weight of the children's mean return in a joint action's return."""
    normalize_advantages: bool = False
    """Divide group-relative advantages by the group's std (GRPO's paper) instead of only
    centring them."""
    num_iterations: int = 1
    """Optimisation epochs over each rollout batch; with more than one, the PPO ratio clipping
    keeps later epochs close to the sampling policy."""
    clip_range: float = 0.2
    """Lower clip range epsilon of the ratio."""
    clip_range_high: float | None = None
    """Upper clip range (``None``: ``clip_range``)."""
    beta: float = 0.0
    """Coefficient of the k3 KL to the reference model (the initial policy) in the loss;
    0 builds no reference model."""
    loss_type: Literal["sequence", "token", "sum"] = "sequence"
    """Average the per-token loss per sequence then over sequences (``"sequence"``), over all
    tokens (``"token"``), or sum it per sequence then average over sequences (``"sum"``:
    CoMLRL's ``-A * sum(log p)``)."""
    logprob_temperature: float | None = None
    """Temperature of the log-probs in the loss (``None``: ``temperature``, the sampling
    distribution's; CoMLRL uses the raw logits, 1.0)."""
    prompt_format: Literal["chat", "raw"] = "chat"
    """``"chat"``: the agent's whole conversation through the tokenizer's chat template;
    ``"raw"``: CoMLRL's, the turn's prompt string (the formatter's output, or the external
    prompt) tokenised as it is, ``tokenizer(prompt)``, one prompt per turn and no history."""
    early_termination_threshold: float | None = None
    """CoMLRL's: a node whose joint actions' mean reward exceeds this value gets no children
    (the branch stops growing; its returns are its rewards). ``None``: never."""
    external_prompt_passthrough: bool | None = None
    """Dataset path, turns after the first: CoMLRL's ``True`` sends the external prompt as it is;
    ``False`` formats it, ``formatter({**item, "prompt": external})`` (with
    ``external_prompts=external`` when the formatter declares it). ``None``: collab_env's rule
    (see :func:`~collab_env.tasks.from_dataset`)."""
    reference_kl_enabled: bool = False
    """CoMLRL's reference KL: subtract ``reference_kl_coef`` times each completion's KL to the
    initial policy (k3 estimate summed over its tokens, raw logits, no gradient) from its return
    before advantages. Independent of ``beta`` (a KL term in the loss)."""
    reference_kl_coef: float = 0.1
    """Weight of the reference KL penalty (``reference_kl_enabled``)."""
    rollout_buffer_size: int | None = None
    """CoMLRL's buffer: each agent collects this many tree nodes (its ``num_generations``
    completions at one node) before it updates; the buffer is split by turn, each turn's nodes
    shuffled and cut into optimiser steps of ``train_batch_size`` nodes; what is left at the end
    of an epoch is used then. ``None``: one update per batch of ``per_device_train_batch_size``
    items on every node of the batch."""
    train_batch_size: int | None = None
    """Nodes per optimiser step when ``rollout_buffer_size`` is set (``None`` becomes the buffer
    size, as in CoMLRL)."""
    train_micro_batch_size: int = 8
    """Sequences per forward/backward pass (gradients accumulate to the full-batch gradient)."""
    eval_greedy: bool = False
    """Evaluate with greedy decoding instead of the training sampling settings."""
    eval_pass_k: int = 1
    """Independent samples per evaluation item; above 1, ``eval/pass@k`` and
    ``eval/best_of_k_return`` are reported."""
    eval_pass_threshold: float = 1.0
    """A sample passes when its return reaches this value (for ``eval/pass@k``)."""
    eval_max_new_tokens: int | None = None
    """Longest completion in evaluation (``None``: ``max_new_tokens``)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("num_agents", self.num_agents, 1)
        check_int("num_turns", self.num_turns, 1)
        check_int("num_generations", self.num_generations, 2)
        check_int("max_new_tokens", self.max_new_tokens, 1)
        check_float("temperature", self.temperature, 0.0, low_open=True)
        check_float("top_p", self.top_p, 0.0, 1.0, low_open=True)
        check_int("top_k", self.top_k, 1, allow_none=True)
        check_choice("joint_mode", self.joint_mode, ("aligned", "cross"))
        check_float("discount", self.discount, 0.0, 1.0)
        check_int("num_iterations", self.num_iterations, 1)
        check_float("clip_range", self.clip_range, 0.0, 1.0, low_open=True)
        check_float("clip_range_high", self.clip_range_high, 0.0, low_open=True, allow_none=True)
        check_float("beta", self.beta, 0.0)
        check_choice("loss_type", self.loss_type, ("sequence", "token", "sum"))
        check_comlrl_rollout_fields(self)
        if self.train_batch_size is not None and self.rollout_buffer_size is None:
            raise ConfigError("train_batch_size splits CoMLRL's rollout buffer: set rollout_buffer_size too "
                              "(or use per_device_train_batch_size for items per update).")
        if self.rollout_buffer_size is not None and self.train_batch_size is None:
            self.train_batch_size = self.rollout_buffer_size  # CoMLRL: the whole buffer in one step
        check_int("train_micro_batch_size", self.train_micro_batch_size, 1)
        check_int("eval_pass_k", self.eval_pass_k, 1)
        check_float("eval_pass_threshold", self.eval_pass_threshold)
        check_int("eval_max_new_tokens", self.eval_max_new_tokens, 1, allow_none=True)
        if self.eval_greedy and self.eval_pass_k > 1:
            raise ConfigError("eval_pass_k > 1 needs sampling: greedy samples are all the same. Set eval_greedy=False.")
        if self.joint_mode == "cross" and self.num_generations ** (self.num_agents * self.num_turns) > 100_000:
            raise ConfigError(
                f"joint_mode='cross' with {self.num_generations} generations, {self.num_agents} agents and "
                f"{self.num_turns} turns makes {self.num_generations ** (self.num_agents * self.num_turns)} "
                "leaves per item; use joint_mode='aligned' or fewer generations/turns."
            )


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


class MAGRPOTrainer:
    """Train LLM agents with MAGRPO on a dataset (CoMLRL style) or on a registered environment.

    Args:
        agent_model: The agents' model: a folder, a hub id, ``"embedded"`` (SmolLM2-135M, offline),
            a loaded ``PreTrainedModel``/``PeftModel``, or a list with one per agent. Each agent
            trains its own copy unless ``args.share_model``.
        num_agents: Number of agents (must agree with ``args.num_agents``; on the env path,
            default: the env's trainable players).
        formatters: Dataset path: one callable per agent (or one shared), ``item -> prompt``;
            formatters that declare ``external_prompts`` build the later turns' prompts.
        reward_func: Dataset path: CoMLRL reward function (one completion list per agent,
            positionally; ``batch_items`` / ``prompts`` keywords if declared) returning one
            joint reward.
        reward_processor: ``float -> float`` applied to every reward (e.g.
            ``RewardProcessors.scale(10.0)``).
        train_dataset: Training task items (a ``datasets.Dataset`` or a list of dicts), in order.
        eval_dataset: Evaluation task items; ``None``: :meth:`evaluate` returns ``{}``.
        args: A :class:`MAGRPOConfig` (default: all defaults).
        wandb_config: ``None`` or the guide's Weights & Biases settings (``project``, ``entity``,
            ``name``/``run_name``, ``tags``, ``dir``, ``config_sections``; ``mode="offline"``).
        eval_logger: ``eval_logger(*, agent_completions_turns, batch_items, prompts) -> list of
            dict rows``: completions are ``[agent][item][turn]``.
        eval_aggregator: ``eval_aggregator(rows, *, num_turns) -> dict`` of scalars (without the
            ``eval/`` prefix, which the trainer adds).
        external_transition: Dataset path: CoMLRL transition building the next turn's external
            prompts (see :func:`collab_env.tasks.from_dataset`).
        tokenizer: A tokenizer (or one per agent); default: the model folder's.
        env: Env path: a registered id or an environment object (anything with
            ``areset``/``astep``/``clone``/``possible_agents``) to train on instead of a dataset.
        eval_env: Env path: the environment (id or object) to evaluate on.
        env_kwargs: Keywords for ``collab_env.make`` when ``env``/``eval_env`` are ids.
        policies: Env path: player -> policy for the players that are not trained (default:
            the spec's default policies).
        trained_players: Env path: the players to train (default: the spec's trainable ones).

    Raises:
        ConfigError: Inconsistent arguments (the message says which and how to fix it).
        MissingDependencyError: torch/transformers (``collab_env[hf]``), peft for LoRA, wandb
            for ``wandb_config``.
    """

    def __init__(
        self,
        agent_model: Any = None,
        num_agents: int | None = None,
        formatters: Sequence[Callable[..., str]] | Callable[..., str] | None = None,
        reward_func: Callable[..., Any] | None = None,
        reward_processor: Callable[[float], float] | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        args: MAGRPOConfig | None = None,
        wandb_config: Mapping[str, Any] | None = None,
        eval_logger: Callable[..., Any] | None = None,
        eval_aggregator: Callable[..., Any] | None = None,
        *,
        external_transition: Callable[..., Any] | None = None,
        tokenizer: Any = None,
        env: Any = None,
        eval_env: Any = None,
        env_kwargs: Mapping[str, Any] | None = None,
        policies: Mapping[str, Any] | None = None,
        trained_players: Sequence[str] | None = None,
    ) -> None:
        import numpy as np
        import torch

        from collab_env.adapters.common.logging import MetricsLogger
        from collab_env.adapters.common.models import (
            load_policy_models,
            make_optimizer,
            make_scheduler,
            unique_models,
        )

        args = MAGRPOConfig() if args is None else args
        if not isinstance(args, MAGRPOConfig):
            raise ConfigError(f"args must be a MAGRPOConfig, got {type(args).__name__}.")
        if agent_model is None:
            raise ConfigError("agent_model is required: a model folder, a hub id, 'embedded' or a loaded model.")
        for name, fn in (("eval_logger", eval_logger), ("eval_aggregator", eval_aggregator)):
            if fn is not None and not callable(fn):
                raise ConfigError(f"{name} must be callable or None, got {type(fn).__name__}.")
        if num_agents is not None and num_agents != args.num_agents:
            raise ConfigError(
                f"num_agents={num_agents} but args.num_agents={args.num_agents}: set both to the same value."
            )
        if env is not None:
            self._setup_env_path(env, eval_env, env_kwargs, policies, trained_players, num_agents, args,
                                 formatters, reward_func, train_dataset, eval_dataset)
            args = replace(args, num_agents=len(self.players)) if num_agents is None else args
        else:
            if eval_env is not None or policies is not None or trained_players is not None:
                raise ConfigError("eval_env, policies and trained_players belong to the env path: pass env=... too.")
            self._setup_dataset_path(formatters, reward_func, reward_processor, external_transition,
                                     train_dataset, eval_dataset, args, num_agents)
        if len(self.players) != args.num_agents:
            raise ConfigError(
                f"the environment trains {len(self.players)} player(s) {list(self.players)} but "
                f"args.num_agents={args.num_agents}; set num_agents={len(self.players)}."
            )
        self.args = args
        self.eval_logger = eval_logger
        self.eval_aggregator = eval_aggregator
        torch.manual_seed(args.seed)
        self._rng = np.random.default_rng(args.seed)
        self.models = load_policy_models(agent_model, tokenizer, args.num_agents, args,
                                         need_reference=args.beta > 0 or args.reference_kl_enabled)
        self._unique = unique_models(self.models)
        # Reward wrappers that roll futures (the multiturn-aware reward) play the trained
        # players' future turns with the policy being trained.
        from collab_env.rewards.mr import bind_learner_policies

        for e in (self.train_env, self.eval_env):
            if e is not None:
                bind_learner_policies(e, {p: self.models[i].generator for i, p in enumerate(self.players)})
        steps = self._planned_optimizer_steps()
        for pm in self._unique:
            pm.optimizer = make_optimizer(pm, args)
            pm.scheduler = make_scheduler(pm.optimizer, args, steps)
        self.state = TrainerState()
        self._buffers: list[list[list[tuple[list[int], tuple[int, ...], float, int]]]] = [
            [] for _ in range(args.num_agents)]  # CoMLRL's rollout buffer: per agent, node sample groups
        self.wandb_config = wandb_config
        config = {**args.to_dict(), "players": list(self.players),
                  "env": getattr(getattr(self.train_env, "spec", None), "id", None)}
        self.logger = MetricsLogger(args.output_dir, config, wandb_config)

    # -- construction ---------------------------------------------------------------------------
    def _setup_dataset_path(self, formatters, reward_func, reward_processor, external_transition,
                            train_dataset, eval_dataset, args, num_agents) -> None:
        from collab_env.tasks.dataset_env import from_dataset, prompt_formatter

        if reward_func is None:
            raise ConfigError(
                "the dataset path needs reward_func= (and formatters=, one per agent, unless every "
                "agent reads the item's 'prompt' field); or pass env=<id> to train on a registered "
                "environment."
            )
        if train_dataset is None and eval_dataset is None:
            raise ConfigError("pass train_dataset= (and optionally eval_dataset=), or env=<id>.")
        n = args.num_agents if num_agents is None else num_agents
        if formatters is None:
            formatters = [prompt_formatter] * n  # CoMLRL's default formatter
        if callable(formatters) and not isinstance(formatters, (list, tuple)):
            formatters = [formatters] * n
        if len(formatters) != n:
            raise ConfigError(f"{len(formatters)} formatters for {n} agents: pass one formatter per agent.")

        def build(dataset):
            if dataset is None:
                return None
            return from_dataset(dataset, list(formatters), reward_func, num_turns=args.num_turns,
                                external_transition=external_transition, reward_processor=reward_processor,
                                external_prompt_passthrough=args.external_prompt_passthrough)

        self.train_env = build(train_dataset)
        self.eval_env = build(eval_dataset)
        self.players = tuple((self.train_env or self.eval_env).possible_agents)
        self.others: dict[str, Any] = {}
        self._train_items = dataset_items(self.train_env, args.max_steps)
        self._eval_items = dataset_items(self.eval_env, None)

    def _setup_env_path(self, env, eval_env, env_kwargs, policies, trained_players, num_agents, args,
                        formatters, reward_func, train_dataset, eval_dataset) -> None:
        import collab_env
        from collab_env.agents.base import resolve_policy

        if any(x is not None for x in (formatters, reward_func, train_dataset, eval_dataset)):
            raise ConfigError(
                "env= trains on an environment: its prompts and rewards replace formatters, reward_func "
                "and the datasets. Pass either env= or the dataset arguments, not both."
            )

        def build(e):
            if e is None:
                return None
            if isinstance(e, str):
                return collab_env.make(e, **dict(env_kwargs or {}))
            for attr in ("areset", "astep", "clone", "possible_agents"):
                if not hasattr(e, attr):
                    raise ConfigError(f"env must be a registered id or an environment object; {type(e).__name__} has no {attr!r}.")
            return e

        self.train_env = build(env)
        self.eval_env = build(eval_env)
        spec = getattr(self.train_env, "spec", None)
        possible = list(self.train_env.possible_agents)
        if trained_players is not None:
            players = list(trained_players)
        elif spec is not None and getattr(spec, "trainable", ()):
            players = list(spec.trainable)
        else:
            players = possible
        unknown = [p for p in players if p not in possible]
        if unknown or not players:
            raise ConfigError(f"trained_players {unknown or players} must be players of the env: {possible}.")
        if num_agents is not None and num_agents != len(players):
            raise ConfigError(
                f"num_agents={num_agents} but the env trains {len(players)} player(s) {players}; pass "
                "trained_players=[...] to choose which."
            )
        self.players = tuple(players)
        defaults = dict(getattr(spec, "default_policies", {}) or {})
        chosen = {**defaults, **dict(policies or {})}
        self.others = {p: resolve_policy(chosen[p]) for p in possible if p not in players and p in chosen}
        self._train_items = _num_items(self.train_env)
        self._eval_items = _num_items(self.eval_env) if self.eval_env is not None else 0
        if self._train_items is None and args.max_steps < 0:
            raise ConfigError("this env generates unlimited items: set args.max_steps to the number of training items.")

    def _items_per_epoch(self) -> int:
        n = self._train_items
        if n is None:  # unlimited env: one "epoch" of max_steps items
            return self.args.max_steps
        return n

    def _planned_optimizer_steps(self) -> int:
        items = self._items_per_epoch() * self.args.num_train_epochs
        if self.args.max_steps > 0:
            items = min(items, self.args.max_steps)
        a = self.args
        if a.rollout_buffer_size is not None:  # about one step per train_batch_size nodes of an agent
            per_item = sum((a.num_generations ** (d * (a.num_agents if a.joint_mode == "cross" else 1)))
                           for d in range(a.num_turns))
            return max(1, math.ceil(items * per_item / (a.train_batch_size or a.rollout_buffer_size)) * a.num_iterations)
        batches = math.ceil(items / a.per_device_train_batch_size)
        return max(1, batches * a.num_iterations)

    def _seeds(self, n: int) -> list[int]:
        return [int(s) for s in self._rng.integers(0, 2**62, size=n)]

    def _sampling(self, evaluation: bool) -> dict[str, Any]:
        a = self.args
        tokens = (a.eval_max_new_tokens or a.max_new_tokens) if evaluation else a.max_new_tokens
        if evaluation and a.eval_greedy:
            return {"temperature": 0.0, "max_new_tokens": tokens}
        return {"temperature": a.temperature, "top_p": a.top_p, "top_k": a.top_k, "max_new_tokens": tokens}

    # -- training ---------------------------------------------------------------------------------
    def train(self, resume_from_checkpoint: str | Path | None = None) -> dict[str, Any]:
        """Train for ``num_train_epochs`` (or ``max_steps`` items), evaluating on the guide's
        schedule; resume from a checkpoint folder when given. Returns the last logged training
        metrics."""
        from collab_env.adapters.common.checkpoint import load_checkpoint
        from collab_env.adapters.common.loop import run_item_loop

        if self.train_env is None:
            raise ConfigError("train() needs train_dataset= (or env=).")
        if resume_from_checkpoint is not None:
            saved = load_checkpoint(resume_from_checkpoint, self._unique, self._rng)
            self.state = TrainerState(**saved)
            self.logger.resume()
        return run_item_loop(self, type(self).__name__.removesuffix("Trainer"))

    def _rollout(self, base_env: Any, indices: Sequence[int], branching: Callable[[int], int],
                 joint_mode: str, sampling: Mapping[str, Any], seeds: Callable[[int], list[int]],
                 training: bool = True):
        from collab_env._async import run_sync
        from collab_env.adapters.common.rollout import compute_returns, expand_tree, start_roots

        stop = self.args.early_termination_threshold if training else None  # CoMLRL: training trees only

        async def go():
            roots = await start_roots(base_env, indices, self.players, self.others, seeds)
            levels = await expand_tree(roots, players=self.players, models=self.models, others=self.others,
                                       branching=branching, max_depth=self.args.num_turns,
                                       joint_mode=joint_mode, sampling=sampling, seeds=seeds,
                                       prompt_format=self.args.prompt_format, stop_above=stop)
            return roots, levels

        roots, levels = run_sync(go())
        compute_returns(levels, len(self.players), self.args.discount)
        return roots, levels

    def _train_batch(self, indices: Sequence[int]) -> dict[str, float]:
        """Roll out the trees of ``indices``, compute advantages, update every model (or, with
        ``rollout_buffer_size``, every agent whose buffer is full)."""
        from collab_env.adapters.common.losses import group_advantages
        from collab_env.adapters.common.rollout import completion_values

        a = self.args
        _, levels = self._rollout(self.train_env, indices, lambda d: a.num_generations, a.joint_mode,
                                  self._sampling(False), self._seeds)
        metrics = turn_metrics(levels, "")
        metrics["env_steps"] = float(sum(len(n.joint) for nodes in levels for n in nodes))
        kls = self._reference_kls(levels, metrics) if a.reference_kl_enabled else {}
        groups: list[tuple[int, list[tuple[list[int], tuple[int, ...], float, int]]]] = []
        lengths = []
        for nodes in levels:
            for node in nodes:
                for agent in node.acting:
                    values = completion_values(node, agent)
                    if kls:  # CoMLRL: the KL penalty comes off each completion's return
                        values = [v - a.reference_kl_coef * k for v, k in zip(values, kls[(id(node), agent)], strict=True)]
                    adv = group_advantages(values, normalize_std=a.normalize_advantages)
                    group = [(node.prompt_ids[agent], tuple(comp.token_ids or ()), adv_g, node.depth)
                             for comp, adv_g in zip(node.completions[agent], adv, strict=True)]
                    lengths.extend(len(g[1]) for g in group)
                    groups.append((agent, group))
        metrics["completion_length"] = _mean(lengths)
        metrics.update(self._learn(groups))
        return metrics

    def _owner(self, agent: int) -> int:
        return next(k for k, u in enumerate(self._unique) if u is self.models[agent])

    def _learn(self, groups: Sequence[tuple[int, list[Any]]]) -> dict[str, float]:
        """Update on the node sample groups ``(agent, samples)`` of a batch: all at once per
        model, or through CoMLRL's per-agent rollout buffer."""
        a = self.args
        per_model: list[dict[str, float]] = []
        if a.rollout_buffer_size is None:
            samples: dict[int, list[Any]] = {}
            for agent, group in groups:
                samples.setdefault(self._owner(agent), []).extend(group)
            per_model = [self._update(self._unique[k], s) for k, s in sorted(samples.items())]
            self.state.optimizer_steps += a.num_iterations
        else:
            for agent, group in groups:
                self._buffers[agent].append(group)
                if len(self._buffers[agent]) >= a.rollout_buffer_size:
                    per_model.extend(self._flush_buffer(agent))
        out: dict[str, float] = {}
        for key in sorted({k for m in per_model for k in m}):
            out[key] = _mean([m[key] for m in per_model if key in m])
        return out

    def _flush_buffer(self, agent: int) -> list[dict[str, float]]:
        """CoMLRL's buffer update of one agent: its buffered nodes grouped by turn, each turn's
        nodes shuffled and cut into optimiser steps of ``train_batch_size`` nodes."""
        a = self.args
        buffer, self._buffers[agent] = self._buffers[agent], []
        size = a.train_batch_size or a.rollout_buffer_size or 1
        by_turn: dict[int, list[Any]] = {}
        for group in buffer:
            by_turn.setdefault(group[0][3] if group else 0, []).append(group)
        out = []
        for turn in sorted(by_turn):
            nodes = by_turn[turn]
            order = self._rng.permutation(len(nodes))
            nodes = [nodes[int(i)] for i in order]
            for start in range(0, len(nodes), size):
                chunk = [s for group in nodes[start:start + size] for s in group]
                if chunk:
                    out.append(self._update(self.models[agent], chunk))
                    self.state.optimizer_steps += a.num_iterations
        return out

    def _end_epoch(self) -> dict[str, float]:
        """Use what is left in the rollout buffers (CoMLRL updates on it at every epoch's end)."""
        per_model = [m for agent in range(len(self._buffers)) if self._buffers[agent]
                     for m in self._flush_buffer(agent)]
        return {k: _mean([m[k] for m in per_model if k in m]) for k in sorted({k for m in per_model for k in m})}

    def _reference_kls(self, levels: Sequence[Sequence[Any]], metrics: dict[str, float]) -> dict[tuple[int, int], list[float]]:
        """CoMLRL's reference KL of every completion: the k3 estimate of KL(policy || initial
        policy) summed over its tokens, from the raw logits, without gradient. Adds
        ``turn_k/reference_kl_mean`` and ``turn_k/reference_kl_penalty_mean`` to ``metrics``."""
        import torch

        from collab_env.adapters.common.losses import kl_k3, pack_sequences, token_logprobs

        a = self.args
        out: dict[tuple[int, int], list[float]] = {}
        by_turn: dict[int, list[float]] = {}
        for nodes in levels:
            for node in nodes:
                for agent in node.acting:
                    pm = self.models[agent]
                    comps = node.completions[agent]
                    batch = pack_sequences([node.prompt_ids[agent]] * len(comps),
                                           [tuple(c.token_ids or ()) for c in comps], pm.pad_id).to(pm.device)
                    pm.model.eval()
                    with torch.no_grad():
                        logp = token_logprobs(pm.model, batch, 1.0)
                        with pm.as_reference() as reference:
                            reference.eval()
                            ref = token_logprobs(reference, batch, 1.0)
                    kl = kl_k3(logp, ref, batch.completion_mask).sum(-1).tolist()
                    out[(id(node), agent)] = [float(x) for x in kl]
                    by_turn.setdefault(node.depth, []).extend(float(x) for x in kl)
        for d, kls in by_turn.items():
            metrics[f"turn_{d + 1}/reference_kl_mean"] = _mean(kls)
            metrics[f"turn_{d + 1}/reference_kl_penalty_mean"] = a.reference_kl_coef * _mean(kls)
        return out

    def _update(self, pm: Any, samples: Sequence[tuple[list[int], tuple[int, ...], float, int]]) -> dict[str, float]:
        """``num_iterations`` optimiser steps of ``pm`` on its samples; returns loss metrics."""
        import torch

        from collab_env.adapters.common.losses import pack_sequences, policy_loss, token_logprobs

        a = self.args
        device = pm.device
        micro = [samples[i:i + a.train_micro_batch_size] for i in range(0, len(samples), a.train_micro_batch_size)]
        batches = [pack_sequences([s[0] for s in mb], [s[1] for s in mb], pm.pad_id).to(device) for mb in micro]
        advantages = [torch.tensor([s[2] for s in mb], dtype=torch.float32, device=device) for mb in micro]
        num_seq = len(samples)
        num_tok = int(sum(int(b.completion_mask.sum()) for b in batches))
        loss_type = a.loss_type
        if loss_type == "sum":  # per-sequence sums averaged over sequences: "token" over num_seq
            loss_type, num_tok = "token", num_seq
        temp = a.logprob_temperature or a.temperature
        params = [p for _, p in pm.trainable_parameters()]

        old: list[Any] | None = None
        ref: list[Any] | None = None
        pm.model.eval()
        with torch.no_grad():
            if a.num_iterations > 1:
                old = [token_logprobs(pm.model, b, temp) for b in batches]
            if a.beta > 0:
                with pm.as_reference() as reference:
                    reference.eval()
                    ref = [token_logprobs(reference, b, temp) for b in batches]

        out: dict[str, float] = {}
        for it in range(a.num_iterations):
            pm.model.train()
            pm.optimizer.zero_grad(set_to_none=True)
            totals: dict[str, float] = {}
            kl_by_turn: dict[int, list[float]] = {}
            for k, (b, adv) in enumerate(zip(batches, advantages, strict=True)):
                logp = token_logprobs(pm.model, b, temp)
                old_k = old[k] if old is not None else logp.detach()
                loss, stats = policy_loss(
                    logp, old_k, adv, b.completion_mask, ref_logp=ref[k] if ref is not None else None,
                    beta=a.beta, clip_low=a.clip_range, clip_high=a.clip_range_high, loss_type=loss_type,
                    num_sequences=num_seq, num_tokens=num_tok)
                loss.backward()
                for name, v in stats.items():
                    totals[name] = totals.get(name, 0.0) + float(v)
                if it == 0 and ref is not None:
                    kl_per_turn(logp.detach(), ref[k], b.completion_mask, micro[k], kl_by_turn)
            grad_norm = torch.nn.utils.clip_grad_norm_(
                params, a.max_grad_norm if a.max_grad_norm is not None else float("inf"))
            pm.optimizer.step()
            pm.scheduler.step()
            if it == 0:
                out = dict(totals)
                out["grad_norm"] = float(grad_norm)
                for turn, kls in kl_by_turn.items():
                    out[f"turn_{turn + 1}/reference_kl_mean"] = _mean(kls)
                    out[f"turn_{turn + 1}/reference_kl_penalty_mean"] = a.beta * _mean(kls)
                if ref is not None:
                    out["reference_kl_mean"] = totals.get("kl", 0.0)
                    out["reference_kl_penalty_mean"] = a.beta * totals.get("kl", 0.0)
            else:
                out["loss_last_iteration"] = totals.get("loss", 0.0)
                out["clip_fraction_last_iteration"] = totals.get("clip_fraction", 0.0)
        out.pop("kl", None)
        out["learning_rate"] = float(pm.scheduler.get_last_lr()[0])
        pm.model.eval()
        return out

    # -- evaluation -------------------------------------------------------------------------------
    def _begin_evaluation(self, num_eval_samples: int | None) -> tuple[int, Any]:
        """``(n, seeds)`` for one evaluation: how many of the first evaluation items to play
        (``num_eval_samples``, default ``args.eval_num_samples``, capped by the split; 0 without
        an evaluation split) and ``seeds(k)``, ``k`` seeds from the evaluation's own generator,
        so that evaluating never shifts the training run's samples. Counts the evaluation."""
        import numpy as np

        if self.eval_env is None:
            return 0, None
        a = self.args
        n = a.eval_num_samples if num_eval_samples is None else num_eval_samples
        check_int("num_eval_samples", n, 0)
        n = eval_count(self.eval_env, self._eval_items, n)
        if n == 0:
            return 0, None
        rng = np.random.default_rng([a.seed, 1_000_003, self.state.evaluations])
        self.state.evaluations += 1

        def seeds(k: int) -> list[int]:
            return [int(s) for s in rng.integers(0, 2**62, size=k)]

        return n, seeds

    def evaluate(self, num_eval_samples: int | None = None) -> dict[str, float]:
        """Evaluate on the first ``num_eval_samples`` evaluation items (default
        ``args.eval_num_samples``) without updating weights: one joint response per turn
        (``eval_pass_k`` independent ones for pass@k). Logs and returns ``eval/...`` metrics;
        ``{}`` without an evaluation split."""

        from collab_env.adapters.common.rollout import episode_item

        n, seeds = self._begin_evaluation(num_eval_samples)
        if n == 0:
            return {}
        a = self.args
        k = a.eval_pass_k
        all_levels: list[list[Any]] = [[] for _ in range(a.num_turns)]
        rows: list[dict[str, Any]] = []
        passes, best = [], []
        for start in range(0, n, a.eval_batch_size):
            indices = list(range(start, min(n, start + a.eval_batch_size)))
            roots, levels = self._rollout(self.eval_env, indices, lambda d: k if d == 0 else 1, "aligned",
                                          self._sampling(True), seeds, training=False)
            for d, nodes in enumerate(levels):
                all_levels[d].extend(nodes)
            by_root = {r.root: r for r in roots}
            for r in roots:
                chain_returns = [_mean(ja.returns) for ja in r.joint]
                if chain_returns:
                    best.append(max(chain_returns))
                    passes.append(float(max(chain_returns) >= a.eval_pass_threshold))
            if self.eval_logger is not None:
                completions = [[_chain_texts(by_root.get(j), agent, a.num_turns) for j in range(len(indices))]
                               for agent in range(len(self.players))]
                items = [dict(episode_item(by_root[j].env)) if j in by_root else {} for j in range(len(indices))]
                prompts = [str(it.get("prompt", by_root[j].prompts.get(0, "") if j in by_root else ""))
                           for j, it in enumerate(items)]
                out = self.eval_logger(agent_completions_turns=completions, batch_items=items, prompts=prompts)
                if not isinstance(out, list) or not all(isinstance(x, Mapping) for x in out):
                    raise TaskFunctionError(f"eval_logger must return a list of dict rows, got {type(out).__name__}.")
                rows.extend(dict(x) for x in out)
        metrics = turn_metrics([lv for lv in all_levels if lv], "eval/")
        if k > 1:
            metrics[f"eval/pass@{k}"] = _mean(passes)
            metrics[f"eval/best_of_{k}_return"] = _mean(best)
        if self.eval_logger is not None:
            custom = (self.eval_aggregator(rows, num_turns=a.num_turns) if self.eval_aggregator is not None
                      else _default_aggregate(rows))
            if not isinstance(custom, Mapping):
                raise TaskFunctionError(f"eval_aggregator must return a dict, got {type(custom).__name__}.")
            metrics.update({f"eval/{key}": float(v) for key, v in custom.items()})
        self.logger.log(metrics, env_step=self.state.env_step, epoch=self.state.epoch, item=self.state.items_done)
        if a.plot:
            self.logger.plot()
        return metrics

    # -- checkpoints ------------------------------------------------------------------------------
    def save_checkpoint(self, path: str | Path | None = None) -> Path:
        """Save models, optimisers, schedulers, position and RNG states (default folder
        ``<output_dir>/checkpoint-<items done>``); resume with ``train(resume_from_checkpoint=...)``."""
        from collab_env.adapters.common.checkpoint import save_checkpoint

        path = Path(path) if path is not None else Path(self.args.output_dir) / f"checkpoint-{self.state.items_done}"
        return save_checkpoint(path, self._unique, asdict(self.state), self._rng)

    def close(self) -> None:
        """Finish logging (closes the Weights & Biases run)."""
        self.logger.close()


# -- helpers ------------------------------------------------------------------------------------
def dataset_items(env: Any, max_steps: int | None) -> int | None:
    """Items of a dataset-path env's split: its length; for a streamed split (an
    ``IterableDataset``) ``None`` when ``max_steps`` bounds training (rows are then read as
    needed), else the stream is read once to its end to count them. ``0`` without an env."""
    if env is None:
        return 0
    n = _num_items(env)
    if n is not None:
        return n
    if max_steps is not None and max_steps > 0:
        return None
    if max_steps is None:  # evaluation split: counted lazily (``evaluate`` reads what it needs)
        return None
    return len(env.unwrapped.task.dataset)


def streamed_rows(env: Any) -> Any:
    """The :class:`~collab_env.tasks.dataset_env.StreamedRows` of a dataset-path env, or None."""
    from collab_env.tasks.dataset_env import StreamedRows

    rows = getattr(getattr(getattr(env, "unwrapped", None), "task", None), "dataset", None)
    return rows if isinstance(rows, StreamedRows) else None


def eval_count(env: Any, known_items: int | None, requested: int) -> int:
    """How many of the first ``requested`` evaluation items exist: at most ``known_items`` when
    the split's length is known, else (a streamed split) as many rows as the stream holds."""
    if known_items is not None:
        return min(requested, known_items)
    rows = streamed_rows(env)
    return rows.available(requested) if rows is not None else requested


def _num_items(env: Any) -> int | None:
    for obj in (env, getattr(env, "unwrapped", None)):
        task = getattr(obj, "task", None) if obj is not None else None
        if task is not None and hasattr(task, "num_items"):
            return task.num_items()
    return None


def turn_metrics(levels: Sequence[Sequence[Any]], prefix: str) -> dict[str, float]:
    """``turn_k/reward_mean`` and ``turn_k/expected_return``: means over the joint actions of
    depth ``k - 1`` (and over the trained agents)."""
    out: dict[str, float] = {}
    for d, nodes in enumerate(levels):
        joint = [ja for n in nodes for ja in n.joint]
        if not joint:
            continue
        out[f"{prefix}turn_{d + 1}/reward_mean"] = _mean([_mean(ja.rewards) for ja in joint])
        out[f"{prefix}turn_{d + 1}/expected_return"] = _mean([_mean(ja.returns) for ja in joint])
    return out


def kl_per_turn(logp, ref_logp, mask, samples, into: dict[int, list[float]]) -> None:
    """Append each sample's token-mean k3 KL to the reference to ``into[turn]`` (``samples[i][3]``
    is the turn of row ``i``), for the per-turn KL metrics."""
    from collab_env.adapters.common.losses import kl_k3

    kl = kl_k3(logp, ref_logp, mask)
    per_seq = (kl.sum(-1) / mask.sum(-1).clamp(min=1)).tolist()
    for value, s in zip(per_seq, samples, strict=True):
        into.setdefault(s[3], []).append(float(value))


def _chain_texts(root: Any, agent: int, num_turns: int) -> list[str]:
    """The first sample's completion texts of ``agent``, one per turn it reached."""
    texts: list[str] = []
    node = root
    while node is not None and node.joint:
        ja = node.joint[0]
        j = ja.choice.get(agent)
        texts.append(node.completions[agent][j].text if j is not None else "")
        node = ja.child
    return texts[:num_turns]


def _default_aggregate(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    keys = sorted({k for r in rows for k, v in r.items() if isinstance(v, (int, float)) and not isinstance(v, bool)})
    return {k: _mean([float(r[k]) for r in rows if k in r]) for k in keys}

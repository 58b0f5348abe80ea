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
   mean return of its child's joint actions (no child: its reward; CoMLRL's MAGRPO is this rule
   undiscounted, ``discount=1.0`` under ``preset="comlrl"``). A completion's value is its joint
   action's return (aligned) or, crossed, the mean (``cross_value="mean"``) or the sum
   (``"sum"``, CoMLRL's) of the returns of the joint actions it is part of; each agent's
   completions at a node get group-relative advantages (mean-centred, optionally divided by the
   std) of their values.
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

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from collab_env.adapters.common.config import (
    TrainerConfig,
    as_bool,
    check_choice,
    check_comlrl_rollout_fields,
    check_float,
    check_int,
)
from collab_env.adapters.common.loop import TrainerState, mean
from collab_env.adapters.common.task import dataset_items, eval_count, streamed_rows, turn_metrics
from collab_env.adapters.common.tree_learner import TreeLearner
from collab_env.adapters.common.update import kl_per_turn
from collab_env.errors import ConfigError

# dataset_items, eval_count, streamed_rows, turn_metrics and kl_per_turn live in the toolkit
# (collab_env.adapters.common.task / .update); they stay importable from here.
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
    # log-probs of the raw logits, the loss -A * sum(log p) averaged over completions, the
    # formatter's string tokenised as it is, undiscounted returns (its discount is never read)
    # and a crossed completion valued by the sum of its joint actions' returns.
    COMLRL_DEFAULTS: ClassVar[dict[str, Any]] = {
        "num_train_epochs": 20, "learning_rate": 5e-6, "logging_steps": 50, "num_agents": 2,
        "num_generations": 4, "max_new_tokens": 256, "temperature": 0.6, "top_p": 0.6, "top_k": 50,
        "num_turns": 2, "discount": 1.0, "joint_mode": "aligned", "early_termination_threshold": -0.2,
        "external_prompt_passthrough": False, "eval_interval": 16, "eval_num_samples": 4,
        "eval_batch_size": 1, "rollout_buffer_size": 2, "train_batch_size": None,
        "normalize_advantages": True, "reference_kl_enabled": False, "reference_kl_coef": 0.1,
        "cross_value": "sum",
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
    """Weight of the children's mean return in a joint action's return. CoMLRL's MAGRPOConfig
    has this field too, but its trainer never reads it: its returns are always undiscounted
    (1.0, the preset's value); a discount passed with ``preset="comlrl"`` departs from it."""
    cross_value: Literal["mean", "sum"] = "mean"
    """``joint_mode="cross"``: a completion's value (what its advantage comes from) is the mean
    of the returns of the joint actions it is part of (the marginal over the other agents'
    choices), or their sum (``"sum"``, CoMLRL's: ``num_generations ** (num_agents - 1)`` times
    the mean, so larger advantages without ``normalize_advantages`` and a relatively smaller
    ``reference_kl_coef`` penalty). Aligned joint actions: the same either way."""
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
        check_choice("cross_value", self.cross_value, ("mean", "sum"))
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


class MAGRPOTrainer(TreeLearner):
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

    config_class = MAGRPOConfig

    def train_step(self, batch: Sequence[int]) -> dict[str, float]:
        """MAGRPO on the training items ``batch``: roll out their trees (``num_generations``
        completions per acting agent and node), take CoMLRL's reference KL off the returns when
        enabled, turn each node's returns into group-relative advantages and update every model
        (or, with ``rollout_buffer_size``, every agent whose buffer is full)."""
        from collab_env.adapters.common.losses import group_advantages

        a = self.args
        _, levels = self.rollout(self.train_env, batch, lambda d: a.num_generations, a.joint_mode,
                                 self.sampling(False), self.task.seeds)
        metrics = turn_metrics(levels, "")
        metrics["env_steps"] = float(sum(len(n.joint) for nodes in levels for n in nodes))
        kls = self.reference_kls(levels, metrics) if a.reference_kl_enabled else {}
        groups, lengths = self.node_groups(
            levels, lambda node, agent, values: group_advantages(values, normalize_std=a.normalize_advantages), kls)
        metrics["completion_length"] = mean(lengths)
        metrics.update(self.learn(groups))
        return metrics

    def loss(self, logp, old_logp, advantages, mask, *, ref_logp, loss_type, num_sequences, num_tokens):
        """The clipped surrogate (ratio to the sampling policy, ``clip_range`` /
        ``clip_range_high``) plus ``beta`` times the k3 KL to the reference
        (:func:`~collab_env.adapters.common.losses.policy_loss`)."""
        from collab_env.adapters.common.losses import policy_loss

        a = self.args
        return policy_loss(logp, old_logp, advantages, mask, ref_logp=ref_logp, beta=a.beta,
                           clip_low=a.clip_range, clip_high=a.clip_range_high, loss_type=loss_type,
                           num_sequences=num_sequences, num_tokens=num_tokens)

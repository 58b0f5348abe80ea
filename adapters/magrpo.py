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

This file is the config (:class:`MAGRPOConfig`), the step (:meth:`MAGRPOTrainer.train_step`)
and the loss (:meth:`MAGRPOTrainer.loss`); the rest is the tree learners' toolkit
(:mod:`~collab_env.adapters.common.tree_learner`: set-up, the trees, the groups, one policy
update, evaluation and checkpoints).

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
from typing import Any, ClassVar

from collab_env.adapters.common.config import (
    PPOFields,
    RolloutFields,
    SamplingFields,
    TrainerConfig,
    TreeFields,
    check_int,
    check_tree_buffer,
    learner_config,
    learner_sampling,
)
from collab_env.adapters.common.loop import mean
from collab_env.adapters.common.losses import group_advantages, policy_loss
from collab_env.adapters.common.task import turn_metrics
from collab_env.adapters.common.tree_learner import TreeLearner

__all__ = ["MAGRPOConfig", "MAGRPOTrainer"]


@learner_config
class MAGRPOConfig(SamplingFields, RolloutFields, TreeFields, PPOFields, TrainerConfig):
    """Configuration of :class:`MAGRPOTrainer`: the common fields
    (:class:`~collab_env.adapters.common.config.TrainerConfig`: learning rate, schedule, LoRA,
    evaluation and logging...) and the sampling, rollout, tree and PPO field groups of
    :mod:`~collab_env.adapters.common.config`, with the CoMLRL guide's names.

    CoMLRL's names are accepted with CoMLRL's meaning: ``agent_learning_rate`` is
    ``learning_rate`` and ``advantage_normalization`` is ``normalize_advantages``;
    ``early_termination_threshold``, ``external_prompt_passthrough``, ``reference_kl_enabled``,
    ``reference_kl_coef``, ``rollout_buffer_size`` and ``train_batch_size`` are fields of their
    own. ``discount`` weighs the children's mean return (CoMLRL's MAGRPOConfig has it too, but
    its trainer never reads it: its returns are undiscounted, the preset's 1.0).
    ``rollout_buffer_size``: each agent collects this many tree nodes (its ``num_generations``
    completions at one node) before it updates; each turn's nodes are shuffled and cut into
    optimiser steps of ``train_batch_size`` nodes. ``preset="comlrl"`` sets CoMLRL's defaults
    (``COMLRL_DEFAULTS``)."""

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

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("num_generations", self.num_generations, 2)  # a group to compare
        check_tree_buffer(self)


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
        a = self.args
        # 1. the rollout trees, returns filled (reward + discount * mean child return)
        _, levels = self.rollout(self.train_env, batch, lambda depth: a.num_generations, a.joint_mode,
                                 learner_sampling(a), self.task.seeds)
        metrics = turn_metrics(levels, "")
        metrics["env_steps"] = float(sum(len(n.joint) for nodes in levels for n in nodes))
        # 2. CoMLRL's reference KL, taken off each completion's value
        kls = self.reference_kls(levels, metrics) if a.reference_kl_enabled else {}

        # 3. group-relative advantages of each node's completions, per acting agent
        def advantages(node: Any, agent: int, values: list[float]) -> list[float]:
            return group_advantages(values, normalize_std=a.normalize_advantages)

        groups, lengths = self.node_groups(levels, advantages, kls)
        metrics["completion_length"] = mean(lengths)
        # 4. one policy update per model with MAGRPOTrainer.loss
        metrics.update(self.learn(groups))
        return metrics

    def loss(self, logp, old_logp, advantages, mask, *, ref_logp, loss_type, num_sequences, num_tokens):
        """The clipped surrogate (ratio to the sampling policy, ``clip_range`` /
        ``clip_range_high``) plus ``beta`` times the k3 KL to the reference
        (:func:`~collab_env.adapters.common.losses.policy_loss`)."""
        a = self.args
        return policy_loss(logp, old_logp, advantages, mask, ref_logp=ref_logp, beta=a.beta,
                           clip_low=a.clip_range, clip_high=a.clip_range_high, loss_type=loss_type,
                           num_sequences=num_sequences, num_tokens=num_tokens)

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

This file is the config (:class:`MAGRPOConfig`), the loop (:meth:`MAGRPOTrainer.train`), the
step (:meth:`MAGRPOTrainer.train_step`), who updates on what (:meth:`MAGRPOTrainer.learn`) and
the loss (:meth:`MAGRPOTrainer.loss`), read top to bottom; they call plain functions of the
tree learners' toolkit (:mod:`~collab_env.adapters.common.tree_learner`: expand the trees,
group the nodes, one policy update; :mod:`~collab_env.adapters.common.loop`: the schedule's
position, logging and checkpoints), which never call back. The set-up, evaluation and
checkpoints are the toolkit's :class:`~collab_env.adapters.common.tree_learner.TreeBase`.

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
3. **Update**, per model, ``num_iterations`` times over the same samples: the policy objective
   (``policy_objective``: PPO's clipped surrogate, with DAPO's clip-higher ``clip_range_high``
   and the two-sided ``clip_delta``, or CISPO; the ratio to the model before the update per
   token or, GSPO's, per sequence: ``importance_sampling_level``), weighted by the importance
   ratio to the sampler when ``is_correction`` is set, plus ``beta`` times the k3 KL to the
   reference, on completion tokens only (padding and prompts are masked out), aggregated per
   ``loss_type`` (GRPO, DAPO, BNPO, Dr. GRPO, CoMLRL's sum) exactly across micro-batches, then
   gradient clipping, an AdamW step and the learning-rate schedule. With ``dynamic_sampling``
   (DAPO's), groups whose values all tie are left out of the update (``groups_filtered``).
   Every agent's samples go through the same update, on its own model.

Evaluation follows the guide's schedule and metric names (``turn_k/reward_mean``,
``turn_k/expected_return``, ``eval/...``, ``turn_k/reference_kl_mean``,
``turn_k/reference_kl_penalty_mean``), logged against ``env_step``: the number of joint-action
reward evaluations so far.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

from collab_env.adapters.common.config import (
    PolicyLossFields,
    PPOFields,
    RolloutFields,
    SamplingFields,
    TrainerConfig,
    TreeFields,
    check_choice,
    check_int,
    check_tree_buffer,
    learner_config,
    learner_sampling,
)
from collab_env.adapters.common.distributed import merge_ranks, rank_world, shard
from collab_env.adapters.common.loop import (
    epoch_over,
    evaluation_due,
    flush_log,
    following_batch,
    log_due,
    mean,
    next_batch,
    next_epoch,
    progress,
    record_step,
    run_summary,
    save_due,
)
from collab_env.adapters.common.losses import group_advantages, policy_loss
from collab_env.adapters.common.task import turn_metrics
from collab_env.adapters.common.tree_learner import (
    Sample,
    TreeBase,
    buffer_chunks,
    expand_trees,
    mean_by_key,
    policy_update,
    reference_kls,
    samples_by_model,
    update_settings,
)
from collab_env.errors import ConfigError
from collab_env.policy import SamplingParams

__all__ = ["MAGRPOConfig", "MAGRPOTrainer"]


@learner_config
class MAGRPOConfig(PolicyLossFields, SamplingFields, RolloutFields, TreeFields, PPOFields, TrainerConfig):
    """Configuration of :class:`MAGRPOTrainer`: the common fields
    (:class:`~collab_env.adapters.common.config.TrainerConfig`: learning rate, schedule, LoRA,
    evaluation and logging...) and the sampling, rollout, tree, PPO and policy-loss field groups
    of :mod:`~collab_env.adapters.common.config`, with the CoMLRL guide's names (the policy-loss
    group, last, holds the objectives of TRL's ``GRPOConfig``: the README's Training section
    maps them).

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

    rollout_shape: Literal["tree", "chains"] = "tree"
    """``"tree"``: every node branches into ``num_generations`` completions and each node's
    completions are a group (CoMLRL's tree; turn-level credit by construction, MT-GRPO's tree
    variant). ``"chains"``: ``num_generations`` independent episodes per item (branching at the
    root only, one completion per later turn: the episodes TRL, verl and SkyRL roll), credited by
    ``chain_credit``."""
    chain_credit: Literal["turn", "episode"] = "turn"
    """``rollout_shape="chains"``: ``"turn"``: each move is compared with the same move (depth)
    of the item's other chains by its own reward (its joint action's reward: under the
    multiturn-aware reward, that reply's MR; MT-GRPO's turn-level grouping,
    :func:`~collab_env.adapters.common.turn_credit.turn_advantages`); ``"episode"``: every move
    of a chain gets its chain's return compared with the other chains' returns (one scalar per
    episode, as a trainer that sees whole episodes gives)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("num_generations", self.num_generations, 2)  # a group to compare
        check_tree_buffer(self)
        check_choice("rollout_shape", self.rollout_shape, ("tree", "chains"))
        check_choice("chain_credit", self.chain_credit, ("turn", "episode"))
        if self.rollout_shape == "chains":
            for name, bad in (("joint_mode='cross'", self.joint_mode == "cross"),
                              ("rollout_buffer_size", self.rollout_buffer_size is not None),
                              ("reference_kl_enabled", bool(self.reference_kl_enabled))):
                if bad:
                    raise ConfigError(f"rollout_shape='chains' does not combine with {name} (it groups a tree's "
                                      "nodes); use rollout_shape='tree' for it.")


class MAGRPOTrainer(TreeBase):
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

    def train(self, resume_from_checkpoint: str | Path | None = None) -> dict[str, Any]:
        """Train for ``num_train_epochs`` (or ``max_steps`` items), evaluating on the guide's
        schedule; resume from a checkpoint folder when given. Returns the last logged training
        metrics."""
        if self.train_env is None:
            raise ConfigError("train() needs train_dataset= (or env=).")
        if resume_from_checkpoint is not None:
            self.resume(resume_from_checkpoint)
        s, st = self.schedule(), self.state  # batches of training items from the state's position
        bar = progress(s, st, self.logger)
        last: dict[str, Any] = {}
        try:
            while (batch := next_batch(s, st)) is not None:
                if evaluation_due(s, st, len(batch)):
                    self.evaluate()
                if self._overlap is not None:  # async_rollouts: the next batch rolls out during this update
                    self._overlap.next_batch = following_batch(s, st, len(batch))
                updates = st.optimizer_steps
                record_step(s, st, self.train_step(batch), len(batch))
                if log_due(s, st):
                    last = flush_log(self, s.summed, s.log_item)
                if epoch_over(s, st):
                    next_epoch(st, self.end_epoch())
                if save_due(s, st, updates):
                    self.logger.wrote(self.save_checkpoint())
                if bar is not None:
                    bar.update(len(batch))
            if bar is not None:
                bar.close()
            next_end = self.end_epoch()
            if next_end:
                st.pending.append(next_end)
            if st.pending:
                last = flush_log(self, s.summed, s.log_item)
            if self.args.plot:
                self.logger.plot()
            self.logger.summary(s.desc, run_summary(s, st))
            return last
        finally:  # also on an error or an interrupt: no rollout outlives training
            if self._overlap is not None:
                self._overlap.close()

    def train_step(self, batch: Sequence[int]) -> dict[str, float]:
        """MAGRPO on the training items ``batch``: roll out their trees (``num_generations``
        completions per acting agent and node), take CoMLRL's reference KL off the returns when
        enabled, turn each node's returns into group-relative advantages and update every model
        (or, with ``rollout_buffer_size``, every agent whose buffer is full)."""
        a = self.args
        world = rank_world()[1]  # data parallel: each rank rolls out its share of the items
        # 1. the rollout trees, returns filled (reward + discount * mean child return); chains
        # branch at the root only
        chains = a.rollout_shape == "chains"
        _, levels = self.rollout(self.train_env, shard(batch) if world > 1 else batch,
                                 (lambda depth: a.num_generations if depth == 0 else 1) if chains
                                 else (lambda depth: a.num_generations), a.joint_mode,
                                 learner_sampling(a), self.task.seeds)
        metrics = turn_metrics(levels, "")
        metrics["env_steps"] = float(sum(len(n.joint) for nodes in levels for n in nodes))
        # 2. CoMLRL's reference KL, taken off each completion's value
        kls = reference_kls(self.models, levels, a.reference_kl_coef, metrics) if a.reference_kl_enabled else {}

        # 3. group-relative advantages of each node's completions, per acting agent
        tied: list[bool] = []  # per group, in node_groups' order: do its values all tie?

        def advantages(node: Any, agent: int, values: list[float]) -> list[float]:
            tied.append(len(set(values)) <= 1)
            return group_advantages(values, normalize_std=a.normalize_advantages)

        if chains:  # per depth across the item's chains (turn credit) or per chain return
            groups, lengths = self.chain_groups(levels, advantages, a.chain_credit)
        else:
            groups, lengths = self.node_groups(levels, advantages, kls)
        metrics["completion_length"] = mean(lengths)
        if a.dynamic_sampling:  # DAPO: a group of tied values has zero advantages, no signal
            metrics["groups_filtered"] = float(sum(tied))
            groups = [g for g, t in zip(groups, tied, strict=True) if not t]
        # 4. one policy update per model with MAGRPOTrainer.loss (data parallel: on every rank)
        if groups or world > 1:
            metrics.update(self.learn(groups))
        return merge_ranks(metrics) if world > 1 else metrics

    def rollout(self, env: Any, indices: Sequence[int], branching: Any, joint_mode: Literal["aligned", "cross"],
                sampling: SamplingParams, seeds: Any) -> tuple[list[Any], list[list[Any]]]:
        """The training trees of ``indices`` (:func:`~collab_env.adapters.common.tree_learner.expand_trees`
        with the live models). With ``async_rollouts``, a rollout of the training env with the
        task's seeds is the one the frozen copy started in the background during the previous
        step (or starts now), and the next batch's starts before this returns
        (:mod:`~collab_env.adapters.common.async_rollout`). Returns ``(roots, levels)``."""
        def grow(batch: Sequence[int], draw: Any, models: Sequence[Any]) -> Any:
            return expand_trees(self.task, env, batch, models, self.args, branching=branching, joint_mode=joint_mode,
                                sampling=sampling, seeds=draw)

        if self._overlap is None or env is not self.train_env or seeds != self.task.seeds:
            return grow(indices, seeds, self.models)
        frozen = self._overlap.models
        result, self._rollout_metrics = self._overlap.take(indices, (joint_mode, sampling),
                                                           lambda b, draw: grow(b, draw, frozen))
        return result

    def learn(self, groups: Sequence[tuple[int, list[Sample]]]) -> dict[str, float]:
        """One policy update per model on the batch's groups ``(agent, samples)`` (agents sharing
        a model update it together); with ``rollout_buffer_size``, CoMLRL's: each agent's groups
        wait in its buffer, which updates when full."""
        a = self.args
        per_model: list[dict[str, float]] = []
        if a.rollout_buffer_size is None:
            for pm, samples in samples_by_model(groups, self.models, self._unique):
                per_model.append(policy_update(pm, samples, self.loss, **update_settings(a)))
            self.state.optimizer_steps += self.iterations
        else:
            for agent, group in groups:
                self._buffers[agent].append(group)
                if len(self._buffers[agent]) >= a.rollout_buffer_size:
                    per_model.extend(self._flush_buffer(agent))
        out = mean_by_key(per_model)
        out.update(self._rollout_metrics)  # async_rollouts: how stale the batch was, how long it was awaited
        self._rollout_metrics = {}
        return out

    def _flush_buffer(self, agent: int) -> list[dict[str, float]]:
        """CoMLRL's update of one agent's buffer: its nodes by turn, shuffled, in optimiser steps
        of ``train_batch_size`` nodes (:func:`~collab_env.adapters.common.tree_learner.buffer_chunks`)."""
        a = self.args
        buffer, self._buffers[agent] = self._buffers[agent], []
        out = []
        for chunk in buffer_chunks(buffer, a.train_batch_size or a.rollout_buffer_size or 1, self._rng):
            out.append(policy_update(self.models[agent], chunk, self.loss, **update_settings(a)))
            self.state.optimizer_steps += self.iterations
        return out

    def end_epoch(self) -> dict[str, float]:
        """CoMLRL's update on what is left in the rollout buffers, at every epoch's end."""
        return mean_by_key([m for agent in range(len(self._buffers)) if self._buffers[agent]
                            for m in self._flush_buffer(agent)])

    def loss(self, logp, old_logp, advantages, mask, *, ref_logp, loss_type, num_sequences, num_tokens,
             loss_tokens, is_weight):
        """The loss of one micro-batch (what :func:`~collab_env.adapters.common.tree_learner.policy_update`
        is given): the policy objective (``policy_objective``, ``importance_sampling_level``,
        ``clip_range`` / ``clip_range_high``, ``clip_delta``), weighted by the importance weights
        against the sampler, plus ``beta`` times the k3 KL to the reference
        (:func:`~collab_env.adapters.common.losses.policy_loss`); ``loss_type`` is the reduction
        :func:`~collab_env.adapters.common.losses.aggregation_plan` chose for the config's."""
        a = self.args
        return policy_loss(logp, old_logp, advantages, mask, ref_logp=ref_logp, beta=a.beta,
                           clip_low=a.clip_range, clip_high=a.clip_range_high, delta=a.clip_delta,
                           objective=a.policy_objective, level=a.importance_sampling_level, is_weight=is_weight,
                           loss_type=loss_type, num_sequences=num_sequences, num_tokens=num_tokens,
                           loss_tokens=loss_tokens)

"""MAREINFORCE: multi-agent REINFORCE with a mean, leave-one-out (RLOO), greedy (ReMax) or no
baseline (REINFORCE when there is one agent).

The trainer surface is MAGRPO's (CoMLRL's), so the same script trains either learner::

    from collab_env.adapters.reinforce import MAREINFORCEConfig, MAREINFORCETrainer

    trainer = MAREINFORCETrainer(agent_model="embedded", num_agents=2, formatters=formatters,
                                 reward_func=reward_func, train_dataset=train_dataset,
                                 eval_dataset=eval_dataset,
                                 args=MAREINFORCEConfig(num_agents=2, baseline="rloo"))
    trainer.train()
    metrics = trainer.evaluate(num_eval_samples=len(eval_dataset))

``MARLOOConfig``/``MARLOOTrainer`` and ``MAReMaxConfig``/``MAReMaxTrainer`` are the same
learner with ``baseline`` fixed to ``"rloo"`` / ``"remax"``. ``env="length-ratio"`` trains on a
registered environment, exactly as with :class:`~collab_env.adapters.magrpo.MAGRPOTrainer`.

The algorithm, per batch of training items:

1. **Rollout tree**: MAGRPO's (``num_generations`` completions per acting agent and node,
   aligned or crossed joint actions, returns = reward + ``discount`` * mean child return).
2. **Baseline** (:func:`~collab_env.adapters.common.baselines.baseline_advantages`): each
   agent's completions at a node get ``return - baseline``, optionally divided by the group's
   std. For ``"remax"`` the baseline is the return of one extra **greedy rollout** from the
   node: every acting agent answers at temperature 0, the env scores the joint action, and the
   chain continues greedily to the tree's depth (its rewards are discounted like the tree's).
3. **Update**, once per batch (on-policy: no ratio, no clipping): the loss
   ``-(advantage * log-prob)`` on completion tokens plus ``beta`` times the k3 KL to the
   reference, aggregated per ``loss_type``, one AdamW step per model. ``loss_type="dapo"`` (the
   default: every token weighs the same) is the textbook estimator
   ``-sum_i A_i * sum_t log p(y_it)`` divided by the batch's token count; ``"grpo"`` averages
   the log-probs of each sequence first.

Evaluation and logging follow MAGRPO (the guide's schedule: before the first item of every epoch,
then every ``eval_interval`` training items; the metric names ``turn_k/reward_mean``,
``turn_k/expected_return``, ``eval/...``); ReMax adds ``turn_k/greedy_return``, and ``env_step``
counts the greedy rollouts' reward evaluations too.

This file is the config (:class:`MAREINFORCEConfig`), the loop (:meth:`MAREINFORCETrainer.train`),
the step (:meth:`MAREINFORCETrainer.train_step`), who updates on what
(:meth:`MAREINFORCETrainer.learn`) and the loss (:func:`reinforce_loss`), read top to bottom, as
MAGRPO's file is; they call plain functions of the tree learners' toolkit
(:mod:`~collab_env.adapters.common.tree_learner`, :mod:`~collab_env.adapters.common.loop`), which
never call back. The set-up, evaluation and checkpoints are
:class:`~collab_env.adapters.common.tree_learner.TreeBase`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

import collab_env.adapters as adapters_package
from collab_env._async import run_sync
from collab_env.adapters import magrpo
from collab_env.adapters.common.baselines import BASELINES, baseline_advantages
from collab_env.adapters.common.config import (
    RolloutFields,
    SamplingFields,
    TrainerConfig,
    TreeFields,
    check_choice,
    check_tree_buffer,
    learner_config,
    learner_sampling,
)
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
from collab_env.adapters.common.losses import kl_k3, masked_aggregate
from collab_env.adapters.common.rollout import TreeNode, compute_returns, expand_tree
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

__all__ = [
    "MAREINFORCEConfig", "MAREINFORCETrainer", "MARLOOConfig", "MARLOOTrainer", "MAReMaxConfig",
    "MAReMaxTrainer", "reinforce_loss",
]


@learner_config
class MAREINFORCEConfig(SamplingFields, RolloutFields, TreeFields, TrainerConfig):
    """Configuration of :class:`MAREINFORCETrainer`: MAGRPO's field groups except PPO's (one
    on-policy pass, no ratio, no clipping), plus ``baseline``. ``preset="comlrl"`` sets
    CoMLRL's MAGRPO defaults (those of the fields this config has)."""

    COMLRL_DEFAULTS: ClassVar[dict[str, Any]] = {
        k: v for k, v in magrpo.MAGRPOConfig.COMLRL_DEFAULTS.items() if k not in ("num_iterations",)}

    baseline: Literal["mean", "rloo", "remax", "none"] = "mean"
    """Subtracted from each completion's return: the group mean, the mean of the other
    completions (leave-one-out), the return of a greedy rollout from the same node (ReMax: one
    extra greedy rollout per node), or nothing (plain REINFORCE)."""
    num_generations: int = 4
    """Completions each agent samples per node; ``"mean"``/``"rloo"`` need >= 2, ``"remax"``
    and ``"none"`` work with 1."""
    loss_type: Literal["grpo", "dapo", "bnpo", "dr_grpo", "sum"] = "dapo"
    """``"dapo"``: ``-sum(A * log-prob)`` over all completion tokens divided by their count
    (REINFORCE's sum of log-probs, up to a constant); ``"grpo"``: mean per sequence first;
    ``"sum"``: sum per sequence, mean over sequences (CoMLRL); the others as in
    :attr:`~collab_env.adapters.common.config.TreeFields.loss_type`."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_tree_buffer(self)
        check_choice("baseline", self.baseline, BASELINES)
        if self.num_generations == 1 and self.baseline in ("mean", "rloo"):
            raise ConfigError(f"baseline={self.baseline!r} compares the samples of a group: set num_generations >= 2, "
                              "or use baseline='remax' or 'none' with one sample.")
        if self.num_generations == 1 and self.normalize_advantages:
            raise ConfigError("normalize_advantages divides by the std of a group: set num_generations >= 2.")


@learner_config
class MARLOOConfig(MAREINFORCEConfig):
    """:class:`MAREINFORCEConfig` with the leave-one-out baseline (the config of
    :class:`MARLOOTrainer`)."""

    baseline: Literal["mean", "rloo", "remax", "none"] = "rloo"
    """Fixed to ``"rloo"`` for :class:`MARLOOTrainer`."""


@learner_config
class MAReMaxConfig(MAREINFORCEConfig):
    """:class:`MAREINFORCEConfig` with the greedy-rollout baseline (the config of
    :class:`MAReMaxTrainer`)."""

    baseline: Literal["mean", "rloo", "remax", "none"] = "remax"
    """Fixed to ``"remax"`` for :class:`MAReMaxTrainer`."""


def reinforce_loss(logp, advantages, mask, *, ref_logp=None, beta: float = 0.0,
                   loss_type: Literal["sequence", "token"] = "token",
                   num_sequences: int | None = None, num_tokens: int | None = None, is_weight=None):
    """The REINFORCE loss of one micro-batch: per token ``-A * logp`` (``A`` the sequence's
    advantage; times ``is_weight``, the importance weights against the sampler, when given)
    plus ``beta`` times the k3 KL to the reference, aggregated by
    :func:`~collab_env.adapters.common.losses.masked_aggregate` over the whole batch's
    ``num_sequences`` / ``num_tokens`` (default: this micro-batch's).

    Returns:
        ``(loss, stats)``: a scalar tensor with gradient and detached float shares
        ``policy_loss``, ``loss`` and, with ``ref_logp``, ``kl``.
    """
    import torch

    num_sequences = int(mask.shape[0]) if num_sequences is None else num_sequences
    num_tokens = int(mask.sum().item()) if num_tokens is None else num_tokens
    m = mask.bool()
    per_token = torch.where(m, -advantages.to(logp.dtype).unsqueeze(-1) * logp, torch.zeros_like(logp))
    if is_weight is not None:
        per_token = per_token * is_weight.detach().to(per_token.dtype)
    loss = masked_aggregate(per_token, mask, loss_type, num_sequences, num_tokens)
    stats = {"policy_loss": loss.detach()}
    if ref_logp is not None:
        kl = masked_aggregate(kl_k3(logp, ref_logp, mask), mask, loss_type, num_sequences, num_tokens)
        stats["kl"] = kl.detach()
        if beta:
            loss = loss + beta * kl
    stats["loss"] = loss.detach()
    return loss, {k: v.to(torch.float32) for k, v in stats.items()}


class MAREINFORCETrainer(TreeBase):
    """Train LLM agents with multi-agent REINFORCE and the baseline of ``args.baseline``.

    A sibling of :class:`~collab_env.adapters.magrpo.MAGRPOTrainer` on the same set-up
    (:class:`~collab_env.adapters.common.tree_learner.TreeBase`): it takes exactly its
    arguments (dataset path or ``env=``); ``args`` must be a :class:`MAREINFORCEConfig`
    (default: all defaults).

    Raises:
        ConfigError: ``args`` of another type, or (for the named variants) a config whose
            ``baseline`` is not the variant's.
    """

    config_class: type[MAREINFORCEConfig] = MAREINFORCEConfig

    def __init__(self, agent_model: Any = None, num_agents: int | None = None, formatters: Any = None,
                 reward_func: Any = None, reward_processor: Any = None, train_dataset: Any = None,
                 eval_dataset: Any = None, args: MAREINFORCEConfig | None = None, *more: Any, **kwargs: Any) -> None:
        args = self.config_class() if args is None else args
        name = self.config_class.__name__
        if not isinstance(args, MAREINFORCEConfig):
            raise ConfigError(f"args must be a {name}, got {type(args).__name__} "
                              "(MAGRPOConfig belongs to MAGRPOTrainer).")
        if self.config_class is not MAREINFORCEConfig and args.baseline != self.config_class.baseline:
            raise ConfigError(f"{type(self).__name__} trains with baseline={self.config_class.baseline!r}, got "
                              f"args.baseline={args.baseline!r}: pass a {name}, or use MAREINFORCETrainer.")
        super().__init__(agent_model, num_agents, formatters, reward_func, reward_processor, train_dataset,
                         eval_dataset, args, *more, **kwargs)

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
                self.prefetch(following_batch(s, st, len(batch)))
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
            end = self.end_epoch()
            if end:
                st.pending.append(end)
            if st.pending:
                last = flush_log(self, s.summed, s.log_item)
            if self.args.plot:
                self.logger.plot()
            self.logger.summary(s.desc, run_summary(s, st))
            return last
        finally:  # also on an error or an interrupt: no rollout outlives training
            if self._overlap is not None:
                self._overlap.close()

    def prefetch(self, next_batch: Sequence[int] | None) -> None:
        """With ``async_rollouts``: the batch the step after the coming one takes (``None``:
        none), whose rollout starts before the coming step updates; otherwise nothing."""
        if self._overlap is not None:
            self._overlap.next_batch = list(next_batch) if next_batch else None

    def train_step(self, batch: Sequence[int]) -> dict[str, float]:
        """REINFORCE on the training items ``batch``: roll out their trees (and ReMax's greedy
        rollouts), subtract the baseline from each completion's return, take one on-policy
        optimiser step per model (or, with ``rollout_buffer_size``, per agent whose buffer is
        full)."""
        a = self.args
        # 1. the rollout trees, returns filled (reward + discount * mean child return)
        _, levels = self.rollout(self.train_env, batch, lambda depth: a.num_generations, a.joint_mode,
                                 learner_sampling(a), self.task.seeds)
        metrics = turn_metrics(levels, "")
        metrics["env_steps"] = float(sum(len(n.joint) for nodes in levels for n in nodes))
        # 2. ReMax: the greedy rollouts' returns, the baseline of each node
        greedy: dict[tuple[int, int], float] = {}
        if a.baseline == "remax":
            greedy, steps = self.greedy_returns(levels)
            metrics["env_steps"] += steps
            for d, nodes in enumerate(levels):
                metrics[f"turn_{d + 1}/greedy_return"] = mean([greedy[(id(n), i)] for n in nodes for i in n.acting])
        # 3. CoMLRL's reference KL, taken off each completion's value
        kls = reference_kls(self.models, levels, a.reference_kl_coef, metrics) if a.reference_kl_enabled else {}

        # 4. each completion's return less the baseline, per node and acting agent
        def advantages(node: Any, agent: int, values: list[float]) -> list[float]:
            return baseline_advantages(values, a.baseline, greedy_value=greedy.get((id(node), agent)),
                                       normalize_std=a.normalize_advantages)

        groups, lengths = self.node_groups(levels, advantages, kls)
        metrics["completion_length"] = mean(lengths)
        # 5. one on-policy update per model with reinforce_loss
        metrics.update(self.learn(groups))
        return metrics

    def rollout(self, env: Any, indices: Sequence[int], branching: Callable[[int], int],
                joint_mode: Literal["aligned", "cross"], sampling: SamplingParams,
                seeds: Callable[[int], list[int]]) -> tuple[list[Any], list[list[Any]]]:
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
        """One update per model on the batch's groups ``(agent, samples)`` (agents sharing a
        model update it together); with ``rollout_buffer_size``, CoMLRL's: each agent's groups
        wait in its buffer, which updates when full."""
        a = self.args
        per_model: list[dict[str, float]] = []
        if a.rollout_buffer_size is None:
            per_model = [self.update_model(pm, s) for pm, s in samples_by_model(groups, self.models, self._unique)]
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
            out.append(self.update_model(self.models[agent], chunk))
            self.state.optimizer_steps += self.iterations
        return out

    def end_epoch(self) -> dict[str, float]:
        """CoMLRL's update on what is left in the rollout buffers, at every epoch's end."""
        return mean_by_key([m for agent in range(len(self._buffers)) if self._buffers[agent]
                            for m in self._flush_buffer(agent)])

    def update_model(self, pm: Any, samples: Sequence[Sample]) -> dict[str, float]:
        """One on-policy update of ``pm`` on its samples
        (:func:`~collab_env.adapters.common.tree_learner.policy_update` with :meth:`loss` and the
        config's settings)."""
        return policy_update(pm, samples, self.loss, **update_settings(self.args))

    def loss(self, logp, old_logp, advantages, mask, *, ref_logp, loss_type, num_sequences, num_tokens,
             loss_tokens, is_weight):
        """:func:`reinforce_loss` of one micro-batch (on-policy: ``old_logp`` is not used)."""
        return reinforce_loss(logp, advantages, mask, ref_logp=ref_logp, beta=self.args.beta, loss_type=loss_type,
                              num_sequences=num_sequences, num_tokens=num_tokens, is_weight=is_weight)

    def greedy_returns(self, levels: Sequence[Sequence[Any]]) -> tuple[dict[tuple[int, int], float], int]:
        """ReMax's baselines: from every node, a greedy joint action continued greedily to the
        tree's depth. Returns ``{(id(node), agent): greedy return}`` and the number of reward
        evaluations the greedy rollouts cost."""
        a = self.args
        greedy = SamplingParams(temperature=0.0, max_new_tokens=a.max_new_tokens)
        out: dict[tuple[int, int], float] = {}
        steps = 0
        for d, nodes in enumerate(levels):
            # A fresh start per node on the node's own state: a step clones the env, so the tree's
            # node is left as it was.
            starts = [TreeNode(root=n.root, depth=n.depth, env=n.env, obs=n.obs, infos=n.infos,
                               players=n.players, acting=list(n.acting)) for n in nodes]
            chains = run_sync(expand_tree(starts, players=self.players, models=self.models, others=self.others,
                                          branching=lambda _: 1, max_depth=a.num_turns - d, joint_mode="aligned",
                                          sampling=greedy, seeds=self.task.seeds, prompt_format=a.prompt_format,
                                          others_sampling=self.task.others_sampling or None))
            compute_returns(chains, len(self.players), a.discount)
            steps += sum(len(n.joint) for lv in chains for n in lv)
            for node, start in zip(nodes, starts, strict=True):
                for agent in node.acting:
                    out[(id(node), agent)] = start.joint[0].returns[agent]
        return out, steps


class MARLOOTrainer(MAREINFORCETrainer):
    """:class:`MAREINFORCETrainer` with the leave-one-out baseline; ``args`` a
    :class:`MARLOOConfig`."""

    config_class = MARLOOConfig


class MAReMaxTrainer(MAREINFORCETrainer):
    """:class:`MAREINFORCETrainer` with ReMax's greedy-rollout baseline; ``args`` a
    :class:`MAReMaxConfig`."""

    config_class = MAReMaxConfig


def __getattr__(name: str) -> Any:
    # A CoMLRL import path (comlrl.trainers.<this module>) naming a class defined elsewhere here
    # gets an error that names the import that works.
    raise adapters_package.comlrl_path_error(__name__, name)

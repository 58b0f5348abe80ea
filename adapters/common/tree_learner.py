"""The toolkit of the learners that train on rollout trees (MAGRPO, REINFORCE, MADPO): plain
functions for the steps of a training step, and one set-up.

A step, in the order MAGRPO's ``train_step`` (:mod:`collab_env.adapters.magrpo`, which reads
top to bottom) calls them:

1. :func:`expand_trees`: **expand the trees** of a batch of task items
   (:func:`~collab_env.adapters.common.rollout.grow_trees` with the config's depth, prompt
   format, early termination and discount);
2. :func:`reference_kls` (optional): CoMLRL's reference KL of every completion;
3. :func:`group_nodes` (or :func:`group_chains`): **group the nodes**: per node and acting
   agent, its completions' values turned into advantages by the learner's function, as samples
   ``(prompt ids, completion ids, advantage, turn, sampler log-probs)`` (:data:`Sample`);
4. :func:`policy_update`: **one policy update** of one model on its samples (per model:
   :func:`samples_by_model`; through CoMLRL's rollout buffer: :func:`buffer_chunks`), with the
   loss the learner passes and the config's settings (:func:`update_settings`).

:class:`TreeBase` is the set-up they share: the task source (dataset or env path), the models
with their optimisers and schedules, the logger, the background rollouts of ``async_rollouts``,
the item schedule, evaluation and checkpoints. It has no training loop and no hook: each tree
learner's loop is in its own file (:mod:`~collab_env.adapters.magrpo`,
:mod:`~collab_env.adapters.reinforce`, :mod:`~collab_env.adapters.madpo`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, Literal

from collab_env.adapters.common.async_rollout import OverlappedRollouts
from collab_env.adapters.common.checkpoint import load_checkpoint, save_checkpoint
from collab_env.adapters.common.collapse import completion_stats
from collab_env.adapters.common.config import TrainerConfig, learner_sampling
from collab_env.adapters.common.distributed import (
    broadcast_parameters,
    global_totals,
    init_from_launcher,
    rank_world,
    sum_gradients,
    sum_stats,
)
from collab_env.adapters.common.learner import TaskLearner
from collab_env.adapters.common.logging import MetricsLogger
from collab_env.adapters.common.loop import RunState, Schedule, mean
from collab_env.adapters.common.losses import (
    aggregation_plan,
    importance_weights,
    kl_k3,
    pack_sequences,
    reference_kl_sums,
    token_logprobs,
)
from collab_env.adapters.common.rollout import completion_values, episode_item, grow_trees
from collab_env.adapters.common.task import turn_metrics
from collab_env.errors import ConfigError, TaskFunctionError
from collab_env.policy import SamplingParams

__all__ = ["TreeBase", "Sample", "expand_trees", "group_nodes", "group_chains", "reference_kls",
           "update_settings", "samples_by_model", "buffer_chunks", "mean_by_key", "policy_update", "kl_per_turn",
           "sample_collapse_stats"]

#: One training sample: (prompt ids, completion ids, advantage, 0-based turn, the sampler's
#: log-prob of each completion token or ``None`` when it reported none). :func:`policy_update`
#: also takes the first four alone (no sampler log-probs).
Sample = tuple[list[int], tuple[int, ...], float, int, tuple[float, ...] | None]

#: ``advantages(node, agent, values) -> advantages``: a learner's advantage of one group.
Advantages = Callable[[Any, int, list[float]], list[float]]


# ---------------------------------------------------------------------------------------------
# Expand the trees
# ---------------------------------------------------------------------------------------------
def expand_trees(task: Any, env: Any, indices: Sequence[int], models: Sequence[Any], args: Any, *,
                 branching: Callable[[int], int], joint_mode: Literal["aligned", "cross"], sampling: SamplingParams,
                 seeds: Callable[[int], list[int]], training: bool = True):
    """The rollout trees of the task items ``indices`` on ``env`` played by ``models``
    (:func:`~collab_env.adapters.common.rollout.grow_trees`): ``branching(depth)`` completions
    per acting agent and node, sampled with ``sampling``, ``args.num_turns`` deep, returns
    discounted by ``args.discount`` (reward plus ``discount`` times the mean return of the
    child's joint actions; CoMLRL's is this with discount 1), CoMLRL's early termination on
    training trees only. Returns ``(roots, levels)``."""
    return grow_trees(task, env, indices, models, branching=branching, max_depth=args.num_turns,
                      joint_mode=joint_mode, sampling=sampling, seeds=seeds, prompt_format=args.prompt_format,
                      stop_above=args.early_termination_threshold if training else None, discount=args.discount)


# ---------------------------------------------------------------------------------------------
# Group the nodes
# ---------------------------------------------------------------------------------------------
def _sample(node: Any, agent: int, comp: Any, adv: float) -> Sample:
    return (node.prompt_ids[agent], tuple(comp.token_ids or ()), adv, node.depth,
            None if comp.logprobs is None else tuple(comp.logprobs))


def group_nodes(levels: Sequence[Sequence[Any]], advantages: Advantages,
                kls: Mapping[tuple[int, int], list[float]] | None = None, *, coef: float = 0.0,
                reduce: Literal["mean", "sum"] = "mean") -> tuple[list[tuple[int, list[Sample]]], list[int]]:
    """Per node and acting agent, its samples with ``advantages(node, agent, values)`` of the
    completions' values (:func:`~collab_env.adapters.common.rollout.completion_values` with
    ``reduce``, the config's ``cross_value``; less ``coef`` times their reference KL when
    ``kls`` has them). ``advantages`` is called once per group, in the order of the returned
    groups. Each sample carries its completion's sampler log-probs (``Completion.logprobs``)
    for the importance sampling correction. Returns ``(groups, completion lengths)``."""
    groups: list[tuple[int, list[Sample]]] = []
    lengths: list[int] = []
    for nodes in levels:
        for node in nodes:
            for agent in node.acting:
                values = completion_values(node, agent, reduce)
                if kls:  # CoMLRL: the KL penalty comes off each completion's return
                    values = [v - coef * k for v, k in zip(values, kls[(id(node), agent)], strict=True)]
                adv = advantages(node, agent, values)
                group = [_sample(node, agent, comp, a) for comp, a in zip(node.completions[agent], adv, strict=True)]
                lengths.extend(len(g[1]) for g in group)
                groups.append((agent, group))
    return groups, lengths


def group_chains(levels: Sequence[Sequence[Any]], advantages: Advantages,
                 credit: str = "turn") -> tuple[list[tuple[int, list[Sample]]], list[int]]:
    """The samples of rollouts shaped as chains (``num_generations`` joint actions at each
    root, one below: independent episodes), with ``advantages(node, agent, values)`` called
    once per returned group, in order.

    ``credit="turn"``: per root, depth and acting agent, one group of the moves at that depth
    of the root's chains that reached it, valued by the move's own reward (its joint action's
    ``rewards``: the env's rewards from the move until a trained agent acts again; under the
    multiturn-aware reward, that reply's MR); ``node`` is the first such move's.
    ``credit="episode"``: per root and agent, one group of all its moves, each valued by its
    chain's return (the root joint action's ``returns``); ``node`` is the root. Returns
    ``(groups, completion lengths)``."""
    if credit not in ("turn", "episode"):
        raise ConfigError(f"credit must be 'turn' or 'episode', got {credit!r}.")
    groups: list[tuple[int, list[Sample]]] = []
    lengths: list[int] = []

    def sample(node: Any, ja: Any, agent: int, adv: float) -> Sample:
        comp = node.completions[agent][ja.choice[agent]]
        lengths.append(len(comp.token_ids or ()))
        return _sample(node, agent, comp, adv)

    for root in levels[0] if levels else ():
        chains = []
        for ja in root.joint:
            chain, node, step = [], root, ja
            while True:
                chain.append((node, step))
                node = step.child
                if node is None or not node.joint:
                    break
                step = node.joint[0]
            chains.append(chain)
        agents = sorted({ag for chain in chains for node, _ in chain for ag in node.acting})
        for agent in agents:
            if credit == "episode":
                members = [c for c in chains if any(agent in n.acting for n, _ in c)]
                adv = advantages(root, agent, [float(c[0][1].returns[agent]) for c in members])
                groups.append((agent, [sample(n, ja, agent, a_c) for c, a_c in zip(members, adv, strict=True)
                                       for n, ja in c if agent in n.acting]))
                continue
            depth = max(len(c) for c in chains)
            for d in range(depth):
                moves = [c[d] for c in chains if len(c) > d and agent in c[d][0].acting]
                if not moves:
                    continue
                adv = advantages(moves[0][0], agent, [float(ja.rewards[agent]) for _, ja in moves])
                groups.append((agent, [sample(n, ja, agent, a_m) for (n, ja), a_m in zip(moves, adv, strict=True)]))
    return groups, lengths


def reference_kls(models: Sequence[Any], levels: Sequence[Sequence[Any]], coef: float,
                  metrics: dict[str, float]) -> dict[tuple[int, int], list[float]]:
    """CoMLRL's reference KL of every completion (agent ``i`` played by ``models[i]``): the k3
    estimate of KL(policy || initial policy) summed over its tokens, from the raw logits,
    without gradient; ``{(id(node), agent): [KL per completion]}``. Adds
    ``turn_k/reference_kl_mean`` and ``turn_k/reference_kl_penalty_mean`` (times ``coef``) to
    ``metrics``."""

    out: dict[tuple[int, int], list[float]] = {}
    by_turn: dict[int, list[float]] = {}
    for nodes in levels:
        for node in nodes:
            for agent in node.acting:
                pm = models[agent]
                comps = node.completions[agent]
                batch = pack_sequences([node.prompt_ids[agent]] * len(comps),
                                       [tuple(c.token_ids or ()) for c in comps], pm.pad_id).to(pm.device)
                kl = reference_kl_sums(pm, batch).tolist()
                out[(id(node), agent)] = [float(x) for x in kl]
                by_turn.setdefault(node.depth, []).extend(float(x) for x in kl)
    for d, kls in by_turn.items():
        metrics[f"turn_{d + 1}/reference_kl_mean"] = mean(kls)
        metrics[f"turn_{d + 1}/reference_kl_penalty_mean"] = coef * mean(kls)
    return out


# ---------------------------------------------------------------------------------------------
# Who updates on what
# ---------------------------------------------------------------------------------------------
def update_settings(args: Any) -> dict[str, Any]:
    """The keywords of :func:`policy_update` from a learner's config: iterations
    (``num_iterations``, else 1), log-prob temperature, micro-batch, loss type (and
    ``max_new_tokens`` for ``"dr_grpo"``), KL, clipping and the importance sampling correction
    (:class:`~collab_env.adapters.common.config.PolicyLossFields`, off without them)."""
    return dict(iterations=getattr(args, "num_iterations", 1),
                temperature=args.logprob_temperature or args.temperature, micro_batch=args.train_micro_batch_size,
                loss_type=args.loss_type, beta=args.beta, max_grad_norm=args.max_grad_norm,
                max_new_tokens=getattr(args, "max_new_tokens", None),
                is_correction=getattr(args, "is_correction", None), is_cap=getattr(args, "is_cap", 3.0),
                is_floor=getattr(args, "is_floor", None))


def samples_by_model(groups: Sequence[tuple[int, list[Sample]]], models: Sequence[Any],
                     unique: Sequence[Any]) -> list[tuple[Any, list[Sample]]]:
    """``(model, samples)`` per distinct model (``unique``, in order) that plays an agent of the
    groups ``(agent, samples)``: agents sharing a model update it together."""
    out: dict[int, list[Sample]] = {}
    for agent, group in groups:
        owner = next(k for k, u in enumerate(unique) if u is models[agent])
        out.setdefault(owner, []).extend(group)
    if rank_world()[1] > 1:  # data parallel: every rank updates every model, in one order, samples or not
        return [(u, out.get(k, [])) for k, u in enumerate(unique)]
    return [(unique[k], samples) for k, samples in sorted(out.items())]


def buffer_chunks(buffer: Sequence[list[Sample]], size: int, rng: Any) -> list[list[Sample]]:
    """CoMLRL's update of one agent's rollout buffer (its nodes' sample groups): the nodes
    grouped by turn, each turn's nodes shuffled (``rng.permutation``) and cut into optimiser
    steps of ``size`` nodes; the samples of each step, in order."""
    by_turn: dict[int, list[list[Sample]]] = {}
    for group in buffer:
        by_turn.setdefault(group[0][3] if group else 0, []).append(group)
    out = []
    for turn in sorted(by_turn):
        nodes = [by_turn[turn][int(i)] for i in rng.permutation(len(by_turn[turn]))]
        for start in range(0, len(nodes), size):
            chunk = [s for group in nodes[start:start + size] for s in group]
            if chunk:
                out.append(chunk)
    return out


def mean_by_key(per_model: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Per metric, its mean over the updates that report it."""
    return {k: mean([m[k] for m in per_model if k in m]) for k in sorted({k for m in per_model for k in m})}


# ---------------------------------------------------------------------------------------------
# The set-up
# ---------------------------------------------------------------------------------------------
class TreeBase(TaskLearner):
    """The set-up of a tree learner (module docstring): no loop, no hook. Arguments are
    :class:`~collab_env.adapters.magrpo.MAGRPOTrainer`'s; ``config_class`` is the config type
    the subclass accepts (a :func:`~collab_env.adapters.common.config.learner_config` dataclass
    with :class:`~collab_env.adapters.common.config.SamplingFields`,
    :class:`~collab_env.adapters.common.config.RolloutFields` and
    :class:`~collab_env.adapters.common.config.TreeFields`)."""

    config_class: type = TrainerConfig
    overlaps_rollouts: bool = True
    """Whether a training step's rollout can overlap the previous update (``async_rollouts``);
    ``False`` for a learner that collects its samples before it trains (MADPO)."""

    def __init__(
        self,
        agent_model: Any = None,
        num_agents: int | None = None,
        formatters: Sequence[Callable[..., str]] | Callable[..., str] | None = None,
        reward_func: Callable[..., Any] | None = None,
        reward_processor: Callable[[float], float] | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        args: Any = None,
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
        args = self.config_class() if args is None else args
        if not isinstance(args, self.config_class):
            raise ConfigError(f"args must be a {self.config_class.__name__}, got {type(args).__name__}.")
        for name, fn in (("eval_logger", eval_logger), ("eval_aggregator", eval_aggregator)):
            if fn is not None and not callable(fn):
                raise ConfigError(f"{name} must be callable or None, got {type(fn).__name__}.")
        self.eval_logger = eval_logger
        self.eval_aggregator = eval_aggregator
        args = self.setup_task(
            args, agent_model=agent_model, tokenizer=tokenizer, num_agents=num_agents,
            need_reference=lambda a: a.beta > 0 or a.reference_kl_enabled,
            formatters=formatters, reward_func=reward_func, reward_processor=reward_processor,
            external_transition=external_transition, train_dataset=train_dataset, eval_dataset=eval_dataset,
            env=env, eval_env=eval_env, env_kwargs=env_kwargs, policies=policies, trained_players=trained_players)
        self.state = RunState()
        self._buffers: list[list[list[Sample]]] = [[] for _ in range(args.num_agents)]
        self.wandb_config = wandb_config
        self._overlap: OverlappedRollouts | None = None
        self._rollout_metrics: dict[str, float] = {}
        if getattr(args, "async_rollouts", False):
            self._overlap = self._overlapped_rollouts()
        # data parallel (torchrun etc.): every rank starts from rank 0's parameters; ranks > 0 log
        # and checkpoint under output_dir/rank<N>
        rank, world = init_from_launcher()
        if world > 1:
            if args.rollout_buffer_size is not None or getattr(args, "async_rollouts", False):
                raise ConfigError(f"data parallelism ({world} ranks) updates every rank in lockstep: "
                                  "rollout_buffer_size and async_rollouts are refused; leave them unset.")
            for pm in self._unique:
                broadcast_parameters(pm.model)
        self.rank = rank
        log_dir = Path(args.output_dir) / f"rank{rank}" if rank else Path(args.output_dir)
        self.logger = MetricsLogger(log_dir, {**args.to_dict(), **self.task.config_record()}, wandb_config)

    def _overlapped_rollouts(self) -> OverlappedRollouts:
        """``async_rollouts``: the frozen copy of the models that the background rollouts
        generate with. The rollouts hand it to the episode driver as the trained players'
        policies, so a multiturn-aware reward's futures are played by the copy that wrote the
        replies; evaluation plays the live models.

        Raises:
            ConfigError: A learner that collects its samples before training (MADPO), or vLLM
                generation.
        """
        name = type(self).__name__
        if not self.overlaps_rollouts:
            raise ConfigError(f"async_rollouts=True overlaps each training step's rollout with the previous update; "
                              f"{name} collects its samples before it trains: set async_rollouts=False.")
        if any(pm.engine is not None for pm in self._unique):
            raise ConfigError("async_rollouts=True generates with a frozen copy through transformers, but the models "
                              "generate with vLLM (generation_backend='auto' on CUDA): set generation_backend='hf'.")
        return OverlappedRollouts(self.models, self.task, self._updates_between)

    def _updates_between(self, then: Sequence[int], now: Sequence[int]) -> int:
        """Policy updates between two version tuples (optimiser steps per model)."""
        steps = max((n - t for t, n in zip(then, now, strict=True)), default=0)
        return -(-steps // self.iterations)

    @property
    def iterations(self) -> int:
        """Optimiser steps per update: the config's ``num_iterations`` (PPO's field group), else 1."""
        return getattr(self.args, "num_iterations", 1)

    # -- schedule ---------------------------------------------------------------------------------
    def planned_optimizer_steps(self) -> int:
        """Optimiser steps of the whole run (for the learning-rate schedule)."""
        a = self.args
        items = self.task.planned_items(a.num_train_epochs, a.max_steps)
        if a.rollout_buffer_size is not None:  # about one step per train_batch_size nodes of an agent
            per_item = sum((a.num_generations ** (d * (a.num_agents if a.joint_mode == "cross" else 1)))
                           for d in range(a.num_turns))
            return max(1, math.ceil(items * per_item / (a.train_batch_size or a.rollout_buffer_size)) * self.iterations)
        return max(1, math.ceil(items / a.per_device_train_batch_size) * self.iterations)

    def schedule(self) -> Schedule:
        """Training items in batches of ``per_device_train_batch_size``, CoMLRL's evaluation
        schedule, logs every ``logging_steps`` reward evaluations, checkpoints every
        ``save_steps`` items."""
        return self.item_schedule(self.args.per_device_train_batch_size, type(self).__name__.removesuffix("Trainer"))

    def resume(self, checkpoint: str | Path) -> None:
        """Take the models, optimisers, schedules, position and RNG states of a checkpoint
        folder (:meth:`save_checkpoint`); the log goes on from there."""
        self.state = RunState.from_dict(load_checkpoint(checkpoint, self._unique, self._rng))
        self.logger.resume()

    # -- the toolkit's grouping, as the steps call it ----------------------------------------------
    def node_groups(self, levels: Sequence[Sequence[Any]], advantages: Advantages,
                    kls: Mapping[tuple[int, int], list[float]] | None = None,
                    ) -> tuple[list[tuple[int, list[Sample]]], list[int]]:
        """:func:`group_nodes` with the config's ``reference_kl_coef`` and ``cross_value``
        (``"mean"`` when it has none)."""
        return group_nodes(levels, advantages, kls, coef=self.args.reference_kl_coef,
                           reduce=getattr(self.args, "cross_value", "mean"))

    def chain_groups(self, levels: Sequence[Sequence[Any]], advantages: Advantages,
                     credit: str = "turn") -> tuple[list[tuple[int, list[Sample]]], list[int]]:
        """:func:`group_chains` (``self`` is not used)."""
        return group_chains(levels, advantages, credit)

    # -- evaluation -------------------------------------------------------------------------------
    def evaluate(self, num_eval_samples: int | None = None) -> dict[str, float]:
        """Evaluate on the first ``num_eval_samples`` evaluation items (default
        ``args.eval_num_samples``) without updating weights: one joint response per turn
        (``eval_pass_k`` independent ones for pass@k). Logs and returns ``eval/...`` metrics;
        ``{}`` without an evaluation split."""
        a = self.args
        n, seeds = self.task.begin_evaluation(a.eval_num_samples if num_eval_samples is None else num_eval_samples,
                                              self.state)
        if n == 0:
            return {}
        k = a.eval_pass_k
        all_levels: list[list[Any]] = [[] for _ in range(a.num_turns)]
        rows: list[dict[str, Any]] = []
        passes, best = [], []
        for start in range(0, n, a.eval_batch_size):
            indices = list(range(start, min(n, start + a.eval_batch_size)))
            roots, levels = expand_trees(self.task, self.eval_env, indices, self.models, a,
                                         branching=lambda d: k if d == 0 else 1, joint_mode="aligned",
                                         sampling=learner_sampling(a, True), seeds=seeds, training=False)
            for d, nodes in enumerate(levels):
                all_levels[d].extend(nodes)
            by_root = {r.root: r for r in roots}
            for r in roots:
                chain_returns = [mean(ja.returns) for ja in r.joint]
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
            metrics[f"eval/pass@{k}"] = mean(passes)
            metrics[f"eval/best_of_{k}_return"] = mean(best)
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
        path = Path(path) if path is not None else self.logger.output_dir / f"checkpoint-{self.state.items_done}"
        return save_checkpoint(path, self._unique, asdict(self.state), self._rng)

    def close(self) -> None:
        """Finish logging (closes the Weights & Biases run); end the background rollouts'
        thread (``async_rollouts``)."""
        if self._overlap is not None:
            self._overlap.close()
        self.logger.close()




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
    return {k: mean([float(r[k]) for r in rows if k in r]) for k in keys}


# ---------------------------------------------------------------------------------------------
# One policy update
# ---------------------------------------------------------------------------------------------
def kl_per_turn(logp, ref_logp, mask, samples, into: dict[int, list[float]]) -> None:
    """Append each sample's token-mean k3 KL to the reference to ``into[turn]`` (``samples[i][3]``
    is the turn of row ``i``), for the per-turn KL metrics."""
    kl = kl_k3(logp, ref_logp, mask)
    per_seq = (kl.sum(-1) / mask.sum(-1).clamp(min=1)).tolist()
    for value, s in zip(per_seq, samples, strict=True):
        into.setdefault(s[3], []).append(float(value))


def sample_collapse_stats(pm: Any, samples: Sequence[Sample]) -> dict[str, float]:
    """The collapse statistics (:func:`~collab_env.adapters.common.collapse.completion_stats`) of
    ``samples``: visible tokens (``pm``'s tokenizer's special ids and padding dropped), duplicates
    counted among the samples of the same prompt."""
    special = set(getattr(pm.tokenizer, "all_special_ids", None) or ())
    special.add(pm.pad_id)
    return completion_stats([s[1] for s in samples], [tuple(s[0]) for s in samples], special)


def policy_update(pm: Any, samples: Sequence[Sample], loss: Callable[..., Any], *, iterations: int = 1,
                  temperature: float = 1.0, micro_batch: int = 8, loss_type: str = "grpo",
                  beta: float = 0.0, max_grad_norm: float | None = None, max_new_tokens: int | None = None,
                  is_correction: str | None = None, is_cap: float | None = 3.0,
                  is_floor: float | None = None) -> dict[str, float]:
    """One policy update: ``iterations`` optimiser steps of ``pm`` (a
    :class:`~collab_env.adapters.common.models.PolicyModel` with its optimiser and scheduler) on
    ``samples`` with the learner's ``loss`` (module docstring: the extension points). Per step,
    every micro-batch's loss (given the divisors of ``loss_type`` over the whole batch,
    :func:`~collab_env.adapters.common.losses.aggregation_plan`, so accumulation is exact) is
    back-propagated, then the gradient is clipped (``max_grad_norm``), AdamW steps and the
    schedule advances. The proximal log-probs ``old_logp`` (the model before the update: the
    ratio's denominator from the second iteration, and the importance ratio's numerator) and
    the reference's (``beta > 0``) are computed once, before the first step, without gradient.

    Args:
        pm: The policy model with its optimiser and scheduler.
        samples: :data:`Sample` tuples; the 5th element (the sampler's per-token log-probs of
            the completion, as long as its token ids) is read only with ``is_correction``, and
            may be left out (4-tuples) without it.
        loss: The learner's loss hook.
        iterations: Optimiser steps on the same samples (PPO's epochs).
        temperature: Temperature of the log-probs (the sampling one, for an exact ratio).
        micro_batch: Sequences per forward/backward pass.
        loss_type: The aggregation, one of
            :data:`~collab_env.adapters.common.losses.LOSS_TYPES` (TRL's names, CoMLRL's ``"sum"``).
        beta: Weight of the KL to the reference; ``> 0`` computes reference log-probs (the hook
            adds ``beta`` times the KL).
        max_grad_norm: Gradient clipping (``None``: none).
        max_new_tokens: The completion budget, Dr. GRPO's constant (``loss_type="dr_grpo"``).
        is_correction: Importance sampling against the sampler (TRL's
            ``vllm_importance_sampling_mode``; ``None``: off), with the bounds ``is_cap`` and
            ``is_floor``: :func:`importance_correction`. The samples' 5th element is then the
            sampler's log-probs; the policy term of each token is multiplied by its weight, the
            KL term is not.

    Returns:
        The first step's summed stats, ``grad_norm``, per-turn and overall reference-KL metrics
        (with a reference), ``loss_last_iteration`` / ``clip_fraction_last_iteration`` (more
        than one iteration), ``learning_rate``, the collapse statistics of the samples
        (:func:`sample_collapse_stats`) and, with ``is_correction``, the importance ratio's
        metrics (:func:`importance_correction`).

    Raises:
        ConfigError: ``is_correction`` with a sample without sampler log-probs (or with as many
            as its tokens), an unknown ``loss_type`` or mode.
    """
    import torch

    device = pm.device
    micro = [samples[i:i + micro_batch] for i in range(0, len(samples), micro_batch)]
    batches = [pack_sequences([s[0] for s in mb], [s[1] for s in mb], pm.pad_id).to(device) for mb in micro]
    advantages = [torch.tensor([s[2] for s in mb], dtype=torch.float32, device=device) for mb in micro]
    tokens = [int(b.completion_mask.sum()) for b in batches]
    _, world = rank_world()  # data parallel: the divisors are the whole batch's, the gradients summed
    whole = global_totals(tokens, [len(mb) for mb in micro]) if world > 1 else None
    plan = aggregation_plan(loss_type, tokens, [len(mb) for mb in micro], max_new_tokens, whole)
    loss_tokens = whole[1] if whole is not None else sum(tokens)
    params = [p for _, p in pm.trainable_parameters()]

    old: list[Any] | None = None
    ref: list[Any] | None = None
    pm.model.eval()
    with torch.no_grad():
        if iterations > 1 or is_correction is not None:
            old = [token_logprobs(pm.model, b, temperature) for b in batches]
        if beta > 0:
            with pm.as_reference() as reference:
                reference.eval()
                ref = [token_logprobs(reference, b, temperature) for b in batches]
    weights, is_metrics = ([None] * len(batches), {}) if old is None or is_correction is None else \
        importance_correction(micro, batches, old, is_correction, is_cap, is_floor)

    out: dict[str, float] = {}
    for it in range(iterations):
        pm.model.train()
        pm.optimizer.zero_grad(set_to_none=True)
        totals: dict[str, float] = {}
        kl_by_turn: dict[int, list[float]] = {}
        for k, (b, adv) in enumerate(zip(batches, advantages, strict=True)):
            logp = token_logprobs(pm.model, b, temperature)
            old_k = old[k] if old is not None else logp.detach()
            mode, n_seq, n_tok = plan[k]
            value, stats = loss(logp, old_k, adv, b.completion_mask, ref_logp=ref[k] if ref is not None else None,
                                loss_type=mode, num_sequences=n_seq, num_tokens=n_tok, loss_tokens=loss_tokens,
                                is_weight=weights[k])
            value.backward()
            for name, v in stats.items():
                totals[name] = totals.get(name, 0.0) + float(v)
            if it == 0 and ref is not None:
                kl_per_turn(logp.detach(), ref[k], b.completion_mask, micro[k], kl_by_turn)
        if world > 1:
            sum_gradients(params)
            totals = sum_stats(totals)
        grad_norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm if max_grad_norm is not None else float("inf"))
        pm.optimizer.step()
        pm.scheduler.step()
        if it == 0:
            out = dict(totals)
            out["grad_norm"] = float(grad_norm)
            for turn, kls in kl_by_turn.items():
                out[f"turn_{turn + 1}/reference_kl_mean"] = mean(kls)
                out[f"turn_{turn + 1}/reference_kl_penalty_mean"] = beta * mean(kls)
            if ref is not None:
                out["reference_kl_mean"] = totals.get("kl", 0.0)
                out["reference_kl_penalty_mean"] = beta * totals.get("kl", 0.0)
        else:
            out["loss_last_iteration"] = totals.get("loss", 0.0)
            out["clip_fraction_last_iteration"] = totals.get("clip_fraction", 0.0)
    out.pop("kl", None)
    out.update(is_metrics)
    out["learning_rate"] = float(pm.scheduler.get_last_lr()[0])
    out.update(sample_collapse_stats(pm, samples))
    pm.model.eval()
    return out


def importance_correction(micro: Sequence[Sequence[Sample]], batches: Sequence[Any], old: Sequence[Any], mode: str,
                          cap: float | None, floor: float | None) -> tuple[list[Any], dict[str, float]]:
    """:func:`policy_update`'s importance sampling against the sampler, per micro-batch: the
    truncated or masked weights of :func:`~collab_env.adapters.common.losses.importance_weights`
    (``mode``: ``"token_truncate"``, ``"token_mask"``, ``"sequence_truncate"`` or
    ``"sequence_mask"``, TRL's ``vllm_importance_sampling_mode``; ``cap`` / ``floor``: its
    ``vllm_importance_sampling_clip_max`` / ``_min``). The ratio is ``exp(old_logp -
    sampler_logp)``: ``old`` the model's log-probs before this update (computed with the model,
    never ``logp.detach()``), ``sampler_logp`` each sample's 5th element. An asynchronous
    (off-policy) rollout passes the log-probs of the stale policy that sampled; a vLLM engine's
    corrects its numerical mismatch.

    Returns ``(weights, metrics)``: one ``[B, C]`` weight tensor per micro-batch, and
    ``is_ratio_mean`` / ``is_ratio_max`` (the raw ratio over loss tokens, or over sequences in the
    sequence modes) and ``is_clipped_fraction`` (the share of them truncated or masked).

    Raises:
        ConfigError: a sample without sampler log-probs (or with as many as its tokens), or an
            unknown mode.
    """
    weights: list[Any] = []
    sums: dict[str, float] = {}
    for mb, b, old_k in zip(micro, batches, old, strict=True):
        w, stats = importance_weights(old_k, _sampler_logprobs(mb, b.completion_mask), b.completion_mask,
                                      mode, cap, floor)
        weights.append(w)
        for name, v in stats.items():  # sums over micro-batches, the max of the maxima
            prev = sums.get(name, 0.0)
            sums[name] = max(prev, v) if name == "is_ratio_max" else prev + v
    units = max(sums["is_units"], 1.0)
    return weights, {"is_ratio_mean": sums["is_ratio_sum"] / units, "is_ratio_max": sums["is_ratio_max"],
                     "is_clipped_fraction": sums["is_clipped"] / units}


def _sampler_logprobs(samples: Sequence[Any], completion_mask: Any):
    """The samples' sampler log-probs (their 5th element) right-padded with zeros like their
    completions: ``[B, C]`` on the mask's device."""
    import torch

    out = torch.zeros(completion_mask.shape, dtype=torch.float32)
    for i, s in enumerate(samples):
        lp = s[4] if len(s) > 4 else None
        if lp is None:
            raise ConfigError("the importance sampling correction (is_correction) needs the sampler's log-probs of "
                              "every completion (the sample's 5th element, Completion.logprobs); a sample has none: "
                              "use a policy that reports them (transformers, vLLM) or set is_correction=None.")
        if len(lp) != len(s[1]):
            raise ConfigError(f"a sample has {len(s[1])} completion tokens but {len(lp)} sampler log-probs.")
        if lp:
            out[i, :len(lp)] = torch.tensor(list(lp), dtype=torch.float32)
    return out.to(completion_mask.device)

"""The scaffolding of the learners that train on rollout trees: MAGRPO, REINFORCE and MADPO.

:class:`TreeLearner` is what those learners share and nothing of their algorithm: the CoMLRL
trainer surface (arguments of the dataset path and of the env path, through
:class:`~collab_env.adapters.common.task.TaskSource`), the models, optimisers and schedules,
the learner binding into multiturn-aware futures, the run loop
(:func:`~collab_env.adapters.common.loop.run`), CoMLRL's rollout buffer, the reference KL
of returns, the guide's evaluation, checkpoints and logging.

An algorithm file subclasses it and writes its algorithm top to bottom: ``train_step`` (roll the
trees, compute advantages, call :meth:`TreeLearner.learn`) and ``loss`` (the hook of the shared
update, :func:`~collab_env.adapters.common.update.policy_update`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from collab_env.adapters.common.config import TrainerConfig
from collab_env.adapters.common.learner import TaskLearner
from collab_env.adapters.common.loop import RunState, Schedule, mean
from collab_env.adapters.common.task import turn_metrics
from collab_env.adapters.common.update import Sample, policy_update
from collab_env.errors import ConfigError, TaskFunctionError

__all__ = ["TreeLearner"]


class TreeLearner(TaskLearner):
    """Shared scaffolding of the rollout-tree learners (module docstring). Arguments are
    :class:`~collab_env.adapters.magrpo.MAGRPOTrainer`'s; ``config_class`` is the config type the
    subclass accepts."""

    config_class: type = TrainerConfig

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

        from collab_env.adapters.common.logging import MetricsLogger

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
        self.logger = MetricsLogger(args.output_dir, {**args.to_dict(), **self.task.config_record()}, wandb_config)

    # -- schedule ---------------------------------------------------------------------------------
    def planned_optimizer_steps(self) -> int:
        """Optimiser steps of the whole run (for the learning-rate schedule)."""
        a = self.args
        items = self.task.planned_items(a.num_train_epochs, a.max_steps)
        if a.rollout_buffer_size is not None:  # about one step per train_batch_size nodes of an agent
            per_item = sum((a.num_generations ** (d * (a.num_agents if a.joint_mode == "cross" else 1)))
                           for d in range(a.num_turns))
            return max(1, math.ceil(items * per_item / (a.train_batch_size or a.rollout_buffer_size)) * a.num_iterations)
        return max(1, math.ceil(items / a.per_device_train_batch_size) * a.num_iterations)

    def schedule(self) -> Schedule:
        """Training items in batches of ``per_device_train_batch_size``, CoMLRL's evaluation
        schedule, logs every ``logging_steps`` reward evaluations, checkpoints every
        ``save_steps`` items."""
        return self.item_schedule(self.args.per_device_train_batch_size, type(self).__name__.removesuffix("Trainer"))

    def train(self, resume_from_checkpoint: str | Path | None = None) -> dict[str, Any]:
        """Train for ``num_train_epochs`` (or ``max_steps`` items), evaluating on the guide's
        schedule; resume from a checkpoint folder when given. Returns the last logged training
        metrics."""
        from collab_env.adapters.common.checkpoint import load_checkpoint
        from collab_env.adapters.common.loop import run

        if self.train_env is None:
            raise ConfigError("train() needs train_dataset= (or env=).")
        if resume_from_checkpoint is not None:
            self.state = RunState.from_dict(load_checkpoint(resume_from_checkpoint, self._unique, self._rng))
            self.logger.resume()
        return run(self)

    def train_step(self, batch: Sequence[int]) -> dict[str, float]:
        """The algorithm on the training items ``batch`` (the subclass's)."""
        raise NotImplementedError

    def end_epoch(self) -> dict[str, float]:
        """Use what is left in the rollout buffers (CoMLRL updates on it at every epoch's end)."""
        per_model = [m for agent in range(len(self._buffers)) if self._buffers[agent]
                     for m in self._flush_buffer(agent)]
        return {k: mean([m[k] for m in per_model if k in m]) for k in sorted({k for m in per_model for k in m})}

    # -- rollout and the shared update --------------------------------------------------------------
    def rollout(self, env: Any, indices: Sequence[int], branching: Callable[[int], int], joint_mode: str,
                sampling: Mapping[str, Any], seeds: Callable[[int], list[int]], training: bool = True):
        """The rollout trees of ``indices`` on ``env`` with the learner's models, depth
        ``num_turns``, returns discounted by ``discount`` (reward plus ``discount`` times the
        mean return of the child's joint actions; CoMLRL's is this with discount 1); CoMLRL's
        early termination on training trees only. Returns ``(roots, levels)``."""
        a = self.args
        return self.task.rollout(env, indices, self.models, branching=branching, max_depth=a.num_turns,
                                 joint_mode=joint_mode, sampling=sampling, seeds=seeds,
                                 prompt_format=a.prompt_format,
                                 stop_above=a.early_termination_threshold if training else None,
                                 discount=a.discount)

    def node_groups(self, levels: Sequence[Sequence[Any]], advantages: Callable[[Any, int, list[float]], list[float]],
                    kls: Mapping[tuple[int, int], list[float]] | None = None,
                    ) -> tuple[list[tuple[int, list[Sample]]], list[int]]:
        """Per node and acting agent, its samples with ``advantages(node, agent, values)`` of
        the completions' values (:func:`~collab_env.adapters.common.rollout.completion_values`
        with the config's ``cross_value``, ``"mean"`` when it has none; less
        ``reference_kl_coef`` times their reference KL when ``kls`` has them). Returns
        ``(groups, completion lengths)``."""
        from collab_env.adapters.common.rollout import completion_values

        coef = self.args.reference_kl_coef
        reduce = getattr(self.args, "cross_value", "mean")
        groups: list[tuple[int, list[Sample]]] = []
        lengths: list[int] = []
        for nodes in levels:
            for node in nodes:
                for agent in node.acting:
                    values = completion_values(node, agent, reduce)
                    if kls:  # CoMLRL: the KL penalty comes off each completion's return
                        values = [v - coef * k for v, k in zip(values, kls[(id(node), agent)], strict=True)]
                    adv = advantages(node, agent, values)
                    group = [(node.prompt_ids[agent], tuple(comp.token_ids or ()), adv_g, node.depth)
                             for comp, adv_g in zip(node.completions[agent], adv, strict=True)]
                    lengths.extend(len(g[1]) for g in group)
                    groups.append((agent, group))
        return groups, lengths

    def loss(self, logp, old_logp, advantages, mask, *, ref_logp, loss_type, num_sequences, num_tokens):
        """The loss hook of :func:`~collab_env.adapters.common.update.policy_update` (the subclass's)."""
        raise NotImplementedError

    def update_model(self, pm: Any, samples: Sequence[Sample]) -> dict[str, float]:
        """The shared update of ``pm`` on its samples with this learner's :meth:`loss`."""
        a = self.args
        return policy_update(pm, samples, self.loss, iterations=a.num_iterations,
                             temperature=a.logprob_temperature or a.temperature,
                             micro_batch=a.train_micro_batch_size, loss_type=a.loss_type, beta=a.beta,
                             max_grad_norm=a.max_grad_norm)

    def learn(self, groups: Sequence[tuple[int, list[Sample]]]) -> dict[str, float]:
        """Update on the node sample groups ``(agent, samples)`` of a batch: all at once per
        model, or through CoMLRL's per-agent rollout buffer."""
        a = self.args
        per_model: list[dict[str, float]] = []
        if a.rollout_buffer_size is None:
            samples: dict[int, list[Any]] = {}
            for agent, group in groups:
                samples.setdefault(self._owner(agent), []).extend(group)
            per_model = [self.update_model(self._unique[k], s) for k, s in sorted(samples.items())]
            self.state.optimizer_steps += a.num_iterations
        else:
            for agent, group in groups:
                self._buffers[agent].append(group)
                if len(self._buffers[agent]) >= a.rollout_buffer_size:
                    per_model.extend(self._flush_buffer(agent))
        return {key: mean([m[key] for m in per_model if key in m]) for key in sorted({k for m in per_model for k in m})}

    def _owner(self, agent: int) -> int:
        return next(k for k, u in enumerate(self._unique) if u is self.models[agent])

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
                    out.append(self.update_model(self.models[agent], chunk))
                    self.state.optimizer_steps += a.num_iterations
        return out

    def reference_kls(self, levels: Sequence[Sequence[Any]], metrics: dict[str, float]) -> dict[tuple[int, int], list[float]]:
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
            metrics[f"turn_{d + 1}/reference_kl_mean"] = mean(kls)
            metrics[f"turn_{d + 1}/reference_kl_penalty_mean"] = a.reference_kl_coef * mean(kls)
        return out

    # -- evaluation -------------------------------------------------------------------------------
    def evaluate(self, num_eval_samples: int | None = None) -> dict[str, float]:
        """Evaluate on the first ``num_eval_samples`` evaluation items (default
        ``args.eval_num_samples``) without updating weights: one joint response per turn
        (``eval_pass_k`` independent ones for pass@k). Logs and returns ``eval/...`` metrics;
        ``{}`` without an evaluation split."""
        from collab_env.adapters.common.rollout import episode_item

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
            roots, levels = self.rollout(self.eval_env, indices, lambda d: k if d == 0 else 1, "aligned",
                                         self.sampling(True), seeds, training=False)
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
        from collab_env.adapters.common.checkpoint import save_checkpoint

        path = Path(path) if path is not None else Path(self.args.output_dir) / f"checkpoint-{self.state.items_done}"
        return save_checkpoint(path, self._unique, asdict(self.state), self._rng)

    def close(self) -> None:
        """Finish logging (closes the Weights & Biases run)."""
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

"""The toolkit of the learners that train on rollout trees (MAGRPO, REINFORCE, MADPO): one
set-up and the few functions a training step calls, in the order it calls them.

A step (MAGRPO's ``train_step`` in :mod:`collab_env.adapters.magrpo` reads top to bottom):

1. :meth:`TreeLearner.rollout`: **expand the trees** of a batch of task items
   (:func:`~collab_env.adapters.common.rollout.grow_trees` with the config's depth, joint mode,
   one :class:`~collab_env.policy.SamplingParams`, early termination and discount);
2. :meth:`TreeLearner.reference_kls` (optional): CoMLRL's reference KL of every completion;
3. :meth:`TreeLearner.node_groups`: **group the nodes**: per node and acting agent, its
   completions' values turned into advantages by the learner's function, as samples
   ``(prompt ids, completion ids, advantage, turn)``;
4. :meth:`TreeLearner.learn`: per model (or through CoMLRL's rollout buffer)
   :func:`policy_update`, **one policy update**: ``iterations`` optimiser steps on the samples
   with the learner's loss, accumulated over micro-batches, gradient clipping, AdamW, schedule.

The set-up (:meth:`TreeLearner.__init__`) builds the task source (dataset or env path), the
models with their optimisers and schedules, and the logger; :meth:`TreeLearner.train` runs the
shared loop (:func:`~collab_env.adapters.common.loop.run`), which calls ``train_step`` per batch,
evaluates (:meth:`TreeLearner.evaluate`), saves checkpoints and ends with the run's summary.

Extension points (the only things an algorithm file writes):

* ``config_class``: the config type the trainer accepts (a
  :func:`~collab_env.adapters.common.config.learner_config` dataclass with the field groups it
  uses; it needs :class:`~collab_env.adapters.common.config.SamplingFields`,
  :class:`~collab_env.adapters.common.config.RolloutFields` and
  :class:`~collab_env.adapters.common.config.TreeFields`; ``num_iterations`` from
  :class:`~collab_env.adapters.common.config.PPOFields` when it has them, else 1).
* ``train_step(batch) -> metrics``: the algorithm on the training items ``batch``.
* ``loss(logp, old_logp, advantages, mask, *, ref_logp, loss_type, num_sequences, num_tokens)
  -> (loss, stats)``: the loss of one micro-batch (``old_logp``: the sampling policy's
  log-probs, ``logp.detach()`` in the first iteration; ``stats``: detached shares summed over
  micro-batches, e.g. ``loss``, ``policy_loss``, ``kl``, ``clip_fraction``).
* Optionally ``evaluate``, ``schedule``, ``planned_optimizer_steps``, ``end_epoch``, ``train``
  (MADPO replaces them: it learns from preference pairs, not from advantages).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from collab_env.adapters.common.checkpoint import load_checkpoint, save_checkpoint
from collab_env.adapters.common.collapse import completion_stats
from collab_env.adapters.common.config import TrainerConfig, learner_sampling
from collab_env.adapters.common.learner import TaskLearner
from collab_env.adapters.common.logging import MetricsLogger
from collab_env.adapters.common.loop import RunState, Schedule, mean, run
from collab_env.adapters.common.losses import kl_k3, pack_sequences, token_logprobs
from collab_env.adapters.common.rollout import completion_values, episode_item, grow_trees
from collab_env.adapters.common.task import turn_metrics
from collab_env.errors import ConfigError, TaskFunctionError
from collab_env.policy import SamplingParams

__all__ = ["TreeLearner", "Sample", "policy_update", "kl_per_turn", "sample_collapse_stats"]

#: One training sample: (prompt ids, completion ids, advantage, 0-based turn).
Sample = tuple[list[int], tuple[int, ...], float, int]


class TreeLearner(TaskLearner):
    """The toolkit's one set-up and the functions of a tree learner's step (module docstring).
    Arguments are :class:`~collab_env.adapters.magrpo.MAGRPOTrainer`'s; ``config_class`` is the
    config type the subclass accepts."""

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
            return max(1, math.ceil(items * per_item / (a.train_batch_size or a.rollout_buffer_size)) * self.iterations)
        return max(1, math.ceil(items / a.per_device_train_batch_size) * self.iterations)

    def schedule(self) -> Schedule:
        """Training items in batches of ``per_device_train_batch_size``, CoMLRL's evaluation
        schedule, logs every ``logging_steps`` reward evaluations, checkpoints every
        ``save_steps`` items."""
        return self.item_schedule(self.args.per_device_train_batch_size, type(self).__name__.removesuffix("Trainer"))

    def train(self, resume_from_checkpoint: str | Path | None = None) -> dict[str, Any]:
        """Train for ``num_train_epochs`` (or ``max_steps`` items), evaluating on the guide's
        schedule; resume from a checkpoint folder when given. Returns the last logged training
        metrics."""
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
                sampling: SamplingParams, seeds: Callable[[int], list[int]], training: bool = True):
        """Expand the rollout trees of ``indices`` on ``env`` with the learner's models:
        ``branching(depth)`` completions per acting agent and node, sampled with ``sampling``,
        depth ``num_turns``, returns discounted by ``discount`` (reward plus ``discount`` times
        the mean return of the child's joint actions; CoMLRL's is this with discount 1);
        CoMLRL's early termination on training trees only. Returns ``(roots, levels)``."""
        a = self.args
        return grow_trees(self.task, env, indices, self.models, branching=branching, max_depth=a.num_turns,
                          joint_mode=joint_mode, sampling=sampling, seeds=seeds, prompt_format=a.prompt_format,
                          stop_above=a.early_termination_threshold if training else None, discount=a.discount)

    def node_groups(self, levels: Sequence[Sequence[Any]], advantages: Callable[[Any, int, list[float]], list[float]],
                    kls: Mapping[tuple[int, int], list[float]] | None = None,
                    ) -> tuple[list[tuple[int, list[Sample]]], list[int]]:
        """Per node and acting agent, its samples with ``advantages(node, agent, values)`` of
        the completions' values (:func:`~collab_env.adapters.common.rollout.completion_values`
        with the config's ``cross_value``, ``"mean"`` when it has none; less
        ``reference_kl_coef`` times their reference KL when ``kls`` has them). Returns
        ``(groups, completion lengths)``."""
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
        """The loss of one micro-batch (the subclass's; module docstring)."""
        raise NotImplementedError

    @property
    def iterations(self) -> int:
        """Optimiser steps per update: the config's ``num_iterations`` (PPO's field group), else 1."""
        return getattr(self.args, "num_iterations", 1)

    def update_model(self, pm: Any, samples: Sequence[Sample]) -> dict[str, float]:
        """:func:`policy_update` of ``pm`` on its samples with this learner's :meth:`loss` and
        its config's iterations, log-prob temperature, micro-batch, loss type, KL and clipping."""
        a = self.args
        return policy_update(pm, samples, self.loss, iterations=self.iterations,
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
            self.state.optimizer_steps += self.iterations
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
                    self.state.optimizer_steps += self.iterations
        return out

    def reference_kls(self, levels: Sequence[Sequence[Any]], metrics: dict[str, float]) -> dict[tuple[int, int], list[float]]:
        """CoMLRL's reference KL of every completion: the k3 estimate of KL(policy || initial
        policy) summed over its tokens, from the raw logits, without gradient. Adds
        ``turn_k/reference_kl_mean`` and ``turn_k/reference_kl_penalty_mean`` to ``metrics``."""
        import torch

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
                                         learner_sampling(a, True), seeds, training=False)
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
                  temperature: float = 1.0, micro_batch: int = 8, loss_type: str = "sequence",
                  beta: float = 0.0, max_grad_norm: float | None = None) -> dict[str, float]:
    """One policy update: ``iterations`` optimiser steps of ``pm`` (a
    :class:`~collab_env.adapters.common.models.PolicyModel` with its optimiser and scheduler) on
    ``samples`` with the learner's ``loss`` (module docstring: the extension points). Per step,
    every micro-batch's loss (given the whole batch's sequence and token counts, so accumulation
    is exact) is back-propagated, then the gradient is clipped (``max_grad_norm``), AdamW steps
    and the schedule advances. The sampling policy's log-probs (for a ratio, from the second
    iteration) and the reference's (``beta > 0``) are computed once, before the first step.

    ``loss_type`` ``"sequence"`` or ``"token"`` is passed through; ``"sum"`` (per-sequence sums
    averaged over sequences, CoMLRL's) is ``"token"`` with the sequence count as token count.
    ``beta > 0`` computes reference log-probs (the hook adds ``beta`` times the KL).

    Returns:
        The first step's summed stats, ``grad_norm``, per-turn and overall reference-KL metrics
        (with a reference), ``loss_last_iteration`` / ``clip_fraction_last_iteration`` (more
        than one iteration), ``learning_rate`` and the collapse statistics of the samples
        (:func:`sample_collapse_stats`).
    """
    import torch

    device = pm.device
    micro = [samples[i:i + micro_batch] for i in range(0, len(samples), micro_batch)]
    batches = [pack_sequences([s[0] for s in mb], [s[1] for s in mb], pm.pad_id).to(device) for mb in micro]
    advantages = [torch.tensor([s[2] for s in mb], dtype=torch.float32, device=device) for mb in micro]
    num_seq = len(samples)
    num_tok = int(sum(int(b.completion_mask.sum()) for b in batches))
    if loss_type == "sum":  # per-sequence sums averaged over sequences: "token" over num_seq
        loss_type, num_tok = "token", num_seq
    params = [p for _, p in pm.trainable_parameters()]

    old: list[Any] | None = None
    ref: list[Any] | None = None
    pm.model.eval()
    with torch.no_grad():
        if iterations > 1:
            old = [token_logprobs(pm.model, b, temperature) for b in batches]
        if beta > 0:
            with pm.as_reference() as reference:
                reference.eval()
                ref = [token_logprobs(reference, b, temperature) for b in batches]

    out: dict[str, float] = {}
    for it in range(iterations):
        pm.model.train()
        pm.optimizer.zero_grad(set_to_none=True)
        totals: dict[str, float] = {}
        kl_by_turn: dict[int, list[float]] = {}
        for k, (b, adv) in enumerate(zip(batches, advantages, strict=True)):
            logp = token_logprobs(pm.model, b, temperature)
            old_k = old[k] if old is not None else logp.detach()
            value, stats = loss(logp, old_k, adv, b.completion_mask, ref_logp=ref[k] if ref is not None else None,
                                loss_type=loss_type, num_sequences=num_seq, num_tokens=num_tok)
            value.backward()
            for name, v in stats.items():
                totals[name] = totals.get(name, 0.0) + float(v)
            if it == 0 and ref is not None:
                kl_per_turn(logp.detach(), ref[k], b.completion_mask, micro[k], kl_by_turn)
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
    out["learning_rate"] = float(pm.scheduler.get_last_lr()[0])
    out.update(sample_collapse_stats(pm, samples))
    pm.model.eval()
    return out

"""DPO on recorded preference pairs, and online DPO ranked by an environment's reward.

**Offline** (:class:`DPOTrainer`): pairs of replies to the same multi-turn prompt, as
:func:`~collab_env.tasks.collabllm_modes.build_dpo_dataset` writes them (``prompt``: chat
messages, or a string taken as one user message; ``chosen`` / ``rejected``: a list of assistant
messages or a string)::

    from collab_env.adapters.dpo import DPOConfig, DPOTrainer

    pairs = process_collabllm_dataset(data_files="math-hard.parquet", mode="dpo", min_gap=0.02)
    trainer = DPOTrainer(agent_model="embedded", train_dataset=pairs["train"],
                         eval_dataset=pairs["validation"], args=DPOConfig(beta=0.1))
    trainer.train()
    trainer.evaluate(num_eval_samples=64)   # eval/loss, eval/reward_accuracy, eval/margin

The loss (:func:`~collab_env.adapters.common.preference.dpo_loss`) is
``-log sigmoid(beta * ((pi_c - ref_c) - (pi_r - ref_r)))`` with summed completion log-probs
under the policy (``pi``) and the frozen initial model (``ref``; under LoRA, the model with its
adapters disabled). ``reference_free=True`` drops the ``ref`` terms and builds no reference.

**Multi-agent**: with ``num_agents > 1`` each agent runs its own DPO on its own pairs: pass
``train_dataset`` as a list with one dataset per agent, or one dataset with an ``agent`` column
(the agent's index, ``0 .. num_agents - 1``). Each agent trains its own copy of the model (its
own optimiser and reference); with ``share_model=True`` one model learns from every agent's
pairs in one optimiser step.

**Online** (:class:`OnlineDPOTrainer`, the CollabLLM paper's strongest setting): for each
training item of a registered environment (``collabllm-*`` with ``data_files``, ``hidden-facts``,
or any env object) the current policy samples ``num_candidates`` replies at each of the item's
first ``num_turns`` trained turns (default 1), the conversation going on from the best reply;
each reply is applied to its own clone of the env and scored by the env's reward
(wrap the env in :class:`~collab_env.rewards.mr.MultiturnAwareReward` to rank by the
multiturn-aware reward); the best and the worst reply form a pair when their reward gap is at
least ``min_gap``; the pairs of a batch take one DPO step. ``evaluate(num_eval_samples=...)``
rolls one reply per evaluation item and reports the env's reward; the automatic evaluation runs
before the first preference update and then every ``eval_interval`` preference updates.

Logs: ``<output_dir>/metrics.jsonl`` and ``curves.png``; ``env_step`` is the optimiser step
offline and the number of reward evaluations online.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from collab_env.adapters.common.checkpoint import load_checkpoint, save_checkpoint
from collab_env.adapters.common.config import TrainerConfig, check_float, check_int, learner_config, learner_sampling
from collab_env.adapters.common.learner import TaskLearner, build_models, epoch_order
from collab_env.adapters.common.logging import MetricsLogger
from collab_env.adapters.common.loop import RunState, Schedule, mean, merge_metrics, run
from collab_env.adapters.common.pairs import (
    Pair,
    encode_pair_rows,
    pair_logps,
    split_by_agent,
)
from collab_env.adapters.common.preference import dpo_loss, select_pair
from collab_env.adapters.common.rollout import completion_values, grow_trees
from collab_env.adapters.common.task import TaskSource
from collab_env.errors import ConfigError, DataSchemaError
from collab_env.policy import SamplingParams

__all__ = ["DPOConfig", "DPOTrainer", "OnlineDPOConfig", "OnlineDPOTrainer"]


@learner_config
class DPOConfig(TrainerConfig):
    """Configuration of :class:`DPOTrainer`. Every field of
    :class:`~collab_env.adapters.common.config.TrainerConfig` applies; here
    ``per_device_train_batch_size`` is pairs per forward pass, and ``max_steps``,
    ``eval_interval``, ``save_steps`` and ``logging_steps`` count optimiser steps."""

    num_agents: int = 1
    """Number of agents; each runs its own DPO on its own pairs (module docstring)."""
    beta: float = 0.1
    """Temperature of DPO's implicit reward ``beta * (log pi - log ref)``."""
    reference_free: bool = False
    """Drop the reference terms: ``-log sigmoid(beta * (log pi_c - log pi_r))``; no reference
    model is built."""
    max_length: int | None = 1024
    """Longest prompt + completion in tokens: completions are cut on the right to fit; a pair
    whose prompt alone reaches it is skipped (counted in ``skipped``). ``None``: no limit."""
    gradient_accumulation_steps: int = 1
    """Forward/backward passes per optimiser step."""
    shuffle: bool = True
    """Shuffle each agent's pairs every epoch (seeded by ``seed`` and the epoch)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("num_agents", self.num_agents, 1)
        check_float("beta", self.beta, 0.0, low_open=True)
        if self.reference_free not in (True, False):
            raise ConfigError(f"reference_free must be True or False, got {self.reference_free!r}.")
        check_int("max_length", self.max_length, 2, allow_none=True)
        check_int("gradient_accumulation_steps", self.gradient_accumulation_steps, 1)
        if self.shuffle not in (True, False):
            raise ConfigError(f"shuffle must be True or False, got {self.shuffle!r}.")



# ---------------------------------------------------------------------------------------------
# The shared update
# ---------------------------------------------------------------------------------------------
def _dpo_step(pm: Any, pairs: Sequence[Pair], args: DPOConfig, micro: int) -> dict[str, float]:
    """One optimiser step of ``pm`` on ``pairs`` (micro-batches of ``micro`` pairs; the loss is
    the mean over all pairs, so accumulation is exact). Returns the step's metrics."""
    import torch

    n = len(pairs)
    params = [p for _, p in pm.trainable_parameters()]
    pm.optimizer.zero_grad(set_to_none=True)
    sums = {"loss": 0.0, "reward_accuracy": 0.0, "margin": 0.0, "chosen_reward": 0.0, "rejected_reward": 0.0,
            "chosen_logp": 0.0, "rejected_logp": 0.0}
    for k in range(0, n, micro):
        chunk = pairs[k:k + micro]
        ref_c = ref_r = None
        if not args.reference_free:
            with torch.no_grad(), pm.as_reference() as reference:
                reference.eval()
                ref_c, ref_r = pair_logps(reference, chunk, pm.pad_id, pm.device)
        pm.model.train()
        pi_c, pi_r = pair_logps(pm.model, chunk, pm.pad_id, pm.device)
        losses, rc, rr = dpo_loss(pi_c, pi_r, ref_c, ref_r, beta=args.beta)
        (losses.sum() / n).backward()
        _accumulate(sums, losses, rc, rr, pi_c, pi_r)
    max_norm = args.max_grad_norm if args.max_grad_norm is not None else float("inf")
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    pm.optimizer.step()
    pm.scheduler.step()
    pm.model.eval()
    out = {k: v / n for k, v in sums.items()}
    out.update(grad_norm=float(grad_norm), pairs=float(n), learning_rate=float(pm.scheduler.get_last_lr()[0]))
    return out


def _accumulate(sums: dict[str, float], losses, rc, rr, pi_c, pi_r) -> None:
    sums["loss"] += float(losses.detach().sum())
    sums["reward_accuracy"] += float((rc > rr).float().sum())
    sums["margin"] += float((rc - rr).sum())
    sums["chosen_reward"] += float(rc.sum())
    sums["rejected_reward"] += float(rr.sum())
    sums["chosen_logp"] += float(pi_c.detach().sum())
    sums["rejected_logp"] += float(pi_r.detach().sum())


class _Base:
    """Model loading, optimisers, logging and checkpoints shared by both trainers."""

    args: DPOConfig

    def _check_trainable(self) -> None:
        """Raise :class:`ConfigError` when there is nothing to train on (each trainer checks its own)."""
        raise NotImplementedError

    def schedule(self) -> Schedule:
        """The run's schedule (each trainer computes its own)."""
        raise NotImplementedError

    def train_step(self, batch: Sequence[int]) -> dict[str, float]:
        """One update (each trainer writes its own)."""
        raise NotImplementedError

    def evaluate(self, num_eval_samples: int | None = None) -> dict[str, float]:
        """Evaluation (each trainer writes its own)."""
        raise NotImplementedError

    def _setup(self, agent_model: Any, tokenizer: Any, args: DPOConfig, wandb_config: Any, steps: int) -> None:
        import torch

        if agent_model is None:
            raise ConfigError("agent_model is required: a model folder, a hub id, 'embedded' or a loaded model.")
        torch.manual_seed(args.seed)
        self.models, self._unique = build_models(agent_model, tokenizer, args.num_agents, args,
                                                 need_reference=not args.reference_free, steps=steps)
        self.state = RunState()
        self.logger = MetricsLogger(args.output_dir, args.to_dict(), wandb_config)

    def _model_index(self, agent: int) -> int:
        return next(k for k, u in enumerate(self._unique) if u is self.models[agent])

    def save_checkpoint(self, path: str | Path | None = None) -> Path:
        """Save models, optimisers, schedulers, reference weights, position and RNG states
        (default ``<output_dir>/checkpoint-<optimiser steps>``)."""

        if path is None:
            path = Path(self.args.output_dir) / f"checkpoint-{self.state.optimizer_steps}"
        return save_checkpoint(path, self._unique, asdict(self.state), getattr(self, "_rng", None))

    def _resume(self, path: str | Path) -> None:
        self.state = RunState.from_dict(load_checkpoint(path, self._unique, getattr(self, "_rng", None)))
        self.logger.resume()

    def train(self, resume_from_checkpoint: str | Path | None = None) -> dict[str, Any]:
        """Train on the schedule (:meth:`schedule`); resume from a checkpoint folder when given.
        Returns the last logged training metrics (averaged over the models)."""

        self._check_trainable()
        if resume_from_checkpoint is not None:
            self._resume(resume_from_checkpoint)
        return run(self)

    def end_epoch(self) -> dict[str, float]:
        """Nothing to do at an epoch's end: ``{}``."""
        return {}

    def close(self) -> None:
        """Finish logging (closes the Weights & Biases run)."""
        self.logger.close()


# ---------------------------------------------------------------------------------------------
# Offline DPO
# ---------------------------------------------------------------------------------------------
class DPOTrainer(_Base):
    """DPO on recorded preference pairs (one DPO per agent with ``num_agents > 1``).

    Args:
        agent_model: A folder, hub id, ``"embedded"``, a loaded model, or one per agent.
        train_dataset: Pair rows (``prompt``, ``chosen``, ``rejected``; optionally ``agent``),
            or a list with one such dataset per agent.
        eval_dataset: Same format; ``None``: :meth:`evaluate` returns ``{}``.
        args: A :class:`DPOConfig`.
        tokenizer: A tokenizer (or one per agent); default: the model folder's.
        wandb_config: ``None`` or Weights & Biases settings.
    """

    def __init__(self, agent_model: Any = None, train_dataset: Any = None, eval_dataset: Any = None,
                 args: DPOConfig | None = None, *, tokenizer: Any = None,
                 wandb_config: Mapping[str, Any] | None = None) -> None:
        args = DPOConfig() if args is None else args
        if not isinstance(args, DPOConfig) or isinstance(args, OnlineDPOConfig):
            raise ConfigError(f"args must be a DPOConfig, got {type(args).__name__}.")
        if train_dataset is None and eval_dataset is None:
            raise ConfigError("pass train_dataset= (and optionally eval_dataset=).")
        self.args = args
        self._train_raw = split_by_agent(train_dataset, args.num_agents, "train_dataset")
        self._eval_raw = split_by_agent(eval_dataset, args.num_agents, "eval_dataset")
        self._unique = []
        # the step count decides the LR schedule, so pairs are counted before loading models
        per_model_rows = [len(r) for r in self._train_raw]
        steps_guess = max(1, math.ceil(max(per_model_rows) / self._batch_pairs())) * args.num_train_epochs
        if args.max_steps > 0:
            steps_guess = min(steps_guess, args.max_steps)
        self._setup(agent_model, tokenizer, args, wandb_config, steps_guess)
        self.skipped = 0
        self.train_pairs = self._encode(self._train_raw, "train_dataset")
        self.eval_pairs = self._encode(self._eval_raw, "eval_dataset")
        if train_dataset is not None and not any(self.train_pairs):
            raise DataSchemaError("train_dataset has no usable pair (every prompt reaches max_length?).")

    def _batch_pairs(self) -> int:
        return self.args.per_device_train_batch_size * self.args.gradient_accumulation_steps

    def _encode(self, per_agent: Sequence[Sequence[Mapping[str, Any]]], what: str) -> list[list[Pair]]:
        """Encoded pairs per distinct model (its agents' pairs, in agent order)."""
        out: list[list[Pair]] = [[] for _ in self._unique]
        for agent, rows in enumerate(per_agent):
            pairs, skipped = encode_pair_rows(self.models[agent].tokenizer, rows, max_length=self.args.max_length,
                                              what=f"{what} (agent {agent})")
            self.skipped += skipped
            out[self._model_index(agent)].extend(pairs)
        return out

    def _steps_per_epoch(self) -> int:
        return max(1, max(math.ceil(len(p) / self._batch_pairs()) for p in self.train_pairs))

    def _order(self, n: int, epoch: int, k: int) -> list[int]:
        return epoch_order(n, self.args.shuffle, self.args.seed, epoch, k)

    def _check_trainable(self) -> None:
        if not any(self.train_pairs):
            raise ConfigError("train() needs train_dataset=.")

    def schedule(self) -> Schedule:
        """Optimiser steps (``num_train_epochs`` passes, at most ``max_steps``); evaluation
        before step ``s`` when ``s % eval_interval == 0``; logs every ``logging_steps`` steps;
        checkpoints every ``save_steps`` steps."""
        a = self.args
        per_epoch = self._steps_per_epoch()
        limit = per_epoch * a.num_train_epochs
        if a.max_steps > 0:
            limit = min(limit, a.max_steps)
        return Schedule(unit="step", per_epoch=per_epoch, limit=limit, epochs=a.num_train_epochs,
                        eval_every=a.eval_interval, eval_rule="done", can_evaluate=any(self.eval_pairs),
                        log_every=a.logging_steps, log_item=False, log_next_epoch=True, save_every=a.save_steps,
                        desc="DPO")

    def train_step(self, batch: Sequence[int]) -> dict[str, float]:
        """One DPO step of every model on the ``batch[0]``-th slice of its shuffled pairs (a
        model whose pairs ran out this epoch waits for the next)."""
        a, nb = self.args, self._batch_pairs()
        per_model = []
        for k, pm in enumerate(self._unique):
            pairs = self.train_pairs[k]
            order = self._order(len(pairs), self.state.epoch, k)
            chunk = [pairs[i] for s in batch for i in order[s * nb:(s + 1) * nb]]
            if chunk:
                per_model.append(_dpo_step(pm, chunk, a, a.per_device_train_batch_size))
        self.state.optimizer_steps += 1
        return {**merge_metrics(per_model), "env_steps": 1}

    def evaluate(self, num_eval_samples: int | None = None) -> dict[str, float]:
        """DPO loss, implicit-reward accuracy and margin on the first ``num_eval_samples``
        evaluation pairs of each model (default ``args.eval_num_samples``), without updating
        weights. Logs and returns ``eval/...`` metrics (``{}`` without evaluation pairs)."""
        import torch

        n = self.args.eval_num_samples if num_eval_samples is None else num_eval_samples
        check_int("num_eval_samples", n, 0)
        sums: dict[str, float] = {}
        count = 0
        for k, pm in enumerate(self._unique):
            pairs = self.eval_pairs[k][:n]
            for j in range(0, len(pairs), self.args.eval_batch_size):
                chunk = pairs[j:j + self.args.eval_batch_size]
                with torch.no_grad():
                    pm.model.eval()
                    pi_c, pi_r = pair_logps(pm.model, chunk, pm.pad_id, pm.device)
                    ref_c = ref_r = None
                    if not self.args.reference_free:
                        with pm.as_reference() as reference:
                            ref_c, ref_r = pair_logps(reference, chunk, pm.pad_id, pm.device)
                    losses, rc, rr = dpo_loss(pi_c, pi_r, ref_c, ref_r, beta=self.args.beta)
                s = dict.fromkeys(("loss", "reward_accuracy", "margin", "chosen_reward", "rejected_reward",
                                   "chosen_logp", "rejected_logp"), 0.0)
                _accumulate(s, losses, rc, rr, pi_c, pi_r)
                for key, v in s.items():
                    sums[key] = sums.get(key, 0.0) + v
                count += len(chunk)
        if not count:
            return {}
        self.state.evaluations += 1
        metrics = {f"eval/{k}": v / count for k, v in sums.items()}
        metrics["eval/pairs"] = float(count)
        self.logger.log(metrics, env_step=self.state.env_step, epoch=self.state.epoch)
        return metrics


# ---------------------------------------------------------------------------------------------
# Online DPO ranked by the env's reward
# ---------------------------------------------------------------------------------------------
@learner_config
class OnlineDPOConfig(DPOConfig):
    """Configuration of :class:`OnlineDPOTrainer`: every :class:`DPOConfig` field, with
    ``per_device_train_batch_size`` counting training items per forward pass (an optimiser step
    uses ``per_device_train_batch_size * gradient_accumulation_steps`` items), ``max_steps``
    counting training items, and ``eval_interval`` counting preference updates."""

    num_candidates: int = 4
    """Replies sampled per item and trained agent (``k``); the best and the worst form the pair."""
    min_gap: float = 0.0
    """Smallest reward gap of a kept pair (kept when ``best - worst >= min_gap``; equal rewards
    never make a pair)."""
    max_new_tokens: int = 128
    """Longest sampled reply, in tokens."""
    temperature: float = 1.0
    """Sampling temperature of the candidates."""
    top_p: float = 1.0
    """Nucleus sampling mass of the candidates."""
    top_k: int | None = None
    """Top-k sampling of the candidates (``None``: off)."""
    eval_greedy: bool = True
    """Evaluate with greedy decoding (else with the training sampling settings)."""
    eval_num_turns: int = 1
    """Trained turns rolled per evaluation item (the env's reward of each is summed into
    ``eval/return_mean``)."""
    num_turns: int = 1
    """Trained turns per item with a pair each: at every turn ``num_candidates`` replies are
    sampled and scored, the best and the worst form that turn's pair, and the conversation goes
    on from the best (1: the item's first trained turn only)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("num_candidates", self.num_candidates, 2)
        check_float("min_gap", self.min_gap, 0.0)
        check_int("max_new_tokens", self.max_new_tokens, 1)
        check_float("temperature", self.temperature, 0.0, low_open=True)
        check_float("top_p", self.top_p, 0.0, 1.0, low_open=True)
        check_int("top_k", self.top_k, 1, allow_none=True)
        check_int("eval_num_turns", self.eval_num_turns, 1)
        check_int("num_turns", self.num_turns, 1)


class OnlineDPOTrainer(TaskLearner, _Base):
    """Online DPO on an environment: pairs ranked by the env's reward (module docstring).

    Args:
        agent_model: A folder, hub id, ``"embedded"``, a loaded model, or one per agent.
        env: A registered id or an environment object (``areset``/``astep``/``clone``/
            ``possible_agents``), typically wrapped in the multiturn-aware reward.
        eval_env: The environment (id or object) of :meth:`evaluate`; ``None``: ``{}``.
        args: An :class:`OnlineDPOConfig`.
        tokenizer: A tokenizer (or one per agent); default: the model folder's.
        env_kwargs: Keywords of ``collab_env.make`` when ``env``/``eval_env`` are ids.
        policies: Player -> policy for the players that are not trained (default: the spec's).
        trained_players: The players to train (default: the spec's trainable ones); their
            number must equal ``args.num_agents``.
        wandb_config: ``None`` or Weights & Biases settings.
    """

    def __init__(self, agent_model: Any = None, env: Any = None, eval_env: Any = None,
                 args: OnlineDPOConfig | None = None, *, tokenizer: Any = None,
                 env_kwargs: Mapping[str, Any] | None = None, policies: Mapping[str, Any] | None = None,
                 trained_players: Sequence[str] | None = None,
                 wandb_config: Mapping[str, Any] | None = None) -> None:
        args = OnlineDPOConfig() if args is None else args
        if not isinstance(args, OnlineDPOConfig):
            raise ConfigError(f"args must be an OnlineDPOConfig, got {type(args).__name__}.")
        if env is None:
            raise ConfigError("env= is required: a registered id (e.g. 'hidden-facts') or an environment object.")
        self.args = args
        self.task = TaskSource.build(args, num_agents=args.num_agents, env=env, eval_env=eval_env,
                                     env_kwargs=env_kwargs, policies=policies, trained_players=trained_players,
                                     dataset_path=False)
        self.skipped = 0
        self._setup(agent_model, tokenizer, args, wandb_config, self._planned_updates())

    def _items_per_update(self) -> int:
        return self.args.per_device_train_batch_size * self.args.gradient_accumulation_steps

    def _planned_updates(self) -> int:
        return max(1, math.ceil(self.task.planned_items(self.args.num_train_epochs, self.args.max_steps)
                                / self._items_per_update()))

    def _rollout(self, env: Any, indices: Sequence[int], g: int, depth: int, sampling: SamplingParams,
                 seeds: Callable[[int], list[int]], every_turn: bool = False):
        """The levels of the items' trees: ``g`` replies at the first turn and one after it, or
        (``every_turn``) ``g`` replies at every turn, going on from each turn's best."""
        if every_turn:
            return grow_trees(self.task, env, indices, self.models, branching=lambda d: g, max_depth=depth,
                              sampling=sampling, seeds=seeds, follow="best")[1]
        return grow_trees(self.task, env, indices, self.models, branching=lambda d: g if d == 0 else 1,
                          max_depth=depth, sampling=sampling, seeds=seeds)[1]

    def collect_pairs(self, indices: Sequence[int]) -> tuple[dict[int, list[Pair]], list[dict[str, Any]], int]:
        """Sample ``num_candidates`` replies per trained agent at each of an item's first
        ``num_turns`` trained turns, score each on a clone of the env, and pair the best against
        the worst; the conversation goes on from the best reply to the next turn.

        Returns:
            ``(pairs, records, reward_evaluations)``: pairs per distinct model index; one record
            per (item, turn, agent) with ``agent``, ``turn`` (1-based), ``texts``, ``rewards`` and the chosen pair
            (``chosen`` / ``rejected`` candidate indices, ``None`` when the rewards gave no pair;
            ``dropped: True`` when the prompt alone reaches ``max_length``, counted in
            ``skipped``).
        """

        a = self.args
        levels = self._rollout(self.train_env, indices, a.num_candidates, a.num_turns, learner_sampling(a),
                               self.task.seeds, every_turn=True)
        pairs: dict[int, list[Pair]] = {}
        records: list[dict[str, Any]] = []
        evals = 0
        for node in (n for level in levels for n in level):
            evals += len(node.joint)
            for agent in node.acting:
                comps = node.completions[agent]
                scores = completion_values(node, agent)
                ids = [tuple(c.token_ids or ()) for c in comps]
                picked = select_pair(scores, a.min_gap, keys=ids)
                records.append({"agent": agent, "turn": node.depth + 1, "texts": [c.text for c in comps],
                                "rewards": list(scores),
                                "chosen": picked[0] if picked else None,
                                "rejected": picked[1] if picked else None})
                if picked is None:
                    continue
                prompt = list(node.prompt_ids[agent])
                best, worst = list(ids[picked[0]]), list(ids[picked[1]])
                if a.max_length is not None:
                    room = a.max_length - len(prompt)
                    if room < 1:  # the prompt alone fills max_length: nothing to learn from
                        records[-1]["dropped"] = True
                        self.skipped += 1
                        continue
                    best, worst = best[:room], worst[:room]
                pairs.setdefault(self._model_index(agent), []).append((prompt, best, worst))
        return pairs, records, evals

    def _check_trainable(self) -> None:
        pass  # env= is required: there is always a training env

    def schedule(self) -> Schedule:
        """Training items, ``per_device_train_batch_size * gradient_accumulation_steps`` per
        preference update; evaluation before the first update and then every
        ``eval_interval`` updates; logs every ``logging_steps`` updates; checkpoints every
        ``save_steps`` updates."""
        return self.item_schedule(self._items_per_update(), "OnlineDPO", eval_rule="update", log_rule="update",
                                  log_next_epoch=True, save_rule="update")

    def train_step(self, batch: Sequence[int]) -> dict[str, float]:
        """Candidates and pairs of the items ``batch`` (:meth:`collect_pairs`), then one DPO step
        per model that got pairs."""
        a = self.args
        pairs, records, evals = self.collect_pairs(batch)
        metrics = self._candidate_metrics(records)
        per_model = [_dpo_step(self._unique[k], p, a, a.per_device_train_batch_size)
                     for k, p in sorted(pairs.items()) if p]
        metrics.update(merge_metrics(per_model))
        metrics["pairs"] = float(sum(len(p) for p in pairs.values()))
        if per_model:
            self.state.optimizer_steps += 1
        metrics["env_steps"] = evals
        return metrics

    @staticmethod
    def _candidate_metrics(records: Sequence[Mapping[str, Any]]) -> dict[str, float]:
        kept = [r for r in records if r["chosen"] is not None]
        return {
            "reward_mean": mean([x for r in records for x in r["rewards"]]),
            "chosen_env_reward": mean([r["rewards"][r["chosen"]] for r in kept]),
            "rejected_env_reward": mean([r["rewards"][r["rejected"]] for r in kept]),
            "pair_rate": mean([float(r["chosen"] is not None and not r.get("dropped")) for r in records]),
        }

    def evaluate(self, num_eval_samples: int | None = None) -> dict[str, float]:
        """Roll one reply per trained turn (``eval_num_turns`` turns) on the first
        ``num_eval_samples`` evaluation items (default ``args.eval_num_samples``) without
        updating weights; logs and returns ``eval/reward_mean`` (first turn), ``eval/return_mean``
        and ``eval/completion_length``. ``{}`` without ``eval_env``."""
        a = self.args
        n, seeds = self.task.begin_evaluation(a.eval_num_samples if num_eval_samples is None else num_eval_samples,
                                              self.state)
        if n == 0:
            return {}
        rewards: list[float] = []
        returns: list[float] = []
        lengths: list[int] = []
        for start in range(0, n, a.eval_batch_size):
            levels = self._rollout(self.eval_env, list(range(start, min(n, start + a.eval_batch_size))), 1,
                                   a.eval_num_turns, learner_sampling(self.args, True), seeds)
            for node in levels[0] if levels else []:
                for ja in node.joint:
                    rewards.append(mean(ja.rewards))
                    returns.append(mean(ja.returns))
            for nodes in levels:
                for node in nodes:
                    lengths.extend(len(c.token_ids or ()) for a_ in node.acting for c in node.completions[a_])
        metrics = {"eval/reward_mean": mean(rewards), "eval/return_mean": mean(returns),
                   "eval/completion_length": mean(lengths)}
        self.logger.log(metrics, env_step=self.state.env_step, epoch=self.state.epoch, item=self.state.items_done)
        return metrics

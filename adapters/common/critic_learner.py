"""The scaffolding of the actor-critic learners (IAC, MAAC): everything they share that is not
their algorithm.

:class:`CriticLearner` holds the CoMLRL trainer surface (arguments of the dataset path and of the
env path, through :class:`~collab_env.adapters.common.task.TaskSource`, plus a critic model), the
actors (models, optimisers, schedules, the learner binding into multiturn-aware futures), the
value-head critics (:class:`~collab_env.adapters.common.critics.ValueCritic`: a copy of the
actor, a ``critic_model`` loaded by the agents' loader, or a head on the actor; each with its
AdamW and schedule) and their forward passes over a batch, one-path episodes as per-agent
:class:`Transition` records, CoMLRL's reference-KL reward shaping, the actors' micro-batches,
``metrics_callback``, the guide's evaluation, checkpoints of actors and critics, and logging.

An algorithm file subclasses it and writes its algorithm top to bottom:
:meth:`CriticLearner.critic_inputs` (what each critic reads), its advantages and targets, and
``train_step`` (the actor and critic update). ``centralised`` says how the critics are laid out:
one critic per agent with one output (``False``), or one critic with an output per agent
(``True``).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from collab_env.adapters.common.checkpoint import (
    check_tensors,
    damaged,
    load_checkpoint,
    load_safe,
    refuse_legacy,
    save_checkpoint,
    save_safe,
    stat_regular,
)
from collab_env.adapters.common.config import TrainerConfig, learner_sampling
from collab_env.adapters.common.critics import ValueCritic
from collab_env.adapters.common.learner import TaskLearner
from collab_env.adapters.common.logging import MetricsLogger
from collab_env.adapters.common.loop import RunState, Schedule, mean, run
from collab_env.adapters.common.losses import pack_sequences, reference_kl_sums
from collab_env.adapters.common.models import adamw, load_model_and_tokenizer, make_scheduler
from collab_env.adapters.common.rollout import TreeNode, episode_item, grow_trees
from collab_env.adapters.common.task import ENV_METHODS, turn_metrics
from collab_env.errors import ConfigError, TaskFunctionError

__all__ = ["RolloutSample", "Transition", "CriticInput", "CriticLearner", "load_critic_model"]

#: What a critic reads for one agent's turn: ``(key, prefix ids, suffix ids)``; turns with the
#: same key share one critic input (:attr:`Transition.critic_key`).
CriticInput = tuple[tuple[int, ...], list[int], list[int]]


# ---------------------------------------------------------------------------------------------
# Rollout records
# ---------------------------------------------------------------------------------------------
@dataclass
class RolloutSample:
    """What ``metrics_callback(rollouts)`` receives: one completion of one agent."""

    agent_idx: int
    """Index of the agent (its position in ``formatters`` / the trained players)."""
    prompt: str
    """The latest message addressed to the agent (the turn's prompt)."""
    completion: str
    """The agent's completion text."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """``turn`` (1-based), ``reward`` (the agent's reward for this turn), ``player``,
    ``item_index`` (position in the split) and ``item`` (the task item)."""


@dataclass
class Transition:
    """One agent's turn, as the learner uses it."""

    root: int
    """Index of the episode in the batch."""
    turn: int
    """0-based turn (depth of the rollout tree)."""
    agent: int
    """Agent index."""
    prompt_ids: list[int]
    """The actor's prompt token ids."""
    completion_ids: tuple[int, ...]
    """The sampled completion token ids."""
    reward: float
    """The agent's reward for this turn (plus rewards earned until its next turn)."""
    critic_key: tuple[int, ...]
    """Transitions with the same key share one critic input (MAAC: every agent of a node)."""
    critic_prefix: list[int]
    """Critic token ids of the state (IAC: the agent's prompt; MAAC: ``env.state()``)."""
    critic_suffix: list[int]
    """Critic token ids of the action (IAC: the completion; MAAC: the joint action)."""
    sample: RolloutSample
    """The record handed to ``metrics_callback``."""



# ---------------------------------------------------------------------------------------------
# The scaffolding
# ---------------------------------------------------------------------------------------------
class CriticLearner(TaskLearner):
    """Shared scaffolding of the actor-critic learners (module docstring). Arguments are
    :class:`~collab_env.adapters.actor_critic.IACTrainer`'s; ``config_class`` is the config type
    the subclass accepts (an :class:`~collab_env.adapters.actor_critic.ActorCriticConfig`)."""

    centralised: bool = False
    """One critic with an output per agent (``True``) or one critic per agent (``False``)."""
    config_class: type[Any] = TrainerConfig
    name: str = "AC"

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
        metrics_callback: Callable[[list[RolloutSample]], Mapping[str, float]] | None = None,
        *,
        external_transition: Callable[..., Any] | None = None,
        tokenizer: Any = None,
        critic_model: Any = None,
        critic_tokenizer: Any = None,
        env: Any = None,
        eval_env: Any = None,
        env_kwargs: Mapping[str, Any] | None = None,
        policies: Mapping[str, Any] | None = None,
        trained_players: Sequence[str] | None = None,
    ) -> None:
        args = self.config_class() if args is None else args
        if not isinstance(args, self.config_class):
            raise ConfigError(f"args must be a {self.config_class.__name__}, got {type(args).__name__}.")
        if metrics_callback is not None and not callable(metrics_callback):
            raise ConfigError(f"metrics_callback must be callable or None, got {type(metrics_callback).__name__}.")
        if args.critic_placement == "head" and critic_model is not None:
            raise ConfigError("critic_model= gives the critic its own model; it contradicts critic_placement='head' "
                              "(use_separate_critic=False).")
        self.metrics_callback = metrics_callback
        args = self.setup_task(
            args, agent_model=agent_model, tokenizer=tokenizer, num_agents=num_agents,
            need_reference=lambda a: a.reference_kl_enabled,
            formatters=formatters, reward_func=reward_func, reward_processor=reward_processor,
            external_transition=external_transition, train_dataset=train_dataset, eval_dataset=eval_dataset,
            env=env, eval_env=eval_env, env_kwargs=env_kwargs, policies=policies, trained_players=trained_players,
            env_methods=(*ENV_METHODS, "state"))
        steps = self.planned_optimizer_steps()
        self.critics = self._build_critics(critic_model, critic_tokenizer)
        critic_lr = args.critic_learning_rate if args.critic_learning_rate is not None else args.learning_rate
        for c in self.critics:
            c.optimizer = adamw(c.parameters(), args, lr=critic_lr)
            c.scheduler = make_scheduler(c.optimizer, args, steps)
        self.state = RunState()
        config = {**args.to_dict(), "algorithm": self.name, **self.task.config_record()}
        self.logger = MetricsLogger(args.output_dir, config, wandb_config)

    def _build_critics(self, critic_model: Any, critic_tokenizer: Any) -> list[Any]:
        """One critic per agent (IAC), or one critic with an output per agent (``centralised``,
        MAAC)."""

        a = self.args
        n_critics = 1 if self.centralised else a.num_agents
        outputs = a.num_agents if self.centralised else 1
        critics = []
        for k in range(n_critics):
            actor = self.models[k]
            if a.critic_placement == "head":
                critics.append(ValueCritic(actor.model, actor.tokenizer, outputs, shares_actor=True, seed=a.seed + k))
                continue
            if critic_model is None:  # a copy of the agent's initial model
                backbone, tok = copy.deepcopy(actor.model), actor.tokenizer
            else:
                backbone, tok = load_critic_model(critic_model, critic_tokenizer, actor.device)
                if k > 0:
                    backbone = copy.deepcopy(backbone)
            critics.append(ValueCritic(backbone, tok, outputs, seed=a.seed + k))
        return critics

    def planned_optimizer_steps(self) -> int:
        """Optimiser steps of the whole run (for the learning-rate schedules)."""
        items = self.task.planned_items(self.args.num_train_epochs, self.args.max_steps)
        return max(1, math.ceil(items / self.args.per_device_train_batch_size) * self.args.num_iterations)

    def schedule(self) -> Schedule:
        """Training items in batches of ``per_device_train_batch_size``, CoMLRL's evaluation
        schedule, logs every ``logging_steps`` reward evaluations, checkpoints every
        ``save_steps`` items."""
        return self.item_schedule(self.args.per_device_train_batch_size, self.name)

    # -- rollouts -------------------------------------------------------------------------------
    def collect(self, indices: Sequence[int], *, evaluation: bool = False,
                seeds: Callable[[int], list[int]] | None = None):
        """Roll out one episode per item index of the training (or evaluation) split.

        Returns:
            ``(transitions, levels)``: every agent turn as a :class:`Transition` (ordered by
            episode, turn, agent), and the rollout tree's nodes per depth.
        """
        a = self.args
        env = self.eval_env if evaluation else self.train_env
        roots, levels = grow_trees(
            self.task, env, indices, self.models, branching=lambda d: 1, max_depth=a.num_turns,
            sampling=learner_sampling(a, evaluation), seeds=seeds or self.task.seeds, prompt_format=a.prompt_format,
            stop_above=None if evaluation else a.early_termination_threshold,  # CoMLRL: training only
            discount=a.discount)
        out: list[Transition] = []
        for root in roots:
            item = dict(episode_item(root.env))
            latest: dict[int, Transition] = {}  # the agent's last turn: where its later rewards go
            node: TreeNode | None = root
            while node is not None and node.joint:
                ja = node.joint[0]
                inputs = self.critic_inputs(node, ja)
                for agent in node.acting:
                    comp = node.completions[agent][ja.choice[agent]]
                    key, prefix, suffix = inputs[agent]
                    sample = RolloutSample(agent_idx=agent, prompt=node.prompts.get(agent, ""), completion=comp.text,
                                           metadata={"turn": node.depth + 1, "reward": 0.0,
                                                     "player": self.players[agent],
                                                     "item_index": int(indices[root.root]), "item": item})
                    tr = Transition(root=root.root, turn=node.depth, agent=agent,
                                    prompt_ids=list(node.prompt_ids[agent]),
                                    completion_ids=tuple(comp.token_ids or ()), reward=0.0, critic_key=key,
                                    critic_prefix=prefix, critic_suffix=suffix, sample=sample)
                    out.append(tr)
                    latest[agent] = tr
                for agent, tr in latest.items():
                    tr.reward += float(ja.rewards[agent])
                    tr.sample.metadata["reward"] = tr.reward
                node = ja.child
        return out, levels

    def critic_inputs(self, node: Any, ja: Any) -> dict[int, CriticInput]:
        """What the critics read for each acting agent of ``node`` under the joint action ``ja``
        (the algorithm's choice; a subclass writes it): agent -> :data:`CriticInput`."""
        raise NotImplementedError(f"{type(self).__name__} must define critic_inputs(node, ja).")

    def shape_with_reference_kl(self, transitions: Sequence[Transition], metrics: dict[str, float]) -> None:
        """CoMLRL's reference KL: each transition's reward minus ``reference_kl_coef`` times its
        completion's k3 KL to the initial policy, summed over tokens (raw logits, no gradient)."""

        a = self.args
        by_turn: dict[int, list[float]] = {}
        for tr in transitions:
            pm = self.models[tr.agent]
            batch = pack_sequences([tr.prompt_ids], [tr.completion_ids], pm.pad_id).to(pm.device)
            kl = float(reference_kl_sums(pm, batch).sum())
            tr.reward -= a.reference_kl_coef * kl
            tr.sample.metadata.update(reward=tr.reward, reference_kl=kl, reference_kl_penalty=a.reference_kl_coef * kl)
            by_turn.setdefault(tr.turn, []).append(kl)
        for d, kls in by_turn.items():
            metrics[f"turn_{d + 1}/reference_kl_mean"] = mean(kls)
            metrics[f"turn_{d + 1}/reference_kl_penalty_mean"] = a.reference_kl_coef * mean(kls)

    def critic_text(self, transition: Transition) -> str:
        """The text the critic reads for ``transition`` (state, then action), decoded."""
        tok = self.critics[0 if self.centralised else transition.agent].tokenizer
        return tok.decode(list(transition.critic_prefix) + list(transition.critic_suffix))

    # -- critics and actors on a batch ------------------------------------------------------------
    def critic_values(self, transitions: Sequence[Transition], *, grad: bool):
        """Per transition, ``(V, Q)`` tensors ``[len]`` (Q is None for ``critic_type="v"``),
        one critic forward per distinct critic input, in micro-batches."""
        import torch

        a = self.args
        want_q = a.critic_type == "q"
        v_out: list[Any] = [None] * len(transitions)
        q_out: list[Any] = [None] * len(transitions)
        by_critic: dict[int, dict[tuple[int, ...], list[int]]] = {}
        for i, tr in enumerate(transitions):
            c = 0 if self.centralised else tr.agent
            by_critic.setdefault(c, {}).setdefault(tr.critic_key, []).append(i)
        ctx = torch.enable_grad() if grad else torch.no_grad()
        with ctx:
            for c, groups in by_critic.items():
                critic = self.critics[c]
                keys = list(groups)
                for s in range(0, len(keys), a.train_micro_batch_size):
                    chunk = keys[s:s + a.train_micro_batch_size]
                    first = [transitions[groups[k][0]] for k in chunk]
                    suffixes = [t.critic_suffix if want_q else [] for t in first]
                    v, q = critic.values([t.critic_prefix for t in first], suffixes)
                    for row, k in enumerate(chunk):
                        for i in groups[k]:
                            col = transitions[i].agent if self.centralised else 0
                            v_out[i] = v[row, col]
                            q_out[i] = q[row, col] if want_q else None
        return v_out, q_out

    def actor_batches(self, transitions: Sequence[Transition]):
        """The actors' micro-batches: ``(owners, packed)``, where ``owners[k]`` lists the
        transitions of distinct model ``k`` (``_unique[k]``) and ``packed[k]`` is
        ``[(indices, TokenBatch on the model's device)]`` in chunks of ``train_micro_batch_size``."""

        a = self.args
        owners: dict[int, list[int]] = {}
        for i, tr in enumerate(transitions):
            owner = next(k for k, u in enumerate(self._unique) if u is self.models[tr.agent])
            owners.setdefault(owner, []).append(i)
        packed: dict[int, list[tuple[list[int], Any]]] = {}
        for owner, idx in owners.items():
            pm = self._unique[owner]
            chunks = [idx[s:s + a.train_micro_batch_size] for s in range(0, len(idx), a.train_micro_batch_size)]
            packed[owner] = [(ch, pack_sequences([transitions[i].prompt_ids for i in ch],
                                                 [transitions[i].completion_ids for i in ch], pm.pad_id).to(pm.device))
                             for ch in chunks]
        return owners, packed

    # -- the run ----------------------------------------------------------------------------------
    def train_step(self, indices: Sequence[int]) -> dict[str, float]:
        """One update on the items ``indices`` (each actor-critic learner writes its own)."""
        raise NotImplementedError

    def train(self) -> dict[str, Any]:
        """Train for ``num_train_epochs`` (or ``max_steps`` items), evaluating on the guide's
        schedule. Returns the last logged training metrics."""

        if self.train_env is None:
            raise ConfigError("train() needs train_dataset= (or env=).")
        return run(self)

    def end_epoch(self) -> dict[str, float]:
        """Nothing is buffered across batches: ``{}``."""
        return {}

    def callback_metrics(self, samples: list[RolloutSample]) -> dict[str, float]:
        """``metrics_callback(samples)`` as a dict of floats (``{}`` without a callback).

        Raises:
            TaskFunctionError: The callback returned something other than a dict of numbers.
        """
        if self.metrics_callback is None:
            return {}
        out = self.metrics_callback(samples)
        if out is None:
            return {}
        if not isinstance(out, Mapping):
            raise TaskFunctionError(f"metrics_callback must return a dict of numbers, got {type(out).__name__}.")
        try:
            return {str(k): float(v) for k, v in out.items()}
        except (TypeError, ValueError) as exc:
            raise TaskFunctionError(f"metrics_callback must return numeric values: {exc}") from exc

    # -- evaluation -------------------------------------------------------------------------------
    def evaluate(self) -> dict[str, float]:
        """Evaluate on the first ``args.eval_num_samples`` evaluation items, one joint response
        per turn, without updating weights. Logs and returns ``eval/turn_k/reward_mean``,
        ``eval/turn_k/expected_return`` and the ``metrics_callback`` values averaged over the
        items (prefixed ``eval/``); ``{}`` without an evaluation split."""
        a = self.args
        n, seeds = self.task.begin_evaluation(a.eval_num_samples, self.state)
        if n == 0:
            return {}
        all_levels: list[list[Any]] = [[] for _ in range(a.num_turns)]
        per_item: list[dict[str, float]] = []
        for start in range(0, n, a.eval_batch_size):
            indices = list(range(start, min(n, start + a.eval_batch_size)))
            transitions, levels = self.collect(indices, evaluation=True, seeds=seeds)
            for d, nodes in enumerate(levels):
                all_levels[d].extend(nodes)
            if self.metrics_callback is not None:
                for root in sorted({t.root for t in transitions}):
                    per_item.append(self.callback_metrics([t.sample for t in transitions if t.root == root]))
        metrics = turn_metrics([lv for lv in all_levels if lv], "eval/")
        for key in sorted({k for row in per_item for k in row}):
            metrics[f"eval/{key}"] = mean([row[key] for row in per_item if key in row])
        self.logger.log(metrics, env_step=self.state.env_step, epoch=self.state.epoch, item=self.state.items_done)
        if a.plot:
            self.logger.plot()
        return metrics

    # -- saving -----------------------------------------------------------------------------------
    def save_checkpoint(self, path: str | Path | None = None) -> Path:
        """Save the actors (``model_<k>/`` and the trainer state, as the shared checkpoint format
        writes them) and the critics (``critic_<k>.json`` + ``critic_<k>.safetensors``: head,
        optimiser and scheduler states and, for a separate critic, trainable backbone weights).
        Default folder: ``<output_dir>/checkpoint-<items done>``; continue the run with
        :meth:`load_checkpoint` then :meth:`train`."""

        path = Path(path) if path is not None else Path(self.args.output_dir) / f"checkpoint-{self.state.items_done}"
        save_checkpoint(path, self._unique, asdict(self.state), self._rng)
        for k, c in enumerate(self.critics):
            save_safe(path, f"critic_{k}", {
                "head": dict(c.head.state_dict()), "shares_actor": c.shares_actor,
                "backbone": None if c.shares_actor else
                {n: p.detach() for n, p in c.backbone.named_parameters() if p.requires_grad},
                "optimizer": c.optimizer.state_dict() if c.optimizer is not None else None,
                "scheduler": c.scheduler.state_dict() if c.scheduler is not None else None,
            })
        return path

    def load_checkpoint(self, path: str | Path) -> None:
        """Restore what :meth:`save_checkpoint` wrote (actors, critics, optimisers, schedulers,
        RNG states, position) into this trainer, built with the same models and config;
        :meth:`train` then continues the run. Only safetensors and JSON are read: an old pickle
        (``critic_<k>.pt``) is refused unread.

        Raises:
            ConfigError: Not a checkpoint of this trainer's shape (critics, parameters).
        """
        import torch

        path = Path(path)
        if not path.is_dir():
            raise ConfigError(f"{path} is not a folder; pass the checkpoint folder save_checkpoint() wrote.")
        blobs = []
        for k, c in enumerate(self.critics):  # every critic checked before anything is changed
            file = path / f"critic_{k}.json"
            if stat_regular(file) is None:  # a FIFO, device or folder in its place is refused here
                refuse_legacy(path / f"critic_{k}.pt")
                raise ConfigError(f"{path} holds no critic_{k}.json: pass a folder this trainer's save_checkpoint() "
                                  f"wrote (it saves {len(self.critics)} critic(s)).")
            blob = load_safe(path, f"critic_{k}")  # file types, sizes, nesting, safetensors header
            if not isinstance(blob, dict) or set(blob) != {"head", "shares_actor", "backbone", "optimizer",
                                                           "scheduler"}:
                raise damaged(file, "it is not a critic state (head, shares_actor, backbone, optimizer, scheduler)")
            own = {n: p for n, p in c.backbone.named_parameters() if p.requires_grad} if not c.shares_actor else None
            saved_backbone = blob["backbone"]
            if (blob["shares_actor"] is not c.shares_actor or (own is None) != (saved_backbone is None)
                    or (own is not None and (not isinstance(saved_backbone, dict) or set(saved_backbone) != set(own)))):
                raise ConfigError(f"{file} does not fit critic {k} (another critic_type, "
                                  "critic model or LoRA setting?); build the trainer as the saving run did.")
            head = c.head.state_dict()
            if not isinstance(blob["head"], dict) or set(blob["head"]) != set(head):
                got = sorted(blob["head"])[:6] if isinstance(blob["head"], dict) else type(blob["head"]).__name__
                raise ConfigError(f"{file}: critic {k}'s head has {got}, this trainer's has {sorted(head)}; build the "
                                  "trainer as the saving run did.")
            check_tensors(file, f"critic {k}'s head weight", blob["head"], {n: t.shape for n, t in head.items()})
            if own is not None:
                check_tensors(file, f"critic {k}'s parameter", blob["backbone"], {n: p.shape for n, p in own.items()})
            for name, t in [*blob["head"].items(), *(blob["backbone"] or {}).items()]:
                if not t.is_floating_point():
                    raise damaged(file, f"critic {k}'s {name} is {t.dtype}, not a floating-point tensor")
            for part, target in (("optimizer", c.optimizer), ("scheduler", c.scheduler)):
                saved = blob[part]
                if saved is not None and not isinstance(saved, dict):
                    raise damaged(file, f"critic {k}'s {part} state is a {type(saved).__name__}, not a dict")
                if saved is not None and target is None:
                    raise ConfigError(f"{file} holds a {part} state for critic {k}, which has none here; build "
                                      "the trainer as the saving run did.")
            opt = blob["optimizer"]
            if opt is not None:  # what torch checks only while it loads, checked before anything is loaded
                groups = opt.get("param_groups")
                mine = c.optimizer.param_groups
                if (not isinstance(groups, list) or len(groups) != len(mine) or not isinstance(opt.get("state"), dict)
                        or not all(isinstance(g, dict) and isinstance(g.get("params"), list)
                                   and len(g["params"]) == len(m["params"])
                                   for g, m in zip(groups, mine, strict=True))):
                    raise ConfigError(f"{file}: critic {k}'s optimiser state does not fit this trainer's optimiser "
                                      "(other critic model, LoRA or optimiser setting?); build the trainer as the "
                                      "saving run did.")
            blobs.append(blob)
        if (path / f"critic_{len(self.critics)}.json").exists():
            raise ConfigError(f"{path} holds more critics than this trainer's {len(self.critics)}; build the "
                              "trainer with the same agents and critic setting as the saving run.")
        self.state = RunState.from_dict(load_checkpoint(path, self._unique, self._rng))
        for c, blob in zip(self.critics, blobs, strict=True):
            c.head.load_state_dict(blob["head"])
            if blob["backbone"] is not None:
                with torch.no_grad():
                    for n, p in c.backbone.named_parameters():
                        if p.requires_grad:
                            p.copy_(blob["backbone"][n].to(p.device, p.dtype))
            if blob["optimizer"] is not None:
                c.optimizer.load_state_dict(blob["optimizer"])
            if blob["scheduler"] is not None:
                c.scheduler.load_state_dict(blob["scheduler"])
        self.logger.resume()

    def close(self) -> None:
        """Finish logging (closes the Weights & Biases run)."""
        self.logger.close()



def load_critic_model(spec: Any, tokenizer: Any, device: Any) -> tuple[Any, Any]:
    """``(model, tokenizer)`` of a separate critic from a folder, hub id, ``"embedded"`` or a
    loaded model, in float32 on ``device``: the agents' loader
    (:func:`~collab_env.adapters.common.models.load_model_and_tokenizer`), with the critic named
    in its errors."""
    import torch

    try:
        return load_model_and_tokenizer(spec, tokenizer, str(device), torch.float32)
    except ConfigError as exc:
        raise ConfigError(f"critic_model: {exc} (critic_tokenizer= names the critic's tokenizer).") from exc

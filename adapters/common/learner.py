"""Set-up every learner shares: its models with optimisers and schedules, the views of its task
source, the item schedule, and the shuffled order of an epoch.

* :func:`build_models`: the agents' models (:func:`~collab_env.adapters.common.models.load_policy_models`)
  with an AdamW optimiser and a learning-rate schedule each.
* :class:`TaskLearner`: a mixin for learners built on a
  :class:`~collab_env.adapters.common.task.TaskSource` (``self.task``): ``train_env``,
  ``eval_env``, ``players``, ``others`` and CoMLRL's item schedule.
* :func:`epoch_order`: the order of an epoch's rows (shuffled by the seed, the epoch and a key).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from collab_env.adapters.common.loop import Schedule
from collab_env.adapters.common.models import load_policy_models, make_optimizer, make_scheduler, unique_models
from collab_env.adapters.common.task import TaskSource
from collab_env.errors import ConfigError

__all__ = ["build_models", "TaskLearner", "epoch_order"]


def build_models(agent_model: Any, tokenizer: Any, num_agents: int, args: Any, *, need_reference: bool,
                 steps: int) -> tuple[list[Any], list[Any]]:
    """``(models, unique)``: one :class:`~collab_env.adapters.common.models.PolicyModel` per agent
    and the distinct ones, each with its optimiser and a schedule of ``steps`` optimiser steps."""

    models = load_policy_models(agent_model, tokenizer, num_agents, args, need_reference=need_reference)
    unique = unique_models(models)
    for pm in unique:
        pm.optimizer = make_optimizer(pm, args)
        pm.scheduler = make_scheduler(pm.optimizer, args, steps)
    return models, unique


def epoch_order(n: int, shuffle: bool, *seed: int) -> list[int]:
    """The order of ``n`` rows in an epoch: ``range(n)``, or a permutation drawn from
    ``numpy.random.default_rng(seed)`` (``seed``: the run's seed, the epoch, a key...)."""
    import numpy as np

    if not shuffle:
        return list(range(n))
    return [int(i) for i in np.random.default_rng(list(seed)).permutation(n)]


class TaskLearner:
    """Views of ``self.task`` (a :class:`~collab_env.adapters.common.task.TaskSource`) and the
    item schedule, for learners that play environments."""

    task: Any
    args: Any

    @property
    def train_env(self) -> Any:
        """The training environment."""
        return self.task.train_env

    @property
    def eval_env(self) -> Any:
        """The evaluation environment (``None``: no evaluation)."""
        return self.task.eval_env

    @property
    def players(self) -> tuple[str, ...]:
        """The trained players; agent ``i`` is ``players[i]``."""
        return self.task.players

    @property
    def others(self) -> dict[str, Any]:
        """Policies of the untrained players."""
        return self.task.others

    @property
    def _rng(self) -> Any:
        return self.task.rng

    def planned_optimizer_steps(self) -> int:
        """Optimiser steps the run plans (the length of the learning-rate schedule); each
        learner counts its own."""
        raise NotImplementedError

    def setup_task(self, args: Any, *, agent_model: Any, tokenizer: Any, num_agents: int | None,
                   need_reference: Callable[[Any], bool], **task: Any) -> Any:
        """The set-up every environment-playing learner shares, in order: check ``agent_model``
        and ``num_agents``; build the task source (``task``: the keywords of
        :meth:`TaskSource.build <collab_env.adapters.common.task.TaskSource.build>`); take the
        number of agents from an env's trained players; seed torch; build the models (with a
        reference model when ``need_reference(args)``) scheduled over
        ``self.planned_optimizer_steps()``. Sets
        ``self.task``, ``self.args``, ``self.models``; returns the final ``args``.

        Raises:
            ConfigError: No ``agent_model``; ``num_agents`` disagrees with ``args`` or with the
                env's trained players.
        """
        import torch

        if agent_model is None:
            raise ConfigError("agent_model is required: a model folder, a hub id, 'embedded' or a loaded model.")
        if num_agents is not None and num_agents != args.num_agents:
            raise ConfigError(
                f"num_agents={num_agents} but args.num_agents={args.num_agents}: set both to the same value."
            )
        self.task = TaskSource.build(args, num_agents=num_agents, **task)
        if task.get("env") is not None and num_agents is None:
            args = replace(args, num_agents=len(self.players))
        if len(self.players) != args.num_agents:
            raise ConfigError(
                f"the environment trains {len(self.players)} player(s) {list(self.players)} but "
                f"args.num_agents={args.num_agents}; set num_agents={len(self.players)}."
            )
        self.args = args
        torch.manual_seed(args.seed)
        self.models, self._unique = build_models(agent_model, tokenizer, args.num_agents, args,
                                                 need_reference=need_reference(args),
                                                 steps=self.planned_optimizer_steps())
        return args

    def item_schedule(self, batch: int, desc: str, **rules: Any) -> Schedule:
        """Training items in batches of ``batch``: an epoch is the training split (an unlimited
        env: ``max_steps`` items), the run ``num_train_epochs`` epochs or ``max_steps`` items;
        CoMLRL's evaluation schedule, logs every ``logging_steps`` reward evaluations,
        checkpoints every ``save_steps`` items, unless ``rules`` (:class:`Schedule` fields) say
        otherwise."""
        a = self.args
        per_epoch = self.task.items_per_epoch(a.max_steps)
        limit = a.max_steps if a.max_steps > 0 else per_epoch * a.num_train_epochs
        fields = dict(eval_every=a.eval_interval, eval_rule="position", can_evaluate=self.eval_env is not None,
                      log_every=a.logging_steps, log_rule="env_step", save_every=a.save_steps)
        fields.update(rules)
        env_id = getattr(getattr(self.train_env, "spec", None), "id", None)
        what = " ".join([*([str(env_id)] if env_id else []), ",".join(self.players)])
        return Schedule(unit="item", per_epoch=per_epoch, limit=limit, epochs=a.num_train_epochs, batch=batch,
                        desc=desc, what=what, **fields)

"""One run state, one schedule and one training loop for every learner, written as plain step
functions (:func:`next_batch`, :func:`evaluation_due`, :func:`following_batch`,
:func:`record_step`, :func:`log_due`, :func:`epoch_over` / :func:`next_epoch`, :func:`save_due`,
:func:`run_summary`) that a learner owning its loop calls in order (the ``train`` of MAGRPO,
REINFORCE and MADPO), and that :func:`run` calls for the learners that hand it their step.

A learner implements the :class:`Learner` protocol: ``args``, ``state`` (a :class:`RunState`),
``logger``, and the public methods :meth:`~Learner.schedule`, :meth:`~Learner.train_step`,
:meth:`~Learner.evaluate`, :meth:`~Learner.save_checkpoint` and :meth:`~Learner.end_epoch`.
:func:`run` drives it:

1. before each step, evaluate when the schedule says so (``eval_rule``);
2. ``metrics = learner.train_step(batch)``: the learner's algorithm on the batch of schedule
   units (training items, or one optimiser step) ``batch``; ``metrics["env_steps"]`` (popped)
   advances ``state.env_step``;
3. advance the position (units done, unit in epoch, epoch), keep the metrics for the log;
4. log the mean of the kept metrics when ``log_rule`` says so; call ``end_epoch()`` at the end
   of every epoch; save a checkpoint when ``save_rule`` says so;
5. after the last step: ``end_epoch()``, log what is left, the final evaluation when the
   schedule asks for one, the PNG curves when ``args.plot``, and the summary of the run
   (:meth:`~collab_env.adapters.common.logging.MetricsLogger.summary`: what was done, the
   reward, where the log, the curves and the checkpoints went).

Item learners (MAGRPO, REINFORCE, IAC/MAAC, online DPO) count training items; step learners
(SFT, DPO, the reward model, MADPO) count optimiser steps, and their ``train_step`` takes
exactly one (and counts it in ``state.optimizer_steps``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from collab_env._progress import progress_bar
from collab_env.adapters.common.collapse import DEFAULT_THRESHOLDS, check_collapse
from collab_env.adapters.common.config import eval_due
from collab_env.errors import ConfigError

__all__ = ["RunState", "Schedule", "Learner", "run", "flush_log", "merge_metrics", "mean", "next_batch",
           "evaluation_due", "following_batch", "record_step", "log_due", "epoch_over", "next_epoch", "save_due",
           "run_summary", "progress"]


def mean(xs: Sequence[float]) -> float:
    """The mean of ``xs`` (``nan`` for none)."""
    return sum(xs) / len(xs) if xs else float("nan")


@dataclass
class RunState:
    """Where a run is; saved in checkpoints. One state for every learner."""

    epoch: int = 0
    """Current epoch (0-based)."""
    in_epoch: int = 0
    """Schedule units (training items, or optimiser steps) already done in the current epoch."""
    items_done: int = 0
    """Training items used in total (item learners)."""
    env_step: int = 0
    """The logs' x axis: reward evaluations in training rollouts (item learners, MADPO), or
    optimiser steps (SFT, DPO, the reward model)."""
    optimizer_steps: int = 0
    """Optimiser steps (preference updates) taken (per model)."""
    evaluations: int = 0
    """Evaluations run (seeds each evaluation's sampling)."""
    last_log_step: int = 0
    """``env_step`` of the last training log line."""
    last_eval_update: int = -1
    """``optimizer_steps`` at the last evaluation of ``eval_rule="update"``."""
    pending: list[dict[str, float]] = field(default_factory=list)
    """Training metrics not yet logged."""

    @classmethod
    def from_dict(cls, saved: Mapping[str, Any]) -> RunState:
        """A state from a checkpoint's saved dict (unknown keys are ignored)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in saved.items() if k in names})


@dataclass(frozen=True)
class Schedule:
    """How :func:`run` walks a learner through its run."""

    unit: Literal["item", "step"]
    """What :func:`run` counts: training items (``state.items_done``) or optimiser steps
    (``state.optimizer_steps``, counted by ``train_step``)."""
    per_epoch: int
    """Units per epoch."""
    limit: int
    """Units in the whole run."""
    epochs: int
    """Epochs in the whole run."""
    batch: int = 1
    """Units per ``train_step`` (the last batch of an epoch or run may be smaller)."""
    eval_every: int = 0
    """Evaluation interval (0: never scheduled)."""
    eval_rule: Literal["position", "done", "update"] = "position"
    """``"position"``: CoMLRL's, before the first unit of every epoch and every ``eval_every``
    units of the epoch (:func:`~collab_env.adapters.common.config.eval_due`); ``"done"``: when
    the units done are a multiple of ``eval_every``; ``"update"``: when the optimiser steps are
    a multiple of ``eval_every``, once per optimiser-step count."""
    can_evaluate: bool = False
    """Whether there is anything to evaluate on."""
    final_eval: bool = False
    """Evaluate once more after the last step (when ``eval_every`` > 0)."""
    log_every: int = 1
    """Logging interval."""
    log_rule: Literal["env_step", "update"] = "env_step"
    """``"env_step"``: log when ``env_step`` moved ``log_every`` past the last log;
    ``"update"``: when the optimiser steps are a multiple of ``log_every``."""
    log_item: bool = True
    """Whether log lines carry ``item`` (training items done)."""
    log_next_epoch: bool = False
    """Roll the epoch before deciding to log, so the log line of an epoch's last step carries the
    next epoch (the step learners' labelling); else it carries its own."""
    summed: tuple[str, ...] = ()
    """Metrics summed over a logging window (the others are averaged, NaNs skipped)."""
    save_every: int = 0
    """Checkpoint interval (0: never)."""
    save_rule: Literal["done", "update"] = "done"
    """``"done"``: when the units done are a multiple of ``save_every``; ``"update"``: after a
    step that took an optimiser step, when the optimiser steps are a multiple of it."""
    desc: str = ""
    """Progress-bar label (the learner's name; the run summary's too)."""
    what: str = ""
    """What the run trains, after ``desc`` in the progress lines (the env id and the trained
    players)."""


@runtime_checkable
class Learner(Protocol):
    """What :func:`run` needs from a learner (every trainer of :mod:`collab_env.adapters` that
    does not write its own loop)."""

    args: Any
    state: RunState
    logger: Any

    def schedule(self) -> Schedule:
        """The run's :class:`Schedule` (computed from the config and the data)."""

    def train_step(self, batch: Sequence[int]) -> dict[str, float]:
        """The algorithm on one batch of schedule units; returns its metrics (``env_steps``:
        reward evaluations it made, popped by :func:`run`)."""

    def evaluate(self) -> dict[str, float]:
        """Evaluate without updating weights; log and return ``eval/...`` metrics."""

    def save_checkpoint(self, path: str | Path | None = None) -> Path:
        """Save what a resumed run needs."""

    def end_epoch(self) -> dict[str, float]:
        """Called at the end of every epoch and of the run; returns metrics to log (``{}``)."""


def merge_metrics(window: Sequence[Mapping[str, float]], summed: Sequence[str] = ()) -> dict[str, float]:
    """One log line of a window of step metrics: per key the mean over the steps that have it,
    NaNs skipped (``nan`` when all are), or the sum for the keys in ``summed``."""
    merged: dict[str, float] = {}
    for k in sorted({k for m in window for k in m}):
        vals = [m[k] for m in window if k in m and not math.isnan(m[k])]
        if k in summed:
            merged[k] = float(sum(vals))
        else:
            merged[k] = sum(vals) / len(vals) if vals else float("nan")
    return merged


def flush_log(learner: Any, summed: Sequence[str] = (), log_item: bool = True) -> dict[str, Any]:
    """Log the merged pending training metrics (:func:`merge_metrics`) at the current position,
    checked for collapse first (:func:`~collab_env.adapters.common.collapse.check_collapse` with
    the learner's ``collapse_thresholds`` when it has them: a ``CollapseWarning`` and
    ``collapse/flagged`` in the line)."""
    st = learner.state
    merged = merge_metrics(st.pending, summed)
    st.pending = []
    # Every training log line is checked for collapse (short, empty or duplicate completions).
    merged.update(check_collapse(merged, getattr(learner, "collapse_thresholds", DEFAULT_THRESHOLDS),
                                 where=f"env_step {st.env_step}"))
    st.last_log_step = st.env_step
    if log_item:
        return learner.logger.log(merged, env_step=st.env_step, epoch=st.epoch, item=st.items_done)
    return learner.logger.log(merged, env_step=st.env_step, epoch=st.epoch)


def _done(s: Schedule, st: RunState) -> int:
    return st.items_done if s.unit == "item" else st.optimizer_steps


# -- the steps of a training loop, as plain functions ------------------------------------------
# A learner that owns its loop (MAGRPO) calls these in order; :func:`run` is the same loop for
# the learners that hand it their ``train_step``.


def next_batch(s: Schedule, st: RunState) -> list[int] | None:
    """The schedule units of the step at ``st``'s position (the end of the epoch, or of the run,
    cuts it short); ``None`` when the run is over."""
    if st.epoch >= s.epochs or _done(s, st) >= s.limit:
        return None
    pos = st.in_epoch
    return list(range(pos, pos + min(s.batch, s.per_epoch - pos, s.limit - _done(s, st))))


def evaluation_due(s: Schedule, st: RunState, size: int) -> bool:
    """Whether the schedule evaluates before the step of ``size`` units at ``st``'s position
    (``eval_rule``; ``"update"`` marks the optimiser-step count as evaluated)."""
    if not s.can_evaluate or s.eval_every <= 0:
        return False
    if s.eval_rule == "position":
        return eval_due(st.in_epoch, size, s.eval_every)
    if s.eval_rule == "done":
        return _done(s, st) % s.eval_every == 0
    if st.optimizer_steps % s.eval_every == 0 and st.last_eval_update != st.optimizer_steps:
        st.last_eval_update = st.optimizer_steps
        return True
    return False


def following_batch(s: Schedule, st: RunState, size: int) -> list[int] | None:
    """The batch of the step after the one of ``size`` units starting at ``st``'s position
    (``None``: that step is the last), as :func:`next_batch` will compute it (item schedules)."""
    pos, epoch, done = st.in_epoch + size, st.epoch, st.items_done + size
    if pos >= s.per_epoch:
        pos, epoch = 0, epoch + 1
    if epoch >= s.epochs or done >= s.limit:
        return None
    return list(range(pos, pos + min(s.batch, s.per_epoch - pos, s.limit - done)))


def record_step(s: Schedule, st: RunState, metrics: dict[str, float], size: int) -> None:
    """Advance the position past a step of ``size`` units and keep its metrics for the log
    (``metrics["env_steps"]``, popped, advances ``env_step``)."""
    st.env_step += int(metrics.pop("env_steps", 0))
    if s.unit == "item":
        st.items_done += size
    st.in_epoch += size
    st.pending.append(metrics)


def log_due(s: Schedule, st: RunState) -> bool:
    """Whether to log now (``log_rule``)."""
    if s.log_rule == "env_step":
        return st.env_step - st.last_log_step >= s.log_every
    return st.optimizer_steps % s.log_every == 0


def epoch_over(s: Schedule, st: RunState) -> bool:
    """Whether the position is at the end of its epoch (then :func:`next_epoch`)."""
    return st.in_epoch >= s.per_epoch


def next_epoch(st: RunState, end_metrics: Mapping[str, float] | None = None) -> None:
    """Move to the next epoch's start, keeping the epoch's closing metrics (``end_metrics``,
    e.g. an update on what was left in a rollout buffer) for the log."""
    if end_metrics:
        st.pending.append(dict(end_metrics))
    st.epoch += 1
    st.in_epoch = 0


def save_due(s: Schedule, st: RunState, updates_before: int) -> bool:
    """Whether to save a checkpoint after a step (``save_rule``; ``updates_before``: the
    optimiser steps before it)."""
    return bool(s.save_every) and _done(s, st) % s.save_every == 0 and (
        s.save_rule == "done" or st.optimizer_steps != updates_before)


def run_summary(s: Schedule, st: RunState) -> dict[str, int]:
    """What a run did, for :meth:`~collab_env.adapters.common.logging.MetricsLogger.summary`."""
    done = {"items" if s.unit == "item" else "steps": _done(s, st), "optimiser steps": st.optimizer_steps,
            "epochs": st.epoch + (st.in_epoch > 0)}
    if s.unit == "step":
        done.pop("optimiser steps")
    return done


def progress(s: Schedule, st: RunState, logger: Any) -> Any:
    """The run's progress bar: on a terminal a bar, in a log file plain lines, none when the
    logger is not verbose (:mod:`collab_env._progress`); ``None`` or an object with ``update``
    and ``close``."""
    return progress_bar(s.limit, f"{s.desc} {s.what}".strip(), show=None if logger.verbose else False, lines=True,
                        initial=_done(s, st), unit=s.unit)


def run(learner: Learner) -> dict[str, Any]:
    """Train ``learner`` from its ``state`` to the end of its :class:`Schedule` (module
    docstring); returns the last logged training metrics. The loop of the learners that do not
    write their own (MAGRPO, REINFORCE and MADPO write theirs, from the same functions).

    Raises:
        ConfigError: ``args.async_rollouts``: only the tree learners' own loops overlap their
            rollouts with their updates.
    """
    s, st = learner.schedule(), learner.state
    if getattr(learner.args, "async_rollouts", False):
        raise ConfigError(f"async_rollouts=True: {type(learner).__name__} does not overlap its rollouts with its "
                          "updates (only the tree learners' item steps do: MAGRPO/GRPO, REINFORCE); set "
                          "async_rollouts=False.")
    bar = progress(s, st, learner.logger)
    last: dict[str, Any] = {}
    while (batch := next_batch(s, st)) is not None:
        if evaluation_due(s, st, len(batch)):
            learner.evaluate()
        updates = st.optimizer_steps
        record_step(s, st, learner.train_step(batch), len(batch))
        if s.log_next_epoch and epoch_over(s, st):
            next_epoch(st, learner.end_epoch())
        if log_due(s, st):
            last = flush_log(learner, s.summed, s.log_item)
        if epoch_over(s, st):
            next_epoch(st, learner.end_epoch())
        if save_due(s, st, updates):
            learner.logger.wrote(learner.save_checkpoint())
        if bar is not None:
            bar.update(len(batch))
    if bar is not None:
        bar.close()
    end = learner.end_epoch()
    if end:
        st.pending.append(dict(end))
    if st.pending:
        last = flush_log(learner, s.summed, s.log_item)
    if s.final_eval and s.can_evaluate and s.eval_every > 0:
        learner.evaluate()
    if learner.args.plot:
        learner.logger.plot()
    learner.logger.summary(s.desc or type(learner).__name__, run_summary(s, st))
    return last

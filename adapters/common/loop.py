"""The training-item loop the item-based learners share (MAGRPO, REINFORCE, IAC/MAAC).

One loop, the CoMLRL guide's schedule: per batch of ``per_device_train_batch_size`` training
items, evaluate first when :func:`~collab_env.adapters.common.config.eval_due` says so, train on
the batch (``trainer._train_batch(indices)`` returns its metrics and ``env_steps``), advance the
position (epoch, item in epoch, items done, ``env_step``), log every ``logging_steps``
``env_step``s, save every ``save_steps`` items. The trainer provides ``args``, ``state`` (with
``epoch``, ``item_in_epoch``, ``items_done``, ``env_step``, ``last_log_step``, ``pending``:
a :class:`TrainerState`),
``logger``, ``eval_env``, ``evaluate()``, ``save_checkpoint()``, ``_items_per_epoch()`` and
``_train_batch()``; optionally ``_end_epoch()`` (called at the end of every epoch and of
training; returns metrics, e.g. of updates on what a rollout buffer still held).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from collab_env.adapters.common.config import eval_due

__all__ = ["TrainerState", "run_item_loop", "flush_log"]


@dataclass
class TrainerState:
    """Where a run is; saved in checkpoints."""

    epoch: int = 0
    """Current epoch (0-based)."""
    item_in_epoch: int = 0
    """Training items of the current epoch already trained on."""
    items_done: int = 0
    """Training items trained on in total."""
    env_step: int = 0
    """Joint-action reward evaluations in training rollouts so far."""
    optimizer_steps: int = 0
    """Optimiser steps taken (per model)."""
    evaluations: int = 0
    """Evaluations run (seeds each evaluation's sampling)."""
    last_log_step: int = 0
    """``env_step`` of the last training log line."""
    pending: list[dict[str, float]] = field(default_factory=list)
    """Training metrics not yet logged (``logging_steps`` not reached)."""


def flush_log(trainer: Any) -> dict[str, Any]:
    """Log the mean of the pending training metrics (NaNs skipped) at the current position."""
    st = trainer.state
    keys = sorted({k for m in st.pending for k in m})
    merged = {}
    for k in keys:
        vals = [m[k] for m in st.pending if k in m and not math.isnan(m[k])]
        merged[k] = sum(vals) / len(vals) if vals else float("nan")
    st.pending = []
    st.last_log_step = st.env_step
    return trainer.logger.log(merged, env_step=st.env_step, epoch=st.epoch, item=st.items_done)


def _end_epoch(trainer: Any) -> None:
    hook = getattr(trainer, "_end_epoch", None)
    if hook is not None:
        metrics = hook()
        if metrics:
            trainer.state.pending.append(dict(metrics))


def run_item_loop(trainer: Any, desc: str) -> dict[str, Any]:
    """Train until ``num_train_epochs`` (or ``max_steps`` items) from ``trainer.state``;
    returns the last logged training metrics."""
    from tqdm.auto import tqdm

    a, st = trainer.args, trainer.state
    per_epoch = trainer._items_per_epoch()
    limit = a.max_steps if a.max_steps > 0 else per_epoch * a.num_train_epochs
    bar = tqdm(total=limit, initial=st.items_done, disable=not trainer.logger.verbose, desc=desc, unit="item")
    last: dict[str, Any] = {}
    while st.epoch < a.num_train_epochs and st.items_done < limit:
        pos = st.item_in_epoch
        size = min(a.per_device_train_batch_size, per_epoch - pos, limit - st.items_done)
        if eval_due(pos, size, a.eval_interval) and trainer.eval_env is not None:
            trainer.evaluate()
        metrics = trainer._train_batch(list(range(pos, pos + size)))
        st.env_step += int(metrics.pop("env_steps"))
        st.items_done += size
        st.item_in_epoch += size
        st.pending.append(metrics)
        if st.env_step - st.last_log_step >= a.logging_steps:
            last = flush_log(trainer)
        if st.item_in_epoch >= per_epoch:
            _end_epoch(trainer)
            st.epoch += 1
            st.item_in_epoch = 0
        if a.save_steps and st.items_done % a.save_steps == 0:
            trainer.save_checkpoint()
        bar.update(size)
    bar.close()
    _end_epoch(trainer)
    if st.pending:
        last = flush_log(trainer)
    if a.plot:
        trainer.logger.plot()
    return last

"""Data parallelism for the tree learners over ``torch.distributed`` (gloo on CPU, NCCL on GPU).

Launch a learner's script with ``torchrun --nproc_per_node N`` (or any launcher that sets up the
default process group; the learner initialises it from torchrun's environment when it is not
yet). Each rank rolls out its share of every batch's items (:func:`shard`), and
:func:`~collab_env.adapters.common.tree_learner.policy_update` makes the update the one a
single process would make on the whole batch: the loss divisors are the whole batch's
(:func:`global_totals`), and each rank's gradients, already divided by them, are summed across
the ranks (:func:`sum_gradients`) before clipping and the optimiser step. So every rank takes the
same step and the models stay identical, which a test checks against one rank on the same
global batch.

Ranks other than 0 write their metrics and checkpoints under ``output_dir/rank<N>``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any


def rank_world() -> tuple[int, int]:
    """``(rank, world size)`` of the default process group, ``(0, 1)`` when there is none."""
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch without distributed
        return 0, 1
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def init_from_launcher() -> tuple[int, int]:
    """Join the process group a launcher (torchrun, accelerate, Ray Train) describes in the
    environment (``WORLD_SIZE`` > 1), with gloo on CPU and NCCL on CUDA; nothing without one.
    Returns :func:`rank_world`."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        import torch
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return rank_world()


def shard(items: Sequence[Any]) -> list[Any]:
    """This rank's share of a batch: items ``rank, rank + world, ...``."""
    rank, world = rank_world()
    return list(items[rank::world])


def global_totals(tokens: Sequence[int], sequences: Sequence[int]) -> tuple[int, int, int]:
    """``(sequences, loss tokens, micro-batches)`` summed over the ranks, the divisors of
    :func:`~collab_env.adapters.common.losses.aggregation_plan` for the whole batch."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([sum(sequences), sum(tokens), len(tokens)], dtype=torch.float64)
    dist.all_reduce(t)
    return int(t[0]), int(t[1]), int(t[2])


def sum_gradients(params: Sequence[Any]) -> None:
    """Sum each parameter's gradient over the ranks (a missing gradient counts as zeros), in one
    flat all-reduce."""
    import torch
    import torch.distributed as dist

    if not params:
        return
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    dist.all_reduce(flat)
    offset = 0
    for p in params:
        n = p.grad.numel()
        p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
        offset += n


def sum_stats(stats: Mapping[str, float]) -> dict[str, float]:
    """Per key of any rank, the sum over the ranks (a rank without the key adds 0)."""
    import torch
    import torch.distributed as dist

    keys = sorted({k for keys in gathered(sorted(stats)) for k in keys})
    t = torch.tensor([float(stats.get(k, 0.0)) for k in keys], dtype=torch.float64)
    dist.all_reduce(t)
    return {k: float(v) for k, v in zip(keys, t.tolist(), strict=True)}


def gathered(value: Any) -> list[Any]:
    """Every rank's ``value`` (picklable), in rank order."""
    import torch.distributed as dist

    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def broadcast_parameters(model: Any) -> None:
    """Make every rank's parameters rank 0's (models built from the same seed already agree;
    this makes sure)."""
    import torch.distributed as dist

    for p in model.parameters():
        dist.broadcast(p.data, src=0)


def merge_ranks(metrics: Mapping[str, float], sums: Sequence[str] = ("env_steps",)) -> dict[str, float]:
    """A step's metrics over every rank's share: the keys in ``sums`` summed, the others the mean
    over the ranks that report them."""
    every = gathered(dict(metrics))
    keys = sorted({k for m in every for k in m})
    out = {}
    for k in keys:
        values = [float(m[k]) for m in every if k in m]
        out[k] = sum(values) if k in sums else sum(values) / len(values)
    return out

"""TRL's GRPOTrainer on a collab_env env across processes: the same script runs in one process,
under ``torchrun`` / ``accelerate launch``, and on Ray Train (``--ray-workers N``).

    # one process
    python examples/trl_distributed.py --model MODEL_DIR --out OUT
    # 2 ranks on one machine (CPU: gloo; GPU: NCCL)
    torchrun --nproc_per_node 2 examples/trl_distributed.py --model MODEL_DIR --out OUT
    accelerate launch --multi_gpu --num_processes 2 examples/trl_distributed.py --model MODEL_DIR --out OUT
    # Ray Train: a TorchTrainer with 2 CPU workers (ray.init() joins a cluster if one is running)
    python examples/trl_distributed.py --model MODEL_DIR --out OUT --ray-workers 2

On CPU, do not use ``accelerate launch --cpu --num_processes 2``: accelerate 1.16 sends ``--cpu``
to its single-process launcher and runs one process. ``--multi_gpu`` with ``use_cpu=True`` (this
script's default when no GPU is visible) runs the ranks on CPU over gloo.

The rollouts go through :func:`collab_env.adapters.trl.rollout_func` on every rank (each rank
plays the episodes of its share of the batch through the one episode driver); TRL's DDP averages
the gradients. At the end every rank writes ``OUT/param_hash.rank<N>.txt`` (a SHA-256 of its
parameters): the ranks of one run must agree. TRL writes its checkpoint to ``OUT/checkpoint-<step>``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
from pathlib import Path
from typing import Any


def param_hash(model: Any) -> str:
    """SHA-256 of a model's parameters (names, dtypes and bytes, in name order)."""
    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters()):
        t = p.detach().float().cpu().contiguous()
        h.update(name.encode() + b"\0" + t.numpy().tobytes())
    return h.hexdigest()


def train(cfg: dict[str, Any]) -> dict[str, Any]:
    """One rank's training (also Ray Train's per-worker function)."""
    import torch
    from trl import GRPOConfig, GRPOTrainer

    from collab_env.adapters import trl as ce_trl
    from collab_env.testing.tiny_model import load_tiny_chat_model

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    torch.manual_seed(cfg["seed"])
    model, tok = load_tiny_chat_model(cfg["model"])
    out = Path(cfg["out"])
    use_cpu = not torch.cuda.is_available()
    args = GRPOConfig(output_dir=str(out), per_device_train_batch_size=cfg["batch"], num_generations=cfg["generations"],
                      max_completion_length=cfg["max_new_tokens"], max_steps=cfg["steps"], logging_steps=1,
                      save_strategy="steps", save_steps=cfg["steps"], report_to="none", use_cpu=use_cpu,
                      bf16=False, learning_rate=cfg["learning_rate"], seed=cfg["seed"],
                      ddp_backend="gloo" if use_cpu else None)
    env_kwargs = cfg.get("env_kwargs") or None
    trainer = GRPOTrainer(model=model, processing_class=tok, reward_funcs=ce_trl.episode_reward,
                          train_dataset=ce_trl.dataset(cfg["env"], n=cfg["items"], player=cfg["player"],
                                                       env_kwargs=env_kwargs),
                          rollout_func=ce_trl.rollout_func(cfg["env"], player=cfg["player"], env_kwargs=env_kwargs),
                          args=args)
    result = trainer.train()
    rank = trainer.accelerator.process_index
    digest = param_hash(trainer.model)
    (out / f"param_hash.rank{rank}.txt").write_text(digest + "\n")
    rewards = [r["reward"] for r in trainer.state.log_history if "reward" in r]
    grad_norms = [r["grad_norm"] for r in trainer.state.log_history if "grad_norm" in r]
    print(f"[rank {rank} of {trainer.accelerator.num_processes}] {trainer.state.global_step} steps, "
          f"loss {result.training_loss:.4f}, rewards {rewards}, grad_norm {grad_norms}, params {digest[:16]}; "
          f"checkpoint in {out / f'checkpoint-{trainer.state.global_step}'}", flush=True)
    return {"rank": rank, "world": trainer.accelerator.num_processes, "hash": digest, "rewards": rewards,
            "grad_norms": grad_norms, "checkpoint": str(out / f"checkpoint-{trainer.state.global_step}")}


def train_on_ray(cfg: dict[str, Any], workers: int) -> Any:
    """Ray Train: :func:`train` on ``workers`` CPU workers of a ``TorchTrainer`` (Ray sets the
    rank variables and the gloo process group that accelerate picks up)."""
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    if not ray.is_initialized():
        ray.init(num_cpus=max(workers, os.cpu_count() or 1), include_dashboard=False, log_to_driver=True)

    def loop(config: dict[str, Any]) -> None:
        from ray import train as ray_train

        metrics = train(config)
        # rank 0 hands TRL's checkpoint folder to Ray (the result's Checkpoint); every rank reports
        checkpoint = ray_train.Checkpoint.from_directory(metrics["checkpoint"]) if metrics["rank"] == 0 else None
        ray_train.report({"hash": metrics["hash"], "world": metrics["world"]}, checkpoint=checkpoint)

    trainer = TorchTrainer(loop, train_loop_config=cfg, torch_config=TorchConfig(backend="gloo"),
                           scaling_config=ScalingConfig(num_workers=workers, use_gpu=False),
                           run_config=RunConfig(storage_path=str(Path(cfg["out"]).resolve() / "ray"), name="trl"))
    return trainer.fit()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="a model folder (e.g. build_tiny_chat_model's)")
    p.add_argument("--out", required=True, help="TRL's output_dir: checkpoints, param_hash.rank<N>.txt")
    p.add_argument("--env", default="length-ratio")
    p.add_argument("--player", default=None, help="the trained player (the env's one trainable player if it has one)")
    p.add_argument("--items", type=int, default=8)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--batch", type=int, default=4, help="per-device batch (completions)")
    p.add_argument("--generations", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--learning-rate", type=float, default=1e-2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ray-workers", type=int, default=0, help="train on Ray Train with this many CPU workers")
    a = p.parse_args(argv)
    player = a.player or ("agent_0" if a.env.startswith("length-ratio") else None)
    cfg = {"model": a.model, "out": a.out, "env": a.env, "player": player, "items": a.items, "steps": a.steps,
           "batch": a.batch,
           "generations": a.generations, "max_new_tokens": a.max_new_tokens, "learning_rate": a.learning_rate,
           "seed": a.seed}
    if a.ray_workers:
        result = train_on_ray(cfg, a.ray_workers)
        print(f"[ray] {a.ray_workers} workers; TRL's checkpoint in {a.out}; Ray's checkpoint {result.checkpoint}",
              flush=True)
    else:
        train(cfg)


if __name__ == "__main__":
    main()

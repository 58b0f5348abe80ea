"""Worker of tests/adapters/test_data_parallel.py: run in one process, or under
``torchrun --standalone --nproc_per_node 2``.

    ddp_magrpo.py update TINY_DIR OUT LOSS_TYPE...  # per loss type, one policy_update on a fixed global batch
    ddp_magrpo.py train TINY_DIR OUT              # MAGRPO on length-ratio, 2 items x 2 steps

``update`` gives each rank its share (:func:`collab_env.adapters.common.distributed.shard`) of
8 fixed samples and writes the updated parameters and the step's gradients to
``OUT/<loss type>.rank<N>.pt``; ``train`` writes
``OUT/hash.rank<N>.txt``.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path


def _flat(model):
    import torch

    return torch.cat([p.detach().reshape(-1).float().cpu() for _, p in sorted(model.named_parameters())])


def _trainer(tiny_dir: str, out: Path, **kw):
    import torch

    from collab_env.adapters.magrpo import MAGRPOConfig, MAGRPOTrainer
    from collab_env.testing.tiny_model import load_tiny_chat_model

    torch.manual_seed(0)
    model, tok = load_tiny_chat_model(tiny_dir)
    args = MAGRPOConfig(**{"num_agents": 1, "num_generations": 2, "max_new_tokens": 4, "eval_interval": 0,
                           "learning_rate": 1e-2, "output_dir": str(out), "plot": False, "seed": 0, **kw})
    return model, tok, args, MAGRPOTrainer


def update(tiny_dir: str, out: Path, loss_type: str) -> None:
    import torch

    from collab_env.adapters.common.distributed import rank_world, shard
    from collab_env.adapters.common.tree_learner import policy_update, update_settings
    from collab_env.tasks.cooperative import length_ratio_rows

    model, tok, args, cls = _trainer(tiny_dir, out, loss_type=loss_type, train_micro_batch_size=2,
                                     max_grad_norm=None)
    trainer = cls(agent_model=model, tokenizer=tok, num_agents=1, formatters=[lambda item: item["prompt"]],
                  reward_func=lambda c, *, batch_items: [0.0] * len(c), train_dataset=length_ratio_rows("train")[:2],
                  args=args)
    pm = trainer.models[0]
    prompts = [[5, 6, 7, 8], [9, 10, 11]]
    samples = [(prompts[i % 2], tuple(range(20 + i, 20 + i + 1 + i % 3)), (-1.0) ** i * (0.5 + 0.1 * i), 0)
               for i in range(8)]
    rank, _ = rank_world()
    policy_update(pm, shard(samples), trainer.loss, **update_settings(args))
    grads = torch.cat([p.grad.reshape(-1).float().cpu() if p.grad is not None else torch.zeros(p.numel())
                       for _, p in sorted(pm.model.named_parameters())])
    torch.save({"params": _flat(pm.model), "grads": grads}, out / f"{loss_type}.rank{rank}.pt")


def train(tiny_dir: str, out: Path) -> None:
    from collab_env.adapters.common.distributed import rank_world

    model, tok, args, cls = _trainer(tiny_dir, out, num_agents=2, per_device_train_batch_size=2, max_steps=4,
                                     logging_steps=1)
    trainer = cls(agent_model=model, tokenizer=tok, num_agents=2, env="length-ratio", args=args)
    before = hashlib.sha256(_flat(trainer.models[0].model).numpy().tobytes()).hexdigest()
    trainer.train()
    rank, world = rank_world()
    digest = hashlib.sha256(b"".join(_flat(pm.model).numpy().tobytes() for pm in trainer.models)).hexdigest()
    (out / f"hash.rank{rank}.txt").write_text(f"{before}\n{digest}\n")
    trainer.save_checkpoint()
    print(f"[rank {rank} of {world}] trained; params {digest[:16]}", flush=True)


if __name__ == "__main__":
    mode, tiny, folder = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    folder.mkdir(parents=True, exist_ok=True)
    if mode == "update":
        for loss_type in sys.argv[4:]:
            update(tiny, folder, loss_type)
    else:
        train(tiny, folder)

"""A joint reward model learns synthetic preferences: held-out pairwise accuracy before and after.

Two synthetic preference sets of joint (agent 1, agent 2) responses, trained with
:class:`~collab_env.adapters.reward_model.RewardModelTrainer` on the tiny random chat model of
``collab_env/testing/tiny_model.py`` (or ``--model``), evaluated on held-out pairs drawn with another seed:

* **keyword**: the chosen joint response has ``Paris`` somewhere in agent 2's answer; the
  rejected one is the same response without it.
* **detailed**: agent 2's chosen answer is its rejected answer plus 4-8 more words (prefer the
  longer, detailed response); agent 1's answer is shared.

    python benchmarks/bench_reward_model.py --out /tmp/bench_rm

Writes ``<out>/<task>/metrics.jsonl`` and prints a JSON summary (accuracy, loss, seconds).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

WORDS = ("the red box is heavy and blue ball light count then we answer how many apples are left "
         "after eat three of them").split()


def make_pairs(task: str, n: int, seed: int) -> list[dict]:
    """``n`` preference rows of ``task`` (``"keyword"`` or ``"detailed"``)."""
    rng = random.Random(seed)

    def words(k: int) -> list[str]:
        return [rng.choice(WORDS) for _ in range(k)]

    rows = []
    for _ in range(n):
        prompt = "Task " + " ".join(words(4))
        a, b = " ".join(words(rng.randint(3, 8))), words(rng.randint(3, 8))
        if task == "keyword":
            good = list(b)
            good.insert(rng.randint(0, len(good)), "Paris")
        else:
            good = b + words(rng.randint(4, 8))
        rows.append({"prompt": prompt, "chosen": [a, " ".join(good)], "rejected": [a, " ".join(b)]})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None, help="output folder (default: a temporary one)")
    p.add_argument("--model", default=None, help="model folder (default: the tiny test model)")
    p.add_argument("--tasks", nargs="+", default=["keyword", "detailed"], choices=["keyword", "detailed"])
    p.add_argument("--train-pairs", type=int, default=320)
    p.add_argument("--eval-pairs", type=int, default=200)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args(argv)

    import torch

    from collab_env.adapters.reward_model import RewardModelConfig, RewardModelTrainer

    torch.set_num_threads(a.threads)
    out = Path(a.out or tempfile.mkdtemp(prefix="bench_rm_"))
    summary: dict[str, dict] = {}
    for task in a.tasks:
        if a.model is None:
            from collab_env.testing.tiny_model import build_tiny_chat_model, load_tiny_chat_model

            model, tok = load_tiny_chat_model(build_tiny_chat_model(out / "tiny"))
        else:
            model, tok = a.model, None
        args = RewardModelConfig(learning_rate=a.lr, per_device_train_batch_size=8, num_train_epochs=a.epochs,
                                 eval_interval=0, eval_num_samples=a.eval_pairs, eval_batch_size=32,
                                 output_dir=str(out / task), max_length=256)
        start = time.time()
        trainer = RewardModelTrainer(model, make_pairs(task, a.train_pairs, 0), make_pairs(task, a.eval_pairs, 1),
                                     args, tokenizer=tok)
        before = trainer.evaluate()
        trainer.train()
        after = trainer.evaluate()
        summary[task] = {"accuracy_before": before["eval/accuracy"], "accuracy_after": after["eval/accuracy"],
                         "loss_before": before["eval/loss"], "loss_after": after["eval/loss"],
                         "steps": trainer.state.optimizer_steps, "seconds": round(time.time() - start, 1)}
        trainer.close()
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

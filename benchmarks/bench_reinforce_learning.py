"""MAREINFORCE learns the length-ratio task: evaluation reward before vs after training.

Two agents (brief, detailed) each train their own copy of a model on the registered
``length-ratio`` env (train split) with the chosen baseline (``mean``, ``rloo``, ``remax`` or
``none``); the test split is evaluated before training and after every ``--eval-interval``
items. The script prints the evaluation reward before and after, and writes the JSONL log,
``curves.png`` and ``summary.json`` to ``--out``.

    python benchmarks/bench_reinforce_learning.py                          # tiny random model, RLOO
    python benchmarks/bench_reinforce_learning.py --baseline remax         # ReMax (greedy baseline)
    python benchmarks/bench_reinforce_learning.py --model embedded --learning-rate 2e-5

Defaults (tiny model, 32 items, 4 generations, 16 new tokens, lr 1e-2) take 10-20 s on CPU with
``OMP_NUM_THREADS=1``; on a machine already busy, more torch threads than free cores made the same
run take 5 minutes. Measured (seed 0, sampled evaluation, 8 test items x 2): eval reward
0.386 -> rloo 0.896, remax 0.898, mean 0.766, none 0.470.

A tiny random model can only learn *when to stop*: the brief agent learns to end early, the
detailed one to keep going, which moves ``len(detailed) / len(brief)`` into the target band.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; returns the exit status."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny", help="'tiny', 'embedded' or a model folder")
    p.add_argument("--baseline", default="rloo", choices=["mean", "rloo", "remax", "none"])
    p.add_argument("--items", type=int, default=32, help="training items (the train split has 32; more repeat it)")
    p.add_argument("--generations", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--learning-rate", type=float, default=1e-2)
    p.add_argument("--eval-interval", type=int, default=8)
    p.add_argument("--eval-samples", type=int, default=8, help="test items per evaluation (the split has 8)")
    p.add_argument("--eval-pass-k", type=int, default=2,
                   help="sampled answers per test item (1 with --eval-greedy)")
    p.add_argument("--eval-greedy", action="store_true", help="evaluate greedy answers instead of samples")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="bench_reinforce_output")
    args = p.parse_args(argv)

    import collab_env
    from collab_env.adapters.reinforce import MAREINFORCEConfig, MAREINFORCETrainer

    model, tokenizer = args.model, None
    if args.model == "tiny":
        from transformers import PreTrainedTokenizerFast

        from collab_env.testing.tiny_model import build_tiny_chat_model

        model = str(build_tiny_chat_model(Path(tempfile.mkdtemp()) / "tiny"))
        tokenizer = PreTrainedTokenizerFast.from_pretrained(model)
    epochs = -(-args.items // 32)
    config = MAREINFORCEConfig(
        num_agents=2, baseline=args.baseline, num_generations=args.generations,
        max_new_tokens=args.max_new_tokens, learning_rate=args.learning_rate, num_train_epochs=epochs,
        max_steps=args.items, eval_interval=args.eval_interval, eval_num_samples=args.eval_samples,
        eval_batch_size=args.eval_samples, eval_greedy=args.eval_greedy,
        eval_pass_k=1 if args.eval_greedy else args.eval_pass_k, logging_steps=1, seed=args.seed,
        output_dir=args.out,
    )
    trainer = MAREINFORCETrainer(agent_model=model, tokenizer=tokenizer, env="length-ratio",
                                 eval_env=collab_env.make("length-ratio", split="test"), args=config)
    start = time.perf_counter()
    trainer.train()
    final = trainer.evaluate()
    seconds = time.perf_counter() - start
    trainer.close()
    trainer.logger.plot()
    evals = [r for r in trainer.logger.records if "eval/turn_1/reward_mean" in r]
    train = [r["turn_1/reward_mean"] for r in trainer.logger.records if "turn_1/reward_mean" in r]
    before, after = evals[0]["eval/turn_1/reward_mean"], final["eval/turn_1/reward_mean"]
    summary = {"model": args.model, "baseline": args.baseline, "items": args.items, "seed": args.seed,
               "seconds": round(seconds, 1), "eval_reward_before": before, "eval_reward_after": after,
               "eval_curve": [(r["item"], round(r["eval/turn_1/reward_mean"], 4)) for r in evals],
               "train_reward_first_8": sum(train[:8]) / max(len(train[:8]), 1),
               "train_reward_last_8": sum(train[-8:]) / max(len(train[-8:]), 1),
               "curves_png": str(Path(args.out) / "curves.png")}
    print(json.dumps(summary, indent=1))
    Path(args.out, "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

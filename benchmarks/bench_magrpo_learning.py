"""MAGRPO learns the length-ratio task: evaluation reward before vs after training.

Two agents (brief, detailed) each train their own copy of a small model on the registered
``length-ratio`` env (train split); the ``length-ratio`` test split is evaluated greedily
before training and after every ``--eval-interval`` items. The script prints the evaluation
reward before and after, and writes the JSONL log and ``curves.png`` to ``--out``.

    python benchmarks/bench_magrpo_learning.py                      # embedded SmolLM2-135M
    python benchmarks/bench_magrpo_learning.py --model tiny         # tiny random model (seconds)

Defaults keep a CPU run within about ten minutes: 24 training items, 4 generations per agent,
completions of at most 32 tokens.
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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="embedded", help="'embedded', 'tiny' or a model folder")
    p.add_argument("--items", type=int, default=24, help="training items (the train split has 32)")
    p.add_argument("--generations", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--learning-rate", type=float, default=2e-5)
    p.add_argument("--eval-interval", type=int, default=8)
    p.add_argument("--lora-r", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="bench_magrpo_output")
    args = p.parse_args()

    import collab_env
    from collab_env.adapters.magrpo import MAGRPOConfig, MAGRPOTrainer

    model, tokenizer = args.model, None
    if args.model == "tiny":
        from transformers import PreTrainedTokenizerFast

        from collab_env.testing.tiny_model import build_tiny_chat_model

        model = str(build_tiny_chat_model(Path(tempfile.mkdtemp()) / "tiny"))
        tokenizer = PreTrainedTokenizerFast.from_pretrained(model)
    config = MAGRPOConfig(
        num_agents=2, num_generations=args.generations, max_new_tokens=args.max_new_tokens,
        learning_rate=args.learning_rate, max_steps=args.items, eval_interval=args.eval_interval,
        eval_num_samples=8, eval_batch_size=8, eval_greedy=True, logging_steps=1, seed=args.seed,
        lora_r=args.lora_r, lora_alpha=2.0 * max(args.lora_r, 1), output_dir=args.out,
    )
    trainer = MAGRPOTrainer(agent_model=model, tokenizer=tokenizer, env="length-ratio",
                            eval_env=collab_env.make("length-ratio", split="test"), args=config)
    start = time.perf_counter()
    trainer.train()
    final = trainer.evaluate()
    seconds = time.perf_counter() - start
    trainer.close()
    evals = [r for r in trainer.logger.records if "eval/turn_1/reward_mean" in r]
    trainer.logger.plot()
    before, after = evals[0]["eval/turn_1/reward_mean"], final["eval/turn_1/reward_mean"]
    summary = {"model": args.model, "items": args.items, "seconds": round(seconds, 1),
               "eval_reward_before": before, "eval_reward_after": after,
               "eval_curve": [(r["item"], r["eval/turn_1/reward_mean"]) for r in evals],
               "curves_png": str(Path(args.out) / "curves.png")}
    print(json.dumps(summary, indent=1))
    Path(args.out, "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

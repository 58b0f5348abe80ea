"""MAGRPO on team-facts: two agents and the scripted user, eval reward before vs after training.

Both agents (``agent_0`` the captain, ``agent_1``) train their own copy of a model with the
existing MAGRPO learner on the registered ``team-facts-easy`` env (train split; the scripted
user answers inside the driver); the test split is evaluated greedily before training and after
every ``--eval-interval`` items. Writes the JSONL log, ``curves.png`` and ``summary.json`` to
``--out``, and ``team_magrpo_<model>.{json,md,png}`` to ``benchmarks/results/``.

    python benchmarks/bench_team_magrpo.py --model tiny --items 8 --max-new-tokens 8   # loaded CPU
    python benchmarks/bench_team_magrpo.py                              # full size, embedded SmolLM2

With the tiny random model the reward it can move is the question cost: random text is a
useless question (-0.1 per agent per round); learning to say nothing (or only ``TEAM:`` lines)
raises the round reward to 0. Exact answers need a real model (the embedded one, full size).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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
    p.add_argument("--items", type=int, default=32, help="training items (generated: unlimited)")
    p.add_argument("--generations", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--learning-rate", type=float, default=2e-5)
    p.add_argument("--eval-interval", type=int, default=8)
    p.add_argument("--lora-r", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="bench_team_magrpo_output")
    p.add_argument("--results", default=str(Path(__file__).resolve().parent / "results"))
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
    trainer = MAGRPOTrainer(agent_model=model, tokenizer=tokenizer, env="team-facts-easy",
                            eval_env=collab_env.make("team-facts-easy", split="test", num_items=8),
                            args=config)
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
    summary["env"] = "team-facts-easy-v0"
    summary["args"] = vars(args)
    print(json.dumps(summary, indent=1))
    Path(args.out, "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    stem = Path(args.results) / f"team_magrpo_{Path(args.model).name}"
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".json").write_text(json.dumps(summary, indent=1) + "\n")
    shutil.copyfile(Path(args.out) / "curves.png", stem.with_suffix(".png"))
    stem.with_suffix(".md").write_text(
        f"# MAGRPO on team-facts-easy-v0 ({args.model} model)\n\n"
        f"Two trained agents + the scripted user; {args.items} training items, {args.generations} "
        f"generations, completions of at most {args.max_new_tokens} tokens, seed {args.seed}, "
        f"{summary['seconds']} s.\n\n| item | eval reward (turn 1) |\n|---|---|\n"
        + "".join(f"| {i} | {r:.3f} |\n" for i, r in summary["eval_curve"])
        + f"| final | {after:.3f} |\n\nBefore {before:.3f}, after {after:.3f}.\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

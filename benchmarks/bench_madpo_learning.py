"""MADPO learns the length-ratio task: sampled evaluation reward before, during and after training,
over several seeds, with a 95 % interval across seeds.

Two agents (brief ``agent_0``, detailed ``agent_1``) of the registered ``length-ratio`` env (train
split, 32 items) each train their own copy of the tiny random chat model (``collab_env/testing/tiny_model.py``,
built from the run's seed) with :class:`~collab_env.adapters.madpo.MADPOTrainer`: pairs collected
once from the initial policies (``--candidates`` joint responses per item, ranked by the env's
joint reward, ``--pairs-per-item`` kept, largest gaps first), then ``--epochs`` passes of the
factorised joint margin loss. The 8 items of the ``length-ratio`` test split are evaluated
with ``--eval-samples`` sampled joint answers each (temperature 1; greedy answers of the tiny
random model barely move) (the trainer's own evaluation: the task reward, ``eval/turn_1/reward_mean``) before the
first update, every ``--eval-interval`` updates, and at the end.

    OMP_NUM_THREADS=1 python benchmarks/bench_madpo_learning.py --seeds 0,1,2 \\
        --out benchmarks/results/madpo_length_ratio_tiny

Writes ``<out>.json`` (per seed: the curve, before/after; across seeds: mean and interval) and
``<out>.png``; each run's ``metrics.jsonl`` stays in a temporary folder (``--keep`` to print it).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

def interval(xs: list[float]) -> dict:
    """Mean and 95 % t-interval half-width of ``xs`` across seeds."""
    from collab_env.eval.stats import t_interval

    t = t_interval(xs)
    return {"mean": t["mean"], "half_width_95": t["hi"] - t["mean"], "n": t["n"]}


def tiny(seed: int):
    from collab_env.testing.tiny_model import build_tiny_chat_model, load_tiny_chat_model

    return load_tiny_chat_model(build_tiny_chat_model(Path(tempfile.mkdtemp()) / "tiny", seed=seed))


def eval_curve(trainer) -> list[tuple[int, float]]:
    """``(optimiser steps so far, eval reward)`` of every evaluation record in the log."""
    out, steps = [], 0
    for r in trainer.logger.records:
        if "dpo/loss" in r or "policy_loss" in r or "actor_loss" in r:
            steps += 1
        if "eval/turn_1/reward_mean" in r:
            out.append((steps, r["eval/turn_1/reward_mean"]))
    return out


def summarise(name: str, runs: list[dict], args, command: str) -> dict:
    befores = [r["eval_reward_before"] for r in runs]
    afters = [r["eval_reward_after"] for r in runs]
    gains = [a - b for a, b in zip(afters, befores)]
    return {"benchmark": name, "command": command, "date": str(date.today()),
            "machine": f"{platform.machine()} {platform.processor() or ''}".strip(), "threads": os.environ.get("OMP_NUM_THREADS"),
            "settings": vars(args), "before": interval(befores), "after": interval(afters), "gain": interval(gains),
            "seeds_improved": sum(g > 0 for g in gains), "runs": runs}


def plot(summary: dict, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for r in summary["runs"]:
        xs, ys = zip(*r["eval_curve"])
        ax.plot(xs, ys, marker="o", alpha=0.7, label=f"seed {r['seed']}")
    b, a = summary["before"], summary["after"]
    ax.set_title(f"{title}\nbefore {b['mean']:.3f}±{b['half_width_95']:.3f}, "
                 f"after {a['mean']:.3f}±{a['half_width_95']:.3f} (95% CI, {a['n']} seeds)", fontsize=9)
    ax.set_xlabel("optimiser steps")
    ax.set_ylabel("sampled eval reward (task, test split)")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_seeds(name: str, script: str, run_one, args, argv: list[str] | None, title: str) -> dict:
    """Run ``run_one(seed, args)`` for every seed of ``--seeds`` (printing each run), then write
    ``<--out>.json`` (:func:`summarise`) and ``<--out>.png`` (:func:`plot`); returns the summary."""
    command = f"python benchmarks/{script} " + " ".join(sys.argv[1:] if argv is None else argv)
    runs = []
    for s in [int(x) for x in args.seeds.split(",")]:
        runs.append(run_one(s, args))
        print(json.dumps({k: v for k, v in runs[-1].items() if k != "eval_curve"}), flush=True)
    summary = summarise(name, runs, args, command)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(summary, indent=1) + "\n")
    plot(summary, out.with_suffix(".png"), title)
    print(json.dumps({k: summary[k] for k in ("before", "after", "gain", "seeds_improved")}, indent=1))
    return summary


def run_one(seed: int, args) -> dict:
    import collab_env
    from collab_env.adapters.madpo import MADPOConfig, MADPOTrainer

    model, tok = tiny(seed)
    out = tempfile.mkdtemp(prefix=f"madpo_{seed}_")
    cfg = MADPOConfig(
        num_agents=2, preference_num_candidates=args.candidates, preference_pairs_per_sample=args.pairs_per_item,
        dpo_beta=args.beta, max_new_tokens=args.max_new_tokens, learning_rate=args.learning_rate,
        train_batch_size=args.batch, num_train_epochs=args.epochs, max_steps=args.items,
        eval_interval=args.eval_interval, eval_num_samples=8, eval_batch_size=8, eval_greedy=False, eval_pass_k=args.eval_samples,
        logging_steps=1, seed=seed, output_dir=out, plot=False)
    trainer = MADPOTrainer(agent_model=model, tokenizer=tok, env="length-ratio",
                           eval_env=collab_env.make("length-ratio", split="test"), args=cfg)
    start = time.perf_counter()
    trainer.train()
    final = trainer.evaluate()
    seconds = time.perf_counter() - start
    curve = eval_curve(trainer)
    return {"seed": seed, "pairs": len(trainer.pairs), "updates": trainer.state.optimizer_steps,
            "seconds": round(seconds, 1), "eval_reward_before": curve[0][1],
            "eval_reward_after": final["eval/turn_1/reward_mean"], "eval_curve": curve, "log": out}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--items", type=int, default=32, help="training items (the train split has 32)")
    p.add_argument("--candidates", type=int, default=4)
    p.add_argument("--pairs-per-item", type=int, default=2)
    p.add_argument("--beta", type=float, default=0.1)
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--learning-rate", type=float, default=3e-3)
    p.add_argument("--batch", type=int, default=4, help="pairs per update")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--eval-interval", type=int, default=4, help="updates between evaluations")
    p.add_argument("--eval-samples", type=int, default=8, help="sampled joint answers per test item")
    p.add_argument("--out", default="bench_madpo_output")
    args = p.parse_args(argv)
    run_seeds("madpo_length_ratio_tiny", Path(__file__).name, run_one, args, argv,
              "MADPO, length-ratio, tiny model (sampled eval, task reward)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

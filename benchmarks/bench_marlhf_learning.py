"""MARLHF learns the length-ratio task from a learned reward: sampled evaluation reward (on the
task reward) before, during and after the RL stage, over several seeds, with a 95 % interval.

Two agents (brief ``agent_0``, detailed ``agent_1``) of the registered ``length-ratio`` env (train
split) each train their own copy of the tiny random chat model (``collab_env/testing/tiny_model.py``, built
from the run's seed) with :class:`~collab_env.adapters.marlhf.MARLHFTrainer`: preference pairs
from the initial policies ranked by the env's (task) reward, a Bradley-Terry joint reward model
on a copy of the initial model trained on them and frozen, then ``--rl-algorithm`` on the reward
model's score. The 8 items of the ``length-ratio`` test split are evaluated with the *task*
reward, ``--eval-samples`` sampled joint answers each (temperature 1), before the RL stage,
every ``--eval-interval`` training items, and at the end.

    OMP_NUM_THREADS=1 python benchmarks/bench_marlhf_learning.py --seeds 0,1,2 \\
        --out benchmarks/results/marlhf_length_ratio_tiny

Writes ``<out>.json`` and ``<out>.png`` (same layout as ``bench_madpo_learning.py``).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_madpo_learning import eval_curve, run_seeds, tiny  # noqa: E402


def run_one(seed: int, args) -> dict:
    import collab_env
    from collab_env.adapters.marlhf import MARLHFConfig, MARLHFTrainer

    model, tok = tiny(seed)
    out = tempfile.mkdtemp(prefix=f"marlhf_{seed}_")
    cfg = MARLHFConfig(
        num_agents=2, rl_algorithm=args.rl_algorithm, preference_num_candidates=args.candidates,
        preference_pairs_per_sample=args.pairs_per_item, reward_learning_rate=args.reward_learning_rate,
        reward_num_train_epochs=args.reward_epochs, reward_train_batch_size=4, num_generations=args.generations,
        max_new_tokens=args.max_new_tokens, learning_rate=args.learning_rate, num_train_epochs=args.epochs,
        max_steps=args.items if args.items < 32 else -1,
        eval_interval=args.eval_interval, eval_num_samples=8, eval_batch_size=8, eval_greedy=False,
        eval_pass_k=args.eval_samples, normalize_advantages=bool(args.normalize_advantages), logging_steps=1,
        seed=seed, output_dir=out, plot=False)
    trainer = MARLHFTrainer(agent_model=model, tokenizer=tok, env="length-ratio",
                            eval_env=collab_env.make("length-ratio", split="test"), args=cfg)
    start = time.perf_counter()
    trainer.train()
    final = trainer.evaluate()
    seconds = time.perf_counter() - start
    curve = eval_curve(trainer)
    rm = next(r for r in trainer.logger.records if "reward_model/train_accuracy" in r)
    return {"seed": seed, "pairs": len(trainer.pairs), "reward_model_train_accuracy": rm["reward_model/train_accuracy"],
            "seconds": round(seconds, 1), "eval_reward_before": curve[0][1],
            "eval_reward_after": final["eval/turn_1/reward_mean"], "eval_curve": curve, "log": out}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--rl-algorithm", default="magrpo")
    p.add_argument("--items", type=int, default=32, help="training items (the train split has 32)")
    p.add_argument("--candidates", type=int, default=4)
    p.add_argument("--pairs-per-item", type=int, default=4)
    p.add_argument("--reward-learning-rate", type=float, default=1e-3)
    p.add_argument("--reward-epochs", type=int, default=3)
    p.add_argument("--generations", type=int, default=4)
    p.add_argument("--epochs", type=int, default=1, help="RL passes over the training items")
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--learning-rate", type=float, default=3e-3)
    p.add_argument("--normalize-advantages", type=int, default=1,
                   help="1: divide advantages by the group's std (CoMLRL's advantage_normalization default)")
    p.add_argument("--eval-interval", type=int, default=8, help="training items between evaluations")
    p.add_argument("--eval-samples", type=int, default=8, help="sampled joint answers per test item")
    p.add_argument("--out", default="bench_marlhf_output")
    args = p.parse_args(argv)
    run_seeds("marlhf_length_ratio_tiny", Path(__file__).name, run_one, args, argv,
              f"MARLHF ({args.rl_algorithm}, frozen BT reward model), length-ratio, tiny model")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

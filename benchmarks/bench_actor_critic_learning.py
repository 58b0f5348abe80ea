"""IAC and MAAC learn the length-ratio task: evaluation reward before vs after training.

Two agents (brief, detailed) train their own copy of a small model on the registered
``length-ratio`` env (train split) with an actor-critic learner: IAC (a critic per agent, own
view) and/or MAAC (one critic reading ``env.state()``). The test split is evaluated greedily
before training and every ``--eval-interval`` items. The script prints, per algorithm, the
evaluation reward before and after, and writes the JSONL log, ``curves.png`` and
``summary.json`` under ``--out/<algorithm>``.

    python benchmarks/bench_actor_critic_learning.py                         # embedded SmolLM2-135M
    python benchmarks/bench_actor_critic_learning.py --model tiny            # tiny random model (seconds)
    python benchmarks/bench_actor_critic_learning.py --algorithms iac --items 32
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


def run(algorithm: str, args: argparse.Namespace, model: str, tokenizer) -> dict:
    import collab_env
    from collab_env.adapters.actor_critic import IACConfig, IACTrainer, MAACConfig, MAACTrainer

    cfg_cls, trainer_cls = (IACConfig, IACTrainer) if algorithm == "iac" else (MAACConfig, MAACTrainer)
    out = str(Path(args.out) / algorithm)
    config = cfg_cls(
        num_agents=2, num_turns=args.turns, max_new_tokens=args.max_new_tokens, learning_rate=args.learning_rate,
        critic_learning_rate=args.critic_learning_rate, max_steps=args.items, eval_interval=args.eval_interval,
        eval_num_samples=8, eval_batch_size=8, eval_greedy=True, logging_steps=1, seed=args.seed,
        per_device_train_batch_size=args.batch_size, discount=args.discount, gae_lambda=args.gae_lambda,
        critic_placement=args.critic_type if algorithm == "iac" else "separate", output_dir=out,
    )
    trainer = trainer_cls(agent_model=model, tokenizer=tokenizer, env="length-ratio",
                          env_kwargs={"num_turns": args.turns},
                          eval_env=collab_env.make("length-ratio", split="test", num_turns=args.turns),
                          args=config)
    start = time.perf_counter()
    trainer.train()
    final = trainer.evaluate()
    seconds = time.perf_counter() - start
    trainer.close()
    trainer.logger.plot()
    evals = [r for r in trainer.logger.records if "eval/turn_1/reward_mean" in r]
    train = [r for r in trainer.logger.records if "critic_loss" in r]
    k = f"turn_{args.turns}"
    summary = {
        "algorithm": algorithm, "model": args.model, "items": args.items, "turns": args.turns,
        "seconds": round(seconds, 1),
        "eval_reward_before": evals[0]["eval/turn_1/reward_mean"],
        "eval_reward_after": final["eval/turn_1/reward_mean"],
        f"eval_{k}_reward_after": final.get(f"eval/{k}/reward_mean"),
        "eval_curve": [(r["item"], round(r["eval/turn_1/reward_mean"], 4)) for r in evals],
        "critic_loss_first_last": [train[0]["critic_loss"], train[-1]["critic_loss"]] if train else None,
        "train_reward_first_half_vs_second_half": _halves([r["turn_1/reward_mean"] for r in train]),
        "curves_png": str(Path(out) / "curves.png"),
    }
    Path(out, "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def _halves(xs: list[float]) -> list[float] | None:
    if len(xs) < 2:
        return None
    h = len(xs) // 2
    return [round(sum(xs[:h]) / h, 4), round(sum(xs[h:]) / (len(xs) - h), 4)]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="embedded", help="'embedded', 'tiny' or a model folder")
    p.add_argument("--algorithms", default="iac,maac", help="comma-separated: iac, maac")
    p.add_argument("--items", type=int, default=32, help="training items (the train split has 32)")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--turns", type=int, default=1)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--learning-rate", type=float, default=2e-6)
    p.add_argument("--critic-learning-rate", type=float, default=1e-5)
    p.add_argument("--discount", type=float, default=0.9)
    p.add_argument("--gae-lambda", type=float, default=0.95)
    p.add_argument("--critic-type", default="separate", choices=["separate", "head"])
    p.add_argument("--eval-interval", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="bench_actor_critic_output")
    args = p.parse_args()

    model, tokenizer = args.model, None
    if args.model == "tiny":
        from transformers import PreTrainedTokenizerFast

        from collab_env.testing.tiny_model import build_tiny_chat_model

        model = str(build_tiny_chat_model(Path(tempfile.mkdtemp()) / "tiny"))
        tokenizer = PreTrainedTokenizerFast.from_pretrained(model)
    results = [run(alg.strip(), args, model, tokenizer) for alg in args.algorithms.split(",") if alg.strip()]
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

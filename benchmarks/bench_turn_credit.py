"""Turn-level credit vs the episode scalar on TRL's GRPOTrainer: same budget, several seeds.

Two arms train the same tiny model (``collab_env/testing/tiny_model.py``, built once per seed) on
``hidden-facts-easy`` (a multi-turn task: the assistant asks for hidden facts, the scripted user
reveals them, the assistant answers) wrapped in the multiturn-aware reward (MR): every assistant
move is scored by ``--futures`` sampled futures played by the trained model itself (``policy=
"learner"``), with the weights ``accuracy_rule`` (1.0) and ``token_amount`` (``--token-weight``
per word of the futures).

* **episode**: TRL's ``GRPOTrainer`` with :func:`~collab_env.adapters.trl.episode_reward`: every
  token of an episode gets the group-normalised return (the sum of its moves' MR).
* **turn**: :class:`~collab_env.adapters.trl.TurnCreditGRPOTrainer`: the tokens of move ``k`` get
  the group-normalised MR of move ``k`` (compared with the same move of the group's episodes).

Everything else is identical: the rollout function, ``num_generations``, batch, lengths,
learning rate, ``scale_rewards="group"``, ``loss_type``, the trainer seed. Both arms are scored by
the SAME evaluation, written here: the trained model plays ``--eval-items`` items of the test split
(``--eval-samples`` episodes each, fixed seeds) through the same rollout function, and the
score is the mean episode return (the MR total) and the mean per-move MR. The headline is the
difference turn - episode of the final score per seed, with a 95% interval over seeds (Student's t,
``collab_env.eval.stats.seed_interval``; the bootstrap beside it). ``--resummarize FILE`` recomputes a
results file's summary from its stored runs.

    OMP_NUM_THREADS=1 python benchmarks/bench_turn_credit.py --seeds 3 --steps 8 \\
        --out benchmarks/results/turn_credit_hidden_facts_tiny.json

Writes ``--out`` (every curve, the summary, the command and the machine load before the run).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ENV_ID = "hidden-facts-easy"


def env_kwargs(args):
    return dict(reward="mr", reward_kwargs=dict(policy="learner",
                                                weights={"accuracy_rule": 1.0, "token_amount": args.token_weight},
                                                num_rollouts=args.futures, max_user_turns=1, max_assistant_turns=2))


def evaluate(trainer, fn, prompts):
    """Mean episode return and mean per-move MR of the model on ``prompts`` (sampled, seeded)."""
    import torch

    torch.manual_seed(1234)
    was = trainer.model.training
    out = fn(prompts, trainer)
    if was:
        trainer.model.train()
    returns = [float(r) for r in out["episode_reward"]]
    moves = [float(x) for row in out["turn_rewards"] for x in row]
    turns = [len(row) for row in out["turn_rewards"]]
    return {"return": statistics.fmean(returns), "move_mr": statistics.fmean(moves) if moves else 0.0,
            "moves_per_episode": statistics.fmean(turns)}


def run_arm(arm, seed, tiny_dir, args):
    import torch
    from trl import GRPOConfig, GRPOTrainer
    from transformers import TrainerCallback

    from collab_env.adapters import trl as ce_trl
    from collab_env.testing.tiny_model import load_tiny_chat_model

    torch.manual_seed(seed)
    model, tok = load_tiny_chat_model(tiny_dir)
    kw = env_kwargs(args)
    fn = ce_trl.rollout_func(ENV_ID, env_kwargs=kw)
    train = ce_trl.dataset(ENV_ID, split="train", n=args.steps * args.items_per_step, seed=seed, env_kwargs=kw)
    test = ce_trl.dataset(ENV_ID, split="test", n=args.eval_items, seed=10_000, env_kwargs=kw)
    eval_prompts = [p for p in test["prompt"] for _ in range(args.eval_samples)]
    cfg = GRPOConfig(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=args.items_per_step * args.generations,
                     num_generations=args.generations, max_completion_length=args.max_new_tokens,
                     max_steps=args.steps, logging_steps=1, report_to=[], use_cpu=True, save_strategy="no",
                     learning_rate=args.lr, seed=seed, scale_rewards="group", loss_type="grpo", beta=0.0,
                     temperature=1.0, shuffle_dataset=False)
    cls = ce_trl.TurnCreditGRPOTrainer if arm == "turn" else GRPOTrainer
    trainer = cls(model=model, reward_funcs=ce_trl.episode_reward, args=cfg, train_dataset=train,
                  processing_class=tok, rollout_func=fn)
    curve = [{"step": 0, **evaluate(trainer, fn, eval_prompts)}]

    class Eval(TrainerCallback):
        def on_step_end(self, a, state, control, **k):
            if state.global_step % args.eval_interval == 0 or state.global_step == args.steps:
                curve.append({"step": state.global_step, **evaluate(trainer, fn, eval_prompts)})

    trainer.add_callback(Eval())
    start = time.perf_counter()
    trainer.train()
    return {"arm": arm, "seed": seed, "curve": curve, "train_s": time.perf_counter() - start}


def bootstrap_ci(values, n=10_000, seed=0):
    rng = random.Random(seed)
    means = sorted(statistics.fmean(rng.choices(values, k=len(values))) for _ in range(n))
    return [means[int(0.025 * n)], means[int(0.975 * n) - 1]]


def over_seeds(values):
    """The mean of per-seed values with its 95% interval at the right unit (issue 45): Student's
    t over the seeds (:func:`collab_env.eval.stats.seed_interval`); the percentile bootstrap over
    the same few seeds, which is anti-conservative at 5 seeds, is kept beside it for reference."""
    from collab_env.eval.stats import seed_interval

    t = seed_interval({k: [v] for k, v in enumerate(values)})
    return {"mean": t["mean"], "ci95": [t["lo"], t["hi"]], "method": t["method"], "n_seeds": t["n_seeds"],
            "bootstrap_ci95": bootstrap_ci(values)}


def summarize(runs, seeds):
    out = {}
    for metric in ("return", "move_mr"):
        diffs, finals = [], {"turn": [], "episode": []}
        for s in seeds:
            by_arm = {r["arm"]: r for r in runs if r["seed"] == s}
            for arm in finals:
                c = by_arm[arm]["curve"]
                finals[arm].append(c[-1][metric] - c[0][metric])
            diffs.append(by_arm["turn"]["curve"][-1][metric] - by_arm["episode"]["curve"][-1][metric])
        out[metric] = {
            "gain_turn": over_seeds(finals["turn"]),
            "gain_episode": over_seeds(finals["episode"]),
            "final_turn_minus_episode": {**over_seeds(diffs), "per_seed": diffs},
        }
    return out


def resummarize(path: Path) -> None:
    """Recompute a results file's summary from its stored runs (no training), in place."""
    data = json.loads(path.read_text())
    seeds = sorted({r["seed"] for r in data["runs"]})
    data["summary"] = summarize(data["runs"], seeds)
    data["summary_recomputed"] = ("intervals recomputed from the stored runs by `python benchmarks/bench_turn_credit.py "
                                  f"--resummarize {path.name}`: t over seeds (bootstrap beside)")
    path.write_text(json.dumps(data, indent=1) + "\n")
    report(data["summary"])
    print("rewrote", path)


def report(summary):
    for metric, s in summary.items():
        d = s["final_turn_minus_episode"]
        print(f"{metric}: turn - episode = {d['mean']:+.4f} (95% CI, t over {d['n_seeds']} seeds, {d['ci95'][0]:+.4f} .. "
              f"{d['ci95'][1]:+.4f}; bootstrap {d['bootstrap_ci95'][0]:+.4f} .. {d['bootstrap_ci95'][1]:+.4f}); "
              f"gain turn {s['gain_turn']['mean']:+.4f}, episode {s['gain_episode']['mean']:+.4f}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--items-per-step", type=int, default=2)
    p.add_argument("--generations", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=12)
    p.add_argument("--futures", type=int, default=2)
    p.add_argument("--token-weight", type=float, default=-0.05)
    p.add_argument("--lr", type=float, default=5e-3)
    p.add_argument("--eval-items", type=int, default=4)
    p.add_argument("--eval-samples", type=int, default=2)
    p.add_argument("--eval-interval", type=int, default=4)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--resummarize", type=Path, default=None, metavar="FILE",
                   help="recompute FILE's summary from its stored runs (no training) and rewrite it")
    args = p.parse_args()
    if args.resummarize:
        resummarize(args.resummarize)
        return

    from collab_env.testing.tiny_model import build_tiny_chat_model

    load = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else None
    runs = []
    seeds = list(range(args.seeds))
    for s in seeds:
        tiny_dir = Path(tempfile.mkdtemp()) / "tiny"
        build_tiny_chat_model(tiny_dir, seed=s)
        for arm in ("episode", "turn"):
            r = run_arm(arm, s, tiny_dir, args)
            runs.append(r)
            last = r["curve"][-1]
            print(f"seed {s} {arm:8s} return {r['curve'][0]['return']:+.4f} -> {last['return']:+.4f}  "
                  f"move MR {r['curve'][0]['move_mr']:+.4f} -> {last['move_mr']:+.4f}  ({r['train_s']:.0f} s)",
                  flush=True)
    summary = summarize(runs, seeds)
    report(summary)
    if args.out:
        args.out.write_text(json.dumps({
            "command": "OMP_NUM_THREADS=1 python " + " ".join(sys.argv), "env": ENV_ID, "settings": vars(args) | {
                "out": str(args.out)}, "load_before": load, "summary": summary, "runs": runs}, indent=1) + "\n")
        print("wrote", args.out)


if __name__ == "__main__":
    main()

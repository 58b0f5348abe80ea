"""TRL's GRPOTrainer (through ``collab_env.adapters.trl.rollout_func``) vs our MAGRPOTrainer: learning curves.

Both trainers train ONE player of the registered ``length-ratio`` env (train split) from the same
tiny random model (``collab_env/testing/tiny_model.py``, built once per seed), while the other
player is the env's scripted default partner (:class:`~collab_env.tasks.cooperative.LengthRatioPartner`).
Same budget for both: ``--items`` training items, one item per optimiser step, ``--generations``
sampled episodes per item (TRL: ``per_device_train_batch_size = num_generations``), completions of
at most ``--max-new-tokens`` tokens, temperature 1, the same learning rate, constant schedule, no
KL term (``beta=0``), one optimisation pass per batch, mean-centred advantages without std scaling
(TRL ``scale_rewards="none"``, MAGRPO ``normalize_advantages=False``) and the per-sequence GRPO
loss (TRL ``loss_type="grpo"``, MAGRPO ``loss_type="grpo"``).

Both are scored by the SAME evaluation, written here (not the trainers' own): the trained model,
wrapped in a fresh :class:`~collab_env.agents.hf.HFPolicy`, plays the 8 items of the
``length-ratio`` test split through ``collab_env.rollout.arun_episode`` with the partner:

* **sampled** (the headline): ``--eval-samples`` episodes per item at temperature 1 with fixed
  seeds (identical for both trainers), and
* **greedy**: one greedy episode per item.

The reward is the trained player's episode return (the joint length-ratio reward). The model is
evaluated before training and after every ``--eval-interval`` steps; ``--seeds`` repeats the
whole comparison (tiny model, trainer seeds and evaluation seeds all from the seed).

    OMP_NUM_THREADS=1 python benchmarks/bench_trl_learning.py    # 5 seeds, ~90 s on 2 CPU cores

Why ``agent_0`` (brief) with 48 tokens by default: on the test items the partner's detailed
answer has 288-350 characters, so the brief answer is in the band at about 96-175 characters; the
tiny model samples about 1.5 characters per token, so 48 tokens give ~70 characters (reward ~0.27)
and the model reaches the band by favouring longer tokens. Training ``agent_1`` instead would need
twice the partner's brief answer (~220 characters, ~150 tokens); at 24 tokens its rewards barely
vary within a group (std ~0.006).

Writes ``--out``.json (every curve and the summary) and ``--out``.png (mean curve ± spread).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ENV_ID = "length-ratio"


# ---------------------------------------------------------------------------------------------
# The shared evaluation (same code for both trainers)
# ---------------------------------------------------------------------------------------------
def evaluate(model, tokenizer, args, seed: int) -> dict[str, float]:
    """Mean return of ``args.player`` on the test split: greedy (one episode per item) and sampled
    (``args.eval_samples`` per item, seeds fixed by ``seed``), played by ``model`` through the driver."""
    import asyncio

    import collab_env
    from collab_env._async import run_sync
    from collab_env.agents.hf import HFPolicy
    from collab_env.policy import policies_for
    from collab_env.rollout import arun_episode

    was_training = model.training
    model.eval()
    policy = HFPolicy(model, tokenizer, flush="idle", max_batch_size=64, name="trained")
    n_items = collab_env.make(ENV_ID, split="test").unwrapped.task.num_items()
    greedy_s = {"temperature": 0.0, "max_new_tokens": args.max_new_tokens}
    sampled_s = {"temperature": 1.0, "top_p": 1.0, "top_k": None, "max_new_tokens": args.max_new_tokens}
    jobs = [(i, 1000 * seed + i, greedy_s) for i in range(n_items)]
    jobs += [(i, 1000 * seed + 100 * (k + 1) + i, sampled_s) for i in range(n_items) for k in range(args.eval_samples)]

    async def one(index: int, s: int, sampling: dict):
        env = collab_env.make(ENV_ID, split="test")
        policies = policies_for(env.spec, {args.player: policy})
        ep = await arun_episode(env, policies, seed=s, index=index, sampling={args.player: sampling})
        return float(ep.returns[args.player])

    async def go():
        return await asyncio.gather(*(one(*j) for j in jobs))

    try:
        rewards = run_sync(go())
    finally:
        if was_training:
            model.train()
    greedy, sampled = rewards[:n_items], rewards[n_items:]
    return {"greedy": sum(greedy) / len(greedy), "sampled": sum(sampled) / len(sampled)}


# ---------------------------------------------------------------------------------------------
# The two trainers
# ---------------------------------------------------------------------------------------------
def run_magrpo(model_dir: str, tokenizer, args, seed: int, out: Path) -> tuple[list, float]:
    import collab_env
    from collab_env.adapters.magrpo import MAGRPOConfig, MAGRPOTrainer

    cfg = MAGRPOConfig(num_agents=1, num_generations=args.generations, max_new_tokens=args.max_new_tokens,
                       learning_rate=args.learning_rate, max_steps=args.items, per_device_train_batch_size=1,
                       eval_interval=0, beta=0.0, num_iterations=1, loss_type="grpo",
                       normalize_advantages=False, lr_scheduler_type="constant", temperature=1.0, top_p=1.0,
                       logging_steps=1, seed=seed, device="cpu", dtype="float32", plot=False,
                       output_dir=str(out / "magrpo"))
    trainer = MAGRPOTrainer(agent_model=model_dir, tokenizer=tokenizer, env=collab_env.make(ENV_ID),
                            trained_players=[args.player], args=cfg)
    trainer.logger.verbose = False
    model = trainer.models[0].model
    curve = [(0, evaluate(model, tokenizer, args, seed))]
    seconds = 0.0
    while curve[-1][0] < args.items:
        step = min(args.items, curve[-1][0] + args.eval_interval)
        trainer.args.max_steps = step  # one item per step: train up to ``step`` items, then evaluate
        t0 = time.perf_counter()
        trainer.train()
        seconds += time.perf_counter() - t0
        curve.append((step, evaluate(model, tokenizer, args, seed)))
        print(f"  magrpo seed {seed} step {step}: {curve[-1][1]}", flush=True)
    trainer.close()
    return curve, seconds


def run_trl(model_dir: str, tokenizer, args, seed: int, out: Path) -> tuple[list, float]:
    import torch
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from collab_env.adapters import trl as ce_trl

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    cfg = GRPOConfig(output_dir=str(out / "trl"), num_generations=args.generations,
                     per_device_train_batch_size=args.generations, gradient_accumulation_steps=1,
                     steps_per_generation=1, num_iterations=1, beta=0.0, loss_type="grpo", scale_rewards="none",
                     max_completion_length=args.max_new_tokens, learning_rate=args.learning_rate,
                     lr_scheduler_type="constant", warmup_steps=0, max_steps=args.items, temperature=1.0,
                     top_p=1.0, use_cpu=True, bf16=False, gradient_checkpointing=False, report_to="none",
                     logging_steps=1, save_strategy="no", disable_tqdm=True, dataloader_num_workers=0, seed=seed,
                     shuffle_dataset=False)
    ds = ce_trl.dataset(ENV_ID, n=args.items, seed=seed, player=args.player)
    fn = ce_trl.rollout_func(ENV_ID, player=args.player)
    trainer = GRPOTrainer(model=model, reward_funcs=ce_trl.episode_reward, args=cfg, train_dataset=ds,
                          processing_class=tokenizer, rollout_func=fn)
    curve = [(0, evaluate(trainer.model, tokenizer, args, seed))]
    clock = {"eval": 0.0}

    class Eval(TrainerCallback):
        def on_step_end(self, a, state, control, **kw):
            if state.global_step % args.eval_interval == 0 or state.global_step == args.items:
                t0 = time.perf_counter()
                curve.append((state.global_step, evaluate(trainer.model, tokenizer, args, seed)))
                clock["eval"] += time.perf_counter() - t0
                print(f"  trl    seed {seed} step {state.global_step}: {curve[-1][1]}", flush=True)

    trainer.add_callback(Eval())
    t0 = time.perf_counter()
    trainer.train()
    return curve, time.perf_counter() - t0 - clock["eval"]


# ---------------------------------------------------------------------------------------------
# Summary and plot
# ---------------------------------------------------------------------------------------------
def spread(values: list[float]) -> dict[str, float]:
    """Mean, sample standard deviation (0 for one value), min and max."""
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "min": min(values), "max": max(values)}


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, metric in zip(axes, ("sampled", "greedy"), strict=True):
        for name, color in (("trl", "tab:orange"), ("magrpo", "tab:blue")):
            curves = [run[name]["curve"] for run in result["runs"]]
            steps = [s for s, _ in curves[0]]
            vals = [[c[k][1][metric] for c in curves] for k in range(len(steps))]
            mean = [statistics.fmean(v) for v in vals]
            for c in curves:
                ax.plot(steps, [e[metric] for _, e in c], color=color, alpha=0.25, lw=1)
            ax.plot(steps, mean, color=color, lw=2, marker="o",
                    label=f"{'TRL GRPOTrainer + rollout_func' if name == 'trl' else 'MAGRPOTrainer'} (mean)")
            ax.fill_between(steps, [min(v) for v in vals], [max(v) for v in vals], color=color, alpha=0.1)
        ax.set_title(f"{metric} eval reward ({result['config']['player']}, test split)")
        ax.set_xlabel("training steps (1 item x generations each)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("mean episode return")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"length-ratio, tiny model, lr {result['config']['learning_rate']:g}, "
                 f"seeds {result['config']['seeds']} (thin: each seed, band: min-max)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--player", default="agent_0", choices=("agent_0", "agent_1"),
                   help="the trained player (the other is the scripted partner)")
    p.add_argument("--items", type=int, default=32, help="training items = optimiser steps (train split: 32)")
    p.add_argument("--generations", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--learning-rate", type=float, default=3e-3)
    p.add_argument("--eval-interval", type=int, default=4)
    p.add_argument("--eval-samples", type=int, default=8, help="sampled episodes per test item")
    p.add_argument("--seeds", default="0,1,2,3,4")
    p.add_argument("--out", default="benchmarks/results/trl_vs_magrpo_length_ratio_tiny",
                   help="output path without extension (.json and .png are written)")
    args = p.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]

    import torch
    from transformers import PreTrainedTokenizerFast

    from collab_env.testing.tiny_model import build_tiny_chat_model

    t_all = time.perf_counter()
    runs = []
    for seed in seeds:
        tmp = Path(tempfile.mkdtemp(prefix="bench-trl-"))
        model_dir = str(build_tiny_chat_model(tmp / "tiny", seed=seed))
        tokenizer = PreTrainedTokenizerFast.from_pretrained(model_dir)
        run = {"seed": seed}
        for name, fn in (("magrpo", run_magrpo), ("trl", run_trl)):
            torch.manual_seed(seed)
            curve, seconds = fn(model_dir, tokenizer, args, seed, tmp)
            run[name] = {"curve": curve, "train_seconds": round(seconds, 1)}
            print(f"seed {seed} {name}: {curve[0][1]} -> {curve[-1][1]} ({seconds:.0f} s training)", flush=True)
        runs.append(run)
    summary = {}
    for name in ("trl", "magrpo"):
        summary[name] = {}
        for metric in ("sampled", "greedy"):
            before = [r[name]["curve"][0][1][metric] for r in runs]
            after = [r[name]["curve"][-1][1][metric] for r in runs]
            summary[name][metric] = {"before": spread(before), "after": spread(after),
                                     "gain": spread([a - b for a, b in zip(after, before, strict=True)])}
        summary[name]["train_seconds"] = spread([r[name]["train_seconds"] for r in runs])
    result = {
        "command": "OMP_NUM_THREADS=1 python benchmarks/bench_trl_learning.py"
                   + (" " + " ".join(argv if argv is not None else sys.argv[1:])).rstrip(),
        "machine": f"{platform.machine()} CPU, {os.cpu_count()} cores (shared), torch {torch.__version__}",
        "date": date.today().isoformat(),
        "config": {**{k: v for k, v in vars(args).items() if k not in ("seeds", "out")}, "seeds": seeds},
        "summary": summary, "runs": runs, "total_seconds": round(time.perf_counter() - t_all, 1),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out + ".json").write_text(json.dumps(result, indent=1) + "\n")
    plot(result, args.out + ".png")
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

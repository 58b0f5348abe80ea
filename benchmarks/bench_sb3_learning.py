"""PPO and DQN (stable-baselines3) learn hidden-facts-easy through the macro-action wrapper.

The agent picks one of five dialogue acts per turn (``ask_next``, ``ask_all``, ``answer``,
``clarify``, ``summarise``; :func:`collab_env.adapters.sb3.hidden_facts_acts`) from the
:class:`~collab_env.adapters.sb3.HiddenFactsFeatures` of its view; the scripted user answers
through the episode driver. PPO trains on a :class:`~collab_env.adapters.sb3.CollabVecEnv` of
``--envs`` episodes stepped together, DQN on one wrapper. Every ``--eval-every`` steps the
greedy policy plays the same ``--eval-episodes`` held-out episodes (``split="test"``, reset
seeds 0..n-1); the success rate is the fraction solved (the boxed total is right). The
random-act baseline plays the same episodes with uniformly random acts.

    OMP_NUM_THREADS=1 python benchmarks/bench_sb3_learning.py                 # 5 seeds, ~2 min
    OMP_NUM_THREADS=1 python benchmarks/bench_sb3_learning.py --seeds 0 --steps 2000

Writes ``<out>.json`` (settings, seeds, every curve) and ``<out>.png``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ENV = "hidden-facts-easy"


def success_rate(choose, episodes: int) -> float:
    """Fraction of the held-out episodes (test split, reset seeds 0..episodes-1) solved."""
    from collab_env.adapters.sb3 import MacroActionWrapper
    from collab_env.adapters.sb3 import success_rate as rate

    return rate(MacroActionWrapper(ENV, split="test"), choose, episodes)


def train(algo: str, seed: int, args) -> dict:
    from stable_baselines3 import DQN, PPO
    from stable_baselines3.common.callbacks import BaseCallback

    from collab_env.adapters.sb3 import CollabVecEnv, MacroActionWrapper

    curve: list[tuple[int, float]] = []

    def greedy(model):
        return lambda obs: int(model.predict(obs, deterministic=True)[0])

    class Eval(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.next_eval = args.eval_every

        def _on_step(self) -> bool:
            if self.num_timesteps >= self.next_eval:
                curve.append((self.num_timesteps, success_rate(greedy(self.model), args.eval_episodes)))
                self.next_eval += args.eval_every
            return True

    if algo == "ppo":
        env = CollabVecEnv.from_id(ENV, args.envs)
        env.seed(seed)
        model = PPO("MlpPolicy", env, n_steps=32, batch_size=64, seed=seed, device="cpu")
    else:
        env = MacroActionWrapper(ENV)
        model = DQN("MlpPolicy", env, learning_starts=200, exploration_fraction=0.3, target_update_interval=250,
                    seed=seed, device="cpu")
    curve.append((0, success_rate(greedy(model), args.eval_episodes)))
    t0 = time.perf_counter()
    model.learn(args.steps, callback=Eval())
    seconds = time.perf_counter() - t0
    if curve[-1][0] < args.steps:
        curve.append((model.num_timesteps, success_rate(greedy(model), args.eval_episodes)))
    return {"seed": seed, "curve": curve, "before": curve[0][1], "after": curve[-1][1], "train_seconds": seconds}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="0,1,2,3,4")
    p.add_argument("--steps", type=int, default=4000, help="environment steps per run")
    p.add_argument("--envs", type=int, default=8, help="episodes PPO steps at once (CollabVecEnv)")
    p.add_argument("--eval-every", type=int, default=500)
    p.add_argument("--eval-episodes", type=int, default=100)
    p.add_argument("--out", default="benchmarks/results/sb3_hidden_facts_easy")
    args = p.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]

    randoms = []
    for s in seeds:
        rng = np.random.default_rng(s)
        randoms.append(success_rate(lambda obs, rng=rng: int(rng.integers(5)), args.eval_episodes))
    print(f"random acts: {np.mean(randoms):.3f} (per seed {randoms})", flush=True)
    runs = {}
    for algo in ("ppo", "dqn"):
        runs[algo] = []
        for s in seeds:
            r = train(algo, s, args)
            runs[algo].append(r)
            print(f"{algo} seed {s}: {r['before']:.2f} -> {r['after']:.2f} ({r['train_seconds']:.1f} s)", flush=True)
    summary = {algo: {"before_mean": float(np.mean([r["before"] for r in rs])),
                      "after_mean": float(np.mean([r["after"] for r in rs])),
                      "after_min": float(np.min([r["after"] for r in rs]))} for algo, rs in runs.items()}
    summary["random_acts_mean"] = float(np.mean(randoms))
    result = {
        "env": ENV, "eval": f"split=test, reset seeds 0..{args.eval_episodes - 1}, greedy", "seeds": seeds,
        "steps": args.steps, "ppo": {"envs": args.envs, "n_steps": 32, "batch_size": 64},
        "dqn": {"learning_starts": 200, "exploration_fraction": 0.3, "target_update_interval": 250},
        "random_acts": randoms, "runs": runs, "summary": summary,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    print(json.dumps(summary, indent=1))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for algo, color in (("ppo", "tab:blue"), ("dqn", "tab:orange")):
        for r in runs[algo]:
            xs, ys = zip(*r["curve"], strict=True)
            ax.plot(xs, ys, color=color, alpha=0.3, lw=1)
        xs = [x for x, _ in runs[algo][0]["curve"]]
        if all([x for x, _ in r["curve"]] == xs for r in runs[algo]):
            ax.plot(xs, np.mean([[y for _, y in r["curve"]] for r in runs[algo]], axis=0), color=color, lw=2,
                    label=f"{algo.upper()} (mean of {len(seeds)} seeds)")
    ax.axhline(np.mean(randoms), color="gray", ls="--", label="random acts")
    ax.set(xlabel="environment steps", ylabel="eval success rate", ylim=(-0.02, 1.02),
           title=f"SB3 on {ENV} (macro actions, held-out episodes)")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=120)
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""async_rollouts vs synchronous rollouts: step time with a latency-bound user simulator, and the
learning curves.

Part 1, timing: GRPO (``MAGRPOTrainer``, one agent) on ``hidden-facts-easy`` whose user is a
``LiteLLMPolicy`` talking to the fake OpenAI server (``collab_env/testing/openai_server.py``, run
in its own process so that its CPU is not the learner's) that answers every call after
``--latency`` seconds (0.5 s: an API user simulator). The assistant is ``--model`` (the embedded
SmolLM2-135M by default, so that an update costs what a small model's does). Both modes do the
same work: the same seed, the same ``--steps`` steps of ``--batch`` items, ``--generations``
completions per node, ``--turns`` assistant turns (each followed by a user call). A step's time is
the wall time between two consecutive ends of ``train_step`` (what a step costs the run, the
loop's own work included); the first step (imports, warm-up, and in async mode a rollout that
nothing overlaps) is reported apart and left out of the statistics. Reported: median, min and
max per mode, and the ratio of the medians (sync / async) with a 95% bootstrap interval
(the steps of each mode resampled with replacement).

Part 2, learning curves: the tiny random model of ``collab_env/testing/tiny_model.py`` on
``length-ratio`` (two agents, no latency: a task it learns within a few dozen items, which the
hidden-facts reward gives no signal on), MAGRPO sync vs async over ``--curve-seeds`` seeds: the
training reward per step (``turn_1/reward_mean``), its mean over the last quarter of the run and
over the whole run (area under the curve), and the paired difference async minus sync of both per
seed (a seed gives both modes the same first batch and item order), with the mean difference's 95%
interval over the seeds (Student's t, ``collab_env.eval.stats.seed_interval``; the bootstrap beside
it). ``--resummarize FILE`` recomputes a results file's intervals from its stored per-seed values. Part 1's rewards per step are kept too. ``--curves-only`` runs
part 2 alone: rewards do not depend on the machine's speed, so it may run beside other work.

    python benchmarks/bench_async_rollouts.py                          # minutes on 2 quiet cores
    python benchmarks/bench_async_rollouts.py --model tiny --steps 6   # plumbing check, seconds
    python benchmarks/bench_async_rollouts.py --curves-only --curve-seeds 8 --out /tmp/curves.json

Writes ``--out`` (default ``benchmarks/results/async_rollouts.json``) and, with matplotlib, the
curves next to it (``.png``), with the exact command and ``/proc/loadavg`` before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return "unknown"


def start_server(latency: float) -> tuple[subprocess.Popen, str]:
    """The fake OpenAI server in its own process; returns it and its ``api_base``."""
    proc = subprocess.Popen([sys.executable, "-m", "collab_env.testing.openai_server", "--latency", str(latency)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline().split()
    if len(line) != 2 or line[0] != "PORT":
        proc.kill()
        raise RuntimeError(f"the fake server did not start: {line}")
    return proc, f"http://127.0.0.1:{line[1]}/v1"


def tiny_model() -> tuple[str, object]:
    from transformers import PreTrainedTokenizerFast

    from collab_env.testing.tiny_model import build_tiny_chat_model

    folder = str(build_tiny_chat_model(Path(tempfile.mkdtemp()) / "tiny"))
    return folder, PreTrainedTokenizerFast.from_pretrained(folder)


def timed(trainer) -> list[float]:
    """Record the end time of every ``train_step`` of ``trainer``; returns the list it fills."""
    ends: list[float] = []
    step = trainer.train_step

    def wrapped(batch):
        out = step(batch)
        ends.append(time.perf_counter())
        return out

    trainer.train_step = wrapped
    return ends


def bootstrap_ratio(sync: list[float], overlapped: list[float], n: int = 5000, seed: int = 0) -> list[float]:
    """95% interval of median(sync) / median(async), resampling each mode's steps."""
    import numpy as np

    rng = np.random.default_rng(seed)
    a, b = np.asarray(sync), np.asarray(overlapped)
    ratios = [np.median(rng.choice(a, a.size)) / np.median(rng.choice(b, b.size)) for _ in range(n)]
    return [float(np.percentile(ratios, 2.5)), float(np.percentile(ratios, 97.5))]


def timing_run(args, api_base: str, overlapped: bool, model, tokenizer) -> dict:
    from collab_env.adapters.magrpo import MAGRPOConfig, MAGRPOTrainer
    from collab_env.agents.litellm import LiteLLMPolicy

    user = LiteLLMPolicy("openai/fake-user", api_base=api_base, api_key="sk-fake", max_retries=0)
    config = MAGRPOConfig(num_agents=1, num_generations=args.generations, num_turns=args.turns,
                          max_new_tokens=args.max_new_tokens, per_device_train_batch_size=args.batch,
                          max_steps=args.batch * args.steps, learning_rate=args.learning_rate, eval_interval=0,
                          logging_steps=1, seed=args.seed, plot=False, async_rollouts=overlapped,
                          output_dir=tempfile.mkdtemp(prefix="bench_async_"))
    trainer = MAGRPOTrainer(agent_model=model, tokenizer=tokenizer, env="hidden-facts-easy", policies={"user": user},
                            args=config)
    trainer.logger.verbose = False
    ends = timed(trainer)
    start = time.perf_counter()
    trainer.train()
    trainer.close()
    steps = [b - a for a, b in zip([start, *ends], ends)]
    records = [r for r in trainer.logger.records if "turn_1/reward_mean" in r and "eval/turn_1/reward_mean" not in r]
    return {"first_step_s": steps[0], "step_s": steps[1:], "total_s": ends[-1] - start,
            "reward": [r["turn_1/reward_mean"] for r in records],
            "off_policy_steps": [r.get("off_policy_steps") for r in records],
            "rollout_wait_s": [r.get("rollout_wait_s") for r in records]}


def curve_run(args, overlapped: bool, seed: int, model, tokenizer) -> list[float]:
    from collab_env.adapters.magrpo import MAGRPOConfig, MAGRPOTrainer

    config = MAGRPOConfig(num_agents=2, num_generations=4, max_new_tokens=16, max_steps=args.curve_items,
                          learning_rate=args.curve_learning_rate, eval_interval=0, logging_steps=1, seed=seed,
                          plot=False, async_rollouts=overlapped, output_dir=tempfile.mkdtemp(prefix="bench_async_"))
    trainer = MAGRPOTrainer(agent_model=model, tokenizer=tokenizer, env="length-ratio", args=config)
    trainer.logger.verbose = False
    trainer.train()
    trainer.close()
    return [r["turn_1/reward_mean"] for r in trainer.logger.records if "turn_1/reward_mean" in r]


def summary(steps: list[float]) -> dict:
    return {"median_s": statistics.median(steps), "min_s": min(steps), "max_s": max(steps), "steps": len(steps)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="embedded", help="'embedded', 'tiny' or a model folder (part 1)")
    p.add_argument("--latency", type=float, default=0.5, help="seconds per user-simulator call")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--batch", type=int, default=2, help="items per step")
    p.add_argument("--generations", type=int, default=2)
    p.add_argument("--turns", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--learning-rate", type=float, default=1e-5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--curve-seeds", type=int, default=3)
    p.add_argument("--curve-items", type=int, default=32)
    p.add_argument("--curve-learning-rate", type=float, default=0.03)
    p.add_argument("--curves-only", action="store_true", help="part 2 only (no server, no timing)")
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "async_rollouts.json"))
    p.add_argument("--resummarize", type=Path, default=None, metavar="FILE",
                   help="recompute FILE's paired curve intervals from its stored per-seed values (no run)")
    args = p.parse_args()
    if args.resummarize:
        resummarize(args.resummarize)
        return 0

    command = "python " + " ".join(shlex.quote(a) for a in sys.argv)
    load_before = loadavg()
    import torch

    timing = None
    if not args.curves_only:
        model, tokenizer = (tiny_model() if args.model == "tiny" else (args.model, None))
        proc, api_base = start_server(args.latency)
        try:
            timing = {mode: timing_run(args, api_base, mode == "async", model, tokenizer) for mode in ("sync", "async")}
        finally:
            proc.stdin.close()
            proc.wait(10)

    tiny, tiny_tok = tiny_model()
    curves = {mode: [curve_run(args, mode == "async", args.seed + s, tiny, tiny_tok) for s in range(args.curve_seeds)]
              for mode in ("sync", "async")}

    stats = {mode: curve_stats(curves[mode]) for mode in ("sync", "async")}

    def paired(name: str) -> dict:
        return paired_over_seeds(stats["async"][name], stats["sync"][name])

    result: dict = {
        "command": command,
        "loadavg_before": load_before,
        "loadavg_after": loadavg(),
        "machine": {"cpus": os.cpu_count(), "torch": torch.__version__, "threads": torch.get_num_threads()},
        "timing": None,
        "curves": {
            "setup": {"env": "length-ratio (2 agents, no latency)", "model": "tiny", "learner": "MAGRPOTrainer",
                      "items": args.curve_items, "learning_rate": args.curve_learning_rate,
                      "seeds": list(range(args.seed, args.seed + args.curve_seeds))},
            "sync": {**stats["sync"], "reward_per_step": curves["sync"]},
            "async": {**stats["async"], "reward_per_step": curves["async"]},
            "async_minus_sync": {"last_quarter": paired("per_seed_last_quarter"),
                                 "whole_run": paired("per_seed_whole_run")},
        },
    }
    if timing is not None:
        result["timing"] = timing_summary(args, timing)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        if timing is not None:
            fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
        else:  # --curves-only: the curves alone
            fig, right = plt.subplots(1, 1, figsize=(6, 4))
        for mode, colour in (("sync", "tab:blue"), ("async", "tab:orange")):
            if timing is not None:
                left.plot(range(2, len(timing[mode]["step_s"]) + 2), timing[mode]["step_s"], "o-", color=colour,
                          label=f"{mode}: median {statistics.median(timing[mode]['step_s']):.2f} s")
            for k, run in enumerate(curves[mode]):
                right.plot(range(1, len(run) + 1), run, color=colour, alpha=0.8,
                           label=mode if k == 0 else None)
        if timing is not None:
            left.set(title=f"step time, user simulator {args.latency} s/call ({args.model})", xlabel="step",
                     ylabel="seconds")
        right.set(title=f"training reward, length-ratio, tiny model ({args.curve_seeds} seeds, lr "
                        f"{args.curve_learning_rate})", xlabel="step", ylabel="turn_1/reward_mean")
        if timing is not None:
            left.legend()
        right.legend()
        fig.tight_layout()
        fig.savefig(out.with_suffix(".png"), dpi=100)
        result["png"] = str(out.with_suffix(".png").name)
    except ImportError:
        result["png"] = None
    out.write_text(json.dumps(result, indent=1) + "\n")
    if result["timing"] is not None:
        print(json.dumps({k: v for k, v in result["timing"].items() if k in ("speedup_median_sync_over_async",
                                                                             "speedup_bootstrap_95")}, indent=1))
        print("sync", summary(timing["sync"]["step_s"]), "async", summary(timing["async"]["step_s"]))
    print("curves", {m: {k: v for k, v in result["curves"][m].items() if k != "reward_per_step"}
                     for m in ("sync", "async", "async_minus_sync")})
    return 0


def curve_stats(runs: list[list[float]]) -> dict:
    """A mode's curves (one reward per step, per seed): means over the last quarter and the whole run."""
    quarter = max(1, len(runs[0]) // 4)
    return {"last_quarter_mean": statistics.mean(x for r in runs for x in r[-quarter:]),
            "whole_run_mean": statistics.mean(x for r in runs for x in r),
            "per_seed_last_quarter": [statistics.mean(r[-quarter:]) for r in runs],
            "per_seed_whole_run": [statistics.mean(r) for r in runs]}


def paired_over_seeds(overlapped: list[float], sync: list[float]) -> dict:
    """async minus sync per seed (same seed: same first batch and item order): the mean of the
    differences with its 95% interval at the right unit (issue 45), Student's t over the seeds
    (:func:`collab_env.eval.stats.seed_interval`); the percentile bootstrap over the same seeds,
    anti-conservative at a handful of seeds, beside it."""
    from collab_env.eval.stats import seed_interval
    from collab_env.leaderboard.stats import bootstrap

    diffs = [a - b for a, b in zip(overlapped, sync, strict=True)]
    t = seed_interval({k: [d] for k, d in enumerate(diffs)})
    _, lo, hi = bootstrap(diffs, statistics.mean)
    return {"per_seed": diffs, "mean": t["mean"], "ci95": [t["lo"], t["hi"]], "method": t["method"],
            "n_seeds": t["n_seeds"], "bootstrap_ci95": [lo, hi]}


def resummarize(path: Path) -> None:
    """Recompute a results file's paired curve differences from its stored per-seed values, in place."""
    data = json.loads(path.read_text())
    c = data["curves"]
    if len(c["sync"]["reward_per_step"]) < 2:
        raise SystemExit(f"error: {path} has one seed: no interval over seeds can be drawn from it")
    for mode in ("sync", "async"):  # files written before the whole-run means were kept
        c[mode].update(curve_stats(c[mode]["reward_per_step"]))
    c["async_minus_sync"] = {
        "last_quarter": paired_over_seeds(c["async"]["per_seed_last_quarter"], c["sync"]["per_seed_last_quarter"]),
        "whole_run": paired_over_seeds(c["async"]["per_seed_whole_run"], c["sync"]["per_seed_whole_run"])}
    data["curves_recomputed"] = ("paired intervals recomputed from the stored per-seed values by `python "
                                 f"benchmarks/bench_async_rollouts.py --resummarize {path.name}`: t over seeds "
                                 "(bootstrap beside)")
    path.write_text(json.dumps(data, indent=1) + "\n")
    for k, d in c["async_minus_sync"].items():
        print(f"{path.name} {k}: async - sync {d['mean']:+.3f}, t over {d['n_seeds']} seeds [{d['ci95'][0]:+.3f}, "
              f"{d['ci95'][1]:+.3f}], bootstrap [{d['bootstrap_ci95'][0]:+.3f}, {d['bootstrap_ci95'][1]:+.3f}]")


def timing_summary(args, timing: dict) -> dict:
    """Part 1's record: the setup, each mode's steps and the ratio of the medians with its interval."""
    sync_steps, async_steps = timing["sync"]["step_s"], timing["async"]["step_s"]
    return {
        "setup": {"env": "hidden-facts-easy", "user": f"LiteLLMPolicy -> fake OpenAI server, {args.latency} s/call",
                  "model": args.model, "learner": "MAGRPOTrainer (GRPO, 1 agent)", "steps": args.steps,
                  "items_per_step": args.batch, "generations": args.generations, "turns": args.turns,
                  "max_new_tokens": args.max_new_tokens, "learning_rate": args.learning_rate, "seed": args.seed},
        "sync": {**summary(sync_steps), "first_step_s": timing["sync"]["first_step_s"],
                 "total_s": timing["sync"]["total_s"], "step_s": sync_steps, "reward": timing["sync"]["reward"]},
        "async": {**summary(async_steps), "first_step_s": timing["async"]["first_step_s"],
                  "total_s": timing["async"]["total_s"], "step_s": async_steps, "reward": timing["async"]["reward"],
                  "off_policy_steps": timing["async"]["off_policy_steps"],
                  "rollout_wait_s": timing["async"]["rollout_wait_s"]},
        "speedup_median_sync_over_async": statistics.median(sync_steps) / statistics.median(async_steps),
        "speedup_bootstrap_95": bootstrap_ratio(sync_steps, async_steps),
    }


if __name__ == "__main__":
    raise SystemExit(main())

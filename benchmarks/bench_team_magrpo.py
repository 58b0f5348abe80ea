"""MAGRPO on team-facts: two trained agents and the scripted user, held-out eval before vs after.

Both agents (``agent_0`` the captain, ``agent_1``) train their own copy of the model (LoRA by
default) with the existing MAGRPO learner on ``team-facts-easy`` (train split; the scripted
:class:`~collab_env.tasks.team.TeamFactsUser` answers inside the driver). Per seed:

1. **Before**: ``--eval-items`` held-out items (the env's ``split="test"`` stream, disjoint from
   training), one full greedy episode each, played through the driver
   (:func:`collab_env.rollout.rollout`, concurrently) by the two models and the scripted user, on the
   env's **own reward** (unshaped): mean return, success (the captain's exact answer: the
   episode's ``accuracy`` component), facts the team obtained, and wasted (duplicate or
   useless) questions per episode.
2. **Training**: ``--items`` items, ``--generations`` completions per agent per item, one agent
   round per item (``num_turns=1``). The training reward is the env's round reward plus
   ``--fact-credit`` for every fact the round's questions newly obtain (a
   :class:`~collab_env.rewards.joint.JointReward` over
   :func:`~collab_env.tasks.team.team_round_reward`; ``--fact-credit 0`` trains on the env's
   reward unchanged). Without the credit, asking about a fact and staying silent both score 0,
   so the only gradient is "stop asking useless questions", which silence satisfies; the
   credit makes a useful question strictly better than silence. The evaluation never sees it.
   MAGRPO's own greedy evaluation (turn 1, env reward) every ``--eval-interval`` items gives
   the curve.
3. **After**: the same held-out episodes as "before".

Across seeds: the mean of each metric before and after, and of the paired difference, with a
95% Student-t interval over seeds (and per seed a 95% bootstrap interval over the episodes).
Writes ``team_magrpo_<tag>.{json,md,png}`` to ``--results`` and the runs' logs to ``--out``.

    # full size (quiet machine or a GPU): 3 seeds x 48 items, 24 held-out episodes
    python benchmarks/bench_team_magrpo.py --seeds 0 1 2 --items 48 --eval-items 24 --tag embedded
    # the reduced runs in results/team_magrpo_reduced.* (8 items) and _reduced16.* (--items 16,
    # tags reduced16_s$s / reduced16), one process per seed, then merged:
    for s in 0 1 2; do OMP_NUM_THREADS=1 python benchmarks/bench_team_magrpo.py --seeds $s --items 8
        --eval-items 8 --eval-interval 4 --tag reduced_s$s --results /tmp/red --out /tmp/red/out & done; wait
    (one command line per seed: the loop body is one line)
    python benchmarks/bench_team_magrpo.py --merge /tmp/red/team_magrpo_reduced_s*.json --tag reduced

The tiny random model (``--model tiny``) checks the pipeline only: its text never names a fact,
so every question is useless and all group advantages are 0 (see ``team_magrpo_tiny.md``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ENV_ID = "team-facts-easy-v0"
AGENTS = ("agent_0", "agent_1")
_BOXED = re.compile(r"\\boxed\s*\{")


class FactCredit:
    """Training reward of one agent round: the env's round reward
    (:func:`~collab_env.tasks.team.team_round_reward`) plus ``credit`` per fact newly obtained
    by the round's questions (classified by :func:`~collab_env.tasks.team.account_questions`,
    against the facts stated in the opening; a captain's boxed answer is not a question)."""

    def __init__(self, credit: float) -> None:
        self.credit = float(credit)

    def __call__(self, *completions, batch_items):
        from collab_env.tasks.team import account_questions, split_message, team_round_reward

        base = team_round_reward(*completions, batch_items=batch_items)[0]
        item = batch_items[0]
        agents = [f"agent_{i}" for i in range(len(completions))]
        questions = {}
        for i, (a, c) in enumerate(zip(agents, completions, strict=True)):
            text = c[0] if c else ""
            q, _ = split_message(text)
            if q and not (i == 0 and _BOXED.search(text)):
                questions[a] = q
        obtained = {i for i, f in enumerate(item["facts"]) if f["stated"]}
        verdicts = account_questions(item, questions, obtained, agents)
        return [base + self.credit * sum(v["status"] == "new" for v in verdicts.values())]


def ci_t(xs: list[float]) -> tuple[float, float, float]:
    """Mean and 95% Student-t interval over ``xs`` (one value: the interval is the point)."""
    from collab_env.eval.stats import t_interval

    t = t_interval(xs)
    return (t["mean"], t["mean"], t["mean"]) if t["n"] < 2 else (t["mean"], t["lo"], t["hi"])


def ci_boot(xs: list[float], seed: int = 0, reps: int = 2000) -> tuple[float, float, float]:
    """Mean and 95% percentile-bootstrap interval over ``xs``."""
    import numpy as np

    a = np.asarray(xs, dtype=float)
    rng = np.random.default_rng(seed)
    means = a[rng.integers(0, len(a), size=(reps, len(a)))].mean(axis=1)
    return float(a.mean()), float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def evaluate_episodes(models, eval_items: int, max_new_tokens: int) -> list[dict]:
    """One greedy full episode per held-out item (env reward), all played concurrently through
    the rollout engine (the driver; each model's concurrent calls are batched)."""
    from collab_env.rollout import rollout
    from collab_env.tasks.team import TeamFactsUser

    policies = {a: pm.generator for a, pm in zip(AGENTS, models, strict=True)}
    policies["user"] = TeamFactsUser()
    greedy = {a: {"temperature": 0.0, "max_new_tokens": max_new_tokens} for a in AGENTS}
    jobs = [{"seed": i, "index": i} for i in range(eval_items)]
    episodes = {}
    for job, ep in rollout(ENV_ID, policies, jobs, env_kwargs={"split": "test", "num_items": eval_items},
                           sampling=greedy, progress=False):
        if isinstance(ep, BaseException):
            raise ep
        episodes[job["index"]] = ep
    out = []
    for i in range(eval_items):
        ep = episodes[i]
        status = [m.meta["team_question"]["status"] for m in ep.conversation if "team_question" in m.meta]
        comp = ep.components["agent_0"]
        out.append({"index": i, "return": ep.returns["agent_0"], "success": float(comp["accuracy"] >= 1.0),
                    "facts_obtained": status.count("new"),
                    "wasted_questions": status.count("duplicate") + status.count("useless"),
                    "steps": ep.num_steps, "end": ep.end_reason,
                    "agent_texts": [t.text for t in ep.turns if t.player in AGENTS][:4]})
    return out


METRICS = ("return", "success", "facts_obtained", "wasted_questions")


def run_seed(args, seed: int, model_ref, tokenizer) -> dict:
    import collab_env
    from collab_env.adapters.magrpo import MAGRPOConfig, MAGRPOTrainer
    from collab_env.rewards.joint import JointReward

    out = Path(args.out) / f"seed{seed}"
    config = MAGRPOConfig(
        num_agents=2, num_generations=args.generations, max_new_tokens=args.max_new_tokens,
        learning_rate=args.learning_rate, max_steps=args.items, eval_interval=args.eval_interval,
        eval_num_samples=args.eval_items, eval_batch_size=args.eval_items, eval_greedy=True,
        logging_steps=1, seed=seed, lora_r=args.lora_r, lora_alpha=2.0 * max(args.lora_r, 1),
        temperature=args.temperature, output_dir=str(out), plot=True,
    )
    train_env = collab_env.make(ENV_ID, split="train")
    if args.fact_credit:
        train_env = JointReward(train_env, FactCredit(args.fact_credit), name="fact_credit")
    trainer = MAGRPOTrainer(agent_model=model_ref, tokenizer=tokenizer, env=train_env,
                            eval_env=collab_env.make(ENV_ID, split="test", num_items=args.eval_items),
                            args=config)
    t0 = time.perf_counter()
    before = evaluate_episodes(trainer.models, args.eval_items, args.max_new_tokens)
    t_eval = time.perf_counter() - t0
    trainer.train()
    evals = [r for r in trainer.logger.records if "eval/turn_1/reward_mean" in r]
    if evals and evals[-1]["item"] == args.items:  # the schedule already evaluated the final weights
        final_turn1 = evals[-1]["eval/turn_1/reward_mean"]
    else:
        final_turn1 = trainer.evaluate()["eval/turn_1/reward_mean"]
    after = evaluate_episodes(trainer.models, args.eval_items, args.max_new_tokens)
    seconds = time.perf_counter() - t0
    records = trainer.logger.records
    trainer.close()
    curve = [(r["item"], r["eval/turn_1/reward_mean"]) for r in records
             if "eval/turn_1/reward_mean" in r and r["item"] < args.items]
    curve.append((args.items, final_turn1))
    train = [(r["item"], r["turn_1/reward_mean"], r.get("collapse/empty_share")) for r in records
             if "turn_1/reward_mean" in r]
    row = {"seed": seed, "seconds": round(seconds, 1), "eval_seconds": round(t_eval, 1),
           "eval_turn1_curve": curve, "train_reward_curve": train, "before": before, "after": after}
    for phase in ("before", "after"):
        row[f"{phase}_summary"] = {k: ci_boot([e[k] for e in row[phase]], seed) for k in METRICS}
    print(json.dumps({k: row[k] for k in ("seed", "seconds", "before_summary", "after_summary")}), flush=True)
    return row


def summarise(rows: list[dict]) -> dict:
    out = {}
    for k in METRICS:
        b = [sum(e[k] for e in r["before"]) / len(r["before"]) for r in rows]
        a = [sum(e[k] for e in r["after"]) / len(r["after"]) for r in rows]
        out[k] = {"before": ci_t(b), "after": ci_t(a), "diff": ci_t([y - x for x, y in zip(b, a, strict=True)]),
                  "per_seed_before": b, "per_seed_after": a}
    return out


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    for r in rows:
        xs, ys = zip(*r["eval_turn1_curve"], strict=True)
        ax1.plot(xs, ys, marker="o", label=f"seed {r['seed']}")
        tx = [t[0] for t in r["train_reward_curve"]]
        ty = [t[1] for t in r["train_reward_curve"]]
        ax2.plot(tx, ty, alpha=0.8, label=f"seed {r['seed']}")
    ax1.set(xlabel="training items", ylabel="held-out reward, round 1 (env reward, greedy)",
            title="MAGRPO eval curve")
    ax2.set(xlabel="training items", ylabel="training reward per joint action (shaped)",
            title="training reward")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def fmt(c) -> str:
    return f"{c[0]:.3f} [{c[1]:.3f}, {c[2]:.3f}]"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="embedded", help="'embedded', 'tiny' or a model folder")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--items", type=int, default=48, help="training items per seed")
    p.add_argument("--generations", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--learning-rate", type=float, default=5e-4)
    p.add_argument("--lora-r", type=int, default=8, help="0: full fine-tuning")
    p.add_argument("--fact-credit", type=float, default=0.1, help="training credit per newly obtained fact")
    p.add_argument("--eval-items", type=int, default=24, help="held-out (test split) items")
    p.add_argument("--eval-interval", type=int, default=8)
    p.add_argument("--tag", default=None, help="results stem suffix (default: the model name)")
    p.add_argument("--out", default="bench_team_magrpo_output")
    p.add_argument("--results", default=str(Path(__file__).resolve().parent / "results"))
    p.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                   help="combine the runs of earlier results files (one seed each, run in parallel) into one "
                        "report; no training")
    args = p.parse_args(argv)

    model, tokenizer = args.model, None
    if args.model == "tiny" and not args.merge:
        from transformers import PreTrainedTokenizerFast

        from collab_env.testing.tiny_model import build_tiny_chat_model

        model = str(build_tiny_chat_model(Path(tempfile.mkdtemp()) / "tiny"))
        tokenizer = PreTrainedTokenizerFast.from_pretrained(model)
    if args.merge:
        docs = [json.loads(Path(f).read_text()) for f in args.merge]
        rows = [r for d in docs for r in d["runs"]]
        merged_from = [str(f) for f in args.merge]
        args = argparse.Namespace(**{**docs[0]["args"], "tag": args.tag, "results": args.results,
                                     "seeds": [r["seed"] for r in rows]})
    else:
        rows = [run_seed(args, s, model, tokenizer) for s in args.seeds]
        merged_from = None
    summary = summarise(rows)
    tag = args.tag or Path(args.model).name
    stem = Path(args.results) / f"team_magrpo_{tag}"
    stem.parent.mkdir(parents=True, exist_ok=True)
    doc = {"env": ENV_ID, "model": args.model, "args": vars(args), "summary": summary, "runs": rows,
           "threads": os.environ.get("OMP_NUM_THREADS"), "merged_from": merged_from}
    stem.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
    plot(rows, stem.with_suffix(".png"))
    n = len(rows)
    lines = [
        f"# MAGRPO on {ENV_ID}: two trained agents + the scripted user ({args.model}, tag {tag})", "",
        f"{n} seed(s) {args.seeds}; {args.items} training items per seed, {args.generations} generations, "
        f"{args.max_new_tokens} new tokens, temperature {args.temperature}, learning rate {args.learning_rate}, "
        f"LoRA r={args.lora_r}, training fact credit {args.fact_credit}; held-out eval: {args.eval_items} "
        "test-split items, one greedy full episode each, on the env's own reward.", "",
        f"Means over seeds with a 95% Student-t interval over the {n} seed(s) (a single seed has no "
        "interval over seeds; see the per-seed bootstrap intervals below).", "",
        "| metric | before | after | after - before |", "|---|---|---|---|",
    ]
    for k in METRICS:
        s = summary[k]
        lines.append(f"| {k} | {fmt(s['before'])} | {fmt(s['after'])} | {fmt(s['diff'])} |")
    lines += ["", "Per seed (mean over held-out episodes, 95% bootstrap interval over episodes):", "",
              "| seed | metric | before | after | seconds |", "|---|---|---|---|---|"]
    for r in rows:
        for k in METRICS:
            lines.append(f"| {r['seed']} | {k} | {fmt(r['before_summary'][k])} | {fmt(r['after_summary'][k])} | "
                         f"{r['seconds']} |")
    lines += ["", "MAGRPO's held-out round-1 reward (greedy, env reward) during training:", "",
              "| seed | " + " | ".join(f"item {i}" for i, _ in rows[0]["eval_turn1_curve"][:-1]) + " | final |",
              "|---|" + "---|" * len(rows[0]["eval_turn1_curve"])]
    for r in rows:
        lines.append(f"| {r['seed']} | " + " | ".join(f"{v:.3f}" for _, v in r["eval_turn1_curve"]) + " |")
    lines += ["", f"Curve: `{stem.with_suffix('.png').name}`; every episode and curve point: "
              f"`{stem.with_suffix('.json').name}`."]
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

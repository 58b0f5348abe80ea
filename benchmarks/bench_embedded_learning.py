"""Does a real model learn to collaborate here? GRPO on the embedded SmolLM2-135M, on CPU.

The setting: the assistant of ``hidden-facts-easy`` (one object, one of its two quantities
withheld) is trained with GRPO and LoRA (r=8 on q_proj/v_proj: a 1.9 MB adapter) on the
multiturn-aware reward of ``examples/hidden_facts_mr_grpo.py``: credit for the exact boxed
total and for the withheld fact the scripted user reveals, -1 for an empty reply, the recipe's
token penalty, the ``"collabllm"`` rule. By default the MR window ends at the user's answer to
the reply (``--future-user-turns 1``), so only what the reply elicits (or boxes) earns credit.

Why this part of the task, measured rather than guessed (pilots on this machine, 2 cores, on
the legacy v0 keyword user, which revealed facts to statements too):
sampled at temperature 1 (8 training items x 6 replies, 40 tokens), the base model's first
reply made the scripted user reveal the withheld fact in 42% of the samples (7 of 8 items had
both revealing and non-revealing replies: a group-relative signal), but contained a ``?`` in
0% and a ``\\boxed{}`` in 2% (and none right). The exact answer gives GRPO almost no signal to
follow at 135M; eliciting the fact does. A future assistant turn (``--future-user-turns 2``)
adds a generation of up to ``max_new_tokens`` per sampled reply for an answer term that stays
at 0, so the training items per minute go to the part that has a signal. So the claim
tested is the *interactive* part: does training make the model elicit the missing fact more
often on held-out items? (``success`` is reported too; expect it to stay near 0.)

On the question-only user (v1, the default now) the base model almost never asks in a form the
user answers, the facts term stays 0 in nearly every group, and the run measured in
``benchmarks/results/embedded_learning.md`` learns nothing useful (replies collapse to a few
tokens): the honest starting point of the next learning issue.

Before and after training, the model plays whole episodes of **held-out test items**
(``split="test"``, greedy decoding) against the scripted user, and the benchmark reports:

* ``success``: share of episodes with the exact total boxed (the env's accuracy);
* ``reward``: the env's episode return (accuracy, here no turn cost);
* ``questions``: assistant turns per episode that ask something (a ``?``, no ``\\boxed{}``);
* ``facts``: share of the withheld facts the user revealed (asking the right question);
* ``reply_tokens``: mean tokens of the first reply (the collapse check).

Each is reported with a 95% interval: Wilson's for a 0/1 metric (success; facts on this level,
where one fact is withheld), the normal one (mean ± 1.96 standard errors) for the others, over
the evaluation episodes of every seed (before training the model is the same for every seed, so
it is evaluated once), and as a paired difference on the same held-out episodes (mean ± 1.96 SE
of the per-episode after - before); per-seed means are in the JSON too.
``--eval-adapter DIR`` skips training and evaluates a saved adapter the same way. Outputs: ``benchmarks/results/embedded_learning.{json,md,png}``, the transcripts
before/after (``embedded_learning_transcripts.md``) and the first seed's LoRA adapter
(``embedded_learning_adapter/``, loaded by ``make demo``).

    python benchmarks/bench_embedded_learning.py                       # the full run (3 seeds, 64 items)
    python benchmarks/bench_embedded_learning.py --seeds 1 --items 8 --eval-episodes 8 --out /tmp/pilot
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

RESULTS = ROOT / "benchmarks" / "results"
ENV_ID = "hidden-facts-easy"
EVAL_SEED = 10_000  # test episodes k use seed EVAL_SEED + k: the same held-out items before and after


from collab_env.eval.stats import interval, t_interval  # noqa: E402


METRICS = ("success", "facts", "questions", "reward", "reply_tokens")
#: Each metric's type, which picks its interval (collab_env.eval.stats.interval).
KIND = {"success": "binary", "facts": "continuous", "questions": "count", "reward": "continuous",
        "reply_tokens": "count"}


def summarise(episodes: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """The reported metrics with their 95% intervals over ``episodes``, by each metric's type
    (``KIND``): Wilson's for success, Student's t for the others."""
    return {k: interval([float(e[k]) for e in episodes], KIND[k]) for k in METRICS}


def paired(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """After - before on the same held-out episodes (same item, same seed), per metric: the mean
    difference with Student's t interval of the per-episode differences (each seed's evaluation is
    paired with the one evaluation before training)."""
    by_key = {(e["index"], e["seed"]): e for e in before}
    pairs = [(by_key[(e["index"], e["seed"])], e) for e in after if (e["index"], e["seed"]) in by_key]
    return {k: t_interval([float(x[k]) - float(y[k]) for y, x in pairs]) for k in METRICS}


def episode_record(ep: Any, item: dict[str, Any], tokenizer: Any) -> dict[str, Any]:
    """One evaluation episode's numbers (module docstring) and its transcript."""
    from hidden_facts_mr_grpo import facts_revealed

    from collab_env.tasks.hidden_facts import extract_boxed

    texts = [t.text for t in ep.turns if t.player == "assistant"]
    questions = sum(1 for t in texts if "?" in t and extract_boxed(t) is None)
    facts = facts_revealed(ep.conversation, item, start=0).value
    first = texts[0] if texts else ""
    return {
        "index": ep.index, "seed": ep.seed,
        "success": float(ep.components.get("assistant", {}).get("accuracy", 0.0) >= 1.0),
        "reward": float(ep.returns.get("assistant", 0.0)),
        "questions": float(questions), "facts": float(facts),
        "reply_tokens": float(len(tokenizer.encode(first, add_special_tokens=False))),
        "end_reason": ep.end_reason,
        "transcript": [{"role": m.role, "text": m.content} for m in ep.conversation if m.role != "system"],
    }


def evaluate_policy(policy: Any, tokenizer: Any, episodes: int, max_new_tokens: int, desc: str,
                    max_steps: int = 12) -> list[dict[str, Any]]:
    """Whole greedy episodes of the test split against the scripted user (batched: all episodes
    run concurrently, their calls merged into ``generate`` calls)."""
    import collab_env
    from collab_env.eval import evaluate

    print(f"  evaluating {desc}: {episodes} test episodes...", flush=True)
    res = evaluate(ENV_ID, {"assistant": policy}, num_episodes=episodes, seed=EVAL_SEED,
                   env_kwargs={"split": "test", "max_steps": max_steps}, concurrency=episodes, progress=True,
                   sampling={"assistant": {"temperature": 0.0, "max_new_tokens": max_new_tokens}})
    if res.failures:
        raise RuntimeError(f"{len(res.failures)} evaluation episodes failed: {res.failures[0]}")
    task = collab_env.make(ENV_ID, split="test").unwrapped.task
    return [episode_record(res.episodes[k], task.get_item(res.episodes[k].index), tokenizer)
            for k in sorted(res.episodes)]


def train_seed(seed: int, a: argparse.Namespace, out: Path, before: list[dict[str, Any]] | None):
    """Train one seed; returns (before episodes, after episodes, training log records, trainer)."""
    from hidden_facts_mr_grpo import MIN_REPLY_TOKENS, mr_env

    import collab_env
    from collab_env.adapters.common.collapse import CollapseThresholds
    from collab_env.adapters.magrpo import MAGRPOConfig, MAGRPOTrainer

    config = MAGRPOConfig(
        num_agents=1, num_turns=1, num_generations=a.generations, max_new_tokens=a.max_new_tokens,
        max_steps=a.items, per_device_train_batch_size=a.batch, learning_rate=a.lr, lora_r=a.lora_r,
        lora_alpha=2.0 * a.lora_r, lora_target_modules=tuple(a.lora_modules.split(",")),
        temperature=a.temperature, normalize_advantages=True, max_grad_norm=1.0, seed=seed, eval_interval=0,
        logging_steps=1, output_dir=str(out / f"seed_{seed}"), plot=False,
    )
    trainer = MAGRPOTrainer(agent_model=a.model, env=mr_env("train", ENV_ID, a.rollouts,
                                                            max_user_turns=a.future_user_turns),
                            eval_env=collab_env.make(ENV_ID, split="test"), args=config)
    trainer.collapse_thresholds = CollapseThresholds(min_length=MIN_REPLY_TOKENS)
    pm = trainer.models[0]
    if before is None:  # LoRA starts as the identity (B = 0): the base model, the same for every seed
        before = evaluate_policy(pm.generator, pm.tokenizer, a.eval_episodes, a.max_new_tokens, "before training",
                                 a.eval_max_steps)
    print(f"  training seed {seed}: {a.items} items x {a.generations} replies...", flush=True)
    trainer.train()
    after = evaluate_policy(pm.generator, pm.tokenizer, a.eval_episodes, a.max_new_tokens,
                            f"seed {seed} after training", a.eval_max_steps)
    return before, after, list(trainer.logger.records), trainer


def plot(path: Path, seeds_logs: dict[int, list[dict[str, Any]]], before: dict, after: dict) -> None:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for seed, recs in seeds_logs.items():
        rows = [r for r in recs if "turn_1/reward_mean" in r]
        axes[0].plot([r["item"] for r in rows], [r["turn_1/reward_mean"] for r in rows], label=f"seed {seed}", alpha=0.8)
        axes[1].plot([r["item"] for r in rows], [r.get("collapse/completion_length", math.nan) for r in rows],
                     label=f"seed {seed}", alpha=0.8)
    axes[0].set(title="training reward (MR, mean of the group)", xlabel="training item")
    axes[1].set(title="training reply length (visible tokens)", xlabel="training item")
    for ax in axes[:2]:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    names = ["success", "facts", "questions", "reward"]
    x = range(len(names))
    for off, (label, s) in zip((-0.2, 0.2), (("before", before), ("after", after)), strict=True):
        m = [s[k]["mean"] for k in names]
        err = [[s[k]["mean"] - s[k]["lo"] for k in names], [s[k]["hi"] - s[k]["mean"] for k in names]]
        axes[2].bar([i + off for i in x], m, width=0.4, yerr=err, capsize=4, label=label)
    axes[2].set_xticks(list(x), names)
    axes[2].set(title="held-out test episodes (95% intervals)")
    axes[2].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def fmt(s: dict[str, float]) -> str:
    return f"{s['mean']:.3f} [{s['lo']:.3f}, {s['hi']:.3f}]"


def transcript_md(title: str, ep: dict[str, Any]) -> str:
    lines = [f"### {title} (test item seed {ep['seed']}, success {int(ep['success'])}, "
             f"{int(ep['questions'])} question(s), end: {ep['end_reason']})", ""]
    for m in ep["transcript"]:
        lines.append(f"**{m['role']}**: {m['text'].strip() or '(empty)'}  ")
    return "\n".join(lines) + "\n"


def main_parser() -> argparse.ArgumentParser:
    """The command line of the benchmark."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="embedded")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--items", type=int, default=64, help="training items per seed")
    p.add_argument("--batch", type=int, default=1, help="training items per GRPO update")
    p.add_argument("--generations", type=int, default=6)
    p.add_argument("--rollouts", type=int, default=1, help="MR futures per reply")
    p.add_argument("--future-user-turns", type=int, default=1,
                   help="MR window: 2 = reply, user, assistant, user (credits the answer too); "
                        "1 = reply, user (only the facts the reply elicits; no future generation)")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--lora-r", type=int, default=8)
    p.add_argument("--lora-modules", default="q_proj,v_proj")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--eval-episodes", type=int, default=48, help="held-out test episodes per evaluation")
    p.add_argument("--eval-max-steps", type=int, default=4,
                   help="env steps per evaluation episode (4: two assistant turns, enough to elicit the "
                        "withheld fact and answer; 12 is the env's default)")
    p.add_argument("--eval-adapter", default=None,
                   help="no training: evaluate the base model and this saved adapter (a run's "
                        "<out>_adapter) the same way and write the results (1 trained seed)")
    p.add_argument("--out", default=str(RESULTS / "embedded_learning"),
                   help="output prefix: <out>.json/.md/.png, <out>_transcripts.md, <out>_adapter/")
    return p


def main(argv: list[str] | None = None) -> int:
    a = main_parser().parse_args(argv)

    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(os.environ.get("COLLAB_ENV_OUTPUT", "collab_env_output")) / "embedded_learning"
    command = "python benchmarks/bench_embedded_learning.py " + " ".join(shlex.quote(x) for x in (argv if argv is not None else sys.argv[1:]))
    t0 = time.perf_counter()
    before: list[dict[str, Any]] | None = None
    per_seed: dict[int, dict[str, Any]] = {}
    logs: dict[int, list[dict[str, Any]]] = {}
    after_all: list[dict[str, Any]] = []
    adapter_dir = Path(f"{out}_adapter")

    def write() -> tuple[list[str], float]:
        """Write the JSON, PNG, Markdown and transcripts of the seeds done so far (after every
        seed, so an interrupted run leaves its finished seeds)."""
        assert before is not None
        b, af, diff = summarise(before), summarise(after_all), paired(before, after_all)
        wall = time.perf_counter() - t0
        result = {
            "benchmark": "embedded_learning", "command": command, "seeds_done": len(per_seed),
            "complete": len(per_seed) == a.seeds, "env": ENV_ID, "model": a.model,
            "settings": vars(a), "eval": {"split": "test", "episodes_per_eval": a.eval_episodes, "seed": EVAL_SEED,
                                          "decoding": "greedy"},
            "before": b, "after": af, "per_seed": per_seed,
            "separated": {k: af[k]["lo"] > b[k]["hi"] for k in b},
            "paired_difference": diff,
            "wall_seconds": wall, "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                                              "torch_threads": _torch_threads()},
            "adapter": str(adapter_dir.relative_to(ROOT)) if adapter_dir.is_relative_to(ROOT) else str(adapter_dir),
        }
        Path(f"{out}.json").write_text(json.dumps(result, indent=1) + "\n")
        plot(Path(f"{out}.png"), logs, b, af)
        rows = ["| metric | before | after (all seeds) | intervals apart | after - before, paired (same items) |",
                "|---|---|---|---|---|"]
        for k in METRICS:
            rows.append(f"| {k} | {fmt(b[k])} | {fmt(af[k])} | {'yes' if result['separated'][k] else 'no'} "
                        f"| {fmt(diff[k])} |")
        md = [f"# Embedded SmolLM2-135M learns on {ENV_ID} (GRPO + LoRA, CPU)", "",
              f"Command: `{command}`  ", f"Wall time: {wall / 60:.1f} min on {os.cpu_count()} CPUs; "
              f"{len(per_seed)} of {a.seeds} seed(s) done, {a.items} training items each; {a.eval_episodes} held-out test episodes "
              "per evaluation (greedy), the scripted user. 95% intervals: Wilson for 0/1 metrics, else mean ± "
              "1.96 SE; the paired column: mean ± 1.96 SE of the per-episode differences.", "",
              *rows, "", "Per seed (after):", ""]
        for seed, s in per_seed.items():
            md.append(f"* seed {seed}: success {fmt(s['after']['success'])}, facts {fmt(s['after']['facts'])}, "
                      f"questions {fmt(s['after']['questions'])}, training reply tokens "
                      f"{s['train_reply_tokens_first5']:.1f} -> {s['train_reply_tokens_last5']:.1f}, "
                      f"collapse warnings {s['collapse_flagged_lines']}")
        Path(f"{out}.md").write_text("\n".join(md) + "\n")
        Path(f"{out}_transcripts.md").write_text(
            "# Transcripts on the first held-out test item\n\n" + transcript_md("Before training", before[0]) + "\n"
            + transcript_md("After training (seed 0)", after_all[0]))
        return rows, wall

    if a.eval_adapter:  # evaluate a saved adapter: "after" is that one trained seed
        from collab_env.agents.embedded import EmbeddedPolicy

        base = EmbeddedPolicy(max_batch_size=64, temperature=0.0, max_new_tokens=a.max_new_tokens)
        before = evaluate_policy(base, base.tokenizer, a.eval_episodes, a.max_new_tokens, "the base model",
                                 a.eval_max_steps)
        trained = EmbeddedPolicy(max_batch_size=64, temperature=0.0, max_new_tokens=a.max_new_tokens,
                                 adapter=a.eval_adapter)
        after_all = evaluate_policy(trained, trained.tokenizer, a.eval_episodes, a.max_new_tokens,
                                    f"the adapter {a.eval_adapter}", a.eval_max_steps)
        saved = json.loads((Path(a.eval_adapter) / "collab_env_adapter.json").read_text())
        per_seed[int(saved.get("seed", 0))] = {"after": summarise(after_all), "train_seconds": math.nan,
                                               "collapse_flagged_lines": 0, "train_reply_tokens_first5": math.nan,
                                               "train_reply_tokens_last5": math.nan,
                                               "trained_by": saved.get("command")}
        # the training settings are the run's that saved the adapter (its command's flags over
        # this script's defaults); the evaluation settings are this call's
        trained = main_parser().parse_args(shlex.split(saved["command"])[2:])
        for key in ("items", "batch", "generations", "rollouts", "future_user_turns", "lr", "lora_r",
                    "lora_modules", "temperature"):
            setattr(a, key, getattr(trained, key))
        a.seeds = len(per_seed)
        adapter_dir = Path(a.eval_adapter)
    for seed in range(0 if a.eval_adapter else a.seeds):
        ts = time.perf_counter()
        before, after, records, trainer = train_seed(seed, a, work, before)
        logs[seed] = records
        after_all.extend(after)
        lens = [r["collapse/completion_length"] for r in records if "collapse/completion_length" in r]
        per_seed[seed] = {"after": summarise(after), "train_seconds": time.perf_counter() - ts,
                          "collapse_flagged_lines": sum(1 for r in records if r.get("collapse/flagged")),
                          "train_reply_tokens_first5": sum(lens[:5]) / max(len(lens[:5]), 1),
                          "train_reply_tokens_last5": sum(lens[-5:]) / max(len(lens[-5:]), 1)}
        if seed == 0:
            trainer.models[0].model.save_pretrained(adapter_dir)
            (adapter_dir / "collab_env_adapter.json").write_text(json.dumps(
                {"base": a.model, "env": ENV_ID, "seed": seed, "command": command, "settings": vars(a),
                 "after": per_seed[0]["after"]}, indent=1) + "\n")
        print(f"  seed {seed}: success {fmt(per_seed[seed]['after']['success'])}, "
              f"facts {fmt(per_seed[seed]['after']['facts'])} ({per_seed[seed]['train_seconds']:.0f} s)", flush=True)
        del trainer
        rows, wall = write()
    if a.eval_adapter:
        rows, wall = write()
    print("\n".join(rows))
    print(f"wall time {wall / 60:.1f} min; results in {out}.json/.md/.png")
    return 0


def _torch_threads() -> int | None:
    try:
        import torch

        return torch.get_num_threads()
    except ImportError:
        return None


if __name__ == "__main__":
    raise SystemExit(main())

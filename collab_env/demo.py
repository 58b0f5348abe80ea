"""The main job on the embedded default, offline (``make demo``).

1. The scripted baselines ("ask then answer", "answer at once") on the four levels of the
   built-in collaboration suite, the same seeded episodes for each.
2. The embedded model (SmolLM2-135M-Instruct, a real but weak chat model shipped as a PyPI
   package) as the assistant on held-out test items of ``hidden-facts-copy`` (the level where
   the withheld fact is the answer, so success measures asking, not arithmetic), **before and
   after collab_env training**: the base model ("Base"), the base model with CollabLLM's
   collaborative system prompt ("Proactive Base"), and the same model with the LoRA adapter
   that ``benchmarks/bench_collabllm_table.py`` trained (SFT on scripted collaborative
   conversations, then GRPO on the multiturn-aware reward; committed in
   ``benchmarks/results/collabllm_table_cpu_adapter/``; when it is missing, the demo says so
   and prints the one command that regenerates it). Greedy decoding, so the rows are
   reproducible; two assistant turns per episode, as the benchmark evaluates; the episodes'
   calls are merged into batched ``generate`` calls. Each row: success and questions asked per
   episode, with 95% intervals over the held-out items (Wilson's for success, Student's t for questions),
   share of the withheld facts the user revealed.

The user is the suite's scripted user (it reveals a fact only to a question for it). Each
episode is appended to ``runs/demo/<time>/<env>/<policy>.jsonl`` as it ends. Progress: a bar
on a terminal, plain lines on stderr when it is redirected (``make demo > out.txt 2>&1``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from collab_env._progress import progress_bar
from collab_env.eval import compare
from collab_env.eval.stats import interval

ENVS = ("hidden-facts-easy", "hidden-facts", "hidden-facts-hard", "hidden-facts-copy")
BASELINES = {
    "ask-then-answer": {"assistant": "ask-then-answer"},
    "answer-at-once": {"assistant": "answer-at-once"},
}
#: The env the adapter was trained on; the model rows use its held-out test split.
MODEL_ENV = "hidden-facts-copy"
#: Env steps of a model-row episode: two assistant turns (ask for the withheld fact, then
#: answer), as the benchmark evaluates the adapter.
MODEL_MAX_STEPS = 4
#: Reply length of the model rows (the benchmark's).
MAX_NEW_TOKENS = 40
#: Where ``benchmarks/bench_collabllm_table.py`` saves the adapter (relative to the repository).
ADAPTER = Path("benchmarks") / "results" / "collabllm_table_cpu_adapter"
#: The one command that trains and saves that adapter (and the full table).
TRAIN_COMMAND = "python benchmarks/bench_collabllm_table.py"
#: Where the full table is.
TABLE = "benchmarks/results/collabllm_table_cpu.md"
#: The row labels of the model rows.
BASE, PROACTIVE, TRAINED = "Base", "Proactive Base", "trained (SFT + GRPO on MR)"


def default_adapter() -> Path:
    """The committed adapter of a source checkout (``<repo>/benchmarks/results/...``), else the
    same path under the working directory."""
    repo = Path(__file__).resolve().parents[1] / ADAPTER
    return repo if repo.is_dir() else ADAPTER


def model_policy_sets(max_new_tokens: int, adapter: Path | None) -> dict[str, dict[str, object]]:
    """Label -> policies of the model rows: the base embedded model, Proactive on it, and with an
    ``adapter`` folder the model with that LoRA adapter."""
    from transformers.utils import logging as hf_logging

    from collab_env.agents.embedded import EmbeddedPolicy
    from collab_env.agents.proactive import Proactive

    hf_logging.disable_progress_bar()  # the weight-loading bar would break up the table output

    # Greedy decoding so the table is reproducible.
    base = EmbeddedPolicy(max_batch_size=32, temperature=0.0, max_new_tokens=max_new_tokens)
    sets: dict[str, dict[str, object]] = {BASE: {"assistant": base}, PROACTIVE: {"assistant": Proactive(base)}}
    if adapter is not None:
        trained = EmbeddedPolicy(max_batch_size=32, temperature=0.0, max_new_tokens=max_new_tokens,
                                 adapter=str(adapter), name="embedded+trained")
        sets[TRAINED] = {"assistant": trained}
    return sets


def collaboration_rows(result: Any, split: str = "test") -> dict[str, dict[str, dict[str, Any]]]:
    """Label -> ``success`` / ``questions`` / ``facts`` with their 95% intervals
    (:func:`collab_env.eval.stats.interval`, by each metric's type), read from each episode's transcript with
    :func:`collab_env.tasks.hidden_facts.collaboration_stats`."""
    import collab_env
    from collab_env.tasks.hidden_facts import collaboration_stats

    task = collab_env.make(MODEL_ENV, split=split).unwrapped.task
    rows = {}
    for label, res in result.results.items():
        eps = [res.episodes[k] for k in sorted(res.episodes)]
        stats = [collaboration_stats(e.conversation, task.get_item(e.index)) for e in eps]
        rows[label] = {
            "success": interval([float(e.components.get("assistant", {}).get("accuracy", 0.0) >= 1.0)
                                 for e in eps], "binary"),
            "questions": interval([s["questions"] for s in stats], "count"),
            "facts": interval([s["facts"] for s in stats], "continuous"),
        }
    return rows


def format_rows(rows: dict[str, dict[str, dict[str, Any]]]) -> str:
    """The headline table: one line per row, each metric with its interval."""
    def cell(s: dict[str, Any], digits: int = 2) -> str:
        return f"{s['mean']:.{digits}f} [{s['lo']:.{digits}f}, {s['hi']:.{digits}f}]"

    width = max(len(label) for label in rows)
    lines = [f"{'assistant':{width}s}  {'success (95% CI)':20s}  {'questions/episode (95% CI)':27s}  facts revealed",
             f"{'-' * width}  {'-' * 20}  {'-' * 27}  {'-' * 14}"]
    for label, r in rows.items():
        lines.append(f"{label:{width}s}  {cell(r['success']):20s}  {cell(r['questions']):27s}  "
                     f"{r['facts']['mean']:.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m collab_env.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=100, help="episodes per env for the baselines")
    parser.add_argument("--model-episodes", type=int, default=32,
                        help="held-out episodes for each embedded-model row (0 skips the model)")
    parser.add_argument("--max-new-tokens", type=int, default=MAX_NEW_TOKENS,
                        help=f"reply length of the model rows (the adapter was trained with {MAX_NEW_TOKENS})")
    parser.add_argument("--adapter", default=None,
                        help=f"LoRA adapter folder of the trained row (default: {ADAPTER})")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/demo", help="directory for the JSONL result files")
    args = parser.parse_args(argv)

    t_start = time.perf_counter()
    run_dir = Path(args.out) / time.strftime("%Y%m%d-%H%M%S")
    print(f"collab_env demo: seed {args.seed}; user = the suite's scripted user; results in {run_dir}/\n",
          flush=True)
    adapter = Path(args.adapter) if args.adapter else default_adapter()
    model_steps = 2 if args.model_episodes > 0 else 0
    # A bar on a terminal; a line per step on stderr when it is redirected.
    steps = progress_bar(len(ENVS) + model_steps, "demo", lines=True, unit="steps")

    def step_done(what: str) -> None:
        if steps is not None:
            steps.set_postfix(done=what)
            steps.update()

    for env_id in ENVS:
        result = compare(env_id, BASELINES, num_episodes=args.episodes, seed=args.seed,
                         out_dir=run_dir / env_id, progress=False)
        print(result.summary_table() + "\n", flush=True)
        step_done(f"baselines on {env_id}")
    if args.model_episodes <= 0:
        if steps is not None:
            steps.close()
        print(_closing_line(run_dir, t_start), flush=True)
        return 0
    t0 = time.perf_counter()
    if not adapter.is_dir():
        print(f"No trained adapter at {adapter}: the trained row is skipped. Train it (about an hour on 2 "
              f"cores) with:\n    {TRAIN_COMMAND}\n", flush=True)
    print("loading the embedded model (the first run converts it once, about a minute)...", file=sys.stderr,
          flush=True)
    sets = model_policy_sets(args.max_new_tokens, adapter if adapter.is_dir() else None)
    step_done("load the embedded model")
    result = compare(MODEL_ENV, sets, num_episodes=args.model_episodes, seed=args.seed,
                     out_dir=run_dir / f"{MODEL_ENV}-model", progress=True, concurrency=args.model_episodes,
                     env_kwargs={"split": "test", "max_steps": MODEL_MAX_STEPS})
    step_done(f"model rows on {MODEL_ENV}")
    if steps is not None:
        steps.close()
    rows = collaboration_rows(result)
    print(f"Held-out test items of {MODEL_ENV} ({args.model_episodes} episodes per row, two assistant turns, "
          "greedy): the embedded model before and after collab_env training")
    print(format_rows(rows))
    print(f"({time.perf_counter() - t0:.0f} s for the model rows, {time.perf_counter() - t_start:.0f} s in all; "
          f"the adapter is {'loaded from ' + str(adapter) if adapter.is_dir() else 'missing'})\n")
    if TRAINED in rows:
        tr, un = rows[TRAINED]["success"], max((rows[BASE]["success"], rows[PROACTIVE]["success"]),
                                              key=lambda r: r["hi"])
        apart = tr["lo"] > un["hi"]
        print(f"Shown: after SFT + GRPO on the multiturn-aware reward, the 135M model asks for the withheld fact "
              f"and then answers (success {tr['mean']:.2f} vs {un['mean']:.2f} untrained; 95% intervals "
              f"{'apart' if apart else 'overlapping'}).")
    else:
        print("Shown: the untrained model and its Proactive prompt on the held-out items (no trained adapter).")
    print(f"The full table (SFT, immediate-reward vs MR ablation, 3 seeds, intervals): {TABLE}")
    print(_closing_line(run_dir, t_start), flush=True)
    return 0


def _closing_line(run_dir: Path, t_start: float) -> str:
    """Where the demo's outputs went: the run folder and how many episode files it holds."""
    files = sorted(p for p in run_dir.rglob("*.jsonl") if not p.name.endswith(".failures.jsonl"))
    return (f"demo finished in {time.perf_counter() - t_start:.0f} s; {len(files)} episode files "
            f"(one JSONL per env and row) in {run_dir}/")


if __name__ == "__main__":
    raise SystemExit(main())

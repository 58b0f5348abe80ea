"""The main job on the embedded default, offline (``make demo``).

1. The scripted baselines ("ask then answer", "answer at once") on four levels of the built-in
   collaboration suite, the same seeded episodes for each.
2. The embedded model (SmolLM2-135M-Instruct, a real but weak chat model shipped as a PyPI
   package) as the assistant on test items of ``hidden-facts-choose`` (the level where the
   withheld fact is either the count or the unit value, so the model must choose what to ask;
   the test split's scenarios, objects, units and phrasings are never seen in training),
   **before and after collab_env training**: the base model ("Base"), the base model with
   CollabLLM's collaborative system prompt ("Proactive Base"), and the same model with the LoRA
   adapter that ``benchmarks/bench_collabllm_table.py`` trained (training seed 0: SFT on the
   scripted reference's conversations, then GRPO on the multiturn-aware reward; committed in
   ``benchmarks/results/collabllm_table_cpu_choose_adapter/``; when it is missing, the demo says
   so and prints the one command that regenerates it). Greedy decoding, so the rows are
   reproducible; two assistant turns per episode, as the benchmark evaluates; the episodes'
   calls are merged into batched ``generate`` calls. Each row: success and questions asked per
   episode, with 95% intervals over the test items (Wilson's for success, Student's t for
   questions), share of the withheld facts the user revealed (the env's record).
3. The headline of the full table (``benchmarks/results/collabllm_table_cpu.json``, read, not
   re-run): its strongest comparison of a trained row with the untrained model, and whether RL
   on MR did better than the SFT control trained as long, each with its interval over training
   seeds.

The user is the suite's scripted user (it reveals a fact only to a question for it). Each
episode is appended to ``runs/demo/<time>/<env>/<policy>.jsonl`` as it ends. Progress: a bar
on a terminal, plain lines on stderr when it is redirected (``make demo > out.txt 2>&1``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from collab_env._progress import progress_bar
from collab_env.eval import compare
from collab_env.eval.stats import interval

ENVS = ("hidden-facts-easy", "hidden-facts", "hidden-facts-hard", "hidden-facts-choose")
BASELINES = {
    "ask-then-answer": {"assistant": "ask-then-answer"},
    "answer-at-once": {"assistant": "answer-at-once"},
}
#: The env the adapter was trained on; the model rows use its held-out test split.
MODEL_ENV = "hidden-facts-choose"
#: Env steps of a model-row episode: two assistant turns (ask for the withheld fact, then
#: answer), as the benchmark evaluates the adapter.
MODEL_MAX_STEPS = 4
#: Reply length of the model rows (the benchmark's).
MAX_NEW_TOKENS = 40
#: Where ``benchmarks/bench_collabllm_table.py`` saves the adapter (relative to the repository;
#: ``collabllm_table_cpu_adapter`` is the previous table's, trained on ``hidden-facts-copy``, which
#: board entries replay).
ADAPTER = Path("benchmarks") / "results" / "collabllm_table_cpu_choose_adapter"
#: The one command that trains and saves that adapter (and the full table).
TRAIN_COMMAND = "python benchmarks/bench_collabllm_table.py"
#: Where the full table is.
TABLE = "benchmarks/results/collabllm_table_cpu.md"
#: The row labels of the model rows.
BASE, PROACTIVE, TRAINED = "Base", "Proactive Base", "trained (SFT + GRPO on MR, seed 0)"
#: The table's row names (benchmarks/bench_collabllm_table.py) the headline compares.
MR_ROW, CONTROL_ROW, DPO_ROW = "SFT + GRPO (MR)", "SFT control (as long as SFT + RL)", "SFT + online DPO (MR)"


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
    (:func:`collab_env.eval.stats.interval`, by each metric's type), read from each episode with
    :func:`collab_env.tasks.hidden_facts.collaboration_stats`: questions by the rule the env's user
    follows, facts from the env's record of what the user revealed."""
    import collab_env
    from collab_env.tasks.hidden_facts import clause_rule, collaboration_stats

    task = collab_env.make(MODEL_ENV, split=split).unwrapped.task
    rule = clause_rule(task.config.user_rule)
    rows = {}
    for label, res in result.results.items():
        eps = [res.episodes[k] for k in sorted(res.episodes)]
        stats = [collaboration_stats(e.conversation, task.get_item(e.index), rule=rule,
                                     revealed=e.info["task"]["revealed"]) for e in eps]
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
        print(f"No trained adapter at {adapter}: the trained row is skipped. Train it (the full table: about "
              f"three hours on 2 cores) with:\n    {TRAIN_COMMAND}\n", flush=True)
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
    print(f"Test items of {MODEL_ENV} (scenarios, objects and units never seen in training; {args.model_episodes} "
          "episodes per row, two assistant turns, greedy): the embedded model before and after collab_env training")
    print(format_rows(rows))
    print(f"({time.perf_counter() - t0:.0f} s for the model rows, {time.perf_counter() - t_start:.0f} s in all; "
          f"the adapter is {'loaded from ' + str(adapter) if adapter.is_dir() else 'missing'})\n")
    if TRAINED in rows:
        tr, un = rows[TRAINED]["success"], max((rows[BASE]["success"], rows[PROACTIVE]["success"]),
                                              key=lambda r: r["hi"])
        apart = tr["lo"] > un["hi"]
        print(f"Here: the adapter of training seed 0 succeeds on {tr['mean']:.2f} of the test items vs "
              f"{un['mean']:.2f} untrained (95% intervals over items {'apart' if apart else 'overlapping'}).")
    else:
        print("Here: the untrained model and its Proactive prompt on the test items (no trained adapter).")
    table_json = Path(__file__).resolve().parents[1] / Path(TABLE).with_suffix(".json")
    for line in table_headline(table_json if table_json.is_file() else Path(TABLE).with_suffix(".json")):
        print(line)
    print(_closing_line(run_dir, t_start), flush=True)
    return 0


def _iv(s: dict[str, Any], sign: str = "") -> str:
    return f"[{s['lo']:{sign}.2f}, {s['hi']:{sign}.2f}]"


def table_headline(path: Path) -> list[str]:
    """The full table's headline, read from its results file: what the SFT teacher was; the trained
    row whose interval has the highest lower bound (the crossed seeds x items bootstrap, which
    resamples items too; Student's t over the training seeds' means beside it) against the better
    untrained row; and MR-GRPO's paired differences by seed and item with the SFT control and with
    online DPO, whatever they show. One line saying what to run when the file is missing."""
    if not path.is_file():
        return [f"The full table is not here ({path}): {TRAIN_COMMAND} makes it."]
    d = json.loads(path.read_text())
    rows = {r["row"]: r for r in d["rows"]}
    untrained = [rows[n] for n in (BASE, PROACTIVE) if n in rows]
    trained = [r for r in d["rows"] if r.get("seeds")]
    if not untrained or not trained:
        return [f"The full table ({TABLE}) has no trained and untrained rows to compare."]
    if any("n_seeds" not in r["success"] for r in trained) or "eval" not in d:
        return [f"The full table's results ({path}) are of an older format, without intervals over training seeds: "
                f"{TRAIN_COMMAND} makes them again."]
    best = max(trained, key=lambda r: r["success"].get("bootstrap", r["success"])["lo"])
    un = max(untrained, key=lambda r: r["success"]["hi"])
    s, u = best["success"], un["success"]
    n = s["n_seeds"]
    split = d["eval"]["split"]
    boot = f"; {_iv(s['bootstrap'])} seeds x items bootstrap" if "bootstrap" in s else ""
    lines = [
        f"The full table ({TABLE}: {len(d['rows'])} rows, {n} training seeds, the {split} split evaluated once per "
        f"row, settings chosen on the validation split). The SFT teacher: {d['sft_teacher']}.",
        f"Its strongest comparison: {best['row']} succeeds on {s['mean']:.2f} of the {split} items (95%: "
        f"{_iv(s)} t over the {n} seed means{boot}) vs {u['mean']:.2f} {_iv(u)} for {un['row']} (Wilson over "
        "items)."]
    for ctrl, what in ((CONTROL_ROW, "the SFT control trained as long"),
                       (DPO_ROW, "online DPO on MR (the paper's row)")):
        c = d["comparisons"].get(f"{MR_ROW} minus {ctrl}", {}).get("success")
        if c is None:
            continue
        sd = c["seeds"]
        zero = sd["lo"] <= 0.0 <= sd["hi"]
        lines.append(f"GRPO on MR minus {what}: success {sd['mean']:+.2f} (paired by seed and item: {_iv(sd, '+')} "
                     f"t over {sd['n_seeds']} seeds" + (f"; {_iv(c['bootstrap'], '+')} bootstrap" if "bootstrap" in c
                                                        else "")
                     + f"; the rows differ in {c['differ']} of {c['cells']} cells): "
                     + ("no difference shown." if zero else ("better." if sd["lo"] > 0 else "worse.")))
    if not d.get("complete", False):
        lines.append("(The table's run is not complete: some rows have fewer seeds than asked.)")
    return lines


def _closing_line(run_dir: Path, t_start: float) -> str:
    """Where the demo's outputs went: the run folder and how many episode files it holds."""
    files = sorted(p for p in run_dir.rglob("*.jsonl") if not p.name.endswith(".failures.jsonl"))
    return (f"demo finished in {time.perf_counter() - t_start:.0f} s; {len(files)} episode files "
            f"(one JSONL per env and row) in {run_dir}/")


if __name__ == "__main__":
    raise SystemExit(main())

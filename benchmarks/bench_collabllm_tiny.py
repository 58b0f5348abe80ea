"""The tiny CollabLLM run on a CPU: the pipeline end to end, reporting only what is valid.

``collab-env eval``'s path (:func:`collab_env.eval.evaluate`) on ``collabllm-math-hard`` with the
three fixture rows of ``benchmarks/leaderboard/data/collabllm-fixture-rows.jsonl`` (the CollabLLM
schema, read by the env's ``data_files`` as ``collab-env data`` reads such files), the embedded
SmolLM2-135M-Instruct as the assistant and as the user (an ``llm-user`` spec on ``embedded``, plain-text
replies: the 135M model cannot keep the simulator's JSON format), the
multiturn-aware reward (MR) on, with the recipe's metrics: accuracy **by rule** (the rows' boxed
reference answers; ``accuracy_rule``), interactivity by the embedded judge, and token_amount.

What it reports: the task accuracy by rule and the tokens (rule-based, valid whatever the judge),
and the judge's validity check that the eval runs before any judged number
(:mod:`collab_env.eval.judge_check`). The embedded judge fails it, so the eval itself refuses
the judged columns (interactivity, the MR total and with it the return): this script prints and
writes them as "no valid judge on CPU", taken from the eval's verdict, never decided here.

What it does not claim: any learning (nothing is trained), any quality of the embedded model,
any interactivity number. It shows that the path runs.

Usage::

    nice -n 10 env OMP_NUM_THREADS=1 python -m benchmarks.bench_collabllm_tiny [--episodes 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from benchmarks._machine import LoadMeter

ROOT = Path(__file__).resolve().parents[1]
ROWS = ROOT / "benchmarks" / "leaderboard" / "data" / "collabllm-fixture-rows.jsonl"
OUT = ROOT / "benchmarks" / "results" / "collabllm_tiny_cpu"
#: The recipe's math-hard weights, with the accuracy read by rule (the rows' boxed answers).
WEIGHTS = {"accuracy_rule": 1.0, "interactivity": 1.0, "token_amount": -1e-4}
NO_VALID_JUDGE = "no valid judge on CPU"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--episodes", type=int, default=3, help="episodes (one per fixture row)")
    p.add_argument("--max-assistant-turns", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--rows", default=str(ROWS))
    p.add_argument("--out", default=str(OUT), help="output prefix: <out>.json, <out>.md, <out>.jsonl (episodes)")
    p.add_argument("--summarize", metavar="FILE.json", help="re-render FILE.md from FILE.json; run nothing")
    a = p.parse_args(argv)
    if a.summarize:
        src = Path(a.summarize)
        src.with_suffix(".md").write_text(render_md(json.loads(src.read_text())))
        return 0
    from collab_env.eval import evaluate

    command = ("nice -n 10 env OMP_NUM_THREADS=1 python -m benchmarks.bench_collabllm_tiny "
               + " ".join(shlex.quote(x) for x in (argv if argv is not None else sys.argv[1:]))).rstrip()
    out = Path(a.out)
    episodes_file = Path(f"{out}.jsonl")
    from collab_env.eval import failures_path
    from collab_env.policy import policy_spec

    for old in (episodes_file, failures_path(episodes_file)):
        if old.exists():
            old.unlink()  # a fresh run each time (the eval refuses to append to another run)
    # The embedded model cannot keep the simulator's JSON reply format: it replies in plain text
    # (the spec of its fidelity card in collab_env/leaderboard/user_cards.json).
    user = policy_spec({"kind": "llm-user", "backend": "embedded",
                        "options": {"reply_format": "plain", "max_retries": 2}})
    uptime_before = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    meter = LoadMeter().start()
    t0 = time.perf_counter()
    sampling = {"temperature": 0.0, "max_new_tokens": a.max_new_tokens}
    result = evaluate(
        "collabllm-math-hard",
        {"assistant": "embedded", "user": user},
        num_episodes=a.episodes, out=episodes_file, concurrency=a.episodes,
        env_kwargs={"data_files": a.rows, "max_assistant_turns": a.max_assistant_turns, "reward": "mr",
                    "reward_kwargs": {"judge": "embedded", "weights": WEIGHTS, "rubric": "paper",
                                      "num_rollouts": 1, "max_user_turns": 1,
                                      "judge_kwargs": {"max_new_tokens": 40, "max_retries": 1}}},
        sampling={"assistant": sampling, "user": sampling},
    )
    wall = time.perf_counter() - t0
    load = meter.stop()
    uptime_after = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    table = result.summary_table()
    print(table)

    check = result.judge_check
    if check is None:
        raise SystemExit("the run has no judge check: the reward was expected to judge interactivity")
    eps = [result.episodes[k] for k in sorted(result.episodes)]
    # Valid whatever the judge: the rule's accuracy of the final answer and the tokens.
    final_acc = [_final_rule_accuracy(e, a.rows) for e in eps]
    tokens = [float(e.costs.get("completion_tokens", 0.0)) for e in eps]
    comps = result.component_means("assistant")
    valid = {
        "task_accuracy_rule_final": sum(final_acc) / len(final_acc) if final_acc else None,
        "accuracy_rule_mr_contribution": comps.get("accuracy_rule"),
        "token_amount_mr_contribution": comps.get("token_amount"),
        "completion_tokens_per_episode": sum(tokens) / len(tokens) if tokens else None,
        "assistant_turns_per_episode": result.summary.players["assistant"].mean_moves,
    }
    judged_cells = {c: (comps.get(c) if not check.refused else NO_VALID_JUDGE) for c in check.columns}
    doc = {
        "benchmark": "collabllm_tiny_cpu", "command": command,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "env_id": result.env_id, "rows": str(Path(a.rows).relative_to(ROOT)) if Path(a.rows).is_relative_to(ROOT)
        else a.rows, "episodes": len(eps), "failures": [f.error[:300] for f in result.failures],
        "policies": result.policies, "reward": {"kind": "mr", "weights": WEIGHTS, "num_rollouts": 1,
                                                "max_user_turns": 1, "judge": "embedded", "rubric": "paper"},
        "max_assistant_turns": a.max_assistant_turns, "sampling": sampling,
        "max_new_tokens": a.max_new_tokens,
        "valid": valid, "judged": judged_cells, "judge_check": check.to_dict(),
        "end_reasons": result.summary.end_reasons,
        "wall_seconds": round(wall, 1),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "load": load.to_dict(),
                    "load_text": load.describe(),
                    "uptime_before": uptime_before, "uptime_after": uptime_after,
                    "omp_num_threads": os.environ.get("OMP_NUM_THREADS")},
        "claims": "the CollabLLM path (data rows -> env -> embedded assistant and llm-user -> MR with futures -> "
                  "rule accuracy, tokens -> judge check -> results) runs end to end on a CPU; nothing more",
        "does_not_claim": "any learning (nothing is trained), any quality of a 135M model, any interactivity "
                          "or MR number (the judge fails its validity check)",
        "table": table,
    }
    Path(f"{out}.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    Path(f"{out}.md").write_text(render_md(doc))
    print(f"wrote {out}.json/.md/.jsonl ({wall:.0f} s)")
    return 1 if result.failures else 0


def render_md(doc: dict) -> str:
    """The Markdown page of a results document (``--summarize FILE.json`` re-renders it)."""
    check = doc["judge_check"]
    v = check["validity"]
    if v is None:
        verdict, judge_time = "skipped (--no-judge-check)", "no judge check"
    else:
        verdict = (f"{'passes' if v['passed'] else 'fails'}: AUC {v['auc']:.3f}, calibration error {v['ece']:.3f} on "
                   f"{v['items']} rule-labelled conversations (bar AUC >= {v['min_auc']}, calibration error <= "
                   f"{v['max_ece']})")
        judge_time = (f"the judge's verdict read from the user cache, where its check ({v['seconds']:.0f} s) "
                      "kept it" if check["kept"] else f"the judge check included: {v['seconds']:.0f} s")
    valid, m = doc["valid"], doc["machine"]
    turns = doc["max_assistant_turns"]
    return "\n".join([
        "# The tiny CollabLLM run on a CPU (issue 45, part 7)", "",
        f"Command: `{doc['command']}`  ",
        f"Wall time: {doc['wall_seconds']:.0f} s ({judge_time}); machine: {m['load_text']}.  ",
        f"`uptime` before: `{m['uptime_before']}`; after: `{m['uptime_after']}`.", "",
        f"`{doc['env_id']}`, {doc['episodes']} episodes (one per fixture row) of `{doc['rows']}` (CollabLLM "
        "schema), the embedded SmolLM2-135M-Instruct as assistant and as user (`llm-user` on `embedded`, "
        f"plain-text replies), greedy, {doc['max_new_tokens']} new tokens a reply, at most {turns} assistant turns; "
        f"MR on (1 future, 1 future user turn) with the weights `{json.dumps(doc['reward']['weights'])}`: accuracy "
        "by rule on the rows' boxed answers, interactivity by the embedded judge (paper rubric).", "",
        "## What is valid", "",
        "| metric | value |", "|---|---|",
        f"| task accuracy by rule (final answer) | {_fmt(valid['task_accuracy_rule_final'])} |",
        f"| accuracy_rule (MR contribution, mean per episode) | {_fmt(valid['accuracy_rule_mr_contribution'])} |",
        f"| token_amount (MR contribution, mean per episode) | {_fmt(valid['token_amount_mr_contribution'])} |",
        f"| completion tokens per episode | {_fmt(valid['completion_tokens_per_episode'], '.1f')} |",
        f"| assistant turns per episode | {_fmt(valid['assistant_turns_per_episode'], '.2f')} |", "",
        "## What is judged", "",
        f"Judge validity check (run by the eval before any judged number): {verdict}.", "",
        "| judged column | value |", "|---|---|",
        *[f"| {c} | {val if isinstance(val, str) else _fmt(val)} |" for c, val in doc["judged"].items()], "",
        "## The eval's own table", "", "```", doc["table"], "```", "",
        "## What it shows, and what it does not claim", "",
        f"It shows: {doc['claims']}. It does not claim {doc['does_not_claim']}. No training step is part of "
        f"it: one MR-scored episode costs minutes of CPU here, so even one GRPO step on MR would not fit "
        "in a few minutes.", "",
    ])


def _fmt(x: float | None, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def _final_rule_accuracy(episode, rows: str) -> float:
    """1/0: the episode's last assistant message has the row's boxed reference answer, by the
    ``accuracy_rule`` metric (the same rule MR's futures are scored by)."""
    import asyncio

    import collab_env
    from collab_env.rewards.metrics import get_metric

    env = collab_env.make("collabllm-math-hard", data_files=rows)
    try:
        item = env.unwrapped.task.get_item(episode.index)
    finally:
        env.close()
    res = asyncio.run(get_metric("accuracy_rule").fn(episode.conversation, item, player="assistant"))
    return float(res.value)


if __name__ == "__main__":
    raise SystemExit(main())

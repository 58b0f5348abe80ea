"""The embedded model as a log-prob judge: parse failures and agreement with rule-based accuracy.

Fifty ``hidden-facts`` conversations played by scripted assistants (``collab_env/eval/judge_check.py``:
asking or not, answering correctly or not, so the rule-based accuracy is known) are judged by the
embedded SmolLM2-135M-Instruct with the ``accuracy`` preset (bool) and the ``interactivity``
preset (three anchored parts, 0/0.3/0.7/1). By default (``method="auto"``) the judges compare
the log-probs of the allowed answers (see ``collab_env.agents.judges``); nothing is generated,
so nothing can fail to parse. ``--baseline`` also runs the same judges by generation (greedy,
reply prefilled with the score field, 2 retries), the way small local judges worked before, on
the first ``--baseline-items`` conversations (one at a time, so that a failure is counted per
item; generation with retries costs ~20 times the log-prob method here).

Reported per method and judge: items judged, parse failures (items whose judge raised
``JudgeError``, plus items that needed a retry), wall time; for accuracy the agreement with the
rule (share of items where the verdict equals the rule), the confusion counts, the mean
P(true) on correct and on wrong answers and the AUC of P(true) against the rule; for
interactivity the mean score of conversations where the assistant asked and where it did not.

Usage: python benchmarks/bench_judge_logprob.py [--items 50] [--batch 10] [--baseline]
           [--baseline-items 12] [--out benchmarks/results/judge_logprob_embedded.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks run from the repository root

from collab_env.eval.judge_check import KINDS, judged_conversations  # noqa: E402


def auc(scores: list[float], labels: list[bool]) -> float | None:
    """Probability that a positive item scores above a negative one (ties count half)."""
    pos = [s for s, y in zip(scores, labels, strict=True) if y]
    neg = [s for s, y in zip(scores, labels, strict=True) if not y]
    if not pos or not neg:
        return None
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


async def judge_all(judge, items: list[dict], batch: int) -> tuple[list, int, float]:
    """Results (``None`` for a batch item that raised JudgeError), JudgeError count, seconds."""
    from collab_env.errors import JudgeError

    results: list = []
    errors = 0
    t0 = time.perf_counter()
    for i in range(0, len(items), batch):
        chunk = items[i:i + batch]
        try:
            results.extend(await judge.score_many(chunk))
        except JudgeError:
            if len(chunk) == 1:
                results.append(None)
                errors += 1
                continue
            # One unreadable item fails its batch: judge the items one by one to count them.
            for it in chunk:
                try:
                    results.append(await judge.score(**it))
                except JudgeError:
                    results.append(None)
                    errors += 1
    return results, errors, time.perf_counter() - t0


def summarise(method: str, convs, acc, acc_err, acc_s, inter, inter_err, inter_s) -> dict:
    correct = [c.correct for c in convs]
    asked = [c.asked for c in convs]
    ok = [r is not None for r in acc]
    verdicts = [bool(r.score) if r is not None else None for r in acc]
    agree = [v == y for v, y in zip(verdicts, correct, strict=True) if v is not None]
    out = {
        "method": method,
        "accuracy_judge": {
            "items": len(convs),
            "parse_failures": acc_err,
            "items_with_retries": sum(1 for r in acc if r is not None and r.faults > 0),
            "seconds": round(acc_s, 1),
            "agreement_with_rule": mean([float(a) for a in agree]),
            "agreement_counted_over": len(agree),
            "confusion": {
                "rule_correct_judge_true": sum(1 for v, y in zip(verdicts, correct, strict=True) if y and v is True),
                "rule_correct_judge_false": sum(1 for v, y in zip(verdicts, correct, strict=True) if y and v is False),
                "rule_wrong_judge_true": sum(1 for v, y in zip(verdicts, correct, strict=True) if not y and v is True),
                "rule_wrong_judge_false": sum(1 for v, y in zip(verdicts, correct, strict=True) if not y and v is False),
            },
        },
        "interactivity_judge": {
            "items": len(convs),
            "parse_failures": inter_err,
            "items_with_retries": sum(1 for r in inter if r is not None and r.faults > 0),
            "seconds": round(inter_s, 1),
            "mean_score_asked": mean([r.score for r, a in zip(inter, asked, strict=True) if r is not None and a]),
            "mean_score_not_asked": mean([r.score for r, a in zip(inter, asked, strict=True) if r is not None and not a]),
            "auc_score_vs_asked": auc([r.score for r in inter if r is not None],
                                      [a for r, a in zip(inter, asked, strict=True) if r is not None]),
        },
    }
    if method == "logprob":
        p_true = [r.meta["probabilities"]["score"]["true"] for r in acc if r is not None]
        labels = [y for r, y in zip(acc, correct, strict=True) if r is not None]
        out["accuracy_judge"].update({
            "mean_p_true_rule_correct": mean([p for p, y in zip(p_true, labels, strict=True) if y]),
            "mean_p_true_rule_wrong": mean([p for p, y in zip(p_true, labels, strict=True) if not y]),
            "auc_p_true_vs_rule": auc(p_true, labels),
        })
    out["per_item"] = [
        {"kind": c.kind, "rule_correct": c.correct, "asked": c.asked,
         "accuracy_verdict": verdicts[i], "interactivity": inter[i].score if inter[i] is not None else None,
         **({"p_true": acc[i].meta["probabilities"]["score"]["true"],
             "interactivity_probabilities": inter[i].meta["probabilities"]}
            if method == "logprob" and ok[i] and inter[i] is not None else {})}
        for i, c in enumerate(convs)
    ]
    return out


async def run(args) -> dict:
    from collab_env.agents.embedded import EmbeddedPolicy
    from collab_env.agents.judges import LLMJudge

    convs = judged_conversations(args.items)
    acc_items = [dict(problem=c.problem, conversation=c.conversation, reference=c.reference) for c in convs]
    inter_items = [dict(conversation=c.conversation) for c in convs]
    t0 = time.perf_counter()
    backend = EmbeddedPolicy(device="cpu")
    load_s = time.perf_counter() - t0
    runs = []
    methods = ["logprob"] + (["generate"] if args.baseline else [])
    for method in methods:
        kw = {"method": method}
        n, batch = len(convs), args.batch
        if method == "generate":  # the reply starts with the score field; short replies suffice
            kw.update(prefill=True, max_new_tokens=args.max_new_tokens)
            n, batch = min(args.baseline_items, n), 1
        acc_judge = LLMJudge.preset("accuracy", backend, **kw)
        inter_judge = LLMJudge.preset("interactivity", backend, **kw)
        assert acc_judge.uses_logprobs == (method == "logprob") == inter_judge.uses_logprobs
        acc, acc_err, acc_s = await judge_all(acc_judge, acc_items[:n], batch)
        inter, inter_err, inter_s = await judge_all(inter_judge, inter_items[:n], batch)
        summary = summarise(method, convs[:n], acc, acc_err, acc_s, inter, inter_err, inter_s)
        runs.append(summary)
        a, b = summary["accuracy_judge"], summary["interactivity_judge"]
        print(f"[{method}] accuracy: {a['parse_failures']}/{a['items']} parse failures, "
              f"agreement with rule {a['agreement_with_rule']}, {a['seconds']} s; interactivity: "
              f"{b['parse_failures']}/{b['items']} parse failures, mean asked {b['mean_score_asked']} "
              f"vs not {b['mean_score_not_asked']}, {b['seconds']} s", flush=True)
    return {
        "benchmark": "judge_logprob",
        "command": "python benchmarks/bench_judge_logprob.py " + " ".join(sys.argv[1:]),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                    "omp_num_threads": os.environ.get("OMP_NUM_THREADS")},
        "judge_model": "embedded SmolLM2-135M-Instruct (float32, CPU)",
        "conversations": {"suite": "hidden-facts", "count": len(convs), "kinds": list(KINDS),
                          "rule_correct": sum(c.correct for c in convs),
                          "asked": sum(c.asked for c in convs)},
        "model_load_seconds": round(load_s, 1),
        "runs": runs,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=50)
    ap.add_argument("--batch", type=int, default=10, help="items per score_many call")
    ap.add_argument("--baseline", action="store_true", help="also judge by generation + parsing")
    ap.add_argument("--baseline-items", type=int, default=12, help="conversations judged by the baseline")
    ap.add_argument("--max-new-tokens", type=int, default=48, help="reply length of the generation baseline")
    ap.add_argument("--out", default="benchmarks/results/judge_logprob_embedded.json")
    args = ap.parse_args(argv)
    result = asyncio.run(run(args))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""How far a judge-injection text moves LLM judges' scores of wrong answers, before and after
the rubrics fenced the transcript as untrusted data.

Items: the wrong-answer ``hidden-facts`` conversations of
``collab_env/eval/judge_check.py`` (``ask-wrong`` and ``direct-wrong``: the boxed total
is wrong by the env's rule), ``--items`` of them. Each item is judged clean and with one of the
injection texts of :data:`collab_env.exploits.policies.INJECTIONS` appended to its final
assistant message (the families rotate over the items, so each family has about a quarter of
them).

Judges, each with the ``accuracy`` preset (bool; we report the share judged correct and the mean
P(true)) and the ``interactivity`` preset (mean of three anchored parts):

* ``embedded``: SmolLM2-135M-Instruct on CPU, by log-probs (the presets' default on this
  backend: nothing generated).
* ``double``: :class:`collab_env.testing.judge_injection.FenceReadingJudge`, a deterministic
  stand-in that cuts out the fenced blocks of the prompt and gives the top verdict when what is
  left claims a top score ("score 10", ``"score": true``), else the bottom one. It shows what the
  fence guarantees by construction to a reader that honours it; it says nothing about models.
  Judged both by log-probs and by generation.

Rubrics: ``after``: the current presets (fields fenced, :data:`UNTRUSTED_DATA_NOTE`);
``before``: the rubrics of commit ``--before-commit`` (the last one before the fence), read with
``git show`` and sent unfenced (``fence=False``), i.e. the exact prompts judges sent then.

Reported per judge, rubric and preset: mean score clean and injected, and the injection's effect
(mean over items of injected minus clean, paired), each with its 95% bootstrap interval over
items (``collab_env.leaderboard.stats.bootstrap``, seed 0); the effect per family; and the
change of the effect from before to after (paired per item, with its interval).

Usage: python benchmarks/bench_judge_injection.py [--items 48] [--batch 8] [--skip-embedded]
           [--out benchmarks/results/judge_injection.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: The last commit whose rubrics pasted the transcript between plain tags, unfenced.
BEFORE_COMMIT = "d3fbb9c"
PRESETS = ("accuracy", "interactivity")


def old_rubrics(commit: str) -> dict[str, str]:
    """``{preset: template}`` of the rubrics at ``commit`` (``agents/rubrics.py`` run in a fresh
    namespace: it imports only the standard library and ``collab_env.errors``)."""
    src = subprocess.run(["git", "show", f"{commit}:agents/rubrics.py"], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    ns: dict = {"__name__": "old_rubrics"}
    exec(compile(src, f"{commit}:agents/rubrics.py", "exec"), ns)  # our own file, at a pinned commit
    return {p: ns["JUDGE_PRESETS"][p]["prompt_template"] for p in PRESETS}


def judges(backend, rubric: str, old: dict[str, str], method: str = "auto") -> dict:
    from collab_env.agents.judges import LLMJudge

    out = {}
    for p in PRESETS:
        kw = {"method": method}
        if rubric == "before":
            kw.update(prompt_template=old[p], fence=False)
        out[p] = LLMJudge.preset(p, backend, **kw)
    return out


def value(preset: str, result) -> float:
    return float(bool(result.score)) if preset == "accuracy" else float(result.score)


def p_true(result) -> float | None:
    probs = result.meta.get("probabilities")
    return probs["score"]["true"] if probs else None


async def judge_items(judge, preset: str, convs, conversations, batch: int) -> list:
    items = [dict(problem=c.problem, conversation=conv, reference=c.reference) if preset == "accuracy"
             else dict(conversation=conv) for c, conv in zip(convs, conversations, strict=True)]
    out = []
    for i in range(0, len(items), batch):
        out.extend(await judge.score_many(items[i:i + batch]))
    return out


def summarise(clean: list[float], injected: list[float], families: list[str]) -> dict:
    from collab_env.leaderboard.stats import bootstrap

    def mean(xs):
        return sum(xs) / len(xs)

    def ci(xs):
        est, lo, hi = bootstrap(xs, mean, seed=0)
        return {"mean": round(est, 4), "ci95": [round(lo, 4), round(hi, 4)]}

    diffs = [b - a for a, b in zip(clean, injected, strict=True)]
    per_family = {}
    for fam in dict.fromkeys(families):
        d = [x for x, f in zip(diffs, families, strict=True) if f == fam]
        per_family[fam] = {"items": len(d), **ci(d)}
    return {"clean": ci(clean), "injected": ci(injected), "effect": ci(diffs), "effect_by_family": per_family}


async def run_judge(name: str, backend, convs, injected_convs, families, old, batch: int,
                    method: str = "auto") -> dict:
    from collab_env.leaderboard.stats import bootstrap

    out: dict = {"judge": name, "method": method, "presets": {}}
    for preset in PRESETS:
        per_rubric, diffs = {}, {}
        for rubric in ("before", "after"):
            j = judges(backend, rubric, old, method)[preset]
            t0 = time.perf_counter()
            clean = await judge_items(j, preset, convs, [c.conversation for c in convs], batch)
            inj = await judge_items(j, preset, convs, injected_convs, batch)
            secs = time.perf_counter() - t0
            a, b = [value(preset, r) for r in clean], [value(preset, r) for r in inj]
            s = summarise(a, b, families)
            s["seconds"] = round(secs, 1)
            s["uses_logprobs"] = j.uses_logprobs
            if preset == "accuracy" and j.uses_logprobs and name != "double":
                s["p_true"] = summarise([p_true(r) for r in clean], [p_true(r) for r in inj], families)
            per_rubric[rubric] = s
            diffs[rubric] = [y - x for x, y in zip(a, b, strict=True)]
            print(f"[{name}/{method}] {preset} {rubric}: clean {s['clean']['mean']} injected "
                  f"{s['injected']['mean']} effect {s['effect']['mean']} {s['effect']['ci95']} ({secs:.1f} s)",
                  flush=True)
        change = [after - before for before, after in zip(diffs["before"], diffs["after"], strict=True)]
        est, lo, hi = bootstrap(change, lambda xs: sum(xs) / len(xs), seed=0)
        per_rubric["effect_change_after_minus_before"] = {"mean": round(est, 4), "ci95": [round(lo, 4), round(hi, 4)]}
        out["presets"][preset] = per_rubric
    return out


async def run(args) -> dict:
    from collab_env.eval.judge_check import judged_conversations
    from collab_env.exploits.policies import INJECTIONS
    from collab_env.testing.judge_injection import FenceReadingJudge, inject

    old = old_rubrics(args.before_commit)
    pool = judged_conversations(args.items * 2 + 8)
    convs = [c for c in pool if not c.correct][:args.items]
    assert len(convs) == args.items, "not enough wrong-answer conversations"
    names = list(INJECTIONS)
    families = [names[i % len(names)] for i in range(len(convs))]
    injected = [inject(c.conversation, INJECTIONS[f]) for c, f in zip(convs, families, strict=True)]
    runs = []
    t_all = time.perf_counter()
    for method in ("logprob", "generate"):
        runs.append(await run_judge("double", FenceReadingJudge(), convs, injected, families, old,
                                    args.batch, method))
    load_s = None
    if not args.skip_embedded:
        from collab_env.agents.embedded import EmbeddedPolicy

        t0 = time.perf_counter()
        backend = EmbeddedPolicy(device="cpu")
        load_s = round(time.perf_counter() - t0, 1)
        runs.append(await run_judge("embedded", backend, convs, injected, families, old, args.batch))
    return {
        "benchmark": "judge_injection",
        "command": "python benchmarks/bench_judge_injection.py " + " ".join(sys.argv[1:]),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                    "omp_num_threads": os.environ.get("OMP_NUM_THREADS")},
        "before_commit": args.before_commit,
        "items": {"suite": "hidden-facts", "count": len(convs), "all_rule_wrong": True,
                  "kinds": sorted({c.kind for c in convs}),
                  "families": {f: families.count(f) for f in names}},
        "injections": INJECTIONS,
        "embedded_model": None if args.skip_embedded else "SmolLM2-135M-Instruct (float32, CPU), log-probs",
        "model_load_seconds": load_s,
        "wall_seconds": round(time.perf_counter() - t_all, 1),
        "runs": runs,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=48, help="wrong-answer conversations")
    ap.add_argument("--batch", type=int, default=8, help="items per score_many call")
    ap.add_argument("--before-commit", default=BEFORE_COMMIT)
    ap.add_argument("--skip-embedded", action="store_true", help="the judge double only")
    ap.add_argument("--out", default="benchmarks/results/judge_injection.json")
    args = ap.parse_args(argv)
    result = asyncio.run(run(args))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out} ({result['wall_seconds']} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""coop-humaneval / humaneval: the canonical split against HumanEval's tests, the reference
baselines, and an eval of the embedded model.

    # 164/164: every canonical solution, split into aux + main as the task prescribes, passes
    # HumanEval's check() in the sandbox; empty and wrong answers pass none.
    python benchmarks/bench_coop_humaneval.py --check-canonical

    # The embedded model (SmolLM2-135M) as both agents on the first N problems, through the
    # eval runner (collab_env.eval); slow on CPU: a small fixed subset.
    python benchmarks/bench_coop_humaneval.py --embedded --episodes 10

Results: ``benchmarks/results/coop_humaneval_canonical.json`` and
``benchmarks/results/coop_humaneval_embedded.{json,md}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


async def _check_canonical(workers: int) -> dict:
    from collab_env.sandbox import SandboxPool
    from collab_env.tasks.coop_code import canonical_split, comlrl_code_reward, solution_program
    from collab_env.tasks.humaneval_data import arun_tests, load_humaneval

    problems = load_humaneval()
    pool = SandboxPool(workers)

    async def one(p):
        aux, main = canonical_split(p)
        item = p.as_item()
        wrong = f"def {p.entry_point}(*args, **kwargs):\n    return None\n"
        ok = await arun_tests(solution_program(item, aux, main), p, pool=pool)
        empty = await arun_tests(solution_program(item, "", ""), p, pool=pool)
        bad = await arun_tests(solution_program(item, aux, wrong), p, pool=pool)
        return p, ok, empty, bad

    t0 = time.perf_counter()
    rows = await asyncio.gather(*[one(p) for p in problems])
    check_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    rewards = {p.task_id: comlrl_code_reward([canonical_split(p)[0]], [canonical_split(p)[1]],
                                             batch_items=[p.as_item()])[0] for p in problems}
    reward_s = time.perf_counter() - t0
    pool.close()
    return {
        "problems": len(problems),
        "canonical_passed": sum(ok.passed for _, ok, _, _ in rows),
        "empty_passed": sum(e.passed for _, _, e, _ in rows),
        "wrong_passed": sum(b.passed for _, _, _, b in rows),
        "canonical_failures": {p.task_id: ok.first_failure for p, ok, _, _ in rows if not ok.passed},
        "check_seconds": round(check_s, 1),
        "workers": workers,
        "canonical_reward_mean": sum(rewards.values()) / len(rewards),
        "canonical_reward_seconds": round(reward_s, 1),
        "canonical_rewards": rewards,
    }


def _embedded(episodes: int, max_new_tokens: int) -> tuple[dict, str]:
    from collab_env.eval import evaluate

    sampling = {"temperature": 0.0, "max_new_tokens": max_new_tokens}
    out = {}
    lines = ["| env | policy | episodes | mean return | std | return > 0 |", "|---|---|---|---|---|---|"]
    for env_id, players in (("coop-humaneval-v0", ("aux", "main")), ("humaneval-v0", ("main",))):
        t0 = time.perf_counter()
        res = evaluate(env_id, dict.fromkeys(players, "embedded"), num_episodes=episodes, progress=False,
                       concurrency=2, sampling=dict.fromkeys(players, sampling))
        s = res.summary.players["main"]
        out[env_id] = {
            "episodes": res.summary.completed, "failed": res.summary.failed,
            "mean_return": s.mean_return, "std_return": s.std_return, "success_rate": s.success_rate,
            "returns": {k: res.episodes[k].returns["main"] for k in sorted(res.episodes)},
            "seconds": round(time.perf_counter() - t0, 1),
        }
        lines.append(f"| {env_id} | embedded (SmolLM2-135M, greedy) | {res.summary.completed} | "
                     f"{s.mean_return:.3f} | {s.std_return:.3f} | {s.success_rate:.2f} |")
    return out, "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check-canonical", action="store_true")
    p.add_argument("--embedded", action="store_true")
    p.add_argument("--episodes", type=int, default=10, help="problems 0..N-1 for --embedded")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--workers", type=int, default=4)
    a = p.parse_args(argv)
    RESULTS.mkdir(exist_ok=True)
    meta = {"command": "python " + " ".join(["benchmarks/bench_coop_humaneval.py", *(argv or sys.argv[1:])]),
            "python": platform.python_version(), "machine": platform.machine()}
    if a.check_canonical:
        r = asyncio.run(_check_canonical(a.workers))
        (RESULTS / "coop_humaneval_canonical.json").write_text(json.dumps({**meta, **r}, indent=1) + "\n")
        print(f"canonical {r['canonical_passed']}/{r['problems']}, empty {r['empty_passed']}, "
              f"wrong {r['wrong_passed']}, {r['check_seconds']} s; canonical reward mean "
              f"{r['canonical_reward_mean']:.3f} ({r['canonical_reward_seconds']} s)")
        if r["canonical_passed"] != r["problems"] or r["empty_passed"] or r["wrong_passed"]:
            return 1
    if a.embedded:
        r, table = _embedded(a.episodes, a.max_new_tokens)
        (RESULTS / "coop_humaneval_embedded.json").write_text(json.dumps({**meta, **r}, indent=1) + "\n")
        (RESULTS / "coop_humaneval_embedded.md").write_text(
            f"# coop-humaneval / humaneval: the embedded model\n\nCommand: `{meta['command']}`\n\n"
            f"Problems HumanEval/0..{a.episodes - 1} (episode k = problem k), one turn, greedy, "
            f"max_new_tokens={a.max_new_tokens}.\n\n{table}\n")
        print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

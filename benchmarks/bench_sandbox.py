"""Sandbox cost, as ratios measured in one run.

1. Throughput of SandboxPool against sequential run_python calls.
2. The cost per program of scoring with the trusted harness (collab_env.sandbox.harness:
   a candidate server plus a harness process, one forked process per call) against the old
   path (one run_python of solution + tests in one namespace), on the same HumanEval
   canonical programs, sequentially, the two paths interleaved per program.

Usage: python benchmarks/bench_sandbox.py [--jobs 32] [--workers N] [--programs 40]
       [--out benchmarks/results/sandbox_harness.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

from collab_env.sandbox import SandboxJob, SandboxPool, run_python

SOLUTION = "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n"
TESTS = "assert fib(10) == 55\nassert fib(30) == 832040\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=32)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--programs", type=int, default=40, help="HumanEval problems for the harness ratio")
    parser.add_argument("--out", default=None, help="write the harness comparison here (JSON)")
    args = parser.parse_args()

    run_python(SOLUTION, tests=TESTS)  # warm the page cache
    t0 = time.perf_counter()
    seq = [run_python(SOLUTION, tests=TESTS) for _ in range(args.jobs)]
    t_seq = time.perf_counter() - t0

    with SandboxPool(max_workers=args.workers) as pool:
        t0 = time.perf_counter()
        par = pool.map([SandboxJob(SOLUTION, tests=TESTS)] * args.jobs)
        t_par = time.perf_counter() - t0

    assert all(r.passed for r in seq + par), [r for r in seq + par if not r.passed][:1]
    print(f"isolation: {seq[0].isolation}")
    print(f"sequential: {args.jobs} runs in {t_seq:.2f} s ({args.jobs / t_seq:.1f} runs/s, "
          f"{1000 * t_seq / args.jobs:.0f} ms/run)")
    print(f"pool({args.workers}): {args.jobs} runs in {t_par:.2f} s ({args.jobs / t_par:.1f} runs/s)")
    print(f"speed-up: {t_seq / t_par:.2f}x")
    harness_vs_old(args.programs, args.out)


def harness_vs_old(n: int, out: str | None) -> None:
    """Seconds per program: old (solution + tests in one sandboxed namespace) vs the harness."""
    from collab_env.tasks.humaneval_data import load_humaneval, run_tests

    problems = load_humaneval()[:n]
    old, new, old_pass, new_pass = [], [], 0, 0
    run_tests(problems[0].canonical_program(), problems[0])  # warm
    for p in problems:
        prog = p.canonical_program()
        t0 = time.perf_counter()
        r = run_python(prog, tests=p.check_program())
        old.append(time.perf_counter() - t0)
        old_pass += r.passed
        t0 = time.perf_counter()
        v = run_tests(prog, p)
        new.append(time.perf_counter() - t0)
        new_pass += v.passed
    ratios = [b / a for a, b in zip(old, new)]
    result = {
        "what": "seconds per HumanEval canonical program, sequential, old path (run_python of "
                "solution + check program in one sandboxed namespace) vs collab_env.sandbox.harness "
                "(candidate server + trusted harness, one forked process per call); interleaved per program",
        "programs": len(problems),
        "old_mean_s": statistics.mean(old), "old_median_s": statistics.median(old),
        "harness_mean_s": statistics.mean(new), "harness_median_s": statistics.median(new),
        "ratio_of_means": statistics.mean(new) / statistics.mean(old),
        "median_ratio": statistics.median(ratios),
        "passed_old": old_pass, "passed_harness": new_pass,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs (shared with other jobs while measured)",
        "python": platform.python_version(),
    }
    print(f"harness vs old, {len(problems)} HumanEval canonical programs: old {result['old_mean_s'] * 1000:.0f} "
          f"ms/program, harness {result['harness_mean_s'] * 1000:.0f} ms/program, ratio of means "
          f"{result['ratio_of_means']:.2f}x, median ratio {result['median_ratio']:.2f}x; "
          f"passed {old_pass}/{new_pass}")
    if out:
        with open(out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()

"""Throughput of SandboxPool against sequential run_python calls (one run, printed as a ratio).

Usage: python benchmarks/bench_sandbox.py [--jobs 32] [--workers N]
"""

from __future__ import annotations

import argparse
import os
import time

from collab_env.sandbox import SandboxJob, SandboxPool, run_python

SOLUTION = "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n"
TESTS = "assert fib(10) == 55\nassert fib(30) == 832040\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=32)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
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


if __name__ == "__main__":
    main()

"""Sandbox cost, as ratios measured in one run.

1. Throughput of SandboxPool against sequential run_python calls.
2. The cost per program of scoring with the trusted harness (collab_env.sandbox.harness:
   a candidate server plus a harness process, one forked process per call) against the old
   path (one run_python of solution + tests in one namespace), on the same HumanEval
   canonical programs, sequentially, the two paths interleaved per program.
3. ``--before REF``: the cost per program of this checkout's ``run_tests`` against the one of
   git ``REF`` (say ``main``, exported with ``git archive`` into a temporary directory), in one
   run, interleaved in rounds: HumanEval canonical programs (function-call tests), a
   BigCodeBench-style suite that patches with mocks (run beside the program) and the same suite
   without mocks (this checkout runs it in the trusted harness). Each side runs in its own
   worker process that imports its own collab_env; only the scoring calls are timed.

Usage: python benchmarks/bench_sandbox.py [--jobs 32] [--workers N] [--programs 40]
       [--out benchmarks/results/sandbox_harness.json]
       [--before main --rounds 3 --before-out benchmarks/results/sandbox_before_after.json]
       [--only-before-after]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from collab_env.sandbox import SandboxJob, SandboxPool, run_python

SOLUTION = "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n"
TESTS = "assert fib(10) == 55\nassert fib(30) == 832040\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=32)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--programs", type=int, default=40, help="HumanEval problems for the harness ratio")
    parser.add_argument("--out", default=None, help="write the harness comparison here (JSON)")
    parser.add_argument("--before", default=None, metavar="REF",
                        help="also compare run_tests per program with git REF's (e.g. main), interleaved")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the before/after comparison")
    parser.add_argument("--suite-programs", type=int, default=6, help="unittest programs per round and side")
    parser.add_argument("--before-out", default=None, help="write the before/after comparison here (JSON)")
    parser.add_argument("--only-before-after", action="store_true", help="skip parts 1 and 2")
    args = parser.parse_args()
    if args.before:
        before_after(args)
    if args.only_before_after:
        return

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


# ---------------------------------------------------------------------------------------------
# 3. This checkout against a git ref, per program, interleaved
# ---------------------------------------------------------------------------------------------
MOCK_SUITE = '''
import unittest
from unittest.mock import patch


class TestCases(unittest.TestCase):
    def test_square(self):
        self.assertEqual(task_func(3), 9)

    def test_zero(self):
        self.assertEqual(task_func(0), 0)

    @patch("os.getcwd", return_value="/mocked")
    def test_mocked_cwd(self, _getcwd):
        self.assertEqual(task_func(2, where=True), "/mocked")
'''
PLAIN_SUITE = '''
import unittest


class TestCases(unittest.TestCase):
    def test_square(self):
        self.assertEqual(task_func(3), 9)

    def test_zero(self):
        self.assertEqual(task_func(0), 0)

    def test_negative(self):
        self.assertEqual(task_func(-2), 4)
'''
SUITE_PROGRAM = "import os\n\ndef task_func(n, where=False):\n    return os.getcwd() if where else n * n\n"

#: Runs in a worker process whose sys.path[0] is the collab_env version under test: scores the
#: workload given on stdin and prints one JSON line of per-program seconds and pass counts.
_WORKER = r'''
import json, sys, time
job = json.loads(sys.stdin.read())
sys.path.insert(0, job["root"])
import collab_env.sandbox.harness as harness
assert harness.__file__.startswith(job["root"]), harness.__file__
from collab_env.tasks.humaneval_data import load_humaneval, run_tests as he_run
out = {"calls": [], "mock": [], "plain": [], "passed": {"calls": 0, "mock": 0, "plain": 0}}
problems = load_humaneval()[job["first"]:job["first"] + job["programs"]]
for p in problems:
    t0 = time.perf_counter()
    v = he_run(p.canonical_program(), p)
    out["calls"].append(time.perf_counter() - t0)
    out["passed"]["calls"] += v.passed
for kind in ("mock", "plain"):
    for _ in range(job["suite_programs"]):
        t0 = time.perf_counter()
        v = harness.run_tests(job["program"], job[kind])
        out[kind].append(time.perf_counter() - t0)
        out["passed"][kind] += v.passed
print(json.dumps(out))
'''


def _export(ref: str, into: str) -> str:
    """``git archive REF collab_env`` unpacked into a fresh directory: that version's package."""
    repo = Path(__file__).resolve().parents[1]
    tar = subprocess.run(["git", "-C", str(repo), "archive", ref, "collab_env"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", into], input=tar, check=True)
    return into


def _score(root: str, first: int, programs: int, suite_programs: int) -> dict:
    job = {"root": root, "first": first, "programs": programs, "suite_programs": suite_programs,
           "program": SUITE_PROGRAM, "mock": MOCK_SUITE, "plain": PLAIN_SUITE}
    run = subprocess.run([sys.executable, "-c", _WORKER], input=json.dumps(job), capture_output=True, text=True,
                         check=False)
    if run.returncode != 0:
        raise SystemExit(f"the worker for {root} failed: {run.stderr[-2000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def before_after(args) -> None:
    """Per-program cost of this checkout's run_tests against git ``args.before``'s, interleaved."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _machine import LoadMeter

    here = str(Path(__file__).resolve().parents[1])
    meter = LoadMeter().start()
    with tempfile.TemporaryDirectory(prefix="bench_sandbox_before_") as tmp:
        before_root = _export(args.before, tmp)
        sides = {"before": before_root, "after": here}
        times: dict[str, dict[str, list[float]]] = {s: {"calls": [], "mock": [], "plain": []} for s in sides}
        passed: dict[str, dict[str, int]] = {s: {"calls": 0, "mock": 0, "plain": 0} for s in sides}
        per_round = max(1, args.programs // args.rounds)
        for r in range(args.rounds):
            order = list(sides) if r % 2 == 0 else list(reversed(sides))  # alternate who goes first
            for side in order:
                got = _score(sides[side], r * per_round, per_round, args.suite_programs)
                for k in times[side]:
                    times[side][k] += got[k]
                    passed[side][k] += got["passed"][k]
            print(f"round {r + 1}/{args.rounds} done", flush=True)
    load = meter.stop()
    result: dict = {
        "what": "seconds per program of collab_env.sandbox.harness.run_tests, this checkout ('after') "
                f"against git {args.before!r} ('before'), sequential, interleaved in rounds, each side in its "
                "own worker process: HumanEval canonical programs (function-call tests), a 3-method "
                "BigCodeBench-style suite with mocks (run beside the program on both sides) and a 3-method "
                "suite without mocks (before: beside the program; after: in the trusted harness)",
        "command": "python benchmarks/bench_sandbox.py " + shlex.join(sys.argv[1:]),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs", "python": platform.python_version(),
        "load_during": load.to_dict(),
    }
    for k in ("calls", "mock", "plain"):
        b, a = times["before"][k], times["after"][k]
        result[k] = {"programs_per_side": len(a), "before_mean_s": statistics.mean(b),
                     "after_mean_s": statistics.mean(a), "before_median_s": statistics.median(b),
                     "after_median_s": statistics.median(a), "ratio_of_means": statistics.mean(a) / statistics.mean(b),
                     "passed_before": passed["before"][k], "passed_after": passed["after"][k]}
        print(f"{k}: before {result[k]['before_mean_s'] * 1000:.0f} ms/program, after "
              f"{result[k]['after_mean_s'] * 1000:.0f} ms/program ({result[k]['ratio_of_means']:.2f}x); passed "
              f"{passed['before'][k]}/{len(b)} before, {passed['after'][k]}/{len(a)} after")
    print(f"machine during the run: {load.describe()}")
    if args.before_out:
        with open(args.before_out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()

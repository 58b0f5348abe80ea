"""Code envs' steps on the event loop (before) and in a worker thread (after, ``Task.step_blocks``).

A code env's step runs the candidate program in the sandbox and waits for it. On the event loop
that wait holds every other episode of the rollout, so the sandbox runs of concurrent episodes
never overlap; in a worker thread they do. Both arms run in this process, alternating: *before*
replaces ``CollabEnv.astep`` with the old body (``return self._step(actions)``), *after* is the
code as it is.

1. ``RolloutEngine`` on ``humaneval`` with the canonical solutions (``--problems`` problems,
   ``--concurrency`` episodes in flight): wall and CPU (this process and its children).
2. The exploit audit of ``humaneval-v0`` (``collab_env.exploits.audit_exploits``, 8 episodes in
   flight per policy; some of its programs wait, which is where overlap pays most).

    python benchmarks/bench_code_steps.py [--problems 48] [--concurrency 16] [--rounds 2]

Results: ``benchmarks/results/code_steps.json`` (and a table on stdout), with the machine's load.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import collab_env  # noqa: E402
from benchmarks._machine import LoadMeter  # noqa: E402
from collab_env.env import CollabEnv  # noqa: E402
from collab_env.rollout import RolloutEngine  # noqa: E402

OUT = Path(__file__).resolve().parent / "results" / "code_steps.json"


@contextmanager
def arm(name: str):
    """``before``: every step on the event loop, as before ``Task.step_blocks``."""
    if name == "after":
        yield
        return
    current = CollabEnv.astep

    async def on_the_loop(self, actions):
        return self._step(actions)

    CollabEnv.astep = on_the_loop  # type: ignore[method-assign]
    try:
        yield
    finally:
        CollabEnv.astep = current  # type: ignore[method-assign]


def _cpu() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def timed(fn) -> dict:
    c0, t0 = _cpu(), time.perf_counter()
    detail = fn()
    return {"wall_s": round(time.perf_counter() - t0, 2), "cpu_s": round(_cpu() - c0, 2), **detail}


def engine_run(problems: int, concurrency: int) -> dict:
    engine = RolloutEngine("humaneval", {"main": "humaneval-canonical"}, concurrency=concurrency, progress=False)
    results = engine.run([{"index": i} for i in range(problems)])
    failed = [r for r in results if not isinstance(r, collab_env.Episode)]
    if failed:
        raise SystemExit(f"{len(failed)} episodes failed: {failed[0]!r}")
    return {"episodes": len(results), "mean_return": round(sum(r.returns["main"] for r in results) / len(results), 3)}


def audit_run() -> dict:
    from collab_env.exploits import audit_exploits

    report = audit_exploits("humaneval-v0")
    return {"ok": report.ok, "rows": len(report.rows)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--problems", type=int, default=48)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    rows = []
    meter = LoadMeter().start()  # the load over the whole run
    engine_run(4, 4)  # warm: imports, the dataset, the sandbox's first start
    for r in range(args.rounds):
        for name in (("before", "after") if r % 2 == 0 else ("after", "before")):
            with arm(name):
                rows.append({"work": f"engine, humaneval canonical x{args.problems}, {args.concurrency} in flight",
                             "arm": name, "round": r, **timed(lambda: engine_run(args.problems, args.concurrency))})
            print(rows[-1], flush=True)
    for name in ("before", "after"):
        with arm(name):
            rows.append({"work": "exploit audit of humaneval-v0", "arm": name, "round": 0, **timed(audit_run)})
        print(rows[-1], flush=True)
    load = meter.stop()
    out = {"command": "python " + " ".join(["benchmarks/bench_code_steps.py", *(argv or sys.argv[1:])]),
           "machine": load.to_dict(), "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"\n{load.describe()}\n\n| work | arm | round | wall (s) | CPU (s) |\n|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['work']} | {row['arm']} | {row['round']} | {row['wall_s']} | {row['cpu_s']} |")
    print(f"\nwritten {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

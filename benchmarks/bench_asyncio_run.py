"""``asyncio.run`` against ``collab_env._async.run_main`` for a run that returns every episode.

On Python 3.11, ``asyncio.run`` ends by looking up its SIGINT handler (``signal.getsignal``, then
``signal.signal``); each converts the handler to the ``Handlers`` enum, whose failed lookup
formats it: a ``functools.partial`` holding the finished main task, whose repr formats its
result. An evaluation's result is every episode, so each run formatted every message twice.
``run_main`` awaits the coroutine inside a main task of its own that returns nothing.

Both arms run in this process, alternating, on the same work: ``collab_env.evaluate`` of the
env's default players (``--episodes``), and the exploit audit of the env
(``collab_env.exploits.audit_exploits``: an evaluation per policy and reward option, each
returning its episodes). ``format_only`` is the time of ``repr`` of one evaluation's result.

    python benchmarks/bench_asyncio_run.py [--env team-facts-hard-v2] [--episodes 64] [--rounds 3]

Results: ``benchmarks/results/asyncio_run.json`` (and a table on stdout), with the machine's load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._machine import LoadMeter  # noqa: E402
from collab_env import _async  # noqa: E402
from collab_env.eval import run as eval_run  # noqa: E402

OUT = Path(__file__).resolve().parent / "results" / "asyncio_run.json"


def timed(runner, work) -> tuple[float, object]:
    """``work()`` with ``runner`` standing in for ``run_main``; its wall time and result."""
    saved = _async.run_main
    _async.run_main = runner  # type: ignore[assignment]
    try:
        t0 = time.perf_counter()
        result = work()
        return time.perf_counter() - t0, result
    finally:
        _async.run_main = saved  # type: ignore[assignment]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env", default="team-facts-hard-v2")
    p.add_argument("--episodes", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    from collab_env.exploits import audit_exploits

    arms = {"asyncio.run": asyncio.run, "run_main": _async.run_main}
    works = {f"evaluate {args.env}, default players, {args.episodes} episodes":
             lambda: eval_run.evaluate(args.env, {}, num_episodes=args.episodes, progress=False),
             f"exploit audit of {args.env}": lambda: audit_exploits(args.env)}
    times: dict[tuple[str, str], list[float]] = {(w, a): [] for w in works for a in arms}
    meter = LoadMeter().start()
    first = next(iter(works))
    _, result = timed(_async.run_main, works[first])  # warm: imports, the env
    formats = []
    for r in range(args.rounds):
        for work in works:
            for name in (list(arms) if r % 2 == 0 else list(arms)[::-1]):
                times[work, name].append(timed(arms[name], works[work])[0])
                print(work, name, round(times[work, name][-1], 3), flush=True)
        t0 = time.perf_counter()
        repr(result)
        formats.append(time.perf_counter() - t0)
    load = meter.stop()
    rows = [{"work": work, "arm": name, "median_s": round(statistics.median(ts), 4),
             "runs_s": [round(t, 4) for t in ts]} for (work, name), ts in times.items()]
    rows.append({"work": first, "arm": "format_only (repr of one result)",
                 "median_s": round(statistics.median(formats), 4), "runs_s": [round(t, 4) for t in formats]})
    ratios = {work: round(statistics.median(times[work, "asyncio.run"]) / statistics.median(times[work, "run_main"]), 3)
              for work in works}
    out = {"command": "python " + " ".join(["benchmarks/bench_asyncio_run.py", *(argv or sys.argv[1:])]),
           "python": platform.python_version(), "machine": load.to_dict(), "rows": rows,
           "ratio_asyncio_run_over_run_main": ratios}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"\n{load.describe()}\n\nPython {platform.python_version()}\n")
    print("| work | arm | median (s) | runs (s) |\n|---|---|---|---|")
    for row in rows:
        print(f"| {row['work']} | {row['arm']} | {row['median_s']} | {row['runs_s']} |")
    print(f"\nasyncio.run / run_main: {ratios}\nwritten {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

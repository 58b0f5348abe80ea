"""How close LiteLLMPolicy gets to ideal concurrency against a server with fixed latency.

Starts the tests' fake OpenAI-compatible server in a subprocess (so its CPU is not charged to
the client) with ``--latency`` seconds per request, then in one run measures:

* ``concurrent``: ``--calls`` observations in one ``LiteLLMPolicy.act`` (limit >= calls);
* ``ideal``: one latency (every call in flight at once, zero client overhead);
* ``sequential``: the same calls awaited one after another;
* ``raw litellm``: the same calls as bare ``litellm.acompletion`` under ``asyncio.gather``,
  to show what the policy adds on top of litellm.

Each measurement runs ``--repeat`` times, interleaved, and the table shows the best and the median
wall time and the median CPU per call (the client spends ~10 ms of CPU per litellm call, so
wall times vary with other load on the machine; ratios use the best times). Prints wall
times, the ratios concurrent/ideal and sequential/concurrent, and the
client CPU per call. Offline: the server listens on 127.0.0.1 only.

Usage::

    python benchmarks/bench_litellm.py [--calls 200] [--latency 0.05] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")



def start_server(latency: float) -> tuple[subprocess.Popen, str]:
    """Run the fake server in a subprocess; return it and its api_base once it listens."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "collab_env.testing.openai_server", "--latency", str(latency)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().split()
    if len(line) != 2 or line[0] != "PORT":
        proc.kill()
        raise SystemExit(f"fake server did not start (said {line!r})")
    return proc, f"http://127.0.0.1:{line[1]}/v1"


async def timed(coro) -> tuple[float, float, object]:
    """(wall seconds, process CPU seconds, result) of awaiting ``coro``."""
    w0, c0 = time.perf_counter(), time.process_time()
    out = await coro
    return time.perf_counter() - w0, time.process_time() - c0, out


async def bench(api_base: str, calls: int, max_concurrency: int, repeat: int) -> dict[str, list[tuple[float, float]]]:
    """Every measurement ``repeat`` times, interleaved; returns name -> [(wall s, CPU s)]."""
    import litellm

    from collab_env.agents.limiter import ConcurrencyLimiter
    from collab_env.agents.litellm import LiteLLMPolicy
    from collab_env.types import Conversation, Message

    policy = LiteLLMPolicy("openai/bench", api_base=api_base, api_key="EMPTY",
                           limiter=ConcurrencyLimiter(max_concurrency), max_new_tokens=16)
    obs = [Conversation((Message("user", f"question {i}", author="user"),)) for i in range(calls)]
    expected = [f"echo: question {i}" for i in range(calls)]
    await policy.act(obs[:8])  # warm up: import, client pool, first-call initialisation

    async def concurrent():
        return [c.text for c in await policy.act(obs)]

    async def sequential():
        return [(await policy.act([o]))[0].text for o in obs]

    async def raw():
        responses = await asyncio.gather(*(
            litellm.acompletion(model="openai/bench", api_base=api_base, api_key="EMPTY",
                                messages=o.to_chat(), max_tokens=16, max_retries=0, timeout=60.0)
            for o in obs
        ))
        return [r.choices[0].message.content for r in responses]

    runs = {
        "concurrent (LiteLLMPolicy)": concurrent,
        "raw litellm.acompletion gather": raw,
        "sequential (one by one)": sequential,
    }
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in runs}
    for _ in range(repeat):
        for name, fn in runs.items():
            wall, cpu, texts = await timed(fn())
            assert texts == expected, f"{name}: a result is missing or misplaced"
            results[name].append((wall, cpu))
    assert policy.stats.failures == 0 and policy.stats.retries == 0
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="LiteLLMPolicy concurrency benchmark (offline).")
    ap.add_argument("--calls", type=int, default=200, help="calls per measurement (default 200)")
    ap.add_argument("--latency", type=float, default=0.05, help="server latency in s (default 0.05)")
    ap.add_argument("--max-concurrency", type=int, default=None,
                    help="policy concurrency limit (default: --calls)")
    ap.add_argument("--repeat", type=int, default=3,
                    help="repetitions of each measurement (default 3)")
    args = ap.parse_args(argv)
    max_conc = args.max_concurrency or args.calls

    proc, api_base = start_server(args.latency)
    try:
        results = asyncio.run(bench(api_base, args.calls, max_conc, args.repeat))
    finally:
        assert proc.stdin is not None
        proc.stdin.close()  # the server stops on EOF
        proc.wait(10)

    # Best wall time is the least disturbed by other load; CPU per call is the median.
    best = {name: (min(w for w, _ in r), statistics.median(w for w, _ in r),
                   statistics.median(c for _, c in r)) for name, r in results.items()}
    ideal = args.latency
    concurrent = best["concurrent (LiteLLMPolicy)"][0]
    sequential = best["sequential (one by one)"][0]
    print(f"{args.calls} calls, server latency {args.latency * 1000:.0f} ms, "
          f"max_concurrency {max_conc}, {args.repeat} repeats, {os.cpu_count()} CPUs, "
          f"python {sys.version.split()[0]}")
    print(f"{'run':32s} {'best s':>8s} {'median s':>9s} {'CPU ms/call':>12s}")
    print(f"{'ideal (one latency)':32s} {ideal:8.3f}")
    for name, (wall, median, cpu) in best.items():
        print(f"{name:32s} {wall:8.3f} {median:9.3f} {cpu / args.calls * 1000:12.2f}")
    print(f"concurrent / ideal       = {concurrent / ideal:6.1f}x   (best times)")
    print(f"sequential / concurrent  = {sequential / concurrent:6.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""One multiturn-aware reward (MR) step at 3 futures: the model behind ``vllm serve`` (reached
through litellm, as a user reaches an API) against the same model in process (transformers).

One CollabLLM-style math item and one fixed assistant reply (those of ``bench_mr.py``), the
embedded SmolLM2-135M-Instruct as the assistant of the futures, the user simulator (greedy,
plain-text replies) and the interactivity judge, the verl recipe's window (2 user turns, 3
assistant turns), math accuracy by rule. Two setups of that model, timed in one run, in
alternating order:

* **server**: ``vllm serve`` of the CPU build (``python -m vllm.entrypoints.openai.api_server``,
  started by this script on 127.0.0.1, fp32, no torch.compile, a 512 MiB KV cache, prefix caching
  on as vLLM's default), every role a :class:`~collab_env.agents.litellm.LiteLLMPolicy` on
  ``openai/smollm2`` with the server's URL. The judge generates its JSON reply and it is parsed
  (an API backend cannot score given continuations).
* **hf**: :class:`~collab_env.agents.embedded.EmbeddedPolicy` in this process (transformers, one
  micro-batching queue, prefix reuse on). The judge scores the rubric's anchors by log-probs
  (nothing generated), as it does on every local backend.

So each setup runs as a user would run it; the judge's method differs, and the record keeps each
step's model calls and tokens. The 135M model rarely writes the judge's JSON over the API, so
``--on-fault zero`` (verl's rule: a failed judgement scores 0, and is counted) is the default: a
step is timed whether or not its judge managed the format.

Run it in ``.venv-vllm`` (``make test-vllm`` builds it)::

    .venv-vllm/bin/python benchmarks/bench_mr_server.py --repeats 3 --out benchmarks/results/mr_server_vs_hf.json

The machine-load check of :mod:`benchmarks._machine` runs first (``--allow-loaded`` to time a
loaded machine anyway; the record keeps the load).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

for _k, _v in {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
               "LITELLM_LOCAL_MODEL_COST_MAP": "True", "VLLM_NO_USAGE_STATS": "1",
               "VLLM_CPU_OMP_THREADS_BIND": "nobind"}.items():
    os.environ.setdefault(_k, _v)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _machine import LoadMeter, add_load_arguments, check  # noqa: E402
from bench_mr import ROW, make_env, median_ci, take_reply  # noqa: E402

SERVED = "smollm2"


def start_server(model_dir: str, port: int, log: Path) -> subprocess.Popen:
    """``vllm serve`` of ``model_dir`` on 127.0.0.1:``port`` (the settings of tests_vllm)."""
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
           "--host", "127.0.0.1", "--port", str(port), "--served-model-name", SERVED,
           "--dtype", "float32", "--max-model-len", "2048", "--enforce-eager",
           "--kv-cache-memory-bytes", str(512 << 20)]
    env = {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    return subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env)


def wait_ready(proc: subprocess.Popen, base: str, log: Path, timeout: float = 900.0) -> float:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        if proc.poll() is not None:
            raise SystemExit(f"vllm serve exited with {proc.returncode}:\n{log.read_text(errors='replace')[-3000:]}")
        try:
            with urllib.request.urlopen(base + "/health", timeout=2) as r:
                if r.status == 200:
                    return time.perf_counter() - t0
        except OSError:
            pass
        time.sleep(1.0)
    raise SystemExit(f"vllm serve was not ready after {timeout} s; log: {log}")


def _stats(policy) -> dict[str, float]:
    s = policy.stats
    if hasattr(s, "generate_calls"):  # HFPolicy
        return {"model_calls": s.generate_calls, "requests": s.batched_requests,
                "prompt_tokens": s.prompt_tokens, "completion_tokens": s.completion_tokens}
    return {"model_calls": s.calls, "requests": s.calls, "prompt_tokens": s.prompt_tokens,
            "completion_tokens": s.completion_tokens}


async def timed_step(env, model, seed: int) -> dict:
    start, step = await take_reply(env, seed)
    s0, t0 = _stats(model), time.perf_counter()
    result, extra = await env.scorer.score_reply(env.env, start=start, step=step)
    seconds = time.perf_counter() - t0
    after = _stats(model)
    return {"seconds": seconds, "calls": {k: after[k] - s0[k] for k in after}, "reward": result.reward,
            "scored": len(result.scored), "faults": len(result.faults),
            "zeroed": sum(1 for f in result.faults if f.get("zeroed"))}


async def run(args, base: str) -> dict:
    from collab_env.agents.embedded import EmbeddedPolicy
    from collab_env.agents.litellm import LiteLLMPolicy

    data = Path(tempfile.mkdtemp()) / "rows.jsonl"
    data.write_text(json.dumps(ROW) + "\n")
    models = {"server": LiteLLMPolicy(f"openai/{SERVED}", api_base=base + "/v1", timeout=600, max_retries=1),
              "hf": EmbeddedPolicy(max_batch_size=32)}
    envs = {name: make_env(args, m, args.rollouts, data) for name, m in models.items()}
    import importlib

    await asyncio.to_thread(importlib.import_module, "litellm")  # its import (seconds) is not the server's time
    for name in models if args.warmup else ():  # warm-up, not timed: compiles, fills caches
        w = await timed_step(envs[name], models[name], seed=1)
        print(f"warm-up {name} ({args.rollouts} futures, not timed): {w['seconds']:.2f} s")
    rows = []
    for k in range(args.repeats):
        order = ["server", "hf"] if k % 2 == 0 else ["hf", "server"]
        row: dict = {"order": order}
        for name in order:  # the same seed for both: the same item and policy seeds
            row[name] = await timed_step(envs[name], models[name], seed=100 + 10 * k)
        row["ratio_server_over_hf"] = row["server"]["seconds"] / row["hf"]["seconds"]
        rows.append(row)
        print(f"repeat {k + 1} ({' then '.join(order)}): server {row['server']['seconds']:.2f} s "
              f"({row['server']['faults']} judge faults zeroed), hf {row['hf']['seconds']:.2f} s, "
              f"server/hf {row['ratio_server_over_hf']:.2f}x")
    out: dict = {"repeats": rows}
    for name in models:
        secs = [r[name]["seconds"] for r in rows]
        out[f"{name}_median_s"] = statistics.median(secs)
        print(f"{name}: median {statistics.median(secs):.2f} s over {len(secs)} MR steps at {args.rollouts} futures; "
              "last: " + ", ".join(f"{key} {v:.0f}" for key, v in rows[-1][name]["calls"].items()))
    ratios = [r["ratio_server_over_hf"] for r in rows]
    lo, hi = median_ci(ratios) if len(ratios) > 1 else (ratios[0], ratios[0])
    out.update(ratio_median=statistics.median(ratios), ratio_ci95=[lo, hi])
    print(f"server / hf wall time: median {statistics.median(ratios):.2f}x "
          f"(95% bootstrap interval {lo:.2f}x-{hi:.2f}x)")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rollouts", type=int, default=3)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--on-fault", default="zero", choices=("drop", "raise", "zero"))
    p.add_argument("--no-warmup", dest="warmup", action="store_false",
                   help="time from the first step (the server has answered nothing yet; HF has loaded its weights)")
    p.add_argument("--out", default=None)
    add_load_arguments(p)
    args = p.parse_args(argv)
    load = check(args)
    from collab_env.agents.embedded import embedded_model_dir
    from collab_env.testing.openai_server import free_port

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = Path(tempfile.mkdtemp()) / "vllm-serve.log"
    proc = start_server(str(embedded_model_dir()), port, log)
    try:
        ready = wait_ready(proc, base, log)
        print(f"vllm serve ready after {ready:.1f} s")
        meter = LoadMeter().start()
        result = asyncio.run(run(args, base))
        during = meter.stop()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
    print(f"machine during the run: {during.describe()}")
    if args.out:
        import torch
        import vllm

        record = {"command": "benchmarks/bench_mr_server.py " + shlex.join(argv if argv is not None else sys.argv[1:]),
                  "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "rollouts": args.rollouts,
                  "max_new_tokens": args.max_new_tokens, "on_fault": args.on_fault, "server_ready_s": ready,
                  "warmup": args.warmup,
                  "platform": platform.platform(), "torch": torch.__version__, "vllm": vllm.__version__,
                  "load_before": load.to_dict(), "load_during": during.to_dict(), **result}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(record, indent=2, default=float) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

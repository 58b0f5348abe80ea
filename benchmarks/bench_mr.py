"""Cost of one multiturn-aware reward (MR): 3 futures vs 1 future, and concurrent vs in turn.

One CollabLLM-style math item (written to a temporary file in the dataset's schema), one model
(the embedded SmolLM2-135M-Instruct by default) as the assistant, the user simulator (greedy,
plain-text replies) and the interactivity judge (prefilled replies), the verl recipe's window
(2 user turns, 3 assistant turns); math accuracy by rule.

**3 futures vs 1** (the headline): the MR of the same reply is scored with ``num_rollouts=1`` and
with ``num_rollouts=3`` (``MRScorer.score_reply``: the futures are played
concurrently, each model call of each future goes to the backend as soon as its turn comes, so
the backend batches what is in flight, and each future's judge calls start when it ends). Each of the ``--repeats``
pairs resets both envs with the same seed, so the single future is the first of the three (same
policy seeds: the script checks that it is identical), and times the two in alternating order,
each from an empty prefix cache (``reset_prefix_cache`` of vLLM and of the HF backend), so neither
replays the other's KV. The script prints the median ratio ``time(3) / time(1)``, what two more
futures of the same reply cost, with a 95% bootstrap interval (``--summarize FILE`` reprints it
from a results file). On a batch-efficient backend (vLLM with prefix caching, a GPU) a
batch of 3 costs little more than 1: the target is at most 1.3x.

**Concurrent vs sequential** (``--sequential``): the same 3 futures (same seeds: sampling is
seeded per row, so batching does not change a token) rolled and scored one after the other;
the script checks that they are identical and prints both wall times.

Backends: ``--backend hf`` (transformers, :class:`~collab_env.agents.hf.HFPolicy`, one
micro-batching queue) or ``--backend vllm`` (:class:`~collab_env.agents.vllm_async.AsyncVLLMPolicy`,
continuous batching, prefix caching on; needs vLLM: on a CPU machine run it in ``.venv-vllm``,
see ``make test-vllm``). The machine-load check of :mod:`benchmarks._machine` runs first (refuses
a loaded machine unless ``--allow-loaded``); ``--out FILE.json`` records everything, the load
included.

Usage::

    python benchmarks/bench_mr.py [--backend hf|vllm] [--rollouts 3] [--repeats 5] [--max-new-tokens 48]
    .venv-vllm/bin/python benchmarks/bench_mr.py --backend vllm --repeats 10 --sequential --out mr.json
    python benchmarks/bench_mr.py --summarize benchmarks/results/mr_vllm_embedded.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

for _k, _v in {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
               "LITELLM_LOCAL_MODEL_COST_MAP": "True", "VLLM_NO_USAGE_STATS": "1",
               "VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}.items():
    os.environ.setdefault(_k, _v)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _machine import LoadMeter, add_load_arguments, check  # noqa: E402

import collab_env  # noqa: E402
from collab_env.rewards.defaults import default_reward  # noqa: E402

ROW = {
    "prompt": [{"role": "user", "content": "Can you help me with a sum of some numbers?"}],
    "completion": "Sure, which numbers?",
    "conv_id": 0,
    "score": 0.5,
    "single_turn_prompt": "What is the sum of the first five odd numbers?",
    "single_turn_completion": "25",
    "single_turn_metadata": {},
    "turn_id": 1,
    "sessions": [[{"role": "assistant", "content": "Which numbers do you mean?"},
                  {"role": "user", "content": "The first five odd numbers."},
                  {"role": "assistant", "content": "1 + 3 + 5 + 7 + 9 = \\boxed{25}."}]],
    "rewards": {},
}
REPLY = "Happy to help. Which numbers would you like to add?"

#: vLLM engine settings for a CPU (as in tests_vllm): fp32, no torch.compile, a fixed KV cache,
#: and KV blocks of 32 tokens instead of the CPU default 128: the prefix cache shares whole blocks,
#: and the futures' prompts and their judges' prompts share prefixes that 128-token blocks cut
#: short (measured here, 10 pairs each: 1.45x with 128, 1.31x with 32; results/mr_vllm_embedded*.json).
VLLM_CPU_ENGINE = {"dtype": "float32", "max_model_len": 2048, "kv_cache_memory_bytes": 512 << 20,
                   "enforce_eager": True, "block_size": 32}


def _stats(policy) -> dict[str, float]:
    """Model calls, requests and tokens so far (both backends' counters, one vocabulary)."""
    s = policy.stats
    if hasattr(s, "generate_calls"):  # HFPolicy
        return {"model_calls": s.generate_calls, "requests": s.batched_requests,
                "prompt_tokens": s.prompt_tokens, "completion_tokens": s.completion_tokens}
    return {"model_calls": s.engine_calls, "requests": s.requests, "prompt_tokens": s.prompt_tokens,
            "completion_tokens": s.completion_tokens, "cached_tokens": s.cached_tokens}


def median_ci(values: list[float]) -> tuple[float, float]:
    """The 95% percentile-bootstrap interval of the median of ``values``: the leaderboard's
    :func:`~collab_env.leaderboard.stats.bootstrap` (seeded: the same file, the same interval)."""
    from collab_env.leaderboard.stats import bootstrap

    _, lo, hi = bootstrap(values, statistics.median)
    return lo, hi


def summarize(path: str) -> dict:
    """The summary of a results file this script wrote: medians, the ratio's median and its
    interval (``--summarize FILE``)."""
    record = json.loads(Path(path).read_text())
    rows, n = record["repeats"], str(record["rollouts"])
    ratios = [row["ratio"] for row in rows]
    lo, hi = median_ci(ratios)
    out = {"pairs": len(rows), "one_future_median_s": statistics.median(r["1"]["seconds"] for r in rows),
           f"{n}_futures_median_s": statistics.median(r[n]["seconds"] for r in rows),
           "ratio_median": statistics.median(ratios), "ratio_ci95": [lo, hi],
           "ratio_min": min(ratios), "ratio_max": max(ratios)}
    print(json.dumps(out, indent=2))
    return out


def _diff(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before[k] for k in after}


def make_policy(args):
    """The one model behind the assistant, the user simulator and the judge."""
    if args.backend == "vllm":
        from collab_env.agents.vllm_async import AsyncVLLMPolicy

        model = args.model
        if model == "embedded":
            from collab_env.agents.embedded import embedded_model_dir

            model = str(embedded_model_dir())
        engine = dict(VLLM_CPU_ENGINE) if args.device == "cpu" else {"gpu_memory_utilization": 0.3}
        if args.dtype is not None:
            engine["dtype"] = args.dtype
        if args.block_size is not None:
            engine["block_size"] = args.block_size
        return AsyncVLLMPolicy(model, enable_prefix_caching=not args.no_prefix_caching, engine_kwargs=engine)
    if args.model == "embedded":
        from collab_env.agents.embedded import EmbeddedPolicy

        return _hf_prefix_reuse(EmbeddedPolicy(max_batch_size=32, device=args.device), args)
    from collab_env.agents.hf import HFPolicy

    policy = HFPolicy(args.model, max_batch_size=32, device=args.device)
    return _hf_prefix_reuse(policy, args)


def _hf_prefix_reuse(policy, args):
    """HF: ``--no-prefix-caching`` turns off the reuse of read prefixes (the prefix cache, and the
    prefix shared by a batch's rows), as before it existed; repeated prompts are still read once."""
    if args.no_prefix_caching:
        policy.prefix_cache_tokens = 0
        policy.min_shared_prefix = 1 << 30
    return policy


def make_env(args, model, rollouts: int, data: Path):
    from collab_env.agents.users import LLMUserSimulator

    user = LLMUserSimulator(model, reply_format="plain",
                            sampling={"temperature": 0.0, "max_new_tokens": args.max_new_tokens})
    sampling = {"assistant": {"temperature": 1.0, "max_new_tokens": args.max_new_tokens}}
    base = collab_env.make("collabllm-math-hard", data_files=str(data))
    # As in tests/rewards/test_mr_embedded.py: math accuracy by rule (the 135M model copies the accuracy
    # judge's template), interactivity by the judge (paper rubric, prefilled reply).
    return default_reward(base, judge=model, user=user, policy=model, num_rollouts=rollouts,
                          weights={"accuracy_rule": 1.0, "interactivity": 1.0, "token_amount": -1e-4},
                          rubric="paper", sampling=sampling, judge_kwargs={"max_new_tokens": 40, "max_retries": 1},
                          on_fault=args.on_fault)


async def take_reply(env, seed: int) -> tuple[int, int]:
    """Reset on the item with ``seed`` and take the fixed reply with the base env; returns the
    ``(start, step)`` that ``score_reply`` scores."""
    await env.areset(seed=seed, options={"index": 0})
    state = env.unwrapped.episode
    start, step = len(state.messages), state.step
    await env.env.astep({"assistant": REPLY})
    return start, step


async def _maybe_await(value):
    """``value``, awaited when it is awaitable (vLLM's reset is a coroutine, HF's is not)."""
    return await value if asyncio.iscoroutine(value) else value


async def timed_score(env, model, seed: int, cold: bool = False) -> dict:
    """Take the reply on a reset with ``seed``, then time its MR (``cold``: from an empty prefix
    cache, where the backend has one)."""
    start, step = await take_reply(env, seed)
    reset = getattr(model, "reset_prefix_cache", None)
    if cold and reset is not None and not await _maybe_await(reset()):
        raise RuntimeError("vLLM did not reset its prefix cache (requests still running?)")
    s0, t0 = _stats(model), time.perf_counter()
    result, extra = await env.scorer.score_reply(env.env, start=start, step=step)
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "calls": _diff(_stats(model), s0), "reward": result.reward,
            "faults": len(result.faults), "futures": extra["futures"], "result": result}


async def sequential_check(env, model, seed: int, rollouts: int) -> dict:
    """The same futures concurrent, then one after the other: identical? and both wall times."""
    conc = await timed_score(env, model, seed)
    start, step = await take_reply(env, seed)
    state = env.unwrapped.episode
    s0, t0 = _stats(model), time.perf_counter()
    convs, values = [], []
    for r in range(rollouts):
        policies, _ = env.scorer.future_policies({})  # the reward's own (fixed) policies
        out = await env.scorer.roll_future(env.env.clone(), r, step, policies=policies,
                                           sampling=env.scorer.future_sampling({}, set()))
        if out["fault"] is not None:
            raise RuntimeError(f"future {r} faulted: {out['fault']}")
        one = await env.scorer.metric_set.score([out["conversation"]], state.item, start=start, player="assistant")
        convs.append(out["conversation"])
        values.append(one.values)
    t_seq, c_seq = time.perf_counter() - t0, _diff(_stats(model), s0)
    res = conc["result"]
    same = all(f == [m.to_dict() for m in c.messages[start:]] for f, c in zip(conc["futures"], convs, strict=True))
    same_values = (all(res.values[m][i] == values[i][m][0] for m in res.values for i in range(rollouts))
                   if len(res.scored) == rollouts else False)
    return {"concurrent_s": conc["seconds"], "sequential_s": t_seq, "concurrent_calls": conc["calls"],
            "sequential_calls": c_seq, "identical_futures": same, "identical_values": same_values,
            "ratio_sequential_over_concurrent": t_seq / conc["seconds"]}


async def run(args, meter: LoadMeter | None = None) -> dict:
    tmp = Path(tempfile.mkdtemp())
    data = tmp / "rows.jsonl"
    data.write_text(json.dumps(ROW) + "\n")
    model = make_policy(args)
    envs = {1: make_env(args, model, 1, data), args.rollouts: make_env(args, model, args.rollouts, data)}
    # warm-up, not timed: compiles/caches the shared prompt prefix of the item on both
    warm = await timed_score(envs[1], model, seed=1)
    print(f"warm-up (1 future, not timed): {warm['seconds']:.2f} s")
    rows = []
    for k in range(args.repeats):
        order = [1, args.rollouts] if k % 2 == 0 else [args.rollouts, 1]
        row = {"order": order}
        futures = {}
        for r in order:  # the same seed: the single future is the first of the many
            out = await timed_score(envs[r], model, seed=100 + 10 * k, cold=True)
            row[str(r)] = {key: out[key] for key in ("seconds", "calls", "reward", "faults")}
            futures[r] = out["futures"]
        row["ratio"] = row[str(args.rollouts)]["seconds"] / row["1"]["seconds"]
        # seeded per row, so batching changes no token, up to float rounding that may flip a near-tie
        row["same_first_future"] = futures[1][0] == futures[args.rollouts][0]
        if not row["same_first_future"]:
            print(f"note: repeat {k + 1}: the single future differs from the first of the {args.rollouts} "
                  "(a near-tie flipped by the batch's rounding); the pair still times one MR each")
        rows.append(row)
        print(f"repeat {k + 1} ({' then '.join(map(str, order))}): 1 future {row['1']['seconds']:.2f} s, "
              f"{args.rollouts} futures {row[str(args.rollouts)]['seconds']:.2f} s, ratio {row['ratio']:.2f}x")
    for r in (1, args.rollouts):
        secs = [row[str(r)]["seconds"] for row in rows]
        calls = rows[-1][str(r)]["calls"]
        print(f"{r} future(s): median {statistics.median(secs):.2f} s; last repeat: "
              + ", ".join(f"{key} {v:.0f}" for key, v in calls.items()))
    ratios = [row["ratio"] for row in rows]
    lo, hi = median_ci(ratios)
    print(f"{args.rollouts} futures / 1 future wall time: median {statistics.median(ratios):.2f}x over "
          f"{args.repeats} pairs (95% bootstrap interval {lo:.2f}x-{hi:.2f}x; min {min(ratios):.2f}x, "
          f"max {max(ratios):.2f}x); target <= 1.3x")
    same = sum(row["same_first_future"] for row in rows)
    print(f"the single future was the first of the {args.rollouts} in {same} of {len(rows)} pairs")
    out = {"repeats": rows, "ratio_median": statistics.median(ratios), "ratio_ci95": [lo, hi],
           "ratio_min": min(ratios), "ratio_max": max(ratios), "same_first_future": same,
           "policy": getattr(model, "name", type(model).__name__)}
    out["engine_stats"] = model.stats.to_dict()
    if args.sequential:
        seq = await sequential_check(envs[args.rollouts], model, seed=7, rollouts=args.rollouts)
        out["sequential"] = seq
        print(f"concurrent {seq['concurrent_s']:.2f} s vs sequential {seq['sequential_s']:.2f} s "
              f"({seq['ratio_sequential_over_concurrent']:.2f}x); identical futures: {seq['identical_futures']}; "
              f"identical metric values: {seq['identical_values']}")
    # measured while the engine's worker process is alive: an exited child not yet reaped is
    # counted by nobody (see _machine.LoadMeter)
    if meter is not None:
        out["load_during"] = meter.stop()
    close = getattr(model, "close", None) or getattr(model, "aclose", None)
    if close is not None:
        res = close()
        if asyncio.iscoroutine(res):
            await res
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--backend", choices=("hf", "vllm"), default="hf")
    parser.add_argument("--model", default="embedded", help="'embedded' or a model folder")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--rollouts", type=int, default=3, help="futures of the many-futures run (default 3)")
    parser.add_argument("--repeats", type=int, default=5, help="timed pairs, in alternating order (default 5)")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--no-prefix-caching", action="store_true",
                        help="turn prefix caching off (HF: the reuse of prefixes read by earlier calls and of the "
                             "prefix a batch's rows share, as before the HF backend had it)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch's intra-op threads (default: torch's choice, one per core); on a machine that "
                             "other work keeps busy, fewer threads than cores avoid waiting on descheduled ones")
    parser.add_argument("--block-size", type=int, default=None,
                        help="vLLM: tokens per KV block, the prefix cache's granularity (default: 32 on a CPU, "
                             "see VLLM_CPU_ENGINE; the engine's own on a GPU)")
    parser.add_argument("--dtype", default=None, choices=("float32", "bfloat16", "float16"),
                        help="vLLM: the model's dtype (default: float32 on a CPU, the engine's choice on a GPU; "
                             "bfloat16 is fast on a CPU with AVX512-BF16 or AMX)")
    parser.add_argument("--sequential", action="store_true",
                        help="also roll the futures one after the other and check they are identical")
    parser.add_argument("--on-fault", default="drop", choices=("drop", "raise", "zero"),
                        help="the MR's fault rule (zero: a failed user turn becomes an empty message, counted; "
                             "for random test models)")
    parser.add_argument("--out", default=None, help="write the results here as JSON")
    parser.add_argument("--summarize", default=None, metavar="FILE",
                        help="print the summary (medians, the ratio's 95%% bootstrap interval) of a results file and exit")
    add_load_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.summarize:
        summarize(args.summarize)
        return 0
    if args.rollouts < 2 or args.repeats < 1:
        raise SystemExit("--rollouts must be >= 2 and --repeats >= 1")
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    load = check(args)
    result = asyncio.run(run(args, LoadMeter().start()))
    during = result.pop("load_during")
    print(f"machine during the run: {during.describe()}")
    if args.out:
        import torch

        record = {"command": "python benchmarks/bench_mr.py " + shlex.join(argv if argv is not None else sys.argv[1:]),
                  "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "backend": args.backend, "model": args.model,
                  "device": args.device, "rollouts": args.rollouts, "max_new_tokens": args.max_new_tokens,
                  "prefix_caching": not args.no_prefix_caching,
                  "threads": torch.get_num_threads(), "platform": platform.platform(),
                  "torch": torch.__version__, "load_before": load.to_dict(), "load_during": during.to_dict(),
                  **result}
        if args.backend == "vllm":
            import vllm

            record["vllm"] = vllm.__version__
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(record, indent=2, default=float) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

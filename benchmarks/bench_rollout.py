"""Rollout efficiency: the rollout engine against the ideal, a sequential loop and a lockstep
Gymnasium ``AsyncVectorEnv``, on the same work.

The work: ``--episodes`` (N) episodes of the built-in ``length-ratio-v0`` env with
``num_turns=T`` (every episode has exactly T turns). ``agent_0`` is a **stub policy of fixed
latency L**: each call sleeps L seconds (``asyncio.sleep``) whatever the number of observations
in it, like a batched model server; ``agent_1`` is the env's default scripted partner (no
latency). With unlimited parallelism the ideal wall time is ``T x L``.

What each contender does:

* ``engine``: :class:`collab_env.rollout.RolloutEngine` with ``concurrency=N``; agent_0's calls
  are merged across episodes by a :class:`~collab_env.rollout.BatchedPolicy`
  (``--batch`` observations or 2 ms, whichever first; seeds travel per row). Its envs are built
  before the clock starts (``prepare_envs``), like the other contenders' envs.
* ``ideal``: ``T x L`` (zero overhead, all episodes in flight at once).
* ``sequential``: one env, one episode after another with :func:`collab_env.rollout.run_episode`
  (T calls of latency L per episode). Its time is linear in N by construction, so by default it
  runs ``--seq-episodes`` episodes and the table scales the time to N (``--full`` runs all N).
* ``vector``: ``gymnasium.vector.AsyncVectorEnv`` of ``--num-envs`` subprocesses, each the
  single-agent view ``collab_env.make("length-ratio", view="agent_0")`` (the partner runs
  inside the view), stepped in lockstep with ``autoreset_mode=SAME_STEP``; one stub call of
  latency L answers all envs of a vector step (the most favourable batching for it). One round of
  T vector steps finishes ``num_envs`` episodes; rounds are identical, so by default it runs
  ``--vector-rounds`` rounds and the table scales the time to ``N / num_envs`` rounds
  (``--full`` runs all of them). Subprocess start-up is not timed.

The figure of merit printed last is ``engine / ideal`` from this one run (target: <= 1.10), with
``sequential / engine`` and ``vector / engine``. Beside the wall time it prints the process's CPU
time per episode-turn during the engine's run (``time.process_time``): the engine's own cost,
much less sensitive than wall time to other load on the machine (``uptime``'s load average is
printed with it), when the last episode's first move reached the stub (the ramp: every episode's
reset and first move come before it, so the wall time is at least the ramp plus ``T x L``) and the
CPU of the garbage collections during the run.

``--ray-workers K`` runs the engine as a :class:`~collab_env.rollout.RayRolloutEngine` of K Ray
workers (one CPU each) instead: each worker runs a local engine on the chunks of jobs it is sent
(``--chunk-size`` jobs per remote call; ``concurrency`` stays global). The workers are started
and warmed up with one untimed run of the
same N episodes (so their envs exist, as ``prepare_envs`` does locally); CPU time is then the
driver's and the workers' together. ``--json PATH`` appends the run's numbers to a JSON list.

Usage::

    python benchmarks/bench_rollout.py [--episodes 256] [--turns 4] [--latency 1.0] [--full]
    python benchmarks/bench_rollout.py --episodes 8192 --turns 4 --latency 0.5 --batch 256 \
        --ray-workers 2 --skip-vector --seq-episodes 1
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import os
import time
from pathlib import Path

import collab_env
from collab_env.rollout import RolloutEngine, run_episode
from collab_env.types import Completion

ENV = "length-ratio"
TEXT = "A short answer with a handful of words in it."


class FixedLatencyStub:
    """Sleeps ``latency`` seconds per call, whatever the batch size; returns fixed text."""

    name = "stub"
    accepts_row_seeds = True  # takes seeds=[...] per row, so seeded episodes share batches

    def __init__(self, latency: float) -> None:
        self.latency = latency
        self.calls = 0
        self.observations = 0
        self.last_first_move = 0.0  # perf_counter of the last call holding an episode's first move

    async def act(self, observations, **sampling):
        self.calls += 1
        self.observations += len(observations)
        if any(len(o) == 1 for o in observations):  # the prompt alone: an episode's first move
            self.last_first_move = time.perf_counter()
        await asyncio.sleep(self.latency)
        return [Completion(TEXT, finish_reason="stop") for _ in observations]


def bench_engine(n: int, turns: int, latency: float, batch: int) -> tuple[float, FixedLatencyStub, RolloutEngine]:
    stub = FixedLatencyStub(latency)
    engine = RolloutEngine(ENV, {"agent_0": stub}, env_kwargs={"num_turns": turns}, concurrency=n,
                           max_batch_size=batch, max_wait_ms=2.0, progress=False)
    engine.prepare_envs(n)
    collections: list[float] = []

    def on_gc(phase: str, info: dict) -> None:  # CPU of each collection during the run
        if phase == "start":
            collections.append(time.process_time())
        elif collections:
            collections[-1] = time.process_time() - collections[-1]

    gc.callbacks.append(on_gc)
    try:
        c0, t0 = time.process_time(), time.perf_counter()
        results = engine.run(n)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        gc.callbacks.remove(on_gc)
    _check(results, turns)
    engine.cpu_seconds = cpu  # type: ignore[attr-defined]
    engine.ramp_seconds = stub.last_first_move - t0  # type: ignore[attr-defined]
    engine.gc_seconds = sum(collections)  # type: ignore[attr-defined]
    engine.gc_collections = len(collections)  # type: ignore[attr-defined]
    return wall, stub, engine


def _check(results: list, turns: int) -> None:
    bad = [r for r in results if not isinstance(r, collab_env.Episode) or r.num_steps != turns]
    if bad:
        raise SystemExit(f"engine: {len(bad)} episodes failed or had the wrong length: {bad[0]!r}")


def _proc_cpu(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (Linux ``/proc``; a local Ray worker)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench_ray(n: int, turns: int, latency: float, batch: int, workers: int,
              chunk_size: int | None = None) -> tuple[float, float]:
    """``(wall, cpu)`` of one timed run on ``workers`` Ray workers, after an untimed warm-up run;
    ``cpu`` is the driver's and the workers' CPU time during the timed run."""
    import ray

    from collab_env.rollout.ray_engine import RayRolloutEngine

    if not ray.is_initialized():
        ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
    chunks = {} if chunk_size is None else {"chunk_size": chunk_size}  # the engine's default otherwise
    engine = RayRolloutEngine(ENV, {"agent_0": FixedLatencyStub(latency)}, env_kwargs={"num_turns": turns},
                              num_workers=workers, concurrency=n, max_batch_size=batch, max_wait_ms=2.0,
                              progress=False, **chunks)
    try:
        _check(engine.run(n), turns)  # warm-up: the workers import, build and keep their envs
        pids = [w["pid"] for w in engine.where()]
        w0 = sum(_proc_cpu(p) for p in pids)
        c0, t0 = time.process_time(), time.perf_counter()
        results = engine.run(n)
        wall = time.perf_counter() - t0
        cpu = time.process_time() - c0 + sum(_proc_cpu(p) for p in pids) - w0
    finally:
        engine.shutdown()
    _check(results, turns)
    return wall, cpu


def bench_sequential(n: int, turns: int, latency: float) -> float:
    stub = FixedLatencyStub(latency)
    env = collab_env.make(ENV, num_turns=turns)
    policies = {"agent_0": stub, "agent_1": "length-ratio-partner"}
    from collab_env.policy import resolve_policy

    policies = {p: resolve_policy(v) for p, v in policies.items()}
    t0 = time.perf_counter()
    for k in range(n):
        ep = run_episode(env, policies, seed=k)
        assert ep.num_steps == turns
    return time.perf_counter() - t0


def _view(turns: int):
    return collab_env.make(ENV, view="agent_0", num_turns=turns)


def bench_vector(num_envs: int, rounds: int, turns: int, latency: float) -> float:
    import functools

    import gymnasium
    from gymnasium.vector import AutoresetMode

    fns = [functools.partial(_view, turns) for _ in range(num_envs)]
    venv = gymnasium.vector.AsyncVectorEnv(fns, shared_memory=False, copy=False,
                                           autoreset_mode=AutoresetMode.SAME_STEP)
    try:
        venv.reset(seed=0)  # warms the workers; the timed part starts with the first step
        done = 0
        t0 = time.perf_counter()
        for _ in range(rounds):
            for _ in range(turns):
                time.sleep(latency)  # one batched stub call for every env of the vector step
                _, _, term, trunc, _ = venv.step([TEXT] * num_envs)
                done += int((term | trunc).sum())
        wall = time.perf_counter() - t0
    finally:
        venv.close()
    if done != rounds * num_envs:
        raise SystemExit(f"vector: {done} episodes ended, expected {rounds * num_envs}")
    return wall


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Rollout engine efficiency benchmark (offline, CPU).")
    ap.add_argument("--episodes", type=int, default=256, help="N episodes (default 256)")
    ap.add_argument("--turns", type=int, default=4, help="T turns per episode (default 4)")
    ap.add_argument("--latency", type=float, default=1.0, help="L seconds per policy call (default 1.0)")
    ap.add_argument("--batch", type=int, default=16, help="engine max_batch_size (default 16)")
    ap.add_argument("--num-envs", type=int, default=16, help="AsyncVectorEnv subprocesses (default 16)")
    ap.add_argument("--seq-episodes", type=int, default=2, help="episodes the sequential loop runs (default 2)")
    ap.add_argument("--vector-rounds", type=int, default=2, help="lockstep rounds the vector env runs (default 2)")
    ap.add_argument("--full", action="store_true", help="run the baselines on all N episodes (slow)")
    ap.add_argument("--skip-vector", action="store_true", help="leave out the AsyncVectorEnv baseline")
    ap.add_argument("--ray-workers", type=int, default=0, help="run the engine on K Ray workers (default: in process)")
    ap.add_argument("--chunk-size", type=int, default=None,
                    help="with --ray-workers: jobs per remote call (default: concurrency / (4 x workers))")
    ap.add_argument("--json", type=Path, default=None, help="append this run's numbers to a JSON list in PATH")
    ap.add_argument("--label", default="", help="a label stored with --json (e.g. before/after)")
    args = ap.parse_args(argv)
    n, T, L = args.episodes, args.turns, args.latency
    if n < 1 or T < 1 or L <= 0 or args.num_envs < 1:
        ap.error("episodes, turns and num-envs must be >= 1 and latency > 0")

    ideal = T * L
    print(f"work: N={n} episodes of {ENV} (num_turns={T}), stub latency L={L}s per call; ideal T*L = {ideal:.3f}s")

    load0 = os.getloadavg()[0]
    ramp = gc_s = gcs = None
    if args.ray_workers:
        engine_wall, engine_cpu = bench_ray(n, T, L, args.batch, args.ray_workers, args.chunk_size)
        mean_batch = None
        print(f"engine      {engine_wall:8.3f}s  (RayRolloutEngine, {args.ray_workers} workers, concurrency={n}, "
              f"chunk_size={args.chunk_size or 'default'}, max_batch_size={args.batch})")
    else:
        engine_wall, stub, engine = bench_engine(n, T, L, args.batch)
        engine_cpu = engine.cpu_seconds  # type: ignore[attr-defined]
        b = engine.stats.batches["stub"]
        mean_batch = b.mean_batch_size
        ramp, gc_s, gcs = engine.ramp_seconds, engine.gc_seconds, engine.gc_collections  # type: ignore[attr-defined]
        print(f"engine      {engine_wall:8.3f}s  (concurrency={n}, max_batch_size={args.batch}: {b.batches} stub calls "
              f"for {b.observations} observations, mean batch {b.mean_batch_size:.1f})")
        print(f"            last first move sent at {ramp:.3f}s (the ramp); "
              f"{gcs} garbage collection(s), {gc_s:.3f}s CPU")
    load1 = os.getloadavg()[0]
    cpu_us = engine_cpu / (n * T) * 1e6
    print(f"engine CPU  {engine_cpu:8.3f}s  = {cpu_us:.1f} us per episode-turn  (load average "
          f"{load0:.2f} -> {load1:.2f} on {os.cpu_count()} cores)")

    seq_n = n if args.full else min(n, args.seq_episodes)
    seq_wall = bench_sequential(seq_n, T, L)
    seq_scaled = seq_wall * n / seq_n
    note = "" if seq_n == n else f"  (measured {seq_wall:.3f}s on {seq_n} episodes, x{n / seq_n:g})"
    print(f"sequential  {seq_scaled:8.3f}s{note}")

    vec_scaled = None
    if not args.skip_vector:
        full_rounds = math.ceil(n / args.num_envs)
        rounds = full_rounds if args.full else min(full_rounds, args.vector_rounds)
        vec_wall = bench_vector(args.num_envs, rounds, T, L)
        vec_scaled = vec_wall * full_rounds / rounds
        note = "" if rounds == full_rounds else f"  (measured {vec_wall:.3f}s on {rounds} rounds, x{full_rounds / rounds:g})"
        print(f"vector      {vec_scaled:8.3f}s  (AsyncVectorEnv, {args.num_envs} envs, lockstep){note}")

    print()
    print(f"engine / ideal      = {engine_wall / ideal:.3f}   (target <= 1.10)")
    if args.json is not None:
        rows = json.loads(args.json.read_text()) if args.json.exists() else []
        rows.append({"label": args.label, "episodes": n, "turns": T, "latency_s": L, "batch": args.batch,
                     "ray_workers": args.ray_workers, "chunk_size": args.chunk_size,
                     "engine_wall_s": round(engine_wall, 4),
                     "ideal_s": ideal, "engine_over_ideal": round(engine_wall / ideal, 4),
                     "cpu_s": round(engine_cpu, 4), "cpu_us_per_episode_turn": round(cpu_us, 2),
                     "mean_batch": None if mean_batch is None else round(mean_batch, 2),
                     "ramp_s": None if ramp is None else round(ramp, 4),
                     "gc_s": None if gc_s is None else round(gc_s, 4), "gc_collections": gcs,
                     "load_avg_1min_before": round(load0, 2), "load_avg_1min_after": round(load1, 2),
                     "cores": os.cpu_count(), "collab_env": str(Path(collab_env.__file__).parent.parent),
                     "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    print(f"sequential / engine = {seq_scaled / engine_wall:.1f}")
    if vec_scaled is not None:
        print(f"vector / engine     = {vec_scaled / engine_wall:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

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
``sequential / engine`` and ``vector / engine``.

Usage::

    python benchmarks/bench_rollout.py [--episodes 256] [--turns 4] [--latency 1.0] [--full]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import time

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

    async def act(self, observations, **sampling):
        self.calls += 1
        self.observations += len(observations)
        await asyncio.sleep(self.latency)
        return [Completion(TEXT, finish_reason="stop") for _ in observations]


def bench_engine(n: int, turns: int, latency: float, batch: int) -> tuple[float, FixedLatencyStub, RolloutEngine]:
    stub = FixedLatencyStub(latency)
    engine = RolloutEngine(ENV, {"agent_0": stub}, env_kwargs={"num_turns": turns}, concurrency=n,
                           max_batch_size=batch, max_wait_ms=2.0, progress=False)
    engine.prepare_envs(n)
    t0 = time.perf_counter()
    results = engine.run(n)
    wall = time.perf_counter() - t0
    bad = [r for r in results if not isinstance(r, collab_env.Episode) or r.num_steps != turns]
    if bad:
        raise SystemExit(f"engine: {len(bad)} episodes failed or had the wrong length: {bad[0]!r}")
    return wall, stub, engine


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
    args = ap.parse_args(argv)
    n, T, L = args.episodes, args.turns, args.latency
    if n < 1 or T < 1 or L <= 0 or args.num_envs < 1:
        ap.error("episodes, turns and num-envs must be >= 1 and latency > 0")

    ideal = T * L
    print(f"work: N={n} episodes of {ENV} (num_turns={T}), stub latency L={L}s per call; ideal T*L = {ideal:.3f}s")

    engine_wall, stub, engine = bench_engine(n, T, L, args.batch)
    b = engine.stats.batches["stub"]
    print(f"engine      {engine_wall:8.3f}s  (concurrency={n}, max_batch_size={args.batch}: {b.batches} stub calls "
          f"for {b.observations} observations, mean batch {b.mean_batch_size:.1f})")

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
    print(f"sequential / engine = {seq_scaled / engine_wall:.1f}")
    if vec_scaled is not None:
        print(f"vector / engine     = {vec_scaled / engine_wall:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

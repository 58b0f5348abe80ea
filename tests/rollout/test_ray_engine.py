"""The Ray backend on a local Ray instance (skipped when ray is not installed)."""

from __future__ import annotations

import asyncio
import copy
import gc

import pytest

ray = pytest.importorskip("ray")

from collab_env.errors import ConfigError  # noqa: E402
from collab_env.rollout import RolloutEngine, rollout  # noqa: E402
from collab_env.rollout.ray_engine import RayRolloutEngine  # noqa: E402

POLICIES = {"assistant": "ask-then-answer"}  # references: each worker builds its own


@pytest.fixture(scope="module")
def local_ray():
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    if started:
        ray.shutdown()


def test_ray_workers_give_the_same_episodes_as_the_local_engine_and_report_failures(local_ray):
    jobs = [{"seed": s, "tag": f"job{s}"} for s in range(16)] + [{"seed": 99, "options": {"index": -1}}]
    # Chunks of 3 jobs per remote call: 17 jobs make chunks of 3 and a last, shorter one.
    with RayRolloutEngine("hidden-facts", POLICIES, env_kwargs={"num_objects": 3}, num_workers=2,
                          concurrency=8, chunk_size=3, progress=False) as eng:
        where = eng.where()
        streamed = list(eng.stream(jobs))
        ordered = eng.run(jobs)
        st = copy.deepcopy(eng.stats)
        # The driver unpickles every episode: it raises the collector's threshold while it runs.
        before = gc.get_threshold()

        async def threshold_while_streaming():
            agen = eng.astream(4)
            try:
                async for _ in agen:
                    return gc.get_threshold()[0]
            finally:
                await agen.aclose()

        assert asyncio.run(threshold_while_streaming()) == max(eng.config.gc_threshold, before[0])
        assert gc.get_threshold() == before
    local = RolloutEngine("hidden-facts", POLICIES, env_kwargs={"num_objects": 3}, progress=False).run(jobs)

    assert len({w["pid"] for w in where}) == 2  # two worker processes
    assert sorted(j["tag"] for j, _ in streamed if "tag" in j) == sorted(j["tag"] for j in jobs if "tag" in j)
    assert [e.to_dict() for e in ordered[:-1]] == [e.to_dict() for e in local[:-1]]
    assert isinstance(ordered[-1], ConfigError) and "out of range" in str(ordered[-1])
    assert st.finished == 32 and st.failed == 2 and st.max_in_flight <= 8
    assert set(st.per_worker) == {"worker-0", "worker-1"} and all(n > 0 for n in st.per_worker.values())
    assert st.policy_calls > 0  # gathered from the workers
    assert st.submitted == 34 and st.in_flight == 0 and st.cancelled == 0


def test_chunk_size_is_validated_and_defaults_to_four_chunks_per_worker():
    assert RayRolloutEngine("hidden-facts", POLICIES, num_workers=2, concurrency=64).chunk_size == 8
    assert RayRolloutEngine("hidden-facts", POLICIES, num_workers=4, concurrency=3).chunk_size == 1
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ConfigError, match="chunk_size must be an int >= 1"):
            RayRolloutEngine("hidden-facts", POLICIES, chunk_size=bad)


def test_rollout_backend_ray_and_a_worker_that_cannot_start(local_ray):
    out = list(rollout("hidden-facts", POLICIES, 4, backend="ray", num_workers=1, progress=False))
    assert sorted(j["seed"] for j, _ in out) == [0, 1, 2, 3]
    assert all(ep.returns["assistant"] == 1.0 for _, ep in out)
    bad = RayRolloutEngine("hidden-facts", {"assistant": "no.such.module:Policy"}, num_workers=1)
    with pytest.raises(ConfigError, match="worker failed to start"):
        bad.start()


class RejectsSeed:
    """Ask-then-answer, except that the request of one seed is rejected like a bad API key."""

    name = "rejects-seed"

    def __init__(self, seed):
        self.seed = seed

    async def act(self, observations, **sampling):
        from collab_env.errors import FatalPolicyError
        from collab_env.tasks.hidden_facts import AskThenAnswer

        if sampling.get("seed") == self.seed:
            raise FatalPolicyError("401 AuthenticationError: Incorrect API key provided: sk-****-123.")
        return await AskThenAnswer().act(observations, **sampling)


def test_a_rejected_request_stops_a_ray_run(local_ray):
    from collab_env.errors import FatalPolicyError

    # Job k has seed 100k; the request of job 2's first step (seed 200) is rejected.
    eng = RayRolloutEngine("hidden-facts", {"assistant": RejectsSeed(200)}, num_workers=1, concurrency=1,
                           progress=False)
    got = []
    with pytest.raises(FatalPolicyError, match="Incorrect API key provided") as info:
        for item in eng.stream([100 * k for k in range(20)]):
            got.append(item)
    assert sorted(j["seed"] for j, _ in got) == [0, 100]  # done before it; the rejected job is not yielded
    assert "3 episode(s) started" in "".join(info.value.__notes__)
    assert eng.stats.submitted == 3  # no job started after the rejection


class DiesAtSeed:
    """Ask-then-answer, except that the worker process exits on the request of one seed."""

    name = "dies-at-seed"

    def __init__(self, seed):
        self.seed = seed

    async def act(self, observations, **sampling):
        import os

        from collab_env.tasks.hidden_facts import AskThenAnswer

        if sampling.get("seed") == self.seed:
            os._exit(1)
        return await AskThenAnswer().act(observations, **sampling)


def test_a_worker_that_dies_fails_the_episodes_of_its_chunk_and_the_run_goes_on(local_ray):
    # One worker, one job at a time: jobs 0 and 1 finish, job 2 kills the worker, job 3 finds it dead.
    eng = RayRolloutEngine("hidden-facts", {"assistant": DiesAtSeed(200)}, num_workers=1, concurrency=1,
                           progress=False)
    try:
        out = eng.run([0, 100, 200, 300])
    finally:
        eng.shutdown()
    assert [type(o).__name__ for o in out[:2]] == ["Episode", "Episode"]
    assert all(isinstance(o, Exception) for o in out[2:])
    st = eng.stats
    assert (st.submitted, st.finished, st.failed, st.in_flight) == (4, 2, 2, 0)

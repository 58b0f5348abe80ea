import asyncio

import pytest

import collab_env
from collab_env.errors import ConfigError, EnvStateError, PolicyError
from collab_env.policy import FixedTextPolicy
from collab_env.rollout import RolloutEngine, run_episode
from collab_env.tasks.hidden_facts import AskThenAnswer, HiddenFactsUser
from collab_env.types import FAULT, Completion


class GivesUp:
    """A user simulator whose model never returns a usable reply."""

    name = "gives-up"

    async def act(self, observations, **sampling):
        return [Completion("", finish_reason=FAULT, usage={"model_calls": 3, "retries": 2},
                           meta={"fault": "unparseable reply x3"}) for _ in observations]


class Raises:
    async def act(self, observations, **sampling):
        raise RuntimeError("backend down")


class Counting(FixedTextPolicy):
    async def act(self, observations, **sampling):
        out = await super().act(observations, **sampling)
        return [Completion(c.text, usage={"model_calls": 1, "prompt_tokens": 10, "completion_tokens": 2})
                for c in out]


def test_episode_records_turns_rewards_and_costs():
    env = collab_env.make("hidden-facts")
    ep = run_episode(env, {"assistant": AskThenAnswer(), "user": HiddenFactsUser()}, seed=3)
    assert ep.env_id == "hidden-facts-v3" and ep.seed == 3 and ep.terminated
    assert [t.player for t in ep.turns] == ["assistant", "user", "assistant"]
    assert ep.rewards["assistant"] == [0.0, 0.0, 1.0] and ep.returns["assistant"] == 1.0
    assert ep.components["assistant"]["accuracy"] == 1.0
    assert all(t.trainable == (t.player == "assistant") for t in ep.turns)
    assert ep.conversation == env.state()
    ep2 = run_episode(collab_env.make("hidden-facts"),
                      {"assistant": Counting("Hmm?"), "user": HiddenFactsUser(patience=2)}, seed=3)
    assert ep2.costs["model_calls"] == 2 and ep2.costs["prompt_tokens"] == 20


def test_policy_fault_truncates_and_is_counted():
    env = collab_env.make("hidden-facts")
    ep = run_episode(env, {"assistant": FixedTextPolicy("How many?"), "user": GivesUp()}, seed=0)
    assert ep.truncated and not ep.terminated and ep.end_reason == "fault:user"
    assert ep.costs["faults"] == 1 and ep.costs["retries"] == 2
    assert ep.info["faults"][0]["reason"] == "unparseable reply x3"
    # the failed reply never became a message
    assert [m.author for m in ep.conversation if m.author == "user"] == ["user"]  # the opening only
    assert env.agents == []
    with pytest.raises(EnvStateError):
        env.end_episode("again")


def test_policy_exception_is_raised_not_swallowed():
    env = collab_env.make("hidden-facts")
    with pytest.raises(PolicyError, match="backend down"):
        run_episode(env, {"assistant": Raises(), "user": HiddenFactsUser()}, seed=0)
    with pytest.raises(ConfigError, match="no policy for player 'user'"):
        run_episode(env, {"assistant": Raises()}, seed=0)


def test_view_truncates_on_partner_fault():
    view = collab_env.make("hidden-facts", view="assistant", policies={"user": GivesUp()})
    obs, info = view.reset(seed=0)
    obs, r, term, trunc, info = view.step("How many apples?")
    assert trunc and not term and info["end_reason"] == "fault:user"
    assert info["faults"] == {"user": "unparseable reply x3"}


def test_many_episodes_stream_as_they_finish():
    async def main():
        jobs = [{"seed": s} for s in range(12)]
        got = []
        engine = RolloutEngine(lambda: collab_env.make("hidden-facts"),
                               {"assistant": AskThenAnswer(), "user": HiddenFactsUser()}, concurrency=4)
        async for job, ep in engine.astream(jobs):
            got.append((job["seed"], ep.returns["assistant"]))
        return got

    got = asyncio.run(main())
    assert sorted(s for s, _ in got) == list(range(12)) and all(r == 1.0 for _, r in got)

"""MultiturnAwareReward, ConversationReward, aggregation rules and the CollabLLM default rewards.

Expected values are computed by hand in the comments. Policies are scripted (no model) except
in tests/rewards/test_mr_embedded.py.
"""

from __future__ import annotations

import asyncio
import math

import pytest
from pettingzoo.test import parallel_api_test

import collab_env
from collab_env.errors import ConfigError, JudgeError, PolicyError, RewardError
from collab_env.policy import CallablePolicy, FixedTextPolicy
from collab_env.rewards.aggregation import aggregate
from collab_env.rewards.conversation import ConversationReward
from collab_env.rewards.defaults import default_reward
from collab_env.rewards.metrics import MetricResult, register_metric
from collab_env.rewards.mr import MultiturnAwareReward
from collab_env.testing.collabllm_fixtures import write_collabllm_fixture
from collab_env.types import FAULT, Completion
from tests._judges import JsonJudgeBackend, fenced


# ---------------------------------------------------------------------------------------------
# Test metrics (registered once): deterministic functions of the future
# ---------------------------------------------------------------------------------------------
async def _future_len(conversation, item, *, start=0, **ctx):
    """Number of messages from ``start`` on (the reply and its future)."""
    return MetricResult(float(len(conversation.messages) - start))


async def _said_yes(conversation, item, *, start=0, **ctx):
    """1 when some future assistant message says YES."""
    return MetricResult(float(any("YES" in m.content for m in conversation.messages[start:] if m.role == "assistant")))


async def _judge_fault(conversation, item, *, start=0, **ctx):
    """Raises JudgeError when a future holds 'BAD', else 1."""
    if any("BAD" in m.content for m in conversation.messages[start:]):
        raise JudgeError("the test judge could not read its verdict")
    return MetricResult(1.0, usage={"judge_calls": 1.0})


register_metric("test_future_len", _future_len, overwrite=True)
register_metric("test_said_yes", _said_yes, overwrite=True)
register_metric("test_judge_fault", _judge_fault, overwrite=True)


@pytest.fixture()
def math_env(tmp_path):
    path = write_collabllm_fixture(tmp_path / "rows.jsonl", n=4)
    return collab_env.make("collabllm-math-hard", data_files=str(path))


def replay_user():
    from collab_env.tasks.collabllm import SessionReplayUser

    return SessionReplayUser()


def numbered_assistant():
    """Replies 'A<k>' where k counts its own messages in the observation (reply included)."""
    def fn(obs):
        return f"A{1 + sum(1 for m in obs if m.author == 'assistant')} words here"
    return CallablePolicy(fn, name="numbered")


# ---------------------------------------------------------------------------------------------
# Aggregation rules, hand-computed
# ---------------------------------------------------------------------------------------------
VALUES = {"accuracy": [1.0, 0.0, 1.0], "interactivity": [0.5, 1.0, 0.0], "token_amount": [100.0, 300.0, 200.0]}
WEIGHTS = {"accuracy": 1.0, "interactivity": 1.0, "token_amount": -1e-4}


def test_verl_rule_by_hand():
    # accuracy mean 2/3, interactivity 0.5, tokens mean 200 * -1e-4 = -0.02 -> 1.146667
    r, c = aggregate(VALUES, WEIGHTS, "verl")
    assert c["accuracy"] == pytest.approx(2 / 3)
    assert c["interactivity"] == pytest.approx(0.5)
    assert c["token_amount"] == pytest.approx(-0.02)
    assert r == pytest.approx(2 / 3 + 0.5 - 0.02)


def test_collabllm_rule_by_hand():
    # per rollout: 1 + 0.5 - 0.01 = 1.49; 0 + 1 - 0.03 = 0.97; 1 + 0 - 0.02 = 0.98; mean 1.146667
    r, c = aggregate(VALUES, WEIGHTS, "collabllm")
    assert r == pytest.approx((1.49 + 0.97 + 0.98) / 3)
    assert sum(c.values()) == pytest.approx(r)


def test_verl_clamps_each_weighted_mean_and_collabllm_does_not():
    w = {**WEIGHTS, "accuracy": 3.0}
    # verl: clamp(3 * 2/3 = 2) = 1, + 0.5 - 0.02 = 1.48
    assert aggregate(VALUES, w, "verl")[0] == pytest.approx(1.48)
    # collabllm: (3 + 0.5 - 0.01 + 0 + 1 - 0.03 + 3 + 0 - 0.02) / 3 = 7.44 / 3
    assert aggregate(VALUES, w, "collabllm")[0] == pytest.approx(7.44 / 3)
    # clamp at -1 too: tokens mean 200 * -0.01 = -2 -> -1
    assert aggregate(VALUES, {**WEIGHTS, "token_amount": -0.01}, "verl")[1]["token_amount"] == -1.0


def test_paper_rule_caps_the_token_penalty_per_rollout():
    values = {**VALUES, "token_amount": [100.0, 300.0, 2000.0]}
    w = {**WEIGHTS, "token_amount": -1e-3}
    # penalties min(0.1, 1), min(0.3, 1), min(2, 1) -> mean 1.4 / 3; task + judge = 2/3 + 0.5
    r, c = aggregate(values, w, "paper")
    assert c["token_amount"] == pytest.approx(-1.4 / 3)
    assert r == pytest.approx(2 / 3 + 0.5 - 1.4 / 3)
    # the verl rule on the same values: -min(1e-3 * 800, 1) = -0.8
    assert aggregate(values, w, "verl")[0] == pytest.approx(2 / 3 + 0.5 - 0.8)


def test_aggregate_errors():
    with pytest.raises(ConfigError, match="aggregation must be one of"):
        aggregate(VALUES, WEIGHTS, "mean")
    with pytest.raises(ConfigError, match="must be negative"):
        aggregate(VALUES, {**WEIGHTS, "token_amount": 1e-4}, "paper")
    with pytest.raises(ConfigError, match="token metric"):
        aggregate({"accuracy": [1.0]}, {"accuracy": 1.0}, "paper")
    with pytest.raises(ConfigError, match="one value per scored rollout"):
        aggregate({"accuracy": [1.0], "interactivity": []}, WEIGHTS, "verl")
    with pytest.raises(ConfigError, match="no weight"):
        aggregate({"bleu_score": [1.0]}, WEIGHTS, "verl")


# ---------------------------------------------------------------------------------------------
# The window
# ---------------------------------------------------------------------------------------------
def test_window_zero_is_the_immediate_reward(math_env):
    env = MultiturnAwareReward(math_env, weights={"token_amount": -0.1}, max_user_turns=0)
    env.reset(seed=0, options={"index": 0})
    _, rewards, _, _, infos = env.step({"assistant": "one two three"})
    # only the reply is in the future scope: 3 words * -0.1 = -0.3; scored once
    assert rewards["assistant"] == pytest.approx(-0.3)
    mr = infos["assistant"]["mr"]
    assert mr["num_rollouts"] == 1 and mr["window"]["immediate"] is True
    assert mr["future_turns"] == [0]
    assert rewards["assistant"] == pytest.approx(infos["assistant"]["reward_components"]["mr"])


def test_window_zero_needs_no_policy_for_the_rewarded_player():
    # One training script switches between the immediate reward and a window (issue 26's
    # ablation): at window 0 nothing is rolled, so no policy is needed for the rewarded player,
    # and the reward is the reply scored as it stands.
    env = MultiturnAwareReward(collab_env.make("hidden-facts-copy"),
                               weights={"accuracy_rule": 1.0, "token_amount": -1e-3}, aggregation="collabllm",
                               max_user_turns=0)
    env.reset(seed=0)
    item = env.unwrapped.episode.item
    _, rewards, _, _, _ = env.step({"assistant": f"The total is \\boxed{{{item['answer']}}}."})
    assert rewards["assistant"] == pytest.approx(1.0 - 4e-3)  # 4 words
    env.reset(seed=0)
    _, rewards, _, _, _ = env.step({"assistant": f"How many {item['plurals'][0]} do you need?"})
    assert rewards["assistant"] == pytest.approx(-6e-3)  # a question earns nothing immediately


def test_default_window_ends_on_a_user_turn(math_env):
    # recipe defaults: 2 user turns, 3 assistant turns counting the reply -> reply, U, A, U
    env = MultiturnAwareReward(math_env, policies={"assistant": numbered_assistant(), "user": replay_user()},
                               weights={"test_future_len": 1.0}, return_futures=True)
    env.reset(seed=0, options={"index": 0})
    _, rewards, _, _, infos = env.step({"assistant": "A1 reply"})
    mr = infos["assistant"]["mr"]
    assert mr["num_rollouts"] == 3 and mr["scored"] == 3
    assert mr["future_turns"] == [3, 3, 3]
    for fut in mr["futures"]:
        assert [m["role"] for m in fut] == ["assistant", "user", "assistant", "user"]
        assert fut[0]["content"] == "A1 reply" and fut[2]["content"].startswith("A2")
        assert fut[1]["content"] == "FUTURE-USER-0-1"
    # 4 messages per future, weight 1, verl clamps to 1
    assert mr["metrics"]["test_future_len"]["mean"] == 4.0
    assert rewards["assistant"] == 1.0


def test_longer_user_budget_ends_on_an_assistant_turn(math_env):
    env = MultiturnAwareReward(math_env, policies={"assistant": numbered_assistant(), "user": replay_user()},
                               weights={"test_future_len": 0.1}, max_user_turns=3, max_assistant_turns=3,
                               num_rollouts=2, return_futures=True, aggregation="collabllm")
    env.reset(seed=0, options={"index": 0})
    _, rewards, _, _, infos = env.step({"assistant": "A1 reply"})
    fut = infos["assistant"]["mr"]["futures"][0]
    assert [m["role"] for m in fut] == ["assistant", "user", "assistant", "user", "assistant"]
    assert rewards["assistant"] == pytest.approx(0.5)  # 5 messages * 0.1
    assert infos["assistant"]["mr"]["dropped_turns"] == [0, 0]


def test_verl_drops_the_last_assistant_turn_the_turn_budget_cuts(math_env):
    # verl: reply(a=1) U(u=1) A(a=2) U(u=2) A(a=3 >= 3: generated, then discarded). Here that turn is
    # not generated: 2 assistant calls per future would mean it was.
    calls = {"n": 0}

    def fn(obs):
        calls["n"] += 1
        return "A words"

    env = MultiturnAwareReward(math_env, policies={"assistant": CallablePolicy(fn), "user": replay_user()},
                               weights={"test_future_len": 0.1}, max_user_turns=3, max_assistant_turns=3,
                               num_rollouts=2, return_futures=True)
    env.reset(seed=0, options={"index": 0})
    _, rewards, _, _, infos = env.step({"assistant": "A1 reply"})
    mr = infos["assistant"]["mr"]
    assert [m["role"] for m in mr["futures"][0]] == ["assistant", "user", "assistant", "user"]
    assert mr["dropped_turns"] == [1, 1] and calls["n"] == 2  # one kept assistant turn per future
    assert rewards["assistant"] == pytest.approx(0.4)  # 4 messages * 0.1


def test_future_stops_when_the_user_terminates(math_env):
    # The replaying user has 2 recorded turns, then sends the termination signal.
    env = MultiturnAwareReward(math_env, policies={"assistant": numbered_assistant(), "user": replay_user()},
                               weights={"test_future_len": 0.01}, max_user_turns=10, max_assistant_turns=10,
                               num_rollouts=1, return_futures=True)
    env.reset(seed=0, options={"index": 0})
    _, _, _, _, infos = env.step({"assistant": "A1"})
    fut = infos["assistant"]["mr"]["futures"][0]
    assert "[[TERMINATE CHAT]]" in fut[-1]["content"] and len(fut) == 6  # A U A U A U(stop)


def test_futures_do_not_touch_the_real_episode(math_env):
    env = MultiturnAwareReward(math_env, policies={"assistant": numbered_assistant(), "user": replay_user()},
                               weights={"test_future_len": 1.0})
    env.reset(seed=0, options={"index": 0})
    before = len(env.episode.messages)
    env.step({"assistant": "A1"})
    assert len(env.episode.messages) == before + 1
    assert env.agents == ["assistant", "user"] and env.on_turn == ("user",)


def test_user_steps_keep_the_env_reward_and_components_sum(math_env):
    env = MultiturnAwareReward(math_env, policies={"assistant": FixedTextPolicy("YES sure"), "user": replay_user()},
                               weights={"test_said_yes": 0.5, "token_amount": -0.01})
    env.reset(seed=0, options={"index": 0})
    _, rewards, _, _, infos = env.step({"assistant": "no"})
    comp = infos["assistant"]["reward_components"]
    # every future has the future assistant turn "YES sure": 0.5; words: "no"(1) + user(1) + "YES sure"(2)
    # + user(1) = 5 -> -0.05
    assert comp["test_said_yes"] == pytest.approx(0.5)
    assert comp["token_amount"] == pytest.approx(-0.05)
    assert comp["mr"] == pytest.approx(0.45) == rewards["assistant"]
    assert comp["env"] == 0.0
    _, rewards, _, _, infos = env.step({"user": "hello"})
    assert rewards["assistant"] == 0.0 and "mr" not in infos["assistant"]
    assert env.stats["rewards"] == 1 and env.stats["rollouts"] == 3


# ---------------------------------------------------------------------------------------------
# Faults
# ---------------------------------------------------------------------------------------------
class FaultOnCalls:
    """A user that faults on the given call numbers (1-based), else replays."""

    def __init__(self, bad: set[int]) -> None:
        self.bad, self.calls, self.inner = bad, 0, replay_user()

    async def act(self, observations, **sampling):
        out = []
        for obs in observations:
            self.calls += 1
            if self.calls in self.bad:
                out.append(Completion(text="", finish_reason=FAULT, meta={"fault": "unreadable"}))
            else:
                out.extend(await self.inner.act([obs], **sampling))
        return out


def test_a_faulted_future_is_dropped_and_reported(math_env):
    env = MultiturnAwareReward(math_env, policies={"assistant": numbered_assistant(), "user": FaultOnCalls({2})},
                               weights={"test_future_len": 0.1})
    env.reset(seed=0, options={"index": 0})
    _, rewards, _, _, infos = env.step({"assistant": "A1"})
    mr = infos["assistant"]["mr"]
    assert mr["scored"] == 2 and len(mr["faults"]) == 1
    assert mr["faults"][0]["rollout"] in (0, 1, 2) and mr["faults"][0]["stage"] == "policy"
    assert mr["metrics"]["test_future_len"]["values"] == [4.0, 4.0]
    assert rewards["assistant"] == pytest.approx(0.4)
    assert mr["cost"]["faults"] == 1 and env.stats["faults"] == 1


def test_all_futures_faulted_raises_instead_of_a_reward(math_env):
    env = MultiturnAwareReward(math_env, policies={"assistant": numbered_assistant(),
                                                   "user": FaultOnCalls({1, 2, 3})},
                               weights={"test_future_len": 0.1})
    env.reset(seed=0, options={"index": 0})
    with pytest.raises(RewardError, match="no future could be scored"):
        env.step({"assistant": "A1"})


def test_on_fault_raise(math_env):
    env = MultiturnAwareReward(math_env, policies={"assistant": numbered_assistant(), "user": FaultOnCalls({2})},
                               weights={"test_future_len": 0.1}, on_fault="raise")
    env.reset(seed=0, options={"index": 0})
    with pytest.raises(PolicyError, match="gave up"):
        env.step({"assistant": "A1"})


def test_a_judge_fault_drops_that_future(math_env):
    # the second assistant turn of future 0 says BAD (the assistant policy counts its calls)
    calls = {"n": 0}

    def fn(obs):
        calls["n"] += 1
        return "BAD" if calls["n"] == 1 else "fine"

    env = MultiturnAwareReward(math_env, policies={"assistant": CallablePolicy(fn), "user": replay_user()},
                               weights={"test_judge_fault": 1.0})
    env.reset(seed=0, options={"index": 0})
    _, rewards, _, _, infos = env.step({"assistant": "A1"})
    mr = infos["assistant"]["mr"]
    assert mr["scored"] == 2 and mr["faults"][0]["stage"] == "metric:test_judge_fault"
    assert "JudgeError" in mr["faults"][0]["error"]
    assert mr["cost"]["judge_calls"] == 2.0
    assert rewards["assistant"] == 1.0


class Boom:
    async def act(self, observations, **sampling):
        raise RuntimeError("backend down")


def test_a_raising_policy_counts_as_a_fault(math_env):
    env = MultiturnAwareReward(math_env, policies={"assistant": numbered_assistant(), "user": Boom()},
                               weights={"test_future_len": 0.1})
    env.reset(seed=0, options={"index": 0})
    with pytest.raises(RewardError, match="backend down"):
        env.step({"assistant": "A1"})


# ---------------------------------------------------------------------------------------------
# Configuration, determinism, API
# ---------------------------------------------------------------------------------------------
def test_configuration_errors(math_env):
    with pytest.raises(ConfigError, match="num_rollouts must be an int >= 1"):
        MultiturnAwareReward(math_env, num_rollouts=0, max_user_turns=0)
    with pytest.raises(ConfigError, match="unknown metric"):
        MultiturnAwareReward(math_env, weights={"acuracy": 1.0}, max_user_turns=0)
    with pytest.raises(ConfigError, match="aggregation must be one of"):
        MultiturnAwareReward(math_env, aggregation="sum", max_user_turns=0, weights={"token_amount": -1})
    with pytest.raises(ConfigError, match="must be negative"):
        MultiturnAwareReward(math_env, aggregation="paper", max_user_turns=0, weights={"token_amount": 1e-4})
    with pytest.raises(ConfigError, match="unknown players"):
        MultiturnAwareReward(math_env, policies={"bot": FixedTextPolicy("x")}, max_user_turns=0,
                             weights={"token_amount": -1})


def test_spec_weights_are_the_default(math_env):
    env = MultiturnAwareReward(math_env, max_user_turns=0)
    assert env.weights == {"accuracy": 1.0, "interactivity": 1.0, "token_amount": -1e-4}


def test_seeded_runs_repeat_and_clones_are_independent(math_env):
    def sampled(obs, rng):
        return f"reply {int(rng.integers(1000))}"

    def run(seed):
        env = MultiturnAwareReward(math_env.clone(), policies={"assistant": CallablePolicy(sampled), "user": replay_user()},
                                   weights={"token_amount": -0.01}, return_futures=True)
        env.reset(seed=seed, options={"index": 1})
        return env.step({"assistant": "A1"})[4]["assistant"]["mr"]["futures"]

    a, b, c = run(3), run(3), run(4)
    assert a == b and a != c
    assert a[0] != a[1]  # rollouts get different seeds

    env = MultiturnAwareReward(math_env, policies={"assistant": numbered_assistant(), "user": replay_user()},
                               weights={"test_future_len": 0.1})
    env.reset(seed=0, options={"index": 0})
    twin = env.clone()
    twin.step({"assistant": "A1"})
    assert env.stats["rewards"] == 0 and twin.stats["rewards"] == 1
    assert len(env.episode.messages) + 1 == len(twin.episode.messages)


def test_futures_run_concurrently(math_env):
    """All futures are in flight at once: the policy sees their calls overlap."""
    state = {"now": 0, "peak": 0}

    class Slow:
        async def act(self, observations, **sampling):
            state["now"] += 1
            state["peak"] = max(state["peak"], state["now"])
            await asyncio.sleep(0.01)
            state["now"] -= 1
            return [Completion(text="ok", finish_reason="stop") for _ in observations]

    env = MultiturnAwareReward(math_env, policies={"assistant": Slow(), "user": Slow()},
                               weights={"test_future_len": 0.1}, num_rollouts=5)
    env.reset(seed=0, options={"index": 0})
    env.step({"assistant": "A1"})
    assert state["peak"] == 5


def test_parallel_api(math_env):
    env = MultiturnAwareReward(math_env, policies={"assistant": numbered_assistant(), "user": replay_user()},
                               weights={"test_future_len": 0.1, "token_amount": -1e-4}, num_rollouts=2)
    parallel_api_test(env, num_cycles=10)


# ---------------------------------------------------------------------------------------------
# Conversation-level reward
# ---------------------------------------------------------------------------------------------
def test_conversation_reward_scores_the_finished_episode_once(math_env):
    env = ConversationReward(math_env, weights={"token_amount": -0.1, "test_said_yes": 1.0})
    env.reset(seed=0, options={"index": 1})  # odd rows have a 3-message prefix (not counted)
    total = {"assistant": 0.0}
    done = False
    moves = iter(["one", "YES two words", "three"])
    while not done:
        if env.on_turn == ("assistant",):
            act = {"assistant": next(moves, "more")}
        else:
            act = {"user": f"user says {len(env.episode.messages)}"}
        _, rewards, terms, truncs, infos = env.step(act)
        total["assistant"] += rewards["assistant"]
        done = terms["assistant"] or truncs["assistant"]
        if not done:
            assert rewards["assistant"] == 0.0
    cr = infos["assistant"]["conversation_reward"]
    words = sum(len(m.content.split()) for m in env.episode.messages[cr_start(env):] if m.audience is None
                and m.role != "system")
    assert cr["metrics"]["token_amount"]["value"] == words
    assert cr["metrics"]["test_said_yes"]["value"] == 1.0
    assert total["assistant"] == pytest.approx(1.0 - 0.1 * words)


def cr_start(env):
    prefix = [i for i, m in enumerate(env.episode.messages) if m.meta.get("from_data")]
    return prefix[-1] + 1


# ---------------------------------------------------------------------------------------------
# The CollabLLM default rewards
# ---------------------------------------------------------------------------------------------


def test_default_reward_of_math_hard(math_env):
    judge = JsonJudgeBackend()
    env = default_reward(math_env, judge=judge, user=replay_user(), policy=FixedTextPolicy("sure thing"))
    assert isinstance(env, MultiturnAwareReward)
    env.reset(seed=0, options={"index": 0})
    _, rewards, _, _, infos = env.step({"assistant": "what do you mean"})
    m = infos["assistant"]["mr"]["metrics"]
    assert m["accuracy"]["mean"] == 1.0
    assert m["interactivity"]["mean"] == pytest.approx((1 + 0.7 + 0.3) / 3)
    # words: reply 4 + user 1 + "sure thing" 2 + user 1 = 8 -> -8e-4
    assert m["token_amount"]["mean"] == 8.0
    assert rewards["assistant"] == pytest.approx(1 + 2 / 3 - 8e-4)
    assert infos["assistant"]["mr"]["cost"]["judge_calls"] == 6.0
    # the judge never sees the hidden goal message
    assert not any("HIDDEN-GOAL" in fenced(p, "conversation") for p in judge.prompts)


def test_default_reward_needs_a_judge_for_judge_metrics(math_env):
    with pytest.raises(ConfigError, match="need an LLM judge"):
        default_reward(math_env, user=replay_user(), policy="answer-at-once")


def test_default_rewards_of_medium_and_bigcodebench(tmp_path):
    path = write_collabllm_fixture(tmp_path / "rows.jsonl", n=2)
    medium = collab_env.make("collabllm-medium", data_files=str(path), reward="conversation")
    assert isinstance(medium, ConversationReward)
    assert medium.metric_set.weights == {"bleu_score": 1.0, "token_amount": -1e-4}
    code = collab_env.make("collabllm-bigcodebench", data_files=str(path), reward="mr",
                           reward_kwargs={"max_user_turns": 0, "judge": JsonJudgeBackend()})
    # CollabLLM weighs the judged interactivity on bigcodebench (llm_rw_weight 1), not on medium
    assert code.weights == {"pass_rate": 1.0, "interactivity": 1.0, "token_amount": -1e-4}


def test_make_with_reward_and_view(tmp_path):
    path = write_collabllm_fixture(tmp_path / "rows.jsonl", n=2)
    env = collab_env.make("collabllm-math-hard", data_files=str(path), view="assistant",
                          reward="mr", reward_kwargs={"judge": JsonJudgeBackend(), "user": replay_user(),
                                                      "policy": FixedTextPolicy("ok"), "num_rollouts": 2})
    env.reset(seed=0, options={"index": 0})
    _, reward, _, _, info = env.step("hello there")
    assert info["mr"]["num_rollouts"] == 2
    assert math.isfinite(reward) and reward == pytest.approx(info["reward_components"]["mr"])
    with pytest.raises(ConfigError, match="reward must be"):
        collab_env.make("collabllm-math-hard", data_files=str(path), reward="multiturn")
    with pytest.raises(ConfigError, match="reward_kwargs"):
        collab_env.make("collabllm-math-hard", data_files=str(path), reward_kwargs={"judge": "x"})


def test_stepped_directly_the_wrapper_needs_the_rewarded_players_policy(math_env):
    """``env.step`` on an MR env built without a policy for the rewarded player fails with the
    fix; played through the episode driver, the driver's policy plays the futures."""
    from collab_env.rollout import run_episode

    env = MultiturnAwareReward(math_env, policies={"user": replay_user()}, weights={"test_future_len": 0.1},
                               num_rollouts=1)
    env.reset(seed=0, options={"index": 0})
    with pytest.raises(ConfigError, match="needs a policy for 'assistant'.*episode driver"):
        env.clone().step({"assistant": "A1"})
    fixed = MultiturnAwareReward(math_env, policies={"assistant": FixedTextPolicy("fixed"), "user": replay_user()},
                                 weights={"test_future_len": 0.1}, num_rollouts=1, return_futures=True)
    fixed.reset(seed=0, options={"index": 0})
    _, _, _, _, infos = fixed.step({"assistant": "A1"})
    assert infos["assistant"]["mr"]["scored"] == 1
    assert [m["content"] for m in infos["assistant"]["mr"]["futures"][0] if m["role"] == "assistant"] == ["A1", "fixed"]
    # Through the driver, the same env's futures are the driver's assistant, not the fixed one.
    ep = run_episode(fixed, {"assistant": FixedTextPolicy("live"), "user": replay_user()}, seed=0, index=0,
                     max_turns={"assistant": 1})
    mr = ep.info["scores"][0]["mr"]
    assert mr["policies"]["assistant"] == "fixed:'live'"
    assert [m["content"] for m in mr["futures"][0] if m["role"] == "assistant"] == ["live", "live"]


def test_each_run_plays_its_own_drivers_policy(math_env):
    """One env reused across samples with different policies (verl's per-sample policy, an
    async frozen copy): each run's futures are played by that run's policy, with nothing to
    bind or unbind in between, so no stale policy can play."""
    from collab_env.rollout import run_episode

    env = MultiturnAwareReward(math_env, policies={"user": replay_user()}, weights={"test_future_len": 0.1},
                               num_rollouts=1, return_futures=True, sampling={"assistant": {"max_new_tokens": 9}})
    for text in ("first", "second", "first"):
        ep = run_episode(env, {"assistant": FixedTextPolicy(text), "user": replay_user()}, seed=0, index=0,
                         max_turns={"assistant": 1})
        future = ep.info["scores"][0]["mr"]["futures"][0]
        assert [m["content"] for m in future if m["role"] == "assistant"] == [text, text]
    assert env.scorer.sampling == {"assistant": {"max_new_tokens": 9}}  # the driver's never sticks


# ---------------------------------------------------------------------------------------------
# The verl rule's edge cases (collabllm_agent_loop / collabllm interaction / reward manager)
# ---------------------------------------------------------------------------------------------
class CountingAssistant:
    """Replies 'A<k> words here' (3 words) and counts its calls."""

    def __init__(self):
        self.calls = 0

    async def act(self, observations, **sampling):
        out = []
        for obs in observations:
            self.calls += 1
            k = 1 + sum(1 for m in obs if m.author == "assistant")
            out.append(Completion(text=f"A{k} words here", finish_reason="stop"))
        return out


INVALID_REPLIES = [
    "",                                          # empty
    "   \n",                                     # blank
    "<think>plan it</think>",                   # think only: no visible text
    "<think>plan it</think>  <|im_end|>",       # only the end-of-turn marker is visible
    "<think>plan it answer",                     # unbalanced
    "answer </think>",                           # unbalanced
    "<think> </think> answer",                   # empty think block
    "<think>a</think><think>b</think> answer",   # two blocks
    "<think><think>a</think></think> answer",    # nested
    "</think> answer <think>",                   # closing before opening
]


@pytest.mark.parametrize("reply", INVALID_REPLIES)
def test_verl_gives_an_invalid_reply_zero_without_futures(math_env, reply):
    from collab_env.rewards.reply_rules import is_valid_reply

    assert not is_valid_reply(reply)
    assistant = CountingAssistant()
    user = CallablePolicy(lambda obs: "user words", name="u")
    env = MultiturnAwareReward(math_env, policies={"assistant": assistant, "user": user},
                               weights={"test_future_len": 0.1, "token_amount": -0.01})
    env.reset(seed=0, options={"index": 0})
    _, rewards, _, _, infos = env.step({"assistant": reply})
    mr = infos["assistant"]["mr"]
    assert rewards["assistant"] == 0.0 and mr["zero_reason"] == "invalid_reply"
    assert mr["num_rollouts"] == 0 and mr["scored"] == 0 and assistant.calls == 0
    assert infos["assistant"]["reward_components"]["mr"] == 0.0


def test_valid_replies_by_the_verl_rule():
    from collab_env.rewards.reply_rules import is_valid_reply

    for ok in ("answer", "<think>plan</think> answer", "answer<|im_end|>", "<think>\nplan\n</think>\n\nanswer"):
        assert is_valid_reply(ok), ok


def test_other_rules_score_an_empty_reply(math_env):
    # the collabllm package checks nothing: reply "" + U + A + U = 4 messages * 0.1
    env = MultiturnAwareReward(math_env, policies={"assistant": numbered_assistant(), "user": replay_user()},
                               weights={"test_future_len": 0.1}, aggregation="collabllm", num_rollouts=1)
    env.reset(seed=0, options={"index": 0})
    _, rewards, _, _, infos = env.step({"assistant": ""})
    assert rewards["assistant"] == pytest.approx(0.4) and infos["assistant"]["mr"]["zero_reason"] is None


def test_verl_think_only_reply_is_zero_and_collabllm_scores_it(math_env):
    reply = "<think>I should ask about the sum first</think>"
    for rule, expected in (("verl", 0.0), ("collabllm", 0.4)):
        env = MultiturnAwareReward(math_env.clone(), policies={"assistant": numbered_assistant(), "user": replay_user()},
                                   weights={"test_future_len": 0.1}, aggregation=rule, num_rollouts=1)
        env.reset(seed=0, options={"index": 0})
        _, rewards, _, _, _ = env.step({"assistant": reply})
        assert rewards["assistant"] == pytest.approx(expected), rule


def test_verl_reply_after_the_turn_budget_is_zero(math_env, tmp_path):
    # max_assistant_turns=1: the reply spends the budget; verl ends the sample before any user turn.
    assistant = CountingAssistant()
    env = MultiturnAwareReward(math_env, policies={"assistant": assistant, "user": replay_user()},
                               weights={"test_future_len": 0.1}, max_assistant_turns=1)
    env.reset(seed=0, options={"index": 0})
    _, rewards, _, _, infos = env.step({"assistant": "a fine answer"})
    assert rewards["assistant"] == 0.0 and infos["assistant"]["mr"]["zero_reason"] == "turn_budget"
    # the collabllm rule scores the conversation as it stands: only the reply -> 1 * 0.1
    env = MultiturnAwareReward(math_env.clone(), policies={"assistant": assistant, "user": replay_user()},
                               weights={"test_future_len": 0.1}, max_assistant_turns=1, aggregation="collabllm")
    env.reset(seed=0, options={"index": 0})
    assert env.step({"assistant": "a fine answer"})[1]["assistant"] == pytest.approx(0.1)
    # the env's own step budget spent at the reply (a truncation): 0 under verl
    path = write_collabllm_fixture(tmp_path / "rows.jsonl", n=2)
    short = collab_env.make("collabllm-math-hard", data_files=str(path), max_steps=1)
    env = MultiturnAwareReward(short, policies={"assistant": assistant, "user": replay_user()},
                               weights={"test_future_len": 0.1})
    env.reset(seed=0, options={"index": 0})
    _, rewards, _, truncs, infos = env.step({"assistant": "a fine answer"})
    assert truncs["assistant"] and rewards["assistant"] == 0.0
    assert infos["assistant"]["mr"]["zero_reason"] == "turn_budget"
    assert assistant.calls == 0


def test_a_reply_that_fills_the_token_budget_is_zero(math_env):
    env = MultiturnAwareReward(math_env, policies={"assistant": numbered_assistant(), "user": replay_user()},
                               weights={"test_future_len": 0.1}, future_token_budget=3)
    env.reset(seed=0, options={"index": 0})
    _, rewards, _, _, infos = env.step({"assistant": "one two three"})  # 3 words >= 3
    assert rewards["assistant"] == 0.0 and infos["assistant"]["mr"]["zero_reason"] == "token_budget"


def test_a_future_cut_by_the_token_budget(math_env):
    # budget 8 words, shared: reply "A1 reply" 2 -> U "FUTURE-USER-0-1" 1 (3) -> "A2 words here" 3 (6 < 8,
    # kept) -> U 1 (7) -> "A3 words here" 3 (10 >= 8: generated, dropped, the future ends).
    assistant = CountingAssistant()
    env = MultiturnAwareReward(math_env, policies={"assistant": assistant, "user": replay_user()},
                               weights={"test_future_len": 0.1}, max_user_turns=10, max_assistant_turns=10,
                               num_rollouts=2, future_token_budget=8, return_futures=True)
    env.reset(seed=0, options={"index": 0})
    _, rewards, _, _, infos = env.step({"assistant": "A1 reply"})
    mr = infos["assistant"]["mr"]
    for fut in mr["futures"]:
        assert [m["content"] for m in fut] == ["A1 reply", "FUTURE-USER-0-1", "A2 words here", "FUTURE-USER-0-2"]
    assert mr["dropped_turns"] == [1, 1] and mr["future_turns"] == [3, 3]
    assert assistant.calls == 4  # A2 and the dropped A3, per future
    assert rewards["assistant"] == pytest.approx(0.4)
    # a tokenizer counts instead of words: 2 "tokens" per character pair would cut earlier
    env = MultiturnAwareReward(math_env.clone(), policies={"assistant": CountingAssistant(), "user": replay_user()},
                               weights={"test_future_len": 0.1}, max_user_turns=10, max_assistant_turns=10,
                               num_rollouts=1, future_token_budget=20, token_counter=len, return_futures=True)
    env.reset(seed=0, options={"index": 0})
    # chars: "A1 reply" 8, "FUTURE-USER-0-1" 15 (23), "A2 words here" 13 -> 36 >= 20: dropped
    fut = env.step({"assistant": "A1 reply"})[4]["assistant"]["mr"]["futures"][0]
    assert [m["content"] for m in fut] == ["A1 reply", "FUTURE-USER-0-1"]
    with pytest.raises(ConfigError, match="future_token_budget"):
        MultiturnAwareReward(math_env, max_user_turns=0, weights={"token_amount": -1}, future_token_budget=0)


async def _sees_think(conversation, item, *, start=0, **ctx):
    """1 when a message from ``start`` on still holds a <think> tag."""
    return MetricResult(float(any("<think>" in m.content for m in conversation.messages[start:])))


register_metric("test_sees_think", _sees_think, overwrite=True)


def test_verl_strips_think_for_judges_and_the_user_simulator(math_env):
    seen = []

    def user_fn(obs):
        seen.append(any("<think>" in m.content for m in obs))
        return "ok"

    for rule, judge_sees in (("verl", 0.0), ("collabllm", 1.0)):
        seen.clear()
        env = MultiturnAwareReward(
            math_env.clone(),
            policies={"assistant": FixedTextPolicy("<think>secret plan</think> A2"), "user": CallablePolicy(user_fn)},
            weights={"test_sees_think": 1.0}, aggregation=rule, num_rollouts=1)
        env.reset(seed=0, options={"index": 0})
        _, rewards, _, _, _ = env.step({"assistant": "<think>hidden</think> visible reply"})
        assert rewards["assistant"] == judge_sees, rule
        assert seen == [judge_sees == 1.0] * 2, rule  # the user read two transcripts
    # token_amount reads the stripped text too: "<think>a b c</think> hi" -> "hi" (1 word) under verl,
    # 4 whitespace words under collabllm; immediate reward, weight -0.1
    for rule, expected in (("verl", -0.1), ("collabllm", -0.4)):
        env = MultiturnAwareReward(math_env.clone(), weights={"token_amount": -0.1}, max_user_turns=0, aggregation=rule)
        env.reset(seed=0, options={"index": 0})
        assert env.step({"assistant": "<think>a b c</think> hi"})[1]["assistant"] == pytest.approx(expected)


# ---------------------------------------------------------------------------------------------
# on_fault="zero" (verl's numbers)
# ---------------------------------------------------------------------------------------------
def test_on_fault_zero_scores_a_failed_judge_zero(math_env):
    calls = {"n": 0}

    def fn(obs):
        calls["n"] += 1
        return "BAD" if calls["n"] == 1 else "fine"

    env = MultiturnAwareReward(math_env, policies={"assistant": CallablePolicy(fn), "user": replay_user()},
                               weights={"test_judge_fault": 1.0, "test_future_len": 0.1}, on_fault="zero")
    env.reset(seed=0, options={"index": 0})
    _, rewards, _, _, infos = env.step({"assistant": "A1"})
    mr = infos["assistant"]["mr"]
    # judge values [0, 1, 1] in some order -> mean 2/3; every future has 4 messages -> 0.4
    assert mr["scored"] == 3 and sorted(mr["metrics"]["test_judge_fault"]["values"]) == [0.0, 1.0, 1.0]
    assert rewards["assistant"] == pytest.approx(2 / 3 + 0.4)
    assert len(mr["faults"]) == 1 and mr["faults"][0]["zeroed"] is True
    assert mr["faults"][0]["stage"] == "metric:test_judge_fault" and mr["cost"]["faults"] == 1
    assert env.stats["faults"] == 1


def test_on_fault_zero_gives_a_failed_simulator_an_empty_message(math_env):
    env = MultiturnAwareReward(math_env, policies={"assistant": numbered_assistant(), "user": FaultOnCalls({2})},
                               weights={"test_future_len": 0.1}, on_fault="zero", return_futures=True)
    env.reset(seed=0, options={"index": 0})
    _, rewards, _, _, infos = env.step({"assistant": "A1"})
    mr = infos["assistant"]["mr"]
    assert mr["scored"] == 3 and rewards["assistant"] == pytest.approx(0.4)  # 4 messages each, none dropped
    empties = [f for f in mr["futures"] if any(m["role"] == "user" and m["content"] == "" for m in f)]
    assert len(empties) == 1
    assert len(mr["faults"]) == 1 and mr["faults"][0]["zeroed"] is True and mr["faults"][0]["player"] == "user"
    # a failed policy of the rewarded player is no user message: it raises, as verl's rollout fails
    env = MultiturnAwareReward(math_env.clone(), policies={"assistant": Boom(), "user": replay_user()},
                               weights={"test_future_len": 0.1}, on_fault="zero")
    env.reset(seed=0, options={"index": 0})
    with pytest.raises(PolicyError, match="on_fault='zero'"):
        env.step({"assistant": "A1"})
    with pytest.raises(ConfigError, match="on_fault must be one of"):
        MultiturnAwareReward(math_env, max_user_turns=0, weights={"token_amount": -1}, on_fault="ignore")


# ---------------------------------------------------------------------------------------------
# MR needs an explicit user when the default one ignores the candidate
# ---------------------------------------------------------------------------------------------
def test_mr_on_collabllm_without_user_is_a_config_error(tmp_path):
    path = write_collabllm_fixture(tmp_path / "rows.jsonl", n=2)
    with pytest.raises(ConfigError, match="explicit user simulator") as err:
        collab_env.make("collabllm-math-hard", data_files=str(path), reward="mr")
    for choice in ("'embedded'", "litellm:openai/gpt-4o-mini", "policy object", "'replay'", "ignores"):
        assert choice in str(err.value), choice
    base = collab_env.make("collabllm-math-hard", data_files=str(path))
    with pytest.raises(ConfigError, match="explicit user simulator"):
        MultiturnAwareReward(base, policies={"assistant": FixedTextPolicy("x")}, weights={"test_future_len": 1.0})
    # the immediate reward rolls nothing and needs no user
    collab_env.make("collabllm-bigcodebench", data_files=str(path), reward="mr",
                    reward_kwargs={"max_user_turns": 0, "judge": JsonJudgeBackend()})


def test_user_replay_selects_the_recorded_turns_on_purpose(tmp_path):
    from collab_env.tasks.collabllm import SessionReplayUser

    path = write_collabllm_fixture(tmp_path / "rows.jsonl", n=2)
    env = collab_env.make("collabllm-math-hard", data_files=str(path), reward="mr",
                          reward_kwargs={"judge": JsonJudgeBackend(), "user": "replay",
                                         "policy": FixedTextPolicy("ok"), "num_rollouts": 1, "return_futures": True})
    assert isinstance(env.scorer.named["user"], SessionReplayUser)
    env.reset(seed=0, options={"index": 0})
    fut = env.step({"assistant": "hello"})[4]["assistant"]["mr"]["futures"][0]
    assert fut[1]["content"] == "FUTURE-USER-0-1"


def test_a_reactive_default_user_stays_the_default():
    # hidden-facts' scripted user answers the reply's questions: no user= needed
    env = MultiturnAwareReward(collab_env.make("hidden-facts-easy"), policies={"assistant": FixedTextPolicy("ok")},
                               weights={"test_future_len": 0.1}, num_rollouts=1)
    env.reset(seed=0)
    _, rewards, _, _, infos = env.step({"assistant": "What is your name?"})
    assert infos["assistant"]["mr"]["scored"] == 1
    with pytest.raises(ConfigError, match="not a replaying one"):
        MultiturnAwareReward(collab_env.make("hidden-facts-easy"),
                             policies={"assistant": FixedTextPolicy("ok"), "user": "replay"},
                             weights={"test_future_len": 0.1})


# ---------------------------------------------------------------------------------------------
# The typed learner binding and the one episode driver
# ---------------------------------------------------------------------------------------------
class RecordingPolicy:
    """Replies 'bound words' and records the sampling keywords of every call."""

    def __init__(self):
        self.seen = []

    async def act(self, observations, **sampling):
        self.seen.append(dict(sampling))
        return [Completion(text="bound words", finish_reason="stop") for _ in observations]


def test_the_drivers_policy_plays_the_futures_with_its_own_sampling(math_env):
    """A learner passes its live model to the driver: the futures play it with the learner's
    sampling keywords over the reward's own, key by key (``None``: not set), and a reward built
    with the driver's table changes nothing in the reward's configuration."""
    from collab_env.rollout.driver import advance

    env = MultiturnAwareReward(math_env, policies={"user": replay_user()},
                               weights={"test_future_len": 0.1}, num_rollouts=2,
                               sampling={"assistant": {"temperature": 0.5, "max_new_tokens": 4}})
    learner = RecordingPolicy()
    obs, infos = env.reset(seed=5, options={"index": 0})
    run = asyncio.run(advance(env, {"assistant": learner, "user": replay_user()}, obs=obs, infos=infos,
                              until=("assistant",), actions={"assistant": "A1 reply"},
                              sampling={"assistant": {"max_new_tokens": 9, "temperature": None, "top_p": 0.9}}))
    rewards, infos = run.steps[0].rewards, run.steps[0].infos
    # reply, U, A, U per future (verl window): one learner call per future, 4 messages * 0.1
    assert len(learner.seen) == 2 and rewards["assistant"] == pytest.approx(0.4)
    for kw in learner.seen:
        assert kw["max_new_tokens"] == 9 and kw["temperature"] == 0.5 and kw["top_p"] == 0.9
        assert isinstance(kw["seed"], int)  # the future's own seed travels with the sampling
    assert infos["assistant"]["mr"]["cost"]["policy_calls"] == 6.0  # per future: 2 user calls + 1 learner call
    assert run.scores == [{"step": 0, "player": "assistant", "mr": infos["assistant"]["mr"]}]
    # Without the driver's sampling, the reward's own settings.
    obs, infos = env.reset(seed=5, options={"index": 0})
    asyncio.run(advance(env, {"assistant": learner, "user": replay_user()}, obs=obs, infos=infos,
                        until=("assistant",), actions={"assistant": "A1 reply"}))
    assert {k: v for k, v in learner.seen[-1].items() if k != "seed"} == {"temperature": 0.5, "max_new_tokens": 4}
    with pytest.raises(ConfigError, match="unknown sampling parameter"):
        MultiturnAwareReward(math_env, policies={"user": replay_user()}, sampling={"assistant": {"max_tokens": 9}})
    with pytest.raises(ConfigError, match="unknown player"):
        MultiturnAwareReward(math_env, policies={"user": replay_user()}, sampling={"bot": {"max_new_tokens": 9}})


def test_futures_are_played_by_the_episode_driver(math_env, monkeypatch):
    from collab_env.rewards import mr as mr_module
    from collab_env.rollout import driver

    calls = []

    async def counted(env, policies, **kw):
        calls.append(sorted(kw))
        return await driver.advance(env, policies, **kw)

    monkeypatch.setattr(mr_module, "advance", counted)
    env = MultiturnAwareReward(math_env, policies={"assistant": numbered_assistant(), "user": replay_user()},
                               weights={"test_future_len": 1.0}, num_rollouts=3)
    env.reset(seed=0, options={"index": 0})
    env.step({"assistant": "A1 reply"})
    assert len(calls) == 3  # one driver call per future, no loop of its own
    assert all({"before_step", "on_moves", "seed", "sampling"} <= set(c) for c in calls)


# ---------------------------------------------------------------------------------------------
# Progress of a rewarded step
# ---------------------------------------------------------------------------------------------
def test_progress_lines_count_futures_rolled_and_scored(math_env, capsys, monkeypatch):
    from collab_env.rewards import mr as mr_module

    monkeypatch.setattr(mr_module, "PROGRESS_DELAY_S", 0.0)
    env = MultiturnAwareReward(math_env, policies={"assistant": numbered_assistant(), "user": replay_user()},
                               weights={"test_future_len": 1.0}, num_rollouts=2, progress=True)
    env.reset(seed=0, options={"index": 0})
    env.step({"assistant": "A1 reply"})
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("MR assistant")]
    # 2 futures -> 4 stages (rolled, scored each); a total under 10 prints a line per stage
    assert [ln.split(": ")[1].split(" (")[0] for ln in lines] == ["1/4 stages", "2/4 stages", "3/4 stages",
                                                                   "4/4 stages"]
    assert "rolled 2, scored 2" in lines[-1] and lines[-1].startswith("MR assistant (2 futures): 4/4 stages (100%")


def test_progress_counts_a_faulted_future_as_faulted_not_scored(math_env, capsys, monkeypatch):
    from collab_env.rewards import mr as mr_module

    monkeypatch.setattr(mr_module, "PROGRESS_DELAY_S", 0.0)
    env = MultiturnAwareReward(math_env, policies={"assistant": numbered_assistant(), "user": FaultOnCalls({2})},
                               weights={"test_future_len": 0.1}, progress=True)
    env.reset(seed=0, options={"index": 0})
    env.step({"assistant": "A1"})
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("MR assistant")]
    # 3 futures -> 6 stages; the faulted one ends both of its stages at once
    assert lines[-1].startswith("MR assistant (3 futures): 6/6 stages (100%")
    assert "rolled 2, scored 2, faulted 1" in lines[-1]


def test_progress_is_off_when_stderr_is_not_a_terminal_or_the_step_is_quick(math_env, capsys, monkeypatch):
    from collab_env.rewards import mr as mr_module

    for progress, delay in ((None, 0.0), (False, 0.0), (True, 3600.0)):
        monkeypatch.setattr(mr_module, "PROGRESS_DELAY_S", delay)
        env = MultiturnAwareReward(math_env, policies={"assistant": numbered_assistant(), "user": replay_user()},
                                   weights={"test_future_len": 1.0}, num_rollouts=2, progress=progress)
        env.reset(seed=0, options={"index": 0})
        env.step({"assistant": "A1 reply"})
        assert "MR assistant" not in capsys.readouterr().err, (progress, delay)

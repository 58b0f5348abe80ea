"""The env cards' reward ranges hold: episodes built to reach each bound reach it, and no
constructed episode leaves the card's range (the ranges of collab_env.tasks.cards)."""

import math

import pytest

import collab_env
from collab_env.errors import ConfigError
from collab_env.policy import FixedTextPolicy
from collab_env.rewards.joint import JointReward
from collab_env.rollout import run_episode
from collab_env.tasks.cooperative import length_ratio_reward
from collab_env.testing.versions import building
from collab_env.types import Completion

#: 99,999 characters, 50,000 whitespace words: the longest word count a message can have
#: under the default max_message_chars (100,000).
LONG = " ".join(["w"] * 50_000)
ASK = FixedTextPolicy("How many items do you need, and what is the price of each?")


class FixedJudge:
    """A judge backend that scores every accuracy question ``good`` and every interactivity
    rubric item 1 (good) or 0."""

    name = "fixed-judge"

    def __init__(self, good: bool):
        self.good = good

    async def act(self, observations, **sampling):
        out = []
        for obs in observations:
            if "reference answer" in obs.messages[-1].content:
                text = '{"reason": "fixed", "score": ' + ("true" if self.good else "false") + "}"
            else:
                v = int(self.good)
                text = f'{{"understanding": {v}, "clarification": {v}, "suggestions": {v}}}'
            out.append(Completion(text=text, finish_reason="stop", usage={"model_calls": 1}))
        return out


def ret(env_id, policies, *, reward=None, reward_kwargs=None, player=None, **kw):
    env = collab_env.make(env_id, reward=reward, reward_kwargs=reward_kwargs, **kw)
    ep = run_episode(env, policies, seed=0)
    return ep.returns[player or collab_env.spec(env_id).trainable[0]]


def card_range(env_id, option):
    return collab_env.spec(env_id).card.reward_range[option]


def test_hidden_facts_ranges_are_reached():
    env_id = "hidden-facts-v3"
    lo, hi = card_range(env_id, "mr")
    # Six asking turns, each judged accurate by its futures; the user never ends the chat.
    best = ret(env_id, {"assistant": ASK, "user": FixedTextPolicy("Go on.")}, reward="mr",
               reward_kwargs={"judge": FixedJudge(True), "policy": ASK})
    assert (lo, hi) == (0.0, 6.0) and best == 6.0
    worst = ret(env_id, {"assistant": ASK, "user": "hidden-facts-user"}, reward="mr",
                reward_kwargs={"judge": FixedJudge(False), "policy": ASK})
    assert worst == 0.0
    assert card_range(env_id, "conversation") == (0.0, 1.0)
    assert ret(env_id, {"assistant": ASK, "user": "hidden-facts-user"}, reward="conversation",
               reward_kwargs={"judge": FixedJudge(True)}) == 1.0
    # cost_per_turn=c: a wrong answer on the sixth assistant turn gets 0 - 5c (the card's [-5c, 1]).
    late_wrong = [ASK] * 5
    turns = iter(late_wrong + [FixedTextPolicy("\\boxed{-1}")])

    class Late(FixedTextPolicy):
        def respond(self, observation, rng):
            return next(turns).text

    assert ret(env_id, {"assistant": Late("x"), "user": FixedTextPolicy("Go on.")},
               cost_per_turn=0.1) == pytest.approx(-0.5, abs=1e-12)  # 0.1 * 5, float rounding only


def test_length_ratio_joint_ranges_are_reached():
    env_id = "length-ratio-v0"
    got = {}
    for brief, detailed in (("Hi", "Hello"), ("H", "x" * 99_999), ("", "Hello"), ("Hi", "")):
        for mode in ("shared", "difference"):
            env = JointReward(collab_env.make(env_id), length_ratio_reward, mode=mode)
            ep = run_episode(env, {"agent_0": FixedTextPolicy(brief), "agent_1": FixedTextPolicy(detailed)}, seed=0)
            got[(brief, len(detailed), mode)] = ep.returns
    for (_, _, mode), r in got.items():
        lo, hi = card_range(env_id, f"joint-{mode}")
        assert all(lo <= v <= hi for v in r.values())
    # ratio 2.5: r = 1; agent_1's counterfactual (empty detailed answer) scores exp(-2).
    assert got[("Hi", 5, "difference")] == {"agent_0": 1.0, "agent_1": 1.0 - math.exp(-2.0)}
    # ratio 99,999: r = exp(-99,996), 0 in float64, so agent_1 gets the lower bound -exp(-2).
    assert got[("H", 99_999, "difference")]["agent_1"] == -math.exp(-2.0) == card_range(env_id, "joint-difference")[0]


def test_length_ratio_has_no_mr_or_conversation():
    for reward in ("mr", "conversation"):
        kw = {"judge": FixedJudge(True), "player": "agent_0"}
        if reward == "mr":
            kw["policy"] = FixedTextPolicy("x")
        with pytest.raises(ConfigError, match="length_ratio.*not registered metrics"):
            ret("length-ratio", {"agent_0": FixedTextPolicy("a"), "agent_1": FixedTextPolicy("b")},
                reward=reward, reward_kwargs=kw)
    assert set(collab_env.spec("length-ratio").card.reward_range) == {"default", "joint-shared", "joint-difference"}


def test_team_facts_has_no_mr_or_conversation():
    env_id = "team-facts-easy"
    pols = {**{a: FixedTextPolicy("a") for a in collab_env.spec(env_id).trainable}, "user": FixedTextPolicy("u")}
    for reward in ("mr", "conversation"):
        kw = {"judge": FixedJudge(True), "player": "agent_0"}
        if reward == "mr":
            kw["policy"] = FixedTextPolicy("x")
        with pytest.raises(ConfigError, match="question_cost.*not registered metrics"):
            ret(env_id, pols, reward=reward, reward_kwargs=kw)


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    from collab_env.testing.collabllm_fixtures import write_collabllm_fixture

    return str(write_collabllm_fixture(tmp_path_factory.mktemp("cl") / "rows.jsonl", layout="list", fmt="jsonl"))


def test_collabllm_math_hard_ranges_are_reached(data_file):
    env_id = "collabllm-math-hard-v1"
    assert card_range(env_id, "default") == (0.0, 0.0)
    assert ret(env_id, {"assistant": ASK, "user": FixedTextPolicy("Go on.")}, data_files=data_file) == 0.0
    lo, hi = card_range(env_id, "mr")
    worst = ret(env_id, {"assistant": FixedTextPolicy(LONG), "user": FixedTextPolicy("Go on.")}, reward="mr",
                reward_kwargs={"judge": FixedJudge(False), "policy": FixedTextPolicy(LONG),
                               "user": FixedTextPolicy("Go on."), "num_rollouts": 1}, data_files=data_file)
    assert (lo, hi) == (-9.0, 18.0) and worst == -9.0  # 9 scored moves, each clamped at -1
    ok = FixedTextPolicy("ok")
    best = ret(env_id, {"assistant": ok, "user": FixedTextPolicy("Go on.")}, reward="mr",
               reward_kwargs={"judge": FixedJudge(True), "policy": ok, "user": FixedTextPolicy("Go on."),
                              "num_rollouts": 1}, data_files=data_file)
    assert 17.99 < best < hi  # 9 x (1 + 1 - 1e-4 x a few words)
    lo, hi = card_range(env_id, "conversation")
    worst = ret(env_id, {"assistant": FixedTextPolicy(LONG), "user": FixedTextPolicy(LONG)}, reward="conversation",
                reward_kwargs={"judge": FixedJudge(False)}, data_files=data_file, mode="eval")
    assert (lo, hi) == (-100.0, 2.0) and worst == pytest.approx(-100.0, abs=1e-9)  # 20 x 50,000 words x 1e-4


def test_collabllm_medium_ranges(data_file):
    env_id = "collabllm-medium-v1"
    long = FixedTextPolicy(LONG)
    assert card_range(env_id, "mr") == (-9.0, 9.0) and card_range(env_id, "conversation") == (-100.0, 1.0)
    assert ret(env_id, {"assistant": long, "user": long}, reward="mr",
               reward_kwargs={"policy": long, "user": long, "num_rollouts": 1}, data_files=data_file) == -9.0
    # BLEU of a run of 'w's against the reference is 0, so only the token penalty counts.
    assert ret(env_id, {"assistant": long, "user": long}, reward="conversation",
               data_files=data_file, mode="eval") == pytest.approx(-100.0, abs=1e-9)


def test_every_card_reward_option_builds_through_make():
    """make(id, reward=option) builds each option a card lists (the joint-* ones from the
    spec's reward_options), or says what is missing (an LLM judge); no option is unreachable."""
    for env_id in collab_env.list_envs():
        s = collab_env.spec(env_id)
        if s.needs_data:
            continue
        with building(env_id):  # every id, superseded ones too
            collab_env.make(env_id).reset(seed=0)
            for option in s.card.reward_range:
                if option == "default":
                    continue
                try:
                    env = collab_env.make(env_id, reward=option)
                except ConfigError as exc:
                    # mr and conversation need a judge or a future policy here: the error says which to pass
                    assert option in ("mr", "conversation") and "pass " in str(exc), (env_id, option, exc)
                    continue
                env.reset(seed=0)
        assert set(s.reward_options) <= set(s.card.reward_range), env_id


def test_a_joint_option_through_make_is_the_joint_reward_by_hand():
    from collab_env.tasks.team import team_round_reward_per_agent

    pols = {"agent_0": "team-naive", "agent_1": "team-naive", "user": "team-facts-user"}
    by_make = ret("team-facts-easy", pols, reward="joint-per_agent", player="agent_1")
    env = JointReward(collab_env.make("team-facts-easy"), team_round_reward_per_agent, mode="per_agent")
    by_hand = run_episode(env, pols, seed=0).returns["agent_1"]
    assert by_make == by_hand
    with pytest.raises(ConfigError, match="joint-shared"):
        collab_env.make("team-facts-easy", reward="joint-sharde")

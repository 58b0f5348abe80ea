import gymnasium
import numpy as np
import pytest

import collab_env
from collab_env.errors import ConfigError
from collab_env.policy import FixedTextPolicy
from collab_env.rollout import run_episode
from collab_env.tasks.hidden_facts import (
    AnswerAtOnce,
    AskThenAnswer,
    HiddenFactsConfig,
    HiddenFactsUser,
    extract_boxed,
    generate_item,
)
from collab_env.types import Conversation, Message

IDS = ["hidden-facts-easy", "hidden-facts", "hidden-facts-hard"]


@pytest.mark.parametrize("env_id", IDS)
def test_asking_matters(env_id):
    env = collab_env.make(env_id)
    user = HiddenFactsUser()
    ask = [run_episode(env, {"assistant": AskThenAnswer(), "user": user}, seed=s) for s in range(40)]
    rush = [run_episode(env, {"assistant": AnswerAtOnce(), "user": user}, seed=s) for s in range(40)]
    ask_mean = np.mean([e.returns["assistant"] for e in ask])
    rush_mean = np.mean([e.returns["assistant"] for e in rush])
    assert ask_mean == 1.0
    assert rush_mean <= 0.1
    assert all(e.end_reason == "answered" and e.terminated for e in ask + rush)
    # asking costs turns: the reference asks at least once
    assert min(sum(1 for t in e.turns if t.player == "assistant") for e in ask) >= 2


def test_items_are_deterministic_split_and_answer_is_right():
    cfg = HiddenFactsConfig()
    a, b = generate_item(cfg, 5), generate_item(cfg, 5)
    assert a == b
    test_item = generate_item(HiddenFactsConfig(split="test"), 5)
    assert test_item["opening"] != a["opening"]
    facts = a["facts"]
    assert a["answer"] == sum(facts[i]["value"] * facts[i + 1]["value"] for i in range(0, len(facts), 2))
    assert all(f["hidden"] for f in facts)  # vagueness 1.0 withholds every quantity
    half = generate_item(HiddenFactsConfig(vagueness=0.5), 5)
    assert sum(f["hidden"] for f in half["facts"]) == 2
    assert all(f["sentence"] in half["opening"] for f in half["facts"] if not f["hidden"])


def test_hidden_goal_only_reaches_the_user():
    env = collab_env.make("hidden-facts")
    obs, infos = env.reset(seed=2)
    item = env.episode.item
    hidden_sentences = [f["sentence"] for f in item["facts"]]
    for step in range(3):
        a_text = " ".join(m.content for m in obs["assistant"])
        u_text = " ".join(m.content for m in obs["user"])
        assert not any(s in a_text for s in hidden_sentences[2 * step:])  # not yet revealed
        assert all(s in u_text for s in hidden_sentences)
        assert not any("hidden" in m.meta for m in obs["assistant"])
        obs, *_ = env.step({"assistant": "What do you need?"})
        obs, *_ = env.step({"user": "Just the total."})
    # the answer is never in any message's metadata
    assert all("answer" not in m.meta.get("hidden", {}) for m in env.state())


def _user_reply(env, assistant_text, seed=0):
    obs, *_ = env.step({"assistant": assistant_text})
    user = HiddenFactsUser()
    import asyncio

    return asyncio.run(user.act([obs["user"]], seed=seed))[0].text


def test_user_reveals_only_what_is_asked():
    env = collab_env.make("hidden-facts", num_objects=2, scenarios=("shopping",))
    env.reset(seed=0)
    item = env.episode.item
    one, many = item["objects"][0], item["plurals"][0]
    reply = _user_reply(env, f"How many {many} do you need?")
    facts = {(f["object"], f["kind"]): f["sentence"] for f in item["facts"]}
    assert facts[(one, "count")] in reply
    assert facts[(one, "unit")] not in reply
    other = item["objects"][1]
    assert facts[(other, "count")] not in reply
    env.step({"user": reply})
    reply = _user_reply(env, "Can you give me more details?")
    assert not any(s in reply for s in facts.values())
    env.step({"user": reply})
    reply = _user_reply(env, "The answer is \\boxed{3}.")
    assert reply.endswith("[[TERMINATE CHAT]]")


def test_user_gives_up_after_patience():
    env = collab_env.make("hidden-facts")
    ep = run_episode(env, {"assistant": FixedTextPolicy("Hmm."),
                           "user": HiddenFactsUser(patience=2)}, seed=1)
    assert ep.end_reason == "user_terminated" and ep.returns["assistant"] == 0.0
    assert ep.num_steps == 4


def test_wrong_answer_and_turn_cost():
    env = collab_env.make("hidden-facts", cost_per_turn=0.1)
    env.reset(seed=0)
    answer = env.episode.item["answer"]
    env.step({"assistant": "How much?"})
    env.step({"user": "You tell me."})
    _, rew, term, _, infos = env.step({"assistant": f"It's \\boxed{{{answer}}}"})
    assert rew["assistant"] == pytest.approx(0.9) and all(term.values())
    assert infos["assistant"]["reward_components"] == {"accuracy": 1.0, "turn_cost": pytest.approx(-0.1)}
    env.reset(seed=0)
    _, rew, *_ = env.step({"assistant": f"\\boxed{{{answer + 1}}}"})
    assert rew["assistant"] == 0.0


@pytest.mark.parametrize("text,value", [
    ("\\boxed{42}", 42.0), ("so \\boxed{$1,234} dollars", 1234.0), ("\\boxed{ 7 kg }", 7.0),
    ("\\boxed{1} then \\boxed{2}", 2.0), ("no box 42", None), ("\\boxed{abc}", None), ("\\boxed{-3.5}", -3.5),
])
def test_extract_boxed(text, value):
    assert extract_boxed(text) == value


def test_config_validation():
    with pytest.raises(ConfigError, match="vagueness"):
        collab_env.make("hidden-facts", vagueness=2.0)
    with pytest.raises(ConfigError, match="scenario"):
        collab_env.make("hidden-facts", scenarios=("space",))
    with pytest.raises(ConfigError, match="hidden system message"):
        HiddenFactsUser().respond(Conversation((Message("user", "x", author="assistant"),)), None)
    env = collab_env.make("hidden-facts", num_items=5)
    with pytest.raises(ConfigError, match="out of range"):
        env.reset(options={"index": 5})


def test_gymnasium_view_plays_a_full_episode():
    env = gymnasium.make("collab_env/hidden-facts-v0")
    obs, info = env.reset(seed=4)
    ask = AskThenAnswer()
    total, done = 0.0, False
    while not done:
        import asyncio

        action = asyncio.run(ask.act([obs]))[0].text
        obs, r, term, trunc, info = env.step(action)
        total += r
        done = term or trunc
    assert total == 1.0 and term and info["end_reason"] == "answered"
    assert info["other_moves"] == [] or all(p == "user" for p, _ in info["other_moves"])

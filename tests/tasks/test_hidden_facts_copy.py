"""hidden-facts-copy (issue 26): the withheld fact is the answer, and nothing but asking gets it."""

import hashlib
import json
import re

import numpy as np
import pytest

import collab_env
from collab_env.errors import ConfigError
from collab_env.policy import ScriptedPolicy
from collab_env.rollout import run_episode
from collab_env.tasks import hidden_facts as hf
from collab_env.tasks.hidden_facts import (
    AnswerAtOnce,
    AskThenAnswer,
    HiddenFactsConfig,
    HiddenFactsUser,
    collaboration_stats,
    generate_item,
)

ENV = "hidden-facts-copy"


def config(split="train"):
    from collab_env.registry import spec

    return HiddenFactsConfig(split=split, **spec(ENV).kwargs)


def play(assistant, seeds=range(60), split="test"):
    env = collab_env.make(ENV, split=split)
    return [run_episode(env, {"assistant": assistant, "user": HiddenFactsUser()}, seed=s) for s in seeds]


def success(eps):
    return float(np.mean([e.components["assistant"]["accuracy"] >= 1.0 for e in eps]))


@pytest.mark.parametrize("split", ["train", "test"])
def test_the_answer_is_the_withheld_count_and_no_opening_number_is_it(split):
    cfg = config(split)
    for i in range(400):
        item = generate_item(cfg, i)
        (count, unit) = item["facts"]
        assert count["kind"] == "count" and count["hidden"] and not unit["hidden"]
        assert unit["value"] == 1 and item["answer"] == count["value"] and 2 <= count["value"] <= 30
        # "1 dollar", "1 gram of sugar", "1 kilogram": the stated unit is singular
        assert re.search(r"\b1 (dollar|gram|kilogram)\b", unit["sentence"]), unit["sentence"]
        assert unit["sentence"] in item["opening"] and count["sentence"] not in item["opening"]
        numbers = [int(x) for x in re.findall(r"\d+", item["opening"])]
        assert item["answer"] not in numbers, item["opening"]      # copying the opening is never right
        assert len(item["distractors"]) == 2
        for d in item["distractors"]:
            n = int(re.search(r"\d+", d).group())
            assert n not in (1, item["answer"])
            if "o'clock" in d:
                assert 2 <= n <= 12, d                               # never "41 o'clock"


def test_the_other_levels_items_are_unchanged():
    # The new knobs (withhold, unit_value, distractors_avoid_answer) keep their defaults' draws:
    # 300 items per split of the three older levels hash as they did before issue 26.
    out = []
    for kw in ({}, {"num_objects": 1, "vagueness": 0.5, "num_distractors": 0},
               {"num_objects": 3, "vagueness": 1.0, "vague_objects": True, "num_distractors": 2}):
        for split in ("train", "test"):
            c = HiddenFactsConfig(split=split, **kw)
            out += [generate_item(c, i) for i in range(300)]
    digest = hashlib.sha256(json.dumps(out, sort_keys=True).encode()).hexdigest()
    assert digest == "e801ea2bb13eda42bf9ff0f531818d8cb10267a3740f73e6baeab7ce597b78fb"


def test_config_validation():
    with pytest.raises(ConfigError, match="withhold"):
        HiddenFactsConfig(withhold=("price",))
    with pytest.raises(ConfigError, match="withhold"):
        HiddenFactsConfig(withhold=())
    with pytest.raises(ConfigError, match="lower vagueness"):
        HiddenFactsConfig(num_objects=1, vagueness=1.0, withhold=("count",))
    for bad in (0, -1, 1.5, True, "1"):
        with pytest.raises(ConfigError, match="unit_value"):
            HiddenFactsConfig(unit_value=bad)


def test_ask_then_answer_is_one_answer_at_once_is_zero():
    ask, once = play(AskThenAnswer()), play(AnswerAtOnce())
    assert success(ask) == 1.0 and success(once) == 0.0
    for e in ask:
        item = collab_env.make(ENV, split="test").unwrapped.task.get_item(e.index)
        assert collaboration_stats(e.conversation, item) == {"questions": 1.0, "facts": 1.0, "answered": 1.0}


class BoxOpeningNumber(ScriptedPolicy):
    """Copies a number of the opening into the box (the k-th, or the last)."""

    def __init__(self, k):
        self.k = k

    def respond(self, observation, rng):
        nums = re.findall(r"\d+", " ".join(m.content for m in observation if m.author == "user"))
        return f"The total is \\boxed{{{nums[min(self.k, len(nums) - 1)]}}}."


class UniformGuess(ScriptedPolicy):
    """Boxes a uniform guess of the count at once: the level's chance rate."""

    def respond(self, observation, rng):
        return f"The total is \\boxed{{{int(rng.integers(2, 31))}}}."


class Spray(ScriptedPolicy):
    """Every possible count in boxes in one message (only the last box is the answer)."""

    def respond(self, observation, rng):
        return " ".join(f"\\boxed{{{n}}}" for n in range(2, 31))


class VagueQuestion(ScriptedPolicy):
    """Asks without naming the object or the quantity, then boxes whatever number it heard last."""

    def respond(self, observation, rng):
        said = [m.content for m in observation if m.author == "user"]
        if len(said) == 1:
            return "How many do you need? What do you want exactly?"
        nums = re.findall(r"\d+", said[-1]) or ["1"]
        return f"\\boxed{{{nums[-1]}}}"


class GuessThenBox(ScriptedPolicy):
    """States a count for the object instead of asking (a guess: the episode ends wrong)."""

    def respond(self, observation, rng):
        v = hf.visible_facts(observation)
        return f"Let's say 7 {v['objects'][0]}. Is that right?"


@pytest.mark.parametrize("policy", [BoxOpeningNumber(0), BoxOpeningNumber(1), BoxOpeningNumber(2),
                                    BoxOpeningNumber(99), Spray(), VagueQuestion(), GuessThenBox()],
                         ids=["first-number", "second-number", "third-number", "last-number", "spray",
                              "vague-question", "guess"])
def test_shortcuts_score_nothing(policy):
    eps = play(policy, seeds=range(100))
    # Spray's last box is 30: right only when the count is 30 (1 in 29 items); the others never.
    assert success(eps) <= (0.07 if isinstance(policy, Spray) else 0.0), policy
    if isinstance(policy, GuessThenBox):
        # a guess ends the episode as a wrong answer; where 7 is a distractor the user already said
        # it is no guess, and the user never confirms it either
        assert {e.end_reason for e in eps} <= {"guessed", "user_terminated"}
        assert sum(e.end_reason == "guessed" for e in eps) >= 90
    task = collab_env.make(ENV, split="test").unwrapped.task
    assert all(collaboration_stats(e.conversation, task.get_item(e.index))["facts"] == 0.0 for e in eps)


def test_a_uniform_guess_is_chance():
    eps = play(UniformGuess(), seeds=range(300))
    # 1/29 = 0.034; with 300 episodes the rate stays under 0.08 (binomial, p < 1e-3)
    assert success(eps) < 0.08


def test_collaboration_stats_counts_real_questions_only():
    from collab_env.types import Conversation, Message

    item = generate_item(config("test"), 3)
    many = item["plurals"][0]
    count = item["facts"][0]

    def conv(*turns):
        msgs = [Message(role="user", content=item["opening"], author="user")]
        for role, text in turns:
            author = "user" if role == "user" else "assistant"
            msgs.append(Message(role=role, content=text, author=author))
        return Conversation(msgs)

    # a "?" alone, the opening pasted back with a "?", a keyword dump: no question, nothing told
    for text in ("?", item["opening"] + "?", "how many count quantity number price cost?"):
        stats = collaboration_stats(conv(("assistant", text)), item)
        assert stats["questions"] == 0.0 and stats["facts"] == 0.0, text
    # a real question, the user's answer, a boxed answer: one question, the fact told, answered
    stats = collaboration_stats(conv(("assistant", f"How many {many} do you need?"), ("user", count["sentence"]),
                                     ("assistant", f"\\boxed{{{item['answer']}}}")), item)
    assert stats == {"questions": 1.0, "facts": 1.0, "answered": 1.0}
    # the fact stated in the opening does not count as obtained (only later user messages do)
    opening_says_it = Conversation([Message(role="user", content=item["opening"] + " " + count["sentence"],
                                            author="user"),
                                    Message(role="assistant", content="Thanks.", author="assistant")])
    assert collaboration_stats(opening_says_it, item)["facts"] == 0.0

"""hidden-facts-choose (issue 45): the model must choose what to ask; splits of disjoint scenarios;
facts obtained read from the env's state, under a paraphrasing user."""

from __future__ import annotations

import re

import pytest

import collab_env
from collab_env.errors import ConfigError
from collab_env.eval import evaluate
from collab_env.policy import ScriptedPolicy
from collab_env.rollout import run_episode
from collab_env.tasks import hidden_facts as hf
from collab_env.tasks.hidden_facts import (
    ASK_PHRASINGS,
    SPLIT_SCENARIOS,
    AskThenAnswer,
    HiddenFactsUser,
    collaboration_stats,
    revealed_facts,
)

ID = "hidden-facts-choose-v0"
SPLITS = ("train", "validation", "test")


def items(split: str, n: int = 150) -> list[dict]:
    task = collab_env.make(ID, split=split).unwrapped.task
    return [task.get_item(i) for i in range(n)]


def test_one_fact_withheld_the_other_stated_as_one_and_the_kind_varies():
    for split in SPLITS:
        kinds = set()
        for it in items(split, 60):
            hidden = [f for f in it["facts"] if f["hidden"]]
            told = [f for f in it["facts"] if not f["hidden"]]
            assert len(hidden) == 1 and len(told) == 1 and told[0]["value"] == 1
            assert 2 <= hidden[0]["value"] <= 30 and it["answer"] == hidden[0]["value"]
            assert told[0]["sentence"] in it["opening"] and hidden[0]["sentence"] not in it["opening"]
            assert re.search(r"\b1 (dollar|gram|kilogram|meter|liter|sheet)s\b", it["opening"]) is None
            assert str(it["answer"]) not in re.findall(r"\d+", it["opening"])  # distractors avoid it
            kinds.add(hidden[0]["kind"])
        assert kinds == {"count", "unit"}, split


def test_reference_wins_naive_loses_and_one_template_is_right_on_about_half():
    class AskCountThenCopy(ScriptedPolicy):
        """Always asks for the count (the hidden-facts-copy template), then boxes the number told."""

        def respond(self, observation, rng):
            seen = hf.visible_facts(observation)
            if not any(m.role == "assistant" for m in observation):
                one, many = seen["missing"][0][0], seen["objects"][0]
                return ASK_PHRASINGS[seen["scenario"]]["count"][0].format(one=one, many=many)
            nums = re.findall(r"\d+", observation[-1].content)
            return f"\\boxed{{{nums[-1] if nums else 1}}}"

    for split in SPLITS:
        ref = evaluate(ID, {"assistant": AskThenAnswer(varied=True)}, num_episodes=30, seed=0,
                       env_kwargs={"split": split}, progress=False)
        naive = evaluate(ID, {"assistant": "answer-at-once"}, num_episodes=30, seed=0,
                         env_kwargs={"split": split}, progress=False)
        template = evaluate(ID, {"assistant": AskCountThenCopy()}, num_episodes=60, seed=0,
                            env_kwargs={"split": split}, progress=False)
        assert ref.summary.players["assistant"].success_rate == 1.0, split
        assert naive.summary.players["assistant"].success_rate == 0.0, split
        assert 0.25 <= template.summary.players["assistant"].success_rate <= 0.75, split


@pytest.mark.parametrize("split", SPLITS)
def test_every_reference_phrasing_gets_its_fact(split):
    """Every phrasing of the reference question (the SFT data's variety) is a question the user
    answers, for both kinds, on every scenario of the split."""
    env = collab_env.make(ID, split=split)
    task = env.unwrapped.task
    seen = set()
    for i in range(200):
        it = task.get_item(i)
        f = next(f for f in it["facts"] if f["hidden"])
        key = (it["scenario"], f["kind"])
        if key in seen:
            continue
        seen.add(key)
        for phrasing in ASK_PHRASINGS[it["scenario"]][f["kind"]]:
            text = phrasing.format(one=f["object"], many=f["plural"])
            env.reset(seed=0, options={"index": i})
            env.step({"assistant": text})
            reply = HiddenFactsUser().respond(env.observe("user"), None)
            assert f["sentence"] in reply, (text, reply)
    assert seen == {(sc, k) for sc in SPLIT_SCENARIOS[split] for k in ("count", "unit")}


def test_splits_are_disjoint_in_scenarios_objects_units_and_phrasings():
    vocab = {}
    for split in SPLITS:
        its = items(split)
        vocab[split] = {
            "scenarios": {it["scenario"] for it in its},
            "objects": {w for it in its for w in (*it["objects"], *it["plurals"])},
            "units": {u for it in its for f in it["facts"] if f["kind"] == "unit"
                      for u in re.findall(r"\b(dollars?|grams?|kilograms?|meters?|liters?|sheets?)\b", f["sentence"])},
            "phrasings": {p for sc in {it["scenario"] for it in its} for k in ("count", "unit")
                          for p in ASK_PHRASINGS[sc][k]},
            "openings": {re.sub(r"\d+", "N", it["opening"]) for it in its},
        }
        assert vocab[split]["scenarios"] == set(SPLIT_SCENARIOS[split])
    for a, b in (("train", "validation"), ("train", "test"), ("validation", "test")):
        for part in ("scenarios", "objects", "units", "phrasings", "openings"):
            assert not vocab[a][part] & vocab[b][part], (a, b, part, vocab[a][part] & vocab[b][part])
    # no word naming a training object occurs anywhere in a test item's text
    train_words = vocab["train"]["objects"]
    for it in items("test"):
        words = set(re.findall(r"[a-z]+", (it["single_turn_prompt"] + " " + " ".join(it["distractors"])).lower()))
        assert not words & train_words, words & train_words


def test_the_split_keyword_is_checked():
    with pytest.raises(ConfigError, match="split must be one of"):
        collab_env.make(ID, split="dev")
    with pytest.raises(ConfigError, match="split_scenarios"):
        collab_env.make(ID, scenarios=("shopping",))
    with pytest.raises(ConfigError, match="stated_one needs num_objects=1"):
        collab_env.make(ID, num_objects=2)
    # the older levels keep their items (the split only picks a stream there) and gain a validation stream
    v3 = collab_env.make("hidden-facts-v3").unwrapped.task
    val = collab_env.make("hidden-facts-v3", split="validation").unwrapped.task
    assert v3.get_item(0)["scenario"] in SPLIT_SCENARIOS["train"]
    assert {val.get_item(i)["opening"] for i in range(20)}.isdisjoint({v3.get_item(i)["opening"] for i in range(20)})


def test_a_train_object_named_on_a_test_item_is_foreign():
    env = collab_env.make(ID, split="test")
    env.reset(seed=0, options={"index": 0})
    env.step({"assistant": "How many apples do you need?"})
    assert "there are no apples" in HiddenFactsUser().respond(env.observe("user"), None)


@pytest.mark.parametrize("env_id", [ID, "hidden-facts-v3"])
def test_facts_obtained_survive_a_paraphrasing_user(env_id):
    """The env records what the user revealed in any words: with a user that rewords every fact,
    the facts metric is what it is with the scripted user, while the old sentence match read 0."""
    for split in ("train", "test") if env_id == ID else ("train",):
        for seed in range(4):
            got = {}
            for paraphrase in (False, True):
                env = collab_env.make(env_id, split=split)
                ep = run_episode(env, {"assistant": AskThenAnswer(), "user": HiddenFactsUser(paraphrase=paraphrase)},
                                 seed=seed)
                item = env.unwrapped.task.get_item(ep.index)
                replies = [m.content for m in ep.conversation if m.author == "user" and m.role != "system"][1:]
                if paraphrase:  # the facts were told in other words than the item's sentences
                    hidden = [f for f in item["facts"] if f["hidden"]]
                    assert not any(f["sentence"] in r for f in hidden for r in replies)
                    assert any(hf.reworded(item["scenario"], f) in " ".join(replies) for f in hidden)
                record = ep.info["task"]
                assert record["withheld"] == sum(f["hidden"] for f in item["facts"])
                got[paraphrase] = collaboration_stats(ep.conversation, item, rule="syntax",
                                                      revealed=record["revealed"])["facts"]
                # the transcript read by the same rule agrees with the env's record
                assert collaboration_stats(ep.conversation, item, rule="syntax")["facts"] == got[paraphrase]
            assert got[True] == got[False] > 0.0, (env_id, split, seed, got)


def test_revealed_facts_needs_the_value_and_ignores_distractors():
    it = items("test", 1)[0]
    f = next(f for f in it["facts"] if f["hidden"])
    assert revealed_facts(it, f"Well, it's {f['value']}, I think.") == [(f["object"], f["kind"])]
    assert revealed_facts(it, "Hmm, I'm not sure what you mean.") == []
    assert revealed_facts(it, f"It's {f['value'] + 1}.") == []
    assert revealed_facts(it, " ".join(it["distractors"])) == []

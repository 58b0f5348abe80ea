import gymnasium
import numpy as np
import pytest

import collab_env
from collab_env.errors import ConfigError, DeprecatedEnvWarning
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

IDS = ["hidden-facts-easy", "hidden-facts", "hidden-facts-hard", "hidden-facts-copy"]


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
    env = gymnasium.make("collab_env/hidden-facts-v3")
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


# ---------------------------------------------------------------------------------------------
# v1 (issue 23): the user reveals only to a question; gaming policies earn nothing
# ---------------------------------------------------------------------------------------------
from collab_env.policy import ScriptedPolicy  # noqa: E402
from collab_env.tasks import hidden_facts as hf  # noqa: E402
from collab_env.tasks.hidden_facts import guessed_facts, visible_facts  # noqa: E402
from collab_env.exploits.policies import DUMP_STYLES, RESTATE_STYLES, KeywordDump, RestateTask  # noqa: E402

#: The latest version of each level: the syntax rule (issue 43) on v2's items (v1's for -copy).
V1 = ["hidden-facts-easy-v3", "hidden-facts-v3", "hidden-facts-hard-v3", "hidden-facts-copy-v2"]
#: The superseded keyword-user ids, kept registered so that old results reproduce.
V0 = ["hidden-facts-easy-v0", "hidden-facts-v0", "hidden-facts-hard-v0"]
SEEDS = range(20)
#: Every attribute and list keyword and every object of every scenario: what a learner could know.
VOCAB = tuple(dict.fromkeys(
    [k for sc in hf._SCENARIOS for a in (sc.count, sc.unit) for k in a.keywords]
    + [k for sc in hf._SCENARIOS for k in sc.list_keywords]))
OBJECTS = tuple(w for sc in hf._SCENARIOS for one, many in sc.objects for w in (many,))


def revealed(ep) -> int:
    """How many withheld facts (and the object list) the user's replies gave away."""
    item = hf.generate_item(hf.HiddenFactsConfig(**_kwargs(ep.env_id)), ep.index)
    replies = " ".join(t.text for t in ep.turns if t.player == "user")
    sc = hf._SCENARIO_BY_NAME[item["scenario"]]
    n = sum(f["sentence"] in replies for f in item["facts"] if f["hidden"])
    return n + (not item["objects_named"] and sc.list_say.format(objects=hf._join(item["plurals"])) in replies)


def _kwargs(env_id):
    from collab_env.registry import spec

    return {k: v for k, v in spec(env_id).kwargs.items()}


def play(env_id, assistant, seeds=SEEDS):
    env = collab_env.make(env_id)
    return [run_episode(env, {"assistant": assistant, "user": HiddenFactsUser()}, seed=s) for s in seeds]


class Statement(ScriptedPolicy):
    """Explains the method without asking: the statement the v0 learner found."""

    def respond(self, observation, rng):
        v = visible_facts(observation) or {"objects": []}
        objs = v["objects"] or ["items"]
        return " ".join(f"You would multiply the number of {o} by the price per {o[:-1]}, the weight "
                        f"of each box of {o} and the sugar in each batch of {o}." for o in objs)


class Guess(ScriptedPolicy):
    """States values for the withheld quantities instead of asking."""

    def respond(self, observation, rng):
        v = visible_facts(observation) or {"objects": []}
        # 89 and 97 are primes above every drawn value: never told, never a product of told values
        return " ".join(f"Let's say 89 {o}. I assume each of the {o} costs 97 dollars, weighs 97 "
                        "kilograms and needs 97 grams of sugar." for o in v["objects"]) or "Let's say 4 items."


class Questions(ScriptedPolicy):
    """Asks for every missing quantity in the given phrasing, one question each, then answers."""

    def __init__(self, phrasing):
        self.phrasing = phrasing

    def respond(self, observation, rng):
        v = visible_facts(observation)
        if not v["objects"]:
            return "Which items exactly are involved?"
        if not v["missing"]:
            return f"\\boxed{{{v['total']}}}"
        return " ".join(self.phrasing[v["scenario"]][kind].format(one=one, many=next(
            m for m in v["objects"] if m.startswith(one))) for one, kind, _ in v["missing"])


NATURAL = {
    "shopping": {"count": "Could you tell me how many {many} you need?", "unit": "How much does one {one} cost?"},
    "baking": {"count": "what's the number of batches of {many}", "unit": "Please share the sugar per batch of {many}."},
    "shipping": {"count": "Could you tell me how many boxes of {many} there are?",
                 "unit": "Tell me the weight of each box of {many}."},
}
TERSE = {
    "shopping": {"count": "And the number of {many}?", "unit": "what's the price of a {one}"},
    "baking": {"count": "How many batches of {many}?", "unit": "How much sugar goes into each batch of {many}?"},
    "shipping": {"count": "Let me know the number of boxes of {many}.", "unit": "What does a box of {many} weigh?"},
}


@pytest.mark.parametrize("env_id", V1)
@pytest.mark.parametrize("style", DUMP_STYLES)
def test_keyword_dump_gets_nothing(env_id, style):
    for vocab in (VOCAB, VOCAB + OBJECTS):
        eps = play(env_id, KeywordDump(style, vocabulary=vocab))
        assert [revealed(e) for e in eps] == [0] * len(eps), (style, vocab[:3])
        assert all(e.returns["assistant"] <= 0.0 for e in eps)


@pytest.mark.parametrize("env_id", V1)
@pytest.mark.parametrize("style", RESTATE_STYLES)
def test_restating_the_task_gets_nothing(env_id, style):
    eps = play(env_id, RestateTask(style))
    assert [revealed(e) for e in eps] == [0] * len(eps)
    assert all(e.end_reason == "user_terminated" for e in eps)


@pytest.mark.parametrize("env_id", V1)
def test_a_statement_gets_nothing(env_id):
    eps = play(env_id, Statement())
    assert [revealed(e) for e in eps] == [0] * len(eps)
    env = collab_env.make(env_id)
    env.reset(seed=0)
    one, many = env.episode.item["objects"][0], env.episode.item["plurals"][0]
    reply = _user_reply(env, f"You would multiply the number of {many} by the price per {one}")
    assert not any(f["sentence"] in reply for f in env.episode.item["facts"] if f["hidden"])


@pytest.mark.parametrize("env_id", V1)
def test_a_guess_counts_as_a_wrong_answer(env_id):
    eps = play(env_id, Guess())
    named = [e for e in eps if hf.generate_item(hf.HiddenFactsConfig(**_kwargs(env_id)), e.index)["objects_named"]]
    for e in named:
        assert e.end_reason == "guessed" and e.terminated and e.returns["assistant"] == 0.0
        assert e.components["assistant"]["accuracy"] == 0.0
        assert revealed(e) == 0
    # hard: the objects are unnamed, so the guesser names none and is simply never told anything
    assert all(revealed(e) == 0 for e in eps)


def test_guess_detection_is_precise():
    item = hf.generate_item(hf.HiddenFactsConfig(scenarios=("shopping",)), 0)
    one, many = item["objects"][0], item["plurals"][0]
    opening = [item["opening"]]
    assert guessed_facts(item, f"Let's say 4 {many}.", opening) == [(one, "count")]
    assert guessed_facts(item, f"I assume {many} cost $3 each.", opening) == [(one, "unit")]
    # questions, arithmetic on told values, the object count and "one" are no guesses
    for text in (f"Do you need 4 {many}?", f"What is the price of one {one}?", "There are 2 items here.",
                 f"You would multiply the number of {many} by the price per {one}."):
        assert guessed_facts(item, text, opening) == [], text
    told = opening + [f"I need 3 {many}.", f"Each {one} costs 5 dollars."]
    assert guessed_facts(item, f"So 3 {many} at 5 dollars is 15 for the {many}.", told) == []


@pytest.mark.parametrize("env_id", V1)
def test_ask_then_answer_still_scores_one(env_id):
    eps = play(env_id, AskThenAnswer(), seeds=range(50))
    assert np.mean([e.returns["assistant"] for e in eps]) == 1.0
    assert {e.end_reason for e in eps} == {"answered"}


@pytest.mark.parametrize("env_id", V1)
@pytest.mark.parametrize("phrasing", [NATURAL, TERSE], ids=["natural", "terse"])
def test_real_questions_in_other_words_reveal(env_id, phrasing):
    eps = play(env_id, Questions(phrasing))
    assert np.mean([e.returns["assistant"] for e in eps]) == 1.0


@pytest.mark.parametrize("question,kinds", [
    ("How much does one {one} cost?", {"unit"}),
    ("what's the price of a {one}", {"unit"}),
    ("Could you tell me how many {many} you need?", {"count"}),
    ("Tell me the price of each {one}.", {"unit"}),
    ("OK, and how many {many}?", {"count"}),
    ("What are the prices and numbers of {many} and {other}?", {"unit", "count"}),
    ("I'd like to know the price of a {one}", {"unit"}),
    ("And the price of a {one}?", {"unit"}),
    ("To total it, I need to know the price of a {one}.", {"unit"}),
])
def test_question_shapes_that_reveal(question, kinds):
    env = collab_env.make("hidden-facts", scenarios=("shopping",))
    env.reset(seed=0)
    item = env.episode.item
    one, many, other = item["objects"][0], item["plurals"][0], item["plurals"][1]
    reply = _user_reply(env, question.format(one=one, many=many, other=other))
    got = {f["kind"] for f in item["facts"] if f["object"] == one and f["sentence"] in reply}
    assert got == kinds, reply


@pytest.mark.parametrize("text", [
    "?", "{many} price?", "{many} {other} price cost how many number?", "How many how much {many} {other}?",
    "What are the prices of {many}, {other}, mugs and towels?", "How many {many} and mugs do you need?",
    "The price of one {one} matters. The number of {many} too.",
    "I'm buying {many} and {other}, how much will it all cost, in dollars?",
    # statements with a "?" or a request tag appended (what the trained model learned to write)
    "You would multiply the number of {many} by the price per {one}?",
    "The total is the number of {many} times the price of a {one}, right?",
    "I multiply the number of {many} by the price of a {one}, tell me.",
])
def test_shapes_that_reveal_nothing(text):
    env = collab_env.make("hidden-facts", scenarios=("shopping",))
    env.reset(seed=0)
    item = env.episode.item
    one, many, other = item["objects"][0], item["plurals"][0], item["plurals"][1]
    reply = _user_reply(env, text.format(one=one, many=many, other=other))
    assert not any(f["sentence"] in reply for f in item["facts"]), (text, reply)


@pytest.mark.parametrize("env_id", V0)
def test_legacy_ids_keep_the_keyword_user(env_id):
    # Reproducing v0 on purpose: it builds, with the warning that names the gameable user and v2.
    with pytest.warns(DeprecatedEnvWarning, match=f"^{env_id} is superseded by {env_id[:-1]}3.*keyword"):
        assert collab_env.make(env_id).task.config.user_rule == "keyword"
        # the old hole, kept for old results: a statement (named objects) or a keyword list gets facts
        gamer = KeywordDump("list", vocabulary=VOCAB + OBJECTS) if "hard" in env_id else Statement()
        assert all(revealed(e) > 0 for e in play(env_id, gamer))
        assert np.mean([e.returns["assistant"] for e in play(env_id, AskThenAnswer())]) == 1.0


def test_new_version_is_the_default():
    env = collab_env.make("hidden-facts")
    assert env.spec.id == "hidden-facts-v3" and env.task.config.user_rule == "syntax"
    assert env.task.config.sensible_numbers and env.task.config.guess_is_wrong
    card = collab_env.spec("hidden-facts-v0").card
    assert "legacy" in card.tests.lower() and "legacy" in card.players["user"]


def test_v2_items_are_locked():
    """300 items per split of the three v2 levels (issue 27) hash as released; a change of what a
    player sees needs a new version (the v0/v1 items: tests/tasks/test_hidden_facts_copy.py)."""
    import hashlib
    import json

    out = []
    for env_id in ("hidden-facts-v2", "hidden-facts-easy-v2", "hidden-facts-hard-v2"):
        for split in ("train", "test"):
            c = HiddenFactsConfig(split=split, **collab_env.spec(env_id).kwargs)
            out += [generate_item(c, i) for i in range(300)]
    digest = hashlib.sha256(json.dumps(out, sort_keys=True).encode()).hexdigest()
    assert digest == "b05de96a73b8e31d58a212347a325530c5680232060c43c611c83835c60f0004"


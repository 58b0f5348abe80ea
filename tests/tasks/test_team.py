"""team-facts: the question accounting, who sees what, the exact answer check, the reward modes
on hand-played episodes, and the reference teams (values computed by hand from the rules)."""

import numpy as np
import pytest

import collab_env
from collab_env.errors import ConfigError, DeprecatedEnvWarning
from collab_env.eval import evaluate
from collab_env.registry import spec
from collab_env.rewards.joint import JointReward
from collab_env.tasks.team import (
    CoordinatedTeam,
    TeamFactsUser,
    generate_item,
    named_facts,
    split_message,
    team_round_reward,
    team_round_reward_per_agent,
)

ASK = {  # one question per (scenario, kind), as a person would write it
    "party": {"count": "How many {many} are we ordering?", "unit": "What is the price of one {one}?"},
    "trip": {"count": "How many {many} did you book?", "unit": "How many seats does each {one} have?"},
    "garden": {"count": "How many rows of {many} did you plant?", "unit": "How much water does a row of {many} need?"},
}


def ask(item, i):
    f = item["facts"][i]
    return ASK[item["scenario"]][f["kind"]].format(one=f["object"], many=f["plural"])


def start(env_id="team-facts-easy", index=4, **kw):
    env = collab_env.make(env_id, **kw)
    obs, infos = env.reset(seed=0, options={"index": index})
    return env, obs, env.episode.item


def hidden(item):
    return [i for i, f in enumerate(item["facts"]) if not f["stated"]]


def stated(item):
    return [i for i, f in enumerate(item["facts"]) if f["stated"]]


def user_reply(env):
    return TeamFactsUser().respond(env.observe("user"), np.random.default_rng(0))


# ---------------------------------------------------------------------------------------------
# Parsing rules
# ---------------------------------------------------------------------------------------------
def test_named_facts_reads_object_and_kind_per_clause():
    objects = [("bus", "buses"), ("coach", "coaches")]
    assert named_facts("How many seats does each bus have?", "trip", objects) == [("bus", "unit")]
    assert named_facts("How many buses did you book? And coaches, how many?", "trip", objects) == [
        ("bus", "count"), ("coach", "count")]
    # object and keyword in different clauses: no fact
    assert named_facts("Tell me about the buses. How many?", "trip", objects) == []
    # whole words only: 'minibus' is not 'bus'
    assert named_facts("How many minibuses?", "trip", objects) == []


def test_named_facts_parses_a_repeated_question_once_and_hands_out_fresh_lists():
    from collab_env.tasks import team

    objects = [("bus", "buses"), ("coach", "coaches")]
    q = "How many seats does each bus have? And coaches, how many?"
    team._named_facts.cache_clear()
    first = named_facts(q, "trip", objects)
    first.append(("edited", "by the caller"))
    assert named_facts(q, "trip", tuple(objects)) == [("bus", "unit"), ("coach", "count")]
    assert team._named_facts.cache_info().hits == 1  # the clauses were parsed once
    # every argument is part of the key: another rule, quoted text or object list is parsed anew
    assert named_facts(q, "trip", objects, rule="keyword") == [("bus", "unit"), ("coach", "count")]
    assert named_facts(q, "trip", objects, quoted=[q]) == []  # the user's own question pasted back
    assert named_facts(q, "trip", objects[:1]) == [("bus", "unit")]
    assert team._named_facts.cache_info().hits == 1


def test_split_message_separates_team_lines():
    q, note = split_message("How many pizzas?\nTEAM: I take pizzas\n  team: you take cakes")
    assert q == "How many pizzas?" and note == "I take pizzas\nyou take cakes"
    assert split_message("TEAM: only team") == ("", "only team")


def test_config_errors_name_the_fix():
    with pytest.raises(ConfigError, match="num_stated"):
        collab_env.make("team-facts-easy", num_stated=4)
    with pytest.raises(ConfigError, match="unknown keyword"):
        collab_env.make("team-facts-easy", num_agent=2)


# ---------------------------------------------------------------------------------------------
# Duplicate and useless questions cost the team (default reward)
# ---------------------------------------------------------------------------------------------
def test_duplicate_and_useless_costs_by_hand():
    env, _, item = start()
    h, s = hidden(item), stated(item)
    assert len(h) == 3 and len(s) == 1
    # round 1: both ask the same hidden fact -> agent_1's question is a duplicate: -0.1
    _, r, _, _, infos = env.step({"agent_0": ask(item, h[0]), "agent_1": ask(item, h[0])})
    assert infos["agent_0"]["questions"] == {"agent_0": "new", "agent_1": "duplicate"}
    assert r == pytest.approx({"agent_0": -0.1, "agent_1": -0.1, "user": -0.1})
    assert infos["agent_1"]["reward_components"]["own_question_cost"] == pytest.approx(-0.1)
    assert infos["agent_0"]["reward_components"]["own_question_cost"] == 0.0
    assert env.on_turn == ("user",)
    _, r, _, _, _ = env.step({"user": user_reply(env)})
    assert r["agent_0"] == 0.0 and env.on_turn == ("agent_0", "agent_1")
    # round 2: asking again (agent_0) and asking for a stated fact (agent_1): two duplicates
    _, r, _, _, infos = env.step({"agent_0": ask(item, h[0]), "agent_1": ask(item, s[0])})
    assert infos["agent_0"]["questions"] == {"agent_0": "duplicate", "agent_1": "duplicate"}
    assert r["agent_0"] == pytest.approx(-0.2)
    env.step({"user": user_reply(env)})
    # round 3: the captain answers exactly while agent_1 asks about no fact: 1 - 0.1
    _, r, terms, _, infos = env.step({"agent_0": f"\\boxed{{{item['answer']}}}",
                                      "agent_1": "What's the weather like?"})
    assert infos["agent_0"]["questions"] == {"agent_1": "useless"}
    assert r["agent_0"] == pytest.approx(0.9) and all(terms.values())
    assert infos["agent_0"]["end_reason"] == "answered"
    assert infos["agent_0"]["reward_components"] == pytest.approx(
        {"accuracy": 1.0, "question_cost": -0.1, "own_question_cost": 0.0})
    # episode return: -0.1 - 0.2 + 0.9 = accuracy - 0.1 * (3 duplicates + 1 useless)


def test_silent_round_skips_the_user_and_costs_nothing():
    env, _, _ = start()
    _, r, _, _, _ = env.step({"agent_0": "TEAM: you start", "agent_1": ""})
    assert r["agent_0"] == 0.0 and env.on_turn == ("agent_0", "agent_1")


def test_lowest_default_return_matches_the_card():
    for env_id, n in (("team-facts-easy-v2", 2), ("team-facts-hard-v2", 3)):
        env, _, _ = start(env_id)
        total = 0.0
        while env.agents:
            acts = {a: "Hello, is anyone there?" for a in env.on_turn if a != "user"}
            if env.on_turn == ("user",):
                acts = {"user": user_reply(env)}
            _, r, _, truncs, _ = env.step(acts)
            total += r["agent_0"]
        assert truncs["agent_0"]
        # 3 asking rounds in 6 steps, n useless questions each, 0.1 apiece
        assert total == pytest.approx(-0.1 * n * 3)
        assert total == pytest.approx(spec(env_id).card.reward_range["default"][0])


# ---------------------------------------------------------------------------------------------
# Who sees what
# ---------------------------------------------------------------------------------------------
def test_team_messages_and_private_answers_are_hidden():
    env, _, item = start()
    h = hidden(item)
    env.step({"agent_0": ask(item, h[0]) + "\nTEAM: secret plan: I ask first",
              "agent_1": ask(item, h[1])})
    user_view = env.observe("user")
    assert not any("secret plan" in m.content for m in user_view)
    assert [m.content for m in user_view if "asks:" in m.content] == [
        f"agent_0 asks: {ask(item, h[0])}", f"agent_1 asks: {ask(item, h[1])}"]
    a1 = [m.content for m in env.observe("agent_1")]
    assert f"agent_0 asked the user: {ask(item, h[0])}\nagent_0 to the team: secret plan: I ask first" in a1
    env.step({"user": user_reply(env)})
    s0, s1 = item["facts"][h[0]]["sentence"], item["facts"][h[1]]["sentence"]
    a0 = [m.content for m in env.observe("agent_0")]
    a1 = [m.content for m in env.observe("agent_1")]
    assert f"The user (to you): {s0}" in a0 and not any(s1 in c for c in a0)
    assert f"The user (to you): {s1}" in a1 and not any(s0 in c for c in a1)
    # the answer reaches nobody; the user's hidden facts reach no agent
    for p in ("agent_0", "agent_1"):
        assert not any("You know these facts" in m.content for m in env.observe(p))


def test_untagged_user_text_goes_to_every_asker():
    env, _, item = start()
    h = hidden(item)
    env.step({"agent_0": ask(item, h[0]), "agent_1": "TEAM: waiting"})
    env.step({"user": "Let me think. @agent_1: not you. @agent_0: yes"})
    a0 = [m.content for m in env.observe("agent_0") if m.content.startswith("The user")]
    a1 = [m.content for m in env.observe("agent_1") if m.content.startswith("The user")]
    assert a0 == ["The user (to you): Let me think. yes"]
    assert a1 == ["The user (to you): not you."]


# ---------------------------------------------------------------------------------------------
# The exact answer check
# ---------------------------------------------------------------------------------------------
def test_answer_is_checked_exactly_and_only_the_captain_answers():
    env, _, item = start()
    _, r, terms, _, _ = env.step({"agent_0": "TEAM: hm", "agent_1": f"\\boxed{{{item['answer']}}}"})
    assert not any(terms.values())  # a teammate's box is not an answer (and no question)
    assert r["agent_0"] == -0.1  # the teammate's text had no TEAM: prefix: a useless question
    env.step({"user": user_reply(env)})
    _, r, terms, _, infos = env.step({"agent_0": f"\\boxed{{{item['answer'] + 1}}}", "agent_1": ""})
    assert all(terms.values()) and r["agent_0"] == 0.0
    assert infos["agent_0"]["reward_components"]["accuracy"] == 0.0


# ---------------------------------------------------------------------------------------------
# Joint, per-agent and difference rewards on one hand-played episode
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode, expected", [
    # round 1: both ask one fact (J = -0.1); round 2: agent_0 asks it again (not charged within
    # the round), agent_1 silent (J = 0); round 3: captain right, agent_1 useless (J = 0.9)
    ("shared", [(-0.1, -0.1), (0.0, 0.0), (0.9, 0.9)]),
    ("per_agent", [(0.0, -0.1), (0.0, 0.0), (1.0, 0.9)]),
    # difference: J - J(agent silent); round 1: -0.1 - 0 for each; round 2: agent_1 did not act
    # -> 0; agent_0: 0 - 0; round 3: agent_0: 0.9 - (-0.1) = 1.0; agent_1: 0.9 - 1.0 = -0.1
    ("difference", [(-0.1, -0.1), (0.0, 0.0), (1.0, -0.1)]),
])
def test_joint_reward_modes_by_hand(mode, expected):
    fn = team_round_reward_per_agent if mode == "per_agent" else team_round_reward
    env = JointReward(collab_env.make("team-facts-easy"), fn, mode=mode)
    env.reset(seed=0, options={"index": 4})
    item = env.unwrapped.episode.item
    h = hidden(item)
    rounds = [
        {"agent_0": ask(item, h[0]), "agent_1": ask(item, h[0])},
        {"agent_0": ask(item, h[0]), "agent_1": ""},
        {"agent_0": f"\\boxed{{{item['answer']}}}", "agent_1": "Nice weather?"},
    ]
    got = []
    for k, acts in enumerate(rounds):
        _, r, _, _, infos = env.step(acts)
        got.append((r["agent_0"], r["agent_1"]))
        if k < 2:
            _, ru, _, _, _ = env.step({"user": user_reply(env.unwrapped)})
            assert ru["agent_0"] == 0.0  # user rounds: no scored agent acted
    assert got == [pytest.approx(e) for e in expected]
    assert infos["agent_0"]["reward_components"]["env"] == pytest.approx(0.9)


# ---------------------------------------------------------------------------------------------
# Reference teams
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("env_id, naive_return", [("team-facts-easy-v2", -0.3), ("team-facts-hard-v2", -0.6)])
def test_reference_teams(env_id, naive_return):
    agents = spec(env_id).trainable
    runs = {name: evaluate(env_id, dict.fromkeys(agents, name), num_episodes=12, progress=False)
            for name in ("team-coordinated", "team-naive")}
    coord, naive = (runs[k].summary for k in ("team-coordinated", "team-naive"))
    assert coord.end_reasons == {"answered": 12}
    assert coord.players["agent_0"].mean_return == pytest.approx(1.0)
    # naive: each of the 3 asking rounds, every teammate duplicates the captain; the captain
    # cannot know all facts in time (easy: 3 rounds needed; hard: 6), so it never answers
    assert naive.end_reasons == {"max_steps": 12}
    assert naive.players["agent_0"].mean_return == pytest.approx(naive_return)


def test_coordinated_team_is_the_single_agent_views_teammate():
    env = collab_env.make("team-facts-easy", view="agent_1")
    obs, _ = env.reset(seed=5)
    total, done = 0.0, False
    while not done:
        obs, r, term, trunc, _ = env.step(CoordinatedTeam().respond(obs, np.random.default_rng(0)))
        total += r
        done = term or trunc
    assert total == pytest.approx(1.0)


def test_items_are_pure_functions_of_config_and_index():
    from collab_env.tasks.team import TeamFactsConfig

    cfg = TeamFactsConfig(num_agents=3, num_objects=3, num_stated=0)
    a, b = generate_item(cfg, 7), generate_item(cfg, 7)
    assert a == b and a["answer"] == sum(a["facts"][2 * k]["value"] * a["facts"][2 * k + 1]["value"]
                                         for k in range(3))
    assert generate_item(TeamFactsConfig(split="test"), 7) != generate_item(TeamFactsConfig(), 7)


def test_card_baselines_are_the_measured_numbers():
    """The cards quote benchmarks/results/team_references.json (bench_team_references.py)."""
    import json
    from pathlib import Path

    doc = json.loads((Path(__file__).resolve().parents[2] / "benchmarks" / "results"
                      / "team_references.json").read_text())
    for env_id, runs in doc["results"].items():
        card = spec(env_id).card
        n = len(spec(env_id).trainable)
        for team, r in runs.items():
            assert card.baselines[f"{team} x{n}"] == (
                f"mean return {r['mean_return']:.3f}, success {r['success']:.3f} (200 ep, seeds 0-199)")
    ref = doc["results"]["team-facts-hard-v0"]
    assert ref["team-coordinated"]["success"] == 1.0 and ref["team-naive"]["success"] == 0.0


# ---------------------------------------------------------------------------------------------
# v1 (issue 23): a question counts only when it asks; gaming policies get no fact
# ---------------------------------------------------------------------------------------------
from collab_env.policy import ScriptedPolicy  # noqa: E402
from collab_env.rollout import run_episode  # noqa: E402
from collab_env.tasks import team as team_mod  # noqa: E402
from collab_env.exploits.policies import DUMP_STYLES, RESTATE_STYLES, KeywordDump, RestateTask  # noqa: E402

V1 = ["team-facts-easy-v2", "team-facts-hard-v2"]
VOCAB = tuple(dict.fromkeys(k for sc in team_mod._SCENARIOS for kind in (sc.count, sc.unit) for k in kind.keywords))


def play_team(env_id, policy, seeds=range(20)):
    env = collab_env.make(env_id)
    agents = spec(env_id).trainable
    return [run_episode(env, {**dict.fromkeys(agents, policy), "user": TeamFactsUser()}, seed=s) for s in seeds]


def facts_told(env_id, ep):
    """Hidden facts the user's private answers gave away over the episode."""
    kwargs = {k: v for k, v in spec(env_id).kwargs.items() if k != "max_steps"}
    item = generate_item(team_mod.TeamFactsConfig(**kwargs), ep.index)
    told = " ".join(m.content for m in ep.conversation if m.content.startswith("The user (to you):"))
    return sum(f["sentence"] in told for f in item["facts"] if not f["stated"])


class TeamStatement(ScriptedPolicy):
    """States the method, names every object and keyword, asks nothing."""

    def respond(self, observation, rng):
        kn = team_mod.read_knowledge(observation)
        if kn.scenario is None:
            return "TEAM: nothing"
        return " ".join(f"You would multiply the number of {many} by the {kn.scenario.unit.keywords[0]} of "
                        f"each {one}." for one, many in kn.objects)


class TeamGuess(ScriptedPolicy):
    def respond(self, observation, rng):
        kn = team_mod.read_knowledge(observation)
        return " ".join(f"Let's say 89 {many}, and each {one} has a {kn.scenario.unit.keywords[0]} of 97."
                        for one, many in kn.objects) if kn.scenario else "Hi."


@pytest.mark.parametrize("env_id", V1)
@pytest.mark.parametrize("gamer", [*(f"dump-{s}" for s in DUMP_STYLES), *(f"restate-{s}" for s in RESTATE_STYLES),
                                   "statement", "guess"])
def test_gaming_policies_get_no_fact(env_id, gamer):
    kind, _, style = gamer.partition("-")
    policy = {"dump": lambda: KeywordDump(style, vocabulary=VOCAB), "restate": lambda: RestateTask(style),
              "statement": TeamStatement, "guess": TeamGuess}[kind]()
    eps = play_team(env_id, policy)
    assert [facts_told(env_id, e) for e in eps] == [0] * len(eps), gamer
    assert all(e.returns["agent_0"] < 0 for e in eps)  # every question was useless, none answered


@pytest.mark.parametrize("env_id", V1)
def test_coordinated_team_still_scores_one(env_id):
    eps = play_team(env_id, CoordinatedTeam(), seeds=range(50))
    assert np.mean([e.returns["agent_0"] for e in eps]) == 1.0


@pytest.mark.parametrize("question,fact", [
    ("Could you tell me how many buses we booked?", ("bus", "count")),
    ("Tell me the number of coaches.", ("coach", "count")),
    ("what's the capacity of a bus", ("bus", "unit")),
    ("OK, and how many passengers fit in one coach?", ("coach", "unit")),
])
def test_real_questions_in_other_words_name_the_fact(question, fact):
    objects = [("bus", "buses"), ("coach", "coaches")]
    assert named_facts(question, "trip", objects) == [fact]


@pytest.mark.parametrize("text", [
    "You would multiply the number of buses by the seats of each coach.",
    "buses coaches seats how many count?", "Let's say 4 buses.",
    "I'm booking buses and coaches for our school trip, how many seats will we have in total?",
])
def test_shapes_that_name_no_fact(text):
    objects = [("bus", "buses"), ("coach", "coaches")]
    opening = "I'm booking buses and coaches for our school trip. How many seats will we have in total?"
    assert named_facts(text, "trip", objects, quoted=(opening,)) == []


def test_legacy_ids_keep_the_keyword_rule():
    objects = [("bus", "buses"), ("coach", "coaches")]
    text = "You would multiply the number of buses by the seats of each coach."
    assert named_facts(text, "trip", objects, rule="keyword") == [("bus", "unit"), ("coach", "unit")]
    assert collab_env.make("team-facts-easy").task.config.question_rule == "syntax"
    # Reproducing v0 on purpose: it builds, with the warning that names the change and v2.
    with pytest.warns(DeprecatedEnvWarning, match="^team-facts-easy-v0 is superseded by team-facts-easy-v2"):
        assert collab_env.make("team-facts-easy-v0").task.config.question_rule == "keyword"
        eps = play_team("team-facts-easy-v0", TeamStatement())
    assert sum(facts_told("team-facts-easy-v0", e) for e in eps) > 0  # the old hole, kept

"""collab_env.eval.check_user: every measure flags the double built to fail it, and the env's
scripted user passes; the rules read paraphrases; the ``check-user`` command."""

from __future__ import annotations

import json
import re

import pytest

from collab_env.errors import ConfigError
from collab_env.eval.check_user import MEASURES, breaks_role, check_user
from collab_env.tasks.hidden_facts import states_fact

DOUBLES = "collab_env.testing.user_doubles"

#: Each flag-able measure -> the double made to fail it.
FAILS = {
    "leaked_unasked": "LeakingUser",
    "answered_unasked": "OverAnsweringUser",
    "refused_asked": "RefusingUser",
    "broke_role": "RoleBreakingUser",
    "ended_early": "EarlyQuitter",
    "never_ended": "NeverEnding",
    "followed_injection": "InjectionFollower",
    "inconsistent": "MindChanger",
}


def test_every_flaggable_measure_has_a_double():
    assert set(FAILS) == {m.name for m in MEASURES if m.flag}


@pytest.mark.parametrize("measure", sorted(FAILS))
def test_the_double_built_to_fail_a_measure_is_flagged_for_it(measure):
    card = check_user(f"{DOUBLES}:{FAILS[measure]}", episodes=4, progress=False)
    assert measure in card.flags, card.table()
    assert not card.passed
    r = card.measures[measure]
    assert r["mean"] == 1.0 and r["lo"] > card.tolerance and r["method"] == "wilson"


def test_doubles_are_not_flagged_for_what_they_do_right():
    # the leaker answers questions and keeps its role; the mind-changer leaks nothing
    leak = check_user(f"{DOUBLES}:LeakingUser", episodes=4, progress=False)
    assert "broke_role" not in leak.flags and "refused_asked" not in leak.flags
    assert "inconsistent" not in leak.flags and "followed_injection" not in leak.flags
    mind = check_user(f"{DOUBLES}:MindChanger", episodes=4, progress=False)
    assert mind.flags == ["inconsistent"]


def test_the_scripted_user_passes_and_is_as_cooperative_as_itself():
    card = check_user("hidden-facts-user", episodes=5, seed=3, progress=False)
    assert card.passed, card.table()
    assert card.measures["facts_revealed"]["mean"] == 1.0 and card.measures["solved"]["mean"] == 1.0
    assert card.scripted["difference"]["mean"] == 0.0
    assert card.measures["broke_role"]["n"] == 5 * 5  # every probe's episodes
    data = card.to_dict()
    assert data["passed"] and data["summary"].startswith("check-user pass")
    json.dumps(data, allow_nan=True)


def test_an_llm_user_double_that_obeys_unfenced_instructions_is_flagged_only_unfenced():
    from collab_env.agents.users import LLMUserSimulator
    from collab_env.testing.user_injection import InjectionObeyingUser

    unfenced = check_user(LLMUserSimulator(InjectionObeyingUser(), fence_transcript=False), episodes=3,
                          progress=False)
    fenced = check_user(LLMUserSimulator(InjectionObeyingUser()), episodes=3, progress=False)
    assert "followed_injection" in unfenced.flags
    assert "followed_injection" not in fenced.flags
    # the double says nothing useful: it tells the reference assistant no fact at all
    assert fenced.measures["facts_revealed"]["mean"] == 0.0 < fenced.scripted["facts_revealed"]["mean"]


def test_a_fact_is_stated_by_the_envs_own_rule():
    """The card reads what a user stated by the rule the env records reveals with."""
    count = {"object": "apple", "plural": "apples", "kind": "count", "value": 4, "sentence": "I need 4 apples."}
    assert states_fact(count, "Sure! I need four apples.")
    assert states_fact(count, "hmm. 4 apples i think")
    assert states_fact(count, "Each apple is 4 bucks")  # the value, said of the object
    assert not states_fact(count, "I need 4 pears. Apples too.")  # 4 is said of pears
    assert not states_fact(count, "I need some apples.")
    assert not states_fact(count, "I need 14 apples.")
    assert states_fact(count, "Four, I think.", single=True)  # one object: no name needed
    assert not states_fact(count, "Four, I think.")
    # a distractor's number answers nothing
    assert not states_fact(count, "I need 4 apples for Tom's party.", distractors=("I need 4 apples for Tom's party.",))
    one = {**count, "value": 1, "sentence": "I need 1 apple."}
    assert states_fact(one, "Just 1 apple.") and not states_fact(one, "The price of one apple is 3.")


def test_role_breaks_are_boxes_labels_stock_phrases_and_the_total():
    known = {3, 4, 5}
    assert breaks_role("The total is \\boxed{27}.", 27, known)
    assert breaks_role("Assistant: sure, here it is", 27, known)
    assert breaks_role("How can I help you today?", 27, known)
    assert breaks_role("So that's 27 dollars in all.", 27, known)
    assert not breaks_role("I need 4 apples, each costs 3 dollars.", 27, known)
    assert not breaks_role("It costs 12 dollars.", 12, {12})  # a number the user holds may be said


def test_bad_arguments_are_one_line_errors():
    with pytest.raises(ConfigError, match="hidden-facts levels"):
        check_user("hidden-facts-user", env_id="math-chat-v1", episodes=1, progress=False)
    with pytest.raises(ConfigError, match="episodes"):
        check_user("hidden-facts-user", episodes=0, progress=False)
    with pytest.raises(ConfigError, match="tolerance"):
        check_user("hidden-facts-user", episodes=1, tolerance=1.5, progress=False)
    with pytest.raises(ConfigError, match="unknown policy"):
        check_user("no-such-user", episodes=1, progress=False)


def test_check_user_command_writes_the_card_and_exits_1_when_flagged(tmp_path, capsys):
    from collab_env.cli import main

    out = tmp_path / "card.json"
    assert main(["check-user", f"{DOUBLES}:RoleBreakingUser", "--episodes", "3", "--no-progress",
                 "--out", str(out)]) == 1
    card = json.loads(out.read_text())
    assert "broke_role" in card["flags"] and card["simulator"] == f"{DOUBLES}:RoleBreakingUser"
    assert "| broke_role | all |" in out.with_suffix(".md").read_text()
    assert main(["check-user", "hidden-facts-user", "--episodes", "2", "--no-progress"]) == 0
    assert "check-user pass" in capsys.readouterr().out


def test_check_user_command_refuses_bad_input_in_one_line(capsys):
    from collab_env.cli import main

    assert main(["check-user", "hidden-facts-user", "--env", "hidden-facts-hard-v3", "--no-progress"]) == 2
    assert main(["check-user", "hidden-facts-user", "--sampling", "assistant.temperature=0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("collab-env: error:") for line in err)
    assert "user.KEY=VALUE" in err[1]


def test_check_user_command_checks_its_output_path_first(tmp_path, capsys):
    from collab_env.cli import main

    bad = tmp_path / "no-such-folder" / "card.json"
    assert main(["check-user", "hidden-facts-user", "--episodes", "1", "--no-progress", "--out", str(bad)]) == 3
    err = capsys.readouterr().err
    assert "no-such-folder" in err and len(err.strip().splitlines()) == 1


def test_check_user_reaches_an_api_simulator_through_api_base(tmp_path, monkeypatch):
    """An LLM user on litellm behind a real server on 127.0.0.1 (the fake OpenAI server, made to
    answer every prompt with the goal's facts: a leaker), given as --policy takes it."""
    pytest.importorskip("litellm")
    from collab_env.cli import main
    from collab_env.testing.openai_server import FakeOpenAIServer

    monkeypatch.setenv("OPENAI_API_KEY", "sk-local")
    out = tmp_path / "card.json"
    def leak(body):  # the fact lines of the simulator's prompt ("- I need 4 apples."), as its reply
        facts = re.findall(r"^- (.*\d.*)$", body["messages"][-1]["content"], re.M)
        return json.dumps({"current_answer": "", "thought": "", "response": " ".join(facts)})

    with FakeOpenAIServer(reply=leak) as srv:
        rc = main(["check-user", "llm-user:litellm:openai/fake-model", "--api-base", f"user={srv.url}",
                   "--episodes", "2", "--no-progress", "--out", str(out)])
        assert len(srv.requests) >= 5 * 2  # every probe's episodes asked the server
    card = json.loads(out.read_text())
    assert rc == 1 and "leaked_unasked" in card["flags"], card["flags"]
    assert card["simulator"] == f"llm-user:litellm:openai/fake-model {{\"api_base\": \"{srv.url}\"}}"

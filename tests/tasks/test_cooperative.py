"""Behavioural tests of from_dataset (the CoMLRL workflow) and the length-ratio suite.

Every function handed to an env is defined at module level so that envs pickle.
"""

from __future__ import annotations

import math
import pickle
import sys
import warnings

import pytest
from datasets import Dataset
from pettingzoo.test import parallel_api_test, parallel_seed_test

import collab_env
from collab_env.errors import CollabEnvError, ConfigError
from collab_env.tasks import from_dataset
from collab_env.tasks.cooperative import (
    LENGTH_RATIO_PROMPTS,
    brief_formatter,
    detailed_formatter,
    formatters,
    length_ratio_reward,
    length_ratio_rows,
    make_length_ratio_env,
    reward_func,
)
from collab_env.errors import TaskFunctionError

ROWS = [
    {"prompt": "Describe a kite.", "answer": "kite"},
    {"prompt": "Describe a moth.", "answer": "moth"},
    {"prompt": "Describe a bell.", "answer": "bell"},
]


# --- module-level functions handed to envs (picklable) ---------------------------------------
def fmt_a(item):
    return f"A: {item['prompt']}"


def fmt_b(item):
    return f"B: {item['prompt']}"


def fmt_external(item, external_prompts=None):
    if external_prompts is None:
        return f"X: {item['prompt']}"
    return f"X(next): {external_prompts} | {item['answer']}"


CALLS: list[dict] = []  # what the recording functions below received, for assertions


def reward_plain(a, b):
    CALLS.append({"args": (a, b)})
    return [float(len(a[0]) + 10 * len(b[0]))]


def reward_items(a, b, *, batch_items):
    CALLS.append({"args": (a, b), "batch_items": batch_items})
    return [1.0 if batch_items[0]["answer"] in b[0] else 0.0]


def reward_prompts(a, b, prompts):
    CALLS.append({"args": (a, b), "prompts": prompts})
    return [0.5]


def reward_kwargs(a, b, **kwargs):
    CALLS.append({"args": (a, b), "kwargs": kwargs})
    return [0.25]


def reward_len_sum(a, b):
    return [float(len(a[0]) + len(b[0]))]


def reward_raises(a, b):
    raise KeyError("missing_field")


def reward_two_values(a, b):
    return [1.0, 2.0]


def reward_nan(a, b):
    return [float("nan")]


def reward_str(a, b):
    return ["1.0"]


def reward_three_agents(a, b, c):
    return [1.0]


def times_ten(r):
    return 10.0 * r


def transition_recording(prompt, agent_completions, num_agents, turn,
                         prompt_history_per_agent, response_history_per_agent):
    CALLS.append({
        "prompt": prompt,
        "agent_completions": agent_completions,
        "num_agents": num_agents,
        "turn": turn,
        "prompt_history_per_agent": prompt_history_per_agent,
        "response_history_per_agent": response_history_per_agent,
    })
    return [f"next for {i}: saw {agent_completions[1 - i]!r}" for i in range(num_agents)]


def transition_item_only(item):
    CALLS.append({"item": item})
    return "same for everyone"


def transition_kwargs(**kwargs):
    CALLS.append(dict(kwargs))
    return ["p0", "p1"]


def transition_wrong_length(agent_completions):
    return ["only one"]


def transition_needs_unknown(prompt, secret):
    return ["a", "b"]


def make_env(**kw):
    kw.setdefault("reward_func", reward_plain)
    return from_dataset(Dataset.from_list(ROWS), [fmt_a, fmt_b], **kw)


@pytest.fixture(autouse=True)
def _clear_calls():
    CALLS.clear()


def both(env, a="a", b="b"):
    return env.step({"agent_0": a, "agent_1": b})


# --- the guide's checks -----------------------------------------------------------------------
def test_guide_checks_on_length_ratio_reward():
    item = length_ratio_rows("train")[0]
    assert item["prompt"] in brief_formatter(item)
    assert item["prompt"] in detailed_formatter(item)
    # len("Hello") / len("Hi") = 2.5, inside [2, 3]
    assert reward_func(["Hi"], ["Hello"], batch_items=[item]) == [1.0]
    assert reward_func([""], ["Hello"], batch_items=[item]) == [0.0]
    # ratio 10 / 2 = 5 -> distance 2 -> exp(-2); ratio 1 / 2 -> distance 1.5 -> exp(-1.5)
    assert reward_func(["ab"], ["x" * 10], batch_items=[item]) == [pytest.approx(math.exp(-2.0))]
    assert reward_func(["ab"], ["x"], batch_items=[item]) == [pytest.approx(math.exp(-1.5))]
    # boundaries are inside; aligned pairs are scored pairwise
    assert reward_func(["ab", "ab"], ["xxxx", "xxxxxx"], batch_items=[item]) == [1.0, 1.0]
    # the band comes from the item
    wide = dict(item, target_min=1.0, target_max=10.0)
    assert length_ratio_reward(["ab"], ["x" * 10], batch_items=[wide]) == [1.0]


def test_guide_example_imports():
    from collab_env.tasks import cooperative

    assert cooperative.formatters == [brief_formatter, detailed_formatter] == formatters
    train, test = cooperative.train_dataset, cooperative.eval_dataset
    assert isinstance(train, Dataset) and isinstance(test, Dataset)
    assert set(train.column_names) == {"prompt", "target_min", "target_max"}
    assert train[0]["target_min"] == 2.0 and train[0]["target_max"] == 3.0


def test_length_ratio_prompts_are_our_own_and_split_is_fixed():
    guide = {"Describe a city in the clouds.", "Invent a new holiday.", "Tell a story about dinosaurs."}
    assert len(LENGTH_RATIO_PROMPTS) == 40 and len(set(LENGTH_RATIO_PROMPTS)) == 40
    assert not guide & set(LENGTH_RATIO_PROMPTS)
    train = [r["prompt"] for r in length_ratio_rows("train")]
    test = [r["prompt"] for r in length_ratio_rows("test")]
    assert (len(train), len(test)) == (32, 8)
    assert set(train).isdisjoint(test) and set(train) | set(test) == set(LENGTH_RATIO_PROMPTS)
    # Golden: the split is part of length-ratio-v0; a change here needs a version bump.
    assert test == [LENGTH_RATIO_PROMPTS[i] for i in (3, 9, 10, 11, 24, 25, 30, 36)]
    assert make_length_ratio_env(split="test").task.num_items() == 8
    assert make_length_ratio_env(split="all").task.num_items() == 40


def test_import_does_not_load_datasets():
    import subprocess

    code = "import collab_env.tasks.cooperative, sys; print('datasets' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# --- PettingZoo conformance -------------------------------------------------------------------
@pytest.mark.parametrize("num_turns", [1, 3])
def test_length_ratio_api_and_seed(num_turns):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        parallel_api_test(make_length_ratio_env(num_turns=num_turns), num_cycles=200)
        parallel_seed_test(lambda: make_length_ratio_env(num_turns=num_turns), num_cycles=200)


@pytest.mark.parametrize("num_turns", [1, 3])
def test_from_dataset_api_and_seed(num_turns):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        parallel_api_test(make_env(num_turns=num_turns), num_cycles=200)
        parallel_seed_test(lambda: make_env(num_turns=num_turns), num_cycles=200)


def test_registered_id_builds_the_suite():
    env = collab_env.make("length-ratio-v0", num_turns=2, target_min=1.0)
    assert env.possible_agents == ["agent_0", "agent_1"]
    assert env.task.num_turns == 2 and env.task.get_item(0)["target_min"] == 1.0
    with pytest.raises(ConfigError, match="num_turn"):
        collab_env.make("length-ratio-v0", num_turn=2)
    with pytest.raises(ConfigError, match="target_min"):
        make_length_ratio_env(target_min=4.0)


# --- turn structure, visibility, shared reward ------------------------------------------------
def test_both_agents_on_turn_and_replies_private():
    env = make_env()
    obs, infos = env.reset(seed=1, options={"index": 2})
    assert env.on_turn == ("agent_0", "agent_1")
    assert all(infos[a]["on_turn"] for a in env.possible_agents)
    assert [m.content for m in obs["agent_0"]] == ["A: Describe a bell."]
    assert [m.content for m in obs["agent_1"]] == ["B: Describe a bell."]
    assert obs["agent_0"][0].role == "user"
    obs, rewards, terms, truncs, infos = both(env, "brief", "a longer answer")
    assert [m.content for m in obs["agent_0"]] == ["A: Describe a bell.", "brief"]
    assert [m.content for m in obs["agent_1"]] == ["B: Describe a bell.", "a longer answer"]
    assert obs["agent_1"][-1].role == "assistant"
    # the reward is reward_func's value on the actual texts, and it is shared
    assert rewards == {"agent_0": 5.0 + 150.0, "agent_1": 155.0}
    assert CALLS[-1]["args"] == (["brief"], ["a longer answer"])
    assert terms == {"agent_0": True, "agent_1": True} and not any(truncs.values())
    assert infos["agent_0"]["end_reason"] == "num_turns"
    assert infos["agent_0"]["reward_components"] == {"reward_func": 155.0, "processed": 155.0}
    assert env.agents == []


def test_share_responses_shows_other_replies():
    env = make_env(share_responses=True)
    env.reset(seed=0, options={"index": 0})
    obs, *_ = both(env, "from zero", "from one")
    seen = obs["agent_0"]
    assert [m.content for m in seen] == ["A: Describe a kite.", "from zero", "from one"]
    other = seen[-1]
    assert other.author == "agent_1" and other.role == "user"  # another agent's text reads as user
    assert "B: Describe a kite." not in [m.content for m in seen]  # prompts stay private


def test_system_prompts_per_agent():
    env = make_env(system_prompts={"agent_1": "You are thorough."})
    obs, _ = env.reset(seed=0, options={"index": 0})
    assert obs["agent_0"].system_prompt is None
    assert obs["agent_1"].system_prompt == "You are thorough."


def test_length_ratio_episode_reward_matches_function():
    env = make_length_ratio_env()
    env.reset(seed=3)
    item = env.episode.item
    brief, detailed = "A lantern hums.", "A lantern hums in the dark, " * 3
    _, rewards, terms, _, infos = both(env, brief, detailed)
    expected = length_ratio_reward([brief], [detailed], batch_items=[item])[0]
    assert expected < 1.0  # out of band: 84 / 15 = 5.6
    assert rewards == {"agent_0": pytest.approx(expected), "agent_1": pytest.approx(expected)}
    assert infos["agent_1"]["reward_components"]["length_ratio"] == pytest.approx(expected)
    assert all(terms.values())


# --- reward_func keyword passing --------------------------------------------------------------
def test_reward_without_keywords_gets_none():
    env = make_env(reward_func=reward_plain)
    env.reset(seed=0, options={"index": 1})
    both(env)
    assert CALLS == [{"args": (["a"], ["b"])}]


def test_reward_with_batch_items_gets_item():
    env = make_env(reward_func=reward_items)
    env.reset(seed=0, options={"index": 1})
    _, rewards, *_ = both(env, "x", "a moth")
    assert CALLS[-1]["batch_items"] == [ROWS[1]]
    assert rewards["agent_0"] == 1.0
    env.reset(seed=0, options={"index": 0})
    _, rewards, *_ = both(env, "x", "a moth")
    assert rewards["agent_0"] == 0.0  # item 0's answer is "kite"


def test_reward_with_prompts_gets_prompts():
    env = make_env(reward_func=reward_prompts)
    env.reset(seed=0, options={"index": 0})
    both(env)
    assert CALLS[-1]["prompts"] == ["A: Describe a kite.", "B: Describe a kite."]


def test_reward_with_kwargs_gets_everything():
    env = make_env(reward_func=reward_kwargs)
    env.reset(seed=0, options={"index": 2})
    both(env)
    assert CALLS[-1]["kwargs"] == {
        "batch_items": [ROWS[2]],
        "prompts": ["A: Describe a bell.", "B: Describe a bell."],
    }


def test_reward_processor_applied():
    env = make_env(reward_func=reward_len_sum, reward_processor=times_ten)
    env.reset(seed=0, options={"index": 0})
    _, rewards, _, _, infos = both(env, "abc", "de")
    assert rewards == {"agent_0": 50.0, "agent_1": 50.0}
    assert infos["agent_0"]["reward_components"] == {"reward_func": 5.0, "processed": 50.0}


@pytest.mark.parametrize(
    ("fn", "pattern"),
    [
        (reward_raises, r"reward_raises.*raised KeyError.*missing_field"),
        (reward_two_values, r"reward_two_values.*returned 2 values"),
        (reward_nan, r"reward_nan.*non-finite"),
        (reward_str, r"reward_str.*gave a str"),
    ],
)
def test_bad_reward_func_is_a_clear_error(fn, pattern):
    env = make_env(reward_func=fn)
    env.reset(seed=0)
    with pytest.raises(TaskFunctionError, match=pattern) as exc_info:
        both(env)
    assert isinstance(exc_info.value, CollabEnvError)


def test_reward_func_signature_checked_at_construction():
    with pytest.raises(ConfigError, match="reward_three_agents"):
        make_env(reward_func=reward_three_agents)


# --- multi-turn ---------------------------------------------------------------------------------
def test_external_transition_gets_declared_arguments_and_sets_next_prompt():
    env = make_env(num_turns=2, external_transition=transition_recording)
    env.reset(seed=0, options={"index": 0})
    obs, rewards, terms, _, infos = both(env, "zero-1", "one-1")
    call = CALLS[-1]  # the reward call came first, then the transition
    assert call == {
        "prompt": "Describe a kite.",
        "agent_completions": ["zero-1", "one-1"],
        "num_agents": 2,
        "turn": 1,
        "prompt_history_per_agent": [["A: Describe a kite."], ["B: Describe a kite."]],
        "response_history_per_agent": [["zero-1"], ["one-1"]],
    }
    assert not any(terms.values()) and infos["agent_0"]["turn"] == 1
    assert obs["agent_0"][-1].content == "next for 0: saw 'one-1'"
    assert obs["agent_1"][-1].content == "next for 1: saw 'zero-1'"
    assert obs["agent_0"][-1].role == "user"
    assert "next for 1" not in obs["agent_0"].render()  # next prompts are private too
    _, _, terms, _, infos = both(env, "zero-2", "one-2")
    assert all(terms.values()) and infos["agent_0"]["end_reason"] == "num_turns"
    assert infos["agent_0"]["turn"] == 2
    assert sum("turn" in c for c in CALLS) == 1  # no transition after the last turn


def test_transition_with_only_item_and_single_string():
    env = make_env(num_turns=3, external_transition=transition_item_only)
    env.reset(seed=0, options={"index": 1})
    obs, *_ = both(env)
    assert CALLS[-1] == {"item": ROWS[1]}
    assert obs["agent_0"][-1].content == obs["agent_1"][-1].content == "same for everyone"


def test_transition_with_kwargs_gets_everything():
    env = make_env(num_turns=2, external_transition=transition_kwargs)
    env.reset(seed=0, options={"index": 0})
    both(env, "x", "y")
    assert set(CALLS[-1]) == {
        "prompt", "agent_completions", "num_agents", "prompt_history_per_agent",
        "response_history_per_agent", "item", "batch_items", "turn",
    }
    assert CALLS[-1]["batch_items"] == [ROWS[0]]


def test_formatter_with_external_prompts_builds_next_prompt():
    env = from_dataset(ROWS, [fmt_external, fmt_b], reward_plain, num_turns=3,
                       external_transition=transition_kwargs)
    obs, _ = env.reset(seed=0, options={"index": 2})
    assert obs["agent_0"][-1].content == "X: Describe a bell."
    obs, *_ = both(env)
    assert obs["agent_0"][-1].content == "X(next): p0 | bell"  # formatter(item, external_prompts=)
    assert obs["agent_1"][-1].content == "p1"  # plain formatter: the external prompt itself
    both(env, "x", "y")
    # the history the transition sees holds the prompts as the agents got them
    assert CALLS[-1]["prompt_history_per_agent"] == [
        ["X: Describe a bell.", "X(next): p0 | bell"],
        ["B: Describe a bell.", "p1"],
    ]


def test_default_transition_shows_other_answers():
    env = make_env(num_turns=2)
    env.reset(seed=0, options={"index": 0})
    obs, *_ = both(env, "my brief take", "my long take")
    nxt0, nxt1 = obs["agent_0"][-1].content, obs["agent_1"][-1].content
    assert "my long take" in nxt0 and "my brief take" not in nxt0
    assert "my brief take" in nxt1 and "revise" in nxt1.lower()
    shared = make_env(num_turns=2, share_responses=True)
    shared.reset(seed=0, options={"index": 0})
    obs, *_ = both(shared, "my brief take", "my long take")
    assert "my long take" not in obs["agent_0"][-1].content  # already visible above


def test_reward_every_turn_of_length_ratio():
    env = make_length_ratio_env(num_turns=3)
    env.reset(seed=0)
    returns = []
    for brief, detailed in [("Hi", "Hello"), ("Hi", "x" * 10), ("", "x")]:
        _, rewards, terms, _, infos = both(env, brief, detailed)
        returns.append(rewards["agent_0"])
    assert returns == [1.0, pytest.approx(math.exp(-2.0)), 0.0]
    assert all(terms.values())
    assert "2 characters" in env.observe("agent_1")[-2].content  # feedback states the lengths


def test_bad_transition_errors():
    env = make_env(num_turns=2, external_transition=transition_wrong_length)
    env.reset(seed=0)
    with pytest.raises(TaskFunctionError, match="transition_wrong_length.*list of 2 str"):
        both(env)
    with pytest.raises(ConfigError, match="transition_needs_unknown"):
        make_env(num_turns=2, external_transition=transition_needs_unknown)


# --- construction checks ------------------------------------------------------------------------
def test_construction_errors():
    with pytest.raises(ConfigError, match="empty"):
        from_dataset([], [fmt_a], reward_plain)
    with pytest.raises(ConfigError, match="one formatter per agent"):
        from_dataset(ROWS, [fmt_a, fmt_b], reward_plain, agent_ids=["x", "y", "z"])
    with pytest.raises(ConfigError, match=r"formatters\[1\]"):
        from_dataset(ROWS, [fmt_a, "not a function"], reward_plain)
    with pytest.raises(ConfigError, match="reward_func must be callable"):
        from_dataset(ROWS, [fmt_a, fmt_b], None)
    with pytest.raises(ConfigError, match="from_dict"):
        from_dataset({"prompt": ["a"]}, [fmt_a, fmt_b], reward_plain)
    with pytest.raises(ConfigError, match="num_turns"):
        from_dataset(ROWS, [fmt_a, fmt_b], reward_plain, num_turns=0)
    with pytest.raises(ConfigError, match="reserved"):
        from_dataset(ROWS, [fmt_a, fmt_b], reward_plain, agent_ids=["env", "b"])


def test_agent_ids_and_item_access():
    env = from_dataset(Dataset.from_list(ROWS), fmt_a, reward_three_agents,
                       agent_ids=["writer", "editor", "critic"])
    assert env.possible_agents == ["writer", "editor", "critic"]
    assert env.task.num_items() == 3
    assert env.task.get_item(1) == ROWS[1] and isinstance(env.task.get_item(1), dict)
    obs, infos = env.reset(seed=0, options={"index": 1})
    assert obs["critic"][-1].content == "A: Describe a moth."
    _, rewards, *_ = env.step({"writer": "a", "editor": "b", "critic": "c"})
    assert rewards == {"writer": 1.0, "editor": 1.0, "critic": 1.0}


# --- clone and pickle ---------------------------------------------------------------------------
def test_clone_is_independent():
    env = make_env(num_turns=2, reward_func=reward_len_sum)
    env.reset(seed=0, options={"index": 0})
    both(env, "one", "two")
    fork = env.clone()
    _, r_fork, t_fork, _, _ = both(fork, "a", "b")
    assert all(t_fork.values()) and r_fork["agent_0"] == 2.0
    assert env.agents == ["agent_0", "agent_1"] and env.episode.data["turn"] == 2
    assert len(env.episode.data["responses"][0]) == 1  # the fork's reply did not leak back
    _, r_env, *_ = both(env, "longer", "reply")
    assert r_env["agent_0"] == 11.0


def test_pickle_round_trip():
    env = make_length_ratio_env(num_turns=2)
    env.reset(seed=5)
    both(env, "Hi", "Hello")
    copy = pickle.loads(pickle.dumps(env))
    assert copy.episode.conversation == env.episode.conversation
    _, r1, *_ = both(env, "Hi", "Hello!")
    _, r2, *_ = both(copy, "Hi", "Hello!")
    assert r1 == r2
    ds_env = make_env(reward_func=reward_items)
    ds_env.reset(seed=0)
    assert pickle.loads(pickle.dumps(ds_env)).task.get_item(0) == ROWS[0]


# --- the scripted partner and the single-agent view ----------------------------------------------
PARTNER = "collab_env.tasks.cooperative:LengthRatioPartner"


def test_two_scripted_partners_solve_every_prompt():
    from collab_env.rollout import run_episode

    env = make_length_ratio_env(split="all", num_turns=2)
    for index in range(env.task.num_items()):
        episode = run_episode(env, {"agent_0": PARTNER, "agent_1": PARTNER}, seed=0, index=index)
        assert episode.rewards == {"agent_0": [1.0, 1.0], "agent_1": [1.0, 1.0]}, index


def test_single_agent_view_against_partner():
    from collab_env.checker import check_env
    from collab_env.tasks.cooperative import LengthRatioPartner

    view = collab_env.make("length-ratio-v0", view="agent_0", policies={"agent_1": PARTNER})
    obs, _ = view.reset(seed=0)
    item = view.env.episode.item
    assert item["prompt"] in obs.render()
    _, reward, terminated, _, _ = view.step("x" * 10)
    partner_text = LengthRatioPartner.detailed_answer(item["prompt"])
    assert view.env.episode.conversation.by("agent_1")[0].content == partner_text
    expected = length_ratio_reward(["x" * 10], [partner_text], batch_items=[item])[0]
    assert reward == pytest.approx(expected) and expected < 1.0 and terminated
    report = check_env("length-ratio-v0", policies={"agent_1": PARTNER}, cycles=50, steps=10)
    assert report.ok and report.results[-1].passed is True, report.results[-1]

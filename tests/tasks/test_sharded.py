"""sharded-math-v0 and sharded-humaneval-v0 (issue 46): the shard protocol and its controls, the
scripted user attacked by whole episodes, scoring against the full request (rule and sandbox),
the published-format loader on stand-in rows, and the paper's measures on the board."""

from __future__ import annotations

import json
import statistics

import pytest

import collab_env
from collab_env.errors import ConfigError, DataSchemaError
from collab_env.exploits.policies import BoxedSpray, EchoUser
from collab_env.policy import FixedTextPolicy
from collab_env.rollout import RolloutEngine
from collab_env.tasks.sharded import (
    CLOSING,
    ShardedSolver,
    ShardedUser,
    load_sharded_rows,
    score_attempt,
)

MATH = "sharded-math-v0"
CODE = "sharded-humaneval-v0"
ASK_ALL = "Please tell me everything you want, every detail at once. What are all the numbers?"
CLAIM = "Done! I have solved it and my answer is correct, you can mark this task as complete."


def _play(env_id, policy, episodes=8, **env_kwargs):
    engine = RolloutEngine(env_id, {"assistant": policy}, env_kwargs=env_kwargs, concurrency=8, progress=False)
    eps = engine.run(range(episodes), raise_on_error=True)
    return statistics.mean(e.returns["assistant"] for e in eps), eps


def _user_lines(ep):
    return [m.content for m in ep.conversation if m.author == "user" and m.role != "system"]


def test_the_user_reveals_exactly_one_shard_per_turn_whatever_the_assistant_writes():
    """A policy that asks for everything gets one shard a turn, in order, then the closing line,
    and the episode ends truncated with reward 0 (it never answers)."""
    _, eps = _play(MATH, FixedTextPolicy(ASK_ALL), episodes=6)
    for ep in eps:
        shards = list(ep.conversation.messages[1].meta["shards"])  # the user's hidden message
        lines = _user_lines(ep)
        assert lines[:len(shards)] == shards and all(x == CLOSING for x in lines[len(shards):])
        assert ep.returns["assistant"] == 0.0 and ep.end_reason == "max_assistant_turns"
        assert sum(1 for m in ep.conversation if m.author == "assistant") == len(shards) + 2


def test_the_three_modes_open_with_a_shard_every_shard_or_the_original_request():
    openings = {}
    for mode in ("sharded", "concat", "full"):
        env = collab_env.make(MATH, mode=mode)
        obs, _ = env.reset(options={"index": 4})
        item = env.episode.item
        view = obs["assistant"]
        openings[mode] = view[-1].content
        assert view[-1].author == "user" and not view[-1].trainable
        # the answer, the shards' list and the hidden goal reach no assistant observation
        assert all("shards" not in m.meta for m in view) and len(view) == 2
    shards = item["shards"]
    assert openings["sharded"] == shards[0]
    assert openings["concat"] == "\n".join(f"- {s}" for s in shards)
    assert openings["full"] == item["full"] and openings["full"].endswith(shards[0])  # question last
    assert sorted(openings["full"].split()) == sorted(" ".join(shards).split())  # same words, reordered


@pytest.mark.parametrize("mode", ["sharded", "concat", "full"])
def test_the_reference_wins_and_the_naive_answer_loses_in_every_mode(mode):
    ref, _ = _play(MATH, "sharded-solver", mode=mode)
    naive, eps = _play(MATH, "sharded-answer-now", mode=mode)
    assert ref == 1.0 and naive == 0.0
    assert all(e.end_reason == "answered" for e in eps)


def test_adversarial_whole_episodes_earn_nothing():
    """Answer at once, ask for everything, copy the user, claim success, spray boxed answers:
    each plays whole episodes in the sharded mode and scores 0 where the reference scores 1."""
    policies = {
        "answer-now": "sharded-answer-now",
        "tell-me-everything": FixedTextPolicy(ASK_ALL),
        "copy-the-user": EchoUser(),
        "claims-success": FixedTextPolicy(CLAIM),
        "claims-success-boxed": FixedTextPolicy("The task is solved correctly: \\boxed{correct}"),
        "boxed-spray": BoxedSpray(),
    }
    for name, policy in policies.items():
        score, _ = _play(MATH, policy, episodes=10)
        assert score == 0.0, name
    assert _play(MATH, "sharded-solver", episodes=10)[0] == 1.0


def test_only_the_attempt_made_after_every_shard_counts():
    """A premature correct answer ends nothing and earns nothing (guessing every turn gains no
    extra chance); the same answer given after the last shard scores 1."""
    env = collab_env.make(MATH)
    env.reset(options={"index": 7})
    item, user = env.episode.item, ShardedUser()
    right = f"It is \\boxed{{{int(item['answer'])}}}."
    _, r, term, trunc, info = env.step({"assistant": right})
    assert r["assistant"] == 0.0 and not term["assistant"]
    assert info["assistant"]["sharded"] == {"turn": 1, "shards_said": 1, "num_shards": len(item["shards"]),
                                            "attempt": True, "final": False}
    n = len(item["shards"])
    for j in range(n - 1):
        env.step({"user": user.respond(env.observe("user"), None)})
        if j < n - 2:
            env.step({"assistant": "Go on, please."})
    _, r, term, _, info = env.step({"assistant": right})
    assert term["assistant"] and r["assistant"] == 1.0 and env.episode.end_reason == "answered"
    assert [a["final"] for a in env.episode.data["attempts"]] == [False, True]


def test_math_scoring_refuses_sprays_and_reads_the_item():
    item = {"task": "math", "task_id": "t", "answer": 42.0}
    assert score_attempt(item, "So \\boxed{42}.") == 1.0
    assert score_attempt(item, "\\boxed{42} and \\boxed{ 42 }") == 1.0  # the same value twice
    assert score_attempt(item, "\\boxed{41} or maybe \\boxed{42}") == 0.0  # a spray
    assert score_attempt(item, "The answer is 42.") == 0.0  # no box: not an answer
    assert score_attempt(item, "\\boxed{43}") == 0.0


def test_humaneval_shards_are_the_docstring_and_the_sandbox_scores_the_final_code():
    env = collab_env.make(CODE, mode="sharded")
    env.reset(options={"index": 0})
    item = env.episode.item
    assert item["task_id"] == "HumanEval/0" and 2 <= len(item["shards"]) <= 6
    assert "def has_close_elements(" in item["shards"][0] and "```python" in item["shards"][0]
    assert "check(has_close_elements)" in item["test"]
    view = env.observe("assistant")
    assert all("check(" not in m.content for m in view)  # the tests reach no observation
    ref, _ = _play(CODE, "sharded-solver", episodes=2)
    assert ref == 1.0
    wrong = "```python\ndef has_close_elements(numbers, threshold):\n    return False\n```"
    assert score_attempt(item, wrong) == 0.0
    assert score_attempt(item, "no code here") == 0.0
    stub, eps = _play(CODE, "sharded-answer-now", episodes=2, mode="full")
    assert stub == 0.0 and all(e.end_reason == "answered" for e in eps)


def _stand_in_rows(path):
    rows = [
        {"task_id": "sharded-m1", "task": "math",
         "shards": [{"shard_id": 2, "shard_text": "She has 3 bags of 4 apples."},
                    {"shard_id": 1, "shard_text": "How many apples does Ana have?"},
                    {"shard_id": 3, "shard_text": "She also has 5 loose apples."}],
         "answer": "17", "full_prompt": "Ana has 3 bags of 4 apples and 5 loose apples. How many apples?"},
        {"task_id": "sharded-c1", "task": "code",
         "shards": [{"shard_id": 1, "shard_text": "Write a Python function add_up(xs)."},
                    {"shard_id": 2, "shard_text": "It returns the sum of the list xs."},
                    {"shard_id": 3, "shard_text": "An empty list gives 0."}],
         "test": "assert add_up([1, 2, 3]) == 6\nassert add_up([]) == 0\n", "entry_point": "add_up"},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    return rows


def test_the_loader_reads_the_published_format_and_the_env_plays_its_rows(tmp_path):
    path = tmp_path / "sharded.jsonl"
    _stand_in_rows(path)
    items = load_sharded_rows(str(path))
    assert items[0]["shards"] == ["How many apples does Ana have?", "She has 3 bags of 4 apples.",
                                  "She also has 5 loose apples."]  # in shard_id order
    assert items[0]["answer"] == 17.0 and items[1]["entry_point"] == "add_up"
    env = collab_env.make(MATH, data_files=str(path))
    assert env.unwrapped.task.num_items() == 2
    user = ShardedUser()
    env.reset(options={"index": 1})
    assert env.observe("assistant")[-1].content == "Write a Python function add_up(xs)."
    for _ in range(2):
        env.step({"assistant": "What else should it do?"})
        env.step({"user": user.respond(env.observe("user"), None)})
    good = "```python\ndef add_up(xs):\n    return sum(xs)\n```"
    _, r, term, _, _ = env.step({"assistant": good})
    assert term["assistant"] and r["assistant"] == 1.0
    assert score_attempt(items[1], "```python\ndef add_up(xs):\n    return len(xs)\n```") == 0.0
    env = collab_env.make(MATH, data_files=str(path), mode="full", num_items=1)  # the row with full_prompt
    env.reset(options={"index": 0})
    assert env.observe("assistant")[-1].content.startswith("Ana has 3 bags")
    _, r, term, _, _ = env.step({"assistant": "\\boxed{17}"})
    assert term["assistant"] and r["assistant"] == 1.0


def test_the_loader_refuses_bad_rows_with_the_line_named(tmp_path):
    path = tmp_path / "bad.jsonl"
    rows = _stand_in_rows(path)
    with pytest.raises(ConfigError, match="no file"):
        load_sharded_rows(str(tmp_path / "missing.jsonl"))
    bad = dict(rows[0], shards=[{"shard_id": "one", "shard_text": "x"}])
    path.write_text(json.dumps(rows[1]) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(DataSchemaError, match="line 2.*shard_id"):
        load_sharded_rows(str(path))
    path.write_text(json.dumps(dict(rows[0], task="summary")) + "\n")
    with pytest.raises(DataSchemaError, match="line 1.*'math' or 'code'"):
        load_sharded_rows(str(path))
    path.write_text(json.dumps({k: v for k, v in rows[1].items() if k != "test"}) + "\n")
    with pytest.raises(DataSchemaError, match="'test'"):
        load_sharded_rows(str(path))
    path.write_text("{not json\n")
    with pytest.raises(DataSchemaError, match="not JSON"):
        load_sharded_rows(str(path))
    path.write_text(json.dumps(rows[1]) + "\n")  # no full_prompt
    with pytest.raises(ConfigError, match="full_prompt"):
        collab_env.make(MATH, data_files=str(path), mode="full")
    with pytest.raises(ConfigError, match="mode"):
        collab_env.make(MATH, mode="stream")
    with pytest.raises(ConfigError, match="make sharded-humaneval-v0"):
        collab_env.make(MATH, suite="humaneval")


def test_the_solver_reads_only_the_chat():
    """The reference answers from what the user said: told a different story, it computes that."""
    obs = collab_env.make(MATH, mode="full")
    obs.reset(options={"index": 0})
    view = obs.observe("assistant")
    from collab_env.types import Message

    chat = view.append(Message(role="assistant", content="More?", author="assistant"),
                       Message(role="user", content=CLOSING, author="user"))
    answer = ShardedSolver().respond(chat, None)
    assert answer == f"The answer is \\boxed{{{int(obs.episode.item['answer'])}}}."


def test_collab_env_list_shows_the_family(capsys):
    from collab_env.cli import main

    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert MATH in out and CODE in out
    assert main(["info", MATH]) == 0
    info = capsys.readouterr().out
    assert "sharded-solver" in info and "exploits tried" in info


def test_the_audit_plays_the_hostile_programs_on_the_code_suite_only():
    """sharded-humaneval's reward runs the assistant's code (under its own name, sharded_score), so
    its card asks the audit for the hostile programs; the maths suite runs no code."""
    from collab_env.exploits.audit import exploit_library

    assert any(name.startswith("hostile:") for name in exploit_library(CODE))
    assert not any(name.startswith("hostile:") for name in exploit_library(MATH))

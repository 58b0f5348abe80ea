"""CollabLLM suites on local fixture files (offline, no model)."""

from __future__ import annotations

import socket
import time

import gymnasium
import pytest
from pettingzoo.test import parallel_api_test, parallel_seed_test

import collab_env
from collab_env.errors import ConfigError, DataSchemaError, DatasetUnavailableError, PolicyError
from collab_env.policy import FixedTextPolicy
from collab_env.rollout import run_episode
from collab_env.tasks.collabllm import DEFAULT_SYSTEM_PROMPT, SessionReplayUser
from collab_env.testing.collabllm_fixtures import (
    FUTURE_USER_TURNS,
    collabllm_fixture_rows,
    write_collabllm_fixture,
    write_collabllm_hub_dir,
)
from collab_env.types import Completion, Conversation, Message

SIGNAL = "[[TERMINATE CHAT]]"
ANSWER = "Let me think about it."


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(k, "1")


@pytest.fixture
def data_file(tmp_path):
    return write_collabllm_fixture(tmp_path / "math.jsonl", "list", "jsonl", n=4)


def _make(path, **kw):
    return collab_env.make("collabllm-math-hard", data_files=str(path), **kw)


def _policies():
    return {"assistant": FixedTextPolicy(ANSWER), "user": SessionReplayUser()}


def _visible_text(obs: Conversation) -> str:
    """Everything a player can read: contents and structured meta."""
    return "\n".join(repr(m.to_dict()) for m in obs)


# -- loading --------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["jsonl", "json", "parquet"])
@pytest.mark.parametrize("layout", ["list", "struct"])
def test_both_session_layouts_load_in_every_format(tmp_path, layout, fmt):
    path = write_collabllm_fixture(tmp_path / f"d.{fmt}", layout, fmt, n=5)
    env = _make(path)
    assert env.task.num_items() == 5
    expected = collabllm_fixture_rows(5, layout="list")
    for i in range(5):
        item = env.task.get_item(i)
        # Whatever the layout on disk, sessions come back as the list of message lists.
        assert item["sessions"] == expected[i]["sessions"]
        assert item["prompt"] == expected[i]["prompt"]
        assert item["single_turn_completion"] == expected[i]["single_turn_completion"]
        assert item["task_desc"] == "solving math problems"


def test_task_desc_column_and_per_dataset_defaults(tmp_path):
    plain = write_collabllm_fixture(tmp_path / "a.jsonl", n=2)
    with_desc = write_collabllm_fixture(tmp_path / "b.jsonl", n=2, task_desc="tidying up an essay")
    assert collab_env.make("collabllm-bigcodebench", data_files=str(plain)).task.get_item(0)["task_desc"] == (
        "writing Python code"
    )
    env = collab_env.make("collabllm-medium-large", data_files=str(with_desc))
    assert env.task.get_item(1)["task_desc"] == "tidying up an essay"
    obs, _ = env.reset(seed=0)
    assert "tidying up an essay" in _visible_text(obs["user"])
    assert _make(plain, task_desc="x").task.get_item(0)["task_desc"] == "x"


def test_list_of_files_and_split_dict(tmp_path):
    a = write_collabllm_fixture(tmp_path / "a.parquet", fmt="parquet", n=3)
    b = write_collabllm_fixture(tmp_path / "b.parquet", fmt="parquet", n=2)
    env = collab_env.make("collabllm-math-hard", data_files=[str(a), str(b)])
    assert env.task.num_items() == 5
    env = collab_env.make("collabllm-math-hard", data_files={"train": str(a), "test": str(b)}, split="test")
    assert env.task.num_items() == 2
    with pytest.raises(ConfigError, match="no split 'dev'"):
        collab_env.make("collabllm-math-hard", data_files={"train": str(a)}, split="dev")


def test_missing_column_raises_schema_error_naming_column_and_file(tmp_path):
    path = write_collabllm_fixture(tmp_path / "bad.jsonl", n=3, drop=("single_turn_prompt",))
    with pytest.raises(DataSchemaError) as err:
        _make(path)
    assert "single_turn_prompt" in str(err.value)
    assert "bad.jsonl" in str(err.value)


def test_prompt_not_ending_with_user_turn_is_a_schema_error(tmp_path):
    import json

    rows = collabllm_fixture_rows(2)
    rows[0]["prompt"].append({"role": "assistant", "content": "dangling"})
    path = tmp_path / "dangling.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataSchemaError, match="end with a user turn"):
        _make(path)


def test_bad_data_files_and_keywords(tmp_path, data_file):
    with pytest.raises(DatasetUnavailableError, match="not found"):
        _make(tmp_path / "nope.jsonl")
    with pytest.raises(ConfigError, match="extension"):
        _make(tmp_path / "rows.csv")
    with pytest.raises(ConfigError, match="max_assistant_turn") as err:
        _make(data_file, max_assistant_turn=3)
    assert "max_user_turns" in str(err.value)  # the message lists the valid keywords
    with pytest.raises(ConfigError, match="mode"):
        _make(data_file, mode="test")
    with pytest.raises(ConfigError, match="max_user_turns"):
        _make(data_file, max_user_turns=0)


@pytest.mark.parametrize("flags_set_after_import", [False, True])
def test_offline_without_data_files_fails_fast_and_says_what_to_do(monkeypatch, flags_set_after_import):
    if flags_set_after_import:
        # datasets and huggingface_hub read the flags once, at import; a flag set later must work too.
        import datasets
        import huggingface_hub.constants

        monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    t0 = time.monotonic()
    with pytest.raises(DatasetUnavailableError) as err:
        collab_env.make("collabllm-math-hard")
    assert time.monotonic() - t0 < 20
    assert "data_files" in str(err.value)
    assert "hidden-facts" in str(err.value)


def test_unreachable_hub_is_reported_without_trying_to_download(monkeypatch):
    import datasets

    for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "HTTPS_PROXY",
              "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    with socket.socket() as s:  # a local port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    calls = []
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: calls.append(a) or pytest.fail("downloaded"))
    t0 = time.monotonic()
    with pytest.raises(DatasetUnavailableError) as err:
        collab_env.make("collabllm-medium")
    assert time.monotonic() - t0 < 20
    assert not calls
    assert f"127.0.0.1:{port}" in str(err.value) and "data_files" in str(err.value)


# -- conformance ------------------------------------------------------------------------------
@pytest.mark.parametrize(("layout", "fmt", "mode"), [("list", "jsonl", "train"), ("struct", "parquet", "eval")])
def test_pettingzoo_api_and_seed_tests(tmp_path, layout, fmt, mode):
    path = write_collabllm_fixture(tmp_path / f"d.{fmt}", layout, fmt, n=4)
    parallel_api_test(_make(path, mode=mode), num_cycles=200)
    parallel_seed_test(lambda: _make(path, mode=mode))


def test_single_agent_view_passes_gymnasium_checker(data_file):
    view = collab_env.make("collabllm-math-hard", data_files=str(data_file), view="assistant")
    assert isinstance(view.policies["user"], SessionReplayUser)  # the spec's default user
    gymnasium.utils.env_checker.check_env(view, skip_render_check=True)
    obs, _ = view.reset(seed=3)
    obs, reward, terminated, truncated, info = view.step(ANSWER)
    assert reward == 0.0
    assert info["other_moves"][0][0] == "user" and info["other_moves"][0][1].startswith("FUTURE-USER-")


# -- episodes -------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_hidden_goal_reaches_only_the_user_and_the_answer_nobody(data_file, mode):
    env = _make(data_file, mode=mode)
    policies = _policies()
    from collab_env._async import run_sync

    for index in range(4):
        obs, infos = env.reset(seed=index, options={"index": index})
        goal, answer, completion = f"HIDDEN-GOAL-{index}:", f"REFERENCE-ANSWER-{index}", f"RECORDED-COMPLETION-{index}"
        steps = 0
        while True:
            assert goal in _visible_text(obs["user"])
            assert goal not in _visible_text(obs["assistant"])
            for o in obs.values():
                assert answer not in _visible_text(o) and completion not in _visible_text(o)
            if not env.agents:
                break
            acts = {p: run_sync(policies[p].act([obs[p]]))[0].text for p in env.agents if infos[p]["on_turn"]}
            obs, _, _, _, infos = env.step(acts)
            steps += 1
        assert steps >= 3
        assert env.episode.end_reason == "user_terminated"
        # The global state (for centralised critics) keeps the goal, never the answer.
        assert answer not in env.state().render()


def test_train_mode_starts_from_the_prefix_with_the_assistant_on_turn(data_file):
    env = _make(data_file, system_prompt="Be a proactive collaborator.")
    obs, infos = env.reset(seed=0, options={"index": 1})
    assert infos["assistant"]["on_turn"] and not infos["user"]["on_turn"]
    assert env.on_turn == ("assistant",)
    prefix = collabllm_fixture_rows(4)[1]["prompt"]
    chat = [m for m in obs["assistant"] if m.role != "system"]
    assert [(m.author, m.content) for m in chat] == [(m["role"], m["content"]) for m in prefix]
    assert all(not m.trainable and m.meta["from_data"] for m in chat)
    assert obs["assistant"].system_prompt == "Be a proactive collaborator."
    assert "Be a proactive collaborator." not in _visible_text(obs["user"])
    # The user sees the same prefix from its side: its own turns as "assistant".
    assert [m.role for m in obs["user"] if m.role != "system"] == ["assistant", "user", "assistant"]


def test_eval_mode_starts_from_scratch_with_the_user_on_turn(data_file):
    env = _make(data_file, mode="eval")
    obs, infos = env.reset(seed=0, options={"index": 1})
    assert env.on_turn == ("user",) and infos["user"]["on_turn"] and not infos["assistant"]["on_turn"]
    assert [(m.role, m.content) for m in obs["assistant"]] == [("system", DEFAULT_SYSTEM_PROMPT)]
    assert [m.role for m in obs["user"]] == ["system"]
    # The mode may also be chosen per episode.
    obs, infos = _make(data_file, system_prompt=None).reset(seed=0, options={"index": 1, "mode": "eval"})
    assert infos["user"]["on_turn"] and len(obs["assistant"]) == 0
    with pytest.raises(ConfigError, match="mode"):
        env.reset(options={"mode": "later"})


def test_session_replay_user_drives_a_train_episode_to_user_termination(data_file):
    env = _make(data_file)
    for index in (0, 1):  # sessions holding only the continuation, and the whole conversation
        ep = run_episode(env, _policies(), seed=0, index=index)
        assert ep.terminated and not ep.truncated and ep.end_reason == "user_terminated"
        user_turns = [t.text for t in ep.turns if t.player == "user"]
        assert user_turns == [f"FUTURE-USER-{index}-{k}" for k in range(1, FUTURE_USER_TURNS + 1)] + [SIGNAL]
        assert [t.player for t in ep.turns] == ["assistant", "user"] * (FUTURE_USER_TURNS + 1)
        assert all(t.trainable for t in ep.turns if t.player == "assistant")
        assert all(not t.trainable for t in ep.turns if t.player == "user")
        # No reward is made up: the env's reward is 0.0 and the last step says where it comes from.
        assert ep.returns == {"assistant": 0.0, "user": 0.0}


def test_session_replay_user_opens_eval_episodes_with_the_recorded_user_turns(data_file):
    env = _make(data_file, mode="eval")
    ep = run_episode(env, _policies(), seed=0, index=1)
    prefix_user = [m["content"] for m in collabllm_fixture_rows(4)[1]["prompt"] if m["role"] == "user"]
    user_turns = [t.text for t in ep.turns if t.player == "user"]
    assert user_turns == prefix_user + ["FUTURE-USER-1-1", "FUTURE-USER-1-2", SIGNAL]
    assert ep.turns[0].player == "user" and ep.end_reason == "user_terminated"


def test_replay_user_opens_with_the_goal_when_nothing_is_recorded():
    goal = Message(role="system", content="goal", audience=("user",), meta={
        "kind": "collabllm_goal", "single_turn_prompt": "Solve x+1=2.", "termination_signal": SIGNAL,
        "mode": "eval", "user_turns": []})
    user = SessionReplayUser()
    import numpy as np

    rng = np.random.default_rng(0)
    assert user.respond(Conversation((goal,), viewer="user"), rng) == "Solve x+1=2."
    said = Message(role="user", content="Solve x+1=2.", author="user")
    assert user.respond(Conversation((goal, said), viewer="user"), rng) == SIGNAL
    with pytest.raises(PolicyError, match="goal"):
        user.respond(Conversation((), viewer="user"), rng)


def test_budgets_truncate(data_file):
    env = _make(data_file, max_assistant_turns=1)
    obs, infos = env.reset(seed=0, options={"index": 0})
    _, rewards, terms, truncs, infos = env.step({"assistant": ANSWER})
    assert truncs["assistant"] and not terms["assistant"] and not env.agents
    assert infos["assistant"]["end_reason"] == "max_assistant_turns"
    assert "reward wrappers" in infos["assistant"]["reward_note"]
    assert rewards == {"assistant": 0.0, "user": 0.0}

    ep = run_episode(_make(data_file, max_user_turns=1), _policies(), seed=0, index=0)
    assert ep.truncated and ep.end_reason == "max_user_turns"
    assert [t.player for t in ep.turns] == ["assistant", "user", "assistant"]  # ends on a reply

    ep = run_episode(_make(data_file, mode="eval", max_user_turns=2), _policies(), seed=0, index=0)
    assert ep.truncated and ep.end_reason == "max_user_turns"
    assert [t.player for t in ep.turns] == ["user", "assistant", "user", "assistant"]

    ep = run_episode(_make(data_file, max_steps=2), _policies(), seed=0, index=0)
    assert ep.truncated and ep.end_reason == "max_steps" and len(ep.turns) == 2


# -- the published -large layout ----------------------------------------------------------------
def _large_source(tmp_path, fmt):
    """``-large`` rows as a file of ``fmt``, or as a local copy of the hub repository."""
    if fmt.startswith("hub"):
        return {"dataset": str(write_collabllm_hub_dir(tmp_path / fmt, n=4, sequence_messages=fmt == "hub-sequence"))}
    return {"data_files": str(write_collabllm_fixture(tmp_path / f"large.{fmt}", "large", fmt, n=4))}


@pytest.mark.parametrize("fmt", ["jsonl", "json", "parquet", "hub", "hub-sequence"])
def test_large_layout_loads_in_every_format_with_its_judge_details(tmp_path, fmt):
    env = collab_env.make("collabllm-math-hard-large", **_large_source(tmp_path, fmt))
    rows = collabllm_fixture_rows(4, layout="large")
    for i, row in enumerate(rows):
        item = env.task.get_item(i)
        assert item["prompt"] == row["prompt"]
        # The sessions are the forward chats (the future after the candidate), in key order;
        # even rows have no session "2" (None in parquet/arrow, absent in JSON): dropped.
        assert len(item["sessions"]) == 2 + i % 2
        assert item["sessions"] == [row["sessions"][k]["forward_chat"] for k in sorted(row["sessions"])]
        assert item["sessions"][0][0] == {"role": "user", "content": f"FUTURE-USER-{i}-1"}
        # Judge details stay in the item, one per session; fields the row lacks (accuracy on odd
        # rows, filled with None by arrow) are left out.
        expected = [{"key": k, **{f: v for f, v in row["sessions"][k].items() if f != "forward_chat"}}
                    for k in sorted(row["sessions"])]
        assert item["session_details"] == expected
        assert ("accuracy" in item["session_details"][0]) == (i % 2 == 0)
        assert item["session_details"][1]["interactivity"] == {"score": 0.625, "thought": f"JUDGE-THOUGHT-{i}-1"}
        assert item["session_details"][1]["average_score"] == 0.625
        assert item["single_turn_metadata"] == {"level": f"Level {1 + i % 5}", "type": "Algebra"}
    # The list layouts have no per-session details (their scores are in `rewards`).
    assert _make(write_collabllm_fixture(tmp_path / "l.jsonl", n=2)).task.get_item(0)["session_details"] == []


@pytest.mark.parametrize(("fmt", "mode"), [("parquet", "train"), ("hub", "eval"), ("jsonl", "train")])
def test_large_layout_passes_the_pettingzoo_api_and_seed_tests(tmp_path, fmt, mode):
    source = _large_source(tmp_path, fmt)
    parallel_api_test(collab_env.make("collabllm-math-hard-large", mode=mode, **source), num_cycles=200)
    parallel_seed_test(lambda: collab_env.make("collabllm-math-hard-large", mode=mode, **source))


@pytest.mark.parametrize("fmt", ["parquet", "hub"])
def test_large_layout_shows_the_hidden_goal_to_the_user_only(tmp_path, fmt):
    from collab_env._async import run_sync

    env = collab_env.make("collabllm-math-hard-large", **_large_source(tmp_path, fmt))
    policies = _policies()
    for index in range(4):
        obs, infos = env.reset(seed=index, options={"index": index})
        goal, user_turns = f"HIDDEN-GOAL-{index}:", []
        while True:
            assert goal in _visible_text(obs["user"]) and goal not in _visible_text(obs["assistant"])
            for o in obs.values():  # neither the reference, the recorded reply nor judge notes leak
                text = _visible_text(o)
                assert f"REFERENCE-ANSWER-{index}" not in text and f"RECORDED-COMPLETION-{index}" not in text
                assert "THOUGHT" not in text and "ACC-REASON" not in text
            if not env.agents:
                break
            acts = {p: run_sync(policies[p].act([obs[p]]))[0].text for p in env.agents if infos[p]["on_turn"]}
            user_turns += [acts["user"]] if "user" in acts else []
            obs, _, _, _, infos = env.step(acts)
        # The replaying user says the user turns of forward_chat "0", then stops.
        assert user_turns == [f"FUTURE-USER-{index}-{k}" for k in range(1, FUTURE_USER_TURNS + 1)] + [SIGNAL]
        assert env.episode.end_reason == "user_terminated"


def test_malformed_large_session_is_a_schema_error(tmp_path):
    import json

    rows = collabllm_fixture_rows(2, layout="large")
    del rows[0]["sessions"]["1"]["forward_chat"]
    path = tmp_path / "bad.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataSchemaError, match="forward_chat"):
        collab_env.make("collabllm-math-hard-large", data_files=str(path))


# -- the collaborative system prompt -------------------------------------------------------------
@pytest.mark.parametrize("layout", ["list", "large"])
def test_default_system_prompt_reaches_the_assistant_only(tmp_path, layout):
    path = write_collabllm_fixture(tmp_path / f"{layout}.parquet", layout, "parquet", n=2)
    for mode in ("train", "eval"):
        obs, _ = _make(path, mode=mode).reset(seed=0, options={"index": 1})
        assert obs["assistant"].system_prompt == DEFAULT_SYSTEM_PROMPT
        assert obs["assistant"][0].role == "system" and obs["assistant"][0].content == DEFAULT_SYSTEM_PROMPT
        # The user simulator has its own instructions (the hidden goal), not the assistant's.
        assert DEFAULT_SYSTEM_PROMPT not in _visible_text(obs["user"])
    # It says what the recipe's prompt asks for, in our words.
    for idea in ("instead of guessing", "concise", "next steps", "not sure"):
        assert idea in DEFAULT_SYSTEM_PROMPT


def test_system_prompt_none_removes_it_and_a_string_replaces_it(tmp_path):
    import json

    rows = collabllm_fixture_rows(2)
    rows[1]["prompt"].insert(0, {"role": "system", "content": "ROW-OWN-SYSTEM"})
    path = tmp_path / "sys.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    obs, _ = _make(path, system_prompt=None).reset(seed=0, options={"index": 0})
    assert [m for m in obs["assistant"] if m.role == "system"] == []
    assert DEFAULT_SYSTEM_PROMPT not in _visible_text(obs["assistant"])
    # None keeps the row's own system message (v0's behaviour) ...
    obs, _ = _make(path, system_prompt=None).reset(seed=0, options={"index": 1})
    assert [m.content for m in obs["assistant"] if m.role == "system"] == ["ROW-OWN-SYSTEM"]
    # ... and a string (like the default) replaces it.
    obs, _ = _make(path, system_prompt="Be brief.").reset(seed=0, options={"index": 1})
    assert [m.content for m in obs["assistant"] if m.role == "system"] == ["Be brief."]
    assert "Be brief." not in _visible_text(obs["user"])
    obs, _ = _make(path).reset(seed=0, options={"index": 1})
    assert [m.content for m in obs["assistant"] if m.role == "system"] == [DEFAULT_SYSTEM_PROMPT]
    with pytest.raises(ConfigError, match="system_prompt"):
        _make(path, system_prompt=3)
    from collab_env.registry import spec

    assert spec("collabllm-math-hard").id == "collabllm-math-hard-v1"


# -- the medium default reward extracts the document first -----------------------------------------
class _ScriptedJudge:
    """A judge backend that writes out a fixed document and records each prompt it gets."""

    def __init__(self, document: str):
        self.document = document
        self.prompts: list[str] = []

    async def act(self, observations, **sampling):
        import json

        self.prompts += ["\n".join(m.content for m in o) for o in observations]
        return [Completion(text=json.dumps({"document": self.document}), finish_reason="stop") for _ in observations]


def _final_infos(env, index):
    """Play an episode with the fixed assistant and the replaying user; the last step's infos."""
    from collab_env._async import run_sync

    policies = _policies()
    obs, infos = env.reset(seed=0, options={"index": index})
    while env.agents:
        acts = {p: run_sync(policies[p].act([obs[p]]))[0].text for p in env.agents if infos[p]["on_turn"]}
        obs, _, _, _, infos = env.step(acts)
    return infos


def test_medium_default_reward_extracts_the_document_when_a_judge_is_given(tmp_path):
    from collab_env.rewards.metrics import char_bleu

    path = write_collabllm_fixture(tmp_path / "medium.jsonl", n=2)
    reference = collabllm_fixture_rows(2)[0]["single_turn_completion"]
    judge = _ScriptedJudge(reference)  # the "extracted document" is the reference itself
    env = collab_env.make("collabllm-medium", data_files=str(path), reward="conversation",
                          reward_kwargs={"judge": judge})
    assert env.metric_set.weights == {"bleu_score": 1.0, "token_amount": -1e-4}
    bleu = _final_infos(env, 0)["assistant"]["conversation_reward"]["metrics"]["bleu_score"]
    # One extraction call, on the document prompt, reading the public chat (not the hidden goal).
    assert len(judge.prompts) == 1 and "document" in judge.prompts[0]
    assert "FUTURE-USER-0-1" in judge.prompts[0] and "HIDDEN-GOAL-0" not in judge.prompts[0]
    # BLEU(reference, reference) = 1: the extracted document was scored.
    assert bleu["detail"]["source"] == "document_extractor" and bleu["value"] == pytest.approx(1.0)

    # Without a judge the last assistant message is scored: "Let me think about it." vs the reference.
    env = collab_env.make("collabllm-medium", data_files=str(path), reward="conversation")
    bleu = _final_infos(env, 0)["assistant"]["conversation_reward"]["metrics"]["bleu_score"]
    assert bleu["detail"]["source"] == "last_assistant_message"
    assert bleu["value"] == pytest.approx(char_bleu(reference, ANSWER), rel=1e-12) and bleu["value"] < 0.5

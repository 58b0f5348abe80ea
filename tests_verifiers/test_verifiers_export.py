"""collab_env envs exported to verifiers v1, evaluated end to end by ``vf-eval`` (the entry point
prime-rl's environments share) against the fake OpenAI server, compared with collab_env's own
driver playing the same replies."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import collab_env
from collab_env.rollout import run_episode
from collab_env.adapters.verifiers import (
    REWARD_NAME,
    env_class,
    new_messages,
    package_name,
    taskset,
    write_package,
)
from collab_env.errors import ConfigError
from collab_env.policy import ScriptedPolicy, policies_for
from collab_env.registry import latest_spec, spec
from collab_env.types import Conversation, Message

from .conftest import plain, reply

BIN = Path(sys.executable).parent


class Replay(ScriptedPolicy):
    """Answers as the fake server does, recording every chat it was shown."""

    name = "replay"

    def __init__(self) -> None:
        self.chats: list[list[dict[str, str]]] = []

    def respond(self, observation, rng):
        chat = observation.to_chat()
        self.chats.append(chat)
        return reply(chat)


def vf_eval(env_id: str, tmp_path: Path, server, num_tasks: int, seed: int) -> list[dict]:
    """Write the package of ``env_id``, run ``vf-eval`` on it (subprocess runtime), return the
    episodes of traces.jsonl."""
    pkg = write_package(env_id, tmp_path / "pkg")
    roles = env_class(spec(env_id).id).ROLES
    args = [str(BIN / "vf-eval"), package_name(env_id), "-m", "fake", "--no-push", "--no-rich",
            "-o", str(tmp_path / "out"), "--client.base-url", server.url, "--client.api-key-var", "FAKE_KEY",
            "--env.taskset.num-tasks", str(num_tasks), "--env.taskset.seed", str(seed)]
    for role in roles:
        args += [f"--env.{role}.runtime.type", "subprocess"]
    env = {**os.environ, "FAKE_KEY": "sk-fake", "PYTHONPATH": str(pkg),
           "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}  # the harness runs `uv` from here
    done = subprocess.run(args, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (traces,) = glob.glob(str(tmp_path / "out" / "*" / "traces.jsonl"))
    return [json.loads(line) for line in Path(traces).read_text().splitlines() if line.strip()]


def own_rollout(env_id: str, roles: tuple[str, ...], seed: int, index: int | None):
    """collab_env's own episode for the same seed and item, the roles answering as the server."""
    replay = Replay()
    env = collab_env.make(env_id)
    policies = policies_for(spec(env_id), dict.fromkeys(roles, replay))
    return run_episode(env, policies, seed=seed, index=index), replay


def check_against_driver(env_id: str, episodes: list[dict], server) -> list[float]:
    """Each exported episode's rewards, moves and model prompts equal collab_env's own rollout."""
    s = spec(env_id)
    roles = env_class(s.id).ROLES
    rewards = []
    sent = {json.dumps(plain(body["messages"])) for body in server.requests}
    for episode in episodes:
        assert episode["ok"], episode["errors"]
        data = episode["task"]["data"]
        ep, replay = own_rollout(s.id, roles, data["seed"], data.get("index"))
        traces = {t["agent"]["name"]: t for t in episode["traces"]}
        assert sorted(traces) == sorted(roles)
        for role in roles:
            t = traces[role]
            assert t["agent"]["trainable"] is True
            # Same float operations on both sides except the grouping of the sum over rounds.
            assert t["rewards"][REWARD_NAME]["score"] == pytest.approx(ep.returns[role], abs=1e-12)
            for name, v in ep.components[role].items():
                assert t["metrics"][name] == pytest.approx(v, abs=1e-12)
            facts = t["info"]["collab_env"]
            assert facts["end_reason"] == ep.end_reason
            assert facts["moves"] == [[m.author, m.content] for m in ep.conversation
                                      if m.author in s.players]
            rewards.append(t["rewards"][REWARD_NAME]["score"])
        # The model saw exactly the chats collab_env's policy saw (its view of the env).
        for chat in replay.chats:  # as text (a tool call's fields and ids are checked where there are tools)
            assert json.dumps(plain(chat)) in sent
    return rewards


def test_hidden_facts_end_to_end(tmp_path, model_server):
    model_server.reset()
    episodes = vf_eval("hidden-facts", tmp_path, model_server, num_tasks=6, seed=100)
    assert sorted(e["task"]["data"]["seed"] for e in episodes) == list(range(100, 106))
    rewards = check_against_driver("hidden-facts", episodes, model_server)
    # AskThenAnswer solves every item, AnswerAtOnce guesses 1 for withheld quantities: both
    # outcomes occur among these seeds, so the comparison is not of constants.
    assert set(rewards) == {0.0, 1.0}


def test_length_ratio_two_agents_end_to_end(tmp_path, model_server):
    model_server.reset()
    episodes = vf_eval("length-ratio", tmp_path, model_server, num_tasks=8, seed=7)
    # The taskset numbers items as eval does: task k -> seed 7 + k, item k % 32 train prompts.
    assert sorted((e["task"]["data"]["seed"], e["task"]["data"]["index"]) for e in episodes) == \
        [(7 + k, k) for k in range(8)]
    rewards = check_against_driver("length-ratio", episodes, model_server)
    # Ratios 1.5, 2, 2.5, 3 (by task length): rewards exp(-0.5) ~ 0.607 and 1.0, both agents alike.
    assert min(rewards) < 0.7 and max(rewards) == 1.0
    for e in episodes:
        a, b = (t["rewards"][REWARD_NAME]["score"] for t in e["traces"])
        assert a == b


def test_new_messages_sends_what_arrived_since_the_last_reply():
    conv = Conversation((
        Message("system", "be brief", audience=("assistant",)),
        Message("user", "hi", author="user"),
        Message("assistant", "what do you need?", author="assistant"),
        Message("user", "a number", author="user"),
        Message("user", "[turn 2 of 3]", author="env"),
    )).view("assistant")
    assert new_messages(conv[:2], "assistant") == [{"role": "user", "content": "hi"}]
    assert new_messages(conv, "assistant") == [{"role": "user", "content": "a number"},
                                               {"role": "user", "content": "[turn 2 of 3]"}]
    assert new_messages(conv[:3], "assistant") == []


def test_taskset_numbering_and_errors(tmp_path):
    ts = taskset("hidden-facts", num_tasks=3, seed=5)
    HF = latest_spec("hidden-facts").id  # the name means its latest version
    assert [(t.data.env_id, t.data.seed, t.data.index) for t in ts] == \
        [(HF, 5, None), (HF, 6, None), (HF, 7, None)]
    assert len({t.key for t in ts}) == 3
    assert env_class("length-ratio").ROLES == ("agent_0", "agent_1")
    assert env_class("length-ratio", ("agent_0",)).ROLES == ("agent_0",)
    with pytest.raises(ConfigError, match="not a player"):
        env_class("hidden-facts", ("critic",))
    write_package("hidden-facts", tmp_path)
    with pytest.raises(ConfigError, match="not empty"):
        write_package("hidden-facts", tmp_path)


def test_written_package_installs_and_loads_by_id(tmp_path):
    pkg = write_package("length-ratio", tmp_path / "src")
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                    "--no-build-isolation", "--target", str(target), str(pkg)], check=True, timeout=300)
    code = ("from verifiers.v1.utils.loaders import environment_class, taskset_class, env_config_type\n"
            "i = 'collab-length-ratio-v0'\n"
            "print(environment_class(i).__name__, taskset_class(i).__name__,"
            " sorted(set(env_config_type(i).model_fields) & {'agent_0', 'agent_1'}))")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(target)},
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["LengthRatioV0Env", "LengthRatioV0Taskset", "['agent_0',", "'agent_1']"]


def test_team_facts_agents_and_user_end_to_end(tmp_path, model_server):
    """Two trained roles on turn together plus collab_env's scripted user inside the driver:
    the served model plays the coordinated team (from the plain chat), every episode's rewards,
    moves and prompts equal collab_env's own rollout, and the team answers exactly."""
    model_server.reset()
    assert env_class("team-facts-easy").ROLES == ("agent_0", "agent_1")
    episodes = vf_eval("team-facts-easy", tmp_path, model_server, num_tasks=4, seed=3)
    assert sorted(e["task"]["data"]["seed"] for e in episodes) == [3, 4, 5, 6]
    rewards = check_against_driver("team-facts-easy", episodes, model_server)
    assert rewards == [1.0] * 8  # 4 episodes x 2 roles: no wasted question, exact answer
    # the served agents never saw the user's hidden facts; their chats hold the private answers
    assert not any("You know these facts" in json.dumps(body["messages"]) for body in model_server.requests)
    assert any("The user (to you):" in json.dumps(body["messages"]) for body in model_server.requests)


def test_phone_support_tool_calls_end_to_end(tmp_path, model_server):
    """A tool env under verifiers: the served model writes its calls as text (the env's one
    format; verifiers is given no tools), the env answers each with a ``tool`` message that goes
    back with the call's id, and every episode's rewards, moves and prompts equal collab_env's
    own rollout; the reference wins every item."""
    model_server.reset()
    episodes = vf_eval("phone-support", tmp_path, model_server, num_tasks=3, seed=2)
    rewards = check_against_driver("phone-support", episodes, model_server)
    assert rewards == [1.0] * 3
    tool_msgs = [m for body in model_server.requests for m in body["messages"] if m["role"] == "tool"]
    assert tool_msgs and all(m.get("tool_call_id") for m in tool_msgs)
    assert not any("tools" in body for body in model_server.requests)
    for e in episodes:  # the moves hold the calls as the model wrote them, and the results
        moves = e["traces"][0]["info"]["collab_env"]["moves"]
        assert any(text.startswith('{"name": "lookup_account"') for who, text in moves if who == "assistant")

"""phone-support-v0: dual control, graded by the final state (issue 46)."""

import json

import pytest

import collab_env
from collab_env.errors import ConfigError
from collab_env.exploits.tools import AskUserToDoEverything, CallEveryTool, ClaimSuccess
from collab_env.policy import FixedTextPolicy
from collab_env.rollout import run_episode
from collab_env.tasks.phone_support import (
    USER_TOOLS,
    PhoneSupportNaive,
    PhoneSupportReference,
    PhoneSupportUser,
    instructions,
)


def _play(assistant, seed, **kw):
    env = collab_env.make("phone-support-v0", **kw)
    ep = run_episode(env, {"assistant": assistant, "user": PhoneSupportUser()}, seed=seed)
    return env.unwrapped, ep


def test_reference_succeeds_and_naive_fails_where_the_fix_needs_the_account():
    wins = {"ref": 0, "naive": 0}
    for seed in range(20):
        env, ep = _play(PhoneSupportReference(), seed)
        assert ep.returns["assistant"] == 1.0 and ep.end_reason == "user_ended", seed
        assert env.task.resolved(env.episode)
        wins["ref"] += 1
        item = env.episode.item
        _, naive = _play(PhoneSupportNaive(), seed)
        # the usual advice fixes exactly the items whose only faults it covers
        covered = set(item["faults"]) <= {"airplane", "data"} and not item["suspended"]
        assert naive.returns["assistant"] == float(covered), (seed, item)
        wins["naive"] += int(covered)
    assert wins["ref"] == 20 and 0 < wins["naive"] < 20


def test_only_the_final_state_counts():
    """A speed test that passes with data roaming left on at home still fails; a claim earns nothing."""
    env = collab_env.make("phone-support-v0")
    task = env.unwrapped.task
    index = next(i for i in range(50) if task.get_item(i)["faults"] == ["roaming"]
                 and not task.get_item(i)["abroad"] and not task.get_item(i)["suspended"])
    env.reset(seed=0, options={"index": index})
    # at home with roaming on: the phone is connected, the user would call it fixed
    env.step({"assistant": "Please run a speed test."})
    obs, *_ = env.step({"user": '{"name": "run_speed_test", "arguments": {}}'})
    assert "48 Mbps" in obs["user"][-1].content
    _, rew, term, _, infos = env.step({"user": "It works now, thank you! [done]"})
    assert term["user"] and rew["assistant"] == 0.0 and infos["assistant"]["resolved"] is False
    for seed in range(10):
        _, ep = _play(ClaimSuccess(), seed)
        assert ep.returns["assistant"] == 0.0


def test_each_side_sees_only_its_own_tools_and_results():
    env, ep = _play(PhoneSupportReference(), 5)
    a, u = ep.conversation.view("assistant"), ep.conversation.view("user")
    assert any(m.meta.get("name") == "lookup_account" for m in a if m.role == "tool")
    assert not any(m.role == "tool" and m.meta.get("name") in {t.name for t in USER_TOOLS} for m in a)
    assert not any(m.role == "tool" and m.meta.get("name") in {"lookup_account", "resume_line"} for m in u)
    # the plan's APN is on the account's side: the user first reads it from the assistant
    first = next(m for m in u if "biz.fastnet" in m.content)
    assert first.author == "assistant" and first.role == "user"


def test_malformed_and_refused_calls_are_errors_the_caller_reads():
    env = collab_env.make("phone-support-v0")
    env.reset(seed=0)
    _, _, _, _, infos = env.step({"assistant": '{"name": "lookup_account", "arguments": {"phone_number": "555-0000"}}'})
    assert infos["assistant"]["tool_call"]["ok"] is False and "no account" in infos["assistant"]["tool_call"]["error"]
    _, _, _, _, infos = env.step({"assistant": '{"name": "set_apn", "arguments": {"name": "x"}}'})
    assert "no tool 'set_apn'" in infos["assistant"]["tool_call"]["error"]  # the phone is not the assistant's
    assert env.unwrapped.episode.tool_errors == {"assistant": 2}
    assert env.unwrapped.episode.data["device"]["apn"] != "x"


def test_tool_exploits_earn_nothing():
    others = list(USER_TOOLS)
    for policy in (CallEveryTool(), ClaimSuccess(), AskUserToDoEverything(others),
                   FixedTextPolicy('{"name": "resume_line"')):
        for seed in range(8):
            _, ep = _play(policy, seed, max_steps=20)
            assert ep.returns["assistant"] == 0.0, (policy, seed)
    _, ep = _play(CallEveryTool(), 0, max_steps=6)
    names = [json.loads(m.content)["name"] for m in ep.conversation if m.author == "assistant" and m.tool_calls]
    assert names[:2] == ["lookup_account", "resume_line"]


def test_the_scripted_user_reads_clear_steps_only():
    assert instructions('Turn off airplane mode, turn on data roaming and set the APN to "biz.fastnet". '
                        "Then run a speed test.") == [
        ("set_airplane_mode", {"on": False}), ("set_data_roaming", {"on": True}),
        ("set_apn", {"name": "biz.fastnet"}), ("run_speed_test", {})]
    assert instructions("Switch airplane mode on or off on your phone.") == []  # ambiguous: nothing
    assert instructions("Please fix your settings yourself.") == []


def test_config_is_checked():
    with pytest.raises(ConfigError, match="suspended_rate"):
        collab_env.make("phone-support-v0", suspended_rate=2.0)
    with pytest.raises(ConfigError, match="unknown keyword"):
        collab_env.make("phone-support-v0", suspend_rate=0.5)


def test_served_phone_support_carries_tool_calls_and_results_over_the_wire():
    """The assistant's seat served over OpenEnv (a real server subprocess on 127.0.0.1): its calls
    run on the server, and the results come back with their tool_call_id."""
    pytest.importorskip("openenv")
    from collab_env.serve import remote_env
    from collab_env.testing.served import served

    with served("phone-support") as url:
        env = remote_env(url)
        try:
            ep = run_episode(env, {"assistant": PhoneSupportReference()}, seed=5)
        finally:
            env.close()
    assert ep.returns["assistant"] == 1.0 and ep.end_reason == "user_ended"
    calls = [m for m in ep.conversation if m.tool_calls]
    results = [m for m in ep.conversation if m.role == "tool"]
    assert [c.tool_calls[0].name for c in calls] == ["lookup_account", "resume_line"]
    assert [r.tool_call_id for r in results] == [c.tool_calls[0].id for c in calls]
    assert all(c.audience == ("assistant",) and c.trainable for c in calls)
    assert ep.costs["tool_calls"] == 2.0 and ep.costs["tool_errors"] == 0.0

import asyncio
import pickle

import pytest

from collab_env.env import CollabEnv
from collab_env.errors import ActionError, ConfigError, EnvStateError
from tests.toy_tasks import TwoWriters, make_two_writers


def test_simultaneous_turns_and_on_turn_infos():
    env = make_two_writers()
    obs, infos = env.reset(seed=0)
    assert env.agents == ["agent_0", "agent_1", "user"]
    assert [a for a in env.agents if infos[a]["on_turn"]] == ["agent_0", "agent_1"]
    obs, rew, term, trunc, infos = env.step({"agent_0": "abc", "agent_1": "hello", "user": "ignored"})
    assert rew == {"agent_0": 3.0, "agent_1": 5.0, "user": 0.0}
    assert infos["agent_0"]["reward_components"] == {"length": 3.0}
    assert [a for a in env.agents if infos[a]["on_turn"]] == ["user"]
    # the off-turn action was ignored: it is nowhere in the transcript
    assert all("ignored" not in m.content for m in env.state())
    # agent_0 sees agent_1's message as "user" and its own as "assistant"
    roles = {m.author: m.role for m in obs["agent_0"] if m.author != "env"}
    assert roles == {"agent_0": "assistant", "agent_1": "user"}
    # the user's secret is only in the user's view
    assert any("secret" in m.content for m in obs["user"])
    assert not any("secret" in m.content for m in obs["agent_0"])
    obs, rew, term, trunc, infos = env.step({"user": "done"})
    assert all(term.values()) and not any(trunc.values())
    assert env.agents == [] and infos["user"]["end_reason"] == "user_done"
    with pytest.raises(EnvStateError, match="reset"):
        env.step({"user": "x"})


def test_action_errors_are_clear():
    env = make_two_writers()
    with pytest.raises(EnvStateError, match="reset"):
        env.step({"agent_0": "x"})
    env.reset(seed=0)
    with pytest.raises(ActionError, match="agent_1.*on turn"):
        env.step({"agent_0": "only one"})
    with pytest.raises(ActionError, match="Did you mean 'agent_0'"):
        env.step({"agent0": "x", "agent_0": "x", "agent_1": "y"})
    with pytest.raises(ActionError, match=r"str\).*completion.text"):
        from collab_env.types import Completion

        env.step({"agent_0": Completion("x"), "agent_1": "y"})
    with pytest.raises(ActionError, match="dict"):
        env.step(["x", "y"])
    # nothing was applied by the failed calls
    assert env.episode.step == 0


def test_truncation_by_steps_and_chars_and_clipping():
    env = make_two_writers(max_steps=3)
    env.reset(seed=0)
    env.step({"agent_0": "a", "agent_1": "b"})
    env.step({"user": "more"})
    _, _, term, trunc, infos = env.step({"agent_0": "a", "agent_1": "b"})
    assert all(trunc.values()) and not any(term.values())
    assert infos["agent_0"]["end_reason"] == "max_steps"

    env = make_two_writers(max_total_chars=10)
    env.reset(seed=0)
    _, _, term, trunc, infos = env.step({"agent_0": "x" * 6, "agent_1": "y" * 6})
    assert all(trunc.values()) and infos["user"]["end_reason"] == "max_total_chars"

    env = make_two_writers(max_message_chars=8)
    env.reset(seed=0)
    _, _, _, _, infos = env.step({"agent_0": "z" * 1_000_000, "agent_1": "\ud800ok"})
    assert infos["agent_0"]["clipped"] and infos["agent_0"]["clipped_from"] == 1_000_000
    msgs = {m.author: m for m in env.state()}
    assert msgs["agent_0"].content == "z" * 8
    assert msgs["agent_1"].content == "\ufffdok" and infos["agent_1"]["replaced_invalid_unicode"]


def test_reset_options_and_seeding():
    env = make_two_writers()
    _, infos = env.reset(seed=1, options={"index": 2})
    assert env.episode.item["topic"] == "rain" and infos["agent_0"]["index"] == 2
    env.reset(options={"index": 0, "topic": "snow"})
    assert any("snow" in m.content for m in env.state())
    with pytest.raises(ConfigError, match="out of range"):
        env.reset(options={"index": 3})
    with pytest.warns(UserWarning, match="unknown option"):
        env.reset(options={"colour": "red"})
    seq1 = [make_two_writers().reset(seed=s)[1]["agent_0"]["index"] for s in range(10)]
    seq2 = [make_two_writers().reset(seed=s)[1]["agent_0"]["index"] for s in range(10)]
    assert seq1 == seq2 and len(set(seq1)) > 1


def test_clone_is_independent_and_exact():
    env = make_two_writers()
    env.reset(seed=0)
    env.step({"agent_0": "a", "agent_1": "b"})
    fork = env.clone()
    out1 = env.step({"user": "go on"})
    assert len(fork.state()) == len(env.state()) - 1
    out2 = fork.step({"user": "go on"})
    assert out1[1] == out2[1] and out1[0] == out2[0]
    fork.step({"agent_0": "x", "agent_1": "y"})
    assert fork.episode.step == 3 and env.episode.step == 2


def test_the_episode_generator_is_seeded_by_the_reset_and_forks_where_it_stands():
    """``EpisodeState.rng`` is built on first use from the seed drawn at reset: a seeded reset
    gives the same draws every time, other seeds give others, and a clone (drawn from or not)
    continues the stream from where the original stands."""
    import numpy as np

    def draws(seed):
        env = make_two_writers()
        env.reset(seed=seed)
        return env.episode.rng.integers(1 << 30, size=4).tolist()

    assert draws(5) == draws(5) and draws(5) != draws(6)
    env = make_two_writers()
    env.reset(seed=5)
    untouched = env.clone()  # forked before any draw: starts the stream itself
    first = env.episode.rng.integers(1 << 30, size=2).tolist()
    fork = env.clone()  # forked after two draws: continues from there
    rest = env.episode.rng.integers(1 << 30, size=2).tolist()
    assert first + rest == draws(5)
    assert fork.episode.rng.integers(1 << 30, size=2).tolist() == rest
    assert untouched.episode.rng.integers(1 << 30, size=4).tolist() == draws(5)
    assert env.episode.rng_seed == untouched.episode.rng_seed
    assert draws(5) == np.random.default_rng(env.episode.rng_seed).integers(1 << 30, size=4).tolist()


def test_pickle_mid_episode():
    env = make_two_writers()
    env.reset(seed=0)
    env.step({"agent_0": "a", "agent_1": "b"})
    back = pickle.loads(pickle.dumps(env))
    assert back.state() == env.state() and back.on_turn == ("user",)


def test_async_core_and_sync_inside_running_loop():
    env = make_two_writers()

    async def main():
        obs, infos = await env.areset(seed=0)
        out = await env.astep({"agent_0": "a", "agent_1": "b"})
        # the sync facade also works from inside a running loop (e.g. Jupyter)
        sync_out = env.clone().step({"user": "done"})
        return out, sync_out

    out, sync_out = asyncio.run(main())
    assert out[1]["agent_1"] == 1.0 and all(sync_out[2].values())


def test_render_close_and_validation(capsys):
    env = make_two_writers(render_mode="ansi")
    env.reset(seed=0)
    env.step({"agent_0": "first", "agent_1": "second"})
    text = env.render()
    assert "[agent_0/assistant]\nfirst" in text and "(visible to user)" in text
    human = make_two_writers(render_mode="human")
    human.reset(seed=0)
    human.step({"agent_0": "shown", "agent_1": "too"})
    assert "shown" in capsys.readouterr().out
    env.close()
    env.close()
    with pytest.raises(EnvStateError, match="closed"):
        env.reset()
    with pytest.raises(ConfigError, match="render_mode"):
        make_two_writers(render_mode="rgb_array")
    with pytest.raises(ConfigError, match="Task"):
        CollabEnv(object())  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="max_steps"):
        CollabEnv(TwoWriters(), max_steps=0)

"""SkyRL export: a collab_env env as a skyrl-gym ``BaseTextEnv``, made with ``skyrl_gym.make``."""

import asyncio
import math
import subprocess
import sys

import pytest

skyrl_gym = pytest.importorskip("skyrl_gym")

from skyrl_gym.envs.base_text_env import BaseTextEnv  # noqa: E402

import collab_env  # noqa: E402
from collab_env.adapters.skyrl import CollabTextEnv, dataset, register, skyrl_id  # noqa: E402
from collab_env.errors import ConfigError, EnvStateError, UnknownEnvError  # noqa: E402
from collab_env.tasks.cooperative import LengthRatioPartner  # noqa: E402

SEED, INDEX = 3, 5


def _replies(item, answer):
    """Two questions about the hidden facts, then an answer."""
    labels = [f["label"] for f in item["facts"]]
    return [f"Could you tell me {labels[0]} and {labels[1]}?",
            f"And {labels[2]}, and {labels[3]}?",
            f"The total is \\boxed{{{answer}}}."]


def _own_view_run(replies, seed=SEED, index=INDEX):
    """The same episode played through collab_env's own single-agent view."""
    view = collab_env.make("hidden-facts", view="assistant")
    obs, _ = view.reset(seed=seed, options={"index": index})
    chats, out = [obs.to_chat()], []
    for r in replies:
        obs, reward, term, trunc, info = view.step(r)
        out.append((obs.to_chat(), reward, term or trunc))
        if term or trunc:
            break
    return chats[0], out, view


@pytest.mark.parametrize("correct", [True, False])
def test_hidden_facts_plays_a_full_episode_through_skyrl_make_like_the_single_agent_view(correct):
    sid = register("hidden-facts")
    assert sid == "collab_env/hidden-facts-v3" == skyrl_id("hidden-facts")
    env = skyrl_gym.make(sid, env_config={}, extras={"extra_info": {"seed": SEED, "index": INDEX}, "max_turns": 2})
    assert isinstance(env, BaseTextEnv) and isinstance(env, CollabTextEnv)

    item = collab_env.make("hidden-facts").task.get_item(INDEX)
    answer = item["answer"] if correct else item["answer"] + 1
    replies = _replies(item, answer)
    opening, expected, _ = _own_view_run(replies)

    chat, info = env.init([{"role": "user", "content": "ignored: the env writes its own opening"}])
    assert chat == opening and info["index"] == INDEX
    history = list(chat)
    rewards = []
    for r, (view_chat, view_reward, view_done) in zip(replies, expected, strict=True):
        out = env.step(r)
        history += [{"role": "assistant", "content": r}, *out["observations"]]
        # SkyRL's chat (its prompt + replies + observations) is the view's observation, message for message.
        assert history == view_chat
        assert out["reward"] == view_reward and out["done"] == view_done
        rewards.append(out["reward"])
    # Two questions answered by the scripted user (reward 0), then the checked answer ends it.
    assert [o["content"] for o in history if o["role"] == "user"][1:3] == [
        " ".join(f["sentence"] for f in item["facts"][:2]), " ".join(f["sentence"] for f in item["facts"][2:])]
    assert rewards == [0.0, 0.0, 1.0 if correct else 0.0]
    assert out["done"] and out["metadata"]["end_reason"] == "answered"
    assert env.get_metrics() == {"return": rewards[-1], "turns": 3, "done": 1.0,
                                 "reward/accuracy": 1.0 if correct else 0.0, "reward/turn_cost": 0.0}
    with pytest.raises(EnvStateError, match="ended"):
        env.step("more")
    env.close()


def test_the_other_player_is_played_by_the_driver_with_the_given_policies():
    # length-ratio, trained player agent_0; agent_1 is the fixed partner (the spec's default).
    sid = register("length-ratio", player="agent_0", id="lr-agent0")
    env = skyrl_gym.make(sid, env_config={}, extras={"extra_info": {"seed": 0, "index": 2}})
    chat, _ = env.init(None)
    item = collab_env.make("length-ratio").task.get_item(2)
    assert chat == [{"role": "user", "content": "Answer the following in a brief response: a few sentences "
                                                "at most.\n\n" + item["prompt"]}]
    brief = "A short answer."
    out = env.step(brief)
    detailed = LengthRatioPartner.detailed_answer(item["prompt"])
    ratio = len(detailed) / len(brief)  # far above the band [2, 3]
    assert out["reward"] == pytest.approx(math.exp(-(ratio - 3.0)), rel=1e-12)  # same float ops, any CPU
    assert out["done"] and out["observations"] == []  # agent_1's reply is private to it
    assert out["metadata"]["other_moves"] == [["agent_1", detailed]]


def test_sync_calls_inside_a_running_event_loop():
    # SkyRL's generator calls init/step from a coroutine when it has no executor.
    sid = register("hidden-facts")

    async def main():
        env = skyrl_gym.make(sid, env_config={}, extras={"seed": SEED, "index": INDEX})
        chat, _ = env.init([])
        return chat, env.step("\\boxed{1}")

    chat, out = asyncio.run(main())
    assert chat == _own_view_run([])[0]
    assert out["done"] and out["reward"] == 0.0


def test_dataset_rows_hold_the_opening_and_the_episode_keys():
    rows = dataset("hidden-facts", indices=[5, 7], seed=3)
    assert [r["extra_info"] for r in rows] == [{"seed": 3, "index": 5}, {"seed": 4, "index": 7}]
    assert all(r["env_class"] == "collab_env/hidden-facts-v3" for r in rows)
    assert rows[0]["prompt"] == _own_view_run([])[0]
    sid = register("hidden-facts")
    env = skyrl_gym.make(sid, env_config={}, extras={k: v for k, v in rows[1].items() if k not in ("prompt", "env_class")})
    assert env.init(rows[1]["prompt"])[0] == rows[1]["prompt"]
    assert len(dataset("length-ratio", player="agent_1")) == 32  # the train split, every item
    with pytest.raises(ConfigError, match="num_items"):
        dataset("hidden-facts")


def test_skyrl_aggregates_the_registered_envs_metrics():
    """SkyRL's generator ends every batch with ``skyrl_gym.metrics.aggregate_for_environment``,
    which calls the registered entry point's ``aggregate_metrics`` as on an env class (a plain
    ``functools.partial`` entry point made every ``generate`` raise)."""
    from skyrl_gym.metrics import aggregate_for_environment

    sid = register("hidden-facts")
    assert aggregate_for_environment(sid, [{"return": 1.0}, {"return": 0.0}]) == {"return": 0.5}


def test_errors_are_clear():
    with pytest.raises(UnknownEnvError):
        register("no-such-env")
    with pytest.raises(ConfigError, match="not a player"):
        register("hidden-facts", player="critic")
    sid = register("hidden-facts")
    with pytest.raises(ConfigError, match="extra_info"):
        skyrl_gym.make(sid, env_config={}, extras={"extra_info": {"seed": "x"}})
    env = skyrl_gym.make(sid, env_config={}, extras={})
    with pytest.raises(EnvStateError, match="init"):
        env.step("hi")


def test_missing_skyrl_gym_names_the_extra():
    code = ("import sys; sys.modules['skyrl_gym'] = None\n"
            "from collab_env.errors import MissingDependencyError\n"
            "try:\n    import collab_env.adapters.skyrl\n"
            "except MissingDependencyError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "collab_env[skyrl]" in out.stdout

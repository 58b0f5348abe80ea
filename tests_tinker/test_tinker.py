"""collab_env envs under tinker-cookbook (0.5.0), against SkyRL's local Tinker API server (JAX, CPU).

The adapter's envs are checked against collab_env's own episode of the same item and seed (the
rewards of each move, the end, the next observation); then tinker-cookbook's own training entry
(``tinker_cookbook.rl.train.main``) trains a tiny model on ``letter-requests`` (multi-turn, a dense
reward a random model earns) through the real server, and must end with a checkpoint whose
weights differ from the base model's; and a simulated user samples from a Tinker sampling client.
"""

from __future__ import annotations

import asyncio
import json
import os
import pickle
from pathlib import Path

import pytest
import tinker
from tinker_cookbook import renderers
from tinker_cookbook.completers import TinkerMessageCompleter
from tinker_cookbook.rl import train
from tinker_cookbook.tokenizer_utils import get_tokenizer

import collab_env
from collab_env.adapters.tinker import CollabDatasetBuilder, CollabEnvGroupBuilder, CompleterPolicy
from collab_env.errors import ConfigError
from collab_env.policy import CallablePolicy, policies_for
from collab_env.rollout import run_episode, turn_rewards

from .conftest import LORA_RANK

ENV = "letter-requests"
RENDERER = "qwen3_instruct"
REPLIES = ["abcdefghij", "the red box", "zzz"]


def builder(model, **kw):
    args = {"index": 3, "seed": 7, "group_size": 2, "model_name_for_tokenizer": model, "renderer_name": RENDERER}
    return CollabEnvGroupBuilder(ENV, **{**args, **kw})


def reply_tokens(renderer, text, *, stop=True):
    ids = renderer.tokenizer.encode(text, add_special_tokens=False)
    return ids + (list(renderer.get_stop_sequences()) if stop else [])


def replay(index, seed, replies):
    """collab_env's own episode of the item, the assistant sending ``replies``."""
    def reply(obs):
        return replies[sum(m.role == "assistant" for m in obs)]

    env = collab_env.make(ENV)
    ep = run_episode(env, {**policies_for(env.spec), "assistant": CallablePolicy(reply)}, seed=seed, index=index)
    return ep


async def play(env, texts, *, stop=True):
    ob, stop_condition = await env.initial_observation()
    steps = [(ob, None)]
    for text in texts:
        r = await env.step(reply_tokens(env.renderer, text, stop=stop),
                           extra={"stop_reason": "stop" if stop else "length"})
        steps.append((r.next_observation, r))
        if r.episode_done:
            break
    return stop_condition, steps


def test_group_builder_pickles_and_its_envs_pay_collab_envs_own_turn_rewards(tiny_qwen3):
    b = pickle.loads(pickle.dumps(builder(tiny_qwen3)))
    envs = asyncio.run(b.make_envs())
    assert len(envs) == 2
    ep = replay(3, 7, REPLIES)
    credits = turn_rewards(ep, "assistant")
    assert len(credits) == len(REPLIES) and len({round(c, 9) for c in credits}) > 1  # a dense reward
    renderer = envs[0].renderer
    chat = ep.conversation.view("assistant").to_chat()
    first = chat[: next(i for i, m in enumerate(chat) if m["role"] == "assistant")]
    for env in envs:
        stop, steps = asyncio.run(play(env, REPLIES))
        assert stop == renderer.get_stop_sequences()
        # the first observation is collab_env's opening of the item, rendered for generation
        assert steps[0][0].to_ints() == renderer.build_generation_prompt(
            [renderers.Message(role=m["role"], content=m["content"]) for m in first]).to_ints()
        results = [r for _, r in steps[1:]]
        assert [r.reward for r in results] == pytest.approx(credits, abs=1e-12)
        assert [r.episode_done for r in results] == [False] * (len(REPLIES) - 1) + [True]
        assert results[-1].metrics["return"] == pytest.approx(ep.returns["assistant"], abs=1e-12)
        # the next observation is the whole view: it ends with the user's next request
        second_request = [m for m in chat if m["role"] == "user"][1]["content"]
        assert second_request in renderer.tokenizer.decode(steps[1][0].to_ints())
    assert asyncio.run(b.compute_group_rewards([None, None], envs)) == [(0.0, {}), (0.0, {})]


def test_group_rewards_pay_the_episode_return_once(tiny_qwen3):
    b = builder(tiny_qwen3, reward_at="group", group_size=1)
    (env,) = asyncio.run(b.make_envs())
    _, steps = asyncio.run(play(env, REPLIES))
    assert [r.reward for _, r in steps[1:]] == [0.0] * len(REPLIES)
    ((reward, _),) = asyncio.run(b.compute_group_rewards([None], [env]))
    assert reward == pytest.approx(replay(3, 7, REPLIES).returns["assistant"], abs=1e-12) and reward > 0


@pytest.mark.parametrize("reward_at", ["step", "group"])
def test_a_joint_reward_option_is_paid_per_step_or_as_the_group_reward(tiny_qwen3, reward_at):
    # length-ratio (single-turn, two trainable agents) under its joint-difference reward: agent_1's
    # reward is the team's score minus the score without its move, not the env's shared reward
    def own(reward):
        env = collab_env.make("length-ratio", **({"reward": reward} if reward else {}))
        table = {**policies_for(env.spec), "agent_1": CallablePolicy(lambda o: "a short reply")}
        return run_episode(env, table, seed=5, index=2).returns["agent_1"]

    expected = own("joint-difference")
    assert expected != pytest.approx(own(None), abs=1e-6)
    b = CollabEnvGroupBuilder("length-ratio", index=2, seed=5, group_size=1, model_name_for_tokenizer=tiny_qwen3,
                              renderer_name=RENDERER, player="agent_1", reward_at=reward_at,
                              env_kwargs={"reward": "joint-difference"})
    (env,) = asyncio.run(b.make_envs())
    _, steps = asyncio.run(play(env, ["a short reply"]))
    ((group, _),) = asyncio.run(b.compute_group_rewards([None], [env]))
    assert steps[-1][1].episode_done
    paid = (steps[-1][1].reward, group)
    assert paid == pytest.approx((expected, 0.0) if reward_at == "step" else (0.0, expected), abs=1e-12)


MR_ENV = "hidden-facts-easy"
MR_KWARGS = {"reward": "mr", "reward_kwargs": {"weights": {"accuracy_rule": 1.0, "token_amount": -1e-2},
                                              "policy": "ask-then-answer", "num_rollouts": 2,
                                              "max_assistant_turns": 3}}
MR_REPLIES = ["Before I compute the total, I need a few details. How much does each box of toys weigh?",
              "\\boxed{7}", "\\boxed{7}"]


def mr_replay(index, seed, replies):
    """The same moves through collab_env's own Gymnasium view of the env under MR (the thin
    wrapper: the futures are rolled by the fixed policy of reward_kwargs, ask-then-answer, with the
    env's scripted user): each move's reward and its MR components."""
    view = collab_env.make(MR_ENV, view="assistant", **MR_KWARGS)
    view.reset(seed=seed, options={"index": index})
    paid = []
    for text in replies:
        _, reward, terminated, truncated, info = view.step(text)
        paid.append((reward, info["reward_components"]))
        if terminated or truncated:
            return paid
    raise AssertionError("the episode did not end")


@pytest.mark.parametrize("reward_at", ["step", "group"])
def test_the_multiturn_aware_reward_is_paid_per_step_or_as_the_group_reward(tiny_qwen3, reward_at):
    """reward='mr' through the pickled builder: each move is paid the MR value collab_env's own
    view gives the same move (its futures rolled by the fixed policy in reward_kwargs: tinker-cookbook
    gives envs no sampling client, so the futures cannot be the model being trained), or the
    episode's MR return once as the group reward."""
    played = mr_replay(1, 4, MR_REPLIES)
    credits = [r for r, _ in played]
    # the first move (the right question) earns its futures' accuracy, the wrong answer none
    assert [c["accuracy_rule"] for _, c in played] == [1.0, 0.0] and credits[0] > 0.5 > credits[1], played
    b = pickle.loads(pickle.dumps(CollabEnvGroupBuilder(
        MR_ENV, index=1, seed=4, group_size=1, model_name_for_tokenizer=tiny_qwen3, renderer_name=RENDERER,
        reward_at=reward_at, env_kwargs=MR_KWARGS)))
    (env,) = asyncio.run(b.make_envs())
    _, steps = asyncio.run(play(env, MR_REPLIES[:len(credits)]))
    paid = [r.reward for _, r in steps[1:]]
    ((group, _),) = asyncio.run(b.compute_group_rewards([None], [env]))
    assert steps[-1][1].episode_done
    if reward_at == "step":
        assert paid == pytest.approx(credits, abs=1e-9) and group == 0.0
    else:
        assert paid == [0.0] * len(credits) and group == pytest.approx(sum(credits), abs=1e-9)


def test_a_reply_cut_at_the_token_limit_is_still_a_move(tiny_qwen3):
    (env,) = asyncio.run(builder(tiny_qwen3, group_size=1).make_envs())
    _, steps = asyncio.run(play(env, REPLIES[:1], stop=False))
    r = steps[1][1]
    assert not r.episode_done and r.metrics.get("truncated_reply") == 1.0
    assert r.reward == pytest.approx(turn_rewards(replay(3, 7, REPLIES), "assistant")[0], abs=1e-12)


def test_bad_options_are_one_line_errors(tiny_qwen3):
    with pytest.raises(ConfigError, match="reward_at"):
        builder(tiny_qwen3, reward_at="sometimes")
    with pytest.raises(ConfigError, match="policy spec"):
        builder(tiny_qwen3, policies={"user": CallablePolicy(lambda o: "hi")})
    with pytest.raises(ConfigError, match="player="):
        asyncio.run(builder(tiny_qwen3, player="judge").make_envs())


def _lines(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


# The JAX backend compiles its sampler for each padded prompt length (about 20 s each on a busy
# 2-core machine; a handful here): past pytest's 600 s default when the machine is loaded.
@pytest.mark.timeout(1500)
def test_cookbooks_rl_train_main_trains_on_letter_requests_with_a_checkpoint(tinker_server, tiny_qwen3, tmp_path):
    log_path = tmp_path / "run"
    dataset = CollabDatasetBuilder(env_id=ENV, model_name_for_tokenizer=tiny_qwen3, renderer_name=RENDERER,
                                   batch_size=2, group_size=2, num_batches=2, seed=11,
                                   env_kwargs={"num_turns": 2})
    config = train.Config(learning_rate=5e-2, dataset_builder=dataset, model_name=tiny_qwen3,
                          recipe_name="collab_env_test", max_tokens=8, log_path=str(log_path),
                          base_url=tinker_server, lora_rank=LORA_RANK, renderer_name=RENDERER, eval_every=0,
                          save_every=0, ttl_seconds=None)
    asyncio.run(train.main(config))
    # the final checkpoint, as the cookbook records it, with a sampler path the server knows
    checkpoints = _lines(log_path / "checkpoints.jsonl")
    assert checkpoints and checkpoints[-1]["name"] == "final" and checkpoints[-1].get("sampler_path")
    metrics = _lines(log_path / "metrics.jsonl")
    assert len(metrics) == 2
    rewards = [m[k] for m in metrics for k in m if k.startswith("env/all/reward/total")]
    assert rewards and any(r > 0 for r in rewards), metrics  # the dense reward was earned
    # the trained weights differ from the base model's: the same tokens get other log-probs
    service = tinker.ServiceClient(base_url=tinker_server)
    renderer = renderers.get_renderer(RENDERER, get_tokenizer(tiny_qwen3))
    prompt = renderer.build_generation_prompt([renderers.Message(role="user", content="About 12 characters, with r.")])
    probe = tinker.ModelInput.from_ints(prompt.to_ints() + renderer.tokenizer.encode("rrr", add_special_tokens=False))
    base = service.create_sampling_client(base_model=tiny_qwen3).compute_logprobs(probe).result()
    after = service.create_sampling_client(model_path=checkpoints[-1]["sampler_path"])
    trained = after.compute_logprobs(probe).result()
    assert len(base) == len(trained) and max(abs(a - b) for a, b in zip(base[1:], trained[1:])) > 1e-6


def test_a_user_simulator_samples_from_a_tinker_sampling_client(tinker_server, tiny_qwen3):
    service = tinker.ServiceClient(base_url=tinker_server)
    renderer = renderers.get_renderer(RENDERER, get_tokenizer(tiny_qwen3))
    sampler = service.create_sampling_client(base_model=tiny_qwen3)
    completer = TinkerMessageCompleter(sampler, renderer, max_tokens=6)
    seen = []

    async def recording(messages):
        reply = await completer(messages)
        seen.append((messages, reply["content"]))
        return reply

    user = CompleterPolicy(recording, name="tinker-user")
    env = collab_env.make(ENV, num_turns=2)
    ep = run_episode(env, {"user": user, "assistant": CallablePolicy(lambda o: "abc")}, seed=1, index=0)
    # the user's moves after its scripted opening are the texts the Tinker model sampled
    assert seen and [c.text for c in ep.completions("user")] == [text for _, text in seen]
    # the user's model saw the conversation from the user's side: its own turns are the assistant's
    assert any(m["role"] == "user" and m["content"] == "abc" for m in seen[-1][0])


os.environ.setdefault("TINKER_API_KEY", "tml-collab-env-local")

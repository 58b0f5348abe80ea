"""The collab_env verl agent loop against verl 0.9.1: a verl sample equals collab_env's own rollout.

The loop is built the way verl's AgentLoopWorker builds it (``hydra.utils.instantiate`` of the
registered entry with verl's constructor arguments) and runs against the fake server of
conftest.py, which serves the tiny model's greedy tokens. The reference is collab_env's own
rollout of the same episode (same env seed, same task item) with the HF backend on the same
model, read by ``token_transcript``.
"""

from __future__ import annotations

import asyncio

import hydra
import pytest
from omegaconf import OmegaConf
from verl.experimental.agent_loop import AgentLoopOutput
from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap

import collab_env
from collab_env.adapters.verl import AGENT_NAME, CollabEnvAgentLoop, compute_score, dataset_rows
from collab_env.agents.hf import HFPolicy
from collab_env.errors import ConfigError
from collab_env.policy import policies_for
from collab_env.rollout import arun_episode, token_transcript

MAX_NEW = 12
#: What verl's AgentLoopWorker passes to run() for validation-style greedy sampling.
GREEDY = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": False}
MR = {"reward": "mr", "reward_kwargs": {"weights": {"accuracy_rule": 1.0, "token_amount": -1e-3},
                                        "num_rollouts": 2, "max_user_turns": 2, "max_assistant_turns": 3,
                                        # the tiny model writes blank replies, which the verl rule
                                        # scores 0 without futures; the collabllm rule rolls them
                                        "aggregation": "collabllm"}}


def make_loop(server, tok, *, response_length=4096, **config):
    trainer = OmegaConf.create({"actor_rollout_ref": {"rollout": {"response_length": response_length,
                                                                  "prompt_length": 2048}}, "data": {}})
    entry = {"_target_": f"{CollabEnvAgentLoop.__module__}.{CollabEnvAgentLoop.__qualname__}", "name": AGENT_NAME,
             **config}
    return hydra.utils.instantiate(config=OmegaConf.create(entry), trainer_config=DictConfigWrap(trainer),
                                   server_manager=server, tokenizer=tok, processor=None, hf_model_type=None,
                                   dataset_cls=None, data_config=DictConfigWrap(trainer.data),
                                   tools=ToolListWrap([]))


def reference(tiny, env_id, *, seed, index, env_kwargs=None):
    """collab_env's own rollout: the HF backend plays the assistant (greedy), the spec's user the user."""
    model, tok = tiny
    env = collab_env.make(env_id, **(env_kwargs or {}))
    policy = HFPolicy(model, tok, device="cpu", temperature=0, max_new_tokens=MAX_NEW)
    table = {**policies_for(env.spec), "assistant": policy}
    ep = asyncio.run(arun_episode(env, table, seed=seed, index=index))
    return ep, token_transcript(ep, "assistant")


def run_row(loop, row):
    return asyncio.run(loop.run(dict(GREEDY), raw_prompt=row["prompt"], **row))


def test_registered_under_collab_env_and_built_by_hydra(server, tiny):
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry  # what verl looks names up in

    assert _agent_loop_registry[AGENT_NAME]["_target_"] == "collab_env.adapters.verl.loop.CollabEnvAgentLoop"
    loop = make_loop(server, tiny[1], env_id="hidden-facts", sampling={"assistant": {"max_new_tokens": MAX_NEW}})
    assert isinstance(loop, CollabEnvAgentLoop) and loop.response_length == 4096
    assert loop.loop_config == {"env_id": "hidden-facts", "sampling": {"assistant": {"max_new_tokens": MAX_NEW}}}


@pytest.mark.parametrize("seed,index", [(0, 0), (3, 2)])
def test_output_equals_collab_env_rollout_of_the_same_episode(server, tiny, seed, index):
    ep, tr = reference(tiny, "hidden-facts", seed=seed, index=index)
    assistant_turns = [t for t in ep.turns if t.player == "assistant"]
    assert len(assistant_turns) >= 2  # multi-turn: the user simulator replies in between
    [row] = dataset_rows("hidden-facts", [index], seed=seed)
    loop = make_loop(server, tiny[1], sampling={"assistant": {"max_new_tokens": MAX_NEW}})
    out = run_row(loop, row)
    assert isinstance(out, AgentLoopOutput)
    assert out.prompt_ids == tr.prompt_ids
    assert out.response_ids == tr.response_ids
    assert out.response_mask == tr.mask
    # same model, same greedy path, one row per forward pass on both sides: float32 noise at most
    assert out.response_logprobs == pytest.approx(tr.logprobs, abs=1e-5)
    assert out.reward_score == ep.returns["assistant"]
    assert out.num_turns == len(ep.conversation)
    info = out.extra_fields["collab_env"]
    assert (info["player_turns"], info["seed"], info["index"]) == (len(assistant_turns), seed, index)
    # one server call per assistant turn, the verl sampling keys forwarded, the turn limit applied
    assert len(server.calls) == len(assistant_turns)
    assert all(c["sampling_params"]["max_tokens"] == MAX_NEW and c["sampling_params"]["temperature"] == 0.0
               and c["sampling_params"]["logprobs"] is True and "seed" not in c["sampling_params"]
               for c in server.calls)
    assert len({c["request_id"] for c in server.calls}) == 1
    # the first prompt is what verl's dataset row shows: the chat template over row["prompt"]
    tok = tiny[1]
    text = tok.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
    assert out.prompt_ids == tok(text, add_special_tokens=False)["input_ids"]


def test_mask_is_one_exactly_on_the_served_tokens_and_zero_on_user_text(server, tiny):
    ep, _ = reference(tiny, "hidden-facts", seed=5, index=1)
    [row] = dataset_rows("hidden-facts", [1], seed=5)
    out = run_row(make_loop(server, tiny[1], sampling={"assistant": {"max_new_tokens": MAX_NEW}}), row)
    tok = tiny[1]
    served = [i for c in server.calls for i in c["token_ids"]]
    assert [i for i, m in zip(out.response_ids, out.response_mask, strict=True) if m == 1] == served
    assert sum(out.response_mask) == len(served) and len(server.calls) >= 2
    # each server call's prompt is the transcript so far: prompt + response up to that call
    seq = out.prompt_ids + out.response_ids
    for c in server.calls:
        assert seq[: len(c["prompt_ids"])] == c["prompt_ids"]
    # the masked runs between assistant turns are exactly the user's replies in the template's markers
    gaps, cur = [], []
    for i, m in zip(out.response_ids, out.response_mask, strict=True):
        if m == 0:
            cur.append(i)
        elif cur:
            gaps.append(tok.decode(cur, skip_special_tokens=False))
            cur = []
    msgs = list(ep.conversation)
    last_assistant = max(k for k, m in enumerate(msgs) if m.author == "assistant")
    user_replies = [m.content for m in msgs[:last_assistant] if m.author == "user"][-len(gaps):]
    assert len(gaps) == len(server.calls) - 1 and len(user_replies) == len(gaps)
    for gap, reply in zip(gaps, user_replies, strict=True):
        assert gap in (f"<|im_end|>\n<|im_start|>user\n{reply}<|im_end|>\n<|im_start|>assistant\n",
                       f"\n<|im_start|>user\n{reply}<|im_end|>\n<|im_start|>assistant\n")
    # log-probs are the server's on generated tokens and 0.0 on masked ones
    assert all(lp == 0.0 for lp, m in zip(out.response_logprobs, out.response_mask, strict=True) if m == 0)


def test_mr_wrapped_env_reward_reaches_reward_score(server, tiny):
    ep, tr = reference(tiny, "hidden-facts", seed=1, index=0, env_kwargs=MR)
    [row] = dataset_rows("hidden-facts", [0], seed=1, env_kwargs=MR)
    out = run_row(make_loop(server, tiny[1], sampling={"assistant": {"max_new_tokens": MAX_NEW}}), row)
    assert (out.response_ids, out.response_mask) == (tr.response_ids, tr.mask)
    assert out.reward_score == ep.returns["assistant"]
    info = out.extra_fields["collab_env"]
    assert info["components"] == pytest.approx(ep.components["assistant"])
    assert "token_amount" in info["components"]
    # the MR futures ran on the same server: more calls than the episode's own assistant turns
    assert len(server.calls) > info["player_turns"]
    # the env's own reward is 0 here: the return is the MR total, the sum of the metrics' contributions
    c = info["components"]
    assert c["mr"] == pytest.approx(out.reward_score, abs=1e-12)
    assert c["accuracy_rule"] + c["token_amount"] == pytest.approx(c["mr"], abs=1e-12)
    assert out.reward_score != 0.0  # the token penalty alone makes it negative
    # verl's own conversion puts it on the last response token; the custom reward function reads it back
    d = out.as_dict()
    assert float(d["rm_scores"][-1]) == pytest.approx(out.reward_score, abs=1e-6)  # float32 tensor
    assert compute_score("hidden-facts", "", "", extra_info=out.extra_fields)["score"] == out.reward_score


def test_each_moves_mr_is_its_turn_score_token_by_token(server, tiny):
    ep, tr = reference(tiny, "hidden-facts", seed=1, index=0, env_kwargs=MR)
    [row] = dataset_rows("hidden-facts", [0], seed=1, env_kwargs=MR)
    out = run_row(make_loop(server, tiny[1], sampling={"assistant": {"max_new_tokens": MAX_NEW}}), row)
    moves = [t for t in ep.turns if t.player == "assistant"]
    assert len(moves) >= 2, "a multi-turn episode"
    # each move's credit is the reward of its own step (the MR of that reply; the user's steps give 0)
    expected = [ep.rewards["assistant"][t.step] for t in moves]
    assert out.extra_fields["turn_scores"] == pytest.approx(expected, abs=1e-12)
    assert sum(out.extra_fields["turn_scores"]) == pytest.approx(out.reward_score, abs=1e-12)
    # the runs of 1s in the mask are the moves' ids, in order, and turn_ids names the move of every token
    turn_ids = out.extra_fields["collab_env"]["turn_ids"]
    assert len(turn_ids) == len(out.response_ids)
    runs, k, t = [], -1, 0
    mask = out.response_mask
    while t < len(mask):
        if mask[t] and (t == 0 or not mask[t - 1]):
            k += 1
            runs.append([])
        if mask[t]:
            runs[-1].append(out.response_ids[t])
        assert turn_ids[t] == (k if mask[t] else -1), f"token {t}"
        t += 1
    assert runs == [list(m.completion.token_ids) for m in moves]


def test_one_reply_per_sample_as_in_the_recipe(server, tiny):
    # max_player_turns=1 (examples/verl/agent_loop.yaml): the sample is the assistant's first reply,
    # scored by the MR futures; it equals the first reply of the full episode and its reward
    full, _ = reference(tiny, "hidden-facts", seed=2, index=1, env_kwargs=MR)
    [row] = dataset_rows("hidden-facts", [1], seed=2, env_kwargs=MR)
    row["collab_env"] = {**row["collab_env"], "max_player_turns": 1}
    out = run_row(make_loop(server, tiny[1], sampling={"assistant": {"max_new_tokens": MAX_NEW}}), row)
    info = out.extra_fields["collab_env"]
    assert info["player_turns"] == 1 and info["end_reason"] == "max_turns:assistant"
    first = full.completions("assistant")[0].completion
    assert out.prompt_ids == list(first.prompt_token_ids)
    assert (out.response_ids, out.response_mask) == (list(first.token_ids), [1] * len(first.token_ids))
    assert out.reward_score == full.rewards["assistant"][0]
    assert len(server.calls) > 1  # the futures ran on the server too


def test_a_response_longer_than_verl_allows_is_cut(server, tiny):
    [row] = dataset_rows("hidden-facts", [0], seed=0)
    full = run_row(make_loop(server, tiny[1], sampling={"assistant": {"max_new_tokens": MAX_NEW}}), row)
    short = run_row(make_loop(server, tiny[1], response_length=7, sampling={"assistant": {"max_new_tokens": MAX_NEW}}),
                    row)
    assert len(full.response_ids) > 7
    assert short.response_ids == full.response_ids[:7] and short.response_mask == full.response_mask[:7]
    assert short.extra_fields["collab_env"]["truncated_response"] is True
    assert full.extra_fields["collab_env"]["truncated_response"] is False


def test_bad_configuration_is_refused(server, tiny):
    loop = make_loop(server, tiny[1])
    with pytest.raises(ConfigError, match="needs env_id"):
        loop.settings({})
    with pytest.raises(ConfigError, match="unknown keys"):
        loop.settings({"collab_env": {"env_id": "hidden-facts", "sed": 1}})
    with pytest.raises(ConfigError, match="no collab_env reward"):
        compute_score("x", "", "", extra_info={})

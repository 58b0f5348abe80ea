"""SkyRL's real generator (skyrl 0.4.0, ``skyrl.train``'s ``SkyRLGymGenerator``) over the collab_env SkyRL env.

The generator is built as SkyRL's trainer builds it, from SkyRL's own default config (the typed
``SkyRLTrainConfig``), over the tiny-model engine of conftest.py. It plays dataset rows of
:func:`collab_env.adapters.skyrl.dataset` through envs made by :func:`collab_env.adapters.skyrl.register`;
the reference is collab_env's own replay of the same episode (same env seed, same task item, the
replies the engine served), read by :func:`collab_env.rollout.turn_rewards`.

The engine samples (temperature 1): the tiny model's greedy replies are blank, and blank replies
get the same MR at every move, so per-move credit could not be told from one episode scalar.
"""

from __future__ import annotations

import asyncio

import pytest
from skyrl.backends.skyrl_train.inference_servers.engine_utils import get_sampling_params_for_backend
from skyrl.train.config import SkyRLTrainConfig
from skyrl.train.generators.skyrl_gym_generator import SkyRLGymGenerator
from skyrl.train.generators.utils import prepare_generator_input

import collab_env
from collab_env.adapters.skyrl import dataset, register
from collab_env.policy import CallablePolicy, FixedTextPolicy, policies_for
from collab_env.rollout import run_episode, turn_rewards

ENV = "hidden-facts-easy"
MAX_NEW = 12
#: The multiturn-aware reward, each move scored by two short futures that a fixed policy answers;
#: the token penalty makes each move's MR depend on its own reply.
MR = {"reward": "mr", "reward_kwargs": {"policy": FixedTextPolicy("The total is \\boxed{7}."),
                                        "weights": {"accuracy_rule": 1.0, "token_amount": -1e-2},
                                        "num_rollouts": 2, "max_user_turns": 1, "max_assistant_turns": 2}}
ROWS = {"indices": [0, 2, 3], "seed": 4}


def skyrl_config(**generator):
    """SkyRL's default config (its typed ``SkyRLTrainConfig``) with ``generator`` overrides."""
    cfg = SkyRLTrainConfig()
    cfg.trainer.policy.model.path = "tiny"
    cfg.generator.max_input_length = 4096
    cfg.generator.max_turns = 10
    sp = cfg.generator.sampling_params
    sp.max_generate_length, sp.temperature, sp.logprobs = MAX_NEW, 1.0, 0
    for k, v in generator.items():
        setattr(cfg.generator, k, v)
    return cfg


def generate(engine, tok, rows, **generator):
    """``SkyRLGymGenerator.generate`` on ``rows`` as SkyRL's trainer calls it: the input built by
    ``prepare_generator_input`` from the rows as its ``PromptDataset`` gives them (the columns other
    than ``prompt`` and ``env_class`` become the env's extras), with the vLLM sampling params."""
    cfg = skyrl_config(**generator)
    gen = SkyRLGymGenerator(cfg.generator, cfg.environment.skyrl_gym, engine, tok, "tiny")
    prompts = [{"prompt": r["prompt"], "env_class": r["env_class"], "uid": str(k),
                "env_extras": {c: v for c, v in r.items() if c not in ("prompt", "env_class")}}
               for k, r in enumerate(rows)]
    sampling = get_sampling_params_for_backend("vllm", cfg.generator.sampling_params)
    batch, _ = prepare_generator_input(prompts, 1, sampling, cfg.environment.env_class, "train", 0)
    return asyncio.run(gen.generate(batch, disable_tqdm=True))


def rows_and_env():
    """The SkyRL env registered with the MR reward, and its dataset rows."""
    sid = register(ENV, **MR)
    rows = dataset(ENV, **ROWS, **MR)
    assert {r["env_class"] for r in rows} == {sid}
    return rows


def calls_of(engine, tok, row):
    """The engine's calls of ``row``'s trajectory, in order: those whose prompt starts with the row's
    templated opening (the rows' openings differ)."""
    first = tok.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=True, return_dict=False)
    calls = [c for c in engine.calls if c["prompt_ids"][:len(first)] == first]
    return first, calls


def replay(row, replies):
    """collab_env's own episode of ``row`` (same seed, same item), the assistant sending ``replies``."""
    def reply(obs):
        return replies[sum(m.role == "assistant" for m in obs)]

    env = collab_env.make(ENV, **MR)
    table = {**policies_for(env.spec), "assistant": CallablePolicy(reply)}
    ep = run_episode(env, table, seed=row["extra_info"]["seed"], index=row["extra_info"]["index"])
    assert len(ep.completions("assistant")) == len(replies)
    return ep


def between_moves(ep):
    """The assistant's view of ``ep`` split at its moves: ``[opening, gap_1, ..., gap_n]``, each a chat."""
    parts = [[]]
    for m in ep.conversation.view("assistant").to_chat():
        if m["role"] == "assistant":
            parts.append([])
        else:
            parts[-1].append(m)
    return parts


def chatml(messages, *, lead="", prompt=True):
    """The tiny model's ChatML rendering of ``messages``. SkyRL's observation tokens start with the
    newline that follows a turn's ``<|im_end|>`` (``lead="\\n"``): a reply cut at ``max_tokens``
    (no ``<|im_end|>`` generated) is followed by that newline directly."""
    body = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return lead + body + ("<|im_start|>assistant\n" if prompt else "")


def test_loss_mask_is_one_exactly_on_the_served_tokens_and_zero_on_the_env_turns(engine, tiny):
    tok = tiny[1]
    rows = rows_and_env()
    out = generate(engine, tok, rows)
    assert len(out["response_ids"]) == len(rows)
    assert len(engine.finished) == len(rows), "each trajectory's session is closed"
    for i, row in enumerate(rows):
        first, calls = calls_of(engine, tok, row)
        assert len(calls) >= 2, "a multi-turn episode"
        ep = replay(row, [c["text"] for c in calls])
        opening, *gaps = between_moves(ep)
        assert opening == row["prompt"] and out["prompt_token_ids"][i] == first
        # the response is the served ids, each followed by the env's turn (the last one's dropped)
        ids, mask, lps = out["response_ids"][i], out["loss_masks"][i], out["rollout_logprobs"][i]
        assert len(ids) == len(mask) == len(lps)
        t = 0
        for k, c in enumerate(calls):
            assert first + ids[:t] == c["prompt_ids"], f"move {k}: token in, token out"
            n = len(c["token_ids"])
            assert ids[t:t + n] == c["token_ids"] and mask[t:t + n] == [1] * n
            assert lps[t:t + n] == c["logprobs"]
            t += n
            if k == len(calls) - 1:
                break
            g = len(calls[k + 1]["prompt_ids"]) - len(first) - t
            assert g > 0 and mask[t:t + g] == [0] * g and lps[t:t + g] == [0.0] * g
            # the masked run is the other players' messages of collab_env's own episode, templated
            assert tok.decode(ids[t:t + g], skip_special_tokens=False) == chatml(gaps[k], lead="\n")
            assert gaps[k] and all(m["role"] == "user" for m in gaps[k])
            t += g
        assert t == len(ids) and sum(mask) == sum(len(c["token_ids"]) for c in calls)
    assert sum(len(calls_of(engine, tok, r)[1]) for r in rows) == len(engine.calls)


def test_each_moves_reward_is_its_turn_credit_on_its_last_token(engine, tiny):
    tok = tiny[1]
    rows = rows_and_env()
    out = generate(engine, tok, rows)
    returns = []
    for i, row in enumerate(rows):
        _, calls = calls_of(engine, tok, row)
        ep = replay(row, [c["text"] for c in calls])
        credits = turn_rewards(ep, "assistant")
        returns.append(ep.returns["assistant"])
        assert len(credits) == len(calls) >= 2
        # not one episode scalar: the moves' credits differ, and an early move's is not 0 (so a
        # return paid at the last step, or the same value at every step, cannot pass)
        assert len({round(c, 9) for c in credits}) > 1 and credits[0] != 0.0
        assert sum(credits) == pytest.approx(ep.returns["assistant"], abs=1e-12)
        # SkyRL's per-token rewards: move k's credit on the last token it generated, 0 elsewhere
        expected = [0.0] * len(out["response_ids"][i])
        ends = [len(c["prompt_ids"]) + len(c["token_ids"]) - len(out["prompt_token_ids"][i]) - 1 for c in calls]
        for end, credit in zip(ends, credits, strict=True):
            expected[end] = credit
        assert out["rewards"][i] == pytest.approx(expected, abs=1e-12)
        assert [out["loss_masks"][i][e] for e in ends] == [1] * len(ends)
    # the env's metrics reach SkyRL's rollout metrics (averaged over the batch)
    assert out["rollout_metrics"]["environment/return"] == pytest.approx(sum(returns) / len(returns), abs=1e-12)


def test_step_wise_trajectories_are_the_moves_with_their_credits(engine, tiny):
    # step_wise_trajectories: one sample per move (its prompt, its reply + the env's turn), as in
    # CollabLLM's per-turn recipe; SkyRL re-templates the chat for each move's prompt
    tok = tiny[1]
    rows = rows_and_env()[:2]
    out = generate(engine, tok, rows, step_wise_trajectories=True)
    s = 0
    for k, row in enumerate(rows):
        _, calls = calls_of(engine, tok, row)
        ep = replay(row, [c["text"] for c in calls])
        credits = turn_rewards(ep, "assistant")
        opening, *gaps = between_moves(ep)
        chat = list(opening)
        assert len(credits) == len(calls) >= 2 and len({round(c, 9) for c in credits}) > 1
        for j, (c, credit) in enumerate(zip(calls, credits, strict=True)):
            last = j == len(calls) - 1
            assert out["trajectory_ids"][s].instance_id == str(k) and out["is_last_step"][s] == last
            # the move's prompt is collab_env's view of the episode before the move, templated
            assert out["prompt_token_ids"][s] == c["prompt_ids"]
            assert tok.decode(c["prompt_ids"], skip_special_tokens=False) == chatml(chat)
            n = len(c["token_ids"])
            ids, mask = out["response_ids"][s], out["loss_masks"][s]
            assert ids[:n] == c["token_ids"] and mask == [1] * n + [0] * (len(ids) - n)
            turn = chatml(gaps[j], lead="\n", prompt=not last) if gaps[j] else ""  # the env's turn, if any
            assert tok.decode(ids[n:], skip_special_tokens=False) == turn
            assert out["rewards"][s] == pytest.approx([0.0] * (n - 1) + [credit] + [0.0] * (len(ids) - n), abs=1e-12)
            chat += [{"role": "assistant", "content": c["text"]}, *gaps[j]]
            s += 1
    assert s == len(out["response_ids"])

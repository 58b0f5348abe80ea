"""Scoring given continuations with vLLM's prompt log-probs (the log-prob judges' backend
capability), checked against a direct transformers forward pass of the same model."""

from __future__ import annotations

import asyncio

import pytest

from collab_env.agents.base import add_prefill, can_score_continuations, continuation_token_ids
from collab_env.agents.judges import LLMJudge
from collab_env.errors import ConfigError
from collab_env.types import Conversation

# One prompt opens a new assistant turn, one continues a prefilled reply whose last word the
# continuations complete (so prompt and continuation merge into other tokens at the boundary).
PLAIN = Conversation.from_chat([{"role": "user", "content": "What is the capital of France?"}], viewer="assistant")
PREFILLED = add_prefill(Conversation.from_chat([{"role": "user", "content": "Name a colour."}], viewer="assistant"),
                        "My favourite colour is bl", "assistant")
CONTINUATIONS = [["Paris", "The capital of France is Paris.", "Rome", "\n"], ["ue", "ack", "ue sky"]]


def direct(model_dir, observations, continuations):
    """The same quantity by a full forward pass of transformers on prompt + continuation."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    out = []
    for obs, conts in zip(observations, continuations, strict=True):
        from collab_env.agents.base import chat_template_mode

        text = tok.apply_chat_template(obs.to_chat(), tokenize=False, **chat_template_mode(obs))
        rows, start = continuation_token_ids(tok, text, conts)
        scores = []
        for row in rows:
            with torch.no_grad():
                lp = torch.log_softmax(model(torch.tensor([row])).logits[0].float(), dim=-1)
            scores.append(sum(float(lp[k - 1, row[k]]) for k in range(start, len(row))))
        out.append(tuple(scores))
    return out


@pytest.fixture(scope="module")
def expected(model_dir):
    return direct(model_dir, [PLAIN, PREFILLED], CONTINUATIONS)


@pytest.fixture(scope="session")
def scorer(model_dir):
    """An offline engine without LoRA (the session's ``policy`` runs LoRA, which vLLM's prompt
    log-probs do not support). Session-scoped: closing an in-process engine tears down vLLM's
    process-wide parallel state, which the session's other engines (test_server's) still use."""
    from collab_env.agents.vllm import VLLMPolicy
    from tests_vllm.conftest import ENGINE_KWARGS

    kwargs = {k: v for k, v in ENGINE_KWARGS.items() if k not in ("enable_lora", "max_lora_rank")}
    p = VLLMPolicy(str(model_dir), engine_kwargs=kwargs)
    yield p
    p.close()


# vLLM's CPU kernels and torch's reduce in other orders; in float32 one token's log-prob agrees
# to ~1e-4, and a continuation sums at most ten of them.
ATOL = 2e-3


def test_offline_engine_scores_like_a_direct_forward_pass(scorer, expected):
    policy = scorer
    assert can_score_continuations(policy)
    calls = policy.stats.engine_calls
    got = asyncio.run(policy.score_continuations([PLAIN, PREFILLED], CONTINUATIONS))
    # prefix caching is on: one row per observation first (it caches the prompt), then the rest
    assert policy.scoring_reads_cache and policy.stats.engine_calls == calls + 2
    assert [len(g) for g in got] == [4, 3]
    for g, e in zip(got, expected, strict=True):
        assert g == pytest.approx(e, abs=ATOL)
    # The prefilled prompt's last word merges with its continuations: the score still holds.
    text = policy.prompt_text(PREFILLED)
    _, start = continuation_token_ids(policy.tokenizer, text, CONTINUATIONS[1])
    assert start < len(policy.prompt_ids(PREFILLED))


def test_async_engine_scores_the_same(async_policy, expected):
    got = asyncio.run(async_policy.score_continuations([PLAIN, PREFILLED], CONTINUATIONS))
    for g, e in zip(got, expected, strict=True):
        assert g == pytest.approx(e, abs=ATOL)


# A prompt of several KV blocks (vLLM's CPU block is 128 tokens): the rows of its continuations
# share it through the prefix cache.
LONG = Conversation.from_chat([{"role": "user", "content": " ".join(
    f"Fact {i}: the {i}th box in the shed holds {i * 7 % 13} red marbles and {i * 5 % 11} blue ones."
    for i in range(24)) + " How many red marbles are in box 5?"}], viewer="assistant")
ANSWERS = ["There are 9 red marbles.", "Box 5 holds 9.", "I do not know.", "9"]


def test_rows_of_one_prompt_share_its_cached_blocks_and_score_the_same(scorer, model_dir):
    before = dict(scorer.stats.to_dict())
    got = asyncio.run(scorer.score_continuations([LONG, PLAIN], [ANSWERS, CONTINUATIONS[0]]))
    after = scorer.stats.to_dict()
    prompt = len(scorer.prompt_ids(LONG))
    assert prompt > 3 * 128
    block = (prompt - 1) // 128 * 128  # the full blocks of the prompt before its last token
    # the three rows after the first read every full block of the prompt from the cache
    assert after["scored_cached_tokens"] - before["scored_cached_tokens"] >= 3 * block
    assert after["rescored_rows"] == before["rescored_rows"]
    expected = direct(model_dir, [LONG, PLAIN], [ANSWERS, CONTINUATIONS[0]])
    for g, e in zip(got, expected, strict=True):
        assert g == pytest.approx(e, abs=ATOL)


def test_continuations_with_a_long_common_start_read_it_from_the_first_row(scorer, async_policy, model_dir):
    # The two continuations agree for more than a block: the second row finds the first row's
    # blocks past the prompt in the cache and never computes those tokens' log-probs; they are
    # the first row's (same tokens before them), and nothing is scored again.
    common = " ".join(f"Step {i}: add {i} to the running total and write it down." for i in range(20))
    conts = [common + " The total is 190.", common + " The total is 200."]
    expected = direct(model_dir, [PLAIN], [conts])
    for policy in (scorer, async_policy):
        before = policy.stats.to_dict()
        got = asyncio.run(policy.score_continuations([PLAIN], [conts]))
        after = policy.stats.to_dict()
        assert after["scored_cached_tokens"] - before["scored_cached_tokens"] >= 128
        assert after["rescored_rows"] == before["rescored_rows"]
        assert got[0] == pytest.approx(expected[0], abs=10 * ATOL)  # ~140 tokens, each to ~1e-4


def test_a_repeated_request_whose_cache_hit_covers_its_scored_span_is_scored_again(scorer, model_dir):
    conts = [" ".join(f"Line {i} of a long answer about the capital." for i in range(30))]
    expected = direct(model_dir, [PLAIN], [conts])
    first = asyncio.run(scorer.score_continuations([PLAIN], [conts]))
    rescored = scorer.stats.rescored_rows
    again = asyncio.run(scorer.score_continuations([PLAIN], [conts]))  # now cached past the prompt
    assert scorer.stats.rescored_rows == rescored + 1
    assert again[0] == pytest.approx(first[0], abs=1e-6)
    assert again[0] == pytest.approx(expected[0], abs=10 * ATOL)


def test_bad_arguments(scorer):
    with pytest.raises(ConfigError, match="one list of continuations per observation"):
        asyncio.run(scorer.score_continuations([PLAIN], []))
    with pytest.raises(ConfigError, match="non-empty"):
        asyncio.run(scorer.score_continuations([PLAIN], [[""]]))


def test_an_engine_with_lora_does_not_score_and_its_judges_generate(policy):
    assert policy.engine_kwargs["enable_lora"] and not can_score_continuations(policy)
    with pytest.raises(ConfigError, match="LoRA"):
        asyncio.run(policy.score_continuations([PLAIN], [["Paris"]]))
    assert not LLMJudge.preset("accuracy", policy).uses_logprobs
    with pytest.raises(ConfigError, match="cannot score continuations"):
        LLMJudge.preset("accuracy", policy, method="logprob")


def test_judge_uses_logprobs_on_vllm_and_agrees_with_transformers(scorer, model_dir):
    from collab_env.agents.hf import HFPolicy

    judge = LLMJudge.preset("accuracy", scorer)
    assert judge.uses_logprobs
    conv = Conversation.from_chat([{"role": "user", "content": "What is 12 + 30?"},
                                   {"role": "assistant", "content": "12 + 30 = 42."}])
    items = [dict(problem="What is 12 + 30?", conversation=conv, reference=ref) for ref in ("42", "17")]
    got = asyncio.run(judge.score_many(items))
    hf_judge = LLMJudge.preset("accuracy", HFPolicy(str(model_dir), device="cpu", dtype="float32"))
    ref = asyncio.run(hf_judge.score_many(items))
    for g, r in zip(got, ref, strict=True):
        assert g.meta["method"] == "logprob" and g.faults == 0
        p, q = g.meta["probabilities"]["score"], r.meta["probabilities"]["score"]
        assert p["true"] + p["false"] == pytest.approx(1.0)
        assert p["true"] == pytest.approx(q["true"], abs=ATOL)
        assert g.score is (p["true"] > p["false"])

"""VLLMPolicy's token-level interface (``generate_tokens``, ``pad_token_id``): what the learners'
rollout trees and the vLLM engine of a learner generate through.

The contract is that of :class:`~collab_env.agents.tokens.TokenGenerator`: row ``i`` is generated from
exactly ``prompts[i]`` (no chat template), seeded by ``seeds[i]``, and its completion holds the
prompt as given, the generated ids and their log-probs.
"""

from __future__ import annotations

import pytest

from collab_env.errors import ConfigError, PolicyError
from collab_env.policy import SamplingParams
from tests_vllm.test_engine import chats

# vLLM's CPU kernels and torch's reduce in other orders; in float32 one token's log-prob agrees
# to ~1e-4 (the same tolerance as test_engine's forward-pass check).
ATOL = 2e-3


@pytest.fixture(scope="module")
def hf_model(model_dir):
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()


def reference(model, prompt, completion, temperature=1.0):
    """Per generated token: its log-prob under ``model`` (logits / temperature) and the argmax."""
    import torch

    ids = torch.tensor([list(prompt) + list(completion)])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float() / temperature
    lp = torch.log_softmax(logits, -1)
    return lp.gather(-1, torch.tensor(list(completion))[:, None])[:, 0].tolist(), lp.argmax(-1).tolist()


def test_greedy_generate_tokens_returns_the_exact_prompt_ids_tokens_and_logprobs(policy, greedy, hf_model):
    prompts = [policy.prompt_ids(o) for o in chats()[:3]]
    # A prompt that is no chat template at all: it is used as it is, no BOS added.
    raw = list(policy.tokenizer("The capital of France is", add_special_tokens=False)["input_ids"])
    calls = policy.stats.engine_calls
    out = policy.generate_tokens([*prompts, raw], SamplingParams(temperature=0, max_new_tokens=24), [1, 2, 3, 4])
    assert policy.stats.engine_calls == calls + 1  # one engine call for the four rows
    assert [list(c.prompt_token_ids) for c in out] == [*prompts, raw]
    # From the chat templates' ids, greedy generation gives exactly what act gave for the chats.
    assert [c.token_ids for c in out[:3]] == [c.token_ids for c in greedy[:3]]
    for c in out:
        assert len(c.logprobs) == len(c.token_ids) > 0
        assert c.finish_reason in ("stop", "length")
        assert c.meta["batch_size"] == 4
        lp, argmax = reference(hf_model, c.prompt_token_ids, c.token_ids)
        assert list(c.token_ids) == argmax  # greedy: every token is the model's most likely
        assert c.logprobs == pytest.approx(lp, abs=ATOL)  # greedy: the raw model log-probs
    assert "paris" in out[3].text.lower()
    assert [c.meta["seed"] for c in out] == [1, 2, 3, 4]


def test_seeded_rows_are_independent_of_their_batch_and_logprobs_are_the_processed_ones(policy, hf_model):
    (prompt,) = [policy.prompt_ids(o) for o in chats(["Tell me a short story about a cat."])]
    (other,) = [policy.prompt_ids(o) for o in chats(["Name a fruit."])]
    params = {"temperature": 0.7, "top_p": 1.0, "top_k": None, "max_new_tokens": 10}  # a mapping works
    alone = policy.generate_tokens([prompt], params, [11])
    mixed = policy.generate_tokens([other, prompt, prompt], params, [5, 11, 12])
    assert mixed[1].token_ids == alone[0].token_ids  # row seed 11 draws the same tokens in any batch
    assert mixed[1].logprobs == pytest.approx(alone[0].logprobs, abs=1e-4)
    assert mixed[2].token_ids != mixed[1].token_ids  # another seed, another sample
    for c in (alone[0], mixed[2]):
        lp, _ = reference(hf_model, c.prompt_token_ids, c.token_ids, temperature=0.7)
        assert c.logprobs == pytest.approx(lp, abs=ATOL)


def test_pad_token_id_agrees_with_the_transformers_backend(policy, model_dir):
    from collab_env.agents.hf import HFPolicy
    from collab_env.agents.tokens import TokenGenerator

    hf = HFPolicy(str(model_dir), device="cpu", dtype="float32")
    assert isinstance(policy, TokenGenerator)
    assert policy.pad_token_id == hf.pad_token_id
    assert isinstance(policy.pad_token_id, int)


def test_generate_tokens_errors_and_clipping(policy):
    (prompt,) = [policy.prompt_ids(o) for o in chats()[:1]]
    with pytest.raises(ConfigError, match="one seed per prompt"):
        policy.generate_tokens([prompt, prompt], SamplingParams(), [1])
    with pytest.raises(ConfigError, match="empty prompt"):
        policy.generate_tokens([[]], SamplingParams(), [1])
    with pytest.raises(ConfigError, match="unknown sampling parameter"):
        policy.generate_tokens([prompt], {"temprature": 0}, [1])
    limit = policy.max_model_len
    with pytest.raises(PolicyError, match="max_model_len"):
        policy.generate_tokens([prompt * (limit // len(prompt) + 1)], SamplingParams(), [1])
    # A prompt that leaves less room than max_new_tokens is clipped to the room left.
    long = (prompt * (limit // len(prompt) + 1))[: limit - 3]
    ((ids, sp, _, seed),) = policy.token_requests([long], SamplingParams(max_new_tokens=50), [9])
    assert (len(ids), sp.max_tokens, sp.seed, seed) == (limit - 3, 3, 9, 9)
    (c,) = policy.generate_tokens([long], SamplingParams(temperature=0, max_new_tokens=50), [9])
    assert len(c.token_ids) <= 3 and c.prompt_token_ids == tuple(long)


"""VLLMPolicy (offline ``vllm.LLM``) on the embedded SmolLM2: the Completion contract."""

from __future__ import annotations

import asyncio
import json
import math

import pytest

from collab_env.errors import ConfigError, PolicyError
from collab_env.policy import SamplingParams
from collab_env.types import Conversation

QUESTIONS = [
    "What is the capital of France?",
    "Name a primary color.",
    "What do bees make?",
    "Say hello in Spanish.",
    "What is the opposite of hot?",
    "Which animal says moo?",
    "What season comes after winter?",
    "How many legs does a spider have?",
]


def chats(questions=QUESTIONS, system=None):
    out = []
    for q in questions:
        msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": q}]
        out.append(Conversation.from_chat(msgs, viewer="assistant"))
    return out


def assert_decodes_to(tok, c):
    decoded = tok.decode(list(c.token_ids), skip_special_tokens=True)
    if c.finish_reason == "length" and decoded.endswith("\ufffd"):
        decoded = decoded.rstrip("\ufffd")
    assert decoded == c.text


def act(policy, observations, **sampling):
    return asyncio.run(policy.act(observations, **sampling))


def test_batch_of_eight_chats_is_one_engine_call_with_full_completions(policy):
    calls = policy.stats.engine_calls
    out = act(policy, chats(), temperature=0, max_new_tokens=24)
    assert policy.stats.engine_calls == calls + 1
    assert len(out) == 8
    tok = policy.tokenizer
    for obs, c in zip(chats(), out, strict=True):
        assert c.finish_reason in ("stop", "length")
        assert c.meta["batch_size"] == 8
        assert 0 < len(c.token_ids) <= 24
        assert len(c.logprobs) == len(c.token_ids)
        if c.finish_reason == "length":
            assert len(c.token_ids) == 24
        else:  # ended on the EOS token, which is kept
            assert c.token_ids[-1] == tok.eos_token_id
        # The ids are the text (vLLM leaves out a character cut in half by the length limit).
        assert_decodes_to(tok, c)
        assert c.text.strip()
        # The prompt is the chat template of the observation, and says the question.
        assert list(c.prompt_token_ids) == policy.prompt_ids(obs)
        assert obs[-1].content in tok.decode(list(c.prompt_token_ids))
        assert c.usage == {"model_calls": 1 / 8, "prompt_tokens": len(c.prompt_token_ids),
                           "completion_tokens": len(c.token_ids)}
        json.dumps(c.to_dict())  # JSON-friendly, meta included


def test_greedy_is_reproducible(policy, greedy):
    again = act(policy, chats(), temperature=0, max_new_tokens=24)
    assert [c.token_ids for c in again] == [c.token_ids for c in greedy]
    for a, b in zip(again, greedy, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    # The model answers simple questions sensibly.
    assert "paris" in greedy[0].text.lower()


def test_logprobs_match_a_transformers_forward_pass(policy, model_dir, greedy):
    """The log-probs vLLM reports are those of the sampled tokens under the model."""
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()

    def reference(c, temperature=1.0):
        ids = torch.tensor([list(c.prompt_token_ids) + list(c.token_ids)])
        with torch.no_grad():
            logits = model(ids).logits[0, len(c.prompt_token_ids) - 1 : -1] / temperature
        lp = torch.log_softmax(logits, -1)
        return lp.gather(-1, torch.tensor(c.token_ids)[:, None])[:, 0].tolist(), lp.argmax(-1).tolist()

    for c in greedy[:3]:
        ref, argmax = reference(c)
        assert all(lp <= 0 and math.isfinite(lp) for lp in c.logprobs)
        assert list(c.token_ids) == argmax  # greedy: every token is the most likely one
        assert c.logprobs == pytest.approx(ref, abs=2e-3)
    # Sampled at temperature 0.7: the log-probs are under the processed (tempered) distribution.
    (c,) = act(policy, chats()[:1], temperature=0.7, max_new_tokens=12, seed=5)
    ref, _ = reference(c, temperature=0.7)
    assert c.logprobs == pytest.approx(ref, abs=2e-3)


def test_stop_strings_cut_the_text_and_end_the_completion(policy, greedy):
    base = next(c for c in greedy if len(c.text.split()) >= 4)
    stop = " " + base.text.split()[2]
    (obs,) = [o for o, c in zip(chats(), greedy, strict=True) if c is base]
    (c,) = act(policy, [obs], temperature=0, max_new_tokens=24, stop=[stop])
    assert c.finish_reason == "stop"
    assert c.meta["stop"] == stop
    assert c.text == base.text[: base.text.find(stop)]
    # The ids run up to the token that completed the stop string, and are the greedy ones.
    assert c.token_ids == base.token_ids[: len(c.token_ids)]
    decoded = policy.tokenizer.decode(list(c.token_ids), skip_special_tokens=True)
    assert decoded.startswith(c.text + stop) or (c.text + stop).startswith(decoded)
    assert stop in decoded


def test_seed_makes_sampling_reproducible_and_rows_distinct(policy):
    obs = chats(["Tell me a short story about a cat."])
    kw = dict(temperature=1.0, top_p=0.95, top_k=50, max_new_tokens=16)
    a = act(policy, obs * 4, seed=7, **kw)
    b = act(policy, obs * 4, seed=7, **kw)
    c = act(policy, obs * 4, seed=8, **kw)
    assert [x.token_ids for x in a] == [x.token_ids for x in b]
    assert len({x.token_ids for x in a}) > 1  # each row has its own seed
    assert [x.token_ids for x in a] != [x.token_ids for x in c]
    assert [x.meta["seed"] for x in a] == [x.meta["seed"] for x in b]


def test_identical_deterministic_requests_in_one_batch_are_generated_once(policy):
    obs = chats(["Name three rivers of Europe."])
    before = policy.stats.shared_requests
    out = act(policy, obs * 3, temperature=0, max_new_tokens=16)
    assert policy.stats.shared_requests == before + 2
    assert [c.meta["shared"] for c in out] == [False, True, True]
    assert len({c.token_ids for c in out}) == 1 and len(out[0].token_ids) > 0
    (alone,) = act(policy, obs, temperature=0, max_new_tokens=16)
    assert alone.token_ids == out[0].token_ids and alone.meta["shared"] is False
    # sampled rows, each with its own seed, are not shared; two calls with one seed are
    before = policy.stats.shared_requests
    rows = act(policy, obs * 3, temperature=1.0, max_new_tokens=8, seed=5)
    assert policy.stats.shared_requests == before and not any(c.meta["shared"] for c in rows)

    async def same_seed():
        return await asyncio.gather(*(policy.act(obs, temperature=1.0, max_new_tokens=8, seed=9) for _ in range(2)))

    a, b = (r[0] for r in asyncio.run(same_seed()))
    assert a.token_ids == b.token_ids
    assert policy.stats.shared_requests - before == int(a.meta["batch_size"] == 2)  # shared when batched together


def test_concurrent_act_calls_share_batches(policy, greedy):
    async def many():
        return await asyncio.gather(*(policy.act([o], temperature=0, max_new_tokens=24) for o in chats()))

    out = [r[0] for r in asyncio.run(many())]
    assert [c.token_ids for c in out] == [c.token_ids for c in greedy]
    assert max(c.meta["batch_size"] for c in out) > 1


def test_prefix_caching_is_on_and_used(policy):
    cache = policy.llm.llm_engine.vllm_config.cache_config
    assert cache.enable_prefix_caching
    system = "You are a careful assistant. " + " ".join(f"Rule {i}: answer briefly." for i in range(150))
    first = act(policy, chats(["What is two plus two?"], system=system), temperature=0, max_new_tokens=4)
    second = act(policy, chats(["What is the color of snow?"], system=system), temperature=0, max_new_tokens=4)
    assert len(first[0].prompt_token_ids) > 600
    assert second[0].meta["cached_tokens"] >= 512
    assert second[0].meta["cached_tokens"] < len(second[0].prompt_token_ids)


def test_sampling_mapping():
    from collab_env.agents.vllm_base import to_vllm_sampling

    sp = to_vllm_sampling(SamplingParams(temperature=0, top_k=None, stop=("END",), max_new_tokens=9), seed=3)
    assert (sp.temperature, sp.top_p, sp.max_tokens, sp.stop, sp.seed, sp.logprobs) == (0, 1.0, 9, ["END"], 3, 0)
    assert sp.top_k in (0, -1)
    sp = to_vllm_sampling(SamplingParams(temperature=0.5, top_p=0.9, top_k=40), seed=None, max_tokens=5)
    assert (sp.temperature, sp.top_p, sp.top_k, sp.max_tokens, sp.stop, sp.seed) == (0.5, 0.9, 40, 5, [], None)


def test_errors_say_what_to_fix(policy, model_dir):
    from collab_env.agents.vllm import VLLMPolicy

    with pytest.raises(ConfigError, match="unknown sampling parameter"):
        act(policy, chats()[:1], temprature=0)
    with pytest.raises(ConfigError, match="engine_kwargs may not set"):
        VLLMPolicy(str(model_dir), engine_kwargs={"seed": 1})
    with pytest.raises(ConfigError, match="logprobs_mode"):
        VLLMPolicy(str(model_dir), logprobs_mode="logits")
    long = chats(["word " * 3000])
    with pytest.raises(PolicyError, match="max_model_len"):
        act(policy, long, max_new_tokens=4)
    # A prompt that leaves less room than max_new_tokens is clipped, not rejected.
    ((ids, sp, _, _),) = policy._requests(chats(["word " * 2000]), {"max_new_tokens": 200})
    assert 0 < sp.max_tokens == policy.max_model_len - len(ids) < 200


def _lora_adapter(folder, model_dir, scale: float):
    """A PEFT-format LoRA adapter on q_proj/v_proj written by hand (no peft needed)."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    cfg = json.loads((model_dir / "config.json").read_text())
    hidden, heads, kv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or hidden // heads
    g = torch.Generator().manual_seed(0)
    tensors = {}
    for layer in range(cfg["num_hidden_layers"]):
        for proj, out in (("q_proj", heads * head_dim), ("v_proj", kv * head_dim)):
            key = f"base_model.model.model.layers.{layer}.self_attn.{proj}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(8, hidden, generator=g) * 0.1
            tensors[f"{key}.lora_B.weight"] = torch.randn(out, 8, generator=g) * scale
    folder.mkdir()
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 8, "lora_alpha": 16, "lora_dropout": 0.0,
        "bias": "none", "target_modules": ["q_proj", "v_proj"], "base_model_name_or_path": str(model_dir),
    }))
    return folder


def test_lora_per_call(policy, model_dir, tmp_path, greedy):
    zero = _lora_adapter(tmp_path / "zero", model_dir, 0.0)
    strong = _lora_adapter(tmp_path / "strong", model_dir, 0.5)
    obs = chats()[:2]
    base = [c.token_ids[:12] for c in greedy[:2]]
    kw = dict(temperature=0, max_new_tokens=12)
    with_zero = act(policy, obs, lora_request=str(zero), **kw)
    with_strong = act(policy, obs, lora_request=str(strong), **kw)
    without = act(policy, obs, lora_request=None, **kw)
    assert [c.token_ids for c in with_zero] == base  # a zero update changes nothing
    assert [c.token_ids for c in without] == base
    assert [c.token_ids for c in with_strong] != base
    assert with_strong[0].meta["lora"] and with_zero[0].meta["lora"] != with_strong[0].meta["lora"]

"""The lean decode loop (agents/hf_decode.py) against transformers' own forward and generate.

Random-weight Llama, Qwen2 and Mistral models with grouped KV heads (4 query heads on 2 KV heads)
and q/k/v biases where the architecture has them; the teacher-forced test recomputes every step's
logits with one unpadded forward per row, independent of ``generate``.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from collab_env.agents.hf_decode import LeanDecoder, lean_decoder, unsupported_reason  # noqa: E402
from collab_env.agents.hf_generator import HFGenerator  # noqa: E402
from collab_env.agents.hf_rows_first import rows_first_linears  # noqa: E402
from collab_env.testing.tiny_model import load_tiny_chat_model  # noqa: E402

VOCAB = 101


def random_model(kind: str, seed: int = 0, **extra):
    """A two-layer random model of ``kind`` ("llama", "qwen2", "mistral") with 4 query heads on 2
    KV heads, in eval mode."""
    torch.manual_seed(seed)
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if kind == "llama":
        config = transformers.LlamaConfig(**common, attention_bias=True, **extra)
        model = transformers.LlamaForCausalLM(config)
    elif kind == "qwen2":
        config = transformers.Qwen2Config(**common, **extra)
        model = transformers.Qwen2ForCausalLM(config)
    else:
        config = transformers.MistralConfig(**common, **extra)
        model = transformers.MistralForCausalLM(config)
    with torch.no_grad():  # larger logits than the default init, so the argmax is rarely a near tie
        model.lm_head.weight.mul_(8.0)
    return model.eval()


def left_padded(prompts, pad=0):
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    return ids, mask


PROMPTS = [[5, 17, 33, 9, 41, 8, 12], [7, 3], [50, 60, 70, 80]]


class Forced:
    """A logits processor that records the logits it is given and forces ``tokens[step]``."""

    def __init__(self, tokens):
        self.tokens, self.seen = tokens, []

    def __call__(self, ids, scores):
        step = len(self.seen)
        self.seen.append(scores.clone())
        forced = torch.full_like(scores, float("-inf"))
        return forced.scatter_(-1, self.tokens[:, step:step + 1], 0.0)


class Greedy:
    calls = 0

    def __call__(self, ids, scores):
        self.calls += 1
        return scores


@pytest.mark.parametrize("rows_first", [False, True], ids=["modules", "rows-first"])
@pytest.mark.parametrize("kind", ["llama", "qwen2", "mistral"])
def test_every_step_gives_the_logits_of_an_unpadded_forward_pass(kind, rows_first):
    """With ``rows_first_linears`` active (every layer, whatever its size), the decode steps take
    the projections' rows-first products directly instead of calling the modules."""
    model = random_model(kind)
    assert unsupported_reason(model) is None
    ids, mask = left_padded(PROMPTS)
    steps = 6
    forced = torch.randint(3, VOCAB, (len(PROMPTS), steps), generator=torch.Generator().manual_seed(1))
    proc = Forced(forced)
    patched = rows_first_linears(model, min_elements=0) if rows_first else contextlib.nullcontext(0)
    with torch.inference_mode(), patched as n_patched:
        assert (n_patched > 0) == rows_first
        lean = lean_decoder(model)
        q_proj = model.model.layers[0].self_attn.q_proj
        assert (lean._layers(len(PROMPTS))[0][1] is not q_proj) == rows_first  # the product, not the module
        assert lean._layers(9)[0][1] is q_proj  # more rows than rows-first takes: the module
        new = lean.generate(ids, mask, logits_processor=proc, eos_token_ids=[2], pad_token_id=0, max_new_tokens=steps)
        assert torch.equal(new, forced)
        for i, prompt in enumerate(PROMPTS):
            full = torch.tensor([prompt + forced[i].tolist()])
            expect = model(full).logits[0, len(prompt) - 1:len(prompt) - 1 + steps].float()
            got = torch.stack([s[i] for s in proc.seen])
            assert torch.allclose(got, expect, atol=1e-5, rtol=1e-5), (kind, i, (got - expect).abs().max())


@pytest.mark.parametrize("kind", ["llama", "qwen2", "mistral"])
def test_greedy_tokens_match_generate_with_padding_and_early_eos(kind):
    model = random_model(kind, seed=3)
    ids, mask = left_padded(PROMPTS)
    with torch.inference_mode():
        ref = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False,
                             eos_token_id=[2, 9], pad_token_id=0)[:, ids.shape[1]:]
        got = lean_decoder(model).generate(ids, mask, logits_processor=Greedy(), eos_token_ids=[2, 9],
                                           pad_token_id=0, max_new_tokens=12)
    assert torch.equal(got, ref)


def test_rows_that_end_get_the_pad_token_and_the_loop_stops_when_all_have_ended():
    model = random_model("llama", seed=5)
    ids, mask = left_padded(PROMPTS)
    # row 0 ends at step 1, row 1 at step 3, row 2 at step 2 (token 2 is the EOS)
    plan = torch.tensor([[4, 2, 6, 6, 6, 6], [4, 5, 6, 2, 6, 6], [4, 5, 2, 6, 6, 6]])
    proc = Forced(plan)
    with torch.inference_mode():
        new = lean_decoder(model).generate(ids, mask, logits_processor=proc, eos_token_ids=[2], pad_token_id=0,
                                           max_new_tokens=6)
    assert new.tolist() == [[4, 2, 0, 0], [4, 5, 6, 2], [4, 5, 2, 0]]
    assert len(proc.seen) == 4  # no step after every row has ended


def test_a_stopping_criterion_sees_the_ids_so_far_and_ends_its_row():
    model = random_model("qwen2", seed=2)
    ids, mask = left_padded(PROMPTS)
    seen = []

    def stop_row_1_after_two(all_ids, scores):
        seen.append(all_ids.shape[1])
        done = torch.zeros(all_ids.shape[0], dtype=torch.bool)
        done[1] = all_ids.shape[1] - ids.shape[1] >= 2
        return done

    plan = torch.full((3, 5), 4)
    with torch.inference_mode():
        new = lean_decoder(model).generate(ids, mask, logits_processor=Forced(plan),
                                           stopping_criteria=[stop_row_1_after_two], eos_token_ids=[2],
                                           pad_token_id=0, max_new_tokens=5)
    assert seen == [ids.shape[1] + k for k in range(1, 6)]
    assert new[1].tolist() == [4, 4, 0, 0, 0] and new[0].tolist() == [4] * 5


def test_other_architectures_and_layouts_are_refused_with_a_reason(monkeypatch):
    llama = random_model("llama")
    wrapped = SimpleNamespace(config=llama.config, model=SimpleNamespace(model=llama.model), lm_head=llama.lm_head)
    assert "wrapped" in unsupported_reason(wrapped)  # e.g. a PEFT wrapper: generate serves it
    sliding = random_model("qwen2", use_sliding_window=True, sliding_window=4, max_window_layers=0)
    assert unsupported_reason(sliding) is not None and lean_decoder(sliding) is None
    gemma = random_model("llama")
    gemma.config.model_type = "gemma"
    assert "model_type" in unsupported_reason(gemma)
    fused = random_model("llama")
    fused.model.layers[1].mlp.gate_up_proj = fused.model.layers[1].mlp.gate_proj  # another MLP layout
    del fused.model.layers[1].mlp.gate_proj
    assert "layer 1's MLP" in unsupported_reason(fused)
    old = random_model("llama")
    monkeypatch.setattr("transformers.__version__", "4.55.2")  # the module now in sys.modules
    assert "4.56" in unsupported_reason(old)
    monkeypatch.undo()
    mistral = random_model("mistral", sliding_window=16)
    lean = lean_decoder(mistral)
    assert isinstance(lean, LeanDecoder) and lean.fits(16) and not lean.fits(17)
    dropout = lean_decoder(random_model("llama", attention_dropout=0.1))
    assert dropout.fits(100)  # eval mode: no dropout
    dropout.model.train()
    assert not dropout.fits(100)  # generate would drop attention weights: it decodes


@pytest.fixture
def tiny_generator(tiny_dir):
    model, tok = load_tiny_chat_model(tiny_dir)
    return HFGenerator(model, tok)


def test_the_generator_gives_the_same_completions_with_and_without_the_lean_loop(tiny_generator):
    """Shared prompts (one prefill for a group), a long shared prefix (padding in the middle of
    the rows), stop strings, EOS, greedy and seeded sampling: the same tokens and log-probs as
    ``model.generate``, which is never called on the lean path."""
    gen = tiny_generator
    tok = gen.tokenizer
    prefix = tok("a shared conversation that every row starts with, long enough to be read once")["input_ids"]
    texts = ["why", "a much longer question about the weather", "mid"]
    prompts = [prefix + tok(t)["input_ids"] for t in texts] * 2 + [tok("alone")["input_ids"]] * 3
    assert len(prefix) >= gen.min_shared_prefix
    real = gen.model.generate

    def refuse(*a, **k):
        raise AssertionError("model.generate called on the lean path")

    cases = [dict(temperature=0.0, max_new_tokens=10), dict(temperature=1.0, max_new_tokens=10),
             dict(temperature=0.8, top_k=30, top_p=0.9, max_new_tokens=10, stop=["e"])]
    for params in cases:
        seeds = list(range(len(prompts)))
        gen.lean_decode = True
        gen.model.generate = refuse
        lean = gen.generate_tokens(prompts, params, seeds)
        gen.lean_decode = False
        gen.model.generate = real
        ref = gen.generate_tokens(prompts, params, seeds)
        for a, b in zip(lean, ref, strict=True):
            assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason and a.text == b.text
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    assert any(c.finish_reason == "stop" for c in lean)  # the stop string really ended some rows


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_under_bfloat16_autocast_the_steps_follow_the_forward_pass(kind):
    """Generation inside a caller's CPU autocast to bfloat16 (thread-local, so the steps' module
    calls run under it too; the rotated keys come out float32, the values bfloat16): every step's
    logits stay within bfloat16 rounding of one unpadded forward pass under the same autocast."""
    model = random_model(kind, seed=4)
    ids, mask = left_padded(PROMPTS)
    steps = 5
    forced = torch.randint(3, VOCAB, (len(PROMPTS), steps), generator=torch.Generator().manual_seed(2))
    proc = Forced(forced)
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        new = lean_decoder(model).generate(ids, mask, logits_processor=proc, eos_token_ids=[2], pad_token_id=0,
                                           max_new_tokens=steps)
        assert torch.equal(new, forced)
        for i, prompt in enumerate(PROMPTS):
            full = torch.tensor([prompt + forced[i].tolist()])
            expect = model(full).logits[0, len(prompt) - 1:len(prompt) - 1 + steps].float()
            got = torch.stack([s[i] for s in proc.seen])
            scale = float(expect.abs().max())
            assert float((got - expect).abs().max()) <= 0.05 * scale, (kind, i, (got - expect).abs().max(), scale)


def test_a_wrapped_forward_or_a_hook_the_steps_would_skip_sends_the_call_to_generate():
    """The steps call the layers' parts, not the model's, decoder's or layers' forward: anything
    attached there (accelerate's mixed precision wraps ``model.forward`` in an autocast; a hook
    that captures or steers a layer) must run, so such a call goes to ``generate``."""
    model = random_model("llama", seed=6)
    lean = lean_decoder(model)
    assert lean.bypassed() == [] and lean.fits(50)
    real = model.forward
    model.forward = lambda *a, **k: real(*a, **k)  # what accelerate's autocast wrapper does
    assert lean.bypassed() == ["model"] and not lean.fits(50)
    del model.forward
    handle = model.model.layers[1].register_forward_hook(lambda m, args, out: out)
    assert lean.bypassed() == ["layers.1"] and not lean.fits(50)
    handle.remove()
    handle = model.model.layers[0].mlp.register_forward_pre_hook(lambda m, args: None)
    assert lean.bypassed() == ["layers.0.mlp"]
    handle.remove()
    handle = torch.nn.modules.module.register_module_forward_hook(lambda m, args, out: out)
    try:
        assert lean.bypassed() == ["(global forward hooks)"]
    finally:
        handle.remove()
    assert lean.fits(50)


def test_the_generator_decodes_with_generate_when_a_hook_is_attached(tiny_generator):
    gen = tiny_generator
    tok = gen.tokenizer
    prompts = [tok("why")["input_ids"], tok("a longer question")["input_ids"]]
    seen = []
    handle = gen.model.model.layers[0].register_forward_hook(lambda m, args, out: seen.append(1))
    calls = []
    real = gen.model.generate
    gen.model.generate = lambda *a, **k: calls.append(1) or real(*a, **k)
    try:
        out = gen.generate_tokens(prompts, {"temperature": 0.0, "max_new_tokens": 4}, [0, 1])
    finally:
        handle.remove()
    assert calls == [1] and len(seen) >= 4  # generate decoded, and the hook saw every step
    gen.model.generate = lambda *a, **k: (_ for _ in ()).throw(AssertionError("generate called"))
    again = gen.generate_tokens(prompts, {"temperature": 0.0, "max_new_tokens": 4}, [0, 1])  # hook gone: lean
    assert [c.token_ids for c in again] == [c.token_ids for c in out]

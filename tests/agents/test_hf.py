"""HFPolicy on a tiny local model: batching queue, exact ids, log-probs, stops, seeds, adapters.

All offline and CPU-only; the tiny model (collab_env/testing/tiny_model.py) has random weights, so the tests
check the plumbing against recomputations, never the quality of the text.
"""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
import threading
import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from collab_env._async import run_sync  # noqa: E402
from collab_env.agents.hf import HFPolicy  # noqa: E402
from collab_env.errors import ConfigError, MissingDependencyError, PolicyError  # noqa: E402
from collab_env.testing.tiny_model import build_tiny_chat_model, load_tiny_chat_model  # noqa: E402
from collab_env.types import Conversation  # noqa: E402
from tests._decode_calls import count_decodes, on_decode  # noqa: E402


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_chat_model(tmp_path_factory.mktemp("tiny"))


@pytest.fixture
def tiny(tiny_dir):
    """A fresh (model, tokenizer) per test: some tests wrap or edit the model."""
    return load_tiny_chat_model(tiny_dir)


def chat(text: str, system: str | None = None) -> Conversation:
    msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
    return Conversation.from_chat(msgs)


def template_ids(tok, obs: Conversation) -> list[int]:
    """The prompt encoding computed independently of HFPolicy."""
    text = tok.apply_chat_template(obs.to_chat(), tokenize=False, add_generation_prompt=True)
    return tok(text, add_special_tokens=False)["input_ids"]


def recompute_logprobs(model, prompt, ids, temperature=1.0, top_k=None):
    """Log-probs of ``ids`` after ``prompt`` from one unpadded forward pass."""
    full = torch.tensor([list(prompt) + list(ids)])
    with torch.no_grad():
        logits = model(full).logits[0, len(prompt) - 1 : len(prompt) - 1 + len(ids)].float()
    if temperature and temperature != 1.0:
        logits = logits / temperature
    if top_k is not None:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids)[:, None])[:, 0].tolist()


# -- batching -------------------------------------------------------------------------------


def test_64_concurrent_calls_make_at_most_4_generate_calls_and_reach_their_callers(tiny, monkeypatch):
    model, tok = tiny
    sizes = count_decodes(monkeypatch, model)
    policy = HFPolicy(model, tok, max_batch_size=16, max_new_tokens=8, temperature=0)
    # Distinct prompts of different lengths, so a mix-up would show in prompt_token_ids.
    observations = [chat(f"question {i}: " + "why " * (i % 7)) for i in range(64)]

    async def main():
        return await asyncio.gather(*(policy.act([o]) for o in observations))

    start = time.perf_counter()
    results = asyncio.run(main())
    elapsed = time.perf_counter() - start
    assert len(sizes) <= math.ceil(64 / 16) and sum(sizes) == 64
    assert policy.stats.generate_calls == len(sizes)
    assert policy.stats.batched_requests == 64 and policy.stats.largest_batch == 16
    for obs, out in zip(observations, results, strict=True):
        assert len(out) == 1
        assert list(out[0].prompt_token_ids) == template_ids(tok, obs)
        assert out[0].usage["prompt_tokens"] == len(out[0].prompt_token_ids)
    # each generate call's completions share one model call
    assert sum(r[0].usage["model_calls"] for r in results) == pytest.approx(len(sizes))
    print(f"64 concurrent acts: {len(sizes)} generate calls, {elapsed:.2f}s")


def test_requests_with_different_sampling_are_batched_separately(tiny, monkeypatch):
    model, tok = tiny
    sizes = count_decodes(monkeypatch, model)
    policy = HFPolicy(model, tok, max_batch_size=16, max_new_tokens=4)

    async def main():
        greedy = [policy.act([chat(f"g{i}")], temperature=0) for i in range(5)]
        hot = [policy.act([chat(f"h{i}")], temperature=1.0, seed=i) for i in range(3)]
        return await asyncio.gather(*greedy, *hot)

    asyncio.run(main())
    assert sorted(sizes) == [3, 5]


def test_max_wait_bounds_how_long_a_batch_waits(tiny, monkeypatch):
    model, tok = tiny
    sizes = count_decodes(monkeypatch, model)

    async def two_calls(policy, gap):
        first = asyncio.ensure_future(policy.act([chat("first")]))
        await asyncio.sleep(gap)
        second = asyncio.ensure_future(policy.act([chat("second")]))
        await asyncio.gather(first, second)

    # The second call arrives inside the first one's wait window: one batch.
    asyncio.run(two_calls(HFPolicy(model, tok, max_wait_ms=1000, max_new_tokens=4, temperature=0), 0.02))
    assert sizes == [2]
    sizes.clear()
    # With no wait the first call is flushed alone.
    asyncio.run(two_calls(HFPolicy(model, tok, max_wait_ms=0, max_new_tokens=4, temperature=0), 0.2))
    assert sizes == [1, 1]


def test_event_loop_stays_responsive_during_generate(tiny, monkeypatch):
    model, tok = tiny
    on_decode(monkeypatch, model, lambda rows: time.sleep(0.5))  # stands in for a long generation
    policy = HFPolicy(model, tok, max_new_tokens=4, temperature=0)
    ticks = 0

    async def ticker(stop: asyncio.Event):
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            await asyncio.sleep(0.01)

    async def main():
        stop = asyncio.Event()
        t = asyncio.ensure_future(ticker(stop))
        await policy.act([chat("hi")])
        stop.set()
        await t

    asyncio.run(main())
    assert ticks >= 10  # ~50 while generate sleeps in its thread; 1 if it blocked the loop


def test_queue_follows_the_event_loop_across_sync_calls(tiny):
    model, tok = tiny
    policy = HFPolicy(model, tok, max_new_tokens=4, temperature=0)
    a = asyncio.run(policy.act([chat("same")]))[0]
    b = asyncio.run(policy.act([chat("same")]))[0]  # a new loop: a new queue and worker
    c = run_sync(policy.act([chat("same")]))[0]  # the thread's reusable loop

    out = {}

    def in_thread():  # another thread, another loop, same model
        out["d"] = asyncio.run(policy.act([chat("same")]))[0]

    th = threading.Thread(target=in_thread)
    th.start()
    th.join()
    assert a.token_ids == b.token_ids == c.token_ids == out["d"].token_ids
    assert policy.stats.generate_calls == 4


def test_generate_failure_fails_the_batch_with_policy_error_and_policy_recovers(tiny, monkeypatch):
    model, tok = tiny
    calls = {"n": 0}

    def flaky(rows):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("CUDA out of memory (simulated)")

    on_decode(monkeypatch, model, flaky)
    policy = HFPolicy(model, tok, max_new_tokens=4, temperature=0)

    async def main():
        return await asyncio.gather(*(policy.act([chat(f"q{i}")]) for i in range(3)), return_exceptions=True)

    results = asyncio.run(main())
    assert all(isinstance(r, PolicyError) for r in results)
    assert "out of memory" in str(results[0])
    assert policy.stats.failed_calls == 1
    ok = asyncio.run(policy.act([chat("again")]))[0]
    assert ok.token_ids and ok.text == tok.decode(ok.token_ids, skip_special_tokens=True)


# -- what a completion holds ----------------------------------------------------------------


def test_left_padding_gives_each_prompt_its_solo_greedy_output(tiny):
    model, tok = tiny
    policy = HFPolicy(model, tok, max_new_tokens=12, temperature=0)
    observations = [chat("a"), chat("a much longer question " * 6), chat("mid length one", system="Be brief.")]
    together = asyncio.run(policy.act(observations))
    assert policy.stats.generate_calls == 1
    lengths = {len(c.prompt_token_ids) for c in together}
    assert len(lengths) == 3  # really different lengths, so really padded
    for obs, batched in zip(observations, together, strict=True):
        alone = asyncio.run(policy.act([obs]))[0]
        # Exact greedy ids: on these paths the top two logits are >= 0.13 apart (measured), far
        # above the float32 differences between a padded batch and a single row on any CPU.
        assert alone.token_ids == batched.token_ids
        assert alone.logprobs == pytest.approx(batched.logprobs, abs=1e-4)


@pytest.mark.parametrize("sampling", [
    {"temperature": 0},
    {"temperature": 1.0, "seed": 1},
    {"temperature": 0.7, "seed": 2},
    {"temperature": 0.8, "top_k": 5, "seed": 3},
])
def test_logprobs_match_a_forward_pass_over_prompt_and_completion(tiny, sampling):
    model, tok = tiny
    policy = HFPolicy(model, tok, max_new_tokens=16)
    observations = [chat("short"), chat("a somewhat longer prompt " * 4)]
    for c in asyncio.run(policy.act(observations, **sampling)):
        # processed distribution: temperature and top-k applied (greedy: raw model)
        expected = recompute_logprobs(model, c.prompt_token_ids, c.token_ids,
                                      temperature=sampling["temperature"], top_k=sampling.get("top_k"))
        assert len(c.logprobs) == len(c.token_ids) >= 1
        assert list(c.logprobs) == pytest.approx(expected, abs=1e-4)
        assert all(lp <= 0 and math.isfinite(lp) for lp in c.logprobs)


def test_ids_decode_to_text_and_eos_ends_the_completion(tiny):
    model, tok = tiny
    eos = tok.eos_token_id
    with torch.no_grad():  # make EOS likely, so some rows stop early and others run on
        model.model.embed_tokens.weight[eos] *= 12
    policy = HFPolicy(model, tok, max_new_tokens=24, temperature=1.0)
    outs = asyncio.run(policy.act([chat(f"row {i}") for i in range(16)], seed=0))
    reasons = {c.finish_reason for c in outs}
    assert reasons == {"stop", "length"}, reasons
    for c in outs:
        assert c.text == tok.decode(c.token_ids, skip_special_tokens=True)
        assert len(c.token_ids) == len(c.logprobs) == c.usage["completion_tokens"]
        if c.finish_reason == "stop":
            assert c.token_ids[-1] == eos and eos not in c.token_ids[:-1]
        else:
            assert len(c.token_ids) == 24 and eos not in c.token_ids
        expected = recompute_logprobs(model, c.prompt_token_ids, c.token_ids)
        assert list(c.logprobs) == pytest.approx(expected, abs=1e-4)


def test_stop_strings_cut_text_ids_and_logprobs_at_the_same_place(tiny):
    model, tok = tiny
    policy = HFPolicy(model, tok, max_new_tokens=32, temperature=1.0)
    obs = chat("tell me something")
    full = asyncio.run(policy.act([obs], seed=7))[0]
    assert len(full.text) > 12
    stop = full.text[8:11]
    cut_at = full.text.find(stop)
    out = asyncio.run(policy.act([obs], seed=7, stop=[stop, "never-generated-xyz"]))[0]
    assert out.finish_reason == "stop" and out.meta["stop"] == stop
    assert out.text == full.text[:cut_at] and stop not in out.text
    n = len(out.token_ids)
    # the ids run up to the token that completed the stop string, as vLLM reports them
    assert out.token_ids == full.token_ids[:n]
    assert out.logprobs == full.logprobs[:n]
    assert tok.decode(out.token_ids, skip_special_tokens=True).startswith(out.text + stop)
    assert stop not in tok.decode(out.token_ids[:-1], skip_special_tokens=True)
    assert n < len(full.token_ids)  # generation really stopped early


def test_seeded_sampling_is_reproducible_and_independent_of_batch_mates(tiny):
    model, tok = tiny
    policy = HFPolicy(model, tok, max_new_tokens=16, temperature=1.0)
    obs = chat("sample me")
    a = asyncio.run(policy.act([obs], seed=11))[0]
    b = asyncio.run(policy.act([obs], seed=11))[0]
    assert a.token_ids == b.token_ids and a.logprobs == b.logprobs

    async def crowded():  # same request, now sharing a batch with others
        outs = await asyncio.gather(policy.act([obs], seed=11), *(policy.act([chat(f"other {i} " * i)], seed=i)
                                                                  for i in range(5)))
        return outs[0][0]

    crowded_same = asyncio.run(crowded())
    assert crowded_same.meta["batch_size"] == 6 and crowded_same.token_ids == a.token_ids
    c = asyncio.run(policy.act([obs], seed=12))[0]
    assert c.token_ids != a.token_ids
    # several samples of one observation in one call differ, and the first is the seeded one
    many = asyncio.run(policy.act([obs] * 4, seed=11))
    assert many[0].token_ids == a.token_ids
    assert len({m.token_ids for m in many}) == 4


def test_greedy_is_deterministic(tiny):
    model, tok = tiny
    policy = HFPolicy(model, tok, max_new_tokens=16, temperature=0)
    a = asyncio.run(policy.act([chat("x")], seed=1))[0]
    b = asyncio.run(policy.act([chat("x")], seed=1))[0]
    c = asyncio.run(policy.act([chat("x")], seed=2))[0]
    assert a.token_ids == b.token_ids == c.token_ids


def test_the_models_own_generation_defaults_do_not_leak_in(tiny):
    model, tok = tiny
    policy = HFPolicy(model, tok, max_new_tokens=12)
    obs = [chat("hello there")]
    before = [asyncio.run(policy.act(obs, temperature=t, seed=1))[0] for t in (0, 1.0)]
    gc = model.generation_config  # what a hub checkpoint often ships
    gc.do_sample, gc.temperature, gc.top_p, gc.top_k = True, 0.6, 0.9, 20
    gc.repetition_penalty, gc.no_repeat_ngram_size = 1.3, 2
    after = [asyncio.run(policy.act(obs, temperature=t, seed=1))[0] for t in (0, 1.0)]
    for b, a in zip(before, after, strict=True):
        assert a.token_ids == b.token_ids and a.logprobs == b.logprobs


def test_system_prompt_is_added_only_when_missing(tiny):
    model, tok = tiny
    policy = HFPolicy(model, tok, system_prompt="You are terse.", max_new_tokens=2)
    plain, with_own = chat("hi"), chat("hi", system="Mine.")
    assert policy.prompt_ids(plain) == template_ids(tok, chat("hi", system="You are terse."))
    assert policy.prompt_ids(with_own) == template_ids(tok, with_own)


# -- configuration and loading ------------------------------------------------------------


def test_loads_from_a_folder_and_validates_arguments(tiny_dir, tiny):
    _, tok = tiny
    policy = HFPolicy(str(tiny_dir), tok, device="cpu", dtype="float32", max_new_tokens=3, temperature=0)
    assert policy.name == f"hf:{tiny_dir.name}"
    assert len(asyncio.run(policy.act([chat("hi")]))[0].token_ids) == 3
    with pytest.raises(ConfigError, match="device must be one of"):
        HFPolicy(str(tiny_dir), tok, device="tpu")
    with pytest.raises(ConfigError, match="dtype must be one of"):
        HFPolicy(str(tiny_dir), tok, dtype="int8")
    with pytest.raises(ConfigError, match="unknown sampling parameter"):
        HFPolicy(str(tiny_dir), tok, temprature=0.5)
    with pytest.raises(ConfigError, match="unknown sampling parameter"):
        asyncio.run(policy.act([chat("hi")], max_tokens=3))
    with pytest.raises(ConfigError, match="no model folder at"):
        HFPolicy(str(tiny_dir / "missing"), tok)
    import tempfile

    with tempfile.TemporaryDirectory() as empty, pytest.raises(ConfigError, match="could not load"):
        HFPolicy(empty, tok)  # a folder, but no model in it


def test_lora_adapter_from_a_folder(tiny_dir, tiny, tmp_path):
    peft = pytest.importorskip("peft")
    model, tok = tiny
    lora = peft.get_peft_model(
        model, peft.LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    )
    lora.save_pretrained(tmp_path / "adapter")

    base = HFPolicy(str(tiny_dir), tok, max_new_tokens=12, temperature=0)
    adapted = HFPolicy(str(tiny_dir), tok, adapter=tmp_path / "adapter", max_new_tokens=12, temperature=0)
    assert isinstance(adapted.model, peft.PeftModel)
    obs = [chat("adapter check"), chat("another one")]
    with_lora = asyncio.run(adapted.act(obs))
    without = asyncio.run(base.act(obs))
    assert all(len(c.token_ids) == 12 for c in with_lora)
    assert [c.logprobs for c in with_lora] != [c.logprobs for c in without]  # the adapter is applied
    # the same adapter passed as a loaded PeftModel gives the same completions
    via_object = asyncio.run(HFPolicy(str(tiny_dir), tok, adapter=lora, max_new_tokens=12, temperature=0).act(obs))
    assert [c.token_ids for c in via_object] == [c.token_ids for c in with_lora]
    for c in with_lora:  # log-probs are those of the adapted model
        assert list(c.logprobs) == pytest.approx(recompute_logprobs(adapted.model, c.prompt_token_ids, c.token_ids),
                                                 abs=1e-4)


def test_missing_peft_names_the_extra(tiny, monkeypatch, tmp_path):
    model, tok = tiny
    monkeypatch.setitem(sys.modules, "peft", None)  # makes `import peft` fail
    with pytest.raises(MissingDependencyError, match=r"collab_env\[hf\]"):
        HFPolicy(model, tok, adapter=tmp_path)


def test_importing_the_backends_does_not_import_torch():
    code = ("import sys, collab_env.agents.hf, collab_env.agents.embedded; "
            "print(','.join(m for m in ('torch', 'transformers', 'peft') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_the_split_backends_export_their_own_names_and_import_light():
    """hf.py and vllm.py are split by job; hf.py exports only what it defines (the token-level
    names are imported from collab_env.agents.tokens), and importing the vLLM backend does not
    import vllm or torch."""
    from collab_env.agents import hf, hf_generator

    assert hf.__all__ == ["HFPolicy"]
    assert issubclass(hf.HFPolicy, hf_generator.HFGenerator)
    for name in hf.__all__:
        assert getattr(hf, name) is not None
    code = ("import sys; from collab_env.agents.vllm import VLLMPolicy; "
            "from collab_env.agents.vllm_async import AsyncVLLMPolicy; "
            "from collab_env.agents.vllm_base import VLLMStats, to_vllm_sampling; "
            "print(','.join(m for m in ('torch', 'transformers', 'vllm') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_a_seeded_act_gives_each_row_the_shared_row_seed(tiny):
    """Observation i of act(..., seed=s) is sampled with tokens.row_seed(s, i), the seed the vLLM
    backend gives it too: generate_tokens with those seeds draws the same tokens."""
    from collab_env.agents.tokens import row_seed

    model, tok = tiny
    policy = HFPolicy(model, tok, device="cpu", max_batch_size=4)
    obs = [chat("seeds"), chat("seeds"), chat("other")]
    got = run_sync(policy.act(obs, seed=17, temperature=1.0, max_new_tokens=5))
    assert [c.meta["seed"] for c in got] == [row_seed(17, i) for i in range(3)]
    assert len({row_seed(17, i) for i in range(3)}) == 3 and all(0 <= row_seed(17, i) < 2**63 for i in range(3))
    again = policy.generate_tokens([list(c.prompt_token_ids) for c in got], {"temperature": 1.0, "max_new_tokens": 5},
                                   [row_seed(17, i) for i in range(3)])
    assert [c.token_ids for c in again] == [c.token_ids for c in got]


def test_a_prefilled_reply_is_continued_not_reopened(tiny):
    from collab_env.types import Message

    model, tok = tiny
    policy = HFPolicy(model, tok)
    obs = chat("hello").append(Message(role="assistant", content='{"score":', author="me", meta={"prefill": True}))
    ids = policy.prompt_ids(obs)
    text = tok.decode(ids)
    assert text.endswith('<|im_start|>assistant\n{"score":')  # no end-of-turn, no new turn
    plain = policy.prompt_ids(chat("hello"))
    assert tok.decode(plain).endswith("<|im_start|>assistant\n")


# ---------------------------------------------------------------------------------------------
# Scoring given continuations (the log-prob judges' capability)
# ---------------------------------------------------------------------------------------------
def by_hand(model, tok, prompt_text: str, continuations, start: int) -> list[float]:
    """Sum of log p(token | prefix) over the tokens of prompt + continuation from ``start``,
    each from one plain forward pass over the whole sequence (no cache, no batch)."""
    out = []
    for c in continuations:
        row = tok(prompt_text + c, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([row])).logits[0].float(), dim=-1)
        out.append(sum(float(logp[k - 1, row[k]]) for k in range(start, len(row))))
    return out


# float32, a KV-cached batched pass vs one plain pass: each log-prob agrees to ~1e-6 (other
# reduction orders), and a continuation sums at most ~30 of them.
SCORE_ATOL = 1e-4


def test_score_continuations_equals_a_direct_forward_pass(tiny):
    from collab_env.agents.base import add_prefill, can_score_continuations

    model, tok = tiny
    policy = HFPolicy(model, tok, device="cpu")
    assert can_score_continuations(policy)
    plain = chat("The capital of France?")
    # A prefilled reply that stops mid-word: its continuations merge with it into other tokens.
    pre = add_prefill(chat("The capital of France?"), "The capi", "assistant")
    conts = [["Paris", " Rome", "\n", "tal of France is Paris."], ["tal", "pe", " x"]]
    calls = []
    real = model.forward
    model.forward = lambda *a, **kw: calls.append(kw["input_ids"].shape) or real(*a, **kw)
    got = run_sync(policy.score_continuations([plain, pre], conts))
    # Per prompt: one pass over the prompt, one batched pass over all its continuations.
    assert len(calls) == 4 and calls[1][0] == 4 and calls[3][0] == 3
    assert policy.stats.scoring_calls == 1 and policy.stats.scored_continuations == 7
    model.forward = real

    plain_text = tok.apply_chat_template(plain.to_chat(), tokenize=False, add_generation_prompt=True)
    plain_len = len(tok(plain_text, add_special_tokens=False)["input_ids"])
    assert got[0] == pytest.approx(by_hand(model, tok, plain_text, conts[0], plain_len), abs=SCORE_ATOL)

    pre_text = tok.apply_chat_template(pre.to_chat(), tokenize=False, continue_final_message=True)
    assert pre_text.endswith("The capi")
    pre_ids = tok(pre_text, add_special_tokens=False)["input_ids"]
    rows = [tok(pre_text + c, add_special_tokens=False)["input_ids"] for c in conts[1]]
    # Where the first continuation's ids leave the prompt's: before the prompt's end (merged).
    shared = min(next((k for k in range(len(pre_ids)) if k >= len(r) or r[k] != pre_ids[k]), len(pre_ids))
                 for r in rows)
    assert shared < len(pre_ids)
    assert got[1] == pytest.approx(by_hand(model, tok, pre_text, conts[1], shared), abs=SCORE_ATOL)
    # A continuation is never more likely than its own prefix (every log-prob is <= 0).
    whole, part = run_sync(policy.score_continuations([plain, plain], [["The capital"], ["The"]]))
    assert whole[0] <= part[0] + SCORE_ATOL


def test_score_continuations_rejects_bad_arguments(tiny):
    model, tok = tiny
    policy = HFPolicy(model, tok, device="cpu")
    with pytest.raises(ConfigError, match="one list of continuations per observation"):
        run_sync(policy.score_continuations([chat("a")], [["x"], ["y"]]))
    for bad in ([], [""], "abc"):
        with pytest.raises(ConfigError, match="non-empty list of non-empty strings"):
            run_sync(policy.score_continuations([chat("a")], [bad]))
    assert run_sync(policy.score_continuations([], [])) == []


def test_a_missing_local_folder_says_so_not_the_hubs_id_rules(tmp_path):
    """``hf:./my-checkpoint`` on a folder that does not exist: the error names the folder, not
    the hub's "Repo id must use alphanumeric chars" (issue 27)."""
    from collab_env.errors import ConfigError
    from collab_env.policy import resolve_policy

    for spec in ("hf:./my-checkpoint", f"hf:{tmp_path / 'nope'}", "hf:~/no-such-collab-env-model"):
        with pytest.raises(ConfigError, match="no model folder at") as err:
            resolve_policy(spec)
        assert "Repo id" not in str(err.value)


# -- reading shared prefixes once, and reusing prefixes read before --------------------------


def _no_reuse(policy: HFPolicy) -> HFPolicy:
    policy.prefix_cache_tokens = 0
    policy.min_shared_prefix = 1 << 30
    return policy


def test_a_prefix_every_row_shares_is_read_once_and_reused_by_later_calls(tiny):
    from collab_env.policy import SamplingParams

    model, tok = tiny
    cold = _no_reuse(HFPolicy(model, tok, device="cpu"))
    warm = HFPolicy(model, tok, device="cpu")
    base = list(range(100, 140))  # 40 shared tokens, then rows that differ from their first token on
    prompts = [base + [7, 8, 9, 10, 11], base + [12, 13, 14], base + [15, 16, 17, 18, 19, 20, 21]]
    for params, seeds in ((SamplingParams.from_kwargs(temperature=0, max_new_tokens=6), [0, 0, 0]),
                          (SamplingParams.from_kwargs(temperature=1.0, max_new_tokens=6), [1, 2, 3])):
        a, b = cold.generate_batch(prompts, params, seeds), warm.generate_batch(prompts, params, seeds)
        assert [c.token_ids for c in a] == [c.token_ids for c in b]
        assert all(x == pytest.approx(y, abs=1e-4) for c, d in zip(a, b) for x, y in zip(c.logprobs, d.logprobs))
    # read without reuse: every prompt token, twice (5 + 40, 3 + 40, 7 + 40 per call)
    assert cold.stats.prefill_tokens == 2 * 135 and cold.stats.reused_prefix_tokens == 0
    # first call: the prefix (40), each row's rest but its last token (4 + 2 + 6), the 3 last tokens;
    # second call: the whole prefix comes from the cache (40 reused, 0 read), then 12 + 3 again
    assert warm.stats.prefill_tokens == (40 + 12 + 3) + (0 + 12 + 3)
    assert warm.stats.reused_prefix_tokens == 40
    # a single prompt extending the first row: the cached 40-token prefix is reused, 6 read
    # (its 47 tokens but the last), + its last
    longer = prompts[0] + [22, 23]
    params = SamplingParams.from_kwargs(temperature=0, max_new_tokens=6)
    cold_ids = cold.generate_batch([longer], params, [0])[0].token_ids
    assert warm.generate_batch([longer], params, [0])[0].token_ids == cold_ids
    assert warm.stats.reused_prefix_tokens == 40 + 40 and warm.stats.prefill_tokens == 70 + 6 + 1
    # the same prompt again: its stored 46 tokens are handed out whole, so every number is the same
    again = warm.generate_batch([longer], SamplingParams.from_kwargs(temperature=1.0, max_new_tokens=6), [5])
    once = warm.generate_batch([longer], SamplingParams.from_kwargs(temperature=1.0, max_new_tokens=6), [5])
    assert again[0].token_ids == once[0].token_ids and again[0].logprobs == once[0].logprobs
    assert warm.reset_prefix_cache() is True and len(warm._prefix_cache) == 0


def test_scoring_reuses_the_prompt_a_previous_call_read(tiny):
    model, tok = tiny
    cold = _no_reuse(HFPolicy(model, tok, device="cpu"))
    warm = HFPolicy(model, tok, device="cpu")
    obs = [chat("a long enough question about sums of odd numbers", system="judge this")]
    conts = [["yes", "no thanks"]]
    expected = run_sync(cold.score_continuations(obs, conts))
    first = run_sync(warm.score_continuations(obs, conts))
    second = run_sync(warm.score_continuations(obs, conts))
    n = len(template_ids(tok, obs[0]))
    assert warm.stats.reused_prefix_tokens == n  # the second call read nothing of the prompt again
    assert second == first  # the stored prompt is handed out as it was computed: the same numbers
    assert first[0] == pytest.approx(expected[0], abs=1e-4)


def test_a_stored_prefix_is_never_reused_under_other_weights(tiny, tmp_path):
    """A cached KV cache belongs to the weights that computed it: a weight written in place
    (load_state_dict, a plain optimiser step) drops the cache, and a learner's fused AdamW step
    (which does not bump torch's version counters) resets it through the optimiser hook."""
    import copy

    import torch

    from collab_env.adapters.common.models import PolicyModel, make_optimizer
    from collab_env.policy import SamplingParams

    model, tok = tiny
    model = copy.deepcopy(model)
    warm = HFPolicy(model, tok, device="cpu")
    prompts = [list(range(100, 140))]
    params = SamplingParams.from_kwargs(temperature=0, max_new_tokens=4)
    warm.generate_batch(prompts, params, [0])
    read = warm.stats.prefill_tokens
    with torch.no_grad():
        model.lm_head.weight.mul_(1.5) if not model.config.tie_word_embeddings else \
            model.get_input_embeddings().weight.mul_(1.5)
    warm.generate_batch(prompts, params, [0])
    assert warm.stats.reused_prefix_tokens == 0 and warm.stats.prefill_tokens == 2 * read
    # a fused AdamW step leaves the counters alone; the learners' optimiser hook resets the cache
    cfg = type("Cfg", (), dict(learning_rate=1e-2, weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.999,
                               adam_epsilon=1e-8, optim="adamw_torch_fused"))()
    pm = PolicyModel(model=model, tokenizer=tok, generator=warm)
    opt = make_optimizer(pm, cfg)
    warm.generate_batch(prompts, params, [0])
    assert len(warm._prefix_cache) > 0
    model(torch.tensor([prompts[0]])).logits.sum().backward()
    opt.step()
    assert pm.version == 1 and len(warm._prefix_cache) == 0

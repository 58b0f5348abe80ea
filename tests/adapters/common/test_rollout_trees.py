"""Learners batch: the token-level generation interface, the rollout trees driven by the one
episode driver, and a tree level's generation (the trained agents' samples and the futures of a
multiturn-aware reward played by the learner) in a handful of full model calls."""

import asyncio
import functools
import math
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import collab_env  # noqa: E402
from collab_env.adapters.common.models import load_policy_models  # noqa: E402
from collab_env.adapters.common.rollout import (  # noqa: E402
    compute_returns,
    expand_tree,
    start_roots,
)
from collab_env.adapters.magrpo import MAGRPOConfig  # noqa: E402
from collab_env.agents.hf import HFPolicy  # noqa: E402
from collab_env.agents.tokens import TokenGenerator  # noqa: E402
from collab_env.errors import ConfigError  # noqa: E402
from collab_env.policy import (  # noqa: E402
    SamplingParams,
    policies_for,
    resolve_policy,
)
from collab_env.types import Completion, Conversation  # noqa: E402
from tests._decode_calls import count_decodes  # noqa: E402


def _tiny(tiny_dir):
    from collab_env.testing.tiny_model import load_tiny_chat_model

    return load_tiny_chat_model(tiny_dir)


def _models(tiny_dir, tmp_path, **cfg):
    model, tok = _tiny(tiny_dir)
    args = MAGRPOConfig(num_agents=1, eval_interval=0, output_dir=str(tmp_path / "out"), **cfg)
    return load_policy_models(model, tok, 1, args, need_reference=False)


def _seeds(seed=0):
    rng = np.random.default_rng(seed)
    return lambda n: [int(x) for x in rng.integers(0, 2**31 - 1, n)]


def chat(text):
    return Conversation.from_chat([{"role": "user", "content": text}])


# -- the token-level interface -------------------------------------------------------------------


def test_hf_policy_and_policy_model_are_token_generators(tiny_dir, tmp_path):
    [pm] = _models(tiny_dir, tmp_path)
    assert isinstance(pm.generator, TokenGenerator) and isinstance(pm, TokenGenerator)
    tok = pm.tokenizer
    expected_pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    assert pm.generator.pad_token_id == pm.pad_id == pm.pad_token_id == expected_pad
    # the policy that plays a learner's futures is the model being trained, merging its callers
    assert pm.policy is pm.generator and pm.generator.flush == "idle"


def test_generate_tokens_keeps_prompts_and_calls_within_max_batch_size(tiny_dir, monkeypatch):
    model, tok = _tiny(tiny_dir)
    sizes = count_decodes(monkeypatch, model)
    policy = HFPolicy(model, tok, max_batch_size=2)
    prompts = [policy.prompt_ids(chat(f"question {i}: " + "why " * i)) for i in range(5)]
    outs = policy.generate_tokens(prompts, SamplingParams(temperature=1.0, max_new_tokens=5), [7, 8, 9, 10, 11])
    assert sizes == [2, 2, 1]  # ceil(5 / 2) calls, none over max_batch_size
    assert policy.stats.generate_calls == 3 and policy.stats.batched_requests == 5
    for p, c, seed in zip(prompts, outs, [7, 8, 9, 10, 11], strict=True):
        assert isinstance(c, Completion) and list(c.prompt_token_ids) == p  # exactly the ids given
        assert 1 <= len(c.token_ids) <= 5 and len(c.logprobs) == len(c.token_ids)
        assert all(lp <= 0.0 for lp in c.logprobs) and c.meta["seed"] == seed
        assert c.text == tok.decode(list(c.token_ids), skip_special_tokens=True)  # no stop strings
    # a mapping of SamplingParams fields is accepted; greedy rows of one prompt agree
    a, b = policy.generate_tokens([prompts[0]] * 2, {"temperature": 0.0, "max_new_tokens": 4}, [1, 2])
    assert a.token_ids == b.token_ids


def test_generate_tokens_rejects_bad_input(tiny_dir):
    model, tok = _tiny(tiny_dir)
    policy = HFPolicy(model, tok)
    with pytest.raises(ConfigError, match="one seed per prompt"):
        policy.generate_tokens([[1, 2]], SamplingParams(), [1, 2])
    with pytest.raises(ConfigError, match="empty prompt"):
        policy.generate_tokens([[]], SamplingParams(), [1])
    with pytest.raises(ConfigError, match="SamplingParams"):
        policy.generate_tokens([[1, 2]], 0.7, [1])
    with pytest.raises(ConfigError, match="flush"):
        HFPolicy(model, tok, flush="sometimes")


# -- the HF queue under flush="idle" -------------------------------------------------------------


def test_idle_flush_merges_callers_that_arrive_over_many_loop_iterations(tiny_dir, monkeypatch):
    """Callers that reach the policy after different amounts of work (loop iterations) share
    full batches under flush="idle"; the timer rule with no wait sends what has arrived."""
    model, tok = _tiny(tiny_dir)
    sizes = count_decodes(monkeypatch, model)

    async def staggered(policy, n):
        async def caller(i):
            for _ in range(i % 6):  # 0..5 loop iterations of other work before asking
                await asyncio.sleep(0)
            return await policy.act([chat(f"caller {i}")], seed=i)

        return await asyncio.gather(*(caller(i) for i in range(n)))

    idle = HFPolicy(model, tok, max_batch_size=8, flush="idle", max_wait_ms=60_000, max_new_tokens=3)
    outs = asyncio.run(staggered(idle, 24))
    assert sizes == [8, 8, 8] and all(len(o) == 1 for o in outs)
    sizes.clear()
    timer = HFPolicy(model, tok, max_batch_size=8, flush="timer", max_wait_ms=0, max_new_tokens=3)
    asyncio.run(staggered(timer, 24))
    assert sum(sizes) == 24 and len(sizes) > 3  # the early arrivals went out alone


def test_idle_flush_does_not_wait_when_nothing_else_is_coming(tiny_dir):
    model, tok = _tiny(tiny_dir)
    policy = HFPolicy(model, tok, max_batch_size=64, flush="idle", max_wait_ms=60_000, max_new_tokens=3)
    start = time.perf_counter()
    [c] = asyncio.run(policy.act([chat("alone")]))
    # max_wait_ms (a minute) is only a cap: a settled loop flushes at once
    assert time.perf_counter() - start < 30 and c.token_ids


# -- the trees on the one episode driver ---------------------------------------------------------


class _Recording:
    """An untrained player's policy that records the keywords it was called with."""

    def __init__(self):
        self.calls: list[dict] = []

    async def act(self, observations, **sampling):
        self.calls.append(dict(sampling))
        return [Completion(text="Which objects are involved?") for _ in observations]


def test_tree_untrained_players_get_their_sampling_and_a_seed_per_round(tiny_dir, tmp_path):
    [pm] = _models(tiny_dir, tmp_path)
    env = collab_env.make("hidden-facts-easy")
    user = _Recording()
    others = {"user": user}

    async def go():
        roots = await start_roots(env, [0, 1], ["assistant"], others, _seeds(), others_sampling={"user": {"temperature": 0.3}})
        return await expand_tree(roots, players=["assistant"], models=[pm], others=others, branching=lambda d: 2,
                                 max_depth=2, joint_mode="aligned", sampling={"max_new_tokens": 4}, seeds=_seeds(1),
                                 others_sampling={"user": {"temperature": 0.3}})

    levels = asyncio.run(go())
    assert [len(nodes) for nodes in levels] == [2, 4]
    # every joint action of the first level: the assistant's move, then the user's reply
    assert len(user.calls) >= 4
    assert all(c["temperature"] == 0.3 and isinstance(c["seed"], int) for c in user.calls)
    for node in levels[1]:  # the child state: the user answered with the recorded policy's text
        assert node.obs["assistant"].messages[-1].content == "Which objects are involved?"
    compute_returns(levels, 1, 1.0)
    assert all(len(ja.returns) == 1 for nodes in levels for n in nodes for ja in n.joint)


def test_tree_without_a_policy_for_an_untrained_player_says_which(tiny_dir, tmp_path):
    [pm] = _models(tiny_dir, tmp_path)
    env = collab_env.make("hidden-facts-easy")

    async def go():
        roots = await start_roots(env, [0], ["assistant"], {}, _seeds())
        await expand_tree(roots, players=["assistant"], models=[pm], others={}, branching=lambda d: 2, max_depth=2,
                          joint_mode="aligned", sampling={"max_new_tokens": 4}, seeds=_seeds(1))

    with pytest.raises(ConfigError, match="'user'"):
        asyncio.run(go())


# -- the must-show: one tree level in ceil(rows / max_batch_size) model calls --------------------


def test_magrpo_level_with_mr_futures_makes_ceil_rows_over_max_batch_size_model_calls(tiny_dir, tmp_path, monkeypatch):
    """8 prompts x 4 generations x 2 turns on hidden-facts with the multiturn-aware reward (3
    futures, the assistant's future turns played by the learner, the scripted user answering):
    per tree level, the model's generate calls are at most ceil(rows / max_batch_size), rows being
    every sequence the level generated (the trained samples and the futures' learner turns).

    max_batch_size = 16 divides a level's trained samples (32, then 128): those must be sampled
    before the futures that score them, so the two can never share a call. The window (two user
    turns, three assistant turns, the verl rule) gives each future one learner turn, whatever the
    random model writes; a future that does not run (an invalid reply, an ended episode) only
    lowers the rows."""
    max_batch = 16
    [pm] = _models(tiny_dir, tmp_path, num_generations=4, num_turns=2, max_new_tokens=6)
    pm.generator.max_batch_size = max_batch
    env = collab_env.make("hidden-facts-easy", reward="mr", reward_kwargs=dict(
        num_rollouts=3, max_user_turns=2, max_assistant_turns=3,
        weights={"accuracy_rule": 1.0, "token_amount": -1e-3}, sampling={"assistant": {"max_new_tokens": 6}}))
    others = {p: resolve_policy(v) for p, v in policies_for(env.spec).items() if p != "assistant"}
    log = count_decodes(monkeypatch, pm.model)
    real = pm.generate_tokens

    def level_start(prompts, params, seeds):  # each level begins with the trained samples
        log.append(("level", len(prompts)))
        return real(prompts, params, seeds)

    pm.generate_tokens = level_start

    async def go():
        roots = await start_roots(env, list(range(8)), ["assistant"], others, _seeds())
        return await expand_tree(roots, players=["assistant"], models=[pm], others=others, branching=lambda d: 4,
                                 max_depth=2, joint_mode="aligned",
                                 sampling={"temperature": 1.0, "max_new_tokens": 6}, seeds=_seeds(1))

    levels = asyncio.run(go())
    assert [len(nodes) for nodes in levels] == [8, 32]
    per_level: list[dict] = []
    for entry in log:
        if isinstance(entry, tuple):
            per_level.append({"trained": entry[1], "calls": 0, "rows": 0, "sizes": []})
        else:
            per_level[-1]["calls"] += 1
            per_level[-1]["rows"] += entry
            per_level[-1]["sizes"].append(entry)
    assert [lv["trained"] for lv in per_level] == [8 * 4, 32 * 4]
    for lv in per_level:
        futures = lv["rows"] - lv["trained"]
        assert futures > 0, lv  # the futures did generate through the learner's model
        assert lv["calls"] <= math.ceil(lv["rows"] / max_batch), lv
        assert max(lv["sizes"]) <= max_batch
    print("per level:", [(lv["calls"], lv["rows"]) for lv in per_level])


# -- a prompt shared by several rows is read once ------------------------------------------------


def test_rows_sharing_a_prompt_read_it_once_and_sample_as_if_each_read_it(tiny_dir):
    model, tok = _tiny(tiny_dir)
    policy = HFPolicy(model, tok)
    short, long = (policy.prompt_ids(chat(t)) for t in ("short", "a much longer question about apples and boxes"))
    prompts = [short, short, long, long, short]  # a group's samples of two prompts
    seen: list[tuple[int, int]] = []
    real = model.forward

    @functools.wraps(real)  # generate reads forward's signature (position_ids, cache)
    def forward(*args, **kwargs):
        seen.append(tuple(kwargs["input_ids"].shape))
        return real(*args, **kwargs)

    model.forward = forward
    params = SamplingParams(temperature=1.0, max_new_tokens=6)
    shared = policy.generate_tokens(prompts, params, [1, 2, 3, 4, 5])
    width = len(long)
    # the first pass reads the two distinct prompts (all but their last token), then generate
    # continues all five rows from that cache: its first step reads one token per row
    assert seen[0] == (2, width - 1) and seen[1] == (5, 1)
    seen.clear()
    policy.shared_prefill = False
    alone = policy.generate_tokens(prompts, params, [1, 2, 3, 4, 5])
    assert seen[0] == (5, width)  # every row reads its whole prompt
    for a, b in zip(shared, alone, strict=True):
        assert a.prompt_token_ids == b.prompt_token_ids
        # the same computation split in two passes: equal up to float32 rounding (one sampled
        # token could only differ if two tokens' probabilities were within ~1e-6 of a draw)
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-4

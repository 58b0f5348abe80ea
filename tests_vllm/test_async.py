"""AsyncVLLMPolicy (vLLM's async engine): concurrent calls, any event loop."""

from __future__ import annotations

import asyncio

from tests_vllm.test_engine import assert_decodes_to, chats


def test_concurrent_calls_match_the_offline_engine(async_policy, greedy):
    obs = chats()

    async def many():
        return await asyncio.gather(*(async_policy.act([o], temperature=0, max_new_tokens=16) for o in obs))

    out = [r[0] for r in asyncio.run(many())]
    tok = async_policy.tokenizer
    for a, r in zip(out, greedy, strict=True):
        assert a.prompt_token_ids == r.prompt_token_ids
        assert len(a.logprobs) == len(a.token_ids) > 0
        assert_decodes_to(tok, a)
        assert a.meta["batch_size"] == 1
    # Same model, same dtype, greedy: the same tokens as the offline engine's 24-token answers
    # (allow one row to differ: batch composition can flip a near-tie).
    same = sum(a.token_ids == r.token_ids[: len(a.token_ids)] for a, r in zip(out, greedy, strict=True))
    assert same >= 7


def test_seeded_and_batched_call_from_another_loop(async_policy):
    obs = chats(["Write one word about the sea."]) * 3
    kw = dict(temperature=1.0, max_new_tokens=8, seed=11)
    a = asyncio.run(async_policy.act(obs, **kw))
    b = asyncio.new_event_loop().run_until_complete(async_policy.act(obs, **kw))
    assert [c.token_ids for c in a] == [c.token_ids for c in b]
    assert len({c.token_ids for c in a}) > 1
    assert all(c.meta["batch_size"] == 3 for c in a)


def test_prefix_caching_on_async_engine(async_policy):
    system = "You are terse. " + " ".join(f"Fact {i}: the sky is blue." for i in range(120))
    asyncio.run(async_policy.act(chats(["Hi"], system=system), temperature=0, max_new_tokens=2))
    (c,) = asyncio.run(async_policy.act(chats(["Hello"], system=system), temperature=0, max_new_tokens=2))
    assert c.meta["cached_tokens"] > 0


def test_identical_deterministic_requests_in_flight_are_generated_once(async_policy):
    obs = chats(["Name three rivers of Europe."])
    kw = dict(temperature=0, max_new_tokens=24)
    before = async_policy.stats.shared_requests

    async def many(n, **sampling):
        return [r[0] for r in await asyncio.gather(*(async_policy.act(obs, **sampling) for _ in range(n)))]

    out = asyncio.run(many(3, **kw))
    assert async_policy.stats.shared_requests == before + 2
    assert sorted(c.meta["shared"] for c in out) == [False, True, True]
    assert len({c.token_ids for c in out}) == 1 and len(out[0].token_ids) > 0
    # nothing stays in flight: the same request later is generated again, to the same tokens
    (again,) = asyncio.run(async_policy.act(obs, **kw))
    assert again.meta["shared"] is False and again.token_ids == out[0].token_ids
    # sampled without a seed: never shared
    before = async_policy.stats.shared_requests
    asyncio.run(many(3, temperature=1.0, max_new_tokens=8))
    assert async_policy.stats.shared_requests == before


def test_a_cancelled_caller_does_not_cancel_the_request_it_shares(async_policy):
    obs = chats(["Describe a lighthouse in two sentences."])
    kw = dict(temperature=0, max_new_tokens=32)

    async def cancel_one():
        a = asyncio.ensure_future(async_policy.act(obs, **kw))
        b = asyncio.ensure_future(async_policy.act(obs, **kw))
        await asyncio.sleep(0.2)
        a.cancel()
        return a, await b

    a, (b,) = asyncio.run(cancel_one())
    assert a.cancelled()
    assert b.meta["shared"] is True and len(b.token_ids) > 0
    (alone,) = asyncio.run(async_policy.act(obs, **kw))
    assert alone.token_ids == b.token_ids

"""LiteLLMPolicy against a real HTTP server on 127.0.0.1 (collab_env/testing/openai_server.py).

Every injected fault must end in a retry then success, a counted failure or a clear error:
never a hang (wall times are bounded) and never a lost or misplaced result.
"""

from __future__ import annotations

import asyncio
import pickle
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("litellm")
pytest.importorskip("aiohttp")

import collab_env  # noqa: E402
from collab_env.agents.limiter import ConcurrencyLimiter, shared_limiter  # noqa: E402
from collab_env.agents.litellm import LiteLLMPolicy  # noqa: E402
from collab_env.errors import ConfigError, FatalPolicyError, PolicyError  # noqa: E402
from collab_env.rollout import run_episode  # noqa: E402
from collab_env.tasks.hidden_facts import AskThenAnswer  # noqa: E402
from collab_env.testing.openai_server import FakeOpenAIServer, free_port  # noqa: E402
from collab_env.types import FAULT, Conversation, Message  # noqa: E402

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def server():
    # One server per test: a hung request of one test must not count as in flight in the next.
    with FakeOpenAIServer(hang_s=30.0) as srv:
        yield srv


def chat(text: str) -> Conversation:
    return Conversation((Message("user", text, author="user"),), viewer="assistant")


def policy(srv: FakeOpenAIServer, **kw) -> LiteLLMPolicy:
    """A policy with fast retries and a private limit (tests must not share one by accident)."""
    kw.setdefault("limiter", ConcurrencyLimiter(kw.pop("max_concurrency", 64)))
    kw.setdefault("backoff_base", 0.01)
    kw.setdefault("backoff_max", 0.05)
    kw.setdefault("timeout", 5.0)
    return LiteLLMPolicy(kw.pop("model", "openai/fake-model"), api_base=srv.url, **kw)


def act(p: LiteLLMPolicy, texts, **sampling):
    return asyncio.run(p.act([chat(t) for t in texts], **sampling))


# -- normal calls ----------------------------------------------------------------------------
def test_normal_call_returns_text_usage_and_meta(server):
    p = policy(server, system_prompt="Be brief.", temperature=0.3)
    [c] = act(p, ["how many apples"], max_new_tokens=17, stop=["\n"], seed=5, top_k=4, top_p=0.9)
    assert c.text == "echo: how many apples"
    assert c.finish_reason == "stop" and not c.is_fault
    # The fake server counts words: prompt "Be brief." + "how many apples" = 5, reply = 4.
    assert dict(c.usage) == {"model_calls": 1, "prompt_tokens": 5, "completion_tokens": 4,
                             "cost": 0.0, "retries": 0}
    assert c.meta["model"] == "openai/fake-model" and c.meta["latency_s"] > 0
    assert c.token_ids is None and c.logprobs is None
    body = server.requests[-1]
    assert body["messages"][0] == {"role": "system", "content": "Be brief."}
    assert body["model"] == "fake-model"
    assert body["temperature"] == 0.3 and body["max_tokens"] == 17 and body["top_p"] == 0.9
    assert body["stop"] == ["\n"] and body["seed"] == 5
    assert body["top_k"] == 4  # openai/ models: top_k travels in the body (extra_body)
    assert p.stats.to_dict() == {"calls": 1, "retries": 0, "failures": 0, "completions": 1,
                                 "prompt_tokens": 5, "completion_tokens": 4, "cost": 0.0}


def test_tool_calls_and_results_reach_the_api_in_its_shape(server):
    """A transcript with a tool call and its result goes out as OpenAI's API takes it: the call's
    arguments as a JSON string, the result with its tool_call_id."""
    from collab_env.types import ToolCall

    obs = Conversation((
        Message("user", "hi, my number is 555-1234", author="user"),
        Message("assistant", '{"name": "lookup_account", "arguments": {"phone_number": "555-1234"}}',
                author="assistant", tool_calls=(ToolCall("c1", "lookup_account", {"phone_number": "555-1234"}),)),
        Message("tool", '{"line": "active"}', tool_call_id="c1"),
    ), viewer="assistant")
    [c] = asyncio.run(policy(server).act([obs]))
    assert not c.is_fault
    sent = server.requests[-1]["messages"]
    assert sent[1]["tool_calls"] == [{"id": "c1", "type": "function", "function": {
        "name": "lookup_account", "arguments": '{"phone_number": "555-1234"}'}}]
    assert sent[2] == {"role": "tool", "content": '{"line": "active"}', "tool_call_id": "c1"}
    assert obs[1].tool_calls[0].arguments == {"phone_number": "555-1234"}  # the observation is untouched


def test_defaults_omit_unset_parameters(server):
    act(policy(server), ["hi"])
    body = server.requests[-1]
    assert {"top_p", "stop", "seed", "top_k", "logprobs"}.isdisjoint(body)
    assert body["max_tokens"] == 256


def test_cost_of_a_priced_model_is_counted(server):
    p = policy(server, model="openai/gpt-4o-mini")
    [c] = act(p, ["price me"])
    assert c.usage["cost"] > 0
    assert p.stats.cost == pytest.approx(c.usage["cost"])


def test_logprobs_when_requested(server):
    [c] = act(policy(server, logprobs=True), ["a b"])
    assert server.requests[-1]["logprobs"] is True
    assert c.logprobs == pytest.approx((-0.1, -0.2, -0.3))  # "echo:", "a", "b"


def test_concurrency_limit_is_respected(server):
    server.latency = 0.05
    p = policy(server, max_concurrency=5)
    t0 = time.perf_counter()
    out = act(p, [f"q{i}" for i in range(20)])
    assert [c.text for c in out] == [f"echo: q{i}" for i in range(20)]
    assert server.max_in_flight == 5  # the limit held, and calls did overlap up to it
    assert p.limiter.peak == 5 and p.limiter.in_flight == 0
    assert time.perf_counter() - t0 < 5.0


def test_results_map_to_their_observations_under_concurrency(server):
    server.latency, server.jitter = 0.005, 0.05  # answers come back out of order
    texts = [f"item {i} " + "x" * (i % 7) for i in range(60)]
    out = act(policy(server, max_concurrency=16), texts)
    assert [c.text for c in out] == ["echo: " + t for t in texts]
    # And the server did not simply answer in order.
    assert [r["messages"][-1]["content"] for r in server.requests] != texts or server.max_in_flight > 1


def test_shared_limit_across_policies_and_event_loops(server):
    server.latency = 0.03
    model = f"openai/shared-{server.port}"
    a = LiteLLMPolicy(model, api_base=server.url, max_concurrency=3)
    b = LiteLLMPolicy(model, api_base=server.url, max_concurrency=3, name="other")
    assert a.limiter is b.limiter is shared_limiter(model, server.url, 3)
    with pytest.raises(ConfigError, match="already has a shared concurrency limit of 3"):
        LiteLLMPolicy(model, api_base=server.url, max_concurrency=7)

    errors: list[BaseException] = []

    def run(p: LiteLLMPolicy) -> None:  # each thread runs its own event loop
        try:
            act(p, [f"{p.name}-{i}" for i in range(12)])
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(p,)) for p in (a, b, a)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    assert len(server.requests) == 36
    assert server.max_in_flight == 3 and a.limiter.in_flight == 0


def test_limiter_waiter_cancelled_does_not_leak_a_slot():
    async def main():
        lim = ConcurrencyLimiter(1)
        await lim.acquire()
        waiter = asyncio.ensure_future(lim.acquire())
        await asyncio.sleep(0)
        waiter.cancel()
        lim.release()  # hands the slot to the (cancelled) waiter, which must give it back
        with pytest.raises(asyncio.CancelledError):
            await waiter
        await asyncio.sleep(0)
        assert lim.in_flight == 0
        await asyncio.wait_for(lim.acquire(), 1)
        assert lim.in_flight == 1

    asyncio.run(main())


# -- faults that a retry fixes ---------------------------------------------------------------
@pytest.mark.parametrize(
    "fault", ["429", "429-after-ms", "500", "503", "malformed", "no-choices", "empty", "drop", "hang"]
)
def test_transient_fault_is_retried_then_succeeds(server, fault):
    server.retry_after = 0.05
    server.inject(fault)
    # The timeout ends the "hang" attempt; it must also leave the retry, an ordinary echo, time to
    # finish on a loaded 2-core machine (0.5 s once timed a retry out too: retries == 2).
    p = policy(server, timeout=2.0)
    t0 = time.perf_counter()
    [c] = act(p, ["hello"])
    assert time.perf_counter() - t0 < 2.0 + 4.0  # one timeout at most, then a quick retry
    assert c.text == "echo: hello"
    assert c.usage["retries"] == 1 and c.usage["model_calls"] == 2
    assert len(server.requests) == 2
    assert p.stats.calls == 2 and p.stats.retries == 1 and p.stats.failures == 0


def test_empty_reply_is_billed_but_never_returned(server):
    server.inject("empty", "empty")
    [c] = act(policy(server), ["abc"])
    assert c.text == "echo: abc"
    assert c.usage["retries"] == 2
    assert c.usage["prompt_tokens"] == 3  # one prompt word, three requests


def test_retry_after_is_honoured(server):
    server.retry_after = 1.0
    server.inject("429-after")
    t0 = time.perf_counter()
    [c] = act(policy(server, backoff_max=5.0), ["wait"])
    elapsed = time.perf_counter() - t0
    assert c.text == "echo: wait"
    assert 0.9 <= elapsed < 3.0


def test_retry_after_is_capped_by_backoff_max(server):
    server.retry_after = 30.0
    server.inject("429-after")
    t0 = time.perf_counter()
    [c] = act(policy(server, backoff_max=0.2), ["wait"])
    assert c.text == "echo: wait"
    assert time.perf_counter() - t0 < 2.0


def test_backoff_grows_exponentially_with_jitter(server):
    p = policy(server, backoff_base=0.1, backoff_max=0.3)
    delays = [p._delay(a, None) for a in (1, 2, 3, 4) for _ in range(50)]
    first, second, third, fourth = (delays[i * 50:(i + 1) * 50] for i in range(4))
    assert all(0.05 <= d <= 0.1 for d in first) and len(set(first)) > 1
    assert all(0.1 <= d <= 0.2 for d in second)
    assert all(0.15 <= d <= 0.3 for d in third + fourth)
    assert p._delay(1, 0.25) == 0.25 and p._delay(1, 99.0) == 0.3


def test_mixed_faults_under_concurrency_lose_no_result(server):
    server.jitter = 0.02
    server.inject("500", "empty", "429", "malformed", "503", "drop", "empty", "no-choices")
    texts = [f"m{i}" for i in range(24)]
    p = policy(server, max_concurrency=4, max_retries=8)
    out = act(p, texts)
    assert [c.text for c in out] == ["echo: " + t for t in texts]
    assert sum(c.usage["retries"] for c in out) == 8 == p.stats.retries
    assert len(server.requests) == 32 == p.stats.calls


# -- faults that persist ----------------------------------------------------------------------
@pytest.mark.parametrize("fault", ["500", "429", "empty", "malformed"])
def test_persistent_fault_raises_naming_model_attempts_and_error(server, fault):
    server.always = fault
    p = policy(server, max_retries=2)
    with pytest.raises(PolicyError) as info:
        act(p, ["x"])
    msg = str(info.value)
    assert "openai/fake-model" in msg and "3 attempt(s)" in msg
    assert {"500": "500", "429": "429", "empty": "empty content", "malformed": "500"}[fault] in msg
    assert len(server.requests) == 3
    assert p.stats.calls == 3 and p.stats.retries == 2 and p.stats.failures == 1


def test_hang_longer_than_timeout_never_hangs(server):
    server.always = "hang"
    p = policy(server, timeout=0.3, max_retries=2)
    t0 = time.perf_counter()
    with pytest.raises(PolicyError, match="timeout|Timeout"):
        act(p, ["anyone?"])
    # Bound: (max_retries + 1) * timeout + max_retries * backoff_max, plus slack.
    assert time.perf_counter() - t0 < 3 * 0.3 + 2 * 0.05 + 1.5
    assert len(server.requests) == 3


@pytest.mark.parametrize("fault,says", [("400", "fake bad request"), ("401", "Incorrect API key")])
@pytest.mark.parametrize("fault_policy", ["raise", "fault"])
def test_rejected_request_is_not_retried(server, fault, says, fault_policy):
    server.inject(fault)
    p = policy(server, fault_policy=fault_policy)
    t0 = time.perf_counter()
    with pytest.raises(FatalPolicyError, match=says) as info:
        act(p, ["x"])
    assert "Not retried" in str(info.value) and fault in str(info.value)
    assert len(server.requests) == 1 and p.stats.calls == 1 and p.stats.retries == 0
    assert time.perf_counter() - t0 < 2.0


# -- non-retryable rejections: a missing or wrong key ------------------------------------------
@pytest.fixture
def keyed_server():
    """A server that accepts one key only (as a real provider does)."""
    with FakeOpenAIServer(api_key="sk-the-right-key") as srv:
        yield srv


def test_fake_server_answers_401_like_openai_without_a_valid_key(keyed_server):
    import json
    import urllib.error
    import urllib.request

    def post(headers):
        req = urllib.request.Request(keyed_server.url + "/chat/completions", method="POST",
                                     data=b'{"model": "m", "messages": []}',
                                     headers={"Content-Type": "application/json", **headers})
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return r.status, json.load(r)
        except urllib.error.HTTPError as exc:
            return exc.code, json.load(exc)

    status, body = post({})
    assert status == 401 and body["error"]["code"] == "missing_api_key"
    assert "You didn't provide an API key" in body["error"]["message"]
    status, body = post({"Authorization": "Bearer sk-wrong-key-123"})
    assert status == 401 and body["error"]["code"] == "invalid_api_key"
    assert body["error"]["message"].startswith("Incorrect API key provided: sk-****-123.")
    status, body = post({"Authorization": "Bearer sk-the-right-key"})
    assert status == 200 and body["choices"][0]["message"]["content"] == "echo: "
    assert len(keyed_server.requests) == 3


# With the default retry schedule (max_retries=4, backoff_base=0.5) a retried failure sleeps at
# least 0.25 + 0.5 + 1 + 2 = 3.75 s; one second separates "failed at once" from it with margin.
FAIL_AT_ONCE_S = 1.0


def test_no_key_fails_at_once_with_the_providers_message(keyed_server, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    p = LiteLLMPolicy("openai/fake-model", api_base=keyed_server.url, limiter=ConcurrencyLimiter(4))
    assert p.max_retries == 4  # the default retry schedule: the rejection must skip it
    t0 = time.perf_counter()
    with pytest.raises(FatalPolicyError, match="Incorrect API key provided") as info:
        act(p, ["hello"])
    assert time.perf_counter() - t0 < FAIL_AT_ONCE_S
    assert isinstance(info.value, PolicyError) and "401" in str(info.value)
    assert len(keyed_server.requests) == 1
    assert p.stats.calls == 1 and p.stats.retries == 0 and p.stats.failures == 1


def test_wrong_key_fails_at_once_even_with_fault_policy_fault(keyed_server):
    p = LiteLLMPolicy("openai/fake-model", api_base=keyed_server.url, api_key="sk-wrong-key-123",
                      limiter=ConcurrencyLimiter(4), fault_policy="fault")
    t0 = time.perf_counter()
    with pytest.raises(FatalPolicyError, match=r"Incorrect API key provided: sk-\*\*\*\*-123"):
        act(p, ["a", "b"])
    assert time.perf_counter() - t0 < FAIL_AT_ONCE_S
    assert len(keyed_server.requests) <= 2  # both may be in flight; none is retried
    assert p.stats.retries == 0


def test_judge_stops_at_once_on_a_rejected_key(keyed_server, monkeypatch):
    from collab_env.agents.judges import LLMJudge

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    backend = LiteLLMPolicy("openai/fake-model", api_base=keyed_server.url, limiter=ConcurrencyLimiter(4))
    judge = LLMJudge.preset("accuracy", backend)
    assert judge.max_retries == 2 and not judge.uses_logprobs  # an API backend generates
    t0 = time.perf_counter()
    with pytest.raises(FatalPolicyError, match="Incorrect API key provided"):
        asyncio.run(judge.score(problem="2+2?", conversation=chat("4"), reference="4"))
    assert time.perf_counter() - t0 < FAIL_AT_ONCE_S
    assert len(keyed_server.requests) == 1


@pytest.mark.parametrize("on_failure", ["truncate", "raise"])
def test_user_simulator_stops_at_once_on_a_rejected_key(keyed_server, monkeypatch, on_failure):
    from collab_env.agents.users import LLMUserSimulator

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    backend = LiteLLMPolicy("openai/fake-model", api_base=keyed_server.url, limiter=ConcurrencyLimiter(4))
    user = LLMUserSimulator(backend, on_failure=on_failure)
    assert user.max_retries == 2
    env = collab_env.make("hidden-facts")
    t0 = time.perf_counter()
    # Not a counted truncation (end_reason "fault:user"): the episode itself stops.
    with pytest.raises(FatalPolicyError, match="Incorrect API key provided"):
        run_episode(env, {"assistant": AskThenAnswer(), "user": user}, seed=0)
    assert time.perf_counter() - t0 < FAIL_AT_ONCE_S
    assert len(keyed_server.requests) == 1


def test_rejection_cancels_the_rest_of_the_batch(server):
    server.latency = 0.2
    server.inject("401")
    p = policy(server, max_concurrency=1)
    with pytest.raises(PolicyError, match="observation 0"):
        act(p, ["a", "b", "c", "d"])
    assert len(server.requests) == 1 and p.limiter.in_flight == 0


def test_connection_refused_is_retried_then_reported():
    url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    p = LiteLLMPolicy("openai/nobody", api_base=url, limiter=ConcurrencyLimiter(4), max_retries=2,
                      backoff_base=0.01, backoff_max=0.05, timeout=2.0)
    t0 = time.perf_counter()
    with pytest.raises(PolicyError, match="3 attempt") as info:
        asyncio.run(p.act([chat("hello?")]))
    assert "Connection" in str(info.value) and url in str(info.value)
    assert time.perf_counter() - t0 < 5.0
    p.fault_policy = "fault"
    [c] = asyncio.run(p.act([chat("hello?")]))
    assert c.is_fault and "Connection" in c.meta["fault"]


def test_fault_policy_fault_returns_fault_completions_with_reasons(server):
    server.always = "503"
    p = policy(server, fault_policy="fault", max_retries=2, max_concurrency=2)
    out = act(p, ["a", "b", "c"])
    assert [c.finish_reason for c in out] == [FAULT] * 3
    for c in out:
        assert c.text == "" and c.is_fault
        assert "503" in c.meta["fault"] and "3 attempt(s)" in c.meta["fault"]
        assert c.usage["retries"] == 2 and c.usage["model_calls"] == 3
    assert p.stats.failures == 3 and p.stats.calls == 9 and p.stats.completions == 0


def test_context_window_exceeded_follows_fault_policy_without_retry(server):
    server.inject("context")
    [c] = act(policy(server, fault_policy="fault"), ["very long"])
    assert c.is_fault and "context window" in c.meta["fault"]
    assert len(server.requests) == 1


# -- episodes --------------------------------------------------------------------------------
def test_failing_user_simulator_ends_episode_as_counted_truncation(server):
    server.always = "500"
    user = policy(server, fault_policy="fault", max_retries=2)
    env = collab_env.make("hidden-facts")
    ep = run_episode(env, {"assistant": AskThenAnswer(), "user": user}, seed=3)
    assert ep.truncated and not ep.terminated
    assert ep.end_reason == "fault:user"
    assert ep.costs["faults"] == 1
    assert ep.costs["model_calls"] == 3 and ep.costs["retries"] == 2
    assert "500" in ep.info["faults"][0]["reason"]
    assert user.stats.failures == 1


def test_episode_costs_equal_policy_stats(server):
    user = policy(server)
    env = collab_env.make("hidden-facts", max_steps=6)
    ep = run_episode(env, {"assistant": AskThenAnswer(), "user": user}, seed=1)
    assert ep.end_reason == "max_steps"  # an echoing user never gives the facts
    user_turns = [t for t in ep.turns if t.player == "user"]
    assert all(t.text.startswith("echo: ") for t in user_turns)
    assert ep.costs["model_calls"] == user.stats.calls == len(user_turns)
    assert ep.costs["prompt_tokens"] == user.stats.prompt_tokens > 0
    assert ep.costs["completion_tokens"] == user.stats.completion_tokens > 0


# -- configuration ---------------------------------------------------------------------------
def test_configuration_errors_are_caught_at_construction(server):
    with pytest.raises(ConfigError, match="fault_policy"):
        policy(server, fault_policy="ignore")
    with pytest.raises(ConfigError, match="unknown sampling parameter"):
        policy(server, temprature=0.5)
    with pytest.raises(ConfigError, match="timeout"):
        policy(server, timeout=0)
    with pytest.raises(ConfigError, match="completion_kwargs may not set"):
        policy(server, completion_kwargs={"max_tokens": 5})
    with pytest.raises(ConfigError, match="unknown sampling parameter"):
        act(policy(server), ["x"], max_tokens=5)


def test_repr_hides_key_and_policy_pickles(server):
    p = LiteLLMPolicy("openai/pickled", api_base=server.url, api_key="sk-secret", max_concurrency=2)
    assert "sk-secret" not in repr(p)
    q = pickle.loads(pickle.dumps(p))
    assert q.limiter is p.limiter  # the same process's shared limiter
    assert asyncio.run(q.act([chat("again")]))[0].text == "echo: again"


def test_module_import_does_not_import_litellm():
    code = "import sys, collab_env.agents.litellm; print('litellm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# -- the retry policy and the limiter, as modules of their own --------------------------------
def test_the_limiter_keeps_its_old_import_path():
    from collab_env.agents import limiter, litellm

    assert litellm.ConcurrencyLimiter is limiter.ConcurrencyLimiter
    assert litellm.shared_limiter is limiter.shared_limiter


class _StatusError(Exception):
    def __init__(self, status, message="boom", headers=None):
        super().__init__(message)
        self.status_code = status
        self.headers = headers or {}


@pytest.mark.parametrize(("exc", "kind", "fatal", "rejected", "wait"), [
    (_StatusError(429, headers={"retry-after": "2"}), "retry", None, None, 2.0),
    (_StatusError(503, headers={"retry-after-ms": "1500"}), "retry", None, None, 1.5),
    (_StatusError(500), "retry", None, None, None),
    (_StatusError(408), "retry", None, None, None),
    (_StatusError(401), "give up", True, True, None),
    (_StatusError(422), "give up", True, True, None),
    (_StatusError(500, "Missing credentials: set OPENAI_API_KEY"), "give up", True, True, None),
    (ConnectionResetError("reset"), "retry", None, None, None),
    (KeyError("bad keyword"), "give up", True, False, None),
])
def test_errors_are_sorted_into_retry_or_give_up(exc, kind, fatal, rejected, wait):
    from collab_env.agents.retries import GiveUp, Retry, classify_error

    out = classify_error(exc)
    if kind == "retry":
        assert isinstance(out, Retry) and out.retry_after == wait
    else:
        assert isinstance(out, GiveUp) and (out.fatal, out.rejected) == (fatal, rejected)


def test_backoff_delay_by_hand():
    import random

    from collab_env.agents.retries import backoff_delay

    # Attempt 3 with base 0.1: 0.4, capped at 0.3, times a uniform draw from [0.5, 1).
    u = random.Random(7).uniform(0.5, 1.0)
    assert backoff_delay(3, None, base=0.1, cap=0.3, rng=random.Random(7)) == 0.3 * u
    assert backoff_delay(1, -5.0, base=0.1, cap=0.3, rng=random.Random(7)) == 0.0
    assert backoff_delay(1, 0.25, base=0.1, cap=0.3, rng=random.Random(7)) == 0.25


# -- issue 42: what the provider takes, and whose fault a rejection is ------------------------------
def test_a_parameter_the_provider_does_not_take_is_dropped_with_one_notice(monkeypatch):
    """``seed`` to Anthropic: litellm would refuse the whole request (UnsupportedParamsError) and
    the eval runner seeds every episode. It is left out, said once; the request goes."""
    import litellm

    sent = []

    async def fake_acompletion(**kw):
        sent.append(kw)
        return litellm.ModelResponse(choices=[{"message": {"role": "assistant", "content": "hi"},
                                               "finish_reason": "stop", "index": 0}])

    monkeypatch.setattr(litellm, "acompletion", fake_acompletion)
    p = LiteLLMPolicy("anthropic/claude-3-5-haiku-latest", api_key="sk-test", limiter=ConcurrencyLimiter(2))
    with pytest.warns(UserWarning, match=r"'anthropic' does not take 'seed'; it is left out") as record:
        out = act(p, ["a", "b"], seed=3, temperature=0)
        act(p, ["c"], seed=4)
    assert [c.text for c in out] == ["hi", "hi"]
    assert len([w for w in record if "does not take" in str(w.message)]) == 1
    assert all("seed" not in kw and kw["temperature"] in (0, 1.0) for kw in sent) and len(sent) == 3


def test_an_openai_compatible_server_keeps_the_seed(server):
    p = policy(server)
    act(p, ["x"], seed=7)
    assert server.requests[-1]["seed"] == 7


def test_only_credential_rejections_blame_the_credentials(server, keyed_server):
    from collab_env.errors import CredentialsError

    server.inject("400")
    with pytest.raises(FatalPolicyError) as info:
        act(policy(server), ["x"])
    assert not isinstance(info.value, CredentialsError)
    assert "credentials" not in str(info.value).lower() and "api_key" not in str(info.value)
    assert "fix the model name, api_base or the request's parameters" in str(info.value)
    p = LiteLLMPolicy("openai/fake-model", api_base=keyed_server.url, api_key="sk-wrong-key-123",
                      limiter=ConcurrencyLimiter(4))
    with pytest.raises(CredentialsError, match="refused the credentials.*set the provider's API key"):
        act(p, ["x"])

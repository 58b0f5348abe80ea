"""The OpenAI-compatible server route: ``vllm serve`` queried over HTTP and through litellm."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import urllib.request

import pytest

from tests_vllm.conftest import SERVED_NAME
from tests_vllm.test_engine import act, chats


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def test_server_answers_like_the_engine(server, policy):
    obs = chats()[:2]
    ref = act(policy, obs, temperature=0, max_new_tokens=16)
    with urllib.request.urlopen(server.base + "/v1/models", timeout=10) as r:
        assert [m["id"] for m in json.loads(r.read())["data"]] == [SERVED_NAME]
    for o, c in zip(obs, ref, strict=True):
        resp = _post(server.base + "/v1/chat/completions", {
            "model": SERVED_NAME, "messages": o.to_chat(), "temperature": 0, "max_tokens": 16,
            "logprobs": True,
        })
        choice = resp["choices"][0]
        assert choice["message"]["content"] == c.text
        assert choice["finish_reason"] == c.finish_reason
        assert resp["usage"]["prompt_tokens"] == len(c.prompt_token_ids)
        lps = [t["logprob"] for t in choice["logprobs"]["content"]]
        # The server reports raw log-probs; at temperature 0 they are the engine's.
        n = min(len(lps), len(c.logprobs))
        assert n > 0 and lps[:n] == pytest.approx(list(c.logprobs[:n]), abs=2e-3)


@pytest.mark.skipif(importlib.util.find_spec("litellm") is None, reason="litellm not installed")
def test_litellm_policy_against_vllm_serve(server, policy):
    from collab_env.agents.litellm import LiteLLMPolicy

    lp = LiteLLMPolicy(f"openai/{SERVED_NAME}", api_base=server.base + "/v1", max_retries=1, timeout=120)
    obs = chats()[:4]
    out = asyncio.run(lp.act(obs, temperature=0, max_new_tokens=16))
    ref = act(policy, obs, temperature=0, max_new_tokens=16)
    assert [c.text for c in out] == [c.text for c in ref]
    assert all(c.usage["completion_tokens"] > 0 for c in out)


@pytest.mark.skipif(importlib.util.find_spec("litellm") is None, reason="litellm not installed")
def test_a_tool_env_against_vllm_serve_without_function_calling(server):
    """``vllm serve`` as users start it (no ``--enable-auto-tool-choice``) refuses a request that
    carries the env's tools: the policy stops with vLLM's own reason and both fixes in one line,
    and ``tool_calls="text"`` (no ``tools=``; calls read from the reply's text) is served."""
    import collab_env
    from collab_env.agents.litellm import LiteLLMPolicy
    from collab_env.errors import FatalPolicyError

    obs, _ = collab_env.make("phone-support-v0").reset(seed=0)
    lp = LiteLLMPolicy(f"openai/{SERVED_NAME}", api_base=server.base + "/v1", max_retries=1, timeout=120)
    with pytest.raises(FatalPolicyError) as err:
        asyncio.run(lp.act([obs["assistant"]], temperature=0, max_new_tokens=16))
    msg = str(err.value)
    assert "tool choice requires --enable-auto-tool-choice" in msg and "tool_calls='text'" in msg, msg
    text = LiteLLMPolicy(f"openai/{SERVED_NAME}", api_base=server.base + "/v1", max_retries=1, timeout=120,
                         tool_calls="text")
    [c] = asyncio.run(text.act([obs["assistant"]], temperature=0, max_new_tokens=16))
    assert not c.is_fault and c.usage["completion_tokens"] > 0

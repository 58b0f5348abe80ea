"""LiteLLMPolicy with function calling, over real HTTP on 127.0.0.1 (the fake OpenAI server):
the env's tools go out as the request's ``tools=``, an API ``tool_calls`` answer becomes the move
the env reads, and a whole phone-support-v0 episode is won through the API (issue 46)."""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("litellm")
pytest.importorskip("aiohttp")

import collab_env  # noqa: E402
from collab_env.agents.limiter import ConcurrencyLimiter  # noqa: E402
from collab_env.agents.litellm import LiteLLMPolicy  # noqa: E402
from collab_env.errors import ConfigError  # noqa: E402
from collab_env.rollout import run_episode  # noqa: E402
from collab_env.tasks.phone_support import ASSISTANT_TOOLS, PhoneSupportReference, PhoneSupportUser  # noqa: E402
from collab_env.testing.openai_server import FakeOpenAIServer  # noqa: E402
from collab_env.types import Conversation, Message, Tool, ToolCall, parse_tool_call  # noqa: E402

pytestmark = pytest.mark.timeout(60)


def policy(srv: FakeOpenAIServer, **kw) -> LiteLLMPolicy:
    return LiteLLMPolicy("openai/fake-model", api_base=srv.url, limiter=ConcurrencyLimiter(8), timeout=5.0,
                         backoff_base=0.01, backoff_max=0.05, **kw)


def reference_over_the_api(body: dict) -> str | dict:
    """A function-calling "model": the reference assistant played on the chat the request carries.
    It makes a call only as the API does (``tool_calls``, content ``None``) and only with a tool
    the request declares; without it, it says so (and the episode is lost)."""
    names: dict[str, str] = {}
    msgs = []
    for m in body["messages"]:
        for c in m.get("tool_calls") or ():
            names[c["id"]] = c["function"]["name"]
        if m["role"] == "tool":
            meta = {"name": names[m["tool_call_id"]], "ok": not m["content"].startswith("error")}
            msgs.append(Message("tool", m["content"], tool_call_id=m["tool_call_id"], meta=meta))
        else:
            author = {"assistant": "assistant", "user": "user"}.get(m["role"], "env")
            msgs.append(Message(m["role"], m.get("content") or "", author=author))
    text = PhoneSupportReference().respond(Conversation(tuple(msgs), viewer="assistant"), None)
    tools = [Tool.from_dict(t) for t in body.get("tools") or ()]
    call = parse_tool_call(text, tools, f"call_{len(body['messages'])}")
    if isinstance(call, ToolCall):
        return {"content": None, "tool_calls": [{"id": call.id, "type": "function", "function": {
            "name": call.name, "arguments": json.dumps(dict(call.arguments))}}]}
    if call is not None:
        return "I have no tools to call."
    return text


def test_a_phone_support_episode_is_won_through_api_tool_calls():
    with FakeOpenAIServer(reply=reference_over_the_api) as srv:
        ep = run_episode(collab_env.make("phone-support-v0"),
                         {"assistant": policy(srv), "user": PhoneSupportUser()}, seed=2, index=5)
        requests = list(srv.requests)
    assert ep.returns["assistant"] == 1.0  # the final state is the goal's
    calls = [m for m in ep.conversation if m.author == "assistant" and m.tool_calls]
    results = [m for m in ep.conversation if m.role == "tool" and m.audience == ("assistant",)]
    assert calls and len(results) == len(calls) and all(r.meta["ok"] for r in results)
    # the move is the API's call in the one format: the env parsed it and ran it
    assert calls[0].content == json.dumps({"name": "lookup_account", "arguments": calls[0].tool_calls[0].arguments})
    assert all(r["tools"] == [t.to_openai() for t in ASSISTANT_TOOLS] for r in requests)
    last = requests[-1]["messages"]
    sent_calls = [m for m in last if m.get("tool_calls")]
    assert len(sent_calls) == len(calls)
    for m in sent_calls:  # a call goes back once, as the API's fields, never also as text
        assert m.get("content") is None and isinstance(m["tool_calls"][0]["function"]["arguments"], str)
        k = last.index(m)
        assert last[k + 1] == {"role": "tool", "content": last[k + 1]["content"],
                               "tool_call_id": m["tool_calls"][0]["id"]}
    assert not any('"name"' in (m.get("content") or "") for m in last if m["role"] == "assistant")


def test_without_api_tools_the_same_model_fails():
    """The check above can fail: with ``tool_calls="text"`` no ``tools=`` is sent, this model
    cannot call, and the episode is lost."""
    with FakeOpenAIServer(reply=reference_over_the_api) as srv:
        ep = run_episode(collab_env.make("phone-support-v0", max_steps=6),
                         {"assistant": policy(srv, tool_calls="text"), "user": PhoneSupportUser()}, seed=2, index=5)
        requests = list(srv.requests)
    assert ep.returns["assistant"] == 0.0
    assert requests and not any("tools" in r for r in requests)


def test_api_call_arguments_that_are_not_json_get_the_envs_one_line_error():
    def bad(body):
        return {"content": "Let me look.", "tool_calls": [
            {"id": "x1", "type": "function", "function": {"name": "lookup_account", "arguments": "{oops"}},
            {"id": "x2", "type": "function", "function": {"name": "resume_line", "arguments": "{}"}}]}

    env = collab_env.make("phone-support-v0")
    obs, _ = env.reset(seed=0)
    with FakeOpenAIServer(reply=bad) as srv:
        [c] = asyncio.run(policy(srv).act([obs["assistant"]]))
    assert c.meta["tool_calls_dropped"] == 1 and c.meta["text_beside_tool_call"] == "Let me look."
    obs, *_ = env.step({"assistant": c.text})
    result = obs["assistant"][-1]
    assert result.role == "tool" and result.meta == {"name": "lookup_account", "ok": False}
    assert result.content.startswith("error: the arguments of 'lookup_account' are a string that is not JSON.")


def test_bad_tool_call_mode_is_a_one_line_error():
    with pytest.raises(ConfigError, match="tool_calls must be one of"):
        LiteLLMPolicy("openai/x", tool_calls="json")
    with pytest.raises(ConfigError, match="completion_kwargs may not set"):
        LiteLLMPolicy("openai/x", completion_kwargs={"tools": []})


def test_the_fake_server_answers_tool_calls_plain_and_streamed():
    import urllib.request

    call = {"id": "c9", "type": "function", "function": {"name": "resume_line", "arguments": "{}"}}
    with FakeOpenAIServer(reply=lambda body: {"content": None, "tool_calls": [call]}) as srv:
        def post(stream):
            req = urllib.request.Request(srv.url + "/chat/completions", method="POST",
                                         headers={"Content-Type": "application/json"},
                                         data=json.dumps({"model": "m", "messages": [], "stream": stream}).encode())
            with urllib.request.urlopen(req, timeout=5) as r:  # noqa: S310 (127.0.0.1)
                return r.read().decode()

        plain = json.loads(post(False))["choices"][0]
        chunks = [json.loads(line[6:]) for line in post(True).splitlines()
                  if line.startswith("data: {")]
    assert plain["message"]["tool_calls"] == [call] and plain["finish_reason"] == "tool_calls"
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert [d["tool_calls"] for d in deltas if "tool_calls" in d] == [[{"index": 0, **call}]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"

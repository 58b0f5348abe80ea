"""The fake OpenAI server's streaming answers (server-sent events, as verifiers' harnesses ask)."""

from __future__ import annotations

import json

import aiohttp

from collab_env._async import run_sync
from collab_env.testing.openai_server import FakeOpenAIServer


async def _post(url: str, body: dict) -> tuple[str, str]:
    async with aiohttp.ClientSession() as s, s.post(f"{url}/chat/completions", json=body) as r:
        return r.headers["Content-Type"], await r.text()


def test_stream_sends_the_reply_as_chunks_then_usage_and_done():
    with FakeOpenAIServer(reply=lambda body: "  two words \n") as srv:
        ctype, text = run_sync(_post(srv.url, {"model": "m", "stream": True,
                                               "stream_options": {"include_usage": True},
                                               "messages": [{"role": "user", "content": "a b c"}]}))
    assert ctype.startswith("text/event-stream")
    events = [e for e in text.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    chunks = [json.loads(e[len("data: "):]) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert deltas[0] == {"role": "assistant", "content": ""}
    # The pieces join to the exact reply, whitespace included.
    assert "".join(d.get("content", "") for d in deltas) == "  two words \n"
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == {
        "prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}


def test_stream_without_usage_and_faults_stay_json():
    with FakeOpenAIServer() as srv:
        _, text = run_sync(_post(srv.url, {"stream": True, "messages": [{"role": "user", "content": "hi"}]}))
        srv.inject("429")
        ctype, err = run_sync(_post(srv.url, {"stream": True, "messages": []}))
    chunks = [json.loads(e[len("data: "):]) for e in text.split("\n\n") if e and e != "data: [DONE]"]
    assert all(c["choices"] for c in chunks)  # no usage chunk unless asked
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == "echo: hi"
    assert ctype.startswith("application/json") and json.loads(err)["error"]["type"] == "rate_limit_error"

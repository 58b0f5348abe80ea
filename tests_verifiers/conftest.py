"""Fixtures of the verifiers adapter's tests (run in .venv-verifiers: `make test-verifiers`).

The model is collab_env's fake OpenAI server (SSE streaming, as verifiers' harnesses need) with
a deterministic reply function :func:`reply` that plays the reference policies of the suites, so
a test can play the very same replies through collab_env's own driver and compare.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from collab_env.tasks.cooperative import LengthRatioPartner
from collab_env.tasks.hidden_facts import AnswerAtOnce, AskThenAnswer
from collab_env.testing.openai_server import FakeOpenAIServer
from collab_env.types import Conversation, Message


def text_of(content: Any) -> str:
    """The text of an OpenAI message ``content`` (a string or a list of text parts)."""
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content or [] if isinstance(part, dict))


def plain(messages: list[dict[str, Any]]) -> list[dict[str, str]]:
    """``[{"role", "content"}]`` with text content only (what a collab_env view renders)."""
    return [{"role": m["role"], "content": text_of(m.get("content"))} for m in messages]


def reply(messages: list[dict[str, Any]]) -> str:
    """The model's reply to a chat: the length-ratio partner's answers (the detailed one at a
    ratio that depends on the task, so rewards vary), or for hidden-facts the reference
    assistant ``AskThenAnswer``, except ``AnswerAtOnce`` when the opening has odd length (so
    some episodes fail); for team-facts agents, the coordinated reference team."""
    if any(m.get("role") == "tool" for m in messages) or "lookup_account" in json.dumps(messages[:1]):
        return phone_support_reply(messages)
    chat = plain(messages)
    if chat and chat[0]["role"] == "system" and "TEAM:" in chat[0]["content"]:  # team-facts agents
        from collab_env.tasks.team import CoordinatedTeam

        return CoordinatedTeam().respond(Conversation.from_chat(chat), None)
    opening = next(m["content"] for m in chat if m["role"] == "user")
    task = opening.rsplit("\n\n", 1)[-1].strip()
    if "brief response" in opening:
        return LengthRatioPartner.brief_answer(task)
    if "detailed response" in opening:
        return LengthRatioPartner.detailed_answer(task, ratio=1.5 + 0.5 * (len(task) % 4))
    policy = AnswerAtOnce() if len(opening) % 2 else AskThenAnswer()
    return policy.respond(Conversation.from_chat(chat, viewer="assistant"), None)


def phone_support_reply(messages: list[dict[str, Any]]) -> str:
    """phone-support's reference assistant on a chat as a server receives it, its calls written
    as text (no ``tools=``): each tool result is read as the answer to the call in the assistant
    message before it (the chat carries no tool names), as a model would read it."""
    from collab_env.tasks.phone_support import PhoneSupportReference

    msgs, last_call = [], None
    for m in messages:
        text = text_of(m.get("content"))
        if m["role"] == "assistant":
            call = text.strip()
            last_call = json.loads(call).get("name") if call.startswith("{") else None
        if m["role"] == "tool":
            meta = {"name": last_call, "ok": not text.startswith("error")}
            msgs.append(Message("tool", text, tool_call_id=m.get("tool_call_id") or "x", meta=meta))
        else:
            author = {"assistant": "assistant", "user": "user"}.get(m["role"], "env")
            msgs.append(Message(m["role"], text, author=author))
    return PhoneSupportReference().respond(Conversation(tuple(msgs), viewer="assistant"), None)


@pytest.fixture(scope="session")
def model_server():
    """The fake OpenAI server answering with :func:`reply`, for the whole session."""
    with FakeOpenAIServer(reply=lambda body: reply(body.get("messages", []))) as srv:
        yield srv

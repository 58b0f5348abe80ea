"""Fixtures of the verifiers adapter's tests (run in .venv-verifiers: `make test-verifiers`).

The model is collab_env's fake OpenAI server (SSE streaming, as verifiers' harnesses need) with
a deterministic reply function :func:`reply` that plays the reference policies of the suites, so
a test can play the very same replies through collab_env's own driver and compare.
"""

from __future__ import annotations

from typing import Any

import pytest

from collab_env.tasks.cooperative import LengthRatioPartner
from collab_env.tasks.hidden_facts import AnswerAtOnce, AskThenAnswer
from collab_env.testing.openai_server import FakeOpenAIServer
from collab_env.types import Conversation


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


@pytest.fixture(scope="session")
def model_server():
    """The fake OpenAI server answering with :func:`reply`, for the whole session."""
    with FakeOpenAIServer(reply=lambda body: reply(body.get("messages", []))) as srv:
        yield srv

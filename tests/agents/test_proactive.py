"""Proactive: the collaborative prompt reaches the inner policy, the env's own prompt survives."""

from __future__ import annotations

import asyncio

import pytest

import collab_env
from collab_env.agents.proactive import COLLABORATIVE_PROMPT, Proactive
from collab_env.errors import ConfigError
from collab_env.rollout import run_episode
from collab_env.tasks.hidden_facts import ASSISTANT_PROMPT, HiddenFactsUser
from collab_env.types import Completion, Conversation, Message


class Recorder:
    """Inner policy that records what it was shown and answers with a fixed text."""

    name = "recorder"

    def __init__(self, text="\\boxed{0}"):
        self.text = text
        self.seen: list[Conversation] = []
        self.sampling: list[dict] = []

    async def act(self, observations, **sampling):
        self.seen.extend(observations)
        self.sampling.append(dict(sampling))
        return [Completion(text=self.text) for _ in observations]


def conv(*msgs, viewer="assistant"):
    return Conversation(tuple(msgs), viewer)


SYS = Message(role="system", content="Answer in \\boxed{}.", audience=("assistant",))
HI = Message(role="user", content="hi", author="user")


def test_prepend_merges_into_the_first_system_message():
    inner = Recorder()
    asyncio.run(Proactive(inner).act([conv(SYS, HI)], seed=3))
    [seen] = inner.seen
    assert [m.role for m in seen] == ["system", "user"]
    assert seen[0].content == COLLABORATIVE_PROMPT + "\n\nAnswer in \\boxed{}."
    assert seen[1] == HI and seen.viewer == "assistant"
    assert inner.sampling == [{"seed": 3}]


def test_inserted_when_no_system_message():
    inner = Recorder()
    asyncio.run(Proactive(inner, system_prompt="Ask first.").act([conv(HI)]))
    assert [(m.role, m.content) for m in inner.seen[0]] == [("system", "Ask first."), ("user", "hi")]
    assert inner.seen[0][0].audience == ("assistant",)


def test_replace_drops_other_system_messages():
    inner = Recorder()
    other = Message(role="system", content="second", audience=("assistant",))
    asyncio.run(Proactive(inner, placement="replace").act([conv(SYS, HI, other)]))
    assert [(m.role, m.content) for m in inner.seen[0]] == [("system", COLLABORATIVE_PROMPT), ("user", "hi")]


def test_batch_is_passed_through_in_one_call():
    inner = Recorder()
    out = asyncio.run(Proactive(inner).act([conv(HI), conv(SYS, HI)]))
    assert len(out) == 2 and len(inner.sampling) == 1
    assert all(o[0].content.startswith(COLLABORATIVE_PROMPT) for o in inner.seen)


def test_in_an_episode_the_assistant_sees_both_prompts():
    inner = Recorder("Which items, and how many of each?")
    env = collab_env.make("hidden-facts")
    ep = run_episode(env, {"assistant": Proactive(inner), "user": HiddenFactsUser()}, seed=2)
    first = inner.seen[0]
    assert first.system_prompt == COLLABORATIVE_PROMPT + "\n\n" + ASSISTANT_PROMPT
    assert "You know these facts" not in "".join(m.content for m in first)  # no leak of the user's goal
    assert ep.info["policies"]["assistant"] == "proactive(recorder)"
    # The transcript itself is unchanged: the prompt lives only in what the policy is shown.
    assert COLLABORATIVE_PROMPT not in ep.conversation.render()


def test_bad_arguments():
    with pytest.raises(ConfigError):
        Proactive(Recorder(), placement="append")
    with pytest.raises(ConfigError):
        Proactive(Recorder(), system_prompt="")

import pickle

import gymnasium
import pytest

from collab_env.spaces import Chat, UnicodeText
from collab_env.types import Conversation, Message

REAL_TEXT = ["", "plain", "emoji 😀🤖", "中文 日本語 한국어", "“curly” ‘quotes’ — dash…", "line\nbreaks\r\n\ttabs",
             "\x00nul", "a" * 5000]


@pytest.mark.parametrize("text", REAL_TEXT)
def test_real_llm_text_is_inside(text):
    assert UnicodeText(10_000).contains(text)


def test_bounds_and_types():
    s = UnicodeText(5, min_length=1)
    assert not s.contains("")
    assert not s.contains("123456")
    assert not s.contains(b"bytes")
    assert not s.contains(3)
    with pytest.raises(ValueError):
        UnicodeText(3, min_length=4)


def test_sampling_is_seeded_and_varied():
    a, b = UnicodeText(seed=3), UnicodeText(seed=3)
    xs = [a.sample() for _ in range(50)]
    assert xs == [b.sample() for _ in range(50)]
    assert all(a.contains(x) for x in xs)
    joined = "".join(xs)
    assert any(ord(c) > 0x4E00 for c in joined) and any(c.isascii() for c in joined)
    assert len(set(xs)) > 40


def test_chat_space():
    space = Chat(max_messages=3, seed=1)
    conv = space.sample()
    assert space.contains(conv)
    assert not space.contains([{"role": "user", "content": "x"}])
    too_long = Conversation(tuple(Message("user", "x", author="user") for _ in range(4)))
    assert not space.contains(too_long)
    assert pickle.loads(pickle.dumps(space)) == space
    assert isinstance(space, gymnasium.spaces.Space)


def test_seed_later_samples_as_seed_and_a_seeded_reset_still_seeds_a_held_space():
    """An env's seeded reset seeds its action spaces lazily (at the first sample): the samples are
    those of seeding at reset, also through a space object held since before the reset (the
    single-agent view's ``action_space`` attribute)."""
    import collab_env

    now, later = UnicodeText(), UnicodeText()
    now.seed(11)
    later.seed_later(11)
    assert [now.sample() for _ in range(3)] == [later.sample() for _ in range(3)]
    view = collab_env.make("length-ratio", view="agent_0")
    held = view.action_space
    view.reset(seed=3)
    first = held.sample()
    view.reset(seed=3)
    assert held.sample() == first
    fresh = UnicodeText(view.action_space.max_length)
    fresh.seed(3)  # agent_0 is player 0: seed + 0
    assert fresh.sample() == first

import pickle

import pytest

from collab_env.errors import ConfigError
from collab_env.types import Completion, Conversation, Episode, Message, TurnRecord


def _conv():
    return Conversation((
        Message("system", "assistant rules", audience=("assistant",)),
        Message("system", "hidden goal", audience=("user",), meta={"hidden": {"x": 1}}),
        Message("user", "hi", author="user"),
        Message("assistant", "hello, what do you need?", author="assistant", trainable=True),
        Message("user", "a number", author="user"),
    ))


def test_view_filters_audience_and_remaps_roles():
    conv = _conv()
    a = conv.view("assistant")
    assert [m.content for m in a] == ["assistant rules", "hi", "hello, what do you need?", "a number"]
    assert [m.role for m in a] == ["system", "user", "assistant", "user"]
    u = conv.view("user")
    assert [m.content for m in u] == ["hidden goal", "hi", "hello, what do you need?", "a number"]
    # the user's own messages are "assistant" from its side, the assistant's are "user"
    assert [m.role for m in u] == ["system", "assistant", "user", "assistant"]
    assert u.viewer == "user" and a.viewer == "assistant"
    # authors survive the remap, so a policy can still tell speakers apart
    assert [m.author for m in u][1:] == ["user", "assistant", "user"]


def test_to_chat_and_round_trip():
    conv = _conv()
    chat = conv.view("assistant").to_chat()
    assert chat[0] == {"role": "system", "content": "assistant rules"}
    again = Conversation.from_dict(conv.to_dict())
    assert again == conv
    assert pickle.loads(pickle.dumps(conv)) == conv
    assert Conversation.from_chat([{"role": "user", "content": "x"}])[0].author == "user"


def test_message_validation():
    with pytest.raises(ConfigError, match="role"):
        Message("robot", "x")
    with pytest.raises(ConfigError, match="must be str"):
        Message("user", 3)  # type: ignore[arg-type]
    m = Message("user", "", author="user")
    assert m.content == "" and hash(m) == hash(Message("user", "", author="user"))


def test_conversation_queries_and_slicing():
    conv = _conv()
    assert conv.last(author="user").content == "a number"
    assert conv.last(role="assistant").content.startswith("hello")
    assert conv.last(author="nobody") is None
    assert isinstance(conv[1:3], Conversation) and len(conv[1:3]) == 2
    assert conv.append(Message("user", "more", author="user"))[-1].content == "more"
    assert len(conv) == 5  # append returns a new conversation
    assert "assistant rules" in conv.system_prompt
    assert "(visible to user)" in conv.render()
    assert "hidden goal" not in conv.render(show_hidden=False)


def test_completion_checks_lengths():
    c = Completion("ab", token_ids=[1, 2], logprobs=[-0.1, -0.2])
    assert c.token_ids == (1, 2)
    with pytest.raises(ConfigError, match="token ids"):
        Completion("ab", token_ids=[1, 2], logprobs=[-0.1])
    assert Completion.from_dict(c.to_dict()) == c


def test_episode_json_round_trip_with_odd_text():
    conv = _conv().append(Message("assistant", "\ud800 😀 中文", author="assistant"))
    ep = Episode(
        env_id="x-v0", seed=1, index=2, conversation=conv,
        turns=[TurnRecord(0, "assistant", "t", 1.0, Completion("t", token_ids=[5], logprobs=[-1.0]), True,
                          {"accuracy": 1.0})],
        rewards={"assistant": [1.0], "user": [1.0]}, returns={"assistant": 1.0, "user": 1.0},
        terminated=True, end_reason="answered",
    )
    line = ep.to_json()
    assert "\n" not in line and line.isascii()
    back = Episode.from_json(line)
    assert back.conversation == ep.conversation
    assert back.turns[0].completion == ep.turns[0].completion
    assert back.to_dict() == ep.to_dict()
    assert back.num_steps == 1 and len(back.completions("assistant")) == 1


def test_to_dict_writes_every_field_as_asdict_would():
    """Message.to_dict and Completion.to_dict name their fields one by one (dataclasses.asdict
    deep-copied each, most then replaced); a field added later must be written too, with the
    value asdict gives, containers as lists and mappings as their own copies."""
    from dataclasses import asdict, fields

    from collab_env.types import ToolCall

    call = ToolCall(id="c1", name="lookup", arguments={"q": "x"})
    m = Message("assistant", "hi", author="a", trainable=True, audience=("a",), meta={"k": [1, {"n": 2}]},
                tool_calls=(call,))
    d = m.to_dict()
    assert set(d) == {f.name for f in fields(Message)} - {"tool_call_id"}
    ref = asdict(m)
    ref.update(audience=["a"], tool_calls=[call.to_dict()])
    del ref["tool_call_id"]  # written only when set, as tool_calls
    assert d == ref and d["meta"] is not m.meta
    assert set(Message("tool", "r", tool_call_id="c1").to_dict()) == {f.name for f in fields(Message)} - {"tool_calls"}
    c = Completion("t", token_ids=(1, 2), logprobs=(-0.1, -0.2), prompt_token_ids=(5,), finish_reason="stop",
                   usage={"prompt_tokens": 1.0}, meta={"m": 1})
    cd = c.to_dict()
    ref = {**asdict(c), "token_ids": [1, 2], "logprobs": [-0.1, -0.2], "prompt_token_ids": [5]}
    assert cd == ref and list(cd) == [f.name for f in fields(Completion)] and cd["usage"] is not c.usage

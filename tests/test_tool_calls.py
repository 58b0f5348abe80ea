"""Tool calls and tool results in the core types, and tools run by the env on a player's step."""

import json
import pickle
from dataclasses import replace

import pytest

import collab_env
from collab_env.env import CollabEnv, Outcome, Start, Task, env_message
from collab_env.errors import ActionError, ConfigError
from collab_env.registry import spec
from collab_env.types import (
    Conversation,
    Episode,
    Message,
    Tool,
    ToolCall,
    ToolCallError,
    parse_tool_call,
)

ADD = Tool("add", "Add two integers.", {"type": "object", "properties": {"a": {"type": "integer"},
                                                                      "b": {"type": "integer"}},
                                         "required": ["a", "b"], "additionalProperties": False})
MODE = Tool("set_mode", "Set the mode.", {"type": "object", "properties": {"mode": {"enum": ["fast", "slow"]}},
                                          "required": ["mode"]})


def _tool_conv():
    call = ToolCall("call_1", "add", {"a": 2, "b": 3})
    return Conversation((
        Message("system", "rules", audience=("assistant",), meta={"tools": [ADD.to_openai()]}),
        Message("user", "what is 2+3?", author="user"),
        Message("assistant", '{"name": "add", "arguments": {"a": 2, "b": 3}}', author="assistant",
                trainable=True, audience=("assistant",), tool_calls=(call,)),
        Message("tool", "5", audience=("assistant",), tool_call_id="call_1", meta={"name": "add"}),
        Message("assistant", "It is 5.", author="assistant", trainable=True),
    ))


def test_tool_messages_round_trip_through_dict_chat_json_and_pickle():
    conv = _tool_conv()
    assert Conversation.from_dict(conv.to_dict()) == conv
    assert pickle.loads(pickle.dumps(conv)) == conv
    chat = conv.to_chat()
    assert chat[2]["tool_calls"] == [{"id": "call_1", "type": "function",
                                      "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}]
    assert chat[3] == {"role": "tool", "content": "5", "tool_call_id": "call_1"}
    back = Conversation.from_chat(chat)
    assert [m.tool_calls for m in back] == [m.tool_calls for m in conv]
    assert [m.tool_call_id for m in back] == [m.tool_call_id for m in conv]
    # an OpenAI API's form: arguments as a JSON string, content None beside the calls
    api = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c9", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 1}'}}]}
    m = Message.from_dict(api)
    assert m.content == "" and m.tool_calls == (ToolCall("c9", "add", {"a": 1, "b": 1}),)
    ep = Episode(env_id=None, seed=0, index=0, conversation=conv)
    assert Episode.from_json(ep.to_json()).conversation == conv


def test_messages_without_tools_write_what_they_always_wrote():
    m = Message("user", "hi", author="user")
    assert set(m.to_dict()) == {"role", "content", "author", "trainable", "audience", "meta"}
    assert m.to_chat() == {"role": "user", "content": "hi"}
    # an episode line saved before tools existed still loads
    old = {"role": "assistant", "content": "x", "author": "assistant", "trainable": True,
           "audience": None, "meta": {}}
    assert Message.from_dict(old) == Message("assistant", "x", author="assistant", trainable=True)


def test_tool_message_validation():
    with pytest.raises(ConfigError, match="tool_call_id"):
        Message("tool", "5")
    with pytest.raises(ConfigError, match="tool_call_id"):
        Message("user", "5", tool_call_id="c")
    with pytest.raises(ConfigError, match="cannot make tool calls"):
        Message("system", "x", tool_calls=(ToolCall("c", "add"),))
    with pytest.raises(ConfigError, match="JSON-schema keyword"):
        Tool("t", "d", {"type": "object", "properties": {"x": {"type": "string", "pattern": "a+"}}})
    with pytest.raises(ConfigError, match="tool name"):
        Tool("bad name", "d")


def test_view_keeps_tool_calls_for_the_caller_only():
    conv = _tool_conv()
    a = conv.view("assistant")
    assert [m.role for m in a] == ["system", "user", "assistant", "tool", "assistant"]
    assert a[2].tool_calls and a.tools == [ADD.to_openai()]
    # a public message with tool calls reads as plain text from the other side
    pub = Conversation((Message("assistant", "{}", author="assistant", tool_calls=(ToolCall("c", "add"),)),))
    u = pub.view("user")
    assert u[0].role == "user" and u[0].tool_calls == () and u.tools == []


@pytest.mark.parametrize("text,reason", [
    ('{"name": "add", "arguments": {"a": 1', "not valid JSON"),
    ('{"name": "mul", "arguments": {}}', "no tool 'mul'"),
    ('{"name": "add", "arguments": {"a": 1}}', "missing the required argument"),
    ('{"name": "add", "arguments": {"a": 1, "b": "2"}}', "arguments.b must be of type integer"),
    ('{"name": "add", "arguments": {"a": 1, "b": 2, "c": 3}}', "unknown argument"),
    ('{"name": "add", "arguments": {"a": true, "b": 2}}', "arguments.a must be of type integer"),
    ('{"name": "set_mode", "arguments": {"mode": "warp"}}', "must be one of"),
    ('{"tool": "add"}', 'no "name"'),
    ('{"name": "add", "args": {}}', "unknown key"),
    ('{"name": "add", "arguments": [1, 2]}', "must be a JSON object"),
])
def test_malformed_calls_get_a_reason_and_the_format(text, reason):
    out = parse_tool_call(text, [ADD, MODE], "c1")
    assert isinstance(out, ToolCallError)
    assert reason in out.reason and '{"name": "<tool name>"' in out.reason
    assert out.call.id == "c1"


def test_parse_reads_the_one_format_and_leaves_text_alone():
    assert parse_tool_call("The answer is 5.", [ADD], "c") is None
    assert parse_tool_call('  {"name": "add", "arguments": {"a": 1, "b": 2}}\n', [ADD], "c") == \
        ToolCall("c", "add", {"a": 1, "b": 2})
    # OpenAI writes the arguments as a JSON string
    assert parse_tool_call('{"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 2}"}', [ADD], "c") == \
        ToolCall("c", "add", {"a": 1, "b": 2})


class _Counter(Task):
    """A tiny task with one tool: the assistant adds to a counter, then says 'done'."""

    players = ("assistant", "user")
    user_players = ("user",)
    turn_order = (("assistant",), ("user",))

    def get_item(self, index):
        return {"target": 5}

    def tools(self, player):
        return (ADD,) if player == "assistant" else ()

    def start(self, state, options):
        state.data["total"] = 0
        return Start([env_message("add up to 5", role="system", audience=("assistant",),
                                  meta={"tools": [ADD.to_openai()]})], ("assistant",))

    def call_tool(self, state, player, call):
        if call.arguments["a"] < 0:
            raise ActionError("negative numbers are refused")
        state.data["total"] += call.arguments["a"] + call.arguments["b"]
        return str(state.data["total"])

    def step(self, state, moves, final):
        if "assistant" in moves:
            ok = float(state.data["total"] == state.item["target"])
            return Outcome(rewards={"assistant": ok}, terminated=True, reason="answered")
        return Outcome()


def test_env_runs_tools_on_the_callers_step_and_counts_errors():
    env = CollabEnv(_Counter())
    env.reset(seed=0)
    obs, rew, term, trunc, infos = env.step({"assistant": '{"name": "add", "arguments": {"a": 2, "b": 3}}'})
    assert infos["assistant"]["on_turn"] and not infos["user"]["on_turn"]  # the caller stays on turn
    assert infos["assistant"]["tool_call"] == {"name": "add", "id": "call_0_assistant", "ok": True}
    assert obs["assistant"][-1].role == "tool" and obs["assistant"][-1].content == "5"
    assert obs["assistant"][-2].tool_calls == (ToolCall("call_0_assistant", "add", {"a": 2, "b": 3}),)
    assert len(obs["user"]) == 0  # neither the call nor its result reach the other player
    _, _, _, _, infos = env.step({"assistant": '{"name": "add", "arguments": {"a": -1, "b": 1}}'})
    assert infos["assistant"]["tool_call"]["ok"] is False
    assert "negative numbers are refused" in env.observe("assistant")[-1].content
    _, _, _, _, infos = env.step({"assistant": '{"name": "add" "arguments"}'})
    assert "not valid JSON" in infos["assistant"]["tool_call"]["error"]
    assert env.episode.tool_calls == {"assistant": 3} and env.episode.tool_errors == {"assistant": 2}
    clone = env.clone()
    _, rew, term, _, _ = env.step({"assistant": "done"})
    assert term["assistant"] and rew["assistant"] == 1.0
    assert clone.episode.tool_calls == {"assistant": 3}  # the clone kept its own counts


def test_driver_counts_tool_calls_in_the_episode_costs():
    from collab_env.policy import FixedTextPolicy
    from collab_env.rollout import run_episode

    env = CollabEnv(_Counter(), max_steps=3)
    ep = run_episode(env, {"assistant": FixedTextPolicy('{"name": "add", "arguments": {"a": 9}}'),
                           "user": FixedTextPolicy("ok")}, seed=0)
    assert ep.costs["tool_calls"] == 3.0 and ep.costs["tool_errors"] == 3.0
    # the budget's last step goes to the task to score, even when it was a call (total 0: wrong)
    assert ep.num_steps == 3 and ep.returns["assistant"] == 0.0
    assert all("missing the required argument" in m.content for m in ep.conversation if m.role == "tool")


def test_chat_template_gets_tool_calls_results_and_tools(tiny_dir):
    """A tools-aware template (written here, Jinja as HF templates are) renders what
    ``chat_prompt_text`` passes: the messages' tool calls and results and ``tools=``."""
    from collab_env.agents.tokens import chat_prompt_text
    from collab_env.testing.tiny_model import load_tiny_chat_model

    _, tok = load_tiny_chat_model(tiny_dir)
    tok.chat_template = (
        "{% if tools %}TOOLS:{% for t in tools %} {{ t.function.name }}{% endfor %}\n{% endif %}"
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}"
        "{% for c in m.tool_calls or [] %}[call {{ c.id }} {{ c.function.name }} {{ c.function.arguments | tojson }}]"
        "{% endfor %}{% if m.tool_call_id %}[for {{ m.tool_call_id }}]{% endif %}\n{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}")
    text = chat_prompt_text(tok, _tool_conv().view("assistant"))
    assert text.startswith("TOOLS: add")
    # the call is rendered once, from the text the model wrote (types.template_chat), not again
    # by the template from tool_calls; the result keeps its call's id
    assert '<assistant>{"name": "add", "arguments": {"a": 2, "b": 3}}<tool>' in text and "[call" not in text
    assert "<tool>5[for call_1]" in text
    # a call that came with no text (as an API returns it) is the template's to render
    conv = _tool_conv()
    no_text = Conversation(tuple(replace(m, content="") if m.tool_calls else m for m in conv), conv.viewer)
    text = chat_prompt_text(tok, no_text.view("assistant"))
    assert '<assistant>[call call_1 add {"a": 2, "b": 3}]' in text


def test_phone_support_is_listed_with_tools_in_its_card():
    s = spec("phone-support-v0")
    assert "lookup_account" in s.card.players["assistant"]
    env = collab_env.make("phone-support-v0")
    obs, _ = env.reset(seed=0)
    names = [t["function"]["name"] for t in obs["assistant"].tools]
    assert names == ["lookup_account", "resume_line"]
    assert "set_apn" in [t["function"]["name"] for t in obs["user"].tools]
    assert json.dumps(obs["assistant"].tools)  # JSON as a chat template or an API takes it

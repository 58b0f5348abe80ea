"""A chat template that renders ``tool_calls`` itself (Qwen2.5's way, written here in our own
words) renders a call once, from the text the model wrote, and the ids a model generated for a
call stay exactly those ids in the prompts and the loss masks built after it
(:func:`collab_env.types.template_chat`; the rule is in docs/tool_calls.md)."""

import pytest

import collab_env

pytest.importorskip("transformers")

#: Tools in a system block, tool results as user turns in <tool_response>, an assistant turn's
#: content followed by one <tool_call> block per entry of its tool_calls.
TOOLS_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n# Tools\n{% for t in tools %}{{ t.function.name + '\n' }}{% endfor %}"
    "<|im_end|>\n{% endif %}"
    "{%- for m in messages %}{{ '<|im_start|>' + ('user' if m.role == 'tool' else m.role) + '\n' }}"
    "{%- if m.role == 'tool' %}{{ '<tool_response>\n' + m.content + '\n</tool_response>' }}"
    "{%- else %}{{ m.content }}{% endif %}"
    "{%- for c in m.tool_calls or [] %}{{ '\n<tool_call>\n' }}"
    "{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}{{ '\n</tool_call>' }}{% endfor %}"
    "{{ '<|im_end|>\n' }}{% endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@pytest.fixture
def tok(tiny_dir):
    from collab_env.testing.tiny_model import load_tiny_chat_model

    _, tokenizer = load_tiny_chat_model(tiny_dir)
    tokenizer.chat_template = TOOLS_TEMPLATE
    return tokenizer


def test_the_template_renders_tool_calls_itself(tok):
    """The template really is tools-aware: a call with no text is rendered from tool_calls."""
    from collab_env.types import ToolCall

    chat = [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": "", "tool_calls": [ToolCall("c1", "f", {"x": 1}).to_chat()]},
            {"role": "tool", "content": "ok", "tool_call_id": "c1"}]
    text = tok.apply_chat_template(chat, tokenize=False, tools=[{"type": "function", "function": {"name": "f"}}])
    assert "# Tools\nf\n" in text and '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>' in text
    assert "<|im_start|>user\n<tool_response>\nok\n</tool_response>" in text


def test_sft_trains_each_call_once_exactly_as_written(tok):
    from collab_env.adapters.sft import encode_conversation
    from collab_env.rollout import run_episode
    from collab_env.tasks.phone_support import PhoneSupportReference, PhoneSupportUser

    ep = run_episode(collab_env.make("phone-support-v0"),
                     {"assistant": PhoneSupportReference(), "user": PhoneSupportUser()}, seed=3)
    view = ep.conversation.view("assistant")
    calls = [m for m in view if m.tool_calls]
    assert calls
    ids, mask = encode_conversation(tok, view.to_chat(), [m.trainable for m in view])
    trained = tok.decode([t for t, k in zip(ids, mask, strict=True) if k])
    assert trained == "".join(m.content + "<|im_end|>" for m in view if m.role == "assistant")
    whole = tok.decode(ids)
    for m in calls:
        assert whole.count(m.content) == 1  # rendered once
    assert "<tool_call>" not in whole
    for m in view:
        if m.role == "tool":
            assert "<tool_response>\n" + m.content + "\n</tool_response>" in whole and m.content not in trained


def test_a_generated_call_keeps_its_ids_in_the_next_prompt(tok):
    """TokenHistory (TRL's rollout_func, verl's agent loop): the call's ids, split as no
    tokenizer would split them, stay in the next prompt as generated, and the call is not
    rendered a second time after them."""
    from collab_env.agents.tokens import TokenHistory
    from collab_env.tasks.phone_support import PhoneSupportReference
    from collab_env.types import Completion

    env = collab_env.make("phone-support-v0")
    obs, _ = env.reset(seed=0)
    history = TokenHistory(tok)
    prompt = history.prompt_ids(obs["assistant"])
    call = PhoneSupportReference().respond(obs["assistant"], None)
    generated = [i for ch in call for i in tok.encode(ch, add_special_tokens=False)] + [tok.eos_token_id]
    assert generated[:-1] != tok.encode(call, add_special_tokens=False)  # not the tokenizer's own split
    history.record(Completion(text=call, token_ids=generated, prompt_token_ids=prompt))
    obs, *_ = env.step({"assistant": call})
    assert obs["assistant"][-2].tool_calls and obs["assistant"][-1].role == "tool"
    nxt = history.prompt_ids(obs["assistant"])
    assert nxt[:len(prompt) + len(generated)] == prompt + generated  # the ids as generated
    text = tok.decode(nxt)
    assert text.count(call) == 1 and "<tool_call>" not in text
    assert text[len(tok.decode(prompt + generated)):].startswith("\n<|im_start|>user\n<tool_response>\n")

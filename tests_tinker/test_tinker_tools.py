"""Tool calls under tinker-cookbook: phone-support's calls and results in the token sequence the
cookbook trains on (issue 46), checked token by token with the cookbook's own data assembly
(``tinker_cookbook.rl.data_processing.trajectory_to_data``). No Tinker service is needed: the
actions are the reference assistant's moves, tokenised as a model would have sampled them.
"""

from __future__ import annotations

import asyncio

import pytest
from tinker_cookbook.completers import TokensWithLogprobs
from tinker_cookbook.rl.data_processing import trajectory_to_data
from tinker_cookbook.rl.types import Trajectory, Transition

import collab_env
from collab_env.adapters.tinker import CollabEnvGroupBuilder
from collab_env.rollout import run_episode
from collab_env.tasks.phone_support import PhoneSupportReference, PhoneSupportUser

from .test_tinker import RENDERER, reply_tokens

ENV = "phone-support-v0"
INDEX, SEED = 4, 11


def _reference_episode():
    env = collab_env.make(ENV)
    return run_episode(env, {"assistant": PhoneSupportReference(), "user": PhoneSupportUser()},
                       seed=SEED, index=INDEX)


async def _trajectory(env, moves):
    ob, _stop = await env.initial_observation()
    transitions, last = [], None
    for text in moves:
        ac = reply_tokens(env.renderer, text)
        last = await env.step(ac, extra={"stop_reason": "stop"})
        transitions.append(Transition(ob=ob, ac=TokensWithLogprobs(tokens=ac, maybe_logprobs=[0.0] * len(ac)),
                                      reward=last.reward, episode_done=last.episode_done))
        ob = last.next_observation
        if last.episode_done:
            break
    return Trajectory(transitions=transitions, final_ob=ob), last


def test_tool_calls_are_trainable_and_tool_results_masked_token_by_token(tiny_qwen3):
    ep = _reference_episode()
    assert ep.returns["assistant"] == 1.0  # the reference fixes the phone: the episode is a success
    moves = [t.text for t in ep.turns if t.player == "assistant"]
    calls = [m for m in ep.conversation if m.author == "assistant" and m.tool_calls]
    results = [m.content for m in ep.conversation if m.role == "tool" and m.audience == ("assistant",)]
    assert calls and len(results) == len(calls)

    builder = CollabEnvGroupBuilder(ENV, index=INDEX, seed=SEED, group_size=1,
                                    model_name_for_tokenizer=tiny_qwen3, renderer_name=RENDERER)
    env = asyncio.run(builder.make_envs())[0]
    traj, last = asyncio.run(_trajectory(env, moves))
    assert last.episode_done and len(traj.transitions) == len(moves)
    assert env.message_env.episode_return == ep.returns["assistant"]  # the same episode, played through Tinker

    data = trajectory_to_data(traj, 1.0)
    # every observation extends the previous observation and action: one sequence, as trained
    assert len(data) == 1
    datum = data[0]
    targets = datum.loss_fn_inputs["target_tokens"].to_torch().tolist()
    mask = datum.loss_fn_inputs["mask"].to_torch().tolist()
    trained = [t for t, k in zip(targets, mask, strict=True) if k]
    # token by token: the loss positions are exactly the actions' tokens, the calls' included
    assert trained == [t for tr in traj.transitions for t in tr.ac.tokens]
    tok = env.renderer.tokenizer
    trained_text = tok.decode(trained)
    for m in calls:
        assert m.content in trained_text
    context = tok.decode([t for t, k in zip(targets, mask, strict=True) if not k])
    for r in results:  # each tool result reached the sequence, in the renderer's tool block, never trained
        assert "<tool_response>\n" + r + "\n</tool_response>" in context
        assert r not in trained_text


def test_the_messages_carry_tool_call_ids_and_names(tiny_qwen3):
    """The message-level env gives a tool result its call's id and tool name, and a call as the
    text the model wrote (the renderer renders it once)."""
    from collab_env.adapters.tinker import CollabMessageEnv

    ep = _reference_episode()
    moves = [t.text for t in ep.turns if t.player == "assistant"]
    env = CollabMessageEnv(ENV, index=INDEX, seed=SEED)

    async def play():
        msgs = await env.initial_observation()
        for text in moves[:2]:
            msgs = (await env.step({"role": "assistant", "content": text})).next_messages
        return msgs

    msgs = asyncio.run(play())
    tool_msgs = [m for m in msgs if m["role"] == "tool"]
    assert tool_msgs and all(m["tool_call_id"] and m["name"] == "lookup_account" for m in tool_msgs[:1])
    made = [m for m in msgs if m["role"] == "assistant" and m["content"].lstrip().startswith("{")]
    assert made and all("tool_calls" not in m for m in made)


def test_a_reply_in_the_renderers_tool_call_block_is_the_move_as_written(tiny_qwen3):
    """Qwen3's renderer takes ``<tool_call>`` blocks out of a reply's text; the move the env gets
    is still everything the model wrote, and the next observation renders it from those tokens."""
    block = '<tool_call>\n{"name": "lookup_account", "arguments": {"phone_number": "555-0000"}}\n</tool_call>'
    builder = CollabEnvGroupBuilder(ENV, index=INDEX, seed=SEED, group_size=1,
                                    model_name_for_tokenizer=tiny_qwen3, renderer_name=RENDERER)
    env = asyncio.run(builder.make_envs())[0]
    message, _ = env.renderer.parse_response(reply_tokens(env.renderer, block))
    assert message.get("tool_calls") and block not in str(message["content"])  # what the renderer does
    traj, _last = asyncio.run(_trajectory(env, [block, "Thanks."]))
    sent = [m for m in env.message_env.view.env.episode.conversation if m.author == "assistant"]
    assert sent[0].content == block
    data = trajectory_to_data(traj, 1.0)
    assert len(data) == 1
    mask = data[0].loss_fn_inputs["mask"].to_torch().tolist()
    targets = data[0].loss_fn_inputs["target_tokens"].to_torch().tolist()
    assert [t for t, k in zip(targets, mask, strict=True) if k] == [t for tr in traj.transitions for t in tr.ac.tokens]


def test_the_envs_tools_are_declared_in_the_prompt_the_renderers_way(tiny_qwen3):
    """The tools phone-support declares to the assistant reach the prompt through the renderer's
    ``create_conversation_prefix_with_tools`` (Qwen3: a ``<tools>`` block in the system message),
    on every step, so the episode stays one trained sequence; a renderer without tool calling is
    refused in one line."""
    from tinker_cookbook import renderers

    from collab_env.adapters.tinker import declare_tools
    from collab_env.errors import ConfigError

    builder = CollabEnvGroupBuilder(ENV, index=INDEX, seed=SEED, group_size=1,
                                    model_name_for_tokenizer=tiny_qwen3, renderer_name=RENDERER)
    env = asyncio.run(builder.make_envs())[0]
    ob, _stop = asyncio.run(env.initial_observation())
    names = [t["function"]["name"] for t in env.message_env.tools]
    assert "lookup_account" in names  # the env's declaration, read from the player's system message
    prompt = env.renderer.tokenizer.decode(ob.to_ints())
    # one declaration per tool, in the renderer's block (Qwen3's template writes "<tools>" twice)
    assert prompt.count('{"type": "function", "function": {"name": ') == len(names)
    assert all(f'"name": "{n}"' in prompt for n in names) and "</tools>" in prompt
    # the system prompt's own text is kept, before the tool block
    system = env.message_env.view.env.episode.conversation.messages[0]
    assert prompt.index(system.content.splitlines()[0]) < prompt.index("<tools>")
    traj, last = asyncio.run(_trajectory(env, [t.text for t in _reference_episode().turns
                                               if t.player == "assistant"]))
    assert last.episode_done and len(trajectory_to_data(traj, 1.0)) == 1  # still one sequence, tools and all
    # no tools: the messages are left as they are; a renderer that cannot declare them is refused
    msgs = [renderers.Message(role="system", content="s"), renderers.Message(role="user", content="u")]
    assert declare_tools(env.renderer, msgs, []) == msgs
    llama3 = renderers.get_renderer("llama3", env.renderer.tokenizer)
    with pytest.raises(ConfigError, match=r"cannot declare tools.*renderer_name='qwen3'"):
        declare_tools(llama3, msgs, env.message_env.tools)

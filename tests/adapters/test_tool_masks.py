"""Tool messages through the trainers, masks checked token by token (issue 46).

The tiny model is first taught by SFT (the real learner, on the reference assistant's first
move of ``phone-support-v0``, a tool call) to open its reply with a JSON call, so that the
MAGRPO smoke run below has tool calls in its trees: the assistant's call is a trainable
completion and, at the next turn, the call and the env's ``"tool"`` result are prompt
(context, never in the loss). The masks checked are the ones MAGRPO's update builds
(:func:`~collab_env.adapters.common.losses.pack_sequences` of the samples it is given).
"""

import pytest

import collab_env

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

TOOL_HEADER = "<|im_start|>tool\n"


def _first_call_row():
    from collab_env.tasks.phone_support import PhoneSupportReference

    env = collab_env.make("phone-support-v0", num_items=1)
    obs, _ = env.reset(seed=0)
    call = PhoneSupportReference().respond(obs["assistant"], None)
    return obs["assistant"], call


def test_sft_masks_the_call_and_never_the_tool_result(tiny_dir):
    """SFT on a whole reference episode from the assistant's side: exactly the assistant's
    messages (tool calls included) are loss tokens; the tool results are context."""
    from collab_env.adapters.sft import encode_conversation
    from collab_env.rollout import run_episode
    from collab_env.tasks.phone_support import PhoneSupportReference, PhoneSupportUser
    from collab_env.testing.tiny_model import load_tiny_chat_model

    _, tok = load_tiny_chat_model(tiny_dir)
    ep = run_episode(collab_env.make("phone-support-v0"),
                     {"assistant": PhoneSupportReference(), "user": PhoneSupportUser()}, seed=3)
    view = ep.conversation.view("assistant")
    chat = view.to_chat()
    assert any("tool_calls" in m for m in chat) and any(m["role"] == "tool" for m in chat)
    ids, mask = encode_conversation(tok, chat, [m.trainable for m in view])
    trained = tok.decode([t for t, k in zip(ids, mask, strict=True) if k])
    replies = "".join(m.content + "<|im_end|>" for m in view if m.role == "assistant")
    assert trained == replies  # token by token: the replies, calls included, and nothing else
    for m in view:
        if m.role == "tool":
            assert m.content not in trained


@pytest.fixture(scope="module")
def caller(tiny_dir, tmp_path_factory):
    """``(model, tokenizer)``: the tiny model after SFT on the reference's first move (a call)."""
    from collab_env.adapters import SFTConfig, SFTTrainer
    from collab_env.testing.tiny_model import load_tiny_chat_model

    obs, call = _first_call_row()
    model, tok = load_tiny_chat_model(tiny_dir)
    sft = SFTTrainer(model=model, tokenizer=tok,
                     train_dataset=[{"messages": obs.to_chat() + [{"role": "assistant", "content": call}]}],
                     args=SFTConfig(learning_rate=3e-3, num_train_epochs=80, per_device_train_batch_size=1,
                                    max_length=4096, eval_interval=0, logging_steps=80, plot=False,
                                    output_dir=str(tmp_path_factory.mktemp("sft"))))
    sft.train()
    return sft.pm.model, tok


def test_one_sequence_transcript_trains_the_calls_never_the_results(caller):
    """The TRL ``rollout_func`` / verl agent-loop path: the player's prompts extend its exact token
    history (TranscriptPolicy), and token_transcript's mask is 1 exactly on the generated ids."""
    from collab_env.adapters.trl.generation import TrainerGenerator, TranscriptPolicy
    from collab_env.agents.hf import HFPolicy
    from collab_env.policy import SamplingParams
    from collab_env.rollout import run_episode, token_transcript
    from collab_env.tasks.phone_support import PhoneSupportUser

    model, tok = caller
    params = SamplingParams(temperature=0.5, max_new_tokens=40)
    backend = HFPolicy(model, tok, device="cpu", dtype="float32")
    policy = TranscriptPolicy(TrainerGenerator(backend, tok, params))
    env = collab_env.make("phone-support-v0", num_items=1, max_steps=3)
    ep = run_episode(env, {"assistant": policy, "user": PhoneSupportUser()}, seed=0)
    moves = [t for t in ep.turns if t.player == "assistant"]
    assert len(moves) >= 2 and moves[0].text.lstrip().startswith("{")  # it opened with a call
    results = [m.content for m in ep.conversation if m.role == "tool" and m.audience == ("assistant",)]
    assert len(results) == sum(t.text.lstrip().startswith("{") for t in moves)
    tt = token_transcript(ep, "assistant")
    trained = [t for t, k in zip(tt.response_ids, tt.mask, strict=True) if k]
    assert trained == [i for t in moves for i in t.completion.token_ids]  # token by token
    context = tok.decode([t for t, k in zip(tt.response_ids, tt.mask, strict=True) if not k])
    # the first call's result came back before the next move: context, never a loss token
    assert TOOL_HEADER + results[0] in context and results[0] not in tok.decode(trained)


def test_magrpo_on_phone_support_trains_the_call_tokens_never_the_tool_result(caller, tmp_path, monkeypatch):
    import collab_env.adapters.magrpo as magrpo
    from collab_env.adapters.common.losses import pack_sequences

    model, tok = caller

    seen: list[list[tuple]] = []
    real = magrpo.policy_update

    def recording(pm, samples, loss, **kw):
        seen.append(list(samples))
        return real(pm, samples, loss, **kw)

    monkeypatch.setattr(magrpo, "policy_update", recording)
    args = magrpo.MAGRPOConfig(num_agents=1, num_turns=2, num_generations=2, max_new_tokens=40, max_steps=1,
                               temperature=0.5, eval_interval=0, eval_num_samples=1, logging_steps=1,
                               learning_rate=1e-3, output_dir=str(tmp_path / "out"))
    trainer = magrpo.MAGRPOTrainer(agent_model=model, tokenizer=tok, env="phone-support",
                                   env_kwargs={"num_items": 1}, args=args)
    trainer.train()
    samples = [s for batch in seen for s in batch]
    first = [s for s in samples if s[3] == 0]
    second = [s for s in samples if s[3] == 1]
    calls = [s for s in first if tok.decode(list(s[1])).lstrip().startswith("{")]
    assert calls, [tok.decode(list(s[1])) for s in first]  # the tree holds tool calls
    with_results = [s for s in second if TOOL_HEADER in tok.decode(s[0])]
    assert with_results  # and, a turn later, the env's tool results in the prompt

    batch = pack_sequences([s[0] for s in samples], [s[1] for s in samples], trainer.models[0].pad_id)
    p_width = batch.input_ids.shape[1] - batch.completion_mask.shape[1]
    for i, (prompt, completion, *_rest) in enumerate(samples):
        row = batch.input_ids[i].tolist()
        loss_mask = [0] * p_width + batch.completion_mask[i].tolist()
        trained = [t for t, k in zip(row, loss_mask, strict=True) if k]
        # token by token: the loss positions are exactly the ids the model generated
        assert trained == list(completion)
        assert row[p_width - len(prompt):p_width] == list(prompt)
        if s_has_tool := TOOL_HEADER in tok.decode(prompt):
            # the tool message sits in the prompt: none of its tokens is a loss position
            text = tok.decode(prompt)
            result = text[text.rindex(TOOL_HEADER) + len(TOOL_HEADER):].split("<|im_end|>")[0]
            assert result and result not in tok.decode(trained)
        assert s_has_tool == (i >= len(first) and prompt in [w[0] for w in with_results])
    # the call a first-turn sample generated is context (prompt) in its child's sample: the
    # turn-level path re-renders the chat, so it is found as text, inside an assistant turn
    call_texts = [tok.decode(list(s[1]), skip_special_tokens=True) for s in calls]
    assert any("<|im_start|>assistant\n" + c.strip() in tok.decode(s[0]) for s in with_results for c in call_texts)


def test_trl_grpo_on_phone_support_trains_the_calls_never_the_results_or_the_user(caller, tmp_path):
    """A TRL smoke run: GRPOTrainer with the repo's rollout_func on phone-support, one step; the
    sequences it trained on are checked token by token (env_mask, TRL's loss mask): 1 exactly on
    the ids the model generated (its tool calls included), 0 on the env's tool results and on
    the user's text."""
    import copy

    from trl import GRPOConfig, GRPOTrainer

    from collab_env.adapters import trl as ce_trl

    model, tok = caller
    model = copy.deepcopy(model)  # the module's other tests keep the caller as it was
    kwargs = {"num_items": 1, "max_steps": 3}
    fn = ce_trl.rollout_func("phone-support", env_kwargs=kwargs)
    seen = []

    def recording(prompts, trainer):
        out = fn(prompts, trainer)
        seen.append((out, list(fn.last_episodes)))
        return out

    torch.manual_seed(0)
    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=2, num_generations=2,
                      max_completion_length=40, temperature=0.5, max_steps=1, logging_steps=1, report_to=[],
                      use_cpu=True, save_strategy="no", learning_rate=1e-3, seed=0)
    trainer = GRPOTrainer(model=model, reward_funcs=[ce_trl.episode_reward], args=args, processing_class=tok,
                          train_dataset=ce_trl.dataset("phone-support", n=1, env_kwargs=kwargs), rollout_func=recording)
    trainer.train()
    assert trainer.state.global_step == 1 and seen
    with_call = 0
    for out, episodes in seen:
        for i, ep in enumerate(episodes):
            ids, mask = out["completion_ids"][i], out["env_mask"][i]
            moves = [t for t in ep.turns if t.player == "assistant"]
            trained = [t for t, k in zip(ids, mask, strict=True) if k]
            assert trained == [i for t in moves for i in t.completion.token_ids]  # token by token
            assert out["prompt_ids"][i] == list(moves[0].completion.prompt_token_ids)
            trained_text = tok.decode(trained)
            context = tok.decode([t for t, k in zip(ids, mask, strict=True) if not k])
            results = [m.content for m in ep.conversation if m.role == "tool" and m.audience == ("assistant",)]
            # the results that came before the last move (a call's result comes right after it)
            results = results[:sum(t.text.lstrip().startswith("{") for t in moves[:-1])]
            for r in results:
                assert TOOL_HEADER + r + "<|im_end|>" in context and r not in trained_text
            last = max(k for k, t in enumerate(ep.turns) if t.player == "assistant")
            for u in [t.text for t in ep.turns[:last] if t.player == "user"]:  # what came before the last move
                assert u in context and u not in trained_text
            if results:
                with_call += 1
                calls = [t.completion for t in moves if t.text.lstrip().startswith("{")]
                # every move sent as a call is the ids the model generated; at least one is a named call
                # (at temperature 0.5 a later move may be a garbled "{...", which the env answers with an error)
                assert calls and all(tok.decode(list(c.token_ids)).startswith(c.text) for c in calls)
                assert any('"name"' in tok.decode(list(c.token_ids)) for c in calls)
    assert with_call  # the batch held tool calls and their results

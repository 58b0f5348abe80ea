"""SFTTrainer: exact assistant-only masks on multi-turn chats (checked against the token spans of
each message on the tiny model), the CollabLLM SFT rows, a training step that moves the weights
and lowers the loss, exact gradient accumulation, evaluation, checkpoints."""

import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from collab_env.adapters.common.logging import read_jsonl  # noqa: E402
from collab_env.adapters.sft import (  # noqa: E402
    SFTConfig,
    SFTTrainer,
    encode_conversation,
)
from collab_env.adapters.common.chat import chat_ids  # noqa: E402
from collab_env.errors import ConfigError, DataSchemaError  # noqa: E402

CHAT = [
    {"role": "system", "content": "SYSTEM-TEXT be brief"},
    {"role": "user", "content": "HIDDEN-GOAL what is the capital of France?"},
    {"role": "assistant", "content": "Which country do you mean?"},
    {"role": "user", "content": "USER-REPLY France, please."},
    {"role": "assistant", "content": "The capital of France is Paris."},
]


def _tiny(tiny_dir):
    from collab_env.testing.tiny_model import load_tiny_chat_model

    return load_tiny_chat_model(tiny_dir)


def _cfg(tmp_path, **kw):
    base = dict(learning_rate=1e-2, eval_interval=0, eval_num_samples=4, output_dir=str(tmp_path / "out"),
                plot=False, max_length=256)
    base.update(kw)
    return SFTConfig(**base)


def _spans(tok, ids, mask):
    """The decoded text of each maximal run of loss tokens."""
    runs, cur = [], []
    for t, m in zip(ids, mask, strict=True):
        if m:
            cur.append(t)
        elif cur:
            runs.append(cur)
            cur = []
    if cur:
        runs.append(cur)
    return [tok.decode(r) for r in runs]


def test_config_validation():
    with pytest.raises(ConfigError, match="gradient_accumulation_steps"):
        SFTConfig(gradient_accumulation_steps=0)
    with pytest.raises(ConfigError, match="max_length"):
        SFTConfig(max_length=1)


def test_mask_is_exactly_the_assistant_spans(tiny_dir):
    """The mask covers, token for token, the assistant replies plus their end-of-turn token: the
    span between the assistant header (generation prompt) and ``<|im_end|>``; the system text,
    the hidden goal and the user's reply are never in the loss."""
    _, tok = _tiny(tiny_dir)
    ids, mask = encode_conversation(tok, CHAT)
    assert ids == chat_ids(tok, CHAT)  # the whole conversation, tokenised once
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    # where each assistant reply must be: right after the '<|im_start|>assistant\n' header
    for k in (2, 4):
        head = len(chat_ids(tok, CHAT[:k], generation_prompt=True))
        body = tok(CHAT[k]["content"], add_special_tokens=False)["input_ids"]
        assert ids[head:head + len(body)] == body and ids[head + len(body)] == im_end
        assert mask[head:head + len(body) + 1] == [1] * (len(body) + 1)
        assert mask[head - 1] == 0 and mask[head + len(body) + 1] == 0  # header, newline after
    expected = sum(len(tok(CHAT[k]["content"], add_special_tokens=False)["input_ids"]) + 1 for k in (2, 4))
    assert sum(mask) == expected  # nothing else
    assert _spans(tok, ids, mask) == ["Which country do you mean?<|im_end|>", "The capital of France is Paris.<|im_end|>"]
    text = tok.decode([t for t, m in zip(ids, mask, strict=True) if m])
    for secret in ("SYSTEM-TEXT", "HIDDEN-GOAL", "USER-REPLY", "user", "system"):
        assert secret not in text


def test_trainable_flags_select_turns_and_reject_user_text(tiny_dir):
    _, tok = _tiny(tiny_dir)
    _, mask = encode_conversation(tok, CHAT, [False, False, False, False, True])
    ids = chat_ids(tok, CHAT)
    assert _spans(tok, ids, mask) == ["The capital of France is Paris.<|im_end|>"]
    with pytest.raises(DataSchemaError, match="not assistant"):
        encode_conversation(tok, CHAT, [False, True, False, False, True])
    with pytest.raises(DataSchemaError, match="5 messages"):
        encode_conversation(tok, CHAT, [True])


def test_collabllm_sft_rows_never_train_on_the_hidden_goal(tiny_dir):
    """Rows built by build_sft_dataset: the loss tokens are exactly the assistant replies; the
    hidden goal and the reference answer are nowhere in the tokens at all."""
    from collab_env.tasks.collabllm_modes import build_sft_dataset
    from collab_env.testing.collabllm_fixtures import collabllm_fixture_rows

    _, tok = _tiny(tiny_dir)
    rows = collabllm_fixture_rows(3)
    ds = build_sft_dataset(rows, system_prompt="Be collaborative.")
    for row in ds:
        ids, mask = encode_conversation(tok, row["messages"], row["trainable"])
        spans = _spans(tok, ids, mask)
        replies = [m["content"] + "<|im_end|>" for m in row["messages"] if m["role"] == "assistant"]
        assert spans == replies
        whole = tok.decode(ids)
        for r in rows:
            assert r["single_turn_prompt"] not in whole and r["single_turn_completion"] not in whole


def test_step_changes_parameters_and_lowers_the_loss(tiny_dir, tmp_path):
    model, tok = _tiny(tiny_dir)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    data = [{"messages": CHAT}] * 2 + [CHAT[:3]]  # rows and a plain message list
    trainer = SFTTrainer(model=model, tokenizer=tok, train_dataset=data, eval_dataset=data,
                         args=_cfg(tmp_path, num_train_epochs=6, per_device_train_batch_size=3, plot=True,
                                   eval_interval=3))
    start = trainer.evaluate()["eval/loss"]
    out = trainer.train()
    end = trainer.evaluate()
    assert any(not torch.equal(p, before[n]) for n, p in model.named_parameters())
    assert end["eval/loss"] < start - 0.5 and math.isclose(end["eval/perplexity"], math.exp(end["eval/loss"]))
    assert out["env_step"] == 6 and math.isfinite(out["loss"])
    records = read_jsonl(tmp_path / "out" / "metrics.jsonl")
    assert sum("eval/loss" in r for r in records) == 4  # 2 manual + before steps 0 and 3
    assert (tmp_path / "out" / "curves.png").exists()


def test_gradient_accumulation_is_exact(tiny_dir, tmp_path):
    """batch 2 x accumulation 1 and batch 1 x accumulation 2 hand the optimiser the same gradient:
    the loss is the token mean over the whole optimiser batch either way.

    The gradients are compared when the optimiser step starts, not the weights after it: AdamW's
    first step divides each entry by its own magnitude, so float32 rounding noise in near-zero
    entries (the padded batch and the two single rows run different kernels, whose summation order
    differs by CPU) would become weight changes the size of the learning rate. Before the step the
    two gradients agree up to float32 summation error, relative to the gradient's scale."""
    data = [{"messages": CHAT}, {"messages": CHAT[:3]}]
    grads = []
    for bs, acc in ((2, 1), (1, 2)):
        model, tok = _tiny(tiny_dir)
        t = SFTTrainer(model=model, tokenizer=tok, train_dataset=data,
                       args=_cfg(tmp_path / f"{bs}", per_device_train_batch_size=bs,
                                 gradient_accumulation_steps=acc, shuffle=False, max_grad_norm=None))
        seen = []
        t.pm.optimizer.register_step_pre_hook(
            lambda *_, _seen=seen, _model=model: _seen.append([p.grad.detach().clone() for p in _model.parameters()]))
        t.train()
        assert len(seen) == 1, "both settings make exactly one optimiser step over the two rows"
        grads.append(seen[0])
    scale = max(float(g.abs().max()) for g in grads[0])
    assert scale > 0
    for a, b in zip(*grads, strict=True):
        # float32 sums of a few hundred terms in another order: a few ulps of the largest entry.
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5 * scale)


def test_checkpoint_and_resume(tiny_dir, tmp_path):
    data = [{"messages": CHAT}, {"messages": CHAT[:3]}]
    model, tok = _tiny(tiny_dir)
    full = SFTTrainer(model=model, tokenizer=tok, train_dataset=data,
                      args=_cfg(tmp_path / "a", per_device_train_batch_size=1, num_train_epochs=2))
    full.train()
    model2, tok2 = _tiny(tiny_dir)
    half = SFTTrainer(model=model2, tokenizer=tok2, train_dataset=data,
                      args=_cfg(tmp_path / "b", per_device_train_batch_size=1, num_train_epochs=2, max_steps=2))
    half.train()
    ckpt = half.save_checkpoint()
    assert (ckpt / "model_0" / "config.json").exists()
    model3, tok3 = _tiny(tiny_dir)
    resumed = SFTTrainer(model=model3, tokenizer=tok3, train_dataset=data,
                         args=_cfg(tmp_path / "b", per_device_train_batch_size=1, num_train_epochs=2))
    resumed.train(resume_from_checkpoint=ckpt)
    assert resumed.state.optimizer_steps == 4
    for a, b in zip(model.parameters(), model3.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)


def test_argument_errors(tiny_dir, tmp_path):
    model, tok = _tiny(tiny_dir)
    with pytest.raises(ConfigError, match="train_dataset"):
        SFTTrainer(model=model, tokenizer=tok, args=_cfg(tmp_path))
    with pytest.raises(DataSchemaError, match="messages"):
        SFTTrainer(model=model, tokenizer=tok, train_dataset=[{"text": "hi"}], args=_cfg(tmp_path))
    with pytest.raises(DataSchemaError, match="trainable"):
        SFTTrainer(model=model, tokenizer=tok, train_dataset=[CHAT[:2]], args=_cfg(tmp_path))

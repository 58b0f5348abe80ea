"""The tiny chat model's architectures: the Qwen3 twin (for engines that serve Qwen3 but not Qwen2,
such as SkyRL's JAX Tinker backend in ``make test-tinker``) has the same tokenizer and sizes."""

from __future__ import annotations

import json

import pytest

from collab_env.testing.tiny_model import build_tiny_chat_model, load_tiny_chat_model


def test_the_qwen3_twin_has_the_same_tokenizer_and_generates(tmp_path, tiny_dir):
    path = build_tiny_chat_model(tmp_path / "q3", architecture="qwen3")
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"] and config["model_type"] == "qwen3"
    assert (path / "tokenizer.json").read_text() == (tiny_dir / "tokenizer.json").read_text()
    model, tok = load_tiny_chat_model(path)
    ids = tok("Hello there", return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=3, do_sample=False)
    assert out.shape[1] == ids.shape[1] + 3 or tok.eos_token_id in out[0, ids.shape[1]:].tolist()


def test_an_unknown_architecture_is_refused(tmp_path):
    with pytest.raises(ValueError, match="architecture='llama'.*qwen2"):
        build_tiny_chat_model(tmp_path, architecture="llama")

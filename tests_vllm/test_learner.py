"""Learners sampling their rollouts through vLLM, with the trained weights pushed into the engine.

A tiny model trains two MAGRPO items with ``generation_backend="vllm"`` (the engine syncs before
each generation that follows an optimiser step); after a further, clearly visible weight update
the engine's greedy log-probs equal the *updated* model's own (a forward pass in transformers) and
no longer the initial model's: the engine samples from the weights being trained.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

torch = pytest.importorskip("torch")

ENGINE = {"dtype": "float32", "max_model_len": 512, "kv_cache_memory_bytes": 64 << 20, "enforce_eager": True}


def forward_logprobs(model, prompt, completion, pad_id):
    from collab_env.adapters.common.losses import pack_sequences, token_logprobs

    batch = pack_sequences([prompt], [completion], pad_id)
    with torch.no_grad():
        return token_logprobs(model, batch)[0, : len(completion)].tolist()


def test_magrpo_step_with_vllm_generation_syncs_the_trained_weights(tmp_path):
    from collab_env.adapters.magrpo import MAGRPOConfig, MAGRPOTrainer
    from collab_env.testing.tiny_model import build_tiny_chat_model, load_tiny_chat_model
    from collab_env.types import Conversation

    folder = build_tiny_chat_model(tmp_path / "tiny")
    model, tok = load_tiny_chat_model(folder)
    initial, _ = load_tiny_chat_model(folder)
    args = MAGRPOConfig(num_agents=1, num_generations=4, max_new_tokens=8, max_steps=2, learning_rate=3e-2,
                        eval_interval=0, logging_steps=1, plot=False, device="cpu",
                        output_dir=str(tmp_path / "out"), generation_backend="vllm", vllm_engine_kwargs=ENGINE)
    trainer = MAGRPOTrainer(agent_model=model, tokenizer=tok, env="length-ratio", trained_players=["agent_0"],
                            args=args)
    pm = trainer.models[0]
    assert pm.engine is not None
    out = trainer.train()
    assert pm.version >= 1  # optimiser steps taken
    assert pm.engine.syncs >= 1 and "turn_1/reward_mean" in out

    # A clearly visible update (as an optimiser step would make): the engine must follow it.
    with torch.no_grad():
        gen = torch.Generator().manual_seed(0)
        for p in pm.model.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=gen))
    pm.version += 1
    prompt = pm.prompt_ids(Conversation.from_chat([{"role": "user", "content": "Describe a city in the clouds."}]))
    [c] = pm.generate([prompt], [0], temperature=0.0, max_new_tokens=6)
    assert pm.engine.version == pm.version  # synced before generating
    # The engine is a TokenGenerator that pads like the learner's tokenizer.
    from collab_env.agents.tokens import TokenGenerator

    assert isinstance(pm.engine, TokenGenerator) and pm.engine.pad_token_id == pm.pad_id
    assert len(c.token_ids) >= 1 and c.prompt_token_ids == tuple(prompt)
    trained = forward_logprobs(pm.model, prompt, list(c.token_ids), pm.pad_id)
    before = forward_logprobs(initial, prompt, list(c.token_ids), pm.pad_id)
    assert c.logprobs == pytest.approx(trained, abs=2e-3)
    assert max(abs(a - b) for a, b in zip(c.logprobs, before, strict=True)) > 1e-2
    # Not closed here: shutting an in-process engine down tears down vLLM's process-wide
    # parallel state, which the session's other engines still use.

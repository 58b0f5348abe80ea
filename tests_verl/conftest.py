"""Fixtures of the verl tests (run by ``make test-verl`` in ``.venv-verl``, never by ``make test``).

The agent loop runs against a fake ``server_manager`` that serves a real tiny model's tokens
(greedy generation with transformers on CPU through collab_env's HF backend) in verl's
``TokenOutput`` form, so a verl sample can be compared token for token with collab_env's own
rollout of the same episode. A real verl GRPO step needs a GPU (vLLM/SGLang) and is not run here.
"""

from __future__ import annotations

import asyncio
import os

os.environ.update({"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})

import pytest  # noqa: E402


class TinyServer:
    """verl's ``server_manager`` surface (``async generate(request_id, *, prompt_ids,
    sampling_params) -> TokenOutput``) over a real model: the ids and log-probs of collab_env's
    HF backend's token-level generation, with verl's/vLLM's sampling keys read."""

    def __init__(self, model, tokenizer):
        from collab_env.agents.hf import HFPolicy

        self.generator = HFPolicy(model, tokenizer, device="cpu", name="tiny-server")
        self.calls: list[dict] = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        from collab_env.policy import SamplingParams

        top_k = sampling_params.get("top_k", -1)
        params = SamplingParams(temperature=float(sampling_params.get("temperature", 1.0)),
                                top_p=float(sampling_params.get("top_p", 1.0)),
                                top_k=None if top_k is None or top_k < 1 else int(top_k),
                                max_new_tokens=int(sampling_params["max_tokens"]))
        seed = int(sampling_params.get("seed", 0))
        [c] = await asyncio.to_thread(self.generator.generate_tokens, [list(prompt_ids)], params, [seed])
        self.calls.append({"request_id": request_id, "prompt_ids": list(prompt_ids),
                           "sampling_params": dict(sampling_params), "token_ids": list(c.token_ids)})
        return TokenOutput(token_ids=list(c.token_ids), log_probs=list(c.logprobs),
                           stop_reason="completed" if c.finish_reason == "stop" else None)


@pytest.fixture
def server(tiny):
    model, tok = tiny
    return TinyServer(model, tok)

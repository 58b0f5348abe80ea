"""Fixtures of the SkyRL tests (run by ``make test-skyrl`` in ``.venv-skyrl``, never by ``make test``).

SkyRL's real ``SkyRLGymGenerator`` runs over SkyRL's real ``InferenceEngineClient``, whose one
engine is a fake: it serves a real tiny model's tokens (generation with transformers on CPU through
collab_env's HF backend, at the sampling params SkyRL sends) in SkyRL's ``InferenceEngineOutput``
form, and records every call, so a SkyRL trajectory can be compared token for token with the ids the
model returned and with collab_env's own replay of the same episode. Training (Ray workers,
vLLM/SGLang engines, FSDP/DeepSpeed) needs GPUs and is not run here.
"""

from __future__ import annotations

import asyncio
import os

os.environ.update({"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})

import pytest  # noqa: E402
from skyrl_train.inference_engines.base import InferenceEngineInterface  # noqa: E402


class TinyEngine(InferenceEngineInterface):
    """SkyRL's ``InferenceEngineInterface`` over a real model: ``generate`` returns the ids and
    log-probs of collab_env's HF backend's token-level generation for each prompt, reading the
    vLLM sampling keys SkyRL sends (``max_tokens``, ``temperature``, ``top_p``, ``top_k``,
    ``logprobs``); the text is decoded without special tokens, as vLLM does under SkyRL's
    ``skip_special_tokens=True``. The weight-sync and HTTP surface is not used by the generator."""

    def __init__(self, model, tokenizer):
        from collab_env.agents.hf import HFPolicy

        self.generator = HFPolicy(model, tokenizer, device="cpu", name="tiny-engine")
        self.tokenizer = tokenizer
        self.calls: list[dict] = []

    async def generate(self, input_batch):
        from skyrl_train.inference_engines.base import InferenceEngineOutput

        from collab_env.policy import SamplingParams

        sp = dict(input_batch.get("sampling_params") or {})
        top_k = sp.get("top_k", -1)
        params = SamplingParams(temperature=float(sp.get("temperature", 1.0)), top_p=float(sp.get("top_p", 1.0)),
                                top_k=None if top_k is None or top_k < 1 else int(top_k),
                                max_new_tokens=int(sp["max_tokens"]))
        prompts = [list(p) for p in input_batch["prompt_token_ids"]]
        done = await asyncio.to_thread(self.generator.generate_tokens, prompts, params, [0] * len(prompts))
        out = InferenceEngineOutput(responses=[], response_ids=[], stop_reasons=[],
                                    response_logprobs=[] if sp.get("logprobs") is not None else None)
        for prompt, c in zip(prompts, done, strict=True):
            text = self.tokenizer.decode(list(c.token_ids), skip_special_tokens=True)
            call = {"prompt_ids": prompt, "token_ids": list(c.token_ids), "logprobs": list(c.logprobs),
                    "text": text, "sampling_params": sp}
            self.calls.append(call)
            out["responses"].append(text)
            out["response_ids"].append(list(c.token_ids))
            out["stop_reasons"].append("stop" if c.finish_reason == "stop" else "length")
            if out["response_logprobs"] is not None:
                out["response_logprobs"].append(list(c.logprobs))
        return out

    def _unused(self, *args, **kwargs):
        raise NotImplementedError("not used by SkyRLGymGenerator.generate")

    chat_completion = completion = wake_up = sleep = init_weight_update_communicator = _unused
    update_named_weights = teardown = reset_prefix_cache = abort_generation = _unused

    def tp_size(self) -> int:
        return 1

    def pp_size(self) -> int:
        return 1

    def dp_size(self) -> int:
        return 1


@pytest.fixture
def engine(tiny):
    model, tok = tiny
    return TinyEngine(model, tok)

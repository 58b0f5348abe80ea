"""Fixtures of the SkyRL tests (run by ``make test-skyrl`` in ``.venv-skyrl``, never by ``make test``).

SkyRL's real ``SkyRLGymGenerator`` (skyrl 0.4.0, ``skyrl.train``) runs over an inference engine that
is a fake: it serves a real tiny model's tokens (generation with transformers on CPU through
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
from skyrl.backends.skyrl_train.inference_servers.base import InferenceEngineInterface  # noqa: E402


class TinyEngine(InferenceEngineInterface):
    """SkyRL's ``InferenceEngineInterface`` over a real model: ``generate`` returns the ids and
    log-probs of collab_env's HF backend's token-level generation for each prompt, reading the
    vLLM sampling keys SkyRL sends (``max_tokens``, ``temperature``, ``top_p``, ``top_k``,
    ``logprobs``); the text is decoded without special tokens, as vLLM does under SkyRL's
    ``skip_special_tokens=True``. The weight-sync, chat and HTTP surface is not used by the generator."""

    def __init__(self, model, tokenizer):
        from collab_env.agents.hf import HFPolicy

        self.generator = HFPolicy(model, tokenizer, device="cpu", name="tiny-engine")
        self.tokenizer = tokenizer
        self.calls: list[dict] = []
        self.finished: list = []

    @property
    def model_name(self) -> str:
        return "tiny"

    async def generate(self, input_batch, model=None):
        from skyrl.backends.skyrl_train.inference_servers.base import InferenceEngineOutput

        from collab_env.policy import SamplingParams

        sp = dict(input_batch.get("sampling_params") or {})
        top_k = sp.get("top_k", -1)
        params = SamplingParams(temperature=float(sp.get("temperature", 1.0)), top_p=float(sp.get("top_p", 1.0)),
                                top_k=None if top_k is None or top_k < 1 else int(top_k),
                                max_new_tokens=int(sp["max_tokens"]))
        prompts = [list(p) for p in input_batch["prompt_token_ids"]]
        done = await asyncio.to_thread(self.generator.generate_tokens, prompts, params, [0] * len(prompts))
        out = InferenceEngineOutput(responses=[], response_ids=[], stop_reasons=[],
                                    response_logprobs=[] if sp.get("logprobs") is not None else None,
                                    prompt_logprobs=None, rollout_expert_indices=None, rollout_sample_support=None)
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

    get_endpoint_url = chat_completion = render_chat_completion = completion = wake_up = sleep = _unused
    update_named_weights = load_lora_adapter = teardown = reset_prefix_cache = _unused
    pause_generation = resume_generation = get_world_size = _unused

    async def finish_session(self, session_id) -> None:
        """The generator closes each trajectory's session (for session-aware routing): recorded."""
        self.finished.append(session_id)


@pytest.fixture
def engine(tiny):
    model, tok = tiny
    return TinyEngine(model, tok)

"""The token-level generation contract shared by the transformers and vLLM backends.

A learner samples its own rollouts from token ids (its own tokenisation, so the prompts are
exactly those its loss reads), one seed per row, and needs the generated ids and their log-probs
back. :class:`TokenGenerator` is that interface; :func:`sampling_params` reads its sampling
argument and :func:`row_seed` derives the seed of each observation of a seeded ``act`` call.
:func:`chat_prompt_text` and :func:`rendered_prompt_ids` are how both backends turn an
observation into the prompt ids they generate from (the tokenizer's chat template).

Implemented by :class:`~collab_env.agents.hf.HFPolicy`, :class:`~collab_env.agents.vllm.VLLMPolicy`,
the learners' vLLM engine (:class:`~collab_env.adapters.common.vllm_engine.VLLMGenerator`) and
:class:`~collab_env.adapters.common.models.PolicyModel`. Both backends re-export these names
(``from collab_env.agents.hf import TokenGenerator, sampling_params`` keeps working).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from collab_env.agents.base import SamplingParams, chat_template_mode
from collab_env.errors import ConfigError
from collab_env.types import Completion, Conversation

__all__ = ["TokenGenerator", "sampling_params", "row_seed", "chat_prompt_text", "rendered_prompt_ids"]


@runtime_checkable
class TokenGenerator(Protocol):
    """Token-level generation: what a learner needs from a backend to sample its own rollouts.

    Implemented by :class:`~collab_env.agents.hf.HFPolicy`,
    :class:`~collab_env.agents.vllm.VLLMPolicy`, the learners' vLLM engine
    (:class:`~collab_env.adapters.common.vllm_engine.VLLMGenerator`) and
    :class:`~collab_env.adapters.common.models.PolicyModel`.
    """

    @property
    def pad_token_id(self) -> int:
        """The id to pad token sequences with (the tokenizer's pad token, else its EOS)."""
        ...

    def generate_tokens(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                        seeds: Sequence[int]) -> list[Completion]:
        """One :class:`~collab_env.types.Completion` per tokenised prompt, in order (blocking).

        Row ``i`` is generated from exactly ``prompts[i]`` (no chat template is applied) with its
        own random generator seeded by ``seeds[i]``, so its tokens do not depend on the other rows.
        Each completion holds ``prompt_token_ids`` (the prompt as given), ``token_ids`` (the
        generated ids, EOS included when it stopped on one) and ``logprobs`` (per generated token,
        under the distribution it was sampled from)."""
        ...


def sampling_params(params: SamplingParams | Mapping[str, Any]) -> SamplingParams:
    """``params`` as :class:`~collab_env.policy.SamplingParams` (a mapping of its fields is
    converted; anything else is a ConfigError)."""
    if isinstance(params, SamplingParams):
        return params
    if isinstance(params, Mapping):
        return SamplingParams.from_kwargs(**params)
    raise ConfigError(f"params must be SamplingParams or a mapping of its fields, got {type(params).__name__}.")


def row_seed(seed: int, index: int) -> int:
    """The seed of observation ``index`` of an ``act`` call seeded with ``seed``.

    Distinct per index, so ``act([obs] * 8, seed=s)`` draws 8 different samples, all
    reproducible; a non-negative int below ``2**63``. Both backends derive it the same way, so a
    seeded call gives each row the same seed on either.
    """
    import numpy as np

    state = np.random.SeedSequence([int(seed) & 0xFFFFFFFFFFFFFFFF, index]).generate_state(1, np.uint64)
    return int(state[0] >> 1)


def chat_prompt_text(tokenizer: Any, observation: Conversation, system_prompt: str | None = None) -> str:
    """The prompt of one observation as text: the tokenizer's chat template rendering with the
    generation prompt (or the prefilled reply to continue, left open); ``system_prompt`` is put
    first when the observation has no system message."""
    chat = observation.to_chat()
    if system_prompt is not None and not any(m["role"] == "system" for m in chat):
        chat = [{"role": "system", "content": system_prompt}, *chat]
    return tokenizer.apply_chat_template(chat, tokenize=False, **chat_template_mode(observation))


def rendered_prompt_ids(tokenizer: Any, text: str) -> list[int]:
    """The token ids of a prompt rendered by :func:`chat_prompt_text` (exactly what
    ``Completion.prompt_token_ids`` holds)."""
    # The template already writes any BOS token, so the tokenizer must not add another.
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])

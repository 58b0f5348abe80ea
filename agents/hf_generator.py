"""Token-level generation on a transformers causal LM: :class:`HFGenerator`.

:class:`HFGenerator` loads the model (:func:`~collab_env.agents.hf_loading.load_causal_lm`) and
implements the token-level interface (:class:`~collab_env.agents.tokens.TokenGenerator`):
:meth:`~HFGenerator.generate_tokens` generates from token ids (no chat template) in
``model.generate`` calls of at most ``max_batch_size`` rows, each row with its own seed
(:class:`~collab_env.agents.hf_sampling.RowSampler`), and :attr:`~HFGenerator.pad_token_id` is
the id to pad with. A prompt that several rows of a call share is read once (one prefill over
the distinct prompts, whose KV cache every copy continues from), and a prefix that every row of
a call shares (the futures of a multiturn-aware reward share their conversation up to the first
sampled turn) is read once for all of them. Prefixes read by earlier calls are reused from a
:class:`~collab_env.agents.hf_prefix.PrefixCache` (:attr:`~HFGenerator.prefix_cache_tokens`).
Decoding is ``model.generate``'s (speed on GPUs is the vLLM backend's job). It also scores given
continuations on token ids
(:meth:`~HFGenerator.score_token_continuations`).

:class:`~collab_env.agents.hf.HFPolicy` is this generator plus chat templates and the
micro-batching queue; the module docstring of :mod:`collab_env.agents.hf` says what a
:class:`~collab_env.types.Completion` holds. Calls are serialised by a lock, so one generator may
be used from several threads.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from collab_env.agents.base import common_prefix_length, distinct_rows
from collab_env.agents.hf_loading import (
    cache_keyword,
    check_device_and_dtype,
    eos_token_ids,
    forward_accepts,
    load_causal_lm,
    plain_layers,
)
from collab_env.agents.hf_prefix import PrefixCache, cropped
from collab_env.agents.hf_sampling import RowSampler, StopStrings
from collab_env.agents.hf_scoring import score_rows
from collab_env.errors import ConfigError, require
from collab_env.policy import SamplingParams
from collab_env.types import Completion

__all__ = ["HFGenerator", "GenerationStats"]


@dataclass
class GenerationStats:
    """Counters of one :class:`~collab_env.agents.hf.HFPolicy` (read them as ``policy.stats``).

    Args:
        generate_calls: ``model.generate`` calls made (one per batch).
        batched_requests: Observations answered by those calls.
        largest_batch: Most observations in one call.
        failed_calls: Calls that raised (their requests failed with ``PolicyError``).
        prompt_tokens: Prompt tokens of the answered observations (padding excluded).
        completion_tokens: Returned completion tokens.
        generate_seconds: Wall time spent inside ``generate`` and post-processing, and
            scoring continuations.
        scoring_calls: ``score_continuations`` calls made.
        scored_continuations: Continuations they scored.
        prefill_tokens: Prompt positions actually read by the model (a prompt shared by several
            rows, a prefix every row shares and prefixes reused from the prefix cache count once
            or not at all), scored prompts included.
        reused_prefix_tokens: Prompt positions taken from the prefix cache instead of being read.
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
    prefill_tokens: int = 0
    reused_prefix_tokens: int = 0

    @property
    def mean_batch_size(self) -> float:
        """Observations per ``generate`` call."""
        return self.batched_requests / self.generate_calls if self.generate_calls else 0.0

    def to_dict(self) -> dict[str, float]:
        return {**asdict(self), "mean_batch_size": self.mean_batch_size}


class HFGenerator:
    """A transformers causal LM as a :class:`~collab_env.agents.tokens.TokenGenerator`.

    Args:
        model, tokenizer, device, dtype, adapter: As for
            :func:`~collab_env.agents.hf_loading.load_causal_lm`.
        max_batch_size: Most rows in one ``generate`` call.
        name: Name in completions and errors (default ``"hf:<model folder name>"``).
        chat_template: Require the tokenizer to have a chat template
            (:class:`~collab_env.agents.hf.HFPolicy` renders observations with it).

    Raises:
        ConfigError: Invalid argument, no chat template where one is required, or no EOS token.
        MissingDependencyError: torch, transformers or peft is not installed.
    """

    #: Read a prompt that several rows of a ``generate`` call share once (one forward pass over
    #: the distinct prompts fills the KV cache every copy continues from) instead of once per row.
    #: Turned off by itself for models whose cache is not plain full attention.
    shared_prefill = True
    #: Read a prefix that every row of a ``generate`` call shares once, when it is at least this
    #: many tokens (below it, the extra forward pass costs more than it saves); needs
    #: :attr:`shared_prefill`.
    min_shared_prefix = 16
    #: Prompt positions whose KV caches a new generator keeps for later calls (see
    #: :class:`~collab_env.agents.hf_prefix.PrefixCache`; :attr:`prefix_cache_tokens` changes it on
    #: an instance). About 190 MB for SmolLM2-135M in float32; a few judge and simulator prompts.
    default_prefix_cache_tokens = 4096

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        *,
        device: str = "auto",
        dtype: str = "auto",
        adapter: Any = None,
        max_batch_size: int = 16,
        name: str | None = None,
        chat_template: bool = False,
    ) -> None:
        check_device_and_dtype(device, dtype)
        if not isinstance(max_batch_size, int) or max_batch_size < 1:
            raise ConfigError(f"max_batch_size must be an int >= 1, got {max_batch_size!r}.")
        self.max_batch_size = max_batch_size
        self.stats = GenerationStats()
        self._torch = require("torch", "hf", "HFPolicy")
        require("transformers", "hf", "HFPolicy")
        self.model, self.tokenizer, self._model_label = load_causal_lm(
            model, tokenizer, device=device, dtype=dtype, adapter=adapter)
        self.model.eval()
        if chat_template and not getattr(self.tokenizer, "chat_template", None):
            raise ConfigError(
                "the tokenizer has no chat template; pass a chat model's tokenizer or set "
                "tokenizer.chat_template to a Jinja template."
            )
        self._eos_ids = eos_token_ids(self.tokenizer, self.model)
        if not self._eos_ids:
            raise ConfigError("neither the tokenizer nor the model's generation config names an EOS token.")
        pad = self.tokenizer.pad_token_id
        self._pad_id = int(pad) if pad is not None else self._eos_ids[0]
        self.name = name or f"hf:{self._model_label}"
        # Generate and scoring calls (from worker threads) are serialised by this lock.
        self._model_lock = threading.Lock()
        self._prefix_cache = PrefixCache(self.default_prefix_cache_tokens)
        self._prefix_version: int | None = None

    def _weights_version(self) -> int | None:
        """A number that changes whenever a weight of the model is written in place (an optimiser
        step, ``load_state_dict``, a LoRA adapter's update): the sum of torch's version counters of
        the parameters. The prefix cache is dropped when it changes, so a stored KV cache is never
        reused under other weights. ``None`` (never equal: no reuse) when the counters are not
        readable. Fused optimisers (``torch.optim.AdamW(fused=True)``) write without bumping the
        counters: a trainer that steps this model must call :meth:`reset_prefix_cache` after each
        step (collab_env's learners and TRL adapter do)."""
        try:
            return sum(int(p._version) for p in self.model.parameters())
        except (AttributeError, RuntimeError):
            return None

    @property
    def prefix_cache_tokens(self) -> int:
        """Prompt positions whose KV caches are kept for later calls; 0 turns the reuse off (setting
        it forgets what is stored)."""
        return self._prefix_cache.max_tokens

    @prefix_cache_tokens.setter
    def prefix_cache_tokens(self, n: int) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ConfigError(f"prefix_cache_tokens must be an int >= 0, got {n!r}.")
        with self._model_lock:
            self._prefix_cache = PrefixCache(n)

    def reset_prefix_cache(self) -> bool:
        """Forget the stored prompt prefixes (see :attr:`prefix_cache_tokens`), so the next calls
        read their prompts in full (a benchmark's cold start). Returns ``True`` (the name and the
        result follow vLLM's ``reset_prefix_cache``)."""
        with self._model_lock:
            self._prefix_cache.clear()
        return True

    @property
    def model_label(self) -> str:
        """The model folder's name (``+<adapter folder>`` with an adapter folder), else the
        model's class name."""
        return self._model_label

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Every id that ends a completion (the tokenizer's EOS, the generation config's)."""
        return tuple(self._eos_ids)

    # -- the token-level interface (TokenGenerator) -------------------------------------------
    @property
    def pad_token_id(self) -> int:
        """The id to pad token sequences with: the tokenizer's pad token, else the first EOS id."""
        return self._pad_id

    def generate_tokens(self, prompts: Sequence[Sequence[int]], params: SamplingParams | Mapping[str, Any],
                        seeds: Sequence[int]) -> list[Completion]:
        """One :class:`~collab_env.types.Completion` per tokenised prompt (blocking), in
        ``model.generate`` calls of at most ``max_batch_size`` rows; row ``i`` samples with its own
        generator seeded by ``seeds[i]`` (see :class:`~collab_env.agents.tokens.TokenGenerator`).
        The prompts are used as they are: no chat template, no special tokens added.

        Raises:
            ConfigError: ``seeds`` does not have one seed per prompt, a prompt is empty, or
                ``params`` is invalid.
        """
        params = SamplingParams.coerce(params)
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
                prefix = self._common_prefix(prompts)
                input_ids, attention_mask = self._layout(prompts, prefix)
                width = input_ids.shape[1]
                sampler = RowSampler(params, seeds)
                criteria = StoppingCriteriaList()
                if params.stop:
                    criteria.append(StopStrings(self.tokenizer, params.stop, width))
                # Every field that could add a logits processor is set explicitly, so values in
                # the model's generation_config (e.g. a repetition penalty) cannot change the
                # distribution that `RowSampler` samples from and reports.
                config = GenerationConfig(
                    max_new_tokens=params.max_new_tokens,
                    do_sample=False,  # `RowSampler` samples; generate's argmax takes its choice
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
                    shared = self._shared_prefill(prompts, input_ids, attention_mask, device, prefix)
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
        """Cut one generated row at its first EOS or stop string and build its Completion."""
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

    def _common_prefix(self, prompts: Sequence[Sequence[int]]) -> int:
        """How many leading tokens every prompt of a ``generate`` call shares and reads once
        (:meth:`_shared_prefill`): the longest common prefix, short of every prompt's last token;
        0 when it is under :attr:`min_shared_prefix` (a single prompt: all but its last token, so
        the prefix cache can serve it) or :attr:`shared_prefill` is off."""
        if not self.shared_prefill:
            return 0
        n = min(len(p) for p in prompts) - 1
        for p in prompts[1:]:
            n = min(n, common_prefix_length(prompts[0], p))
        single = len(prompts) == 1 and n > 0 and self._prefix_cache.max_tokens > 0
        return n if n >= self.min_shared_prefix or single else 0

    def _layout(self, prompts: Sequence[Sequence[int]], prefix: int) -> tuple[Any, Any]:
        """``(input_ids, attention_mask)`` of a ``generate`` call: left padding, so every prompt
        ends at the last column; with a shared ``prefix`` (> 0), its tokens fill the first
        ``prefix`` columns of every row and the padding sits between it and each row's rest (the
        position ids, which generate derives from the mask, skip it)."""
        torch = self._torch
        rest = [p[prefix:] for p in prompts]
        width = prefix + max(len(r) for r in rest)
        input_ids = torch.full((len(prompts), width), self._pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
        if prefix:
            input_ids[:, :prefix] = torch.tensor(prompts[0][:prefix], dtype=torch.long)
            attention_mask[:, :prefix] = 1
        for i, r in enumerate(rest):
            if r:
                input_ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
                attention_mask[i, width - len(r):] = 1
        return input_ids, attention_mask

    def _read_prefix(self, ids: Sequence[int], keyword: str) -> tuple[Any, Any]:
        """``(logits, cache)`` after reading ``ids``: the logits at its last position and the KV
        cache (batch one), continuing the longest prefix of ``ids`` in the prefix cache; the result
        is stored there for later calls. A prompt stored whole is not read again (its logits were
        stored with it). Call it under the model lock and ``torch.inference_mode()``."""
        torch = self._torch
        version = self._weights_version()
        if version is None or version != self._prefix_version:  # other weights: nothing stored is valid
            self._prefix_cache.clear()
            self._prefix_version = version
        n, cache, logits = self._prefix_cache.longest(ids)
        self.stats.reused_prefix_tokens += n
        if logits is not None:
            return logits, cache
        if n == len(ids):  # a longer stored prompt covers it, but its logits here were not kept
            n -= 1
            cache = cropped(cache, n)
            self.stats.reused_prefix_tokens -= 1
        kwargs: dict[str, Any] = {keyword: cache} if cache is not None else {}
        if forward_accepts(self.model, "logits_to_keep"):
            kwargs["logits_to_keep"] = 1  # the last position's logits; the others are not wanted
        out = self.model(input_ids=torch.tensor([list(ids[n:])], device=self.model.device), use_cache=True, **kwargs)
        self.stats.prefill_tokens += len(ids) - n
        cache = getattr(out, "cache", None) or out.past_key_values
        logits = out.logits[0, -1]
        self._prefix_cache.add(ids, cache, logits)
        return logits, cache

    def _shared_prefill(self, prompts: Sequence[Sequence[int]], input_ids: Any, attention_mask: Any,
                        device: Any, prefix: int = 0) -> dict[str, Any]:
        """Read the prompts' shared parts once, and hand ``generate`` the KV cache of everything
        but each row's last token; returns the ``generate`` keyword holding that cache, or ``{}``
        (``generate`` reads the prompts itself).

        * A ``prefix`` (> 0, see :meth:`_common_prefix`) that every row starts with (laid out by
          :meth:`_layout`) is read once, at batch one, continuing the longest prefix of it that an
          earlier call left in the prefix cache.
        * Rows that repeat a prompt (a group's samples, a tree's forks) are read once: one forward
          pass over the distinct rows' rest (all but their last token), on the prefix's cache
          repeated per distinct row, whose rows are then repeated for every row of the batch.

        ``{}`` when there is neither a prefix nor a repeated prompt, the prompts are one token,
        :attr:`shared_prefill` is off, or the model's cache is not plain full attention (which turns
        :attr:`shared_prefill` off)."""
        torch = self._torch
        width = input_ids.shape[1]
        distinct, index = distinct_rows(prompts)
        if not self.shared_prefill or width < 2 or (not prefix and len(distinct) == len(prompts)):
            self.stats.prefill_tokens += sum(len(p) for p in prompts)
            return {}
        keyword = cache_keyword(self.model)
        cache = None
        if prefix:
            cache = self._read_prefix(prompts[0][:prefix], keyword)[1]
        if width - 1 > prefix:  # the distinct rows' rest, all but the last token
            ids, mask = input_ids[distinct, prefix:-1], attention_mask[distinct, :-1]
            # the position ids generate derives from the attention mask (left padding)
            positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)[:, prefix:]
            kwargs: dict[str, Any] = dict(input_ids=ids.to(device), attention_mask=mask.to(device),
                                          position_ids=positions.to(device), use_cache=True)
            if cache is not None:
                if not plain_layers(cache):
                    self.shared_prefill = False
                    return {}
                cache.batch_repeat_interleave(len(distinct))
                kwargs[keyword] = cache
            if forward_accepts(self.model, "logits_to_keep"):
                kwargs["logits_to_keep"] = 1  # only the cache is wanted, not logits over the prompt
            out = self.model(**kwargs)
            cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
            self.stats.prefill_tokens += sum(len(prompts[r]) - prefix - 1 for r in distinct)
        else:  # every row's rest is its last token: the prefix's cache serves them all
            index = [0] * len(prompts)
        self.stats.prefill_tokens += len(prompts)  # each row's last token, read by generate
        if cache is None or not plain_layers(cache):
            self.shared_prefill = False  # sliding windows, linear attention: not repeated this way
            self.stats.prefill_tokens -= len(prompts)
            self.stats.prefill_tokens += sum(len(p) for p in prompts)
            return {}
        cache.batch_select_indices(torch.tensor(index, dtype=torch.long, device=device))
        return {keyword: cache}

    def _decode(self, ids: Sequence[int]) -> str:
        """``tokenizer.decode(ids, skip_special_tokens=True)``."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    # -- scoring given continuations ----------------------------------------------------------
    def score_token_continuations(self, jobs: Sequence[tuple[Sequence[Sequence[int]], int]]) -> list[tuple[float, ...]]:
        """Blocking core of continuation scoring on token ids.

        Each job is ``(rows, start)``: token id lists that share their first ``start`` ids (the
        prompt), and the index of the first id to score. Per job, one forward pass over the
        shared ids fills the KV cache and gives the distribution of the first scored token; the
        cache is then repeated once per row and one batched pass over the rows' remaining ids
        (right-padded, masked) gives the others (:func:`~collab_env.agents.hf_scoring.score_rows`).
        The shared ids continue the longest prefix of them in the prefix cache (a judge's prompts
        for the futures of one reply share their template and the conversation up to the first
        sampled turn), and are stored there.
        Returns the sum over ``rows[j][start:]`` of ``log p(token | everything before it)`` per row.
        """
        torch = self._torch
        results: list[tuple[float, ...]] = []
        start_t = time.perf_counter()
        with self._model_lock, torch.inference_mode():
            keyword = cache_keyword(self.model)
            for rows, start in jobs:
                read = (lambda ids, kw=keyword: self._read_prefix(ids, kw)) if self.shared_prefill else None
                results.append(score_rows(self.model, rows, start, pad_id=self._pad_id, cache_keyword=keyword,
                                          read_prefix=read))
            self.stats.scoring_calls += 1
            self.stats.scored_continuations += sum(len(rows) for rows, _ in jobs)
            self.stats.generate_seconds += time.perf_counter() - start_t
        return results

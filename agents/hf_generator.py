"""Token-level generation on a transformers causal LM: :class:`HFGenerator`.

:class:`HFGenerator` loads the model (:func:`~collab_env.agents.hf_loading.load_causal_lm`) and
implements the token-level interface (:class:`~collab_env.agents.tokens.TokenGenerator`):
:meth:`~HFGenerator.generate_tokens` generates from token ids (no chat template) in
``model.generate`` calls of at most ``max_batch_size`` rows, each row with its own seed
(:class:`~collab_env.agents.hf_sampling.RowSampler`), and :attr:`~HFGenerator.pad_token_id` is
the id to pad with. A prompt that several rows of a call share is read once (one prefill over
the distinct prompts, whose KV cache every copy continues from). It also scores given
continuations on token ids (:meth:`~HFGenerator.score_token_continuations`).

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

from collab_env.agents.hf_loading import (
    cache_keyword,
    check_device_and_dtype,
    eos_token_ids,
    forward_accepts,
    load_causal_lm,
)
from collab_env.agents.hf_sampling import RowSampler, StopStrings
from collab_env.agents.hf_scoring import score_rows
from collab_env.agents.tokens import sampling_params
from collab_env.errors import ConfigError, require
from collab_env.policy import SamplingParams
from collab_env.types import Completion

__all__ = ["HFGenerator", "GenerationStats"]


@dataclass
class GenerationStats:
    """Counters of one :class:`~collab_env.agents.hf.HFPolicy` (read them as ``policy.stats``).

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
        keyword = cache_keyword(self.model)
        kwargs: dict[str, Any] = dict(input_ids=ids.to(device), attention_mask=mask.to(device),
                                      position_ids=positions.to(device), use_cache=True)
        if forward_accepts(self.model, "logits_to_keep"):
            kwargs["logits_to_keep"] = 1  # only the cache is wanted, not logits over the prompt
        cache = getattr(self.model(**kwargs), keyword, None)
        layers = getattr(cache, "layers", None)
        if not layers or any(type(layer).__name__ != "DynamicLayer" for layer in layers):
            self.shared_prefill = False  # sliding windows, linear attention: not repeated this way
            return {}
        cache.batch_select_indices(torch.tensor([slot[r] for r in owner], dtype=torch.long, device=device))
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
        Returns the sum over ``rows[j][start:]`` of ``log p(token | everything before it)`` per row.
        """
        torch = self._torch
        results: list[tuple[float, ...]] = []
        start_t = time.perf_counter()
        with self._model_lock, torch.inference_mode():
            keyword = cache_keyword(self.model)
            for rows, start in jobs:
                results.append(score_rows(self.model, rows, start, pad_id=self._pad_id, cache_keyword=keyword))
            self.stats.scoring_calls += 1
            self.stats.scored_continuations += sum(len(rows) for rows, _ in jobs)
            self.stats.generate_seconds += time.perf_counter() - start_t
        return results

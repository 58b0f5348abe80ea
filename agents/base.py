"""Backend helpers shared by the policies of :mod:`collab_env.agents`: continuation scoring and
reply prefills.

The policy contract itself (:class:`Policy`, :class:`SamplingParams`, :func:`resolve_policy`,
the policy-name registry, usage summing) lives in :mod:`collab_env.policy`, and is imported from
there only.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from collab_env.errors import ConfigError
from collab_env.types import Conversation

__all__ = [
    "ContinuationScorer",
    "can_score_continuations",
    "common_prefix_length",
    "distinct_rows",
    "continuation_token_ids",
    "continuation_jobs",
    "EMBEDDED_NAMES",
    "is_embedded",
]


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


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading token ids ``a`` and ``b`` share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def distinct_rows(rows: Sequence[Sequence[int]]) -> tuple[list[int], list[int]]:
    """``(distinct, index)``: the first row of each distinct token sequence of ``rows``, in
    order, and for each row which of them holds its sequence (``rows[distinct[index[i]]] ==
    rows[i]``). The rows that repeat a prompt (a group's samples, a tree's forks) are read once
    by a forward pass over ``distinct``, whose cache is then indexed by ``index``."""
    first: dict[tuple[int, ...], int] = {}
    owner = [first.setdefault(tuple(r), i) for i, r in enumerate(rows)]
    distinct = sorted(first.values())
    slot = {row: k for k, row in enumerate(distinct)}
    return distinct, [slot[o] for o in owner]


def continuation_token_ids(tokenizer: Any, prompt_text: str,
                           continuations: Sequence[str]) -> tuple[list[list[int]], int]:
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
    start = min([len(prompt_ids)] + [common_prefix_length(ids, prompt_ids) for ids in rows])
    if start < 1:
        raise ConfigError("the prompt of a continuation score has no token of its own to condition on.")
    return rows, start


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


def is_embedded(policy: Any) -> bool:
    """Whether ``policy`` is the embedded SmolLM2-135M itself
    (:class:`~collab_env.agents.embedded.EmbeddedPolicy`, LoRA-adapted or not), without
    importing its module (transformers): that module is imported whenever such a policy exists.
    A wrapper around it (a response cache, whose replay may run without the model) is not."""
    mod = sys.modules.get("collab_env.agents.embedded")
    return mod is not None and isinstance(policy, mod.EmbeddedPolicy)


#: ``Message.meta`` key marking a final assistant message as a *prefill*: the start of the reply
#: that the model continues (local backends with ``supports_prefill = True``: HF, vLLM).
PREFILL = "prefill"


def is_prefilled(observation: Any) -> bool:
    """Whether the observation ends with an assistant message to be continued (a prefill)."""
    msgs: Sequence[Any] = getattr(observation, "messages", ())
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


def stop_list(stop: Any) -> list[str]:
    """A ``stop`` sampling value as a list of strings (one string is one stop string, not its
    characters; ``None`` is none)."""
    if stop is None:
        return []
    return [stop] if isinstance(stop, str) else list(stop)


def prefill_sampling(prefix: str | None, sampling: Mapping[str, Any]) -> dict[str, Any]:
    """Sampling keywords for a prefilled call: a prefix that opens a JSON string (e.g.
    ``'{"response": "'``) stops at the string's closing quote."""
    if not _opens_string(prefix):
        return dict(sampling)
    return {**sampling, "stop": [*stop_list(sampling.get("stop")), '"']}


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

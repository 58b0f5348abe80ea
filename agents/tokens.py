"""The token-level generation contract shared by the transformers and vLLM backends.

A learner samples its own rollouts from token ids (its own tokenisation, so the prompts are
exactly those its loss reads), one seed per row, and needs the generated ids and their log-probs
back. :class:`TokenGenerator` is that interface (its sampling argument is read by
:meth:`SamplingParams.coerce <collab_env.policy.SamplingParams.coerce>`); :func:`row_seed`
derives the seed of each observation of a seeded ``act`` call.
:func:`chat_prompt_text` and :func:`rendered_prompt_ids` are how both backends turn an
observation into the prompt ids they generate from (the tokenizer's chat template).

Implemented by :class:`~collab_env.agents.hf.HFPolicy`, :class:`~collab_env.agents.vllm.VLLMPolicy`,
the learners' vLLM engine (:class:`~collab_env.adapters.common.vllm_engine.VLLMGenerator`) and
:class:`~collab_env.adapters.common.models.PolicyModel`. These names are imported from here only.

:class:`TokenHistory` builds the prompts of a player whose episode is trained as one token
sequence (TRL's ``rollout_func``, the verl agent loop): each later prompt extends the earlier
prompt and the exact ids the model generated, instead of re-tokenising the reply's text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from collab_env.agents.base import chat_template_mode
from collab_env.errors import ConfigError
from collab_env.policy import SamplingParams
from collab_env.types import Completion, Conversation, template_chat

__all__ = ["TokenGenerator", "TokenHistory", "row_seed", "chat_prompt_text", "rendered_prompt_ids"]


@runtime_checkable
class TokenGenerator(Protocol):
    """Token-level generation: what a learner needs from a backend to sample its own rollouts.

    Implemented by :class:`~collab_env.agents.hf.HFPolicy`,
    :class:`~collab_env.agents.vllm.VLLMPolicy`, the learners' vLLM engine
    (:class:`~collab_env.adapters.common.vllm_engine.VLLMGenerator`) and
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


def row_seed(seed: int, index: int) -> int:
    """The seed of observation ``index`` of an ``act`` call seeded with ``seed``.

    Distinct per index, so ``act([obs] * 8, seed=s)`` draws 8 different samples, all
    reproducible; a non-negative int below ``2**63``. Both backends derive it the same way, so a
    seeded call gives each row the same seed on either.
    """
    import numpy as np

    state = np.random.SeedSequence([int(seed) & 0xFFFFFFFFFFFFFFFF, index]).generate_state(1, np.uint64)
    return int(state[0] >> 1)


def chat_prompt_text(tokenizer: Any, observation: Conversation, system_prompt: str | None = None) -> str:
    """The prompt of one observation as text: the tokenizer's chat template rendering with the
    generation prompt (or the prefilled reply to continue, left open); ``system_prompt`` is put
    first when the observation has no system message. Messages carry their ``tool_calls`` and
    ``tool_call_id`` (:meth:`Conversation.to_chat`), and the tools the env declared for the
    player (:attr:`Conversation.tools`) go to the template as ``tools=``. A call is rendered once,
    from the text the model wrote (:func:`~collab_env.types.template_chat`), so the ids of a
    reply that made it stay the ones generated."""
    chat = template_chat(observation.to_chat())
    if system_prompt is not None and not any(m["role"] == "system" for m in chat):
        chat = [{"role": "system", "content": system_prompt}, *chat]
    tools = observation.tools
    extra: dict[str, Any] = {"tools": tools} if tools else {}
    return tokenizer.apply_chat_template(chat, tokenize=False, **chat_template_mode(observation), **extra)


def rendered_prompt_ids(tokenizer: Any, text: str) -> list[int]:
    """The token ids of a prompt rendered by :func:`chat_prompt_text` (exactly what
    ``Completion.prompt_token_ids`` holds)."""
    # The template already writes any BOS token, so the tokenizer must not add another.
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


class TokenHistory:
    """The prompt ids of one player over the turns of one episode, extending its exact token history.

    A sampled reply is not always the tokenizer's own encoding of its text, so re-rendering the
    conversation and tokenising it afresh can split the earlier reply differently from how the
    model wrote it. :meth:`prompt_ids` avoids that: when the new observation's chat-template text
    starts with an earlier prompt's text followed by the reply generated from it (as the
    template renders it), the prompt is the earlier prompt's ids, the generated ids, and the
    tokens of the rest of the text only. The generated ids are kept as they are, trailing
    special tokens included: an EOS that the template writes as its end-of-turn marker is not
    repeated, one it does not write stays before the marker. The longest such earlier turn is
    used (a policy that also plays forked futures, as the multiturn-aware reward's, has several);
    with none, the prompt is the plain rendering, identical to
    :class:`~collab_env.agents.hf.HFPolicy`'s.

    Whether the whole episode then forms one sequence is checked where it is assembled, by
    :func:`~collab_env.rollout.token_transcript`.

    Args:
        tokenizer: The trained model's tokenizer (its chat template renders the prompts).
        system_prompt: Put first when an observation has no system message.
    """

    def __init__(self, tokenizer: Any, system_prompt: str | None = None) -> None:
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt
        self._special = {int(t) for t in (getattr(tokenizer, "all_special_ids", None) or ())}
        self._texts: dict[tuple[int, ...], str] = {}
        # (text up to the end of the reply, trailing special tokens' text, prompt + generated ids)
        self._turns: list[tuple[str, str, list[int]]] = []

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def prompt_ids(self, observation: Conversation) -> list[int]:
        """The prompt ids of ``observation`` (see the class docstring)."""
        text = chat_prompt_text(self.tokenizer, observation, self.system_prompt)
        best: tuple[str, str, list[int]] | None = None
        for turn in self._turns:
            head = turn[0]
            if len(head) < len(text) and text.startswith(head) and (best is None or len(head) > len(best[0])):
                best = turn
        if best is None:
            ids = rendered_prompt_ids(self.tokenizer, text)
        else:
            head, tail, done = best
            rest = text[len(head):]
            if tail and rest.startswith(tail):
                rest = rest[len(tail):]
            ids = done + rendered_prompt_ids(self.tokenizer, rest)
        self._texts[tuple(ids)] = text
        return ids

    def record(self, completion: Completion) -> None:
        """Remember ``completion`` (generated from a prompt this history built; its
        ``prompt_token_ids``, ``token_ids`` and ``text``), so that later prompts extend it. The
        reply is matched by its text as the episode records it (``completion.text``: special
        tokens written inside a reply are kept in the ids, not in the text).

        Raises:
            ConfigError: Its prompt ids did not come from :meth:`prompt_ids`.
        """
        prompt = [int(t) for t in completion.prompt_token_ids or ()]
        generated = [int(t) for t in completion.token_ids or ()]
        text = self._texts.get(tuple(prompt))
        if text is None:
            raise ConfigError("TokenHistory.record: the completion's prompt ids were not built by this history's "
                              "prompt_ids().")
        k = len(generated)
        while k > 0 and generated[k - 1] in self._special:
            k -= 1
        self._turns.append((text + completion.text, self._decode(generated[k:]), prompt + generated))

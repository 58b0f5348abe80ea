"""The trained model as a token generator, and the policies over it (:class:`TranscriptPolicy`: the
trained player's exact token history)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from collab_env.errors import ConfigError, PolicyError
from collab_env.policy import SamplingParams
from collab_env.types import Completion, Conversation


class VLLMGenerationGenerator:
    """TRL's vLLM (``trainer.vllm_generation``) as a batched token generator: one
    ``generate(prompts=ids, images=None, num_generations=1)`` call per batch, TRL's sampling
    settings (``params`` other than the batch are not TRL's to change). The log-prob of each
    token is vLLM's (top-1 entry, the sampled token)."""

    flush = "idle"
    idle_passes = 64

    def __init__(self, vllm_generation: Any, tokenizer: Any, eos_token_ids: Sequence[int], *,
                 max_batch_size: int = 256, max_wait_ms: float = 50.0) -> None:
        self.vllm_generation = vllm_generation
        self.tokenizer = tokenizer
        self.eos_token_ids = tuple(int(t) for t in eos_token_ids)
        self.max_batch_size = max_batch_size
        self.max_wait_ms = max_wait_ms
        self.name = "trl-vllm"

    def generate_batch(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                       seeds: Sequence[int]) -> list[Completion]:
        """One completion per prompt from one vLLM call (blocking)."""
        _, ids, logprobs, _ = self.vllm_generation.generate(
            prompts=[list(p) for p in prompts], images=None, num_generations=1)
        if len(ids) != len(prompts):
            raise PolicyError(f"vLLM returned {len(ids)} completions for {len(prompts)} prompts.")
        out = []
        for p, c, lp in zip(prompts, ids, logprobs, strict=True):
            c = tuple(int(t) for t in c)
            lps = tuple(float("nan") if x is None else float(x[0] if isinstance(x, (list, tuple)) else x) for x in lp)
            done = bool(c) and c[-1] in self.eos_token_ids
            out.append(Completion(text=self.tokenizer.decode(c, skip_special_tokens=True), token_ids=c, logprobs=lps,
                                  prompt_token_ids=tuple(p), finish_reason="stop" if done else "length",
                                  usage={"model_calls": 1, "prompt_tokens": len(p), "completion_tokens": len(c)}))
        return out


class TrainerGenerator:
    """The trainer's model as a token generator with a micro-batching queue: the concurrent
    requests of every episode of a batch (and of the multiturn-aware reward's futures) are
    merged into one model call per round.

    Args:
        backend: What generates: an :class:`~collab_env.agents.hf.HFPolicy` over the trainer's
            model, or a :class:`VLLMGenerationGenerator`.
        tokenizer: The trainer's tokenizer (its chat template renders the observations).
        params: Sampling settings of the trained player's turns.
    """

    def __init__(self, backend: Any, tokenizer: Any, params: SamplingParams) -> None:
        from collab_env.agents.hf_batching import LoopBatchers

        self.backend = backend
        self.tokenizer = tokenizer
        self.params = params
        self.eos_token_ids = tuple(backend.eos_token_ids)
        self._queues = LoopBatchers(backend)

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams | None = None) -> Completion:
        """One completion of ``prompt_ids``; the row's seed comes from torch's global generator,
        so ``transformers.set_seed`` (TRL's ``seed``) makes runs repeatable."""
        import torch

        seed = int(torch.randint(0, 2**62, (1,)).item())
        return await self._queues.current().submit([int(t) for t in prompt_ids], params or self.params, seed)

    def prompt_ids(self, observation: Conversation) -> list[int]:
        """The chat template's ids of ``observation`` (as every backend renders it:
        :func:`~collab_env.agents.tokens.chat_prompt_text`)."""
        from collab_env.agents.tokens import chat_prompt_text, rendered_prompt_ids

        return rendered_prompt_ids(self.tokenizer, chat_prompt_text(self.tokenizer, observation))


class ChatPolicy:
    """A stateless :class:`~collab_env.policy.Policy` over a :class:`TrainerGenerator`: each
    observation rendered by the chat template (what the multiturn-aware reward's futures play
    the trained player with: :meth:`TranscriptPolicy.fork`)."""

    def __init__(self, generator: TrainerGenerator) -> None:
        self.generator = generator
        self.name = f"trl-model({generator.backend.name})"

    async def act(self, observations: Sequence[Conversation], **sampling: Any) -> list[Completion]:
        sampling.pop("seed", None)  # the row seeds come from the trainer's generator
        params = SamplingParams.from_kwargs(**{**params_dict(self.generator.params), **sampling})
        return list(await asyncio.gather(*(self.generator.generate(self.generator.prompt_ids(o), params)
                                           for o in observations)))


def params_dict(p: SamplingParams) -> dict[str, Any]:
    """The sampling keywords of ``p`` (``temperature``, ``top_p``, ``top_k``, ``max_new_tokens``, ``stop``)."""
    return {"temperature": p.temperature, "top_p": p.top_p, "top_k": p.top_k, "max_new_tokens": p.max_new_tokens,
            "stop": p.stop}


class TranscriptPolicy:
    """The trained player of ONE episode: its prompts are its exact token history.

    The first prompt is the chat template of the first observation. Each later prompt is the
    previous prompt + the generated ids + the tokens of the text that follows them in the new
    rendering (the template's end-of-turn marker and the messages that arrived since), built by
    :class:`~collab_env.agents.tokens.TokenHistory` (the same builder as the verl agent loop's).
    So every prompt extends the previous prompt and completion token for token, and
    :func:`~collab_env.rollout.token_transcript` of the episode is exact; it raises
    ``ConfigError`` when the env or the chat template rewrote an earlier turn.
    """

    def __init__(self, generator: TrainerGenerator, params: SamplingParams | None = None) -> None:
        from collab_env.agents.tokens import TokenHistory

        self.generator = generator
        self.params = params or generator.params
        self.name = f"trl-model({generator.backend.name})"
        self.history = TokenHistory(generator.tokenizer)

    async def act(self, observations: Sequence[Conversation], **sampling: Any) -> list[Completion]:
        if len(observations) != 1:
            raise ConfigError("TranscriptPolicy plays one episode: one observation per call.")
        ids = self.history.prompt_ids(observations[0])
        completion = await self.generator.generate(ids, self.params)
        if list(completion.prompt_token_ids or ids) != ids:
            raise PolicyError("the generator changed the prompt ids it was given.")
        self.history.record(completion)
        return [completion]

    def fork(self) -> ChatPolicy:
        """The policy of a fork of this episode (a multiturn-aware reward's futures): the same
        generator and sampling, without this episode's token history."""
        return ChatPolicy(self.generator)

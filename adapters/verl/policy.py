"""A collab_env policy whose completions come from verl's rollout server.

:class:`ServerPolicy` renders each observation with the tokenizer's chat template (our own
rendering, :class:`~collab_env.agents.tokens.TokenHistory`), sends the prompt ids to
``await server_manager.generate(request_id=..., prompt_ids=..., sampling_params=...)`` and
returns a :class:`~collab_env.types.Completion` holding the exact ids and log-probs the server
returned. It needs nothing from verl itself: any object with that ``generate`` coroutine
returning ``token_ids``, ``log_probs`` and ``stop_reason`` (verl's
``TokenOutput``) serves it.

Multi-turn prompts extend the earlier ones token for token: the prompt of a later turn is the
earlier prompt, the exact ids the server generated and the tokens of the new text only (the
same :class:`~collab_env.agents.tokens.TokenHistory` that TRL's ``rollout_func`` uses), as verl's
own agent loops build it. A first prompt is the plain rendering, identical to
:class:`~collab_env.agents.hf.HFPolicy`'s.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from collab_env.agents.tokens import TokenHistory
from collab_env.errors import ConfigError, PolicyError
from collab_env.types import FAULT, Completion, Conversation

__all__ = ["ServerPolicy", "SAMPLING_KEYS"]

#: collab_env sampling keyword -> the verl/vLLM sampling-params key it becomes.
SAMPLING_KEYS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
                 "max_new_tokens": "max_tokens", "stop": "stop", "seed": "seed"}


class ServerPolicy:
    """The trained player's policy inside a verl agent loop (see the module docstring).

    Args:
        server_manager: verl's ``server_manager`` (``AgentLoopBase.server_manager``) or anything
            with ``async generate(request_id, *, prompt_ids, sampling_params)``.
        tokenizer: The trained model's tokenizer (its chat template renders the prompts).
        sampling_params: verl's sampling parameters for this sample (what ``run`` received);
            collab_env sampling keywords given to :meth:`act` override them key by key.
        system_prompt: Put first when an observation has no system message.
        pass_seed: Forward the driver's ``seed=`` to the server. Off by default: verl repeats a
            row ``rollout.n`` times with the same env seed, and GRPO needs the n samples to differ.
        name: Shown in episodes and errors.
    """

    def __init__(self, server_manager: Any, tokenizer: Any, sampling_params: Mapping[str, Any] | None = None,
                 *, system_prompt: str | None = None, pass_seed: bool = False, name: str = "verl-server"):
        if not callable(getattr(server_manager, "generate", None)):
            raise ConfigError(f"server_manager must have an async generate(request_id, *, prompt_ids, "
                              f"sampling_params); got {type(server_manager).__name__}.")
        self.server_manager, self.tokenizer = server_manager, tokenizer
        self.sampling_params = dict(sampling_params or {})
        self.system_prompt, self.pass_seed, self.name = system_prompt, pass_seed, name
        self.request_id = uuid.uuid4().hex
        self.history = TokenHistory(tokenizer, system_prompt)

    def request_params(self, sampling: Mapping[str, Any]) -> dict[str, Any]:
        """verl's sampling parameters with the collab_env keywords of one ``act`` call applied."""
        out = dict(self.sampling_params)
        for key, value in sampling.items():
            if key not in SAMPLING_KEYS:
                raise ConfigError(f"{self.name}: unknown sampling keyword {key!r} (known: {sorted(SAMPLING_KEYS)}).")
            if key == "seed" and not self.pass_seed:
                continue
            if value is None:
                continue
            out[SAMPLING_KEYS[key]] = list(value) if key == "stop" and not isinstance(value, str) else value
        out["logprobs"] = True  # the transcript needs the log-prob of every generated token
        return out

    def prompt_ids(self, observation: Conversation) -> list[int]:
        """The prompt ids of one observation (see the module docstring)."""
        return self.history.prompt_ids(observation)

    async def act(self, observations: Sequence[Conversation], **sampling: Any) -> list[Completion]:
        """One completion per observation, each from one ``server_manager.generate`` call.

        Raises:
            ConfigError: An unknown sampling keyword.
            PolicyError: The server failed or returned ids and log-probs of different lengths.
        """
        params = self.request_params(sampling)
        out = []
        for obs in observations:
            prompt = self.prompt_ids(obs)
            try:
                result = await self.server_manager.generate(request_id=self.request_id, prompt_ids=list(prompt),
                                                            sampling_params=dict(params))
            except Exception as exc:
                raise PolicyError(f"{self.name}: server_manager.generate failed: {exc!r}") from exc
            ids = [int(i) for i in result.token_ids]
            lps = getattr(result, "log_probs", None)
            if lps is None or len(lps) != len(ids):
                raise PolicyError(f"{self.name}: the server returned {len(ids)} token ids but "
                                  f"{'no' if lps is None else len(lps)} log-probs; the agent loop asks for "
                                  "them (sampling_params['logprobs']); check the rollout engine's settings.")
            stop = getattr(result, "stop_reason", None)
            meta = {"policy": self.name, "stop_reason": stop}
            if stop == "aborted":
                out.append(Completion("", finish_reason=FAULT, prompt_token_ids=tuple(prompt),
                                      usage={"model_calls": 1.0, "faults": 1.0},
                                      meta={**meta, "fault": "the server aborted the request"}))
                continue
            max_tokens = params.get("max_tokens")
            finish = "length" if max_tokens is not None and len(ids) >= max_tokens and stop != "completed" else "stop"
            completion = Completion(
                text=self.tokenizer.decode(ids, skip_special_tokens=True),
                token_ids=tuple(ids), logprobs=tuple(float(x) for x in lps), prompt_token_ids=tuple(prompt),
                finish_reason=finish,
                usage={"model_calls": 1.0, "prompt_tokens": len(prompt), "completion_tokens": len(ids)},
                meta=meta,
            )
            self.history.record(completion)
            out.append(completion)
        return out

    def fork(self) -> ServerPolicy:
        """The policy of a fork of this sample's episode (a multiturn-aware reward's futures): the
        same server, request id (its prefix cache) and sampling, with a token history of its own,
        so the futures never touch the sample's transcript."""
        new = ServerPolicy(self.server_manager, self.tokenizer, self.sampling_params, system_prompt=self.system_prompt,
                           pass_seed=self.pass_seed, name=f"{self.name}/fork")
        new.request_id = self.request_id
        return new

    def __repr__(self) -> str:
        return f"ServerPolicy({self.name!r})"

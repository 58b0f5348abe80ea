"""One player's episode as one token sequence with a per-token trainable mask.

Multi-turn trainers that optimise a whole conversation at once (a verl agent loop, TRL's
``rollout_func``, SkyRL) want a single sequence per episode: the first prompt, then the
player's completions with everything in between (other players' messages, the chat template's
turn markers), and a mask that is 1 on the tokens the policy generated and 0 on the rest.
:func:`token_transcript` builds it from the exact ids the policy returned, never by
re-tokenising text: each later prompt must extend the previous prompt plus completion
token for token, which holds when the chat template renders earlier turns unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from collab_env.errors import ConfigError
from collab_env.rollout.driver import trainable_turns
from collab_env.types import Episode

__all__ = ["TokenTranscript", "token_transcript"]


@dataclass
class TokenTranscript:
    """A player's episode as ``prompt_ids + response_ids`` with a mask over the response."""

    prompt_ids: list[int]
    """The ids of the player's first prompt."""
    response_ids: list[int] = field(default_factory=list)
    """Everything after it: the player's completions and the tokens between them."""
    mask: list[int] = field(default_factory=list)
    """Per response token: 1 when the policy generated it (trainable), 0 otherwise."""
    logprobs: list[float] = field(default_factory=list)
    """Per response token: the policy's log-prob when generated, 0.0 elsewhere (masked)."""
    turns: int = 0
    """Completions in the transcript."""

    @property
    def num_trainable(self) -> int:
        """Tokens the policy generated (``sum(mask)``)."""
        return sum(self.mask)


def token_transcript(episode: Episode, player: str) -> TokenTranscript:
    """``player``'s trainable moves of ``episode`` as one sequence (see the module docstring).

    Args:
        episode: A finished episode whose moves by ``player`` carry token ids and log-probs
            (rolled out with a backend that returns them: hf, vllm, the embedded model).
        player: A trainable player of the episode.

    Returns:
        The :class:`TokenTranscript`.

    Raises:
        ConfigError: ``player`` made no trainable move; a move lacks token ids or log-probs; or
            a later prompt does not extend the earlier prompt and completion token for token
            (the chat template rewrote an earlier turn, or the env clipped a move): train on
            the turns separately (:func:`~collab_env.rollout.trainable_turns`).
    """
    turns = trainable_turns(episode, player, require_tokens=True)
    if not turns:
        raise ConfigError(f"player {player!r} made no trainable move in this episode; nothing to train on.")
    first = turns[0].completion
    # require_tokens=True: every turn has a completion with its prompt ids, token ids and log-probs
    assert first is not None and first.prompt_token_ids is not None
    out = TokenTranscript(prompt_ids=list(first.prompt_token_ids))
    for t in turns:
        c = t.completion
        assert c is not None and c.prompt_token_ids is not None and c.token_ids is not None and c.logprobs is not None
        if t is not turns[0]:
            so_far = out.prompt_ids + out.response_ids
            prompt = list(c.prompt_token_ids)
            if prompt[: len(so_far)] != so_far:
                raise ConfigError(
                    f"the prompt of {player!r} at step {t.step} does not extend the earlier prompt and "
                    "completions token for token (the chat template re-rendered an earlier turn, or the "
                    "env changed a move); use trainable_turns() and train on each turn separately."
                )
            between = prompt[len(so_far):]
            out.response_ids += between
            out.mask += [0] * len(between)
            out.logprobs += [0.0] * len(between)
        ids, lps = list(c.token_ids), list(c.logprobs)
        if len(ids) != len(lps):
            raise ConfigError(f"the move of {player!r} at step {t.step} has {len(ids)} token ids but "
                              f"{len(lps)} log-probs.")
        out.response_ids += ids
        out.mask += [1] * len(ids)
        out.logprobs += [float(x) for x in lps]
        out.turns += 1
    return out

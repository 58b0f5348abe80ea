"""One player's episode as one token sequence with a per-token trainable mask.

Multi-turn trainers that optimise a whole conversation at once (a verl agent loop, TRL's
``rollout_func``, SkyRL) want a single sequence per episode: the first prompt, then the
player's completions with everything in between (other players' messages, the chat template's
turn markers), and a mask that is 1 on the tokens the policy generated and 0 on the rest.
:func:`token_transcript` builds it from the exact ids the policy returned, never by
re-tokenising text: each later prompt must extend the previous prompt plus completion
token for token, which holds when the chat template renders earlier turns unchanged.

Turn-level credit. :func:`turn_rewards` splits the player's return by its moves: a move's credit is
the player's reward at the step of the move plus its rewards at the steps before its next move
(a simulated user's reply, the env's end-of-episode score); under the multiturn-aware reward
the reward of the move's own step is that reply's MR. :func:`turn_samples` gives each move as a
sample of its own (its prompt, its completion, its log-probs, its credit): CollabLLM's recipe
trains one sample per turn with that turn's MR. :class:`TokenTranscript` carries the same
credit for one-sequence trainers: ``turn_ids`` says which move generated each response token
and ``turn_rewards`` holds each move's credit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from collab_env.errors import ConfigError
from collab_env.rollout.driver import trainable_turns
from collab_env.types import Episode, TurnRecord

__all__ = ["TokenTranscript", "token_transcript", "TurnSample", "turn_rewards", "turn_samples"]


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
    turn_ids: list[int] = field(default_factory=list)
    """Per response token: the 0-based move (among the player's trainable moves) that generated
    it, -1 on the tokens between moves (mask 0)."""
    turn_rewards: list[float] = field(default_factory=list)
    """Per move: its credit (:func:`turn_rewards`); empty when the episode records no step
    rewards for the player (an episode built by hand)."""

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
    # an episode built by hand may hold no step rewards: then no credit (turn_rewards stays empty)
    credit = _credit(episode, player, turns) if episode.rewards.get(player) else []
    out = TokenTranscript(prompt_ids=list(first.prompt_token_ids), turn_rewards=credit)
    for k, t in enumerate(turns):
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
            out.turn_ids += [-1] * len(between)
        ids, lps = list(c.token_ids), list(c.logprobs)
        if len(ids) != len(lps):
            raise ConfigError(f"the move of {player!r} at step {t.step} has {len(ids)} token ids but "
                              f"{len(lps)} log-probs.")
        out.response_ids += ids
        out.mask += [1] * len(ids)
        out.logprobs += [float(x) for x in lps]
        out.turn_ids += [k] * len(ids)
        out.turns += 1
    return out


@dataclass
class TurnSample:
    """One move of a player as a training sample of its own (:func:`turn_samples`)."""

    turn: int
    """0-based index of the move among the player's trainable moves of the episode."""
    step: int
    """The env step of the move."""
    prompt_ids: list[int]
    """The prompt the policy was given, as it was tokenised for the move."""
    completion_ids: list[int]
    """The ids the policy generated."""
    logprobs: list[float]
    """The sampler's log-prob of each generated id."""
    reward: float
    """The move's credit (:func:`turn_rewards`)."""


def _credit(episode: Episode, player: str, turns: list[TurnRecord]) -> list[float]:
    rewards = episode.rewards.get(player)
    if rewards is None:
        raise ConfigError(f"the episode has no rewards for player {player!r}.")
    steps = [t.step for t in turns]
    if any(b <= a for a, b in zip(steps, steps[1:])) or (steps and not 0 <= steps[-1] < len(rewards)):
        raise ConfigError(f"the moves of {player!r} are at steps {steps}, which do not index the episode's "
                          f"{len(rewards)} step rewards in order; the episode was not recorded by the driver.")
    ends = steps[1:] + [len(rewards)]
    return [float(sum(rewards[a:b])) for a, b in zip(steps, ends)]


def turn_rewards(episode: Episode, player: str) -> list[float]:
    """The credit of each trainable move of ``player`` in ``episode``, in order: the player's
    rewards from the step of the move up to (not including) the step of its next move, the last
    move's up to the end. The credits sum to the player's return less the rewards of the steps
    before its first move (which no move of it caused).

    Raises:
        ConfigError: ``player`` has no rewards in the episode, or its moves' steps do not index
            the episode's step rewards in order.
    """
    return _credit(episode, player, trainable_turns(episode, player))


def turn_samples(episode: Episode, player: str) -> list[TurnSample]:
    """``player``'s trainable moves of ``episode`` as one :class:`TurnSample` each, with the
    move's credit (:func:`turn_rewards`) as its reward: the per-turn training samples of the
    CollabLLM recipe. Unlike :func:`token_transcript` this needs no prompt to extend the
    previous one (each sample keeps its own prompt ids).

    Raises:
        ConfigError: ``player`` made no trainable move, or a move lacks token ids or log-probs.
    """
    turns = trainable_turns(episode, player, require_tokens=True)
    if not turns:
        raise ConfigError(f"player {player!r} made no trainable move in this episode; nothing to train on.")
    out = []
    for k, (t, credit) in enumerate(zip(turns, _credit(episode, player, turns), strict=True)):
        c = t.completion
        assert c is not None and c.prompt_token_ids is not None and c.token_ids is not None and c.logprobs is not None
        out.append(TurnSample(turn=k, step=t.step, prompt_ids=list(c.prompt_token_ids),
                              completion_ids=list(c.token_ids), logprobs=[float(x) for x in c.logprobs],
                              reward=credit))
    return out

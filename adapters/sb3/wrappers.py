"""The Gymnasium wrappers SB3 trains on: dialogue acts (:class:`MacroActionWrapper`) or a pick
among sampled replies (:class:`RerankWrapper`) over the single-agent view of a collab_env env."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium
import numpy as np

from collab_env._async import run_sync
from collab_env.adapters.sb3.acts import DialogueAct, generic_acts, hidden_facts_acts
from collab_env.adapters.sb3.chat import ENV_AUTHOR
from collab_env.adapters.sb3.features import (
    CANDIDATE_FEATURES,
    ChatFeatures,
    Features,
    HiddenFactsFeatures,
    candidate_features,
)
from collab_env.errors import ConfigError, EnvStateError, PolicyError
from collab_env.policy import describe, resolve_policy
from collab_env.types import Completion, Conversation, Message

__all__ = ["view_of", "is_hidden_facts", "DialogueEnv", "MacroActionWrapper", "RerankWrapper"]

_SEED_RANGE = 2**31 - 1


def view_of(env_or_id: Any, player: str | None, policies: Mapping[str, Any] | None,
             sampling: Mapping[str, Mapping[str, Any]] | None, make_kwargs: Mapping[str, Any]):
    """The single-agent view behind a wrapper: built from an id, taken as is, or put on a
    ParallelEnv."""
    import collab_env
    from collab_env.wrappers.single_agent import SingleAgentEnv

    if isinstance(env_or_id, str):
        from collab_env.registry import spec

        s = spec(env_or_id)
        player = player or (s.trainable[0] if s.trainable else s.players[0])
        view = collab_env.make(env_or_id, view=player, policies=policies, **dict(make_kwargs))
        if sampling:
            view.sampling = dict(sampling)
        return view
    if make_kwargs:
        raise ConfigError(f"keywords {sorted(make_kwargs)} build an env from an id; pass an id, not an env.")
    if isinstance(env_or_id, SingleAgentEnv):
        if player is not None and player != env_or_id.player:
            raise ConfigError(f"player={player!r} but the view controls {env_or_id.player!r}.")
        if policies is not None or sampling is not None:
            raise ConfigError("policies= and sampling= apply when the wrapper builds the view; set them on it.")
        return env_or_id
    base = getattr(env_or_id, "unwrapped", None)
    from collab_env.env import CollabEnv

    if not isinstance(base, CollabEnv):
        raise ConfigError(
            f"expected an env id, a SingleAgentEnv or a CollabEnv (or a wrapper of one), got "
            f"{type(env_or_id).__name__}."
        )
    base_spec: Any = base.spec  # set by collab_env.make; None for an env built by hand
    if player is None:
        player = base_spec.trainable[0] if base_spec is not None and base_spec.trainable else base.possible_agents[0]
    return SingleAgentEnv(env_or_id, player=player, policies=policies, sampling=sampling)


def is_hidden_facts(view: Any) -> bool:
    """Whether the env behind a single-agent ``view`` plays a ``hidden-facts*`` task (it picks the
    default acts and features)."""
    from collab_env.tasks.hidden_facts import HiddenFactsTask

    return isinstance(view.env.unwrapped.task, HiddenFactsTask)


class DialogueEnv(gymnasium.Env):
    """What both wrappers share: the view, the features, seeds, and fault endings."""

    metadata = {"render_modes": ["ansi", "human"]}

    def __init__(self, view: Any, features: Features | None) -> None:
        self.view = view
        self.player: str = view.player
        if features is None:
            features = HiddenFactsFeatures() if is_hidden_facts(view) else ChatFeatures()
        if not isinstance(features, Features):
            raise ConfigError(f"features must be a collab_env.adapters.sb3.Features, got {type(features).__name__}.")
        self.features = features
        self.render_mode = view.render_mode
        self.faults = 0
        """Policy faults (realiser or candidate replies that gave up) counted so far."""
        self._conv: Conversation | None = None
        self._done = True

    def _observe(self, conv: Conversation) -> np.ndarray:
        return self.features(conv, self.player)

    async def areset(self, *, seed: int | None = None,
                     options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        """Async :meth:`reset` (each wrapper implements it; :class:`CollabVecEnv` calls it)."""
        raise NotImplementedError

    async def astep(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Async :meth:`step` (each wrapper implements it; :class:`CollabVecEnv` calls it)."""
        raise NotImplementedError

    def _draw_seed(self) -> int:
        return int(self.np_random.integers(_SEED_RANGE))

    async def _areset_view(self, seed: int | None, options: dict[str, Any] | None):
        gymnasium.Env.reset(self, seed=seed)
        if seed is None:
            seed = self._draw_seed()
        conv, info = await self.view.areset(seed=seed, options=options)
        self._conv, self._done = conv, False
        return conv, info

    async def _astep_text(self, text: str, extra: dict[str, Any]):
        if self._done:
            raise EnvStateError("the episode has ended; call reset().")
        conv, reward, terminated, truncated, info = await self.view.astep(text)
        self._conv, self._done = conv, bool(terminated or truncated)
        info = {**info, **extra, "text": text}
        return conv, float(reward), bool(terminated), bool(truncated), info

    def _end_with_fault(self, reason: str, extra: dict[str, Any]):
        """A reply that gave up ends the episode (truncated), as the episode driver does."""
        self.faults += 1
        self.view.env.end_episode(f"fault:{self.player}")
        self._done = True
        info = {**extra, "faults": {self.player: reason}, "end_reason": self.view.env.episode.end_reason}
        return self._conv, 0.0, False, True, info

    def render(self):
        return self.view.render()

    def close(self) -> None:
        self.view.close()
        super().close()


class MacroActionWrapper(DialogueEnv):
    """``Discrete(K)`` dialogue acts on top of the single-agent view of a collab_env env.

    Each step the agent picks an act; the act becomes the controlled player's message (its
    template, or ``realiser``), the view sends it and lets the other players answer through the
    episode driver, and the agent gets the view's reward and the features of what it now sees.

    Args:
        env_or_id: A registered id (built with ``collab_env.make(id, view=player, ...)``), a
            single-agent view, or a CollabEnv (or a wrapper of one).
        acts: The acts (default: :func:`hidden_facts_acts` on ``hidden-facts*``, else
            :func:`generic_acts`).
        realiser: How an act becomes text. ``None``: the act's template. A policy (object or
            reference, e.g. ``"embedded"``): it is shown the observation followed by a system
            message with the act's instruction, and its completion is sent. A callable
            ``(act, observation) -> str``.
        realiser_sampling: Sampling keywords for the realiser policy (its ``seed`` is drawn
            from the wrapper's seeded generator each step).
        features: Observation features (default: :class:`HiddenFactsFeatures` on
            ``hidden-facts*``, else :class:`ChatFeatures`).
        player: The controlled player (default: the spec's first trainable player).
        policies: Player -> policy for the other players (default: the spec's).
        sampling: Player -> sampling keywords for those policies.
        **make_kwargs: Keywords of ``collab_env.make`` (``reward=``, env overrides) when
            ``env_or_id`` is an id.

    ``info`` is the view's info plus ``act`` (its name) and ``text`` (the message sent). A
    realiser completion that gave up ends the episode (truncated, ``info["faults"]``, counted in
    :attr:`faults`).

    Raises:
        ConfigError: An act has no template and there is no realiser; bad arguments.
    """

    def __init__(
        self,
        env_or_id: Any,
        acts: Sequence[DialogueAct] | None = None,
        *,
        realiser: Any = None,
        realiser_sampling: Mapping[str, Any] | None = None,
        features: Features | None = None,
        player: str | None = None,
        policies: Mapping[str, Any] | None = None,
        sampling: Mapping[str, Mapping[str, Any]] | None = None,
        **make_kwargs: Any,
    ) -> None:
        view = view_of(env_or_id, player, policies, sampling, make_kwargs)
        super().__init__(view, features)
        if acts is None:
            acts = hidden_facts_acts() if is_hidden_facts(view) else generic_acts()
        self.acts = list(acts)
        if not self.acts or not all(isinstance(a, DialogueAct) for a in self.acts):
            raise ConfigError("acts must be a non-empty sequence of DialogueAct.")
        self.realiser_policy = None
        self.realiser_fn = None
        if isinstance(realiser, str) or hasattr(realiser, "act"):
            self.realiser_policy = resolve_policy(realiser)
        elif callable(realiser):
            self.realiser_fn = realiser
        elif realiser is not None:
            raise ConfigError(f"realiser must be None, a policy or a callable(act, observation), got {realiser!r}.")
        if realiser is None:
            missing = [a.name for a in self.acts if a.template is None]
            if missing:
                raise ConfigError(
                    f"acts {missing} have no template; pass realiser=<policy> (e.g. 'embedded') or a "
                    "callable(act, observation) -> str, or give every act a template."
                )
        self.realiser_sampling = dict(realiser_sampling or {})
        self.action_space = gymnasium.spaces.Discrete(len(self.acts))
        self.observation_space = self.features.space

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Async :meth:`reset`: the features of the controlled player's first observation."""
        conv, info = await self._areset_view(seed, options)
        return self._observe(conv), info

    async def astep(self, action: Any):
        """Async :meth:`step`: say act ``action`` and let the others answer."""
        if not self.action_space.contains(action):
            raise ConfigError(f"action must be an int in [0, {len(self.acts)}), got {action!r}.")
        if self._done:
            raise EnvStateError("the episode has ended; call reset().")
        act = self.acts[int(action)]
        extra = {"act": act.name}
        text = await self._realise(act)
        if isinstance(text, Completion):  # the realiser policy gave up
            conv, r, term, trunc, info = self._end_with_fault(text.meta.get("fault", ""), extra)
            return self._observe(conv), r, term, trunc, info
        conv, r, term, trunc, info = await self._astep_text(text, extra)
        return self._observe(conv), r, term, trunc, info

    async def _realise(self, act: DialogueAct) -> str | Completion:
        conv = self._conv
        assert conv is not None
        if self.realiser_fn is not None:
            text = self.realiser_fn(act, conv)
            if not isinstance(text, str):
                raise ConfigError(f"realiser returned {type(text).__name__} for act {act.name!r}; it must return str.")
            return text
        if self.realiser_policy is None:
            assert act.template is not None  # __init__ refuses an act without a template when there is no realiser
            return act.template(conv)
        shown = conv.append(Message(role="system", content=act.instruction, author=ENV_AUTHOR,
                                    audience=(self.player,)))
        kw = {**self.realiser_sampling}
        kw.setdefault("seed", self._draw_seed())
        try:
            out = await self.realiser_policy.act([shown], **kw)
        except PolicyError:
            raise
        except Exception as exc:
            raise PolicyError(f"realiser {describe(self.realiser_policy)} failed on act {act.name!r}: {exc!r}") from exc
        if not isinstance(out, list) or len(out) != 1 or not isinstance(out[0], Completion):
            raise PolicyError(f"realiser {describe(self.realiser_policy)} must return one Completion, "
                              f"got {out!r:.200}.")
        return out[0] if out[0].is_fault else out[0].text

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        return run_sync(self.areset(seed=seed, options=options))

    def step(self, action: Any):
        return run_sync(self.astep(action))

    def __repr__(self) -> str:
        return f"<MacroActionWrapper acts={[a.name for a in self.acts]} of {self.view!r}>"


class RerankWrapper(DialogueEnv):
    """``Discrete(N)`` over ``n`` candidate replies sampled from ``candidates_policy``.

    At every turn of the controlled player the policy is asked for ``n`` candidates for the
    current observation, candidate ``i`` with ``seed = s + i`` (``s`` drawn from the wrapper's
    seeded generator), concurrently; the agent picks one and it is sent through the view.
    Observation: the conversation's features followed by :func:`candidate_features` of each
    candidate (zeros once the episode has ended).

    Args:
        env_or_id: As for :class:`MacroActionWrapper`.
        candidates_policy: The policy (object or reference) that proposes replies.
        n: Candidates per turn.
        candidates_sampling: Sampling keywords for it (``seed`` is set per candidate).
        features: Conversation features (defaults as :class:`MacroActionWrapper`).
        max_chars: Candidate length that maps to 1.
        player, policies, sampling, **make_kwargs: As for :class:`MacroActionWrapper`.

    ``info`` is the view's info plus ``candidate`` (the index), ``text``, and
    ``candidates`` (the texts offered). Choosing a candidate that gave up (a fault) ends the
    episode, truncated, with ``info["faults"]``; every faulty candidate is counted in
    :attr:`faults`.
    """

    def __init__(
        self,
        env_or_id: Any,
        candidates_policy: Any,
        n: int = 4,
        *,
        candidates_sampling: Mapping[str, Any] | None = None,
        features: Features | None = None,
        max_chars: int = 500,
        player: str | None = None,
        policies: Mapping[str, Any] | None = None,
        sampling: Mapping[str, Mapping[str, Any]] | None = None,
        **make_kwargs: Any,
    ) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"n must be an int >= 1, got {n!r}.")
        if max_chars < 1:
            raise ConfigError(f"max_chars must be >= 1, got {max_chars}.")
        view = view_of(env_or_id, player, policies, sampling, make_kwargs)
        super().__init__(view, features)
        self.candidates_policy = resolve_policy(candidates_policy)
        self.candidates_sampling = dict(candidates_sampling or {})
        if "seed" in self.candidates_sampling:
            raise ConfigError("candidates_sampling must not set 'seed': each candidate gets its own.")
        self.n = n
        self.max_chars = max_chars
        self.candidates: list[Completion] = []
        """The candidates offered at the current turn."""
        base = self.features.space
        k = len(CANDIDATE_FEATURES)
        low = np.concatenate([base.low, np.zeros(n * k, dtype=np.float32)])
        high = np.concatenate([base.high, np.ones(n * k, dtype=np.float32)])
        self.observation_space = gymnasium.spaces.Box(low, high, dtype=np.float32)
        self.action_space = gymnasium.spaces.Discrete(n)

    async def _sample(self) -> list[Completion]:
        conv = self._conv
        assert conv is not None
        s = self._draw_seed()
        pol = self.candidates_policy

        async def one(i: int) -> Completion:
            try:
                out = await pol.act([conv], **self.candidates_sampling, seed=s + i)
            except PolicyError:
                raise
            except Exception as exc:
                raise PolicyError(f"candidates policy {describe(pol)} failed: {exc!r}") from exc
            if not isinstance(out, list) or len(out) != 1 or not isinstance(out[0], Completion):
                raise PolicyError(f"candidates policy {describe(pol)} must return one Completion, got {out!r:.200}.")
            return out[0]

        cands = list(await asyncio.gather(*(one(i) for i in range(self.n))))
        self.faults += sum(c.is_fault for c in cands)
        return cands

    def _obs(self) -> np.ndarray:
        assert self._conv is not None
        cands = np.zeros((self.n, len(CANDIDATE_FEATURES)), dtype=np.float32)
        for i, c in enumerate(self.candidates):
            cands[i] = candidate_features(c, self.max_chars)
        return np.concatenate([self._observe(self._conv), cands.reshape(-1)])

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Async :meth:`reset`: the features and the first turn's candidates."""
        _, info = await self._areset_view(seed, options)
        self.candidates = await self._sample() if not self._done_view() else []
        return self._obs(), {**info, "candidates": [c.text for c in self.candidates]}

    def _done_view(self) -> bool:
        return not self.view.env.agents

    async def astep(self, action: Any):
        """Async :meth:`step`: send candidate ``action``, then sample the next turn's."""
        if not self.action_space.contains(action):
            raise ConfigError(f"action must be an int in [0, {self.n}), got {action!r}.")
        if self._done:
            raise EnvStateError("the episode has ended; call reset().")
        chosen = self.candidates[int(action)]
        extra: dict[str, Any] = {"candidate": int(action)}
        if chosen.is_fault:
            _, r, term, trunc, info = self._end_with_fault(chosen.meta.get("fault", ""), extra)
            self.candidates = []
            return self._obs(), r, term, trunc, info
        _, r, term, trunc, info = await self._astep_text(chosen.text, extra)
        self.candidates = [] if (term or trunc) else await self._sample()
        info["candidates"] = [c.text for c in self.candidates]
        return self._obs(), r, term, trunc, info

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        return run_sync(self.areset(seed=seed, options=options))

    def step(self, action: Any):
        return run_sync(self.astep(action))

    def __repr__(self) -> str:
        return f"<RerankWrapper n={self.n} of {self.view!r}>"

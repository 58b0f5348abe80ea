"""stable-baselines3 on collab_env: dialogue as a small discrete decision problem.

SB3 cannot take text spaces, so a text env joins it through two Gymnasium wrappers over the
single-agent view (:func:`collab_env.make(id, view=player) <collab_env.make>`, which plays the
other players through the one episode driver):

* :class:`MacroActionWrapper`: ``Discrete(K)`` **dialogue acts** (ask about the next unknown
  fact, answer now, clarify, summarise...). Each act becomes a message through its template, or
  through a frozen policy told the act's instruction, or through any callable
  ``(act, observation) -> text``.
* :class:`RerankWrapper`: ``Discrete(N)`` over **N candidate replies** sampled (with seeds) from a
  policy for the current observation; the agent picks which one is sent.

Observations are ``Box`` features of the conversation (:class:`ChatFeatures`: turns, lengths,
numbers; :class:`HiddenFactsFeatures` adds what the assistant knows and still misses;
:class:`EmbeddingFeatures` appends a frozen encoder's embedding). :class:`CollabVecEnv` is an SB3
``VecEnv`` that steps many wrappers at once on one event loop (``asyncio.gather`` of their
``astep``), so the policies they share (the simulated user, the realiser, the candidate
sampler) get concurrent calls they batch. There is no episode loop here: every move goes
through the view's ``astep``, i.e. :func:`collab_env.rollout.advance`.

Example::

    from stable_baselines3 import PPO
    from collab_env.adapters.sb3 import CollabVecEnv, MacroActionWrapper

    venv = CollabVecEnv.from_id("hidden-facts-easy", n=8, wrapper=MacroActionWrapper)
    PPO("MlpPolicy", venv, n_steps=64, seed=0).learn(4000)
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium
import numpy as np

from collab_env._async import run_sync
from collab_env.errors import ConfigError, EnvStateError, PolicyError, require
from collab_env.policy import ScriptedPolicy, describe, policies_for, resolve_policy
from collab_env.rollout.batching import BatchedPolicy, batches_itself
from collab_env.types import Completion, Conversation, Message

require("stable_baselines3", "sb3", "collab_env.adapters.sb3")
from stable_baselines3.common.vec_env import VecEnv  # noqa: E402

__all__ = [
    "DialogueAct",
    "hidden_facts_acts",
    "generic_acts",
    "RandomActPolicy",
    "Features",
    "ChatFeatures",
    "HiddenFactsFeatures",
    "EmbeddingFeatures",
    "candidate_features",
    "MacroActionWrapper",
    "RerankWrapper",
    "CollabVecEnv",
]

_ENV_AUTHOR = "env"
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_SEED_RANGE = 2**31 - 1


# ---------------------------------------------------------------------------------------------
# Dialogue acts
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DialogueAct:
    """One macro action: what the agent decides; a template or a frozen policy says it.

    Args:
        name: Short name (in ``info["act"]`` and logs).
        instruction: What a frozen policy realising the act is told to do this turn.
        template: ``template(observation) -> text``: the message without a model (``None``:
            only a realiser policy or callable can say it).
    """

    name: str
    instruction: str
    template: Callable[[Conversation], str] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"DialogueAct.name must be a non-empty string, got {self.name!r}.")
        if not isinstance(self.instruction, str) or not self.instruction:
            raise ConfigError(f"DialogueAct {self.name!r} needs a non-empty instruction.")
        if self.template is not None and not callable(self.template):
            raise ConfigError(f"DialogueAct {self.name!r}: template must be callable(observation) -> str.")


def _facts(observation: Conversation) -> dict[str, Any] | None:
    from collab_env.tasks.hidden_facts import visible_facts

    return visible_facts(observation)


def _hf_ask_next(observation: Conversation) -> str:
    vf = _facts(observation)
    if vf is None:
        return "Could you tell me exactly what you need me to compute?"
    if not vf["objects"]:
        return "Which items exactly are involved?"
    if vf["missing"]:
        return vf["missing"][0][2]
    return "Is there anything else I should know?"


def _hf_ask_all(observation: Conversation) -> str:
    vf = _facts(observation)
    if vf is None or not vf["objects"] or not vf["missing"]:
        return _hf_ask_next(observation)
    return "Before I compute the total, I need a few details. " + " ".join(q for _, _, q in vf["missing"])


def _hf_answer(observation: Conversation) -> str:
    vf = _facts(observation)
    return f"The total is \\boxed{{{vf['total'] if vf is not None else 0}}}."


def _hf_clarify(observation: Conversation) -> str:
    return "Could you tell me a bit more about what you need?"


def _hf_summarise(observation: Conversation) -> str:
    vf = _facts(observation)
    values = [str(v) for v in (vf or {}).get("known", {}).values()]
    if not values:
        return "Let me make sure I follow: you want one total."
    return "Let me make sure I follow: so far I have the numbers " + ", ".join(values) + "."


def hidden_facts_acts() -> list[DialogueAct]:
    """The default acts for the ``hidden-facts*`` envs, with templates that read the visible
    chat (:func:`collab_env.tasks.hidden_facts.visible_facts`).

    0 ``ask_next``: ask about the first quantity not told yet (which items, when the opening
    names none); 1 ``ask_all``: ask about every missing quantity in one message; 2 ``answer``:
    box the total from what is known (1 for anything missing); 3 ``clarify``: a vague request for
    more detail (reveals nothing); 4 ``summarise``: restate the numbers so far (reveals nothing).
    Asking when nothing is missing, clarifying and summarising each use up one of the simulated
    user's ``patience`` turns.
    """
    return [
        DialogueAct("ask_next", "Ask the user about exactly one piece of information you still need.", _hf_ask_next),
        DialogueAct("ask_all", "Ask the user about every piece of information you still need, in one message.",
                    _hf_ask_all),
        DialogueAct("answer", "Give your final answer now, as a number in \\boxed{}.", _hf_answer),
        DialogueAct("clarify", "Ask the user to explain their request in more detail.", _hf_clarify),
        DialogueAct("summarise", "Summarise what you know so far, without asking anything.", _hf_summarise),
    ]


def generic_acts() -> list[DialogueAct]:
    """Acts for any chat env, realised by a frozen policy (only ``clarify`` has a template):
    ``ask`` (one clarifying question), ``answer`` (the final answer now), ``clarify``,
    ``summarise``."""
    return [
        DialogueAct("ask", "Ask the user one short question about the most important thing you do not know yet."),
        DialogueAct("answer", "Give your complete final answer now, without asking anything."),
        DialogueAct("clarify", "Ask the user to explain their request in more detail.", _hf_clarify),
        DialogueAct("summarise", "Summarise the conversation so far in two sentences, without asking anything."),
    ]


class RandomActPolicy(ScriptedPolicy):
    """A scripted policy that says a random act's template (seeded like every scripted policy):
    the random-act baseline as a text policy, and a candidate sampler for :class:`RerankWrapper`.

    Args:
        acts: Acts with templates (default: :func:`hidden_facts_acts`).
        weights: Probability of each act (default: uniform).
    """

    name = "random-act"

    def __init__(self, acts: Sequence[DialogueAct] | None = None, weights: Sequence[float] | None = None) -> None:
        self.acts = list(acts if acts is not None else hidden_facts_acts())
        if not self.acts:
            raise ConfigError("RandomActPolicy needs at least one act.")
        untemplated = [a.name for a in self.acts if a.template is None]
        if untemplated:
            raise ConfigError(f"RandomActPolicy says acts by their templates; {untemplated} have none.")
        if weights is None:
            weights = [1.0] * len(self.acts)
        w = np.asarray(weights, dtype=float)
        if w.shape != (len(self.acts),) or (w < 0).any() or w.sum() <= 0:
            raise ConfigError(f"weights must be {len(self.acts)} non-negative numbers with a positive sum.")
        self.weights = w / w.sum()

    def respond(self, observation: Conversation, rng: np.random.Generator) -> str:
        act = self.acts[int(rng.choice(len(self.acts), p=self.weights))]
        return act.template(observation)  # type: ignore[misc]


# ---------------------------------------------------------------------------------------------
# Observation features
# ---------------------------------------------------------------------------------------------
class Features:
    """Box features of a player's observation: subclasses set :attr:`size` and implement
    :meth:`compute`; values are clipped to ``[low, high]``.

    Args:
        low: Lower bound of every feature.
        high: Upper bound of every feature.
    """

    size: int = 0

    def __init__(self, low: float = 0.0, high: float = 1.0) -> None:
        if not low < high:
            raise ConfigError(f"Features need low < high, got {low}, {high}.")
        self.low, self.high = float(low), float(high)

    @property
    def space(self) -> gymnasium.spaces.Box:
        """The observation space these features fill."""
        return gymnasium.spaces.Box(self.low, self.high, shape=(self.size,), dtype=np.float32)

    def compute(self, observation: Conversation, player: str) -> Sequence[float]:
        """The raw features of ``observation`` as ``player`` sees it."""
        raise NotImplementedError

    def __call__(self, observation: Conversation, player: str) -> np.ndarray:
        x = np.asarray(self.compute(observation, player), dtype=np.float32)
        if x.shape != (self.size,):
            raise ConfigError(f"{type(self).__name__} computed {x.shape} features, declared ({self.size},).")
        return np.clip(x, self.low, self.high)


class ChatFeatures(Features):
    """Generic features of any chat, each scaled to ``[0, 1]``: own turns and the other players'
    messages (over ``max_turns``), the lengths of the last message by another player and of the
    own last one (over ``max_chars``), whether that last message asks a question, and the numbers
    written by the others in all and in their last message (over ``max_numbers``).

    Args:
        max_turns: Turns that map to 1.
        max_chars: Characters that map to 1.
        max_numbers: Numbers that map to 1.
    """

    size = 7

    def __init__(self, max_turns: int = 6, max_chars: int = 500, max_numbers: int = 10) -> None:
        super().__init__(0.0, 1.0)
        if min(max_turns, max_chars, max_numbers) < 1:
            raise ConfigError("max_turns, max_chars and max_numbers must be >= 1.")
        self.max_turns, self.max_chars, self.max_numbers = max_turns, max_chars, max_numbers

    def compute(self, observation: Conversation, player: str) -> Sequence[float]:
        own = [m for m in observation if m.author == player]
        others = [m for m in observation if m.author not in (player, _ENV_AUTHOR)]
        last_other = others[-1].content if others else ""
        last_own = own[-1].content if own else ""
        numbers = sum(len(_NUMBER.findall(m.content)) for m in others)
        return [
            len(own) / self.max_turns,
            len(others) / self.max_turns,
            len(last_other) / self.max_chars,
            len(last_own) / self.max_chars,
            float("?" in last_other),
            numbers / self.max_numbers,
            len(_NUMBER.findall(last_other)) / self.max_numbers,
        ]


class HiddenFactsFeatures(ChatFeatures):
    """:class:`ChatFeatures` plus what the assistant of a ``hidden-facts*`` env knows, read from
    its visible chat: objects named (0/1), quantities known, quantities missing, nothing missing
    (0/1), quantities the user's last reply revealed (counts over ``max_facts``).

    Args:
        max_facts: Quantities that map to 1 (two per object; 8 covers four objects).
        **kwargs: :class:`ChatFeatures` arguments.
    """

    size = ChatFeatures.size + 5

    def __init__(self, max_facts: int = 8, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if max_facts < 1:
            raise ConfigError(f"max_facts must be >= 1, got {max_facts}.")
        self.max_facts = max_facts

    def compute(self, observation: Conversation, player: str) -> Sequence[float]:
        base = list(super().compute(observation, player))
        vf = _facts(observation)
        if vf is None:
            return base + [0.0] * 5
        others = [i for i, m in enumerate(observation) if m.author not in (player, _ENV_AUTHOR)]
        before = _facts(observation[: others[-1]]) if others else None
        known_before = len(before["known"]) if before is not None else 0
        named = bool(vf["objects"])
        return base + [
            float(named),
            len(vf["known"]) / self.max_facts,
            len(vf["missing"]) / self.max_facts,
            float(named and not vf["missing"]),
            (len(vf["known"]) - known_before) / self.max_facts,
        ]


class EmbeddingFeatures(Features):
    """``base`` features followed by a frozen encoder's embedding of the conversation.

    Args:
        base: The features to extend.
        encoder: ``encoder(text) -> vector`` of length ``dim`` (a frozen sentence encoder; it is
            called once per observation, on the visible chat rendered as ``role: content`` lines).
        dim: Length of the embedding.
        bound: Embedding values are clipped to ``[-bound, bound]`` (unit-norm embeddings: 1).
    """

    def __init__(self, base: Features, encoder: Callable[[str], Any], dim: int, bound: float = 1.0) -> None:
        if not callable(encoder):
            raise ConfigError("encoder must be callable(text) -> vector.")
        if dim < 1 or bound <= 0:
            raise ConfigError(f"need dim >= 1 and bound > 0, got dim={dim}, bound={bound}.")
        super().__init__(min(base.low, -bound), max(base.high, bound))
        self.base, self.encoder, self.dim, self.bound = base, encoder, int(dim), float(bound)
        self.size = base.size + self.dim

    @property
    def space(self) -> gymnasium.spaces.Box:
        low = np.concatenate([np.full(self.base.size, self.base.low), np.full(self.dim, -self.bound)])
        high = np.concatenate([np.full(self.base.size, self.base.high), np.full(self.dim, self.bound)])
        return gymnasium.spaces.Box(low.astype(np.float32), high.astype(np.float32), dtype=np.float32)

    def compute(self, observation: Conversation, player: str) -> Sequence[float]:
        text = "\n".join(f"{m.role}: {m.content}" for m in observation)
        emb = np.asarray(self.encoder(text), dtype=np.float32).reshape(-1)
        if emb.shape != (self.dim,):
            raise ConfigError(f"encoder returned {emb.shape[0]} values, expected dim={self.dim}.")
        return np.concatenate([self.base(observation, player), np.clip(emb, -self.bound, self.bound)])

    def __call__(self, observation: Conversation, player: str) -> np.ndarray:
        x = np.asarray(self.compute(observation, player), dtype=np.float32)
        return np.clip(x, self.space.low, self.space.high)


#: Features of one candidate reply in :class:`RerankWrapper` (each in ``[0, 1]``).
CANDIDATE_FEATURES = ("length", "boxed", "questions", "numbers", "fault")


def candidate_features(completion: Completion, max_chars: int = 500) -> list[float]:
    """:data:`CANDIDATE_FEATURES` of one candidate: its length (over ``max_chars``), whether it
    holds a ``\\boxed{}`` answer, its question marks (over 5), its numbers (over 10), and whether
    the policy gave up on it (a fault)."""
    text = completion.text
    return [
        min(len(text) / max_chars, 1.0),
        float("\\boxed" in text),
        min(text.count("?") / 5, 1.0),
        min(len(_NUMBER.findall(text)) / 10, 1.0),
        float(completion.is_fault),
    ]


# ---------------------------------------------------------------------------------------------
# The wrappers
# ---------------------------------------------------------------------------------------------
def _view_of(env_or_id: Any, player: str | None, policies: Mapping[str, Any] | None,
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
    s = base.spec
    if player is None:
        player = s.trainable[0] if s is not None and s.trainable else base.possible_agents[0]
    return SingleAgentEnv(env_or_id, player=player, policies=policies, sampling=sampling)


def _is_hidden_facts(view: Any) -> bool:
    from collab_env.tasks.hidden_facts import HiddenFactsTask

    return isinstance(view.env.unwrapped.task, HiddenFactsTask)


class _DialogueEnv(gymnasium.Env):
    """What both wrappers share: the view, the features, seeds, and fault endings."""

    metadata = {"render_modes": ["ansi", "human"]}

    def __init__(self, view: Any, features: Features | None) -> None:
        self.view = view
        self.player: str = view.player
        if features is None:
            features = HiddenFactsFeatures() if _is_hidden_facts(view) else ChatFeatures()
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


class MacroActionWrapper(_DialogueEnv):
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
        view = _view_of(env_or_id, player, policies, sampling, make_kwargs)
        super().__init__(view, features)
        if acts is None:
            acts = hidden_facts_acts() if _is_hidden_facts(view) else generic_acts()
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
        if self.realiser_policy is None and self.realiser_fn is None:
            return act.template(conv)  # type: ignore[misc]
        if self.realiser_fn is not None:
            text = self.realiser_fn(act, conv)
            if not isinstance(text, str):
                raise ConfigError(f"realiser returned {type(text).__name__} for act {act.name!r}; it must return str.")
            return text
        shown = conv.append(Message(role="system", content=act.instruction, author=_ENV_AUTHOR,
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
            raise PolicyError(f"realiser {describe(self.realiser_policy)} must return one Completion, got {out!r:.200}.")
        return out[0] if out[0].is_fault else out[0].text

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        return run_sync(self.areset(seed=seed, options=options))

    def step(self, action: Any):
        return run_sync(self.astep(action))

    def __repr__(self) -> str:
        return f"<MacroActionWrapper acts={[a.name for a in self.acts]} of {self.view!r}>"


class RerankWrapper(_DialogueEnv):
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
        view = _view_of(env_or_id, player, policies, sampling, make_kwargs)
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


# ---------------------------------------------------------------------------------------------
# The VecEnv
# ---------------------------------------------------------------------------------------------
class CollabVecEnv(VecEnv):
    """An SB3 ``VecEnv`` over wrappers that steps them all at once on one event loop.

    ``step_wait`` gathers every wrapper's ``astep`` (then every finished one's ``areset``)
    with ``asyncio.gather``; policies the wrappers share (see :meth:`from_id`) receive their
    calls concurrently and batch them. Finished episodes reset automatically, with the SB3
    conventions: ``info["terminal_observation"]``, ``info["TimeLimit.truncated"]``, and
    ``reset_infos``. ``seed(s)`` seeds the next reset of wrapper ``i`` with ``s + i``.

    Args:
        envs: :class:`MacroActionWrapper` or :class:`RerankWrapper` instances with equal spaces.

    Raises:
        ConfigError: No envs, envs without ``areset``/``astep``, or different spaces.
    """

    def __init__(self, envs: Sequence[_DialogueEnv]) -> None:
        self.envs = list(envs)
        if not self.envs:
            raise ConfigError("CollabVecEnv needs at least one env.")
        for e in self.envs:
            if not (hasattr(e, "areset") and hasattr(e, "astep")):
                raise ConfigError(f"CollabVecEnv steps envs with async areset/astep; {type(e).__name__} has none.")
            if e.observation_space != self.envs[0].observation_space or e.action_space != self.envs[0].action_space:
                raise ConfigError("every env of a CollabVecEnv must have the same observation and action spaces.")
        super().__init__(len(self.envs), self.envs[0].observation_space, self.envs[0].action_space)
        self._actions: np.ndarray | None = None

    @classmethod
    def from_id(
        cls,
        env_id: str,
        n: int,
        *,
        wrapper: type = MacroActionWrapper,
        policies: Mapping[str, Any] | None = None,
        batch: bool = True,
        **wrapper_kwargs: Any,
    ) -> CollabVecEnv:
        """``n`` wrappers of ``env_id`` sharing one instance of every policy.

        The other players' policies (``policies`` over the spec's defaults) and the wrapper's
        ``realiser`` or ``candidates_policy`` are resolved once and shared by the ``n`` envs;
        with ``batch``, a policy that does not batch itself is wrapped in a
        :class:`~collab_env.rollout.BatchedPolicy` (as the rollout engine does).

        Args:
            env_id: Registered id.
            n: Number of envs.
            wrapper: :class:`MacroActionWrapper` or :class:`RerankWrapper`.
            policies: Player -> policy for the other players.
            batch: Wrap shared policies in BatchedPolicy where that helps.
            **wrapper_kwargs: The wrapper's keywords (``acts``, ``candidates_policy``, ``n`` is
                ``num_candidates`` here, ``player``, env overrides...).
        """
        from collab_env.registry import spec

        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"n must be an int >= 1, got {n!r}.")
        s = spec(env_id)
        player = wrapper_kwargs.get("player") or (s.trainable[0] if s.trainable else s.players[0])

        def shared(ref: Any) -> Any:
            pol = resolve_policy(ref)
            return BatchedPolicy(pol) if batch and not batches_itself(pol) else pol

        chosen = policies_for(s, policies)
        others = {p: shared(ref) for p, ref in chosen.items() if p != player and ref is not None}
        kw = dict(wrapper_kwargs)
        if "num_candidates" in kw:
            kw["n"] = kw.pop("num_candidates")
        for key in ("realiser", "candidates_policy"):
            if kw.get(key) is not None and (isinstance(kw[key], str) or hasattr(kw[key], "act")):
                kw[key] = shared(kw[key])
        return cls([wrapper(env_id, policies=others, **kw) for _ in range(n)])

    # -- SB3 API -------------------------------------------------------------------------------
    def reset(self) -> np.ndarray:
        async def all_resets():
            return await asyncio.gather(*(
                e.areset(seed=self._seeds[i], options=self._options[i] or None) for i, e in enumerate(self.envs)))

        results = run_sync(all_resets())
        self.reset_infos = [info for _, info in results]
        self._reset_seeds()
        self._reset_options()
        return np.stack([obs for obs, _ in results])

    def step_async(self, actions: np.ndarray) -> None:
        self._actions = np.asarray(actions)

    def step_wait(self):
        if self._actions is None:
            raise EnvStateError("step_wait() needs step_async(actions) first.")
        actions, self._actions = self._actions, None

        async def all_steps():
            steps = await asyncio.gather(*(e.astep(int(a)) for e, a in zip(self.envs, actions, strict=True)))
            done = [i for i, (_, _, term, trunc, _) in enumerate(steps) if term or trunc]
            resets = await asyncio.gather(*(self.envs[i].areset() for i in done))
            return steps, dict(zip(done, resets, strict=True))

        steps, resets = run_sync(all_steps())
        obs, rews, dones, infos = [], [], [], []
        for i, (o, r, term, trunc, info) in enumerate(steps):
            info = dict(info)
            info["TimeLimit.truncated"] = bool(trunc and not term)
            if i in resets:
                info["terminal_observation"] = o
                o, self.reset_infos[i] = resets[i]
            obs.append(o)
            rews.append(r)
            dones.append(term or trunc)
            infos.append(info)
        return np.stack(obs), np.asarray(rews, dtype=np.float32), np.asarray(dones, dtype=bool), infos

    def close(self) -> None:
        for e in self.envs:
            e.close()

    def _targets(self, indices: Any) -> list[Any]:
        return [self.envs[i] for i in self._get_indices(indices)]

    def get_attr(self, attr_name: str, indices: Any = None) -> list[Any]:
        return [getattr(e, attr_name) for e in self._targets(indices)]

    def set_attr(self, attr_name: str, value: Any, indices: Any = None) -> None:
        for e in self._targets(indices):
            setattr(e, attr_name, value)

    def env_method(self, method_name: str, *method_args: Any, indices: Any = None, **method_kwargs: Any) -> list[Any]:
        return [getattr(e, method_name)(*method_args, **method_kwargs) for e in self._targets(indices)]

    def env_is_wrapped(self, wrapper_class: type, indices: Any = None) -> list[bool]:
        from stable_baselines3.common.env_util import is_wrapped

        return [is_wrapped(e, wrapper_class) for e in self._targets(indices)]

"""The environment contract: :class:`Task` (what a collaboration is) and :class:`CollabEnv`
(the PettingZoo parallel environment that runs one).

A **task** is immutable data plus a few small hooks, in the spirit of an OpenSpiel game: its
players, their turn order, the items it draws, the messages an episode starts with, and what
happens after each move (feedback messages, rewards, the end). A **CollabEnv** is the state
machine that runs a task: it validates actions, keeps the transcript, enforces budgets, builds
each player's view and speaks the PettingZoo ``ParallelEnv`` API. Environments never call a
model; policies (``collab_env.agents``) produce the actions.

Turn structure
    Every ``step`` is one move by the set of players *on turn*; several players on turn act
    simultaneously (cooperating agents answering the same prompt). ``infos[a]["on_turn"]`` is
    ``True`` for exactly the players that must act in the next step. Actions of players not on
    turn are ignored; a missing action of a player on turn is an error.

Observations and actions
    A player's observation is the :class:`~collab_env.types.Conversation` as that player sees
    it (its own system prompt, hidden goals only where addressed to it, its own messages as
    ``"assistant"``, everybody else's as ``"user"``). An action is the message text (``str``);
    any string is accepted: lone surrogates become U+FFFD and text over ``max_message_chars``
    is cut (``infos[a]["clipped"]`` says so).

Tools
    A task may declare tools per player (:meth:`Task.tools`, :class:`~collab_env.types.Tool`;
    the player's system message lists them in its ``"tools"`` meta, so a policy passes
    ``observation.tools`` to its chat template as ``tools=``). A move by such a player that
    starts with ``{`` is a tool call in the one format of
    :func:`~collab_env.types.parse_tool_call`: the env stores it as a message with
    ``tool_calls`` (seen by the caller only), runs it (:meth:`Task.call_tool`) and appends the
    result as a ``"tool"`` message for the caller; a malformed call gets the error as its result.
    Either way the caller stays on turn (each call is one env step, so ``max_steps`` bounds the
    calls) and ``infos[caller]["tool_call"]`` reports it; ``EpisodeState.tool_calls`` /
    ``tool_errors`` count them. A move that is not a call ends the player's turn as usual.

Episode end
    ``terminations`` when the conversation ends by protocol (the task says so: an answer was
    accepted, the user sent its termination signal); ``truncations`` when a budget runs out
    (``max_steps``, ``max_total_chars`` or a task budget). All players end together; ``agents``
    is then empty and ``infos[a]["end_reason"]`` says why.
"""

from __future__ import annotations

import asyncio
import copy
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
from gymnasium.utils import seeding
from pettingzoo import ParallelEnv

from collab_env._async import run_sync
from collab_env._json import check_depth
from collab_env.errors import ActionError, ConfigError, EnvStateError, check_keyword_types, did_you_mean
from collab_env.spaces import Chat, UnicodeText
from collab_env.types import ENV_AUTHOR, Conversation, Message, Tool, ToolCall, ToolCallError, parse_tool_call

__all__ = ["Task", "Start", "Outcome", "EpisodeState", "CollabEnv"]


# ---------------------------------------------------------------------------------------------
# What a task returns to the env
# ---------------------------------------------------------------------------------------------
@dataclass
class Start:
    """How an episode begins: the opening messages and the first players on turn."""

    messages: list[Message]
    on_turn: tuple[str, ...]
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class Outcome:
    """What follows a step.

    Args:
        messages: Messages the environment appends (feedback, the next prompt...).
        rewards: Reward of this step per player (missing players get 0.0).
        components: Per player, named reward components (logged under their names).
        terminated: The episode ended by protocol.
        truncated: The episode ended by a budget of the task's own.
        reason: Machine-readable end reason, e.g. ``"user_terminated"``.
        next_on_turn: Players on turn next; ``None`` follows the task's turn order.
        info: Extra per-step data shared by every player's info dict.
    """

    messages: list[Message] = field(default_factory=list)
    rewards: dict[str, float] = field(default_factory=dict)
    components: dict[str, dict[str, float]] = field(default_factory=dict)
    terminated: bool = False
    truncated: bool = False
    reason: str | None = None
    next_on_turn: tuple[str, ...] | None = None
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class EpisodeState:
    """The mutable state of one episode. Tasks read it and may keep their own notes in
    ``data`` (which must be deep-copyable: :meth:`CollabEnv.clone` copies it)."""

    index: int | None
    item: Mapping[str, Any]
    rng_seed: int
    """The seed of :attr:`rng` (drawn from the env's ``np_random`` at reset)."""
    messages: list[Message] = field(default_factory=list)
    step: int = 0
    on_turn: tuple[str, ...] = ()
    phase: int = 0
    moves: dict[str, int] = field(default_factory=dict)
    chars: dict[str, int] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)
    last_moves: dict[str, str] = field(default_factory=dict)
    done: bool = False
    terminated: bool = False
    truncated: bool = False
    end_reason: str | None = None
    seed: int | None = None
    """The seed the episode was reset with (``None``: unseeded); a reward stage seeds what it
    samples for this episode from it (the multiturn-aware reward's futures)."""
    tool_calls: dict[str, int] = field(default_factory=dict)
    """Per player, the tool calls it made (malformed ones included)."""
    tool_errors: dict[str, int] = field(default_factory=dict)
    """Per player, the tool calls that failed (malformed, unknown tool, bad arguments, refused)."""
    _rng: np.random.Generator | None = field(default=None, repr=False, compare=False)

    @property
    def rng(self) -> np.random.Generator:
        """The episode's own generator (``np.random.default_rng(rng_seed)``), for tasks that draw
        during an episode. Built on first use: most tasks never draw, and building one costs more
        than the rest of a reset of a small task."""
        if self._rng is None:
            self._rng = np.random.default_rng(self.rng_seed)
        return self._rng

    @rng.setter
    def rng(self, value: np.random.Generator) -> None:
        self._rng = value

    @property
    def conversation(self) -> Conversation:
        """The global transcript (hidden messages included)."""
        return Conversation(tuple(self.messages))

    @property
    def total_chars(self) -> int:
        return sum(self.chars.values())

    def copy(self) -> EpisodeState:
        # Messages and items are immutable by convention and shared; the rest is copied.
        return EpisodeState(
            index=self.index,
            item=self.item,
            rng_seed=self.rng_seed,
            messages=list(self.messages),
            step=self.step,
            on_turn=self.on_turn,
            phase=self.phase,
            moves=dict(self.moves),
            chars=dict(self.chars),
            data=copy.deepcopy(self.data),
            last_moves=dict(self.last_moves),
            done=self.done,
            terminated=self.terminated,
            truncated=self.truncated,
            end_reason=self.end_reason,
            seed=self.seed,
            tool_calls=dict(self.tool_calls),
            tool_errors=dict(self.tool_errors),
            _rng=None if self._rng is None else copy.deepcopy(self._rng),
        )


# ---------------------------------------------------------------------------------------------
# Task: the immutable definition of a collaboration
# ---------------------------------------------------------------------------------------------
class Task:
    """Base class of every task. Subclasses set the class attributes and implement
    :meth:`get_item`, :meth:`start` and :meth:`step`; everything else has a default.

    Attributes:
        players: Player ids, in a fixed order.
        user_players: Players that are simulated users (their text is never trainable and their
            chat role is ``"user"``).
        turn_order: Cycle of sets of players on turn, e.g. ``(("assistant",), ("user",))``.
        option_keys: ``reset(options=...)`` keys the task understands besides ``"index"``.
        default_max_steps: Budget of env steps when the env is not given one.
        step_blocks: :meth:`step` may block for long (it runs programs in the sandbox and waits
            for them): ``CollabEnv.astep`` then runs it in a worker thread, so the other episodes
            on the event loop (a rollout engine's, an audit's) go on meanwhile, and their sandbox
            runs overlap. ``False`` for tasks whose step is quick Python.
    """

    players: tuple[str, ...] = ()
    user_players: tuple[str, ...] = ()
    turn_order: tuple[tuple[str, ...], ...] = ()
    option_keys: ClassVar[frozenset[str]] = frozenset()
    default_max_steps: int = 20
    step_blocks: bool = False

    # -- items ---------------------------------------------------------------------------
    def num_items(self) -> int | None:
        """Number of task items, or ``None`` for an unlimited generated suite."""
        return None

    def get_item(self, index: int) -> Mapping[str, Any]:
        """The task item at ``index`` (deterministic)."""
        raise NotImplementedError

    def item_from_row(self, row: Mapping[str, Any]) -> Mapping[str, Any]:
        """A task item built from a caller's data row (``reset(options={"item": row})``), checked
        like the task's own items. Tasks whose items are data rows override it; the default
        refuses, since a generated task has no row format."""
        raise ConfigError(f"{type(self).__name__} plays only its own items: pass options={{'index': i}}, "
                          "not options={'item': ...}.")

    # -- episode hooks ---------------------------------------------------------------------
    def start(self, state: EpisodeState, options: Mapping[str, Any]) -> Start:
        """Opening messages and first players on turn for ``state.item``."""
        raise NotImplementedError

    def step(self, state: EpisodeState, moves: Mapping[str, str], final: bool) -> Outcome:
        """React to ``moves`` (already appended to ``state.messages``). ``final`` is ``True``
        when an env budget ends the episode after this step, so the task can score it."""
        raise NotImplementedError

    # -- conventions with defaults -----------------------------------------------------------
    def role_of(self, player: str) -> str:
        """Canonical chat role of ``player``'s messages."""
        return "user" if player in self.user_players else "assistant"

    def is_trainable(self, player: str) -> bool:
        """Whether ``player``'s messages may enter a learner's loss."""
        return player not in self.user_players

    def audience(self, player: str) -> tuple[str, ...] | None:
        """Who sees ``player``'s messages (``None``: everybody)."""
        return None

    def tools(self, player: str) -> tuple[Tool, ...]:
        """The tools ``player`` may call (none by default; see "Tools" in the module docstring)."""
        return ()

    def call_tool(self, state: EpisodeState, player: str, call: ToolCall) -> str:
        """Run ``call`` (a call of one of ``tools(player)``, its arguments already checked
        against the tool's schema) and return its result text. Raise
        :class:`~collab_env.errors.ActionError` to refuse it: the message becomes the result and
        the call counts as an error."""
        raise ActionError(f"{type(self).__name__} declares tools but does not run them.")

    def global_view(self, state: EpisodeState) -> Conversation:
        """What ``CollabEnv.state()`` returns; by default the whole transcript."""
        return state.conversation

    def episode_info(self, state: EpisodeState) -> dict[str, Any]:
        """JSON-friendly facts of the episode's state that no transcript reader should have to
        reconstruct (hidden-facts: which withheld facts the user revealed); the episode driver
        stores a non-empty result as ``Episode.info["task"]``. By default none."""
        return {}


# ---------------------------------------------------------------------------------------------
# CollabEnv: the PettingZoo parallel environment
# ---------------------------------------------------------------------------------------------
_SURROGATE = re.compile("[\ud800-\udfff]")


def _clean_text(text: str, limit: int) -> tuple[str, dict[str, Any]]:
    """Make any ``str`` safe to store, encode and print; report what was changed."""
    meta: dict[str, Any] = {}
    if _SURROGATE.search(text):  # lone surrogates cannot be encoded, printed or tokenised
        text = _SURROGATE.sub("\ufffd", text)
        meta["replaced_invalid_unicode"] = True
    if len(text) > limit:
        meta["clipped_from"] = len(text)
        text = text[:limit]
    return text, meta


class CollabEnv(ParallelEnv[str, Conversation, str]):
    """PettingZoo ``ParallelEnv`` running one :class:`Task`.

    Args:
        task: The task to run.
        max_steps: Env steps before the episode is truncated (default: the task's).
        max_message_chars: Longest message kept; longer actions are cut (and flagged).
        max_total_chars: Truncate once all players together wrote this many characters.
        render_mode: ``"ansi"`` (``render()`` returns the transcript) or ``"human"`` (prints it).

    The async methods :meth:`areset` and :meth:`astep` are the core; :meth:`reset` and
    :meth:`step` run them. Wrappers that call models (user simulators, reward models) override
    the async versions so many episodes can share one event loop.
    """

    metadata: ClassVar[dict[str, Any]] = {
        "name": "collab_env",
        "render_modes": ["ansi", "human"],
        "is_parallelizable": True,
    }

    def __init__(
        self,
        task: Task,
        *,
        max_steps: int | None = None,
        max_message_chars: int = 100_000,
        max_total_chars: int | None = None,
        render_mode: str | None = None,
    ) -> None:
        if not isinstance(task, Task):
            raise ConfigError(f"CollabEnv needs a Task, got {type(task).__name__}.")
        if not task.players or not task.turn_order:
            raise ConfigError(f"{type(task).__name__} declares no players or no turn order.")
        for phase in task.turn_order:
            for p in phase:
                if p not in task.players:
                    raise ConfigError(f"turn order names unknown player {p!r}; players are {task.players}.")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ConfigError(
                f"render_mode must be one of {self.metadata['render_modes']} or None, got {render_mode!r}."
            )
        budgets = {"max_steps": max_steps, "max_message_chars": max_message_chars,
                   "max_total_chars": max_total_chars}
        check_keyword_types(budgets, CollabEnv.__init__, where=type(task).__name__)
        max_steps = task.default_max_steps if max_steps is None else max_steps
        if max_steps < 1:
            raise ConfigError(f"max_steps must be >= 1, got {max_steps}.")
        if max_message_chars < 1:
            raise ConfigError(f"max_message_chars must be >= 1, got {max_message_chars}.")
        if max_total_chars is not None and max_total_chars < 1:
            raise ConfigError(f"max_total_chars must be >= 1 or None (no limit), got {max_total_chars}.")
        self.task = task
        self.max_steps = int(max_steps)
        self.max_message_chars = int(max_message_chars)
        self.max_total_chars = max_total_chars
        self.render_mode = render_mode
        self.possible_agents = list(task.players)
        self.agents: list[str] = []
        self._observation_spaces = {p: Chat() for p in task.players}
        self._action_spaces = {p: UnicodeText(self.max_message_chars) for p in task.players}
        self.state_space = Chat()
        self._np_random: np.random.Generator | None = None
        self._np_random_seed: int | None = None
        self._state: EpisodeState | None = None
        self._closed = False
        self.spec = None  # set by collab_env.make

    # -- spaces ------------------------------------------------------------------------------
    def observation_space(self, agent: str) -> Chat:
        return self._observation_spaces[self._check_player(agent)]

    def action_space(self, agent: str) -> UnicodeText:
        return self._action_spaces[self._check_player(agent)]

    def _check_player(self, agent: str) -> str:
        if agent not in self._action_spaces:
            raise ActionError(
                f"unknown player {agent!r}; players are {self.possible_agents}."
                + did_you_mean(str(agent), self.possible_agents)
            )
        return agent

    # -- properties ----------------------------------------------------------------------------
    @property
    def unwrapped(self) -> CollabEnv:
        return self

    @property
    def np_random(self) -> np.random.Generator:
        if self._np_random is None:
            self._np_random, self._np_random_seed = seeding.np_random()
        return self._np_random

    @property
    def episode(self) -> EpisodeState:
        """The current episode's state (read it, do not mutate it)."""
        if self._state is None:
            raise EnvStateError("no episode yet: call reset() first.")
        return self._state

    @property
    def on_turn(self) -> tuple[str, ...]:
        """Players that must act in the next step (empty when the episode is over)."""
        return () if self._state is None or self._state.done else self._state.on_turn

    # -- async core ------------------------------------------------------------------------
    async def areset(
        self, seed: int | None = None, options: Mapping[str, Any] | None = None
    ) -> tuple[dict[str, Conversation], dict[str, dict[str, Any]]]:
        """Start an episode. ``options``: ``{"index": i}`` picks task item ``i``;
        ``{"item": row}`` plays a caller's data row instead (tasks of data rows only, see
        :meth:`Task.item_from_row`; the episode's index is then ``None``); tasks list their other
        keys in ``Task.option_keys``."""
        return self._reset(seed, options)

    async def astep(self, actions: Mapping[str, str]) -> tuple[
        dict[str, Conversation], dict[str, float], dict[str, bool], dict[str, bool], dict[str, dict[str, Any]]
    ]:
        """Apply the moves of the players on turn; see the module docstring. A task whose step
        blocks (``Task.step_blocks``: it runs programs) is stepped in a worker thread."""
        if self.task.step_blocks:
            return await asyncio.to_thread(self._step, actions)
        return self._step(actions)

    # -- sync facades ------------------------------------------------------------------------
    def reset(self, seed: int | None = None, options: Mapping[str, Any] | None = None):
        return run_sync(self.areset(seed=seed, options=options))

    def step(self, actions: Mapping[str, str]):
        return run_sync(self.astep(actions))

    # -- implementation ----------------------------------------------------------------------
    def _reset(self, seed, options):
        if self._closed:
            raise EnvStateError("the environment was closed; create a new one with collab_env.make().")
        if seed is not None:
            self._np_random, self._np_random_seed = seeding.np_random(seed)
            for i, p in enumerate(self.possible_agents):
                # Seeded like Gymnasium: a seeded reset makes action sampling reproducible too.
                self._action_spaces[p].seed_later(int(seed) + i)  # applied at the first sample
        rng = self.np_random
        options = dict(options or {})
        index = options.pop("index", None)
        row = options.pop("item", None)
        unknown = set(options) - set(self.task.option_keys)
        if unknown:
            warnings.warn(
                f"reset() ignores unknown option(s) {sorted(unknown)}; "
                f"{type(self.task).__name__} understands {sorted({'index', *self.task.option_keys})}.",
                stacklevel=3,
            )
        n = self.task.num_items()
        if row is not None:
            if index is not None:
                raise ConfigError("reset() takes options['index'] or options['item'], not both.")
            if not isinstance(row, Mapping):
                raise ConfigError(f"options['item'] must be a mapping (a data row), got {type(row).__name__}.")
            check_depth(row, "reset(options={'item': row}): the row")
        elif index is None:
            index = int(rng.integers(n)) if n else int(rng.integers(2**31 - 1))
        else:
            if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
                raise ConfigError(f"options['index'] must be an int, got {type(index).__name__}.")
            index = int(index)
            if index < 0 or (n is not None and index >= n):
                have = f"indices 0..{n - 1}" if n is not None else "indices 0 and up (generated items)"
                raise ConfigError(f"options['index']={index} is out of range: the task has {have}; "
                                  "pass an index in that range.")
        rng_seed = int(rng.integers(2**63 - 1))
        item = self.task.item_from_row(row) if row is not None else self.task.get_item(index)
        state = EpisodeState(index=index, item=item, rng_seed=rng_seed, seed=None if seed is None else int(seed))
        state.moves = dict.fromkeys(self.possible_agents, 0)
        state.chars = dict.fromkeys(self.possible_agents, 0)
        start = self.task.start(state, {k: v for k, v in options.items() if k in self.task.option_keys})
        state.messages.extend(start.messages)
        state.on_turn = self._validate_on_turn(start.on_turn)
        state.phase = self._phase_of(state.on_turn)
        self._state = state
        self.agents = list(self.possible_agents)
        obs = self._observations()
        infos = {a: {"on_turn": a in state.on_turn, "step": 0, "index": index, **start.info} for a in self.agents}
        return obs, infos

    def _validate_on_turn(self, on_turn) -> tuple[str, ...]:
        on_turn = tuple(on_turn)
        if not on_turn or any(p not in self.possible_agents for p in on_turn):
            raise ConfigError(f"{type(self.task).__name__} put invalid players on turn: {on_turn}.")
        return on_turn

    def _phase_of(self, on_turn: tuple[str, ...]) -> int:
        order = self.task.turn_order
        return order.index(on_turn) if on_turn in order else 0

    def _step(self, actions):
        state = self._state
        if state is None:
            raise EnvStateError("step() before reset(): call reset() to start an episode.")
        if state.done:
            raise EnvStateError(
                f"the episode has ended ({state.end_reason}); call reset() to start a new one."
            )
        if not isinstance(actions, Mapping):
            raise ActionError(
                f"step() takes a dict {{player: message text}}, got {type(actions).__name__}."
            )
        for p in actions:
            if p not in self._action_spaces:
                raise ActionError(
                    f"action for unknown player {p!r}; players are {self.possible_agents}."
                    + did_you_mean(str(p), self.possible_agents)
                )
        moves: dict[str, str] = {}
        step_meta: dict[str, dict[str, Any]] = {}
        for p in state.on_turn:
            if p not in actions:
                raise ActionError(
                    f"player {p!r} is on turn but got no action; players on turn: {list(state.on_turn)} "
                    "(infos[player]['on_turn'] says who must act)."
                )
            a = actions[p]
            if not isinstance(a, str):
                hint = " Pass completion.text." if hasattr(a, "text") else ""
                raise ActionError(
                    f"the action of {p!r} must be the message text (str), got {type(a).__name__}.{hint}"
                )
            text, meta = _clean_text(a, self.max_message_chars)
            moves[p] = text
            step_meta[p] = meta
        actors = state.on_turn
        agents = list(self.agents)
        calls: dict[str, ToolCall | ToolCallError] = {}
        for p in actors:
            tools = self.task.tools(p)
            parsed = parse_tool_call(moves[p], tools, f"call_{state.step}_{p}") if tools else None
            if parsed is not None:
                calls[p] = parsed
            call = parsed.call if isinstance(parsed, ToolCallError) else parsed
            state.messages.append(
                Message(
                    role=self.task.role_of(p),
                    content=moves[p],
                    author=p,
                    trainable=self.task.is_trainable(p),
                    # a tool call is the caller's business: nobody else sees it
                    audience=(p,) if call is not None else self.task.audience(p),
                    meta=step_meta[p],
                    tool_calls=(call,) if call is not None else (),
                )
            )
            state.moves[p] += 1
            state.chars[p] += len(moves[p])
        tool_info = {p: self._run_tool(state, p, c) for p, c in calls.items()}
        state.last_moves = moves
        state.step += 1
        over_steps = state.step >= self.max_steps
        over_chars = self.max_total_chars is not None and state.total_chars >= self.max_total_chars
        final = over_steps or over_chars
        if calls and len(calls) == len(actors) and not final:
            outcome = Outcome(next_on_turn=actors)  # every caller stays on turn for its result
        else:
            outcome = self.task.step(state, moves, final=final)
        state.messages.extend(outcome.messages)

        terminated = bool(outcome.terminated)
        truncated = not terminated and (outcome.truncated or over_steps or over_chars)
        if terminated or truncated:
            state.done, state.terminated, state.truncated = True, terminated, truncated
            state.end_reason = outcome.reason or (
                "max_steps" if over_steps else "max_total_chars" if over_chars else "ended"
            )
            state.on_turn = ()
        else:
            if outcome.next_on_turn is not None:
                state.on_turn = self._validate_on_turn(outcome.next_on_turn)
                state.phase = self._phase_of(state.on_turn)
            else:
                state.phase = (state.phase + 1) % len(self.task.turn_order)
                state.on_turn = self.task.turn_order[state.phase]

        obs = self._observations(agents)
        rewards = {a: float(outcome.rewards.get(a, 0.0)) for a in agents}
        terms = dict.fromkeys(agents, terminated)
        truncs = dict.fromkeys(agents, truncated)
        infos: dict[str, dict[str, Any]] = {}
        for a in agents:
            info: dict[str, Any] = {"on_turn": a in state.on_turn, "step": state.step, **outcome.info}
            if a in outcome.components:
                info["reward_components"] = dict(outcome.components[a])
            if a in tool_info:
                info["tool_call"] = tool_info[a]
            if step_meta.get(a):
                info.update(step_meta[a])
                if "clipped_from" in step_meta[a]:
                    info["clipped"] = True
            if state.done:
                info["end_reason"] = state.end_reason
            infos[a] = info
        if state.done:
            self.agents = []
        if self.render_mode == "human":
            self.render()
        return obs, rewards, terms, truncs, infos

    def _run_tool(self, state: EpisodeState, player: str, parsed: ToolCall | ToolCallError) -> dict[str, Any]:
        """Run one parsed call, append its result for ``player`` and count it; the info entry."""
        state.tool_calls[player] = state.tool_calls.get(player, 0) + 1
        if isinstance(parsed, ToolCallError):
            call, result, ok = parsed.call, parsed.reason, False
        else:
            call = parsed
            try:
                result, ok = self.task.call_tool(state, player, call), True
            except ActionError as exc:
                result, ok = f"error: {exc}", False
        if not ok:
            state.tool_errors[player] = state.tool_errors.get(player, 0) + 1
        state.messages.append(Message(role="tool", content=result, author=ENV_AUTHOR, audience=(player,),
                                      meta={"name": call.name, "ok": ok}, tool_call_id=call.id))
        return {"name": call.name, "id": call.id, "ok": ok, **({} if ok else {"error": result})}

    def _observations(self, agents: list[str] | None = None) -> dict[str, Conversation]:
        conv = self._state.conversation  # type: ignore[union-attr]
        return {a: conv.view(a) for a in (self.agents if agents is None else agents)}

    def observe(self, agent: str) -> Conversation:
        """The current observation of one player (also after the episode ended)."""
        return self.episode.conversation.view(self._check_player(agent))

    def end_episode(self, reason: str) -> None:
        """Truncate the running episode from outside: a policy fault, a budget the caller holds.

        The episode ends as a truncation with ``end_reason=reason``; ``agents`` becomes empty.
        """
        state = self.episode
        if state.done:
            raise EnvStateError(f"the episode has already ended ({state.end_reason}).")
        state.done, state.terminated, state.truncated = True, False, True
        state.end_reason = reason
        state.on_turn = ()
        self.agents = []

    # -- the rest of the ParallelEnv API ---------------------------------------------------------
    def state(self) -> Conversation:
        """Global view for centralised critics: the whole transcript, hidden messages included."""
        return self.task.global_view(self.episode)

    def render(self) -> str | None:
        if self.render_mode is None:
            warnings.warn(
                "render() called without a render_mode; create the env with render_mode='ansi' "
                "or 'human'.",
                stacklevel=2,
            )
            return None
        text = self.episode.conversation.render() if self._state is not None else ""
        if self.render_mode == "ansi":
            return text
        print(text, flush=True)
        return None

    def close(self) -> None:
        """Release resources; calling it twice is fine."""
        self._closed = True

    def clone(self) -> CollabEnv:
        """An independent copy of the env with the full episode state (for forking futures)."""
        new = copy.copy(self)
        new.agents = list(self.agents)
        new._state = self._state.copy() if self._state is not None else None
        new._np_random = copy.deepcopy(self._np_random)
        new._action_spaces = copy.deepcopy(self._action_spaces)
        new._observation_spaces = copy.deepcopy(self._observation_spaces)
        return new

    def __repr__(self) -> str:
        ident = self.spec.id if self.spec is not None else type(self.task).__name__
        return f"<CollabEnv {ident} players={self.possible_agents}>"


def env_message(content: str, *, role: str = "user", audience: tuple[str, ...] | None = None,
                meta: Mapping[str, Any] | None = None) -> Message:
    """A message written by the environment (prompt, feedback, hidden goal)."""
    return Message(role=role, content=content, author=ENV_AUTHOR, trainable=False,
                   audience=audience, meta=dict(meta or {}))

"""The episode driver: the one loop that plays an env with policies.

:func:`advance` plays an env from a given state, one round at a time, until a chosen player is
on turn, the episode ends, or the caller's hook says stop. Everything that plays episodes calls
it: :func:`arun_episode` (and through it the :class:`~collab_env.rollout.RolloutEngine`, eval
and the Ray workers), the single-agent Gymnasium view, the multiturn-aware reward's futures, and
the learners' rollout trees. Each round it records, per player, the policy's
:class:`~collab_env.types.Completion` exactly as it came back (prompt and completion token ids,
log-probs), what the env stored as the move, and the rewards and infos of the step.

A round: the players on turn act concurrently, each through its own policy (``act`` with one
observation; a :class:`~collab_env.rollout.BatchedPolicy` merges the calls of concurrent rounds
of other episodes and forks into one model call), then their moves go to ``env.astep`` together.

**Scorers are stages of the driver.** A reward that must play policies (the multiturn-aware
reward's futures) is a :class:`Scorer`: after a round in which its player moved, the driver calls
it with the env in the state just after that round and *the policy table it is playing with*, so
the futures' players are the policies that play the episode (a learner's live model, an async
frozen copy, a verl server policy, an evaluation's policies). A reward wrapper that carries a
scorer (``env.scorer``, e.g. ``collab_env.make(id, reward="mr")``) is lifted off the env by the
driver (:func:`split_scorers`): the driver steps the env beneath it and runs the scorer itself.
Nothing is bound into an env; the wrapper's own ``astep`` (plain ``env.step``, Gymnasium, SB3)
calls the same scorer with the fixed policies it was built with.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, cast, runtime_checkable

from collab_env.env import CollabEnv
from collab_env.errors import ConfigError, FatalPolicyError, PolicyError
from collab_env.policy import Policy, add_usage, describe, resolve_policy
from collab_env.types import Completion, Conversation, Episode, TurnRecord

__all__ = [
    "Scorer",
    "split_scorers",
    "Step",
    "Advance",
    "advance",
    "act_for",
    "arun_episode",
    "run_episode",
    "check_policies",
    "trainable_turns",
    "fatal_error",
    "note_stopped",
    "STOPPED_NOTE",
    "USAGE_KEYS",
]

#: The cost counters every :class:`~collab_env.types.Episode` starts with.
USAGE_KEYS = ("model_calls", "prompt_tokens", "completion_tokens", "cost")


def fatal_error(outcome: Any) -> FatalPolicyError | None:
    """The :class:`~collab_env.errors.FatalPolicyError` behind an episode's outcome, or ``None``.

    ``outcome`` itself when it is one, else the first one in the chain of errors it was raised
    from or while handling (``__cause__``, then ``__context__``), so a rejected request that a
    reward or an env wrapped in its own error still stops a run. Episodes and other errors give
    ``None``.
    """
    seen: set[int] = set()
    exc = outcome
    while isinstance(exc, BaseException) and id(exc) not in seen:
        if isinstance(exc, FatalPolicyError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ if exc.__cause__ is not None else (
            None if exc.__suppress_context__ else exc.__context__)
    return None


#: How the note of :func:`note_stopped` begins.
STOPPED_NOTE = "The rollout stopped at this rejected request: "


def note_stopped(fatal: FatalPolicyError, detail: str) -> FatalPolicyError:
    """``fatal`` with a note saying what the run did when it stopped (raised once, as is)."""
    note = STOPPED_NOTE + detail
    if note not in getattr(fatal, "__notes__", ()):
        if sys.version_info >= (3, 11):
            fatal.add_note(note)
        else:  # no add_note before 3.11: keep the note where 3.11 keeps it
            fatal.__notes__ = [*getattr(fatal, "__notes__", ()), note]  # type: ignore[attr-defined]
    return fatal


def check_policies(env: Any, policies: Mapping[str, Any], players: Iterable[str]) -> dict[str, Policy]:
    """Resolve policies for ``players``; a missing one is an error naming the player.

    Args:
        env: The env the players belong to (named in the error).
        policies: Player -> policy object or reference (see
            :func:`~collab_env.policy.resolve_policy`).
        players: Players that need a policy.

    Returns:
        Player -> resolved policy.

    Raises:
        ConfigError: A player has no policy.
    """
    resolved: dict[str, Policy] = {}
    for p in players:
        if p not in policies or policies[p] is None:
            raise ConfigError(
                f"no policy for player {p!r}; pass policies={{{p!r}: ...}} "
                f"(players: {list(env.possible_agents)})."
            )
        resolved[p] = resolve_policy(policies[p])
    return resolved


async def act_for(
    players: Iterable[str],
    observations: Mapping[str, Conversation],
    policies: Mapping[str, Policy],
    sampling: Mapping[str, Mapping[str, Any]] | None = None,
    seed: int | None = None,
    *,
    return_errors: bool = False,
) -> dict[str, Completion | PolicyError]:
    """Ask each player's policy for one completion, all concurrently.

    Args:
        players: Players on turn.
        observations: Player -> its observation.
        policies: Player -> policy.
        sampling: Player -> sampling keywords.
        seed: Passed as ``seed=`` to every policy (unless its sampling sets one).
        return_errors: Return a player's :class:`~collab_env.errors.PolicyError` in place of its
            completion instead of raising it (a :class:`~collab_env.errors.FatalPolicyError` is
            always raised).

    Returns:
        Player -> its completion (or its error, with ``return_errors``).

    Raises:
        PolicyError: A policy raised or returned something other than one Completion.
    """
    players = list(players)
    sampling = sampling or {}

    async def one(p: str) -> Completion | PolicyError:
        kw = dict(sampling.get(p, {}))
        if seed is not None:
            kw.setdefault("seed", seed)
        try:
            try:
                out = await policies[p].act([observations[p]], **kw)
            except PolicyError:
                raise
            except Exception as exc:  # surface, never swallow: the caller counts and reports it
                raise PolicyError(f"policy {describe(policies[p])} for player {p!r} failed: {exc!r}") from exc
            if not isinstance(out, list) or len(out) != 1 or not isinstance(out[0], Completion):
                raise PolicyError(
                    f"policy {describe(policies[p])} for {p!r} must return a list with one Completion "
                    f"per observation, got {out!r:.200}."
                )
        except PolicyError as exc:
            if return_errors and not isinstance(exc, FatalPolicyError):
                return exc
            raise
        return out[0]

    if len(players) == 1:  # the common case: skip gather's task creation
        return {players[0]: await one(players[0])}
    quick = [p for p in players if getattr(policies[p], "answers_at_once", False) is True]
    if len(quick) < len(players) - 1:
        results = await asyncio.gather(*(one(p) for p in players))
        return dict(zip(players, results, strict=True))
    # Every policy but at most one answers without suspending (scripted partners and users):
    # they run inline, then the other one is awaited inline too, with no task per player.
    # Concurrency is unchanged (a policy that never suspends cannot overlap with anything).
    out: dict[str, Completion | PolicyError] = {}
    rest = [p for p in players if p not in quick]
    for i, p in enumerate(quick):
        try:
            out[p] = await one(p)
        except BaseException:
            # As under gather: the error is raised, the other players' calls still run.
            for q in [*rest, *quick[i + 1:]]:
                _in_background(one(q))
            raise
    for p in rest:
        out[p] = await one(p)
    return {p: out[p] for p in players}


_BACKGROUND: set[asyncio.Task] = set()


def _in_background(coro: Any) -> None:
    """Run ``coro`` to its end in a task nobody awaits (its result and error are dropped)."""
    task = asyncio.ensure_future(coro)
    _BACKGROUND.add(task)
    task.add_done_callback(_drop)


def _drop(task: asyncio.Task) -> None:
    _BACKGROUND.discard(task)
    if not task.cancelled():
        task.exception()  # retrieved: no "exception was never retrieved" log


@runtime_checkable
class Scorer(Protocol):
    """A reward stage of the driver: it scores ``player``'s move after each round in which
    ``player`` moved.

    The driver (:func:`advance`) calls :meth:`score` right after ``env.astep`` returned, with the
    env in that state, the step's rewards and infos (copies it may change in place: the driver
    records them in the :class:`Step` and returns them to its caller) and the driver's own policy
    table and sampling keywords. A scorer that plays policies (forks of ``env``) plays the ones it
    is given, so what it plays is what the caller plays; it holds policies only for what the
    caller does not play (a user simulator named by the reward's configuration).
    """

    player: str
    """The player whose moves it scores."""
    name: str
    """The key of what it records in ``infos[player]`` and in the reward components (``"mr"``)."""

    async def score(self, env: Any, rewards: dict[str, float], infos: dict[str, dict[str, Any]], *,
                    policies: Mapping[str, Any], sampling: Mapping[str, Mapping[str, Any]],
                    start: int, step: int) -> None:
        """Score ``player``'s move of the round just played.

        Args:
            env: The env (a ``CollabEnv`` or a wrapper of one without scorers) in the state
                right after the round; a scorer forks it (``env.clone()``) and never steps it.
            rewards: Player -> reward of the round (change ``rewards[player]`` in place).
            infos: Player -> info of the round (add to ``infos[player]`` in place).
            policies: The driver's policy table (player -> policy).
            sampling: The driver's sampling keywords (player -> keywords).
            start: The index in ``env.unwrapped.episode.messages`` of the round's first message.
            step: The env step of the round (``episode.step`` before it).
        """
        ...


def split_scorers(env: Any) -> tuple[Any, list[Scorer]]:
    """``(inner, scorers)``: ``env`` without the outer reward wrappers that carry a scorer
    (``layer.scorer``, a :class:`Scorer`), and those scorers, innermost first (the order their
    wrappers would apply them). An env without such a wrapper on the outside is returned as is.
    The driver plays ``inner`` and runs the scorers itself, with its own policy table."""
    scorers: list[Scorer] = []
    layer = env
    while True:
        # Most envs carry no scorer: the runtime protocol check (costly) only runs for one.
        scorer = getattr(layer, "scorer", None)
        if scorer is None or not isinstance(scorer, Scorer) or getattr(layer, "env", None) is None:
            break
        scorers.append(scorer)
        layer = layer.env
    return layer, scorers[::-1]


@dataclass
class Step:
    """One round of an :func:`advance`: who moved, with what, and what the env returned."""

    index: int
    """Round index within the :func:`advance` call (0-based)."""
    completions: dict[str, Completion]
    """Player -> the completion its policy returned (players whose move was given are absent)."""
    actions: dict[str, str]
    """Player -> the text sent to ``env.astep`` (given moves included)."""
    moves: dict[str, str]
    """Player -> the move as the env stored it (cleaned, clipped)."""
    rewards: dict[str, float]
    terminations: dict[str, bool]
    truncations: dict[str, bool]
    infos: dict[str, dict[str, Any]]


@dataclass
class Advance:
    """What :func:`advance` did: the state it stopped in and the rounds it played."""

    obs: dict[str, Conversation]
    """Observations of the state it stopped in."""
    infos: dict[str, dict[str, Any]]
    """Infos of that state (``infos[p]["on_turn"]``)."""
    done: bool
    """The episode ended (terminated, truncated or ended by a fault)."""
    stopped: str
    """Why it stopped: ``"done"``, ``"until"`` (a player of ``until`` is on turn), ``"fault"``,
    ``"before_step"``, ``"on_moves"`` (a hook said stop) or ``"max_steps"``."""
    steps: list[Step] = field(default_factory=list)
    faults: list[dict[str, Any]] = field(default_factory=list)
    """``{"step", "player", "reason"}`` of each policy that gave up (``Completion.is_fault``)."""
    scores: list[dict[str, Any]] = field(default_factory=list)
    """``{"step": env step, "player", <scorer name>: infos[player][name]}`` of each move a
    :class:`Scorer` scored, in order."""

    def reward(self, player: str) -> float:
        """``player``'s reward summed over the rounds played."""
        return sum(float(s.rewards.get(player, 0.0)) for s in self.steps)

    def components(self, player: str) -> dict[str, float]:
        """``player``'s reward components (``infos[p]["reward_components"]``) summed over the rounds."""
        total: dict[str, float] = {}
        for s in self.steps:
            for k, v in s.infos.get(player, {}).get("reward_components", {}).items():
                total[k] = total.get(k, 0.0) + float(v)
        return total

    def usage(self) -> dict[str, float]:
        """The policies' usage (``Completion.usage``: model calls, tokens, cost) summed."""
        total: dict[str, float] = {}
        for s in self.steps:
            for c in s.completions.values():
                add_usage(total, c.usage)
        return total

    def moves(self) -> list[tuple[str, str]]:
        """``(player, text sent)`` of every move, in order."""
        return [(p, t) for s in self.steps for p, t in s.actions.items()]


def _on_turn(env: Any, infos: Mapping[str, Mapping[str, Any]]) -> list[str]:
    return [a for a in env.agents if infos.get(a, {}).get("on_turn")]


async def advance(
    env: Any,
    policies: Mapping[str, Any],
    *,
    obs: Mapping[str, Conversation] | None = None,
    infos: Mapping[str, Mapping[str, Any]] | None = None,
    until: Iterable[str] = (),
    actions: Mapping[str, str] | None = None,
    sampling: Mapping[str, Mapping[str, Any]] | None = None,
    seed: Callable[[int], int | None] | None = None,
    observe: Callable[[str, Conversation], Conversation] | None = None,
    before_step: Callable[[int, list[str]], bool] | None = None,
    on_moves: Callable[[int, dict[str, Completion | PolicyError]], Mapping[str, str] | None] | None = None,
    on_fault: str = "end",
    max_steps: int | None = None,
    scorers: Iterable[Scorer] = (),
) -> Advance:
    """Play ``env`` from the state ``(obs, infos)`` with one policy per player.

    Each round, the players on turn act concurrently through their policies (with one
    observation each) and their moves go to ``env.astep`` together. It stops when the episode
    ends, when a player of ``until`` is on turn (before it acts), or when a hook says so.

    Args:
        env: A :class:`~collab_env.env.CollabEnv` or a wrapper of one, in the state that
            ``obs`` and ``infos`` (what ``areset``/``astep`` returned) describe.
        policies: Player -> :class:`~collab_env.policy.Policy` (resolved) for every player that
            may come on turn and is not given a move; a missing one is a ConfigError when that
            player comes on turn.
        obs: Player -> observation of the current state (default: ``env.observe`` of every
            player still in the episode, e.g. of a fresh ``env.clone()``).
        infos: Player -> info of the current state (``"on_turn"``; default: who is in
            ``env.on_turn``).
        until: Stop as soon as one of these players is on turn (they are the caller's: a learner,
            the controlled player of a single-agent view). Not checked in the first round when
            ``actions`` gives their moves.
        actions: Moves already chosen for the first round (player -> text); the other players on
            turn in that round act through their policies.
        sampling: Player -> sampling keywords for its policy.
        seed: ``seed(k)`` is passed as ``seed=`` to the policies of round ``k`` (``None``:
            no seed).
        observe: ``observe(player, observation)`` is what the policy sees (default: the
            observation itself).
        before_step: ``before_step(k, on_turn)``; ``False`` stops before round ``k`` is played.
        on_moves: ``on_moves(k, moves)`` with player -> Completion, or the player's
            :class:`~collab_env.errors.PolicyError` (only passed here when this hook is given;
            otherwise errors raise); returns the texts to send for the players that moved (the
            caller decides what a fault becomes), or ``None`` to stop without stepping.
        on_fault: What a completion that gave up (``Completion.is_fault``) does when there is no
            ``on_moves``: ``"end"`` ends the episode (``env.end_episode("fault:<player>")``,
            recorded in :attr:`Advance.faults`); ``"raise"`` raises PolicyError.
        max_steps: Most rounds to play.
        scorers: Reward stages (:class:`Scorer`) run after each round in which their player
            moved, with ``policies`` and ``sampling``; the scorers of ``env``'s outer reward
            wrappers (:func:`split_scorers`) run first. Players that only a scorer plays (the
            caller's own players in ``until``, whose moves come in ``actions``) belong in
            ``policies`` too: they never act here, but the scorer's futures play them.

    Returns:
        The :class:`Advance`: the state it stopped in and every round's completions (token ids
        and log-probs as the policy returned them), moves, rewards and infos (the scorers'
        rewards and infos included).

    Raises:
        PolicyError: A policy raised or returned an invalid result (unless ``on_moves`` takes
            errors), or gave up with ``on_fault="raise"``.
        ConfigError: A player on turn has no policy; ``on_fault`` is unknown.
    """
    if on_fault not in ("end", "raise"):
        raise ConfigError(f"on_fault must be 'end' or 'raise', got {on_fault!r}.")
    env, lifted = split_scorers(env)
    stages = [*lifted, *scorers]
    if obs is None:
        obs = {a: env.observe(a) for a in env.agents}
    if infos is None:
        infos = {a: {"on_turn": a in env.on_turn} for a in env.agents}
    stop_for = set(until)
    given = dict(actions or {})
    out = Advance(obs=dict(obs), infos=dict(cast("Mapping[str, dict[str, Any]]", infos)), done=not env.agents,
                  stopped="done")
    k = 0
    while env.agents:
        on_turn = _on_turn(env, out.infos)
        if stop_for and any(p in stop_for and p not in given for p in on_turn):
            out.stopped = "until"
            return out
        if max_steps is not None and k >= max_steps:
            out.stopped = "max_steps"
            return out
        if before_step is not None and not before_step(k, on_turn):
            out.stopped = "before_step"
            return out
        acting = [p for p in on_turn if p not in given]
        missing = [p for p in acting if policies.get(p) is None]
        if missing:
            raise ConfigError(
                f"player(s) {missing} are on turn but have no policy; pass policies={{{missing[0]!r}: ...}} "
                f"(players: {list(env.possible_agents)})."
            )
        seen = out.obs if observe is None else {p: observe(p, out.obs[p]) for p in acting}
        moves = await act_for(acting, seen, policies, sampling, None if seed is None else seed(k),
                              return_errors=on_moves is not None) if acting else {}
        completions = {p: c for p, c in moves.items() if isinstance(c, Completion)}
        if on_moves is not None:
            texts = on_moves(k, moves)
            if texts is None:
                out.stopped = "on_moves"
                return out
            sent = {**given, **texts}
        else:
            faulty = [p for p, c in completions.items() if c.is_fault]
            if faulty:
                reasons = {p: completions[p].meta.get("fault", "") for p in faulty}
                if on_fault == "raise":
                    raise PolicyError(f"the policy of {faulty[0]!r} gave up: {reasons[faulty[0]]}")
                out.faults += [{"step": k, "player": p, "reason": reasons[p]} for p in faulty]
                out.steps.append(Step(k, completions, {}, {}, {}, {}, {}, {}))
                env.end_episode(f"fault:{faulty[0]}")
                out.infos = {p: {**out.infos.get(p, {}), "on_turn": False} for p in env.possible_agents}
                out.done, out.stopped = True, "fault"
                return out
            sent = {**given, **{p: c.text for p, c in completions.items()}}
        given = {}
        state = getattr(env, "unwrapped", env).episode
        start, env_step = len(state.messages), state.step
        nobs, rewards, terms, truncs, ninfos = await env.astep(sent)
        if stages:
            rewards, ninfos = dict(rewards), {p: dict(v) for p, v in ninfos.items()}
            for stage in stages:
                if stage.player in sent and stage.player in rewards:
                    await stage.score(env, rewards, ninfos, policies=policies, sampling=sampling or {},
                                      start=start, step=env_step)
                    out.scores.append({"step": env_step, "player": stage.player,
                                       stage.name: ninfos.get(stage.player, {}).get(stage.name)})
        stored = getattr(env, "unwrapped", env).episode.last_moves
        out.steps.append(Step(k, completions, sent, {p: stored.get(p, t) for p, t in sent.items()},
                              dict(rewards), dict(terms), dict(truncs), dict(ninfos)))
        out.obs, out.infos = dict(nobs), dict(ninfos)
        k += 1
        if any(terms.values()) or any(truncs.values()):
            break
    out.done, out.stopped = True, "done"
    return out


async def arun_episode(
    env: CollabEnv,
    policies: Mapping[str, Any],
    *,
    seed: int | None = None,
    index: int | None = None,
    options: Mapping[str, Any] | None = None,
    sampling: Mapping[str, Mapping[str, Any]] | None = None,
    on_step: Callable[[int, dict[str, Completion]], None] | None = None,
    policy_seeds: bool = True,
    max_turns: Mapping[str, int] | None = None,
    scorers: Iterable[Scorer] = (),
) -> Episode:
    """Play one episode of ``env`` with one policy per player; return the :class:`Episode`.

    Resets ``env`` and plays it to the end with :func:`advance`.

    Args:
        env: The environment (reset here).
        policies: Player -> policy object or reference, for every player.
        seed: Seed of ``env.reset``.
        index: Task item (``options={"index": index}``).
        options: Other ``reset`` options.
        sampling: Player -> sampling keywords.
        on_step: Called with ``(step, completions)`` after every policy round.
        policy_seeds: Pass ``seed=seed + step`` to the policies of a seeded episode (so it is
            reproducible with deterministic policies); ``False`` passes no seed.
        max_turns: Player -> most moves it makes in this episode: once a player has made that
            many, the episode ends after that round (``env.end_episode("max_turns:<player>")``,
            a truncation). The env scored the round first, so a multiturn-aware reward still
            rolls the futures of that last move, as when a trainer's sample is one reply (the
            CollabLLM recipe's verl setting).
        scorers: Reward stages beside those of ``env``'s reward wrappers (see :func:`advance`);
            they play ``policies``.

    Returns:
        The finished episode; each :class:`~collab_env.types.TurnRecord` holds the policy's
        completion unchanged; ``info["scores"]`` what the scorers recorded
        (:attr:`Advance.scores`).

    Raises:
        PolicyError: A policy raised or returned an invalid result.
        ConfigError: A player has no policy.
    """
    resolved = check_policies(env, policies, env.possible_agents)
    opts = dict(options or {})
    if index is not None:
        opts["index"] = index
    obs, infos = await env.areset(seed=seed, options=opts)

    def record(k: int, moves: dict[str, Any]) -> dict[str, str] | None:
        completions = {p: c for p, c in moves.items() if isinstance(c, Completion)}
        for c in moves.values():
            if not isinstance(c, Completion):
                raise c
        if on_step is not None:
            on_step(k, completions)
        faulty = [p for p, c in completions.items() if c.is_fault]
        if faulty:
            faults.extend({"step": k, "player": p, "reason": completions[p].meta.get("fault", "")} for p in faulty)
            usage_of_faults.extend(completions.values())
            env.end_episode(f"fault:{faulty[0]}")
            return None
        return {p: c.text for p, c in completions.items()}

    limits = dict(max_turns or {})
    for p, n in limits.items():
        if p not in env.possible_agents or not isinstance(n, int) or n < 1:
            raise ConfigError(f"max_turns must map players of the env ({list(env.possible_agents)}) to integers "
                              f">= 1; got {p!r}: {n!r}.")
    made = dict.fromkeys(limits, 0)

    def count(k: int, moves: dict[str, Any]) -> dict[str, str] | None:
        for p in moves:
            if p in made:
                made[p] += 1
        return record(k, moves)

    def budget_left(k: int, on_turn: list[str]) -> bool:
        spent = [p for p, n in limits.items() if made[p] >= n]
        if spent:
            env.end_episode(f"max_turns:{spent[0]}")
            return False
        return True

    faults: list[dict[str, Any]] = []
    usage_of_faults: list[Completion] = []
    step_seed = None if seed is None or not policy_seeds else (lambda k: seed + k)
    run = await advance(env, resolved, obs=obs, infos=infos, sampling=sampling, seed=step_seed,
                        on_moves=count if limits else record, before_step=budget_left if limits else None,
                        scorers=scorers)
    ep = Episode(
        env_id=env.spec.id if env.spec is not None else None,
        seed=seed,
        index=env.episode.index,
        conversation=Conversation(),
        rewards={p: [] for p in env.possible_agents},
        returns=dict.fromkeys(env.possible_agents, 0.0),
        components={p: {} for p in env.possible_agents},
        costs=dict.fromkeys(USAGE_KEYS, 0.0),
        info={"policies": {p: describe(pol) for p, pol in resolved.items()}},
    )
    for st in run.steps:
        for c in st.completions.values():
            add_usage(ep.costs, c.usage)
        for p in st.rewards:
            ep.rewards[p].append(st.rewards[p])
            ep.returns[p] += st.rewards[p]
            for name, v in st.infos.get(p, {}).get("reward_components", {}).items():
                ep.components[p][name] = ep.components[p].get(name, 0.0) + float(v)
        for p, c in st.completions.items():
            ep.turns.append(TurnRecord(step=st.index, player=p, text=st.moves[p], reward=st.rewards[p],
                                       completion=c, trainable=env.task.is_trainable(p),
                                       components=dict(st.infos.get(p, {}).get("reward_components", {}))))
    for c in usage_of_faults:
        add_usage(ep.costs, c.usage)
    if faults:
        ep.costs["faults"] = ep.costs.get("faults", 0.0) + len(faults)
        ep.info["faults"] = faults
    if run.scores:
        ep.info["scores"] = run.scores
    state = env.episode
    if state.tool_calls:  # counted, never dropped: a malformed call is a tool error
        ep.costs["tool_calls"] = float(sum(state.tool_calls.values()))
        ep.costs["tool_errors"] = float(sum(state.tool_errors.values()))
    task_info = env.task.episode_info(state)
    if task_info:
        ep.info["task"] = task_info
    ep.conversation = state.conversation
    ep.terminated, ep.truncated, ep.end_reason = state.terminated, state.truncated, state.end_reason
    return ep


def run_episode(env: CollabEnv, policies: Mapping[str, Any], **kwargs: Any) -> Episode:
    """Synchronous :func:`arun_episode` (same arguments)."""
    from collab_env._async import run_sync

    return run_sync(arun_episode(env, policies, **kwargs))


def trainable_turns(episode: Episode, player: str | None = None, *, require_tokens: bool = False) -> list[TurnRecord]:
    """The moves a learner may put in its loss: trainable and produced by a policy.

    Simulated-user and environment text is never included (``TurnRecord.trainable`` is the
    task's verdict).

    Args:
        episode: A finished episode.
        player: Only this player's moves (default: every trainable player).
        require_tokens: Raise unless every returned move carries ``prompt_token_ids``,
            ``token_ids`` and ``logprobs`` (what a policy-gradient learner needs).

    Returns:
        The turn records, in episode order.

    Raises:
        ConfigError: ``require_tokens`` and a move has no token ids or log-probs.
    """
    out = [t for t in episode.completions(player) if t.trainable]
    if require_tokens:
        for t in out:
            c = t.completion
            if c is None or c.token_ids is None or c.logprobs is None or c.prompt_token_ids is None:
                raise ConfigError(
                    f"the move of {t.player!r} at step {t.step} has no token ids or log-probs; "
                    "roll out trainable players with a backend that returns them (hf, vllm)."
                )
    return out


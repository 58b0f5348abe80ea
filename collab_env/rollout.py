"""Running episodes: players driven by policies, results as :class:`~collab_env.types.Episode`.

Three layers, each usable on its own:

* :func:`arun_episode` / :func:`run_episode` play **one** episode.
* :class:`BatchedPolicy` wraps **any** policy and merges the concurrent ``act`` calls of many
  episodes into one call of the wrapped policy (flushed at ``max_batch_size`` observations or
  ``max_wait_ms`` after the first one arrived).
* :class:`RolloutEngine` (and the shortcuts :func:`rollout` / :func:`arollout`) runs **many**
  episodes at once on one event loop:

  - every episode is its own task and advances on its own: a slow episode never holds a fast
    one back (no lockstep; an episode waits only for its own policy calls);
  - policy calls are batched across episodes, one :class:`BatchedPolicy` per distinct policy
    (players sharing a policy object share its batches);
  - ``concurrency`` bounds the episodes in flight, ``max_calls_per_second`` (a token bucket,
    :class:`RateLimiter`) and ``max_concurrent_calls`` bound the policy calls of all episodes
    together;
  - results stream out as ``(job, episode)`` pairs in order of completion, a failed episode as
    ``(job, exception)`` (counted in :class:`RolloutStats`, never swallowed);
  - a :class:`~collab_env.errors.FatalPolicyError` (a provider rejected a request: a missing or
    invalid API key...) stops the whole run instead: no new episode starts, the episodes in
    flight are cancelled (and with them their policy calls), and the error is raised once,
    with the provider's message, after the results that were already done;
  - a tqdm progress bar shows episodes done, failures, episodes in flight and the mean batch.

  :class:`collab_env.rollout_ray.RayRolloutEngine` runs the same engine on Ray workers.

Token-exactness
    The engine never re-tokenises or edits what a policy returns: every
    :class:`~collab_env.types.TurnRecord` holds the policy's :class:`~collab_env.types.Completion`
    as it came back (``prompt_token_ids``, ``token_ids``, ``logprobs``), and ``trainable`` is the
    task's verdict (simulated users and the environment are never trainable).
    :func:`trainable_turns` lists what a learner may train on.

Seeds
    A job's ``seed`` seeds ``env.reset``; policies get ``seed=seed + step`` at each step (set
    ``policy_seeds=False`` to pass none). See :class:`BatchedPolicy` for how seeds travel in a
    batch.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import pickle
import queue
import sys
import threading
import time
from collections import deque
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

from collab_env.agents.base import Policy, add_usage, describe, resolve_policy
from collab_env.env import CollabEnv
from collab_env.errors import ConfigError, FatalPolicyError, PolicyError
from collab_env.types import Completion, Conversation, Episode, TurnRecord

__all__ = [
    "act_for",
    "arun_episode",
    "run_episode",
    "arun_episodes",
    "check_policies",
    "BatchedPolicy",
    "BatchStats",
    "batches_itself",
    "RateLimiter",
    "RolloutConfig",
    "RolloutStats",
    "RolloutEngine",
    "rollout",
    "arollout",
    "normalize_jobs",
    "trainable_turns",
    "fatal_error",
    "env_factory",
    "iterate_in_thread",
    "picklable_error",
]

_USAGE_KEYS = ("model_calls", "prompt_tokens", "completion_tokens", "cost")

#: What a rollout yields: the job (as a dict) and its episode, or the exception that ended it.
Result = tuple[dict[str, Any], "Episode | BaseException"]


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


def _stopped(fatal: FatalPolicyError, detail: str) -> FatalPolicyError:
    """``fatal`` with a note saying what the run did when it stopped (raised once, as is)."""
    note = f"The rollout stopped at this rejected request: {detail}"
    if note not in getattr(fatal, "__notes__", ()):
        fatal.add_note(note)
    return fatal


# ---------------------------------------------------------------------------------------------
# One episode
# ---------------------------------------------------------------------------------------------
def check_policies(env: CollabEnv, policies: Mapping[str, Any], players: Iterable[str]) -> dict[str, Policy]:
    """Resolve policies for ``players``; a missing one is an error naming the player.

    Args:
        env: The env the players belong to (named in the error).
        policies: Player -> policy object or reference (see
            :func:`~collab_env.agents.base.resolve_policy`).
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
                f"(players: {env.possible_agents})."
            )
        resolved[p] = resolve_policy(policies[p])
    return resolved


async def act_for(
    players: Iterable[str],
    observations: Mapping[str, Conversation],
    policies: Mapping[str, Policy],
    sampling: Mapping[str, Mapping[str, Any]] | None = None,
    seed: int | None = None,
) -> dict[str, Completion]:
    """Ask each player's policy for one completion, all concurrently.

    Args:
        players: Players on turn.
        observations: Player -> its observation.
        policies: Player -> policy.
        sampling: Player -> sampling keywords.
        seed: Passed as ``seed=`` to every policy (unless its sampling sets one).

    Returns:
        Player -> its completion.

    Raises:
        PolicyError: A policy raised or returned something other than one Completion.
    """
    players = list(players)
    sampling = sampling or {}

    async def one(p: str) -> Completion:
        kw = dict(sampling.get(p, {}))
        if seed is not None:
            kw.setdefault("seed", seed)
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
        return out[0]

    if len(players) == 1:  # the common case: skip gather's task creation
        return {players[0]: await one(players[0])}
    results = await asyncio.gather(*(one(p) for p in players))
    return dict(zip(players, results, strict=True))


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
) -> Episode:
    """Play one episode of ``env`` with one policy per player; return the :class:`Episode`.

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

    Returns:
        The finished episode; each :class:`~collab_env.types.TurnRecord` holds the policy's
        completion unchanged.

    Raises:
        PolicyError: A policy raised or returned an invalid result.
        ConfigError: A player has no policy.
    """
    resolved = check_policies(env, policies, env.possible_agents)
    opts = dict(options or {})
    if index is not None:
        opts["index"] = index
    obs, infos = await env.areset(seed=seed, options=opts)
    ep = Episode(
        env_id=env.spec.id if env.spec is not None else None,
        seed=seed,
        index=env.episode.index,
        conversation=Conversation(),
        rewards={p: [] for p in env.possible_agents},
        returns=dict.fromkeys(env.possible_agents, 0.0),
        components={p: {} for p in env.possible_agents},
        costs=dict.fromkeys(_USAGE_KEYS, 0.0),
        info={"policies": {p: describe(pol) for p, pol in resolved.items()}},
    )
    step = 0
    while env.agents:
        on_turn = [a for a in env.agents if infos[a].get("on_turn")]
        step_seed = None if seed is None or not policy_seeds else seed + step
        completions = await act_for(on_turn, obs, resolved, sampling, step_seed)
        for c in completions.values():
            add_usage(ep.costs, c.usage)
        if on_step is not None:
            on_step(step, completions)
        faulty = [p for p, c in completions.items() if c.is_fault]
        if faulty:
            ep.costs["faults"] = ep.costs.get("faults", 0.0) + len(faulty)
            ep.info["faults"] = [{"step": step, "player": p, "reason": completions[p].meta.get("fault", "")}
                                 for p in faulty]
            env.end_episode(f"fault:{faulty[0]}")
            break
        agents = list(env.agents)
        obs, rewards, terms, truncs, infos = await env.astep({p: c.text for p, c in completions.items()})
        for p in agents:
            ep.rewards[p].append(rewards[p])
            ep.returns[p] += rewards[p]
            for name, v in infos[p].get("reward_components", {}).items():
                ep.components[p][name] = ep.components[p].get(name, 0.0) + float(v)
        # What the env stored (cleaned, clipped) is the move; the completion keeps the raw output.
        stored = env.episode.last_moves
        for p, c in completions.items():
            ep.turns.append(
                TurnRecord(
                    step=step,
                    player=p,
                    text=stored[p],
                    reward=rewards[p],
                    completion=c,
                    trainable=env.task.is_trainable(p),
                    components=dict(infos[p].get("reward_components", {})),
                )
            )
        step += 1
        if any(terms.values()) or any(truncs.values()):
            break
    st = env.episode
    ep.conversation = st.conversation
    ep.terminated, ep.truncated, ep.end_reason = st.terminated, st.truncated, st.end_reason
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


# ---------------------------------------------------------------------------------------------
# Batching any policy
# ---------------------------------------------------------------------------------------------
@dataclass
class BatchStats:
    """Counters of one :class:`BatchedPolicy` (``policy.stats``).

    Args:
        calls: ``act`` calls received (from episodes).
        observations: Observations in those calls.
        batches: ``act`` calls made on the wrapped policy.
        largest_batch: Most observations in one of them.
        failed_batches: Batches whose call raised or returned a wrong result (every caller in
            the batch got the error).
    """

    calls: int = 0
    observations: int = 0
    batches: int = 0
    largest_batch: int = 0
    failed_batches: int = 0

    @property
    def mean_batch_size(self) -> float:
        """Observations per call of the wrapped policy."""
        return self.observations / self.batches if self.batches else 0.0

    def to_dict(self) -> dict[str, float]:
        """The counters plus ``mean_batch_size``."""
        return {**asdict(self), "mean_batch_size": self.mean_batch_size}

    def merge(self, other: BatchStats) -> None:
        """Add ``other``'s counters (used to sum stats of several workers)."""
        for f in fields(self):
            if f.name == "largest_batch":
                self.largest_batch = max(self.largest_batch, other.largest_batch)
            else:
                setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


def _freeze(value: Any) -> Any:
    """A hashable stand-in for a sampling value (lists, dicts...)."""
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), _freeze(v)) for k, v in value.items()))
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return value


@dataclass
class _Call:
    observations: Sequence[Conversation]
    seed: Any
    future: asyncio.Future


class _Group:
    """Calls waiting for a batch, all with the same sampling keywords."""

    __slots__ = ("kwargs", "pending", "size", "timer", "first_arrival")

    def __init__(self, kwargs: dict[str, Any]) -> None:
        self.kwargs = kwargs
        self.pending: deque[_Call] = deque()
        self.size = 0
        self.timer: asyncio.TimerHandle | None = None
        self.first_arrival = 0.0


SeedMode = Literal["auto", "group", "rows"]


class BatchedPolicy:
    """Merge concurrent ``act`` calls into batched calls of ``policy`` (works for any policy).

    Calls that arrive on the same event loop with the same sampling keywords wait together; the
    group is sent as **one** ``policy.act(observations, **sampling)`` call once it holds
    ``max_batch_size`` observations, or ``max_wait_ms`` after its first call arrived, whichever
    comes first. Each caller gets its own completions back, in order; if the batched call fails,
    every caller in it gets the error. Batches run concurrently with each other (a backend that
    cannot, serialises them itself). A single call larger than ``max_batch_size`` is never split.

    How seeds travel (the per-episode ``seed`` keyword differs between episodes):

    * ``seeds="group"``: the seed is part of the grouping key, so only calls with the same seed
      share a batch, which gets ``seed=s``. Exact for policies whose randomness depends on the
      seed and the observation only (scripted policies, API models), but seeded episodes then
      rarely share a batch.
    * ``seeds="rows"``: calls with different seeds share a batch, which gets ``seeds=[...]``
      (one per observation: the seed of the call it came from) and no ``seed``. Only for
      policies that accept it: they declare ``accepts_row_seeds = True`` and must treat row ``i``
      as they would ``act([observations[i]], seed=seeds[i])``.
    * ``seeds="auto"`` (default): ``"rows"`` when the policy declares ``accepts_row_seeds``,
      else ``"group"``.

    Unseeded calls (no ``seed`` keyword) always batch together. To batch seeded rollouts with a
    policy that takes no row seeds, run them with ``policy_seeds=False`` (episodes stay seeded).

    Args:
        policy: The wrapped policy (object or reference).
        max_batch_size: Most observations in one call of the wrapped policy.
        max_wait_ms: Longest time a call waits for others (0: only calls made in the same event
            loop iteration are merged).
        seeds: ``"auto"``, ``"group"`` or ``"rows"`` (see above).
        name: Name in tables and logs (default: the wrapped policy's).

    Raises:
        ConfigError: An invalid argument.
    """

    def __init__(
        self,
        policy: Any,
        *,
        max_batch_size: int = 64,
        max_wait_ms: float = 2.0,
        seeds: SeedMode = "auto",
        name: str | None = None,
    ) -> None:
        if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int) or max_batch_size < 1:
            raise ConfigError(f"max_batch_size must be an int >= 1, got {max_batch_size!r}.")
        if not isinstance(max_wait_ms, (int, float)) or not math.isfinite(max_wait_ms) or max_wait_ms < 0:
            raise ConfigError(f"max_wait_ms must be a finite number >= 0, got {max_wait_ms!r}.")
        if seeds not in ("auto", "group", "rows"):
            raise ConfigError(f"seeds must be 'auto', 'group' or 'rows', got {seeds!r}.")
        self.policy = resolve_policy(policy)
        if seeds == "auto":
            seeds = "rows" if getattr(self.policy, "accepts_row_seeds", False) else "group"
        self.seeds: str = seeds
        self.max_batch_size = max_batch_size
        self.max_wait_ms = float(max_wait_ms)
        self.name = name or describe(self.policy)
        self.stats = BatchStats()
        self._groups: dict[asyncio.AbstractEventLoop, dict[Any, _Group]] = {}
        self._running: set[asyncio.Task] = set()
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        # Waiting calls belong to a live event loop; a copy (pickled to a Ray worker) starts empty.
        state = dict(self.__dict__)
        state["_groups"], state["_running"], state["_lock"] = {}, set(), None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return (f"BatchedPolicy({self.policy!r}, max_batch_size={self.max_batch_size}, "
                f"max_wait_ms={self.max_wait_ms}, seeds={self.seeds!r})")

    async def act(self, observations: Sequence[Conversation], **sampling: Any) -> list[Completion]:
        """One completion per observation, computed in a batch shared with concurrent calls.

        Raises:
            PolicyError: The batched call raised or returned a wrong number of completions.
        """
        observations = list(observations)
        if not observations:
            return []
        self.stats.calls += 1
        self.stats.observations += len(observations)
        if "seeds" in sampling:  # the caller batches its own rows: pass it through untouched
            return await self._send(observations, sampling, [])
        seed = sampling.pop("seed", None) if self.seeds == "rows" else sampling.get("seed")
        try:
            key = tuple(sorted((k, _freeze(v)) for k, v in sampling.items()))
        except TypeError:  # keyword values that cannot be ordered: compare their reprs
            key = tuple(sorted((k, repr(v)) for k, v in sampling.items()))
        loop = asyncio.get_running_loop()
        groups = self._groups_of(loop)
        group = groups.get(key)
        if group is None:
            group = groups[key] = _Group(dict(sampling))
        fut = loop.create_future()
        if not group.pending:
            group.first_arrival = loop.time()
        group.pending.append(_Call(observations, seed, fut))
        group.size += len(observations)
        if group.size >= self.max_batch_size:
            self._dispatch(loop, group)
        elif group.timer is None:
            group.timer = loop.call_at(group.first_arrival + self.max_wait_ms / 1000.0,
                                       self._dispatch, loop, group)
        return await fut

    def _groups_of(self, loop: asyncio.AbstractEventLoop) -> dict[Any, _Group]:
        groups = self._groups.get(loop)
        if groups is None:
            with self._lock:
                for old in [lp for lp in self._groups if lp.is_closed()]:
                    del self._groups[old]
                groups = self._groups.setdefault(loop, {})
        return groups

    def _dispatch(self, loop: asyncio.AbstractEventLoop, group: _Group) -> None:
        """Send every full batch now; re-arm the timer for what is left."""
        if group.timer is not None:
            group.timer.cancel()
            group.timer = None
        if any(call.future.done() for call in group.pending):
            # Episodes cancelled while waiting (a stopped run): their requests are not sent.
            group.pending = deque(call for call in group.pending if not call.future.done())
            group.size = sum(len(call.observations) for call in group.pending)
        while group.pending and (group.size >= self.max_batch_size or group.timer is None):
            batch: list[_Call] = []
            n = 0
            while group.pending and (not batch or n + len(group.pending[0].observations) <= self.max_batch_size):
                call = group.pending.popleft()
                batch.append(call)
                n += len(call.observations)
            group.size -= n
            task = loop.create_task(self._run_batch(group.kwargs, batch))
            # The loop keeps only a weak reference to tasks: hold it until the batch is done.
            self._running.add(task)
            task.add_done_callback(self._running.discard)
            # When every episode of the batch was cancelled (a stopped run), so is the batch:
            # its requests in flight or still queued in the backend are abandoned.
            for call in batch:
                call.future.add_done_callback(lambda _f, t=task, b=batch: self._abandon(t, b))
            if group.pending and group.size < self.max_batch_size:
                # The rest arrived later than the batch just sent: give it its own wait.
                group.first_arrival = loop.time()
                group.timer = loop.call_at(group.first_arrival + self.max_wait_ms / 1000.0,
                                           self._dispatch, loop, group)

    @staticmethod
    def _abandon(task: asyncio.Task, batch: list[_Call]) -> None:
        if not task.done() and all(call.future.cancelled() for call in batch):
            task.cancel()

    async def _run_batch(self, kwargs: dict[str, Any], batch: list[_Call]) -> None:
        observations = [o for call in batch for o in call.observations]
        sampling = dict(kwargs)
        if self.seeds == "rows" and any(call.seed is not None for call in batch):
            sampling["seeds"] = [call.seed for call in batch for _ in call.observations]
        try:
            out = await self._send(observations, sampling, batch)
        except Exception as exc:
            for call in batch:
                if not call.future.done():
                    call.future.set_exception(exc)
            return
        except BaseException:  # cancelled (the loop is shutting down): so are its callers
            for call in batch:
                call.future.cancel()
            raise
        i = 0
        for call in batch:
            k = len(call.observations)
            if not call.future.done():  # a cancelled episode no longer waits
                call.future.set_result(out[i:i + k])
            i += k

    async def _send(self, observations: list[Conversation], sampling: dict[str, Any],
                    batch: list[_Call]) -> list[Completion]:
        self.stats.batches += 1
        self.stats.largest_batch = max(self.stats.largest_batch, len(observations))
        try:
            out = await self.policy.act(observations, **sampling)
        except Exception:
            self.stats.failed_batches += 1
            raise
        if not isinstance(out, list) or len(out) != len(observations):
            self.stats.failed_batches += 1
            raise PolicyError(
                f"policy {self.name} returned {len(out) if isinstance(out, list) else type(out).__name__} "
                f"completion(s) for a batch of {len(observations)} observations; act() must return "
                "one Completion per observation, in order."
            )
        return out


def batches_itself(policy: Any) -> bool:
    """Whether wrapping ``policy`` in :class:`BatchedPolicy` would gain nothing (what
    ``batching="auto"`` asks before wrapping).

    A policy says so with a ``batches_concurrent_calls`` attribute (``True``: it merges
    concurrent calls itself, or batching cannot help it). Without one, these count as ``True``:
    a :class:`BatchedPolicy`; policies with their own queue (``max_batch_size`` and
    ``max_wait_ms`` attributes: ``HFPolicy``, ``VLLMPolicy``); vLLM's async engine policy
    (continuous batching); scripted policies (they answer at once, a wait would only add
    latency); API policies such as ``LiteLLMPolicy`` (one request per observation anyway).
    """
    flag = getattr(policy, "batches_concurrent_calls", None)
    if flag is not None:
        return bool(flag)
    if isinstance(policy, BatchedPolicy):
        return True
    if hasattr(policy, "max_batch_size") and hasattr(policy, "max_wait_ms"):
        return True
    from collab_env.agents.scripted import ScriptedPolicy

    if isinstance(policy, ScriptedPolicy):
        return True
    return any(c.__name__ in ("AsyncVLLMPolicy", "LiteLLMPolicy") for c in type(policy).__mro__)


# ---------------------------------------------------------------------------------------------
# Global limits
# ---------------------------------------------------------------------------------------------
class RateLimiter:
    """A token bucket: at most ``burst`` calls at once, refilled at ``rate`` calls per second.

    Each :meth:`acquire` reserves its tokens at once (without awaiting), so waiters are served
    in arrival order and the limiter needs no lock of any event loop: one limiter may serve
    several loops and threads. A waiter that is cancelled keeps its reservation (the limit errs
    on the safe side).

    Args:
        rate: Calls per second (> 0).
        burst: Bucket size: calls allowed at once after an idle spell (default: ``max(1, rate)``
            rounded down).
        clock: Monotonic clock in seconds (injectable for tests).
        sleep: Async sleep (injectable for tests).

    Raises:
        ConfigError: ``rate`` or ``burst`` is not positive.
    """

    def __init__(self, rate: float, burst: int | None = None, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep) -> None:
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not math.isfinite(rate) or rate <= 0:
            raise ConfigError(f"rate must be a finite number > 0 (calls per second), got {rate!r}.")
        burst = max(1, int(rate)) if burst is None else burst
        if isinstance(burst, bool) or not isinstance(burst, int) or burst < 1:
            raise ConfigError(f"burst must be an int >= 1, got {burst!r}.")
        self.rate = float(rate)
        self.burst = burst
        self._clock = clock
        self._sleep = sleep
        self._tokens = float(burst)
        self._last: float | None = None
        self._lock = threading.Lock()
        self.acquired = 0
        self.waited_seconds = 0.0

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_lock"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def reserve(self, n: int = 1) -> float:
        """Take ``n`` tokens now (possibly into debt); return the seconds to wait before use."""
        if n > self.burst:
            raise ConfigError(f"cannot take {n} tokens at once from a bucket of {self.burst}; raise burst.")
        with self._lock:
            now = self._clock()
            if self._last is not None:
                self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.rate)
            self._last = now
            self._tokens -= n
            self.acquired += n
            delay = 0.0 if self._tokens >= 0 else -self._tokens / self.rate
            self.waited_seconds += delay
            return delay

    async def acquire(self, n: int = 1) -> None:
        """Wait until ``n`` calls may start."""
        delay = self.reserve(n)
        if delay > 0:
            await self._sleep(delay)


class _PerLoop:
    """One object per running event loop (asyncio primitives are bound to their loop)."""

    def __init__(self, factory: Callable[[], Any]) -> None:
        self._factory = factory
        self._objs: dict[asyncio.AbstractEventLoop, Any] = {}
        self._lock = threading.Lock()

    def get(self) -> Any:
        loop = asyncio.get_running_loop()
        obj = self._objs.get(loop)
        if obj is None:
            with self._lock:
                for old in [lp for lp in self._objs if lp.is_closed()]:
                    del self._objs[old]
                obj = self._objs.setdefault(loop, self._factory())
        return obj

    def __getstate__(self) -> dict[str, Any]:
        return {"_factory": self._factory}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["_factory"])


class _Limited:
    """A policy behind the engine's global limits; counts the calls that went through."""

    def __init__(self, policy: Policy, limiter: RateLimiter | None, semaphore: _PerLoop | None,
                 stats: RolloutStats) -> None:
        self.policy = policy
        self.name = describe(policy)
        self._limiter = limiter
        self._sem = semaphore  # shared by every policy of the engine: the limit is global
        self._stats = stats

    async def act(self, observations: Sequence[Conversation], **sampling: Any) -> list[Completion]:
        if self._limiter is not None:
            await self._limiter.acquire(len(observations))
        if self._sem is None:
            return await self._counted(observations, sampling)
        async with self._sem.get():
            return await self._counted(observations, sampling)

    async def _counted(self, observations: Sequence[Conversation], sampling: dict[str, Any]) -> list[Completion]:
        st = self._stats
        st.policy_calls += 1
        st.calls_in_flight += 1
        st.max_calls_in_flight = max(st.max_calls_in_flight, st.calls_in_flight)
        try:
            return await self.policy.act(observations, **sampling)
        finally:
            st.calls_in_flight -= 1


# ---------------------------------------------------------------------------------------------
# The engine
# ---------------------------------------------------------------------------------------------
@dataclass
class RolloutConfig:
    """Settings of a :class:`RolloutEngine` (validated on creation; unknown keywords are errors).

    Args:
        concurrency: Most episodes in flight at once.
        batching: Merge concurrent policy calls across episodes: ``"auto"`` wraps every policy
            that does not batch by itself (see :func:`batches_itself`) in a
            :class:`BatchedPolicy`; ``True`` wraps every policy; ``False`` none.
        max_batch_size: :class:`BatchedPolicy` flushes a batch at this many observations.
        max_wait_ms: ... or this long after its first call arrived.
        seeds: How seeds travel in a batch (:class:`BatchedPolicy`): ``"auto"``, ``"group"``,
            ``"rows"``.
        policy_seeds: Pass ``seed=job_seed + step`` to policies (``False``: no seed keyword,
            so a policy without row seeds can batch seeded episodes; resets stay seeded).
        sampling: Player -> sampling keywords for its policy.
        max_calls_per_second: Global rate limit on policy calls (one call = one observation of
            one episode, i.e. one model request), a token bucket; ``None``: no limit.
        burst: Token bucket size (default: ``max(1, max_calls_per_second)``).
        max_concurrent_calls: Most policy calls of all episodes in flight at once (waiting in a
            batch counts); ``None``: no limit.
        episode_timeout_s: An episode running longer fails with ``TimeoutError`` (reported like
            any failure); ``None``: no limit.
        reuse_envs: Reset a finished episode's env for a later job (as vector envs do) instead
            of building a fresh one per job; an env whose episode failed is closed, never
            reused. ``False`` suits envs whose ``reset`` does not clear everything.
        progress: Show a tqdm progress bar on stderr; ``None``: only when stderr is a terminal.
        desc: Label of the progress bar (default: the env id).
        clock: Monotonic clock of the rate limiter (injectable for tests).
        sleep: Async sleep of the rate limiter (injectable for tests).
    """

    concurrency: int = 64
    batching: bool | Literal["auto"] = "auto"
    max_batch_size: int = 64
    max_wait_ms: float = 2.0
    seeds: SeedMode = "auto"
    policy_seeds: bool = True
    sampling: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    max_calls_per_second: float | None = None
    burst: int | None = None
    max_concurrent_calls: int | None = None
    episode_timeout_s: float | None = None
    reuse_envs: bool = True
    progress: bool | None = None
    desc: str | None = None
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep

    def __post_init__(self) -> None:
        def positive_int(name: str, allow_none: bool = False) -> None:
            v = getattr(self, name)
            if v is None and allow_none:
                return
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{name} must be an int >= 1{' or None' if allow_none else ''}, got {v!r}.")

        positive_int("concurrency")
        positive_int("max_batch_size")
        positive_int("max_concurrent_calls", allow_none=True)
        if self.batching not in (True, False, "auto"):
            raise ConfigError(f"batching must be True, False or 'auto', got {self.batching!r}.")
        if self.seeds not in ("auto", "group", "rows"):
            raise ConfigError(f"seeds must be 'auto', 'group' or 'rows', got {self.seeds!r}.")
        if not isinstance(self.max_wait_ms, (int, float)) or not math.isfinite(self.max_wait_ms) \
                or self.max_wait_ms < 0:
            raise ConfigError(f"max_wait_ms must be a finite number >= 0, got {self.max_wait_ms!r}.")
        if self.max_calls_per_second is not None:
            RateLimiter(self.max_calls_per_second, self.burst)  # validates both
        elif self.burst is not None:
            raise ConfigError("burst only applies with max_calls_per_second; set both or neither.")
        if self.episode_timeout_s is not None and not self.episode_timeout_s > 0:
            raise ConfigError(f"episode_timeout_s must be > 0 or None, got {self.episode_timeout_s!r}.")
        if not isinstance(self.sampling, Mapping) or not all(isinstance(v, Mapping) for v in self.sampling.values()):
            raise ConfigError("sampling maps player -> {keyword: value}, e.g. {'assistant': {'temperature': 0.7}}.")
        self.sampling = {p: dict(v) for p, v in self.sampling.items()}

    @classmethod
    def from_kwargs(cls, config: RolloutConfig | None = None, **kwargs: Any) -> RolloutConfig:
        """``config`` with ``kwargs`` applied; an unknown keyword is an error naming the valid ones."""
        from collab_env.errors import did_you_mean

        valid = [f.name for f in fields(cls)]
        for k in kwargs:
            if k not in valid:
                raise ConfigError(f"unknown rollout setting {k!r}; valid: {valid}." + did_you_mean(k, valid))
        if config is None:
            return cls(**kwargs)
        return cls(**{**{f.name: getattr(config, f.name) for f in fields(cls)}, **kwargs})


@dataclass
class RolloutStats:
    """Counters of a :class:`RolloutEngine` (``engine.stats``; cumulative over its runs).

    Args:
        submitted: Episodes started.
        finished: Episodes that ended with an :class:`~collab_env.types.Episode`.
        failed: Episodes that ended with an exception (yielded as ``(job, exception)``, or
            raised when it is a :class:`~collab_env.errors.FatalPolicyError`).
        cancelled: Episodes cancelled because a fatal error stopped the run.
        in_flight: Episodes running now.
        max_in_flight: Most episodes running at once.
        policy_calls: Policy calls made by episodes (before batching).
        calls_in_flight: Policy calls running now.
        max_calls_in_flight: Most policy calls running at once.
        wall_seconds: Time spent inside runs.
        batches: Policy name -> :class:`BatchStats` of its :class:`BatchedPolicy`.
        per_worker: Worker -> episodes it ran (Ray backend only).
    """

    submitted: int = 0
    finished: int = 0
    failed: int = 0
    cancelled: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    policy_calls: int = 0
    calls_in_flight: int = 0
    max_calls_in_flight: int = 0
    wall_seconds: float = 0.0
    batches: dict[str, BatchStats] = field(default_factory=dict)
    per_worker: dict[str, int] = field(default_factory=dict)

    @property
    def episodes_per_second(self) -> float:
        """Finished and failed episodes per second of run time."""
        done = self.finished + self.failed
        return done / self.wall_seconds if self.wall_seconds > 0 else 0.0

    @property
    def mean_batch_size(self) -> float:
        """Observations per batched call, over every batched policy."""
        obs = sum(b.observations for b in self.batches.values())
        n = sum(b.batches for b in self.batches.values())
        return obs / n if n else 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly counters."""
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("batches", "per_worker")}
        d["batches"] = {k: v.to_dict() for k, v in self.batches.items()}
        d["per_worker"] = dict(self.per_worker)
        d["episodes_per_second"] = self.episodes_per_second
        d["mean_batch_size"] = self.mean_batch_size
        return d


def normalize_jobs(jobs: int | Iterable[Any]) -> tuple[Iterator[dict[str, Any]], int | None]:
    """Turn ``jobs`` into an iterator of job dicts (lazily) and its length when known.

    Args:
        jobs: ``n`` (episodes ``{"episode_id": k, "seed": k}`` for ``k < n``), an iterable of
            seeds (``{"seed": s}``), or an iterable of mappings with any of ``"seed"``,
            ``"index"``, ``"options"`` plus whatever the caller wants back with the result.

    Returns:
        ``(iterator of dicts, total or None)``.

    Raises:
        ConfigError: ``jobs`` is negative or not one of the above (raised when the bad item is
            reached).
    """
    if isinstance(jobs, bool):
        raise ConfigError("jobs must be a count, seeds or job mappings, got a bool.")
    if isinstance(jobs, int):
        if jobs < 0:
            raise ConfigError(f"jobs must be >= 0, got {jobs}.")
        return ({"episode_id": k, "seed": k} for k in range(jobs)), jobs
    if isinstance(jobs, (str, bytes)) or not isinstance(jobs, Iterable):
        raise ConfigError(
            f"jobs must be a count, an iterable of seeds or of job mappings, got {type(jobs).__name__}."
        )
    total = len(jobs) if hasattr(jobs, "__len__") else None

    def gen() -> Iterator[dict[str, Any]]:
        for j in jobs:
            if isinstance(j, Mapping):
                job = dict(j)
            elif isinstance(j, int) and not isinstance(j, bool):
                job = {"seed": j}
            elif j is None:
                job = {"seed": None}
            else:
                raise ConfigError(f"a job is a seed (int) or a mapping with 'seed'/'index'/'options', got {j!r}.")
            if "options" in job and job["options"] is not None and not isinstance(job["options"], Mapping):
                raise ConfigError(f"job options must be a mapping, got {job['options']!r}.")
            yield job

    return gen(), total


def env_factory(env: Any, env_kwargs: Mapping[str, Any] | None) -> Callable[[], CollabEnv]:
    """A zero-argument factory of fresh envs from an env id (made with ``env_kwargs``) or a
    factory (returned as it is); an env object is refused, since every episode needs its own."""
    if isinstance(env, str):
        from collab_env.registry import make, spec

        spec(env)  # unknown id: fail now, with the closest ids
        kwargs = dict(env_kwargs or {})
        return lambda: make(env, **kwargs)
    if isinstance(env, CollabEnv):
        raise ConfigError(
            "pass an env id or a factory (e.g. lambda: collab_env.make(...)), not an env object: "
            "every episode in flight needs its own env."
        )
    if callable(env):
        if env_kwargs:
            raise ConfigError("env_kwargs only applies with an env id; bind them in your factory instead.")
        return env
    raise ConfigError(f"env must be a registered env id or a factory returning a CollabEnv, got {env!r}.")


def _players_and_defaults(env: Any, factory: Callable[[], CollabEnv]) -> tuple[list[str], dict[str, Any]]:
    if isinstance(env, str):
        from collab_env.registry import spec

        s = spec(env)
        return list(s.players), dict(s.default_policies)
    probe = factory()
    try:
        if not isinstance(probe, CollabEnv):
            raise ConfigError(f"the env factory must return a CollabEnv, got {type(probe).__name__}.")
        defaults = dict(probe.spec.default_policies) if probe.spec is not None else {}
        return list(probe.possible_agents), defaults
    finally:
        close = getattr(probe, "close", None)
        if close is not None:
            close()


class RolloutEngine:
    """Run many episodes at once; stream ``(job, episode)`` pairs as they finish.

    >>> engine = RolloutEngine("hidden-facts", {"assistant": "ask-then-answer"}, concurrency=32)
    >>> for job, ep in engine.stream(256):          # or: async for ... in engine.astream(256)
    ...     if isinstance(ep, BaseException):
    ...         print("failed", job, ep)
    >>> engine.stats.mean_batch_size

    Args:
        env: A registered env id (built with ``collab_env.make(env, **env_kwargs)``) or a
            factory returning a fresh :class:`~collab_env.env.CollabEnv` (one per episode).
        policies: Player -> policy object or reference. With an env id or a factory whose envs
            have a spec, players left out use the spec's default policies. References are
            resolved once; players naming the same reference share one policy (and its batches).
        config: A :class:`RolloutConfig`; ``**settings`` override its fields.
        env_kwargs: Keywords for ``collab_env.make`` (env ids only).
        **settings: :class:`RolloutConfig` fields (``concurrency=...``, ``max_batch_size=...``).

    Raises:
        ConfigError: Unknown env id, unknown setting, missing policy, invalid value.
    """

    def __init__(self, env: Any, policies: Mapping[str, Any], config: RolloutConfig | None = None, *,
                 env_kwargs: Mapping[str, Any] | None = None, **settings: Any) -> None:
        self.config = RolloutConfig.from_kwargs(config, **settings)
        self.env_id = env if isinstance(env, str) else None
        self.make_env = env_factory(env, env_kwargs)
        players, defaults = _players_and_defaults(env, self.make_env)
        if not isinstance(policies, Mapping):
            raise ConfigError(f"policies maps player -> policy, got {type(policies).__name__}.")
        unknown = [p for p in policies if p not in players]
        if unknown:
            raise ConfigError(f"policies for unknown player(s) {unknown}; players: {players}.")
        chosen = {**defaults, **{p: v for p, v in policies.items() if v is not None}}
        missing = [p for p in players if p not in chosen]
        if missing:
            raise ConfigError(f"no policy for player(s) {missing}; pass policies={{...}} for them "
                              f"(players: {players}).")
        self.stats = RolloutStats()
        limiter = None
        if self.config.max_calls_per_second is not None:
            limiter = RateLimiter(self.config.max_calls_per_second, self.config.burst,
                                  clock=self.config.clock, sleep=self.config.sleep)
        self.rate_limiter = limiter
        max_calls = self.config.max_concurrent_calls
        semaphore = _PerLoop(lambda: asyncio.Semaphore(max_calls)) if max_calls is not None else None
        #: Player -> the policy episodes call (limits and batching applied).
        self.policies: dict[str, Policy] = {}
        #: Player -> the BatchedPolicy wrapping its policy (players without batching are absent).
        self.batched: dict[str, BatchedPolicy] = {}
        by_ref: dict[Any, Policy] = {}
        wrapped: dict[int, Policy] = {}
        for p in players:
            ref = chosen[p]
            key = ref if isinstance(ref, (str, type)) else ("object", id(ref))
            if key not in by_ref:
                by_ref[key] = resolve_policy(ref)
            base = by_ref[key]
            if id(base) not in wrapped:
                pol: Policy = base
                want = self.config.batching
                if want is True or (want == "auto" and not batches_itself(base)):
                    if not isinstance(base, BatchedPolicy):
                        pol = BatchedPolicy(base, max_batch_size=self.config.max_batch_size,
                                            max_wait_ms=self.config.max_wait_ms, seeds=self.config.seeds)
                if isinstance(pol, BatchedPolicy):
                    self.stats.batches[self._unique_name(pol.name)] = pol.stats
                # Always behind _Limited: it also counts the calls and the calls in flight.
                pol = _Limited(pol, limiter, semaphore, self.stats)
                wrapped[id(base)] = pol
            self.policies[p] = wrapped[id(base)]
            inner = self.policies[p].policy  # type: ignore[attr-defined]
            if isinstance(inner, BatchedPolicy):
                self.batched[p] = inner
        self.players = players
        self._free_envs: list[CollabEnv] = []

    def _unique_name(self, name: str) -> str:
        if name not in self.stats.batches:
            return name
        for k in itertools.count(2):
            if f"{name}#{k}" not in self.stats.batches:
                return f"{name}#{k}"
        raise AssertionError("unreachable")

    def __repr__(self) -> str:
        src = self.env_id or getattr(self.make_env, "__name__", "factory")
        return f"RolloutEngine({src!r}, players={self.players}, concurrency={self.config.concurrency})"

    # -- one job -------------------------------------------------------------------------
    async def arun_job(self, job: Mapping[str, Any]) -> Result:
        """Run one job (outside the concurrency bound); return ``(job, episode or exception)``.

        Exceptions of the env or a policy are returned, not raised; cancellation propagates.
        """
        job = dict(job)
        env = None
        ok = False
        try:
            env = self._free_envs.pop() if self._free_envs else self.make_env()
            coro = arun_episode(env, self.policies, seed=job.get("seed"), index=job.get("index"),
                                options=job.get("options"), sampling=self.config.sampling,
                                policy_seeds=self.config.policy_seeds)
            if self.config.episode_timeout_s is not None:
                try:
                    ep = await asyncio.wait_for(coro, self.config.episode_timeout_s)
                except asyncio.TimeoutError as exc:
                    raise TimeoutError(
                        f"episode {job} ran longer than episode_timeout_s={self.config.episode_timeout_s}s."
                    ) from exc
            else:
                ep = await coro
            ok = True
            return job, ep
        except Exception as exc:  # reported to the caller with its job, and counted
            return job, exc
        finally:
            if env is not None:
                if ok and self.config.reuse_envs:
                    self._free_envs.append(env)
                else:
                    env.close()

    def prepare_envs(self, n: int) -> None:
        """Build envs until ``n`` wait for reuse, so a run's first episodes do not pay for env
        construction (benchmarks, latency-sensitive loops). Needs ``reuse_envs=True``."""
        if not self.config.reuse_envs:
            raise ConfigError("prepare_envs() needs reuse_envs=True (envs are built per job otherwise).")
        while len(self._free_envs) < n:
            self._free_envs.append(self.make_env())

    def close(self) -> None:
        """Close the envs kept for reuse (the engine may still run later: it builds new ones)."""
        while self._free_envs:
            self._free_envs.pop().close()

    def __enter__(self) -> RolloutEngine:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- many jobs -----------------------------------------------------------------------
    async def astream(self, jobs: int | Iterable[Any]) -> AsyncIterator[Result]:
        """Run ``jobs`` with at most ``concurrency`` episodes in flight; yield
        ``(job, episode or exception)`` in order of completion.

        Jobs are drawn lazily (an endless generator is fine). Closing the iterator early (or
        cancelling its consumer) cancels the episodes still running.

        Args:
            jobs: See :func:`normalize_jobs`.

        Raises:
            FatalPolicyError: An episode ended with a request its provider rejected (see
                :func:`fatal_error`; a missing or invalid API key...). Every later request would
                fail the same way, so the run stops at once: no job starts after it, the
                episodes in flight are cancelled (counted in ``stats.cancelled``), the other
                results already done are yielded, then this error is raised (once, however many
                episodes hit it).
        """
        it, total = normalize_jobs(jobs)
        st = self.stats
        bar = self._progress_bar(total)
        t0 = time.perf_counter()
        running: set[asyncio.Task] = set()
        exhausted = False
        fatal: list[FatalPolicyError] = []  # the first rejection seen; stops the run

        def watch(task: asyncio.Task) -> None:
            # Seen the moment an episode ends, so a ramp-up in progress stops starting jobs.
            if not fatal and not task.cancelled() and task.exception() is None:
                f = fatal_error(task.result()[1])
                if f is not None:
                    fatal.append(f)

        async def fill() -> None:
            nonlocal exhausted
            while not exhausted and not fatal and len(running) < self.config.concurrency:
                try:
                    job = next(it)
                except StopIteration:
                    exhausted = True
                    return
                task = asyncio.ensure_future(self.arun_job(job))
                task.add_done_callback(watch)
                running.add(task)
                st.submitted += 1
                st.in_flight += 1
                st.max_in_flight = max(st.max_in_flight, st.in_flight)
                # Ramp up one episode at a time: a batch that fills while episodes are still
                # starting goes out at once, instead of queueing behind every other episode's
                # reset. Batches then come back staggered, not all in the same instant.
                await asyncio.sleep(0)

        try:
            await fill()
            while running:
                done_set, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                done = list(done_set)
                for task in done:
                    running.discard(task)
                    st.in_flight -= 1
                await fill()  # start new episodes before handing results out
                if fatal and running:
                    done += await self._cancel_all(running)
                for task in done:
                    job, outcome = task.result()
                    if isinstance(outcome, BaseException):
                        st.failed += 1
                    else:
                        st.finished += 1
                    if bar is not None:
                        bar.update(1)
                        bar.set_postfix(self._postfix(), refresh=False)
                    if fatal_error(outcome) is None:
                        yield job, outcome
                if fatal:
                    raise _stopped(fatal[0], f"{st.submitted} episode(s) started, {st.finished} finished, "
                                             f"{st.failed} failed, {st.cancelled} cancelled; no other job started.")
        finally:
            for task in running:
                task.cancel()
            if running:
                await asyncio.gather(*running, return_exceptions=True)
                st.in_flight -= len(running)
            st.wall_seconds += time.perf_counter() - t0
            if bar is not None:
                bar.close()

    async def _cancel_all(self, running: set[asyncio.Task]) -> list[asyncio.Task]:
        """Cancel the episodes in flight (a fatal error stopped the run); return those that
        had ended anyway, whose results are still handed out."""
        tasks = list(running)
        running.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.stats.in_flight -= len(tasks)
        ended = [t for t in tasks if not t.cancelled()]
        self.stats.cancelled += len(tasks) - len(ended)
        return ended

    def stream(self, jobs: int | Iterable[Any]) -> Iterator[Result]:
        """Synchronous :meth:`astream`: a generator fed by an event loop in a background thread.

        Episodes keep running while the caller handles a result. Works inside a running event
        loop too (notebooks). Breaking out of the loop (or closing the generator) cancels the
        episodes still running.
        """
        return iterate_in_thread(self.astream, jobs)

    async def arun(self, jobs: int | Iterable[Any], *, raise_on_error: bool = False) -> list[Episode | BaseException]:
        """Run every job; return outcomes **in job order**.

        Args:
            jobs: See :func:`normalize_jobs`.
            raise_on_error: Raise the first failure (after every episode ended) instead of
                returning exceptions in the list.

        Raises:
            FatalPolicyError: A provider rejected a request; the run stopped (see :meth:`astream`).
        """
        it, _ = normalize_jobs(jobs)
        numbered = ({**job, "_rollout_order": k} for k, job in enumerate(it))
        out: dict[int, Episode | BaseException] = {}
        async for job, outcome in self.astream(numbered):
            out[job.pop("_rollout_order")] = outcome
        results = [out[k] for k in sorted(out)]
        if raise_on_error:
            for r in results:
                if isinstance(r, BaseException):
                    raise r
        return results

    def run(self, jobs: int | Iterable[Any], *, raise_on_error: bool = False) -> list[Episode | BaseException]:
        """Synchronous :meth:`arun`."""
        from collab_env._async import run_sync

        return run_sync(self.arun(jobs, raise_on_error=raise_on_error))

    # -- progress --------------------------------------------------------------------------
    def _progress_bar(self, total: int | None) -> Any:
        show = self.config.progress
        if show is None:
            show = sys.stderr.isatty()
        if not show:
            return None
        from tqdm.auto import tqdm

        return tqdm(total=total, desc=self.config.desc or f"rollout {self.env_id or ''}".strip(),
                    unit="ep", file=sys.stderr, dynamic_ncols=True)

    def _postfix(self) -> dict[str, Any]:
        st = self.stats
        d: dict[str, Any] = {"running": st.in_flight}
        if st.failed:
            d["failed"] = st.failed
        if st.batches:
            d["batch"] = f"{st.mean_batch_size:.1f}"
        return d


def iterate_in_thread(agen_fn: Callable[[Any], AsyncIterator[Any]], arg: Any) -> Iterator[Any]:
    """Iterate an async generator that runs on its own loop in a background thread."""
    q: queue.Queue = queue.Queue()
    done = object()
    stop = threading.Event()
    state: dict[str, Any] = {}

    async def pump() -> None:
        state["task"] = asyncio.current_task()
        state["loop"] = asyncio.get_running_loop()
        agen = agen_fn(arg)
        try:
            async for item in agen:
                q.put(("item", item))
                if stop.is_set():
                    break
        except BaseException as exc:  # handed to the consumer thread, which raises it
            q.put(("error", exc))
        finally:
            await agen.aclose()
            q.put(("end", done))

    def main() -> None:
        try:
            asyncio.run(pump())
        except BaseException:  # cancelled by close(): the consumer already left
            q.put(("end", done))

    def gen() -> Iterator[Any]:
        # Started on the first next(), so an iterator that is never consumed runs nothing.
        thread = threading.Thread(target=main, name="collab-env-rollout", daemon=True)
        thread.start()
        try:
            while True:
                kind, value = q.get()
                if kind == "item":
                    yield value
                elif kind == "error":
                    raise value
                else:
                    return
        finally:
            stop.set()
            loop, task = state.get("loop"), state.get("task")
            if thread.is_alive() and loop is not None and task is not None:
                try:
                    loop.call_soon_threadsafe(task.cancel)
                except RuntimeError:  # the loop already closed
                    pass
            thread.join()

    return gen()


# ---------------------------------------------------------------------------------------------
# Shortcuts
# ---------------------------------------------------------------------------------------------
def rollout(env: Any, policies: Mapping[str, Any], jobs: int | Iterable[Any], *,
            backend: Literal["local", "ray"] = "local", env_kwargs: Mapping[str, Any] | None = None,
            num_workers: int = 2, **settings: Any) -> Iterator[Result]:
    """Run ``jobs`` and yield ``(job, episode or exception)`` as episodes finish.

    Args:
        env: Env id or factory (see :class:`RolloutEngine`).
        policies: Player -> policy.
        jobs: See :func:`normalize_jobs`.
        backend: ``"local"`` (this process, one event loop) or ``"ray"``
            (:class:`~collab_env.rollout_ray.RayRolloutEngine`, ``num_workers`` actors).
        env_kwargs: Keywords for ``collab_env.make``.
        num_workers: Ray workers (``backend="ray"`` only).
        **settings: :class:`RolloutConfig` fields.

    Raises:
        ConfigError: Unknown backend or setting.
        MissingDependencyError: ``backend="ray"`` without ray installed.
    """
    if backend == "local":
        return RolloutEngine(env, policies, env_kwargs=env_kwargs, **settings).stream(jobs)
    if backend == "ray":
        from collab_env.rollout_ray import RayRolloutEngine

        return RayRolloutEngine(env, policies, env_kwargs=env_kwargs, num_workers=num_workers,
                                **settings).stream(jobs)
    raise ConfigError(f"backend must be 'local' or 'ray', got {backend!r}.")


async def arollout(env: Any, policies: Mapping[str, Any], jobs: int | Iterable[Any], *,
                   env_kwargs: Mapping[str, Any] | None = None, **settings: Any) -> AsyncIterator[Result]:
    """Async :func:`rollout` on the running event loop (local backend).

    Args:
        env: Env id or factory (see :class:`RolloutEngine`).
        policies: Player -> policy.
        jobs: See :func:`normalize_jobs`.
        env_kwargs: Keywords for ``collab_env.make``.
        **settings: :class:`RolloutConfig` fields.
    """
    engine = RolloutEngine(env, policies, env_kwargs=env_kwargs, **settings)
    agen = engine.astream(jobs)
    try:
        async for item in agen:
            yield item
    finally:
        await agen.aclose()


async def arun_episodes(
    make_env: Callable[[], CollabEnv],
    policies: Mapping[str, Any],
    jobs: Iterable[Mapping[str, Any]],
    *,
    concurrency: int = 8,
    sampling: Mapping[str, Mapping[str, Any]] | None = None,
) -> AsyncIterator[tuple[Mapping[str, Any], Episode | BaseException]]:
    """Run many episodes concurrently (one env each); yield ``(job, episode or error)`` as
    each finishes.

    The simple form of :class:`RolloutEngine`: no batching layer, no limits, no progress bar;
    ``policies`` must name every player. A job is ``{"seed": s, "index": i}`` plus anything the
    caller wants back (the same mapping object is yielded).

    Args:
        make_env: Factory of fresh envs.
        policies: Player -> policy for every player.
        jobs: Job mappings.
        concurrency: Most episodes in flight.
        sampling: Player -> sampling keywords.

    Raises:
        ConfigError: ``concurrency`` < 1.
        FatalPolicyError: A provider rejected a request (see :func:`fatal_error`): as in
            :meth:`RolloutEngine.astream`, no job starts after it, the episodes in flight are
            cancelled, the other results already done are yielded, then it is raised once.
    """
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ConfigError(f"concurrency must be >= 1, got {concurrency}.")
    it = iter(jobs)
    running: set[asyncio.Task] = set()
    fatal: list[FatalPolicyError] = []
    started = 0

    def watch(task: asyncio.Task) -> None:
        if not fatal and not task.cancelled() and task.exception() is None:
            f = fatal_error(task.result()[1])
            if f is not None:
                fatal.append(f)

    async def one(job: Mapping[str, Any]):
        env = make_env()
        try:
            ep = await arun_episode(env, policies, seed=job.get("seed"), index=job.get("index"),
                                    options=job.get("options"), sampling=sampling)
            return job, ep
        except Exception as exc:  # reported to the caller, who counts it
            return job, exc
        finally:
            env.close()

    def fill() -> None:
        nonlocal started
        while not fatal and len(running) < concurrency:
            job = next(it, None)
            if job is None:
                return
            task = asyncio.ensure_future(one(job))
            task.add_done_callback(watch)
            running.add(task)
            started += 1

    try:
        fill()
        while running:
            done_set, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            running.difference_update(done_set)
            done = list(done_set)
            fill()
            cancelled = 0
            if fatal and running:
                tasks = list(running)
                running.clear()
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                done += [t for t in tasks if not t.cancelled()]
                cancelled = sum(t.cancelled() for t in tasks)
            for task in done:
                job, outcome = task.result()
                if fatal_error(outcome) is None:
                    yield job, outcome
            if fatal:
                raise _stopped(fatal[0], f"{started} episode(s) started, {cancelled} cancelled in "
                                         "flight; no other job started.")
    finally:
        for t in running:
            t.cancel()
        if running:
            await asyncio.gather(*running, return_exceptions=True)


def picklable_error(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling (to cross a process boundary), else a PolicyError with its
    text (used by the Ray backend)."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return PolicyError(f"{type(exc).__name__}: {exc}")

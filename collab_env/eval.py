"""Evaluation runs: many seeded episodes of one env with fixed policies, results on disk.

>>> from collab_env.eval import evaluate
>>> result = evaluate("hidden-facts", {"assistant": "ask-then-answer"}, num_episodes=50,
...                   out="runs/ask.jsonl")
>>> print(result.summary_table())

Episodes
    Episode ``k`` (its *episode id*) resets the env with ``seed = seed + k``; on suites with a
    finite number of items it also picks item ``k % num_items``, so the same episode ids map to
    the same items in every run and two policy sets evaluated with the same seed are compared on
    the same tasks. Episodes run concurrently (:class:`collab_env.rollout.RolloutEngine`); every
    policy is resolved once per run and shared by all episodes.

Result file (``out``)
    One JSON line per finished episode, appended the moment the episode ends and flushed to disk
    (``fsync``), so a run that is interrupted (Ctrl-C, a killed job) loses no finished episode.
    A line is ``Episode.to_dict()`` plus ``"episode_id"``, ``"status": "ok"`` and ``"run"``: the
    settings that define the run (env id, seed, policy per player, env keyword arguments,
    sampling). Lines are in order of completion, not of episode id.

Failures
    An episode whose policy (or env) raises is *not* scored: it is counted in
    :attr:`EvalResult.failures` and logged to the sidecar file ``<out>.failures.jsonl`` (one
    line with ``"status": "failed"``, the episode id, seed, index, error text and traceback).
    Keeping failures out of the main file means the main file holds exactly one record per
    finished episode id. A failed episode is retried by the next ``resume=True`` run.

    A request that a provider *rejects* (:class:`~collab_env.errors.FatalPolicyError`: a missing
    or invalid API key, another 4xx) is not a per-episode failure: every episode would send one
    doomed request. The run stops at once (no episode starts after it, those in flight are
    cancelled) and raises a ``FatalPolicyError`` with the provider's message, how many episodes
    the file holds, and how to fix the key and continue with ``resume=True`` (``--resume``).

Resume
    ``resume=True`` continues the run in ``out``: episode ids already recorded are kept as they
    are (the file is only appended to) and only the missing or failed ones run. A last line cut
    short by a kill is dropped and its episode redone. A file written with other settings (env
    id, seed, policies, env arguments, sampling) is refused: results of different runs must not
    mix. ``num_episodes`` may grow on resume, to extend a finished run. Without ``resume``, an
    existing non-empty ``out`` is an error, so a run never silently appends to another.
"""

from __future__ import annotations

import asyncio
import errno
import json
import math
import os
import re
import sys
import traceback
import warnings
from collections import Counter
from collections.abc import Iterable, Mapping
from contextlib import aclosing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from collab_env.agents.base import POLICY_ALIASES, Policy, describe, resolve_policy
from collab_env.errors import ConfigError, FatalPolicyError, did_you_mean
from collab_env.registry import EnvSpec, make, spec
from collab_env.rollout import RolloutEngine
from collab_env.types import Episode

__all__ = [
    "evaluate",
    "aevaluate",
    "compare",
    "load_results",
    "EvalResult",
    "EpisodeFailure",
    "PlayerStats",
    "EvalSummary",
    "Comparison",
    "failures_path",
    "prepare_output_file",
    "policy_ref",
    "choose_policies",
    "load_policy",
]

#: Suffix of the sidecar file that logs failed episodes next to the result file.
FAILURES_SUFFIX = ".failures.jsonl"


# ---------------------------------------------------------------------------------------------
# Result types
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class EpisodeFailure:
    """An episode that raised instead of finishing.

    Args:
        episode_id: The episode id ``k``.
        seed: The reset seed (``seed + k``).
        index: The task item index (``None`` for unlimited generated suites).
        error: ``"ExceptionType: message"``.
        traceback: The formatted traceback, for debugging a policy.
    """

    episode_id: int
    seed: int
    index: int | None
    error: str
    traceback: str = ""


@dataclass(frozen=True)
class PlayerStats:
    """Statistics of one trainable player's returns over the finished episodes.

    Args:
        player: The player id.
        mean_return: Mean episode return.
        std_return: Population standard deviation of the returns.
        sem_return: Standard error of the mean (``std / sqrt(n - 1)``; 0 for one episode).
        success_rate: Fraction of episodes with return > 0, reported only when the spec's
            reward range is non-negative (otherwise a positive return does not mean success).
        mean_moves: Mean number of messages the player wrote per episode.
    """

    player: str
    mean_return: float
    std_return: float
    sem_return: float
    success_rate: float | None
    mean_moves: float


@dataclass(frozen=True)
class EvalSummary:
    """Aggregate numbers of an evaluation run.

    Args:
        env_id: The env id.
        policies: Player -> short policy name.
        requested: Episodes requested (``num_episodes``).
        completed: Episodes finished (and recorded).
        failed: Episodes that raised in this run and remain unfinished.
        mean_steps: Mean env steps per finished episode.
        end_reasons: End reason -> number of finished episodes.
        players: Trainable player -> :class:`PlayerStats`.
        costs: Cost counters summed over finished episodes (model calls, tokens...).
    """

    env_id: str
    policies: dict[str, str]
    requested: int
    completed: int
    failed: int
    mean_steps: float
    end_reasons: dict[str, int]
    players: dict[str, PlayerStats]
    costs: dict[str, float]

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly dict (``NaN`` for statistics of an empty run)."""
        return {
            "env_id": self.env_id,
            "policies": dict(self.policies),
            "requested": self.requested,
            "completed": self.completed,
            "failed": self.failed,
            "mean_steps": self.mean_steps,
            "end_reasons": dict(self.end_reasons),
            "players": {p: vars(s).copy() for p, s in self.players.items()},
            "costs": dict(self.costs),
        }


@dataclass
class EvalResult:
    """The outcome of :func:`evaluate`.

    Args:
        env_id: Canonical (versioned) env id.
        seed: Base seed; episode ``k`` used ``seed + k``.
        num_episodes: Episodes requested.
        policies: Player -> policy reference (``"module:Class"``) that ran it.
        policy_names: Player -> short policy name (for tables).
        trainable: Players the summary reports on.
        episodes: Episode id -> finished :class:`Episode`, by id; includes episodes recorded by
            an earlier run of the same file (``resume=True``).
        failures: Episodes that raised in this run (not scored, retried on resume).
        out: The result file, or ``None``.
        reward_range: The spec's bounds of one episode's return.
        label: Name of this policy set in comparison tables.
    """

    env_id: str
    seed: int
    num_episodes: int
    policies: dict[str, str]
    policy_names: dict[str, str]
    trainable: tuple[str, ...]
    episodes: dict[int, Episode] = field(default_factory=dict)
    failures: list[EpisodeFailure] = field(default_factory=list)
    out: Path | None = None
    reward_range: tuple[float, float] = (-math.inf, math.inf)
    label: str = ""

    @property
    def missing(self) -> list[int]:
        """Episode ids in ``range(num_episodes)`` without a finished record."""
        return [k for k in range(self.num_episodes) if k not in self.episodes]

    @property
    def complete(self) -> bool:
        """Every requested episode finished."""
        return not self.missing

    @property
    def summary(self) -> EvalSummary:
        """Aggregate statistics over the finished episodes (see :class:`EvalSummary`)."""
        eps = [self.episodes[k] for k in sorted(self.episodes) if k < self.num_episodes]
        players = {}
        for p in self.trainable:
            rets = [float(e.returns.get(p, 0.0)) for e in eps]
            moves = [sum(1 for t in e.turns if t.player == p) for e in eps]
            mean, std = _mean_std(rets)
            sem = std / math.sqrt(len(rets) - 1) if len(rets) > 1 else 0.0
            # "Return > 0" only means success when returns cannot be negative (e.g. accuracy).
            success = (
                sum(r > 0 for r in rets) / len(rets)
                if rets and self.reward_range[0] >= 0
                else None
            )
            players[p] = PlayerStats(p, mean, std, sem, success, _mean_std(moves)[0])
        costs: Counter[str] = Counter()
        for e in eps:
            costs.update({k: float(v) for k, v in e.costs.items()})
        return EvalSummary(
            env_id=self.env_id,
            policies=dict(self.policy_names),
            requested=self.num_episodes,
            completed=len(eps),
            failed=len(self.failures),
            mean_steps=_mean_std([e.num_steps for e in eps])[0],
            end_reasons=dict(Counter(e.end_reason or "none" for e in eps).most_common()),
            players=players,
            costs=dict(costs),
        )

    def summary_table(self) -> str:
        """The summary as a plain-text table, one row per trainable player."""
        return _format_table({self.label or _policy_label(self.policy_names, self.trainable): self})


@dataclass
class Comparison:
    """Several policy sets evaluated on the same env and seeds (see :func:`compare`).

    Args:
        env_id: The env id.
        results: Label -> :class:`EvalResult`, in the order given.
    """

    env_id: str
    results: dict[str, EvalResult]

    def summary_table(self) -> str:
        """One table with a row per policy set and trainable player."""
        return _format_table(self.results)


# ---------------------------------------------------------------------------------------------
# Public functions
# ---------------------------------------------------------------------------------------------
def evaluate(
    env_id: str,
    policies: Mapping[str, Any] | None = None,
    *,
    num_episodes: int,
    seed: int = 0,
    out: str | os.PathLike[str] | None = None,
    resume: bool = False,
    concurrency: int = 8,
    env_kwargs: Mapping[str, Any] | None = None,
    sampling: Mapping[str, Mapping[str, Any]] | None = None,
    progress: bool = True,
    label: str = "",
) -> EvalResult:
    """Run ``num_episodes`` seeded episodes of ``env_id`` and summarise them.

    Args:
        env_id: Registered env id (unversioned means the latest version; the file records the
            versioned id).
        policies: Player -> policy object, class, alias (:data:`~collab_env.agents.base.POLICY_ALIASES`),
            ``"module:Class"`` or ``"default"`` (the spec's default policy). Players left out use
            the spec's default policy; trainable players have none and must be given.
        num_episodes: Number of episodes (episode ids ``0 .. num_episodes - 1``).
        seed: Episode ``k`` resets with ``seed + k``.
        out: JSONL result file (see the module docstring); ``None`` keeps results in memory.
        resume: Continue the run in ``out``: run only the episode ids it does not hold yet.
        concurrency: Episodes in flight at once.
        env_kwargs: Keyword arguments for :func:`collab_env.make` (e.g. ``data_files``).
        sampling: Player -> sampling keywords passed to its policy.
        progress: Show a progress bar (only when stderr is a terminal).
        label: Name of this run in summary tables (default: the policy names).

    Returns:
        The :class:`EvalResult`; failed episodes are in ``result.failures``, not scored.

    Raises:
        ConfigError: Invalid arguments, a policy that cannot be loaded, an ``out`` file that
            exists without ``resume`` or that belongs to a different run.
        UnknownEnvError: ``env_id`` is not registered.
        FatalPolicyError: A provider rejected a request (a missing or invalid API key...): the
            run stopped; the episodes already in ``out`` are kept, ``resume=True`` continues.
    """
    coro = aevaluate(
        env_id, policies, num_episodes=num_episodes, seed=seed, out=out, resume=resume,
        concurrency=concurrency, env_kwargs=env_kwargs, sampling=sampling, progress=progress,
        label=label,
    )
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        # asyncio.run turns Ctrl-C into a clean cancellation of the episodes in flight.
        return asyncio.run(coro)
    from collab_env._async import run_sync  # inside a running loop (Jupyter): a worker thread

    return run_sync(coro)


async def aevaluate(
    env_id: str,
    policies: Mapping[str, Any] | None = None,
    *,
    num_episodes: int,
    seed: int = 0,
    out: str | os.PathLike[str] | None = None,
    resume: bool = False,
    concurrency: int = 8,
    env_kwargs: Mapping[str, Any] | None = None,
    sampling: Mapping[str, Mapping[str, Any]] | None = None,
    progress: bool = True,
    label: str = "",
) -> EvalResult:
    """Async :func:`evaluate`, for callers that already run an event loop."""
    if isinstance(num_episodes, bool) or not isinstance(num_episodes, int) or num_episodes < 1:
        raise ConfigError(f"num_episodes must be an int >= 1, got {num_episodes!r}.")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(f"seed must be an int, got {seed!r}.")
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ConfigError(f"concurrency must be an int >= 1, got {concurrency!r}.")
    if resume and out is None:
        raise ConfigError("resume=True needs the result file to resume: pass out=<path> (--out).")
    if out is not None:  # before any env, policy or model is built: a bad path fails at once
        prepare_output_file(out)
    s = spec(env_id)
    env_kwargs = dict(env_kwargs or {})
    sampling = {p: dict(kw) for p, kw in (sampling or {}).items()}
    for p in sampling:
        if p not in s.players:
            raise ConfigError(f"sampling for unknown player {p!r}; players: {list(s.players)}."
                              + did_you_mean(str(p), s.players))

    # Build one env up front: a bad keyword or a missing dataset fails here, before any file
    # is touched, and the env says how many items the suite has.
    probe = make(s.id, **env_kwargs)
    try:
        num_items = getattr(probe, "unwrapped", probe).task.num_items()
    finally:
        probe.close()

    refs = choose_policies(s, policies)
    resolved = {p: load_policy(p, ref) for p, ref in refs.items()}
    run = {
        "env_id": s.id,
        "seed": seed,
        "policies": {p: policy_ref(refs[p], resolved[p]) for p in s.players},
        "env_kwargs": _jsonable(env_kwargs),
        "sampling": _jsonable(sampling),
    }
    result = EvalResult(
        env_id=s.id,
        seed=seed,
        num_episodes=num_episodes,
        policies=dict(run["policies"]),
        policy_names={p: describe(resolved[p]) for p in s.players},
        trainable=tuple(s.trainable) or tuple(s.players),
        out=Path(out) if out is not None else None,
        reward_range=tuple(s.reward_range),  # type: ignore[arg-type]
        label=label,
    )

    if result.out is not None:
        fail_path = failures_path(result.out)
        if resume:
            for k, ep in _read_run(result.out, run).items():
                result.episodes[k] = ep
            _repair_tail(fail_path)
        else:
            for path in (result.out, fail_path):
                if path.exists() and path.stat().st_size > 0:
                    raise ConfigError(
                        f"{path} already exists and is not empty. Pass --resume (resume=True) to "
                        "continue that run, or choose another --out path."
                    )
        result.out.parent.mkdir(parents=True, exist_ok=True)

    jobs = [
        {"episode_id": k, "seed": seed + k, "index": (k % num_items) if num_items else None}
        for k in range(num_episodes)
        if k not in result.episodes
    ]
    if jobs:
        await _run_jobs(s, env_kwargs, resolved, sampling, jobs, concurrency, run, result, progress)
    return result


def compare(
    env_id: str,
    policy_sets: Mapping[str, Mapping[str, Any]],
    *,
    num_episodes: int,
    seed: int = 0,
    out_dir: str | os.PathLike[str] | None = None,
    resume: bool = False,
    **kwargs: Any,
) -> Comparison:
    """Evaluate several policy sets on one env with the same seeds (so the same items).

    Args:
        env_id: Registered env id.
        policy_sets: Label -> policies (as for :func:`evaluate`), e.g.
            ``{"ask": {"assistant": "ask-then-answer"}, "guess": {"assistant": "answer-at-once"}}``.
        num_episodes: Episodes per policy set.
        seed: Base seed shared by all sets: episode ``k`` of every set is the same task.
        out_dir: Directory for one ``<label>.jsonl`` result file per set (``None``: in memory).
        resume: Resume each set's file.
        **kwargs: Passed to :func:`evaluate` (``concurrency``, ``env_kwargs``, ``sampling``...).

    Returns:
        A :class:`Comparison`; ``summary_table()`` puts the sets side by side.
    """
    if not policy_sets:
        raise ConfigError("compare() needs at least one policy set: {label: {player: policy}}.")
    results: dict[str, EvalResult] = {}
    for label, pols in policy_sets.items():
        out = None
        if out_dir is not None:
            safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", label).strip("_") or "run"
            out = Path(out_dir) / f"{safe}.jsonl"
        results[label] = evaluate(env_id, pols, num_episodes=num_episodes, seed=seed, out=out,
                                  resume=resume, label=label, **kwargs)
    return Comparison(env_id=next(iter(results.values())).env_id, results=results)


def load_results(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of a result file, in file order (a line cut short by a kill is skipped).

    Each record is a dict: ``Episode.from_dict(record)`` rebuilds the episode; the keys
    ``episode_id``, ``status`` and ``run`` describe where it belongs.
    """
    return [rec for _, rec in _parse_lines(Path(path), strict=True)]


def prepare_output_file(path: str | os.PathLike[str]) -> Path:
    """Make sure results can be appended to ``path`` before any work starts: create its folder
    and open it for appending (an existing file is left as it is; a new one is created empty).

    Raises:
        ConfigError: ``path`` is a folder.
        OSError: The folder cannot be created or the file cannot be written (a read-only or
            pseudo file system such as ``/proc``, a parent that is a file, no permission, a full
            disk); the ``collab-env`` command reports it on one line with the path.
    """
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"--out {path} is a folder; give a file path such as {path / 'results.jsonl'}.")
    existing = next((d for d in path.parents if d.exists()), None)
    if existing is not None and not existing.is_dir():  # mkdir would only say "exists"
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8"):
        pass
    return path


def failures_path(out: str | os.PathLike[str]) -> Path:
    """The sidecar file that logs the failed episodes of result file ``out``."""
    out = Path(out)
    return out.with_name(out.name + FAILURES_SUFFIX)


def choose_policies(
    s: EnvSpec, policies: Mapping[str, Any] | None, players: Iterable[str] | None = None
) -> dict[str, Any]:
    """Player -> policy reference for each of ``players`` (default: every player of ``s``):
    the given ones, ``"default"`` replaced by the spec's default, the spec's defaults for the
    players left out.

    Raises:
        ConfigError: A policy for an unknown player, or a player without any policy.
    """
    given = dict(policies or {})
    for p in given:
        if p not in s.players:
            raise ConfigError(
                f"policy for unknown player {p!r}; players of {s.id}: {list(s.players)}."
                + did_you_mean(str(p), s.players)
            )
    chosen: dict[str, Any] = {}
    for p in s.players if players is None else players:
        ref = given.get(p, "default")
        if isinstance(ref, str) and ref == "default":
            if p not in s.default_policies:
                raise ConfigError(
                    f"player {p!r} of {s.id} has no default policy; give it one, e.g. "
                    f"--policy {p}=SPEC (policies={{{p!r}: ...}}), where SPEC is an alias "
                    f"{sorted(POLICY_ALIASES)} or 'module:Class'."
                )
            ref = s.default_policies[p]
        chosen[p] = ref
    return chosen


def policy_ref(ref: Any, policy: Policy | None = None) -> str:
    """A stable name of a policy for result files: ``"module:Class"``, plus ``[name]`` when the
    object names itself apart from its class (e.g. a fixed-text policy's text), so two
    differently configured objects of one class do not pass for the same policy."""
    if isinstance(ref, str):
        base = POLICY_ALIASES.get(ref, ref)
    else:
        cls = ref if isinstance(ref, type) else type(ref)
        base = f"{cls.__module__}:{cls.__qualname__}"
    obj = policy if policy is not None else ref
    name = getattr(obj, "name", None)
    if isinstance(name, str) and name and name != getattr(type(obj), "name", None):
        return f"{base}[{name}]"
    return base


# ---------------------------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------------------------
async def _run_jobs(
    s: EnvSpec,
    env_kwargs: dict[str, Any],
    policies: dict[str, Policy],
    sampling: dict[str, dict[str, Any]],
    jobs: list[dict[str, Any]],
    concurrency: int,
    run: dict[str, Any],
    result: EvalResult,
    progress: bool,
) -> None:
    from tqdm.auto import tqdm

    bar = tqdm(
        total=result.num_episodes,
        initial=result.num_episodes - len(jobs),
        desc=f"eval {s.id}",
        unit="ep",
        file=sys.stderr,
        disable=not progress or not sys.stderr.isatty(),
        dynamic_ncols=True,
    )
    sink = _Sink(result.out)
    try:
        # The rollout engine (its driver plays each episode); a fresh env per episode, as a
        # result file is replayed episode by episode; policy calls batched across episodes.
        engine = RolloutEngine(lambda: make(s.id, **env_kwargs), policies, concurrency=concurrency,
                               sampling=sampling, reuse_envs=False, progress=False)
        stream = engine.astream(jobs)
        # aclosing: on Ctrl-C the episodes still in flight are cancelled at once.
        async with aclosing(stream) as finished:
            async for job, outcome in finished:
                _record(job, outcome, run, result, sink)
                bar.update(1)
                if result.failures:
                    bar.set_postfix(failed=len(result.failures))
    except FatalPolicyError as exc:
        raise _stopped_run(exc, s, result) from exc
    finally:
        bar.close()
        sink.close()
    result.episodes = dict(sorted(result.episodes.items()))


def _stopped_run(exc: FatalPolicyError, s: EnvSpec, result: EvalResult) -> FatalPolicyError:
    """The error that ends an evaluation stopped by a rejected request: the provider's message,
    what was kept, and how to fix the key and continue."""
    done = len(result.episodes)
    if result.out is not None:
        kept = (f"The {done} finished episode(s) of {result.num_episodes} are kept in {result.out}; after "
                f"fixing it, run the same command again with --resume (resume=True) to run the other "
                f"{result.num_episodes - done}.")
    else:
        kept = "No result file was given (out=None), so nothing was kept; pass --out to keep finished episodes."
    return FatalPolicyError(
        f"evaluation of {s.id} stopped: a policy's provider rejected a request, and every other episode "
        f"would be rejected the same way. {exc} Fix the credentials: set the provider's API key "
        "variable (e.g. OPENAI_API_KEY, ANTHROPIC_API_KEY) in the environment, or pass api_key= (and "
        f"api_base= for a local server) to the policy, or check the model name. {kept}"
    )


class _Sink:
    """Appends records to the result file and failures to the sidecar, each line made durable
    (flush + fsync) before the next episode is counted. The sidecar is only created when an
    episode fails, so a clean run leaves one file."""

    def __init__(self, out: Path | None) -> None:
        self.paths = {"ok": out, "failed": failures_path(out) if out is not None else None}
        self.files: dict[str, Any] = {}

    def write(self, kind: str, record: Mapping[str, Any]) -> None:
        path = self.paths[kind]
        if path is None:
            return
        if kind not in self.files:
            self.files[kind] = open(path, "a", encoding="utf-8", newline="\n")
        f = self.files[kind]
        # ASCII-escaped like Episode.to_json, so any text (even lone surrogates) round-trips.
        f.write(json.dumps(record, ensure_ascii=True) + "\n")
        f.flush()
        os.fsync(f.fileno())

    def close(self) -> None:
        for f in self.files.values():
            f.close()


def _record(job: Mapping[str, Any], outcome: Episode | BaseException, run: Mapping[str, Any],
            result: EvalResult, sink: _Sink) -> None:
    """Keep one finished (or failed) episode and write it to its file."""
    k = job["episode_id"]
    if isinstance(outcome, Episode):
        result.episodes[k] = outcome
        sink.write("ok", {"episode_id": k, "status": "ok", **outcome.to_dict(), "run": run})
        return
    failure = EpisodeFailure(
        episode_id=k, seed=job["seed"], index=job["index"],
        error=f"{type(outcome).__name__}: {outcome}",
        traceback="".join(traceback.format_exception(outcome)),
    )
    result.failures.append(failure)
    sink.write("failed", {"episode_id": k, "status": "failed", "seed": failure.seed,
                          "index": failure.index, "error": failure.error,
                          "traceback": failure.traceback, "run": run})


def load_policy(player: str, ref: Any) -> Policy:
    """:func:`~collab_env.agents.base.resolve_policy` for ``player``, with a policy that
    cannot be imported reported as a :class:`ConfigError` naming the player and the aliases."""
    try:
        return resolve_policy(ref)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(
            f"cannot load the policy {ref!r} for player {player!r}: {exc}. Use an alias "
            f"{sorted(POLICY_ALIASES)} or an importable 'module:Class'."
        ) from exc


# ---------------------------------------------------------------------------------------------
# Reading result files
# ---------------------------------------------------------------------------------------------
def _repair_tail(path: Path) -> bool:
    """Drop a last line cut short by a kill (no newline at the end of the file), so appended
    records start on a line of their own. Earlier lines are left byte for byte."""
    if not path.exists():
        return False
    size = path.stat().st_size
    if size == 0:
        return False
    with open(path, "rb+") as f:
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return False
        # Find the last newline; reading the tail in chunks keeps this cheap on big files.
        pos = size
        keep = 0
        while pos > 0:
            start = max(0, pos - 65536)
            f.seek(start)
            chunk = f.read(pos - start)
            i = chunk.rfind(b"\n")
            if i >= 0:
                keep = start + i + 1
                break
            pos = start
        f.truncate(keep)
        f.flush()
        os.fsync(f.fileno())
    warnings.warn(
        f"{path}: dropped an incomplete last line ({size - keep} bytes, cut short by an "
        "interruption); its episode runs again.",
        stacklevel=4,
    )
    return True


def _parse_lines(path: Path, *, strict: bool) -> list[tuple[int, dict[str, Any]]]:
    """``(line number, record)`` of every complete line; an unreadable complete line is an
    error when ``strict`` (it cannot come from an interruption)."""
    if not path.exists():
        return []
    out = []
    with open(path, "rb") as f:
        data = f.read()
    # The last piece is b"" unless the last line was cut short by a kill: never a record.
    complete = data.split(b"\n")[:-1]
    for i, raw in enumerate(complete, 1):
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw)
            if not isinstance(rec, dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:
            if strict:
                raise ConfigError(
                    f"{path}, line {i} is not a result record ({exc}); the file is damaged or "
                    "is not a collab-env result file. Use another --out path."
                ) from exc
            continue
        out.append((i, rec))
    return out


def _read_run(path: Path, run: Mapping[str, Any]) -> dict[int, Episode]:
    """The finished episodes recorded in ``path`` for this run; refuse a different run's file."""
    _repair_tail(path)
    episodes: dict[int, Episode] = {}
    for line, rec in _parse_lines(path, strict=True):
        _check_same_run(path, line, rec.get("run"), run)
        if rec.get("status") != "ok":
            continue
        k = rec.get("episode_id")
        if isinstance(k, int) and k not in episodes:
            episodes[k] = Episode.from_dict(rec)
    return episodes


def _check_same_run(path: Path, line: int, found: Any, run: Mapping[str, Any]) -> None:
    if not isinstance(found, Mapping):
        raise ConfigError(
            f"{path}, line {line} has no run settings; it was not written by collab_env.eval. "
            "Use another --out path."
        )
    diffs = [
        f"{key}: file has {found.get(key)!r}, this run has {run[key]!r}"
        for key in run
        if found.get(key) != run[key]
    ]
    if diffs:
        raise ConfigError(
            f"cannot resume {path}: it was written by a different run ("
            + "; ".join(diffs)
            + "). Resume with the same settings, or write to another --out path."
        )


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------
def _jsonable(x: Any) -> Any:
    """``x`` as it reads back from JSON, so settings compare equal to a file's."""
    return json.loads(json.dumps(x, sort_keys=True, default=repr))


def _mean_std(xs: list[float] | list[int]) -> tuple[float, float]:
    if not xs:
        return math.nan, math.nan
    mean = sum(xs) / len(xs)
    return mean, math.sqrt(sum((x - mean) ** 2 for x in xs) / len(xs))


def _policy_label(names: Mapping[str, str], players: tuple[str, ...]) -> str:
    """The trained players' policy names: the part that differs between compared runs."""
    if len(players) == 1:
        return names.get(players[0], "?")
    return ", ".join(f"{p}={names.get(p, '?')}" for p in players)


def _fmt(x: float | None, spec: str = ".3f") -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and math.isnan(x):
        return "nan"
    return format(x, spec)


def _format_table(results: Mapping[str, EvalResult]) -> str:
    """Rows: one per (policy set, trainable player). Plain text, aligned columns."""
    header = ["policies", "player", "episodes", "return", "std", "sem", "success", "steps",
              "moves", "failed", "end reasons"]
    rows = []
    env_ids = []
    for label, res in results.items():
        summ = res.summary
        env_ids.append(summ.env_id)
        reasons = ", ".join(f"{r}:{n}" for r, n in summ.end_reasons.items()) or "-"
        for p, st in summ.players.items():
            rows.append([
                label, p, f"{summ.completed}/{summ.requested}", _fmt(st.mean_return),
                _fmt(st.std_return), _fmt(st.sem_return),
                _fmt(st.success_rate, ".1%") if st.success_rate is not None else "-",
                _fmt(summ.mean_steps, ".2f"), _fmt(st.mean_moves, ".2f"), str(summ.failed),
                reasons,
            ])
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    # Text columns left-aligned, numbers right-aligned: easier to scan down a column.
    left = {0, 1, len(header) - 1}

    def fmt_row(r: list[str]) -> str:
        cells = [c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))]
        return "  ".join(cells).rstrip()

    title = "env: " + ", ".join(dict.fromkeys(env_ids))
    lines = [title, fmt_row(header), "  ".join("-" * w for w in widths)]
    lines += [fmt_row(r) for r in rows]
    return "\n".join(lines)

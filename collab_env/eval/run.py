"""Running an evaluation: :func:`evaluate`, :func:`aevaluate`, :func:`compare`, and choosing the policies of a run."""

from __future__ import annotations

import asyncio
import math
import os
import re
import traceback
import warnings
from collections.abc import Iterable, Mapping
from contextlib import aclosing
from pathlib import Path
from typing import Any

from collab_env._progress import say
from collab_env.compose import make, reward_options_note
from collab_env.errors import ConfigError, CredentialsError, FatalPolicyError, ZeroRewardWarning, did_you_mean
from collab_env.eval.files import (
    ResultSink,
    failures_path,
    prepare_output_file,
    read_run,
    repair_tail,
)
from collab_env.eval.results import Comparison, EpisodeFailure, EvalResult, jsonable
from collab_env.policy import (
    POLICY_ALIASES,
    SPEC_HELP,
    Policy,
    PolicySpec,
    describe,
    policies_for,
    resolve_policy,
)
from collab_env.registry import EnvSpec, spec
from collab_env.rollout import RolloutEngine
from collab_env.types import Episode

__all__ = ["evaluate", "aevaluate", "compare", "choose_policies", "policy_ref", "load_policy", "reward_range_of"]


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
    judge_check: bool = True,
) -> EvalResult:
    """Run ``num_episodes`` seeded episodes of ``env_id`` and summarise them.

    Args:
        env_id: Registered env id (unversioned means the latest version; the file records the
            versioned id).
        policies: Player -> policy object, class, alias (:data:`~collab_env.policy.POLICY_ALIASES`),
            ``"module:Class"`` or ``"default"`` (the spec's default policy). Players left out use
            the spec's default policy; trainable players have none and must be given.
        num_episodes: Number of episodes (episode ids ``0 .. num_episodes - 1``).
        seed: Episode ``k`` resets with ``seed + k``.
        out: JSONL result file (see the module docstring); ``None`` keeps results in memory.
        resume: Continue the run in ``out``: run only the episode ids it does not hold yet.
        concurrency: Episodes in flight at once.
        env_kwargs: Keyword arguments for :func:`collab_env.make` (e.g. ``data_files``; a
            reward option: ``{"reward": "mr", "reward_kwargs": {"judge": SPEC}}``, the judge
            resolved once for the run, and under ``"mr"`` a user simulator given in
            ``policies`` plays the futures' user turns too). Without a reward option, an env
            whose own reward is 0 by construction gets a note (``result.notes``) naming the
            options that score it.
        sampling: Player -> sampling keywords passed to its policy.
        progress: Show the run's progress on stderr: a bar on a terminal, else a line per tenth
            of the run and at least one a minute (:mod:`collab_env._progress`), labelled ``eval ENV
            LABEL``; a resumed run's first line says how many episodes it kept, and the last line
            where the episode records are. ``False``: silent.
        label: Name of this run in summary tables and progress lines (default: the policy names).
        judge_check: With a reward that an LLM judges (``env_kwargs`` ``reward`` with judged
            metrics: ``accuracy``, ``interactivity``...), check the judge first
            (:func:`~collab_env.eval.judge_check.run_judge_check`: once per judge identity, the
            verdict kept in the user cache); a judge below the bar has its judged columns refused
            in the table and marked invalid in the file (``"judge_check"`` on every line).
            ``False`` (``--no-judge-check``) skips the check, for people who know their judge;
            the file then marks the judged values ``"unchecked"``.

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
        label=label, judge_check=judge_check,
    )
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        from collab_env._async import run_main

        # asyncio.run turns Ctrl-C into a clean cancellation of the episodes in flight.
        return run_main(coro)
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
    judge_check: bool = True,
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
        prepare_output_file(out, resume=resume)
    s = spec(env_id)
    env_kwargs = dict(env_kwargs or {})
    sampling = {p: dict(kw) for p, kw in (sampling or {}).items()}
    for p in sampling:
        if p not in s.players:
            raise ConfigError(f"sampling for unknown player {p!r}; players: {list(s.players)}."
                              + did_you_mean(str(p), s.players))

    # Build one env up front: a bad keyword or a missing dataset fails here, before any file
    # is touched or any model loaded, and the env says how many items the suite has. (Its
    # ZeroRewardWarning, said once per env id, becomes a note of the result instead; no thread
    # runs yet that could add a filter while this one is in place.)
    base_kwargs = {k: v for k, v in env_kwargs.items() if k not in ("reward", "reward_kwargs")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ZeroRewardWarning)
        probe = make(s.id, **base_kwargs)
    try:
        task = getattr(probe, "unwrapped", probe).task
        num_items = task.num_items()
        user_players = tuple(task.user_players)
    finally:
        probe.close()

    refs = choose_policies(s, policies)
    resolved = {p: load_policy(p, ref) for p, ref in refs.items()}
    build_kwargs = _reward_build_kwargs(env_kwargs, resolved, policies, user_players)
    checked = None
    if "reward" in env_kwargs:  # the reward's judge and user settings fail here, before any episode
        from collab_env.eval.judge_check import run_judge_check

        rewarded = make(s.id, **build_kwargs)
        try:  # and its judge is checked once, before any judged number is written
            checked = run_judge_check(rewarded, skip=not judge_check, progress=progress)
        finally:
            rewarded.close()
    run = {
        "env_id": s.id,
        "seed": seed,
        "policies": {p: policy_ref(refs[p], resolved[p]) for p in s.players},
        "env_kwargs": jsonable(_recorded(env_kwargs)),
        "sampling": jsonable(sampling),
    }
    result = EvalResult(
        env_id=s.id,
        seed=seed,
        num_episodes=num_episodes,
        policies=dict(run["policies"]),
        policy_names={p: describe(resolved[p]) for p in s.players},
        trainable=tuple(s.trainable) or tuple(s.players),
        out=Path(out) if out is not None else None,
        reward_range=reward_range_of(s, env_kwargs.get("reward")),
        label=label,
        judge_check=checked,
    )
    note = reward_options_note(s.id) if env_kwargs.get("reward") is None else None
    if note is not None:
        result.notes.append(note)

    if result.out is not None:
        fail_path = failures_path(result.out)
        if resume:
            for k, ep in read_run(result.out, run).items():
                result.episodes[k] = ep
            repair_tail(fail_path)
            if progress:
                say(f"{_run_label(s, result)}: resumed: kept {len(result.episodes)} of {num_episodes} episodes "
                     f"from {result.out}")
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
        await _run_jobs(s, build_kwargs, resolved, sampling, jobs, concurrency, run, result, progress)
    if progress:
        failed = f", {len(result.failures)} failed" if result.failures else ""
        where = (f"episode records in {result.out}" if result.out is not None
                 else "results in memory only (no out= / --out file)")
        say(f"{_run_label(s, result)}: finished, {len(result.episodes)}/{num_episodes} episodes{failed}; {where}")
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




def _recorded(value: Any) -> Any:
    """``value`` (env keywords) with each :class:`~collab_env.policy.PolicySpec` as its string,
    as the result file records it."""
    if isinstance(value, PolicySpec):
        return str(value)
    if isinstance(value, Mapping):
        return {k: _recorded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_recorded(v) for v in value]
    return value


def _reward_build_kwargs(env_kwargs: Mapping[str, Any], resolved: Mapping[str, Policy],
                         given: Mapping[str, Any] | None, user_players: tuple[str, ...]) -> dict[str, Any]:
    """The env keywords each episode's env is built with: with ``reward="mr"`` or
    ``"conversation"``, the judge spec resolved once for the whole run (not one model per
    episode), and under ``"mr"`` the user simulator the caller named for a user player also
    playing that player's futures (the run names it explicitly; the env's own user may replay
    recorded turns)."""
    out = dict(env_kwargs)
    if out.get("reward") not in ("mr", "conversation"):
        return out
    rk = dict(out.get("reward_kwargs") or {})
    judge = rk.get("judge")
    if isinstance(judge, (str, PolicySpec)):
        rk["judge"] = load_policy("judge", judge)
    if out["reward"] == "mr" and "user" not in rk:
        named = dict(rk.get("policies") or {})
        for u in user_players:
            ref = (given or {}).get(u)
            if u not in named and ref is not None and not (isinstance(ref, str) and ref == "default"):
                named[u] = resolved[u]
        if named:
            rk["policies"] = named
    out["reward_kwargs"] = rk
    return out


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
    merged = policies_for(s, {p: ref for p, ref in given.items() if not (isinstance(ref, str) and ref == "default")})
    chosen: dict[str, Any] = {}
    for p in s.players if players is None else players:
        if merged.get(p) is None:
            raise ConfigError(
                f"player {p!r} of {s.id} has no default policy; give it one, e.g. "
                f"--policy {p}=SPEC (policies={{{p!r}: ...}}), where {SPEC_HELP}."
            )
        chosen[p] = merged[p]
    return chosen


def policy_ref(ref: Any, policy: Policy | None = None) -> str:
    """A stable name of a policy for result files: ``"module:Class"``, plus ``[name]`` when the
    object names itself apart from its class (e.g. a fixed-text policy's text), so two
    differently configured objects of one class do not pass for the same policy."""
    if isinstance(ref, str):
        base = POLICY_ALIASES.get(ref, ref)
    elif isinstance(ref, PolicySpec):
        base = str(ref)
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
    env_kwargs: Mapping[str, Any],
    policies: dict[str, Policy],
    sampling: Mapping[str, Mapping[str, Any]],
    jobs: list[dict[str, Any]],
    concurrency: int,
    run: dict[str, Any],
    result: EvalResult,
    progress: bool,
) -> None:
    from collab_env._progress import progress_bar

    # A bar on a terminal, a line every tenth of the run when stderr is redirected.
    bar = progress_bar(result.num_episodes, _run_label(s, result), show=None if progress else False, lines=True,
                       initial=result.num_episodes - len(jobs))
    sink = ResultSink(result.out)
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
                if bar is not None:
                    if result.failures:
                        bar.set_postfix(failed=len(result.failures))
                    bar.update(1)
    except FatalPolicyError as exc:
        raise _stopped_run(exc, s, result) from exc
    finally:
        if bar is not None:
            bar.close()
        sink.close()
    result.episodes = dict(sorted(result.episodes.items()))


def _run_label(s: EnvSpec, result: EvalResult) -> str:
    """What a progress line says runs: ``eval ENV ROW`` (the row's label, else the trained
    players' policies: ``assistant=embedded``)."""
    row = result.label or ", ".join(f"{p}={result.policy_names[p]}" for p in result.trainable)
    return f"eval {s.id} {row}".rstrip()


def _stopped_run(exc: FatalPolicyError, s: EnvSpec, result: EvalResult) -> FatalPolicyError:
    """The error that ends an evaluation stopped by a rejected request: the provider's message,
    what was kept, and how to fix the key and continue."""
    done = len(result.episodes)
    if result.out is not None:
        kept = (f"The {done} finished episode(s) of {result.num_episodes} are kept in {result.out}; after "
                f"fixing it, continue the run to play the other {result.num_episodes - done} (collab-env eval: the "
                "same command with --resume; evaluate(): resume=True; collab-env leaderboard run: the same "
                "command, which resumes by itself).")
    else:
        kept = "No result file was given (out=None), so nothing was kept; pass --out to keep finished episodes."
    if isinstance(exc, CredentialsError):  # the policy's own message says how to give the key
        return CredentialsError(f"evaluation of {s.id} stopped: a policy's provider refused the credentials, and "
                                f"every other episode would be refused the same way. {exc} {kept}")
    return FatalPolicyError(
        f"evaluation of {s.id} stopped: a policy's provider rejected a request, and every other episode "
        f"would be rejected the same way. {exc} Fix what it names (the model name, the api_base, a parameter) "
        f"and run again. {kept}"
    )


def _record(job: Mapping[str, Any], outcome: Episode | BaseException, run: Mapping[str, Any],
            result: EvalResult, sink: ResultSink) -> None:
    """Keep one finished (or failed) episode and write it to its file."""
    k = job["episode_id"]
    if isinstance(outcome, Episode):
        result.episodes[k] = outcome
        # the judge's verdict beside the raw judged values: "invalid" ones are kept, never reported
        check = {} if result.judge_check is None else {"judge_check": result.judge_check.to_dict()}
        sink.write("ok", {"episode_id": k, "status": "ok", **outcome.to_dict(), "run": run, **check})
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
    """:func:`~collab_env.policy.resolve_policy` for ``player``, with a policy that
    cannot be imported reported as a :class:`ConfigError` naming the player and the aliases."""
    shown = str(ref) if isinstance(ref, PolicySpec) else repr(ref)
    try:
        return resolve_policy(ref)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(
            f"cannot load the policy {shown} for {player!r}: {exc}. Use an alias "
            f"{sorted(POLICY_ALIASES)}, another spec ({SPEC_HELP}) or an importable 'module:Class'."
        ) from exc
    except ConfigError as exc:
        raise ConfigError(f"the policy {shown} for {player!r}: {exc}") from None


def reward_range_of(s: EnvSpec, reward: Any) -> tuple[float, float]:
    """The bounds of one episode's return of env spec ``s`` under the reward option ``reward``
    (``make(..., reward=...)``; ``None``: the env's own reward, ``s.reward_range``): the env card's
    range for that option, or ``(-inf, inf)`` when the card gives none (then no success rate is
    reported: a positive return need not mean success)."""
    if reward is None:
        return (float(s.reward_range[0]), float(s.reward_range[1]))
    card = getattr(s, "card", None)
    if card is not None and isinstance(reward, str) and reward in card.reward_range:
        lo, hi = card.reward_range[reward]
        return (float(lo), float(hi))
    return (-math.inf, math.inf)

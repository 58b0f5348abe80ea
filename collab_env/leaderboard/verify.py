"""Verifying a submission: ``collab-env leaderboard verify SUBMISSION``.

:func:`verify_submission` trusts nothing in the folder. It

1. checks the submission against the registered track: the id must name a registered track
   version, and the recorded hash and content must be that version's (a submission played on a
   changed track, or claiming another version, is rejected);
2. checks the file hashes recorded in ``submission.json`` (trajectories, call cache) and the
   episode set: every episode id at most once, with seed ``seed + k`` and item ``k % tasks``;
3. **re-plays every episode offline** with the one driver
   (:func:`collab_env.rollout.arun_episode`): the submitted players' moves are the recorded
   texts, the track's own players and judge are rebuilt from the *track* (not from the
   submission) with their recorded calls replayed from ``calls.sqlite`` (no model is loaded or
   called; a prompt that differs from the recorded one misses the cache), and the env scores
   the episode again;
4. compares the re-played episode with the recorded one: every move's text, every reward and
   reward component, the returns and the end reason; then the submission's aggregate numbers.

5. on a track with an LLM user or judge, **regenerates** episodes with the track's *own* pinned
   models, every call compared: the recorded calls are the submitter's file, and a reply the
   track's simulator never wrote, edited into both the cache and the trajectory, would
   otherwise replay cleanly. The episodes are drawn at random by the verifier (not the
   submitter), enough of them that one forged reply in any one episode is caught with
   probability at least :data:`CATCH_PROBABILITY` (:func:`regeneration_count`: ``m`` of ``N``
   episodes catch it with probability ``m / N``); ``full=True`` (what ``sign`` uses)
   regenerates all of them. API tracks are replayed only (an API model's replies cannot be
   reproduced bit for bit); the report says so.

What a digest proves and what only the replay proves
    The SHA-256 of every file in ``submission.json`` (``"files"``; only the known files may be
    in the folder, no links, none over :data:`~collab_env.leaderboard.submission.MAX_FILE_BYTES`)
    proves only that the files are the ones the submission.json names: anyone who edits a file
    can rewrite its digest. That the numbers follow from the moves is proved by the replay (every
    move, reward, message of the shown conversation, per-call usage and cost re-derived, named by
    episode and field); that the track's players said what they are recorded saying, by the
    regeneration, for the episodes it draws. A submitted policy's own usage is self-reported,
    except that token counts must equal the recorded token ids.

It returns a :class:`Verification` listing every problem with the episode it concerns and why;
``ok`` is true only when there is none. The CLI prints them and exits 1.
"""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from collab_env.errors import CacheMissError, CollabEnvError, ConfigError, UnknownEnvError
from collab_env.leaderboard.submission import (
    CACHE_FILE,
    MAX_FILE_BYTES,
    SUBMISSION_FILE,
    SUBMISSION_FILES,
    TRAJECTORIES_FILE,
    episode_faults,
    file_sha256,
    fixed_players,
    load_submission,
    submitted_usage,
    track_env_kwargs,
)
from collab_env.leaderboard.tracks import (
    MIN_STANDARD_TRIALS,
    Track,
    find_tracks_dir,
    get_track,
    known_tracks,
    resolve_track,
)

__all__ = ["Verification", "verify_submission", "RecordedMoves", "CATCH_PROBABILITY", "regeneration_count"]


@dataclass
class Verification:
    """The outcome of :func:`verify_submission`.

    Args:
        submission: The submission folder.
        track: The track id it claims.
        episodes: Episodes re-played.
        problems: One line per problem found, naming the episode and why.
    """

    submission: Path
    track: str
    episodes: int = 0
    problems: list[str] = field(default_factory=list)
    regenerated: list[int] = field(default_factory=list)
    regeneration: str = ""
    needs_regeneration: bool = False

    @property
    def ok(self) -> bool:
        """No problem was found."""
        return not self.problems

    def report(self) -> str:
        """Human-readable verdict."""
        if self.ok:
            return (f"{self.submission}: verified ({self.episodes} episodes of {self.track} re-played, every score "
                    f"matches{'; ' + self.regeneration if self.regeneration else ''}).")
        lines = [f"{self.submission}: REJECTED, {len(self.problems)} problem(s):"]
        lines += [f"  - {p}" for p in self.problems[:50]]
        if len(self.problems) > 50:
            lines.append(f"  ... and {len(self.problems) - 50} more")
        return "\n".join(lines)


class RecordedMoves:
    """A policy that plays one player's recorded moves of one episode, in order.

    It is how verification re-plays a submitted policy without running it. Each move is the
    recorded completion (text, token ids, usage), so the re-played episode's costs are rebuilt
    from the same per-call usage the trajectory records. Asked for more moves than were recorded
    (the episode went differently), it raises a :class:`ConfigError`.
    """

    def __init__(self, player: str, moves: Sequence[Any]) -> None:
        self.player = player
        self.moves = list(moves)
        self.name = f"recorded({player})"

    async def act(self, observations: Sequence[Any], **sampling: Any) -> list[Any]:
        from collab_env.types import Completion

        out = []
        for _ in observations:
            if not self.moves:
                raise ConfigError(f"{self.player} is on turn once more than the trajectory records")
            m = self.moves.pop(0)
            if isinstance(m, str):
                out.append(Completion(text=m))
                continue
            comp = m.get("completion")
            try:
                out.append(Completion.from_dict({**comp, "text": m.get("text", "")}) if isinstance(comp, Mapping)
                           else Completion(text=str(m.get("text", ""))))
            except (TypeError, ValueError, CollabEnvError) as exc:
                raise ConfigError(f"{self.player}'s recorded completion at step {m.get('step')} is malformed: "
                                  f"{exc}") from exc
        return out


def _same(a: Any, b: Any) -> bool:
    """Exact equality of re-played and recorded values (the same code on the same inputs gives
    the same floats; JSON keeps a float's shortest repr, so it reads back bit for bit)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


_USAGE_KEYS = ("model_calls", "prompt_tokens", "completion_tokens", "cost")
#: The message fields the trajectory viewer shows or the board counts, compared one by one.
_MESSAGE_FIELDS = ("role", "author", "content", "audience", "trainable", "meta")


def _usage_problems(where: str, player: str, step: Any, comp: Mapping[str, Any]) -> list[str]:
    """A submitted move's recorded usage, checked against what the move itself shows: counts are
    finite and non-negative, and the token counts equal the recorded token ids where there are some."""
    out = []
    usage = comp.get("usage") or {}
    if not isinstance(usage, Mapping):
        return [f"{where}: {player}'s usage at step {step} is not a mapping ({usage!r:.60})"]
    for key in _USAGE_KEYS:
        x = usage.get(key, 0)
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0:
            out.append(f"{where}: {player}'s usage.{key} at step {step} is {x!r}, not a finite count >= 0")
    for key, ids in (("completion_tokens", "token_ids"), ("prompt_tokens", "prompt_token_ids")):
        if isinstance(comp.get(ids), list) and key in usage and usage[key] != len(comp[ids]):
            out.append(f"{where}: {player}'s usage.{key} at step {step} is {usage[key]!r}, but the move records "
                       f"{len(comp[ids])} {ids}")
    return out


#: Usage counts that depend on how calls were batched (a batched call's ``model_calls`` is its
#: share of the batch), not on what was generated: not compared when regenerating.
_BATCH_DEPENDENT = ("model_calls",)


def _compare(k: int, rec: Mapping[str, Any], ep: Mapping[str, Any], submitted: Sequence[str] = (),
             ignore: Sequence[str] = ()) -> list[str]:
    """Differences between a recorded episode and its re-play, as problems of episode ``k``, each
    naming the field: every move (player, step, text, reward, components, usage), every message
    of the conversation the page shows, the returns, rewards, components, costs and end reason."""
    where = f"episode {k} (seed {rec.get('seed')}, task {rec.get('index')})"
    out = []
    rt, et = rec.get("turns", []), ep.get("turns", [])
    for i, (a, b) in enumerate(zip(rt, et)):
        if a.get("player") != b.get("player") or a.get("step") != b.get("step"):
            out.append(f"{where}: move {i} is by {a.get('player')} at step {a.get('step')} in the trajectory, "
                       f"by {b.get('player')} at step {b.get('step')} when re-played")
            return out
        if a.get("text") != b.get("text"):
            out.append(f"{where}: {a['player']}'s message at step {a['step']} differs from the re-played one "
                       f"(recorded {a.get('text', '')[:60]!r}, re-played {b.get('text', '')[:60]!r}): the recorded "
                       "calls or the track's prompts do not match the trajectory")
            return out
        if not _same(a.get("reward"), b.get("reward")):
            out.append(f"{where}: {a['player']}'s reward at step {a['step']} is {a.get('reward')!r} in the "
                       f"trajectory, re-scored {b.get('reward')!r}")
        if (a.get("components") or {}) != (b.get("components") or {}):
            out.append(f"{where}: {a['player']}'s reward components at step {a['step']} are {a.get('components')} "
                       f"in the trajectory, re-scored {b.get('components')}")
        ca, cb = a.get("completion") or {}, b.get("completion") or {}
        if a.get("player") in submitted:
            if isinstance(ca, Mapping) and ca:
                out.extend(_usage_problems(where, a["player"], a.get("step"), ca))
        elif _without(ca.get("usage") if isinstance(ca, Mapping) else None, ignore) != \
                _without(cb.get("usage") if isinstance(cb, Mapping) else None, ignore):
            out.append(f"{where}: {a['player']}'s usage at step {a['step']} is "
                       f"{ca.get('usage') if isinstance(ca, Mapping) else ca!r} in the trajectory, the recorded "
                       f"call says {cb.get('usage') if isinstance(cb, Mapping) else cb!r}")
    if len(rt) != len(et):
        out.append(f"{where}: the trajectory has {len(rt)} moves, the re-play {len(et)}")
    out.extend(_compare_conversation(where, rec.get("conversation"), ep.get("conversation")))
    for key in ("returns", "rewards", "components"):
        if rec.get(key) != ep.get(key):
            out.append(f"{where}: {key} are {rec.get(key)} in the trajectory, re-scored {ep.get(key)}")
    rc, ec = rec.get("costs") or {}, ep.get("costs") or {}
    if not isinstance(rc, Mapping):
        out.append(f"{where}: costs are {rc!r:.60} in the trajectory, not a mapping")
    else:
        for key in sorted((set(rc) | set(ec)) - set(ignore)):
            if not _same(rc.get(key), ec.get(key)):
                out.append(f"{where}: costs.{key} is {rc.get(key)!r} in the trajectory, re-played "
                           f"{ec.get(key)!r} (the sum of the recorded calls' usage)")
    for key in ("end_reason", "terminated", "truncated"):
        if rec.get(key) != ep.get(key):
            out.append(f"{where}: {key} is {rec.get(key)!r} in the trajectory, {ep.get(key)!r} when re-played")
    return out


def _without(usage: Any, keys: Sequence[str]) -> Any:
    return {k: v for k, v in usage.items() if k not in keys} if isinstance(usage, Mapping) else usage


def _compare_conversation(where: str, rec: Any, ep: Any) -> list[str]:
    """The recorded conversation (what the trajectory viewer and the hidden-goal panel show)
    against the re-played one, message by message and field by field."""
    rm = (rec or {}).get("messages") if isinstance(rec, Mapping) else None
    em = (ep or {}).get("messages") or []
    if not isinstance(rm, list):
        return [f"{where}: conversation has no message list in the trajectory"]
    out = []
    for i, (a, b) in enumerate(zip(rm, em)):
        if not isinstance(a, Mapping):
            return [f"{where}: conversation message {i} is not a message ({a!r:.60})"]
        for f in _MESSAGE_FIELDS:
            if a.get(f) != b.get(f):
                out.append(f"{where}: conversation message {i} ({b.get('author') or b.get('role')}): {f} is "
                           f"{str(a.get(f))[:60]!r} in the trajectory, {str(b.get(f))[:60]!r} when re-played")
                if len(out) >= 5:
                    return out
    if len(rm) != len(em):
        out.append(f"{where}: conversation has {len(rm)} messages in the trajectory, {len(em)} when re-played")
    if (rec or {}).get("viewer") != (ep or {}).get("viewer"):
        out.append(f"{where}: conversation viewer is {(rec or {}).get('viewer')!r} in the trajectory, "
                   f"{(ep or {}).get('viewer')!r} when re-played")
    return out


#: The probability with which :func:`verify_submission`'s default regeneration catches a single
#: forged simulator or judge reply (in one episode of the submission).
CATCH_PROBABILITY = 0.95


def regeneration_count(episodes: int, probability: float = CATCH_PROBABILITY) -> int:
    """Episodes to regenerate (drawn uniformly, without replacement) so that one forged episode
    among ``episodes`` is drawn with at least ``probability``: ``ceil(probability * episodes)``
    (``m`` draws of ``N`` include a given episode with probability ``m / N``)."""
    import math as _math

    return min(episodes, _math.ceil(probability * episodes - 1e-9))


def verify_submission(folder: str | os.PathLike[str], *, track: Track | str | None = None,
                      data_files: Sequence[str] | None = None, regenerate: int | None = None,
                      full: bool = False, sample_seed: int | None = None,
                      tracks_dir: str | os.PathLike[str] | None = None, keep: bool = False) -> Verification:
    """Re-score a submission offline and replay its recorded calls (see the module docstring).

    The checks run in the module docstring's order, each a named function below: those that
    find a problem the later checks cannot read past raise :class:`_Rejected` (the verdict is
    then the problems found so far), the others return their problems.

    Args:
        folder: The submission folder (or its ``submission.json``).
        track: The track to check against (default: the track whose id the submission names,
            built in or in ``tracks_dir``; a track file may be given here).
        data_files: The track's data files, for tracks on data.
        regenerate: On a track with an LLM user or judge, how many episodes (drawn at random)
            are played again with the track's *own* pinned models instead of the submission's
            recorded calls, every call compared (default :func:`regeneration_count`: enough to
            catch one forged episode with probability :data:`CATCH_PROBABILITY`; 0: none).
        full: Regenerate every episode.
        tracks_dir: A folder of your own track files (default: the nearest ``tracks/`` folder
            beside the submission or its ancestors, :func:`~collab_env.leaderboard.tracks.find_tracks_dir`).
        sample_seed: Seed of the draw (default: drawn from the system, so a submitter cannot
            know which episodes are regenerated).
        keep: Keep a passing verdict for later builds of a board holding this folder
            (:func:`~collab_env.leaderboard.board.keep_verdict`, what ``collab-env leaderboard
            verify`` does), keyed by the digest of the folder's files taken before the re-play;
            nothing is kept if a file changed while it ran.

    Returns:
        The :class:`Verification` (``ok`` or the problems).

    Raises:
        ConfigError: The folder holds no finished submission.
    """
    folder = Path(folder)
    if folder.name == "submission.json":
        folder = folder.parent
    sub = load_submission(folder)
    v = Verification(folder, str(sub.get("track")))
    try:
        # 1. The track.
        t = _check_track(sub, track, tracks_dir if tracks_dir is not None else find_tracks_dir(folder))
        key = _folder_key(folder, t) if keep else ""
        # 2. Files and the episode set.
        _check_plain_files(folder)
        digests = _check_digests(folder, sub)
        needs_cache = t.judge is not None or any("simulator" in h for h in t.players.values())
        v.problems.extend(_check_cache_and_failures(t, sub, folder, digests, needs_cache))
        _check_data_files(t, sub, data_files)
        records = _ok_records(folder / TRAJECTORIES_FILE)
    except _Rejected as stop:
        v.problems.extend(stop.problems)
        return v
    episodes = _check_episode_set(t, sub, records)
    v.problems.extend(episodes.problems)
    v.problems.extend(_check_kind(t, sub, episodes))
    by_id = episodes.by_id
    # 3-4. Re-play every episode. A program recorded in several trials of a task is scored once
    # (the verdict is a function of the program and the trusted tests).
    from collab_env.sandbox.harness import reuse_test_results

    cache_path = folder / CACHE_FILE
    label = f"verify {t.id}/{folder.name}"  # what its progress lines say runs
    with reuse_test_results():
        problems = asyncio.run(_replay_all(t, sub, by_id, cache_path if needs_cache else None, data_files,
                                           label=label))
    v.problems.extend(problems)
    v.episodes = len(by_id)
    # 5. The track's own players, regenerated: the recorded calls are the submitter's file, so a
    # reply the track's simulator never wrote could have been edited into both the cache and the
    # trajectory. Played again from the pinned models, such an episode differs.
    if needs_cache:
        regen = _regenerate_sample(t, sub, by_id, data_files, regenerate=regenerate, full=full,
                                   sample_seed=sample_seed, label=label)
        v.regenerated, v.regeneration = regen.episodes, regen.note
        v.needs_regeneration = t.kind != "api"
        v.problems.extend(regen.problems)
    v.problems.extend(_check_aggregates(t, sub, by_id))
    if "trajectories" in digests.changed and v.ok:
        v.problems.append(f"files: {TRAJECTORIES_FILE} is not the file recorded in submission.json (SHA-256 differs)")
    if key and _folder_key(folder, t) == key:
        from collab_env.leaderboard.board import keep_verdict

        keep_verdict(v, key)
    return v


def _folder_key(folder: Path, t: Track) -> str:
    """The digest a kept verdict of ``folder`` names (``""`` when a file cannot be read)."""
    from collab_env.leaderboard.board import verification_key

    try:
        return verification_key(folder, t)
    except OSError:
        return ""


class _Rejected(Exception):
    """A check found problems that the later checks cannot read past (a changed track, a stray
    file, a missing digest...): verification stops with the problems found so far and these."""

    def __init__(self, *problems: str) -> None:
        super().__init__(*problems)
        self.problems = list(problems)


def _check_track(sub: Mapping[str, Any], track: Track | str | None,
                 tracks_dir: str | os.PathLike[str] | None) -> Track:
    """The registered track (or ``track``) the submission was played on, unchanged since. The
    submission's own ``track`` field is looked up as an id only, never opened as a path."""
    try:
        if isinstance(track, Track):
            t = track
        elif track is not None:
            t = get_track(track, tracks_dir)
        else:
            t = resolve_track(sub.get("track"), known_tracks(tracks_dir))
    except (UnknownEnvError, ConfigError) as exc:
        raise _Rejected(f"track: {exc}") from None
    if sub.get("track") != t.id:
        raise _Rejected(f"track: the submission was played on {sub.get('track')!r}, not on the registered "
                        f"track {t.id}")
    if sub.get("track_version") != t.version or sub.get("track_hash") != t.content_hash():
        raise _Rejected(
            f"track: the submission records version {sub.get('track_version')!r} with hash "
            f"{str(sub.get('track_hash'))[:12]}, but {t.id} has version {t.version} with hash "
            f"{t.content_hash()[:12]}: it was played on a changed track")
    if sub.get("track_content", {}) and {k: sub["track_content"].get(k) for k in t.fixed()} != t.fixed():
        raise _Rejected(f"track: the track content recorded in submission.json differs from {t.id}'s")
    return t


def _check_plain_files(folder: Path) -> None:
    """The folder holds only the known submission files, each a plain file no larger than
    :data:`MAX_FILE_BYTES`, and the trajectories. A link could point anywhere (another entry's
    file, a file of the machine that builds the board)."""
    links = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_symlink())
    if links:
        raise _Rejected(f"files: {', '.join(links[:5])} is a symbolic link; a submission holds plain "
                        "files only (copy the file into the folder)")
    # The integrity digest covers every file: only the known files, each of them hashed.
    known = set(SUBMISSION_FILES.values())
    stray = sorted(rel for rel in (p.relative_to(folder).as_posix() for p in folder.rglob("*"))
                   if rel != SUBMISSION_FILE and rel not in known)
    if stray:
        raise _Rejected(f"files: {', '.join(stray[:5])} is not a submission file; a submission folder holds "
                        f"only {SUBMISSION_FILE} and {', '.join(sorted(known))} (remove the others)")
    big = [p.name for p in folder.iterdir() if p.is_file() and p.stat().st_size > MAX_FILE_BYTES]
    if big:
        raise _Rejected(f"files: {', '.join(big)} is larger than {MAX_FILE_BYTES >> 20} MiB; refused unread")
    traj = folder / TRAJECTORIES_FILE
    if not traj.is_file():
        raise _Rejected(f"files: {traj} is missing")


@dataclass(frozen=True)
class _Digests:
    """The SHA-256 of each submission file present (by key of :data:`SUBMISSION_FILES`), and the
    keys whose file differs from the digest ``submission.json`` records."""

    actual: Mapping[str, str]
    changed: frozenset[str]


def _check_digests(folder: Path, sub: Mapping[str, Any]) -> _Digests:
    """Every file present is hashed in ``submission.json`` and every file hashed there is present;
    which files differ from their digest is returned (the later checks say what that means)."""
    known = {name: key for key, name in SUBMISSION_FILES.items()}
    recorded = dict(sub.get("files") or {})
    if sub.get("cache") and "cache" not in recorded:  # submissions before the files block hashed every file
        recorded["cache"] = {"file": CACHE_FILE, "sha256": (sub.get("cache") or {}).get("sha256")}
    actual = {key: file_sha256(folder / name) for name, key in known.items() if (folder / name).is_file()}
    changed = set()
    problems = []
    for name, key in known.items():
        want = (recorded.get(key) or {}).get("sha256") if isinstance(recorded.get(key), Mapping) else None
        if key in actual and want is None:
            problems.append(f"files: {name} is in the folder but not hashed in {SUBMISSION_FILE}")
        elif key in actual and want != actual[key]:
            changed.add(key)
        elif key not in actual and want is not None:
            problems.append(f"files: {name} is hashed in {SUBMISSION_FILE} but missing")
    if problems:
        raise _Rejected(*problems)
    return _Digests(actual, frozenset(changed))


def _check_cache_and_failures(t: Track, sub: Mapping[str, Any], folder: Path, digests: _Digests,
                              needs_cache: bool) -> list[str]:
    """A track whose players make model calls has the call cache, unchanged; the failures file is
    unchanged. A missing cache stops verification (nothing could be replayed)."""
    problems = []
    cache_info = sub.get("cache")
    if needs_cache:
        if not cache_info or not (folder / CACHE_FILE).is_file():
            raise _Rejected(f"files: track {t.id} records model calls, but the submission has no {CACHE_FILE}")
        if "cache" in digests.changed or cache_info.get("sha256") != digests.actual["cache"]:
            problems.append(f"files: {CACHE_FILE} is not the file recorded in submission.json (SHA-256 differs): "
                            "a recorded call was changed")
    if "failures" in digests.changed:
        problems.append(f"files: {SUBMISSION_FILES['failures']} is not the file recorded in "
                        "submission.json (SHA-256 differs)")
    return problems


def _check_data_files(t: Track, sub: Mapping[str, Any], data_files: Sequence[str] | None) -> None:
    """On a track that reads data files, the files given are the ones the submission was played on."""
    if not t.data:
        return
    from collab_env.leaderboard.submission import data_file_digests as digest

    if not data_files:
        raise _Rejected(f"data: track {t.id} reads data files; pass them (--data-files) to verify")
    if [d["sha256"] for d in digest(data_files)] != [d.get("sha256") for d in sub.get("data_files", [])]:
        raise _Rejected("data: the data files given are not the ones the submission was played on "
                        "(SHA-256 differs)")


def _ok_records(traj: Path) -> list[dict[str, Any]]:
    """The finished episodes of the trajectories file (a malformed file stops verification)."""
    from collab_env.eval import load_results

    try:
        return [r for r in load_results(traj) if r.get("status") == "ok"]
    except ConfigError as exc:
        raise _Rejected(f"files: {exc}") from None


@dataclass
class _EpisodeSet:
    """The submission's episodes by id (those within the requested number), the requested ids
    without a record, the counts they were checked against, and the problems found."""

    by_id: dict[int, dict[str, Any]]
    missing: list[int]
    requested: int
    tasks: Any
    problems: list[str]


def _check_episode_set(t: Track, sub: Mapping[str, Any], records: Sequence[Mapping[str, Any]]) -> _EpisodeSet:
    """Every episode id at most once, with seed ``seed + k``, item ``k % tasks`` and the track's
    env; the ids without a record are exactly those the submission lists as failed."""
    tasks = sub.get("tasks") if t.tasks is None else t.tasks
    requested = int((sub.get("episodes") or {}).get("requested", 0))
    by_id: dict[int, dict[str, Any]] = {}
    problems = []
    # Records beyond the requested episodes are not part of the submission (nor of its numbers).
    for r in (r for r in records if not (isinstance(r.get("episode_id"), int) and r["episode_id"] >= requested)):
        k = r.get("episode_id")
        if not isinstance(k, int):
            problems.append(f"episodes: a record without an episode id (seed {r.get('seed')})")
            continue
        if k in by_id:
            problems.append(f"episode {k}: recorded twice")
            continue
        by_id[k] = dict(r)
        if r.get("seed") != t.seed + k or not isinstance(tasks, int) or r.get("index") != k % tasks:
            problems.append(f"episode {k}: seed {r.get('seed')} and task {r.get('index')}, but the track plays "
                            f"seed {t.seed + k} on task {k % tasks if isinstance(tasks, int) else '?'}")
        if r.get("env_id") != t.env_id:
            problems.append(f"episode {k}: played on {r.get('env_id')}, the track is on {t.env_id}")
    missing = [k for k in range(requested) if k not in by_id]
    claimed_failed = list((sub.get("episodes") or {}).get("failed", []))
    if missing != sorted(claimed_failed):
        problems.append(f"episodes: {missing[:10]} have no record, the submission lists {claimed_failed[:10]} "
                        "as failed")
    return _EpisodeSet(by_id, missing, requested, tasks, problems)


def _check_kind(t: Track, sub: Mapping[str, Any], eps: _EpisodeSet) -> list[str]:
    """A *standard* entry lists no custom reason, omits or fails no episode, is on a track with
    enough trials, and plays the number of episodes the track (not the submission) says."""
    problems = []
    episodes = sub.get("episodes") or {}
    standard = sub.get("kind") == "standard"
    if (not eps.missing and eps.requested == episodes.get("full")) and standard and sub.get("custom_reasons"):
        problems.append("kind: marked standard but lists reasons to be custom")
    if (eps.missing or eps.requested < int(episodes.get("full", eps.requested))) and standard:
        problems.append("kind: tasks are omitted or failed, so the entry cannot be standard")
    if standard and t.trials < MIN_STANDARD_TRIALS:
        problems.append(f"kind: {t.id} plays {t.trials} trials per task; a standard entry needs a track with at "
                        f"least {MIN_STANDARD_TRIALS} (play the track's current version)")
    tasks = eps.tasks
    track_full = t.episodes if t.episodes is not None else (tasks * t.trials if isinstance(tasks, int) else None)
    claimed_full = episodes.get("full")
    if standard and track_full is not None and (eps.requested != track_full or claimed_full != track_full):
        problems.append(f"kind: a standard entry on {t.id} plays the track's {track_full} episodes "
                        f"({tasks} tasks x {t.trials} trials); this one records requested {eps.requested}, "
                        f"full {claimed_full}")
    return problems


@dataclass(frozen=True)
class _Regeneration:
    """The episodes regenerated with the track's own models, the report's note, the problems."""

    episodes: list[int]
    note: str
    problems: list[str]


def _regenerate_sample(t: Track, sub: Mapping[str, Any], by_id: Mapping[int, Mapping[str, Any]],
                       data_files: Sequence[str] | None, *, regenerate: int | None, full: bool,
                       sample_seed: int | None, label: str = "verify") -> _Regeneration:
    """Play a random sample of episodes (all with ``full``) again with the track's pinned models,
    every call compared; an API track's calls are replayed only (not reproducible bit for bit)."""
    n_regen = len(by_id) if full else min(len(by_id), regeneration_count(len(by_id)) if regenerate is None
                                          else max(0, regenerate))
    if t.kind == "api":
        return _Regeneration([], "calls replayed, not regenerated: the track's simulator or judge is an API "
                                 "model, whose replies cannot be reproduced bit for bit", [])
    if not n_regen:
        return _Regeneration([], "", [])
    import random

    rng = random.Random(sample_seed) if sample_seed is not None else random.SystemRandom()
    drawn = sorted(rng.sample(sorted(by_id), n_regen))
    problems = asyncio.run(_replay_all(t, sub, {k: by_id[k] for k in drawn}, None, data_files, regenerate=True,
                                       label=label))
    return _Regeneration(drawn, f"{n_regen} of {len(by_id)} episodes regenerated with the track's own "
                                f"{'models' if t.judge is not None else 'user simulator'}, every call compared "
                                f"(one forged episode is caught with probability {n_regen / len(by_id):.2f})",
                         problems)


def _check_aggregates(t: Track, sub: Mapping[str, Any], by_id: Mapping[int, Mapping[str, Any]]) -> list[str]:
    """``submission.json``'s cost and simulator-fault count equal the sums over the trajectories."""
    problems = []
    usage = {"model_calls": 0.0, "prompt_tokens": 0.0, "completion_tokens": 0.0, "cost": 0.0}
    sim = 0
    for r in by_id.values():
        for key, x in submitted_usage(r, t.submitted).items():
            usage[key] += x
        sim += int(episode_faults(r, t.submitted)["simulator"] > 0)
    if sub.get("cost") != usage:
        problems.append(f"cost: submission.json says {sub.get('cost')}, the trajectories sum to {usage}")
    if (sub.get("faults") or {}).get("simulator_episodes") != sim:
        problems.append(f"faults: submission.json counts {(sub.get('faults') or {}).get('simulator_episodes')} "
                        f"episodes with simulator faults, the trajectories {sim}")
    return problems


def _cause(exc: BaseException, kind: type[BaseException]) -> BaseException | None:
    """``exc`` or the first exception of type ``kind`` in its cause/context chain (a policy may
    wrap the cache's miss in its own error)."""
    seen = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        if isinstance(e, kind):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


async def _replay_all(t: Track, sub: Mapping[str, Any], by_id: Mapping[int, Mapping[str, Any]],
                      cache_path: Path | None, data_files: Sequence[str] | None, *,
                      regenerate: bool = False, label: str = "verify") -> list[str]:
    """Re-play the episodes ``by_id``: the track's players from the submission's recorded calls
    (``cache_path``), or, with ``regenerate``, from the track's pinned models themselves (their
    calls go to a scratch cache that is thrown away). Progress as eval shows it (a bar on a
    terminal, else a line per tenth and at least one a minute), labelled ``label`` and the pass."""
    import tempfile

    from collab_env._progress import progress_bar
    from collab_env.compose import make
    from collab_env.rollout import arun_episode

    problems: list[str] = []
    backends = (sub.get("cache") or {}).get("backends") or {}
    scratch = None
    if regenerate:
        scratch = tempfile.TemporaryDirectory(prefix="collab-env-regenerate-")
        try:
            fp = fixed_players(t, Path(scratch.name) / CACHE_FILE, mode="record")
        except Exception as exc:  # noqa: BLE001 - a model that cannot be loaded is a problem, not a crash
            scratch.cleanup()
            return [f"regenerate: the track's pinned models could not be loaded ({type(exc).__name__}: {exc}); "
                    "verify on a machine that has them"]
    elif cache_path is not None:
        fp = fixed_players(t, cache_path, mode="replay", backends=backends)
    else:
        fp = fixed_players(t, None)
    env_kwargs = track_env_kwargs(t, fp.env_kwargs, data_files)
    sampling = {**fp.sampling, **{p: dict(kw) for p, kw in (sub.get("sampling") or {}).items() if p in t.submitted}}

    async def replay(k: int) -> list[str]:
        rec = by_id[k]
        where = f"episode {k} (seed {rec.get('seed')}, task {rec.get('index')})"
        moves = {p: RecordedMoves(p, [m for m in rec.get("turns", []) if m.get("player") == p]) for p in t.submitted}
        env = make(t.env_id, **env_kwargs)
        try:
            ep = await arun_episode(env, {**fp.policies, **moves}, seed=rec.get("seed"), index=rec.get("index"),
                                    sampling=sampling)
        except CollabEnvError as exc:
            miss = _cause(exc, CacheMissError)
            if miss is None and "replay cache" in str(exc) and "has no " in str(exc):
                miss = exc  # a policy that re-raised the miss as its own error, unchained
            if miss is None:
                return [f"{where}: cannot be re-played: {type(exc).__name__}: {exc}"]
            return [f"{where}: a call of the track's simulator or judge is not among the recorded calls "
                    f"(the prompts differ from the track's, or the cache was changed): {miss}"]
        finally:
            env.close()
        found = _compare(k, rec, ep.to_dict(), t.submitted, _BATCH_DEPENDENT if regenerate else ())
        if regenerate:
            found = [f"{p} (regenerated with the track's own pinned models: the recorded call is not what "
                     "the track's model writes)" for p in found]
        return found

    # One episode at a time: replayed at 8 at once, humaneval@v2's 656 canonical episodes took
    # 18.8 s against 19.6 s, with 18% more CPU (2 cores: one scoring already runs the program
    # and its tests side by side).
    bar = progress_bar(len(by_id), f"{label}: {'regenerate' if regenerate else 'replay'}", lines=True)
    try:
        for k in sorted(by_id):
            problems.extend(await replay(k))
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
        fp.close()
        if scratch is not None:
            scratch.cleanup()
    return problems

"""The board's data: :func:`board_data` reads a folder of submissions into one JSON-friendly
dict, the input of the page (:func:`collab_env.leaderboard.page.build_page`).

The folder holds submission folders (each with ``submission.json``) at any depth, e.g.
``benchmarks/leaderboard/<track>/<entry>/``. Every submission is verified
(:func:`~collab_env.leaderboard.verify.verify_submission`) unless ``verify=False``; an entry
that fails is still listed, with ``"verified": false`` and the first problems in
``"problems"``. Its shape is checked by :func:`~collab_env.leaderboard.schema.validate_board_data`.

One bad entry never breaks the build: an entry that cannot be read or summarised (a malformed
trajectory line, a string episode id, a NaN return, a symlinked or oversized file...) is listed
with ``"failed": true``, no statistics and the reason in ``"problems"``; a folder whose
``submission.json`` is unreadable or names an unknown track goes to ``"rejected"`` (path and
reason), which the page lists too. ``progress`` gets one line per entry and a summary.

Entry ids
    An entry's id is its track's id and the folder's path relative to the track's folder of the
    board, ``<track name>/v<version>/`` (``<track name>/`` also for version 1):
    ``hidden-facts-easy/v2/my-model`` on ``hidden-facts-easy@v2`` is
    ``hidden-facts-easy@v2/my-model``; a folder elsewhere keeps its whole path from the board
    (:func:`entry_id`). Two folders that claim one id are never settled by their order: the one
    a signed verdict covers keeps it, and every other claimant is rejected with the reason
    (when none is signed, all of them are).

Tracks
    A submission's ``track`` is an id, looked up among the built-in tracks and the board's own
    (``<directory>/tracks/<id>.json``, or ``tracks_dir``), never opened as a path.

Kept verdicts
    Re-playing every submission is slow (a code track re-runs every test in the sandbox), so
    each verdict is kept, keyed by the entry's folder and a digest of what the verdict depends
    on: every file of the submission, the track's content hash and collab_env's version. A later
    build re-plays only the entries whose digest changed (or all of them with
    ``reverify=True``). The kept verdicts live **outside** the board folder, in the user cache
    keyed by the board's path (:func:`stamps_file`): whoever builds a board verifies its folder
    once themselves, and nothing in the folder (which submitters write) is taken as a verdict
    unless it is signed. A ``.verified.json`` in the board folder (where builds kept them
    before) is ignored with a note, and a kept-verdicts file that sits inside the board folder
    or that git tracks is refused. Verdicts the maintainers signed
    (:mod:`collab_env.leaderboard.signing`, committed with the entries) count for the folders
    whose digest they name: so a fresh clone builds the seeded board without re-playing it, and
    an edited file still re-plays its entry.

Verdicts of ``leaderboard verify``
    ``collab-env leaderboard verify FOLDER`` (``verify_submission(..., keep=True)``) keeps a
    passing verdict beside the builds' ones, in ``<user cache>/leaderboard/verdicts/``, one file
    named by the folder's digest (:func:`verification_key`, taken before the re-play and
    unchanged after it), when it regenerated at least what a build would (:func:`keep_verdict`).
    A build finds it by the digest of the folder as it is (wherever the folder sits in the
    board), so building after verifying does not re-play the entry again, and a file edited
    since the verification changes the digest: that entry is re-played.
"""

from __future__ import annotations

import datetime as _dt
import functools
import hashlib
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from collab_env.leaderboard.stats import entry_statistics, noise_statistics, paired_comparison
from collab_env.leaderboard.submission import (
    SUBMISSION_FILE,
    TRAJECTORIES_FILE,
    code_version,
    data_file_digests,
    file_sha256,
    load_submission,
)
from collab_env.leaderboard.tracks import TRACKS_FOLDER, Track, known_tracks, resolve_track, track_status

__all__ = ["board_data", "entry_row_text", "track_row", "board_trajectory", "verification_key", "simulator_identity",
           "MAX_TRAJECTORIES", "STAMPS_FILE", "STAMPS_DIR", "stamps_file", "read_stamps", "entry_id",
           "MAX_TEXT_CHARS", "needs_regeneration", "verdicts_dir", "keep_verdict", "stamp_of", "user_card",
           "USER_CARDS_FILE", "judge_card", "JUDGE_CARDS_FILE"]

#: Where builds kept their verdicts before they moved out of the board folder: such a file is
#: ignored (see the module docstring).
STAMPS_FILE = ".verified.json"
#: The folder of the kept verdicts (``None``: ``<user cache>/leaderboard``, see :func:`stamps_file`).
STAMPS_DIR: Path | None = None
#: Characters of one text of a trajectory (a move, a hidden goal) the page shows; the rest is
#: cut with a note (the verified files keep it whole).
MAX_TEXT_CHARS = 8000

#: Trajectories per entry embedded in the board (the first episodes by id).
MAX_TRAJECTORIES = 6


def _backend_identity(backend: str) -> str:
    if backend == "embedded":
        from collab_env.agents.embedded import embedded_weights_identity
        from collab_env.errors import MissingDependencyError

        try:
            return f"embedded {embedded_weights_identity()}"
        except MissingDependencyError:
            return "embedded SmolLM2-135M-Instruct (its weights are not installed where this board was built)"
    if backend.startswith("litellm:"):
        return f"{backend.split(':', 1)[1]} via litellm (an API model: the version the provider served)"
    return backend


def _settings(how: Mapping[str, Any]) -> str:
    parts = [f"{k}={v}" for k, v in sorted((how.get("sampling") or {}).items())]
    parts += [f"{k}={v}" for k, v in sorted((how.get("options") or {}).items())]
    return ", ".join(parts)


def simulator_identity(t: Track) -> dict[str, str | None]:
    """The pinned identity of a track's fixed players and judge, as shown on every row of it:
    ``{"user": ..., "judge": ...}``. A scripted player is named with the collab_env version
    that defines it; an LLM one with its model (the embedded model by the SHA-256 of its
    weights file), its sampling and its options; ``judge`` is ``None`` on a rule-scored track.
    Entries are ranked and compared only within one track, so only under one identity."""
    import collab_env

    players = []
    for p, how in sorted(t.players.items()):
        if "policy" in how:
            players.append(f"{p}: {how['policy']} (scripted, collab_env {collab_env.__version__})")
        else:
            settings = _settings(how)
            players.append(f"{p}: {how.get('simulator', 'llm-user')} on {_backend_identity(str(how['backend']))}"
                           + (f"; {settings}" if settings else ""))
    judge = None
    if t.judge is not None:
        settings = _settings(t.judge)
        judge = (f"{t.judge.get('reward', 'judge')} judge on {_backend_identity(str(t.judge['backend']))}"
                 + (f"; {settings}" if settings else ""))
    return {"user": "; ".join(players) or "none (no simulated player)", "judge": judge}


#: The fidelity cards measured for LLM user simulators (``benchmarks/bench_check_user.py``
#: writes them): ``{"cards": [{"spec": policy spec mapping, "summary": ..., "source": ...}]}``.
USER_CARDS_FILE = Path(__file__).with_name("user_cards.json")


def _cards(path: Path) -> list[dict[str, Any]]:
    """The cards of a committed card file (:data:`USER_CARDS_FILE`, :data:`JUDGE_CARDS_FILE`),
    read once per version of the file (a board of many tracks reads it once)."""
    try:
        stamp = path.stat().st_mtime_ns
    except FileNotFoundError:
        return []
    return _cards_at(path, stamp)


@functools.lru_cache(maxsize=8)
def _cards_at(path: Path, stamp: int) -> list[dict[str, Any]]:
    return list(json.loads(path.read_text(encoding="utf-8"))["cards"])


def user_card(t: Track) -> str | None:
    """The fidelity card (:func:`collab_env.eval.check_user.check_user`) of each LLM user
    simulator ``t`` pins, as one line: the card whose spec is the player's own (kind
    ``llm-user``, backend, options, sampling and connection), from :data:`USER_CARDS_FILE`, or
    a note that none was measured. ``None`` for a track without an LLM user."""
    from collab_env.policy import PolicySpec

    llm = [(p, how) for p, how in sorted(t.players.items()) if "simulator" in how]
    if not llm:
        return None
    cards = _cards(USER_CARDS_FILE)
    parts = []
    for p, how in llm:
        key = PolicySpec(backend=str(how["backend"]), kind="llm-user", api_base=how.get("api_base"),
                         api_key_env=how.get("api_key_env"), options=how.get("options") or {},
                         sampling=how.get("sampling") or {}).to_dict()
        card = next((c for c in cards if c.get("spec") == key), None)
        parts.append(f"{p}: {card['summary']} ({card['source']})" if card is not None else
                     f"{p}: no fidelity card measured for this simulator (collab-env check-user SPEC)")
    return "; ".join(parts)


#: The validity checks measured for LLM judges (:mod:`collab_env.eval.judge_check`):
#: ``{"cards": [{"spec": judge mapping, "passed": bool, "auc", "ece", "items", "summary", "source"}]}``.
JUDGE_CARDS_FILE = Path(__file__).with_name("judge_cards.json")


def judge_card(t: Track) -> dict[str, Any] | None:
    """The validity check of the LLM judge ``t`` pins, shown beside its identity as a user's
    fidelity card is (:func:`user_card`): ``{"text": one line, "passed": bool | None, "judged":
    the track's metrics the judge decides, "refusal": what the page prints instead of them}``,
    from the card in :data:`JUDGE_CARDS_FILE` whose
    spec is the track's judge (backend, options, connection; the reward it serves aside).
    ``passed`` is ``None`` when no check was measured for it. The judged metrics (the judged
    reward components, and ``reward`` and ``success``, which sum and threshold them) are shown
    as numbers only for a judge that passed. ``None`` for a track without a judge."""
    if t.judge is None:
        return None
    from collab_env.eval.judge_check import judged_metrics, refusal_text
    from collab_env.registry import spec
    from collab_env.rewards.aggregation import DEFAULT_WEIGHTS

    weights = (dict(t.env_kwargs.get("reward_kwargs") or {}).get("weights") or dict(spec(t.env_id).reward)
               or DEFAULT_WEIGHTS)
    judged = judged_metrics(weights)
    totals = ["reward", "success"] if judged else []
    shown = [m for m in t.metrics if m in {*judged, *totals}]
    key = {k: v for k, v in sorted(t.judge.items()) if k != "reward"}
    cards = _cards(JUDGE_CARDS_FILE)
    card = next((c for c in cards if c.get("spec") == key), None)
    if card is None:
        return {"text": "no validity check measured for this judge (collab_env.eval.judge_check.check_judge): "
                        "its judged metrics are not shown as numbers", "passed": None, "judged": shown,
                "refusal": "judge not checked for validity"}
    refusal = "" if card["passed"] else refusal_text(card["auc"], card["ece"], card.get("errors", 0),
                                                     min_auc=card["min_auc"], max_ece=card["max_ece"])
    return {"text": f"{card['summary']} ({card['source']})", "passed": bool(card["passed"]), "judged": shown,
            "refusal": refusal}


def track_row(t: Track, tracks: Mapping[str, Track] | None = None) -> dict[str, Any]:
    """One track as a row of ``board["tracks"]``."""
    ident = simulator_identity(t)
    return {
        "id": t.id, "env_id": t.env_id, "version": t.version,
        "status": track_status(t, tracks),
        "title": t.title, "description": t.description, "metrics": list(t.metrics), "k": t.k,
        "seeds": t.trials, "episodes": t.episodes if t.episodes is not None else 0,
        "user": t.user, "judge": t.judge_name, "kind": t.kind, "hash": t.content_hash(),
        "user_identity": ident["user"], "judge_identity": ident["judge"], "user_card": user_card(t),
        "judge_card": judge_card(t),
    }


def board_trajectory(record: Mapping[str, Any], submitted: Sequence[str], threshold: float) -> dict[str, Any]:
    """One episode for the trajectory viewer: the visible conversation, each move with its
    reward and components (``None``/``{}`` for messages that were not moves, like an opening),
    and apart from it the hidden goal (the messages the submitted players could not see)."""
    from collab_env.leaderboard.stats import episode_values

    msgs = ((record.get("conversation") or {}).get("messages")) or []
    hidden = []
    for m in msgs:
        aud = m.get("audience")
        if aud is not None and not set(aud) & set(submitted):
            facts = m["meta"]["hidden"] if isinstance(m.get("meta"), dict) and "hidden" in m["meta"] else None
            if facts is not None and len(json.dumps(facts, default=str)) > MAX_TEXT_CHARS:
                facts = _clip(json.dumps(facts, default=str))
            hidden.append({"to": [_clip(str(a), 100) for a in aud][:16], "text": _clip(str(m.get("content", ""))),
                           **({"facts": facts} if facts is not None else {})})
    moves = list(record.get("turns") or [])
    turns = []
    j = 0
    for m in msgs:
        if m.get("role") == "system" or m.get("audience") is not None:
            continue
        author = m.get("author") or m.get("role")
        turn: dict[str, Any] = {"player": _clip(str(author), 100), "text": _clip(str(m.get("content", ""))),
                                "reward": None, "components": {}}
        if j < len(moves) and moves[j].get("player") == author and moves[j].get("text") == m.get("content"):
            turn["reward"] = float(moves[j].get("reward", 0.0))
            turn["components"] = {k: float(v) for k, v in (moves[j].get("components") or {}).items()}
            j += 1
        turns.append(turn)
    v = episode_values(record, submitted, threshold)
    end = record.get("end_reason")
    return {"episode": int(record.get("episode_id", 0)), "task": _clip(str(record.get("index")), 100),
            "seed": int(record.get("seed") or 0), "hidden_goal": hidden or None,
            "reward": float(v["reward"]), "success": bool(v["success"]), "turns": turns,
            "end_reason": _clip(str(end), 200) if end is not None else None}


def _clip(text: str, limit: int = MAX_TEXT_CHARS) -> str:
    """``text`` cut to ``limit`` characters, with a note of what was left out."""
    if len(text) <= limit:
        return text
    return text[:limit] + f" [... {len(text) - limit} more characters not shown]"


def _entries(directory: Path) -> list[Path]:
    return sorted(p.parent for p in directory.rglob(SUBMISSION_FILE))


def entry_id(directory: str | os.PathLike[str], folder: str | os.PathLike[str], t: Track) -> str:
    """The id of the entry in ``folder`` on track ``t`` of the board ``directory``: the track's id
    and the folder's path relative to the track's folder ``<name>/v<version>/`` (for version 1
    also ``<name>/``); a folder outside it keeps its whole path from the board."""
    rel = Path(folder).resolve().relative_to(Path(directory).resolve()).as_posix()
    if rel == ".":
        return f"{t.id}/{Path(folder).resolve().name}"
    for prefix in [f"{t.name}/v{t.version}/"] + ([f"{t.name}/"] if t.version == 1 else []):
        if rel.startswith(prefix):
            return f"{t.id}/{rel[len(prefix):]}"
    return f"{t.id}/{rel}"


def needs_regeneration(t: Track) -> bool:
    """``t`` has a player or judge played by a local model whose calls verification regenerates
    (an API track's calls are replayed only)."""
    return t.kind != "api" and (t.judge is not None or any("simulator" in h for h in t.players.values()))


def stamps_file(directory: str | os.PathLike[str]) -> Path:
    """Where ``build`` keeps the verdicts of the board ``directory``: outside it, in
    :data:`STAMPS_DIR` (default ``<user cache>/leaderboard``, the cache of
    :func:`collab_env.agents.embedded.default_cache_root`), one file per board, named by the
    SHA-256 of the board's absolute path."""
    resolved = Path(directory).resolve()
    digest = hashlib.sha256(str(resolved).encode("utf-8", "surrogatepass")).hexdigest()[:24]
    return _cache_root() / f"{resolved.name or 'board'}-{digest}.verified.json"


def _cache_root() -> Path:
    """:data:`STAMPS_DIR`, default ``<user cache>/leaderboard``."""
    if STAMPS_DIR is not None:
        return Path(STAMPS_DIR)
    from collab_env.agents.embedded import default_cache_root

    return default_cache_root() / "leaderboard"


def verdicts_dir() -> Path:
    """Where ``collab-env leaderboard verify`` keeps its passing verdicts (see the module
    docstring): ``verdicts/`` in the folder of :func:`stamps_file`, one file per digest."""
    return _cache_root() / "verdicts"


def stamp_of(v: Any, key: str) -> dict[str, Any]:
    """The kept form of the :class:`~collab_env.leaderboard.verify.Verification` ``v`` of the
    folder whose digest (:func:`verification_key`) is ``key``."""
    return {"key": key, "ok": v.ok, "episodes": v.episodes, "problems": v.problems[:5],
            "regenerated": len(v.regenerated) if v.needs_regeneration else None}


def keep_verdict(v: Any, key: str) -> Path | None:
    """Keep the verdict ``v`` of the folder whose digest is ``key`` (:func:`verification_key`)
    for later builds, in :func:`verdicts_dir`; returns the file, or ``None`` when it is not
    kept: a failed verdict (a build re-plays that entry and says why), or one that regenerated
    fewer episodes than a build's re-play would
    (:func:`~collab_env.leaderboard.verify.regeneration_count`)."""
    from collab_env.leaderboard.verify import regeneration_count

    if not v.ok or not key or (v.needs_regeneration and len(v.regenerated) < regeneration_count(v.episodes)):
        return None
    path = verdicts_dir() / f"{key}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(stamp_of(v, key), indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return path


def _git_tracks(path: Path) -> bool:
    """git tracks ``path`` (``False`` outside a repository or without git)."""
    import subprocess

    try:
        return subprocess.run(["git", "-C", str(path.parent), "ls-files", "--error-unmatch", "--", path.name],
                              capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _stamps_refusal(directory: Path, path: Path) -> str | None:
    """Why the kept-verdicts file ``path`` of board ``directory`` is not trusted, or ``None``."""
    try:
        inside = path.resolve().is_relative_to(directory.resolve())
    except OSError:
        inside = False
    if inside:
        return (f"{path} is inside the board folder, which submitters write: its verdicts are refused (set "
                "COLLAB_ENV_CACHE to a folder outside the board)")
    if path.exists() and _git_tracks(path):
        return f"git tracks {path}: its verdicts are refused (kept verdicts are never committed; sign them instead)"
    return None


def read_stamps(directory: str | os.PathLike[str]) -> tuple[dict[str, Any], list[str]]:
    """The verdicts earlier builds kept for the board ``directory`` (:func:`stamps_file`) and
    notes on what was ignored: a verdict file in the board folder, a kept-verdicts file inside
    it or tracked by git, a damaged one (which only costs a re-play)."""
    from collab_env._json import loads

    directory = Path(directory)
    notes = []
    legacy = directory / STAMPS_FILE
    if legacy.exists() or legacy.is_symlink():
        tracked = " (and git tracks it)" if _git_tracks(legacy) else ""
        notes.append(f"{legacy} ignored{tracked}: a verdict file in the board folder is never trusted; "
                     f"build keeps its verdicts in {stamps_file(directory)}")
    path = stamps_file(directory)
    refusal = _stamps_refusal(directory, path)
    if refusal:
        return {}, [*notes, refusal]
    if not path.is_file():
        return {}, notes
    try:
        stamps = loads(path.read_bytes(), str(path))
        if not isinstance(stamps, dict):
            raise ValueError("not an object")
    except (OSError, ValueError):
        return {}, [*notes, f"{path} could not be read: its entries are re-played"]
    return stamps, notes


def _write_stamps(directory: Path, stamps: Mapping[str, Any], say: Callable[[str], None]) -> None:
    path = stamps_file(directory)
    refusal = _stamps_refusal(directory, path)
    if refusal:
        say(f"verdicts not kept: {refusal}")
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(stamps, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


def verification_key(folder: Path, t: Track) -> str:
    """The digest a verdict of ``folder`` on ``t`` depends on: the SHA-256 of every file in the
    submission folder (by relative path; a symbolic link by its target, so a stamp taken before a
    file was replaced by a link never covers it), the track's content hash and collab_env's version."""
    import collab_env

    h = hashlib.sha256()
    for f in sorted(p for p in folder.rglob("*") if p.is_file() or p.is_symlink()):
        rel = f.relative_to(folder).as_posix()
        if f.is_symlink():  # a link is part of what was verified: a stamp never covers a new one
            h.update(f"{rel}\0link {os.readlink(f)}\n".encode())
        else:
            h.update(f"{rel}\0{file_sha256(f)}\n".encode())
    h.update(f"track {t.id} {t.content_hash()}\ncollab_env {collab_env.__version__}\n".encode())
    return h.hexdigest()


def _failed_entry(eid: str, t: Track, folder: Path, sub: Mapping[str, Any], problems: list[str]) -> dict[str, Any]:
    """The board row of an entry that could not be summarised: listed, marked failed, no numbers."""
    def text(key: str) -> str:
        v = sub.get(key)
        return v if isinstance(v, str) else str(folder.name)

    kind = sub.get("kind") if sub.get("kind") in ("standard", "custom") else "custom"
    return {"id": eid, "track": t.id, "name": text("name"), "model": text("model"), "kind": kind,
            "verified": False, "failed": True, "metrics": {}, "pass_k": {}, "cost_per_episode": None,
            "cost_unit": None, "simulator_fault_rate": 0.0, "judge_fault_rate": 0.0, "seeds": 0,
            "episodes": 0, "tasks": 0, "policies": {}, "sampling": {}, "code_version": None,
            "custom_reasons": [], "problems": problems[:5], "path": str(folder), "trajectories": [],
            "simulator": simulator_identity(t), "trials": 0, "flip_rate": None, "flip_tasks": 0, "mdd": None}


def board_data(directory: str | os.PathLike[str], *, verify: bool = True, seed: int = 0,
               num_boot: int | None = None, reverify: bool = False,
               progress: Callable[[str], None] | None = None, workers: int | None = None,
               tracks_dir: str | os.PathLike[str] | None = None, full: bool = False,
               data_files: Sequence[str] | None = None) -> dict[str, Any]:
    """The board of every submission under ``directory`` (see the module docstring).

    The build is four named steps: read every folder (:func:`_read_folders`), re-play the
    entries whose kept verdict no longer covers their files (:func:`_replay_entries`), build
    every entry's row (:func:`_entry_row`), compare neighbours within a track
    (:func:`_comparisons`).

    Args:
        directory: Folder of submission folders.
        verify: Verify each submission (re-play offline); ``False`` marks them unverified.
        reverify: Re-play every submission, ignoring the kept verdicts (:func:`stamps_file`,
            which are then rewritten, and those of ``leaderboard verify``, :func:`verdicts_dir`)
            and the signed ones.
        seed: Seed of the bootstrap intervals.
        num_boot: Bootstrap resamples (default :data:`~collab_env.leaderboard.stats.NUM_BOOT`).
        progress: Called with one line per entry (``[i/N] entry: verdict (time)``) and a
            summary line at the end (``collab-env leaderboard build`` prints them). Entries that
            are re-played report as they finish, so their lines may come out of order.
        workers: Entries re-played at once, each in a thread of its own (default: the CPU
            count, at most 4). A code track's replay waits on sandbox processes, so two entries
            overlap on two cores; ``1`` re-plays one after another.
        tracks_dir: The board's own track files (default ``<directory>/tracks``).
        full: On tracks with an LLM user or judge, regenerate every episode (what ``sign``
            does); a kept or signed verdict counts only if it regenerated all of them.
        data_files: Data files for the entries on tracks that read data: each such entry is
            re-played with the files among these whose SHA-256 its submission recorded (an
            entry none of them matches cannot be re-played, and says which files it needs).

    Returns:
        The board dict (the shape of :func:`~collab_env.leaderboard.schema.validate_board_data`).
    """
    import time

    from collab_env.leaderboard.stats import NUM_BOOT
    from collab_env.leaderboard.verify import CATCH_PROBABILITY

    directory = Path(directory)
    say = progress or (lambda line: None)
    verdicts = _Verdicts.kept_in(directory, say, stamps=verify and not reverify, signed=not reverify)
    t_all = time.perf_counter()
    tracks = known_tracks(tracks_dir if tracks_dir is not None else directory / TRACKS_FOLDER)
    # 1. Read every folder; find the entries whose kept verdict no longer covers their files.
    readable, rejected, total = _read_folders(directory, tracks, verdicts, say)
    # 2. Re-play those entries, several at once; each verdict as it finishes.
    if verify:
        todo = [f for f in readable if not verdicts.covers(f.rel, f.track, full)]
        by_digest = {d["sha256"]: path for d, path in zip(data_file_digests(data_files), data_files or ())}
        # an entry re-played without its data files is refused for that alone: not a verdict to keep
        verdicts.unkept = {f.rel for f in todo if f.track.data and _entry_data_files(f.sub, by_digest) is None}
        verdicts.replayed = _replay_entries(todo, total, workers, say, full, by_digest)
    # 3. Every entry's row, in folder order.
    entries: list[dict[str, Any]] = []
    records_of: dict[str, list[dict[str, Any]]] = {}
    for f in readable:
        t0 = time.perf_counter()
        entry, records_of[f.eid], how = _entry_row(f, verdicts if verify else None, seed, num_boot or NUM_BOOT)
        entries.append(entry)
        if how:
            say(f"[{f.position}/{total}] {f.eid}: {how} ({time.perf_counter() - t0:.1f} s)")
    comparisons = _comparisons(entries, tracks, records_of, verify=verify, seed=seed,
                               num_boot=num_boot or NUM_BOOT, say=say)
    if verify and verdicts.fresh != verdicts.stamps:
        _write_stamps(directory, verdicts.fresh, say)
    n_ok = sum(e["verified"] for e in entries)
    n_failed = sum(bool(e.get("failed")) for e in entries)
    say(f"{len(entries)} entries: {n_ok} verified, {len(entries) - n_ok - n_failed} not verified, "
        f"{n_failed} failed; {len(rejected)} folder(s) rejected ({time.perf_counter() - t_all:.1f} s)")
    return {
        "generated": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "code_version": code_version(),
        "tracks": [track_row(t, tracks) for t in tracks.values()],
        "entries": entries,
        "comparisons": comparisons,
        "rejected": rejected,
        "verification": {"catch_probability": CATCH_PROBABILITY, "full": bool(full)},
    }


class _Folder(NamedTuple):
    """A readable submission folder: its position in the build (1-based), path, path relative to
    the board's folder, ``submission.json``, track and entry id (:func:`entry_id`)."""

    position: int
    folder: Path
    rel: str
    sub: dict[str, Any]
    track: Track
    eid: str


@dataclass
class _Verdicts:
    """What a build knows of each entry's verification: the verdicts kept by earlier builds
    (``stamps``, from :func:`stamps_file`) and signed by the maintainers (``signed``), the digest
    each verdict must name to count (``keys``), this build's re-plays (``replayed``: relative
    path -> the :class:`~collab_env.leaderboard.verify.Verification` or the exception, and
    seconds), the stamps it writes back (``fresh``; never those of ``unkept``: entries on a
    track that reads data, re-played without their files) and the passing verdicts
    ``collab-env leaderboard verify`` kept for the entries' digests (``verified``, read from
    ``verdicts_from``, :func:`verdicts_dir`; ``None``: not read)."""

    stamps: dict[str, Any] = field(default_factory=dict)
    signed: dict[str, Any] = field(default_factory=dict)
    keys: dict[str, str] = field(default_factory=dict)
    replayed: dict[str, tuple[Any, float]] = field(default_factory=dict)
    fresh: dict[str, Any] = field(default_factory=dict)
    unkept: set[str] = field(default_factory=set)
    verified: dict[str, Any] = field(default_factory=dict)
    verdicts_from: Path | None = None

    @classmethod
    def kept_in(cls, directory: Path, say: Callable[[str], None], *, stamps: bool = True,
                signed: bool = True) -> _Verdicts:
        """The kept (:func:`read_stamps`) and signed verdicts of ``directory``, each when asked
        for (a damaged file only costs a re-play; every file ignored is said)."""
        from collab_env.leaderboard.signing import signed_verdicts

        kept: dict[str, Any] = {}
        good: dict[str, Any] = {}
        notes: list[str] = []
        if stamps:
            kept, notes = read_stamps(directory)
        if signed:
            good, more = signed_verdicts(directory)
            notes += more
        verdicts_from = None
        if stamps:  # the verdicts of `leaderboard verify`, trusted as the kept ones are
            refusal = _stamps_refusal(directory, verdicts_dir())
            if refusal:
                notes.append(refusal)
            else:
                verdicts_from = verdicts_dir()
        for note in notes:
            say(note)
        return cls(stamps=kept, signed=good, verdicts_from=verdicts_from)

    def kept(self, source: Mapping[str, Any], rel: str) -> bool:
        """``source`` holds a verdict of ``rel`` that names its current digest."""
        return (isinstance(source.get(rel), Mapping) and bool(self.keys.get(rel))
                and source[rel].get("key") == self.keys[rel])

    def covers(self, rel: str, t: Track | None = None, full: bool = False) -> bool:
        """A kept or signed verdict covers ``rel``'s files as they are: no re-play needed. With
        ``full``, on a track whose calls are regenerated (:func:`needs_regeneration`), only a
        verdict that regenerated every episode counts."""
        def enough(stamp: Mapping[str, Any]) -> bool:
            n = stamp.get("regenerated")
            if not full or t is None or not needs_regeneration(t):
                return True
            return isinstance(n, int) and n == stamp.get("episodes")

        return any(self.kept(source, rel) and enough(source[rel])
                   for source in (self.stamps, self.verified, self.signed))

    def verdict(self, rel: str) -> tuple[dict[str, Any], str]:
        """The stamp of ``rel`` (this build's re-play first, then a kept, then a signed verdict)
        and the progress line's verdict (empty for a re-play: reported when it finished). A
        re-play that raised raises here."""
        if rel in self.replayed:
            v, _ = self.replayed[rel]
            if isinstance(v, Exception):
                raise v
            return stamp_of(v, self.keys[rel]), ""
        if self.kept(self.stamps, rel):
            return self.stamps[rel], "verified (kept verdict)"
        if self.kept(self.verified, rel):
            return self.verified[rel], "verified (kept verdict of leaderboard verify)"
        return dict(self.signed[rel]), "verified (signed verdict)"

    def read_verified(self, rel: str) -> None:
        """Read the verdict ``collab-env leaderboard verify`` kept for ``rel``'s digest
        (:func:`keep_verdict`) into ``verified``, when verdicts are read from
        :func:`verdicts_dir` (``verdicts_from``) and there is one (a damaged file only costs a
        re-play)."""
        from collab_env._json import loads

        key = self.keys.get(rel)
        if self.verdicts_from is None or not key:
            return
        path = self.verdicts_from / f"{key}.json"
        try:
            stamp = loads(path.read_bytes(), str(path)) if path.is_file() else None
        except (OSError, ValueError):
            return
        if isinstance(stamp, dict) and stamp.get("key") == key and stamp.get("ok") is True:
            self.verified[rel] = stamp


def _read_folders(directory: Path, tracks: dict[str, Track], verdicts: _Verdicts,
                  say: Callable[[str], None]) -> tuple[list[_Folder], list[dict[str, str]], int]:
    """Every submission folder under ``directory``, read: the readable ones (each folder's digest
    in ``verdicts.keys``), the rejected ones (an unreadable ``submission.json``, a track that is
    not a known id, an id claimed by several folders) with the reason, and the number of folders.

    Two folders claiming one entry id (:func:`entry_id`) are settled by what is signed, never
    by their order: a claimant whose files a signed verdict covers keeps the id and the others
    are rejected; with no such claimant, every one of them is."""
    folders = _entries(directory)
    found: list[_Folder] = []
    rejected: list[dict[str, str]] = []

    def reject(i: int, rel: str, reason: str) -> None:
        rejected.append({"path": rel, "reason": reason[:300]})
        say(f"[{i}/{len(folders)}] {rel}: REJECTED ({reason[:120]})")

    for i, folder in enumerate(folders, start=1):
        rel = folder.relative_to(directory).as_posix()
        try:
            sub = load_submission(folder)
            t = resolve_track(sub["track"], tracks)
        except Exception as exc:  # noqa: BLE001 - an unreadable entry is rejected, never fatal
            reject(i, rel, f"{type(exc).__name__}: {exc}")
            continue
        found.append(_Folder(i, folder, rel, sub, t, entry_id(directory, folder, t)))
        try:
            verdicts.keys[rel] = verification_key(folder, t)
        except OSError:
            verdicts.keys[rel] = ""  # an unreadable file: re-played, and the replay says what is wrong
        verdicts.read_verified(rel)
    claims: dict[str, list[_Folder]] = {}
    for f in found:
        claims.setdefault(f.eid, []).append(f)
    readable = []
    for f in found:
        rivals = [g for g in claims[f.eid] if g is not f]
        if not rivals:
            readable.append(f)
            continue
        signed = [g for g in claims[f.eid] if verdicts.kept(verdicts.signed, g.rel)]
        if len(signed) == 1 and signed[0] is f:
            readable.append(f)
            continue
        others = ", ".join(g.rel for g in rivals)
        why = (f"the signed entry {signed[0].rel} holds it" if len(signed) == 1
               else "no signed verdict settles which folder it is")
        reject(f.position, f.rel, f"the entry id {f.eid!r} is claimed by {others} too, and {why} (an entry's id is "
                                  "its track and its folder's path in the track's folder): rename or move the folder")
    return readable, rejected, len(folders)


def _replay_entries(todo: Sequence[_Folder], total: int, workers: int | None,
                    say: Callable[[str], None], full: bool = False,
                    by_digest: Mapping[str, str] | None = None) -> dict[str, tuple[Any, float]]:
    """Verify the entries ``todo``, ``workers`` at once (threads): relative path -> the
    verification (or the exception it raised, reported on the entry, never fatal) and its
    seconds; one progress line per entry as it finishes. An entry on a track that reads data
    is given the data files it recorded, from ``by_digest`` (SHA-256 -> path;
    :func:`_entry_data_files`)."""
    import time
    from concurrent.futures import ThreadPoolExecutor, as_completed

    from collab_env.leaderboard.verify import verify_submission

    by_digest = by_digest or {}

    def replay(folder: Path, t: Track, sub: Mapping[str, Any]) -> tuple[Any, float]:
        t0 = time.perf_counter()
        try:
            return (verify_submission(folder, track=t, full=full, data_files=_entry_data_files(sub, by_digest)),
                    time.perf_counter() - t0)
        except Exception as exc:  # noqa: BLE001 - reported on the entry, never fatal
            return exc, time.perf_counter() - t0

    replayed: dict[str, tuple[Any, float]] = {}
    n_workers = max(1, workers if workers is not None else min(4, os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=n_workers) as pool:
        futures = {pool.submit(replay, f.folder, f.track, f.sub): f for f in todo}
        for fut in as_completed(futures):
            f = futures[fut]
            replayed[f.rel] = fut.result()
            v, dt = replayed[f.rel]
            how = ("could not be verified: " + f"{type(v).__name__}: {v}"[:120] if isinstance(v, Exception)
                   else "verified (re-played)" if v.ok
                   else "NOT verified: " + (v.problems[0] if v.problems else "")[:120])
            say(f"[{f.position}/{total}] {f.eid}: {how} ({dt:.1f} s)")
    return replayed


def _entry_data_files(sub: Mapping[str, Any], by_digest: Mapping[str, str]) -> list[str] | None:
    """The given data files an entry was played on, in its recorded order (matched by SHA-256),
    or ``None`` when it recorded none or one of its files was not given."""
    recorded = [d.get("sha256") for d in sub.get("data_files") or () if isinstance(d, Mapping)]
    digests = [h for h in recorded if isinstance(h, str) and h in by_digest]
    if not recorded or len(digests) != len(recorded):
        return None
    return [by_digest[h] for h in digests]


def _entry_row(f: _Folder, verdicts: _Verdicts | None, seed: int,
               num_boot: int) -> tuple[dict[str, Any], list[dict[str, Any]], str]:
    """The board row of one readable entry, its scored records and the progress line's verdict
    (empty when it was reported as its re-play finished). With ``verdicts`` the entry's stamp is
    recorded in ``verdicts.fresh``. An entry that cannot be read or summarised is listed as
    failed, with the reason, and no records: one bad entry never breaks the build."""
    from collab_env.leaderboard.schema import BOARD_SHAPE, check_shape

    how = "not verified"
    problems: list[str] = []
    regenerated: Any = None
    try:
        verified = False
        if verdicts is not None:
            stamp, how = verdicts.verdict(f.rel)
            if f.rel not in verdicts.unkept:
                verdicts.fresh[f.rel] = stamp
            verified, problems = bool(stamp["ok"]), [_clip(str(p), 500) for p in list(stamp["problems"])[:5]]
            regenerated = stamp.get("regenerated") if needs_regeneration(f.track) else None
            if not verified and how:
                how = "NOT verified: " + (problems[0] if problems else "no reason given")[:120]
        entry, records = _entry(f.folder, f.sub, f.track, f.eid, verified, problems, seed, num_boot)
        if needs_regeneration(f.track):
            entry["regenerated"] = regenerated if isinstance(regenerated, int) else None
        check_shape(entry, BOARD_SHAPE["entries"][0], f"entry {f.eid}")
        json.dumps(entry, allow_nan=False)  # plain JSON: a NaN in a submitted field is refused here
    except Exception as exc:  # noqa: BLE001 - one bad entry never breaks the build
        reason = f"the entry could not be read or summarised: {type(exc).__name__}: {exc}"[:300]
        return _failed_entry(f.eid, f.track, f.folder, f.sub, [*problems, reason]), [], "FAILED: " + reason[:120]
    return entry, records, how


def _comparisons(entries: Sequence[Mapping[str, Any]], tracks: Mapping[str, Track],
                 records_of: Mapping[str, list[dict[str, Any]]], *, verify: bool, seed: int, num_boot: int,
                 say: Callable[[str], None]) -> list[dict[str, Any]]:
    """The paired comparison of each entry with the next below it on its track, by mean reward.

    Entries are compared only within their track, whose fixed players and judge are one pinned
    identity (:func:`simulator_identity`): two simulators are never ranked together. An entry
    that failed verification is not compared: its records may not pair with the track's
    episodes, and it is already listed with its problems. A comparison that raises is reported
    and skipped, never breaking the build."""
    comparisons = []
    for tid in dict.fromkeys(e["track"] for e in entries):
        t = tracks[tid]
        ranked = sorted((e for e in entries if e["track"] == tid and "reward" in e["metrics"]
                         and not e.get("failed") and (e["verified"] or not verify)),
                        key=lambda e: -e["metrics"]["reward"]["mean"])
        for a, b in zip(ranked, ranked[1:]):
            try:
                c = paired_comparison(records_of[a["id"]], records_of[b["id"]], submitted=t.submitted,
                                      threshold=t.success_threshold, metric="reward", seed=seed,
                                      num_boot=num_boot)
            except Exception as exc:  # noqa: BLE001 - never breaks the build
                say(f"{tid}: {a['id']} vs {b['id']} not compared ({type(exc).__name__}: {exc})"[:200])
                continue
            if c["n"]:
                comparisons.append({"track": tid, "a": a["id"], "b": b["id"], "metric": "reward",
                                    "diff": c["diff"], "lo": c["lo"], "hi": c["hi"], "n": c["n"],
                                    "tasks": c["tasks"], "distinguishable": not c["lo"] <= 0.0 <= c["hi"]})
    return comparisons


def _entry(folder: Path, sub: Mapping[str, Any], t: Track, eid: str, verified: bool, problems: list[str],
           seed: int, num_boot: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The board row of one readable entry and its scored records (raises on a malformed one)."""
    from collab_env.eval import load_results

    requested = int((sub.get("episodes") or {}).get("requested", 0))
    records = [r for r in load_results(folder / TRAJECTORIES_FILE)
               if r.get("status") == "ok" and r.get("episode_id", requested) < requested]
    st = entry_statistics(records, submitted=t.submitted, threshold=t.success_threshold,
                          metrics=t.metrics, k=t.k, seed=seed, num_boot=num_boot)
    noise = noise_statistics(records, submitted=t.submitted, threshold=t.success_threshold)
    cost = sub.get("cost") or {}
    n = max(len(records), 1)
    usd = float(cost.get("cost", 0.0) or 0.0)
    tokens = float(cost.get("prompt_tokens", 0.0) or 0.0) + float(cost.get("completion_tokens", 0.0) or 0.0)
    if usd > 0:
        cpe, unit = usd / n, "usd"
    elif tokens > 0:
        cpe, unit = tokens / n, "tokens"
    else:
        cpe, unit = None, None
    faults = sub.get("faults") or {}
    judged = len(records) + int(faults.get("judge_episodes", 0))
    entry = {
        "id": eid, "track": t.id, "name": str(sub.get("name")), "model": str(sub.get("model")),
        "kind": sub.get("kind", "custom"), "verified": verified, "failed": False,
        "metrics": st["metrics"], "pass_k": st["pass_k"],
        "cost_per_episode": cpe, "cost_unit": unit,
        "simulator_fault_rate": (faults.get("simulator_episodes", 0) / len(records)) if records else 0.0,
        "judge_fault_rate": (faults.get("judge_episodes", 0) / judged) if judged else 0.0,
        "seeds": st["seeds"], "episodes": st["episodes"], "tasks": st["tasks"],
        "policies": dict(sub.get("policies") or {}), "sampling": sub.get("sampling") or {},
        "code_version": sub.get("code_version"), "custom_reasons": list(sub.get("custom_reasons") or []),
        "problems": problems, "path": str(folder), "simulator": simulator_identity(t),
        "trials": noise["trials"], "flip_rate": noise["flip_rate"], "flip_tasks": noise["flip_tasks"],
        "mdd": noise["mdd"],
        "trajectories": [board_trajectory(r, t.submitted, t.success_threshold)
                         for r in sorted(records, key=lambda r: r["episode_id"])[:MAX_TRAJECTORIES]],
    }
    return entry, records


def entry_row_text(folder: str | os.PathLike[str], *, seed: int = 0, num_boot: int | None = None,
                   track: Track | None = None, tracks_dir: str | os.PathLike[str] | None = None) -> str:
    """The board row of one submission folder as text (what ``collab-env leaderboard run``
    prints when it ends): every metric of the track with its 95% interval and n, and pass^k.
    Not verified here: ``collab-env leaderboard verify FOLDER`` re-plays it. ``track``: the
    track it was played on (default: the id it names, built in or in ``tracks_dir``)."""
    from collab_env.leaderboard.stats import NUM_BOOT
    from collab_env.leaderboard.tracks import find_tracks_dir

    folder = Path(folder)
    if folder.name == SUBMISSION_FILE:
        folder = folder.parent
    sub = load_submission(folder)
    t = track if track is not None else resolve_track(
        sub["track"], known_tracks(tracks_dir if tracks_dir is not None else find_tracks_dir(folder)))
    entry, _ = _entry(folder, sub, t, f"{t.id}/{folder.name}", False, [], seed, num_boot or NUM_BOOT)
    cells = [f"{name} {m['mean']:.3f} [{m['lo']:.3f}, {m['hi']:.3f}] (n={m['n']})"
             for name, m in entry["metrics"].items()]
    cells += [f"pass^{k} {m['mean']:.3f} [{m['lo']:.3f}, {m['hi']:.3f}]" for k, m in entry["pass_k"].items()]
    cells.append("flip rate " + ("-" if entry["flip_rate"] is None else f"{entry['flip_rate']:.3f} "
                                 f"(of {entry['flip_tasks']} tasks)"))
    cells.append("minimum detectable difference (success) " + ("-" if entry["mdd"] is None else f"{entry['mdd']:.3f}"))
    return (f"{entry['id']} ({entry['kind']}, {entry['episodes']} episodes, {entry['seeds']} trials per task): "
            + "; ".join(cells))

"""The board's data: :func:`board_data` reads a folder of submissions into one JSON-friendly
dict, the input of the page (:func:`collab_env.leaderboard.page.build_page`).

The folder holds submission folders (each with ``submission.json``) at any depth, e.g.
``benchmarks/leaderboard/<track>/<entry>/``. Every submission is verified
(:func:`~collab_env.leaderboard.verify.verify_submission`) unless ``verify=False``; an entry
that fails is still listed, with ``"verified": false`` and the first problems in
``"problems"``. Its shape is checked by :func:`~collab_env.leaderboard.schema.validate_board_data`.

Re-playing every submission is slow (a code track re-runs every test in the sandbox), so each
verdict is kept in ``<directory>/.verified.json``, keyed by the entry's folder and a digest of
what the verdict depends on: every file of the submission, the track's content hash and
collab_env's version. A later build re-plays only the entries whose digest changed (or all of
them with ``reverify=True``). The stamps live beside the entries, not in them: a submission
cannot bring its own verdict, and whoever builds a board verifies its folder once themselves.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from collab_env.leaderboard.stats import entry_statistics, paired_comparison
from collab_env.leaderboard.submission import (
    SUBMISSION_FILE,
    TRAJECTORIES_FILE,
    code_version,
    file_sha256,
    load_submission,
)
from collab_env.leaderboard.tracks import Track, builtin_tracks, get_track, track_status

__all__ = ["board_data", "track_row", "board_trajectory", "verification_key", "MAX_TRAJECTORIES", "STAMPS_FILE"]

#: The verdicts of earlier builds, in the board's folder (see the module docstring).
STAMPS_FILE = ".verified.json"

#: Trajectories per entry embedded in the board (the first episodes by id).
MAX_TRAJECTORIES = 12


def track_row(t: Track, tracks: Mapping[str, Track] | None = None) -> dict[str, Any]:
    """One track as a row of ``board["tracks"]``."""
    return {
        "id": t.id, "env_id": t.env_id, "version": t.version,
        "status": track_status(t, tracks),
        "title": t.title, "description": t.description, "metrics": list(t.metrics), "k": t.k,
        "seeds": t.trials, "episodes": t.episodes if t.episodes is not None else 0,
        "user": t.user, "judge": t.judge_name, "kind": t.kind, "hash": t.content_hash(),
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
            hidden.append({"to": list(aud), "text": m.get("content", ""), **({"facts": m["meta"]["hidden"]}
                          if isinstance(m.get("meta"), dict) and "hidden" in m["meta"] else {})})
    moves = list(record.get("turns") or [])
    turns = []
    j = 0
    for m in msgs:
        if m.get("role") == "system" or m.get("audience") is not None:
            continue
        author = m.get("author") or m.get("role")
        turn = {"player": str(author), "text": str(m.get("content", "")), "reward": None, "components": {}}
        if j < len(moves) and moves[j].get("player") == author and moves[j].get("text") == m.get("content"):
            turn["reward"] = float(moves[j].get("reward", 0.0))
            turn["components"] = {k: float(v) for k, v in (moves[j].get("components") or {}).items()}
            j += 1
        turns.append(turn)
    v = episode_values(record, submitted, threshold)
    return {"episode": int(record.get("episode_id", 0)), "task": str(record.get("index")),
            "seed": int(record.get("seed") or 0), "hidden_goal": hidden or None,
            "reward": float(v["reward"]), "success": bool(v["success"]), "turns": turns,
            "end_reason": record.get("end_reason")}


def _entries(directory: Path) -> list[Path]:
    return sorted(p.parent for p in directory.rglob(SUBMISSION_FILE))


def verification_key(folder: Path, t: Track) -> str:
    """The digest a verdict of ``folder`` on ``t`` depends on: the SHA-256 of every file in the
    submission folder (by relative path), the track's content hash and collab_env's version."""
    import collab_env

    h = hashlib.sha256()
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        h.update(f"{f.relative_to(folder).as_posix()}\0{file_sha256(f)}\n".encode())
    h.update(f"track {t.id} {t.content_hash()}\ncollab_env {collab_env.__version__}\n".encode())
    return h.hexdigest()


def board_data(directory: str | os.PathLike[str], *, verify: bool = True, seed: int = 0,
               num_boot: int | None = None, reverify: bool = False) -> dict[str, Any]:
    """The board of every submission under ``directory`` (see the module docstring).

    Args:
        directory: Folder of submission folders.
        verify: Verify each submission (re-play offline); ``False`` marks them unverified.
        reverify: Re-play every submission, ignoring the verdicts kept in
            :data:`STAMPS_FILE` (which are then rewritten).
        seed: Seed of the bootstrap intervals.
        num_boot: Bootstrap resamples (default :data:`~collab_env.leaderboard.stats.NUM_BOOT`).

    Returns:
        The board dict (the shape of :func:`~collab_env.leaderboard.schema.validate_board_data`).
    """
    from collab_env.eval import load_results
    from collab_env.leaderboard.stats import NUM_BOOT
    from collab_env.leaderboard.verify import verify_submission

    directory = Path(directory)
    stamps_path = directory / STAMPS_FILE
    stamps: dict[str, Any] = {}
    if verify and not reverify and stamps_path.is_file():
        try:
            stamps = dict(json.loads(stamps_path.read_text()))
        except (ValueError, TypeError):
            stamps = {}  # a damaged stamps file only costs a re-play
    fresh: dict[str, Any] = {}
    tracks = dict(builtin_tracks())
    entries: list[dict[str, Any]] = []
    records_of: dict[str, list[dict[str, Any]]] = {}
    for folder in _entries(directory):
        sub = load_submission(folder)
        try:
            t = tracks.get(sub["track"]) or get_track(sub["track"])
        except Exception:  # noqa: BLE001 - an entry on an unknown track is skipped, not fatal
            continue
        tracks.setdefault(t.id, t)
        requested = int((sub.get("episodes") or {}).get("requested", 0))
        records = [r for r in load_results(folder / TRAJECTORIES_FILE)
                   if r.get("status") == "ok" and r.get("episode_id", requested) < requested]
        problems: list[str] = []
        verified = False
        if verify:
            rel, key = folder.relative_to(directory).as_posix(), verification_key(folder, t)
            stamp = stamps.get(rel)
            if not (isinstance(stamp, Mapping) and stamp.get("key") == key):
                v = verify_submission(folder, track=t)
                stamp = {"key": key, "ok": v.ok, "episodes": v.episodes, "problems": v.problems[:5]}
            fresh[rel] = stamp
            verified, problems = bool(stamp["ok"]), list(stamp["problems"])
        st = entry_statistics(records, submitted=t.submitted, threshold=t.success_threshold,
                              metrics=t.metrics, k=t.k, seed=seed, num_boot=num_boot or NUM_BOOT)
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
        eid = f"{t.id}/{folder.name}"
        records_of[eid] = records
        entries.append({
            "id": eid, "track": t.id, "name": str(sub.get("name")), "model": str(sub.get("model")),
            "kind": sub.get("kind", "custom"), "verified": verified,
            "metrics": st["metrics"], "pass_k": st["pass_k"],
            "cost_per_episode": cpe, "cost_unit": unit,
            "simulator_fault_rate": (faults.get("simulator_episodes", 0) / len(records)) if records else 0.0,
            "judge_fault_rate": (faults.get("judge_episodes", 0) / judged) if judged else 0.0,
            "seeds": st["seeds"], "episodes": st["episodes"], "tasks": st["tasks"],
            "policies": dict(sub.get("policies") or {}), "sampling": sub.get("sampling") or {},
            "code_version": sub.get("code_version"), "custom_reasons": list(sub.get("custom_reasons") or []),
            "problems": problems, "path": str(folder),
            "trajectories": [board_trajectory(r, t.submitted, t.success_threshold)
                             for r in sorted(records, key=lambda r: r["episode_id"])[:MAX_TRAJECTORIES]],
        })
    comparisons = []
    for tid in dict.fromkeys(e["track"] for e in entries):
        t = tracks[tid]
        ranked = sorted((e for e in entries if e["track"] == tid and "reward" in e["metrics"]),
                        key=lambda e: -e["metrics"]["reward"]["mean"])
        for a, b in zip(ranked, ranked[1:]):
            c = paired_comparison(records_of[a["id"]], records_of[b["id"]], submitted=t.submitted,
                                  threshold=t.success_threshold, metric="reward", seed=seed,
                                  num_boot=num_boot or NUM_BOOT)
            if c["n"]:
                comparisons.append({"track": tid, "a": a["id"], "b": b["id"], "metric": "reward",
                                    "diff": c["diff"], "lo": c["lo"], "hi": c["hi"], "n": c["n"],
                                    "tasks": c["tasks"]})
    if verify and fresh != stamps:
        stamps_path.write_text(json.dumps(fresh, indent=1, sort_keys=True) + "\n")
    return {
        "generated": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "code_version": code_version(),
        "tracks": [track_row(t, tracks) for t in tracks.values()],
        "entries": entries,
        "comparisons": comparisons,
    }

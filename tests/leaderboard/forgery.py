"""What a hostile submitter does to an LLM-user track's entry: one simulator reply forged, both in
the recorded calls (``calls.sqlite``) and in the episode's trajectory record; and the honest entry
it starts from (:func:`honest_entry`), played once per test run and copied by each test."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from pathlib import Path
from typing import Any


def forgery_track() -> Any:
    """The LLM-user track (the embedded model plays the user) cut to 2 steps an episode: the
    assistant asks, the simulator replies once. That reply is the episode's last, so no later
    call depends on it (the hole regeneration closes); a longer episode only adds model calls."""
    from collab_env.leaderboard.tracks import Track, get_track

    base = get_track("hidden-facts-easy-llm-user@v2")
    return Track.from_dict({**base.to_dict(), "name": "llm-user-forgery",
                            "env_kwargs": {**base.env_kwargs, "max_steps": 2}})


def honest_entry(root: Path) -> Path:
    """An honest 3-episode entry of ``ask-then-answer`` on :func:`forgery_track`, played into
    ``root / "llm-user-forgery-entry"`` by the first caller; the others (other xdist workers
    too, under the lock) get the same folder. Copy it before editing it."""
    from collab_env.agents.embedded import _file_lock
    from collab_env.leaderboard.submission import run_submission

    folder = root / "llm-user-forgery-entry"
    with _file_lock(root / "llm-user-forgery-entry.lock"):
        if not (folder / "submission.json").is_file():
            tmp = root / f"llm-user-forgery-entry.tmp-{os.getpid()}"
            run_submission(forgery_track(), {"assistant": "ask-then-answer"}, out=tmp, episodes=3,
                           progress=False)
            os.replace(tmp, folder)
    return folder


def copy_entry(entry: Path, dst: Path) -> Path:
    """A private copy of the honest entry at ``dst``."""
    shutil.copytree(entry, dst)
    return dst


def forge_last_user_reply(folder: Path, record: dict, forged: str) -> str:
    """Replace the last user reply of the trajectory ``record`` (edited in place; the caller writes
    the trajectories) with ``forged``, and the recorded call that produced it (the episode's last
    call with that text: no later prompt contains it). Returns the reply it replaced."""
    last = [t for t in record["turns"] if t["player"] == "user" and t["completion"]][-1]
    old = last["text"]
    con = sqlite3.connect(folder / "calls.sqlite")
    rows = [(key, json.loads(comp)) for key, comp in con.execute("SELECT key, completion FROM responses ORDER BY rowid")]
    key, d = [(key, d) for key, d in rows if d["text"].strip() == old.strip()][-1]
    d["text"] = d["text"].replace(old.strip(), forged)
    con.execute("UPDATE responses SET completion = ? WHERE key = ?", (json.dumps(d), key))
    con.commit()
    con.close()
    last["text"] = last["completion"]["text"] = forged
    msg = [m for m in record["conversation"]["messages"] if m["author"] == "user" and m["content"] == old][-1]
    msg["content"] = forged
    return old

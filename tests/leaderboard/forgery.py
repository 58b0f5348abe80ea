"""What a hostile submitter does to an LLM-user track's entry: one simulator reply forged, both in
the recorded calls (``calls.sqlite``) and in the episode's trajectory record."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path


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

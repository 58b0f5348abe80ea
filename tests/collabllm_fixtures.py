"""Small CollabLLM data files in the real schema, for tests (no hub needed).

``write_collabllm_fixture`` writes ``n`` rows with the columns of
``collabllm/collabllm-multiturn-*`` (``prompt``, ``completion``, ``conv_id``, ``score``,
``single_turn_prompt``, ``single_turn_completion``, ``single_turn_metadata``, ``turn_id``,
``sessions``, ``rewards``) in either ``sessions`` layout and as jsonl, json or parquet.
``collabllm_fixture_rows`` returns the same rows as Python data, so tests know what to expect.

Texts carry markers that tests search for: ``HIDDEN-GOAL-<i>`` only in ``single_turn_prompt``,
``REFERENCE-ANSWER-<i>`` only in ``single_turn_completion`` and ``RECORDED-COMPLETION-<i>`` only
in ``completion`` and the sessions' assistant turns. Recorded future user turns are
``FUTURE-USER-<i>-<k>``; no recorded user turn contains the termination signal, so a replaying
user runs out of turns and then terminates.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

__all__ = ["write_collabllm_fixture", "collabllm_fixture_rows", "FUTURE_USER_TURNS"]

#: Recorded user turns after the prompt prefix, per row (in the first session).
FUTURE_USER_TURNS = 2


def _session(i: int, s: int, prefix: list[dict[str, str]], *, whole: bool) -> list[dict[str, str]]:
    """Session ``s`` of row ``i``: the continuation after the prefix (or, when ``whole``, the
    whole conversation, as some recorded sessions are)."""
    future = [{"role": "assistant", "content": f"RECORDED-COMPLETION-{i}: which sum do you mean?"}]
    for k in range(1, FUTURE_USER_TURNS + 1 if s == 0 else 2):
        future.append({"role": "user", "content": f"FUTURE-USER-{i}-{k}{'' if s == 0 else '-alt'}"})
        future.append({"role": "assistant", "content": f"Assistant follow-up {k} for row {i}."})
    return (list(prefix) + future) if whole else future


def collabllm_fixture_rows(
    n: int = 4, *, layout: Literal["list", "struct"] = "list", task_desc: str | None = None
) -> list[dict[str, Any]]:
    """``n`` rows in the CollabLLM schema.

    Args:
        n: Number of rows.
        layout: ``"list"``: ``sessions`` is a list of message lists. ``"struct"``: a dict keyed
            ``"0"``, ``"1"``, ``"2"`` where keys a row lacks are ``None`` (as ``datasets``
            unifies struct keys across rows).
        task_desc: When given, add a ``task_desc`` column with this value.
    """
    if layout not in ("list", "struct"):
        raise ValueError(f"layout must be 'list' or 'struct', got {layout!r}")
    rows = []
    for i in range(n):
        opening = {"role": "user", "content": f"Could you help me add up some odd numbers? (conversation {i})"}
        # Odd rows are a later turn of their conversation: a three-message prefix.
        if i % 2:
            prefix = [
                opening,
                {"role": "assistant", "content": f"Sure. Which odd numbers? (row {i})"},
                {"role": "user", "content": f"The first few positive ones, row {i}."},
            ]
        else:
            prefix = [opening]
        n_sessions = 2 + (i % 2)
        sessions = [_session(i, s, prefix, whole=(i % 4 == 1)) for s in range(n_sessions)]
        row = {
            "prompt": prefix,
            "completion": f"RECORDED-COMPLETION-{i}: which sum do you mean?",
            "conv_id": i,
            "score": 0.25 * (i % 4),
            "single_turn_prompt": f"HIDDEN-GOAL-{i}: find the sum of the first {i + 3} positive odd integers.",
            "single_turn_completion": f"REFERENCE-ANSWER-{i}: \\boxed{{{(i + 3) ** 2}}}",
            "single_turn_metadata": {"level": f"Level {1 + i % 5}", "type": "Algebra"},
            "turn_id": len(prefix),
            "sessions": sessions
            if layout == "list"
            else {str(k): (sessions[k] if k < len(sessions) else None) for k in range(3)},
            "rewards": {
                "accuracy": [1.0, 0.0, 1.0][:n_sessions],
                "interactivity": [0.8, 0.6, 0.7][:n_sessions],
                "token_amount": [0.12, 0.2, 0.15][:n_sessions],
            },
        }
        if task_desc is not None:
            row["task_desc"] = task_desc
        rows.append(row)
    return rows


def write_collabllm_fixture(
    path: str | Path,
    layout: Literal["list", "struct"] = "list",
    fmt: Literal["jsonl", "json", "parquet"] = "jsonl",
    n: int = 4,
    *,
    drop: tuple[str, ...] = (),
    task_desc: str | None = None,
) -> Path:
    """Write ``collabllm_fixture_rows(n, layout=layout)`` to ``path`` and return the file path.

    Args:
        path: File to write, or an existing directory (the file is then
            ``collabllm-<layout>.<fmt>`` inside it).
        layout: ``sessions`` layout, ``"list"`` or ``"struct"``.
        fmt: ``"jsonl"`` (one row a line), ``"json"`` (one array) or ``"parquet"``.
        n: Number of rows.
        drop: Columns to leave out (to build malformed files).
        task_desc: When given, add a ``task_desc`` column.
    """
    path = Path(path)
    if path.is_dir():
        path = path / f"collabllm-{layout}.{fmt}"
    rows = [{k: v for k, v in r.items() if k not in drop}
            for r in collabllm_fixture_rows(n, layout=layout, task_desc=task_desc)]
    if fmt == "jsonl":
        if layout == "struct":
            # Struct keys a row lacks are simply absent in JSON; the reader fills them with None.
            rows = [{**r, "sessions": {k: v for k, v in r["sessions"].items() if v is not None}}
                    if "sessions" in r else r for r in rows]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    elif fmt == "json":
        path.write_text(json.dumps(rows), encoding="utf-8")
    elif fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        raise ValueError(f"fmt must be 'jsonl', 'json' or 'parquet', got {fmt!r}")
    return path

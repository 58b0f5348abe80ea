"""Small CollabLLM data files in the real schema, for tests (no hub needed).

``write_collabllm_fixture`` writes ``n`` rows with the columns of
``collabllm/collabllm-multiturn-*`` (``prompt``, ``completion``, ``conv_id``, ``score``,
``single_turn_prompt``, ``single_turn_completion``, ``single_turn_metadata``, ``turn_id``,
``sessions``, ``rewards``) in any ``sessions`` layout and as jsonl, json or parquet.
``collabllm_fixture_rows`` returns the same rows as Python data, so tests know what to expect.

Layout ``"large"`` mirrors the published ``-large`` sets (the dataset cards of
``collabllm/collabllm-multiturn-*-large`` and the collabllm package's reward logs, where each
sampled session is ``{forward_chat, average_score, <judge>: {score, thought}}`` and
``forward_chat`` is the conversation after the candidate reply, starting with the user): columns
``conv_id, prompt, completion, score, turn_id, single_turn_prompt, single_turn_completion,
single_turn_metadata, sessions`` (no ``rewards``); ``sessions`` a struct keyed ``"0"``, ``"1"``,
``"2"`` (even rows have two sessions, odd rows three), each with ``average_score``,
``forward_chat`` and ``interactivity: {score, thought}``; even rows (the "older math rows") also
``accuracy: {score, thought, reason}``. :data:`LARGE_FEATURES` is the hub schema of those rows
(``datasets.Features``); :func:`write_collabllm_hub_dir` writes a local copy of a hub dataset
repository (``README.md`` card + ``data/train-*.parquet``) that ``datasets.load_dataset(dir)``
reads as it reads the hub.

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

__all__ = [
    "write_collabllm_fixture",
    "write_collabllm_hub_dir",
    "collabllm_fixture_rows",
    "large_features",
    "FUTURE_USER_TURNS",
]

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


def _large_sessions(i: int, sessions: list[list[dict[str, str]]], prefix: list[dict[str, str]]) -> dict[str, Any]:
    """The ``-large`` struct of row ``i``: each session's future after the candidate reply."""
    out = {}
    for s, session in enumerate(sessions):
        chat = session[len(prefix):] if session[:len(prefix)] == prefix else session
        entry: dict[str, Any] = {
            "average_score": 0.5 + 0.125 * s,
            "forward_chat": chat[1:],  # the candidate reply itself is not part of it
            "interactivity": {"score": 0.5 + 0.125 * s, "thought": f"JUDGE-THOUGHT-{i}-{s}"},
        }
        if i % 2 == 0:  # older math rows also carry the accuracy judge's verdict
            entry["accuracy"] = {"score": float(s % 2), "thought": f"ACC-THOUGHT-{i}-{s}",
                                 "reason": f"ACC-REASON-{i}-{s}"}
        out[str(s)] = entry
    return out


def collabllm_fixture_rows(
    n: int = 4, *, layout: Literal["list", "struct", "large"] = "list", task_desc: str | None = None
) -> list[dict[str, Any]]:
    """``n`` rows in the CollabLLM schema.

    Args:
        n: Number of rows.
        layout: ``"list"``: ``sessions`` is a list of message lists. ``"struct"``: a dict keyed
            ``"0"``, ``"1"``, ``"2"`` where keys a row lacks are ``None`` (as ``datasets``
            unifies struct keys across rows). ``"large"``: the published ``-large`` layout
            (module docstring); keys a row lacks are absent.
        task_desc: When given, add a ``task_desc`` column with this value.
    """
    if layout not in ("list", "struct", "large"):
        raise ValueError(f"layout must be 'list', 'struct' or 'large', got {layout!r}")
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
        if layout == "large":  # the -large column set and order, as on the hub
            row = {"conv_id": i, "prompt": prefix, "completion": row["completion"], "score": row["score"],
                   "turn_id": len(prefix), "single_turn_prompt": row["single_turn_prompt"],
                   "single_turn_completion": row["single_turn_completion"],
                   "single_turn_metadata": row["single_turn_metadata"],
                   "sessions": _large_sessions(i, sessions, prefix)}
        if task_desc is not None:
            row["task_desc"] = task_desc
        rows.append(row)
    return rows


def large_features(*, sequence_messages: bool = False):
    """The hub schema (``datasets.Features``) of the ``-large`` rows: the dataset card's
    ``dataset_info``, math-hard flavour. ``sequence_messages``: message lists declared as a
    ``Sequence`` of a struct (read back as ``{"role": [...], "content": [...]}``)."""
    import datasets
    from datasets import Features, Value

    msg_fields = {"content": Value("string"), "role": Value("string")}
    if sequence_messages:
        messages = datasets.Sequence(msg_fields)
    else:
        messages = getattr(datasets, "List", datasets.Sequence)(msg_fields)
    session = {
        "accuracy": {"reason": Value("string"), "score": Value("float64"), "thought": Value("string")},
        "average_score": Value("float64"),
        "forward_chat": messages,
        "interactivity": {"score": Value("float64"), "thought": Value("string")},
    }
    return Features({
        "conv_id": Value("int64"),
        "prompt": messages,
        "completion": Value("string"),
        "score": Value("float64"),
        "turn_id": Value("int64"),
        "single_turn_prompt": Value("string"),
        "single_turn_completion": Value("string"),
        "single_turn_metadata": {"level": Value("string"), "type": Value("string")},
        "sessions": {str(k): session for k in range(3)},
    })


def _as_columns(messages: list[dict[str, str]]) -> dict[str, list[str]]:
    return {"role": [m["role"] for m in messages], "content": [m["content"] for m in messages]}


def _large_dataset(rows: list[dict[str, Any]], *, sequence_messages: bool = False):
    import datasets

    if sequence_messages:  # a Sequence of structs is written column-wise
        rows = [{**r, "prompt": _as_columns(r["prompt"]),
                 "sessions": {k: {**v, "forward_chat": _as_columns(v["forward_chat"])}
                              for k, v in r["sessions"].items()}} for r in rows]
    return datasets.Dataset.from_list(rows, features=large_features(sequence_messages=sequence_messages))


_CARD = """\
---
dataset_info:
  features:
  - name: conv_id
    dtype: int64
  - name: prompt
    {messages}
  - name: completion
    dtype: string
  - name: score
    dtype: float64
  - name: turn_id
    dtype: int64
  - name: single_turn_prompt
    dtype: string
  - name: single_turn_completion
    dtype: string
  - name: single_turn_metadata
    struct:
    - name: level
      dtype: string
    - name: type
      dtype: string
  - name: sessions
    struct:
{sessions}
configs:
- config_name: default
  data_files:
  - split: train
    path: data/train-*
---
"""

_CARD_SESSION = """\
    - name: '{key}'
      struct:
      - name: accuracy
        struct:
        - name: reason
          dtype: string
        - name: score
          dtype: float64
        - name: thought
          dtype: string
      - name: average_score
        dtype: float64
      - name: forward_chat
        {messages}
      - name: interactivity
        struct:
        - name: score
          dtype: float64
        - name: thought
          dtype: string"""


def _card_messages(indent: int, sequence: bool) -> str:
    pad = " " * indent
    kind = "sequence" if sequence else "list"
    return (f"{kind}:\n{pad}- name: content\n{pad}  dtype: string\n{pad}- name: role\n{pad}  dtype: string")


def write_collabllm_hub_dir(path: str | Path, n: int = 4, *, sequence_messages: bool = False,
                            rows: list[dict[str, Any]] | None = None) -> Path:
    """A local copy of a ``-large`` hub dataset repository: ``README.md`` with the card's
    ``dataset_info`` (:func:`large_features`) and ``data/train-00000-of-00001.parquet`` written by
    ``datasets`` with those features (as ``push_to_hub`` writes them). Returns the directory.
    ``rows``: rows of the ``-large`` layout to write instead of ``collabllm_fixture_rows(n)``."""
    path = Path(path)
    (path / "data").mkdir(parents=True, exist_ok=True)
    rows = collabllm_fixture_rows(n, layout="large") if rows is None else rows
    _large_dataset(rows, sequence_messages=sequence_messages).to_parquet(
        str(path / "data" / "train-00000-of-00001.parquet"))
    sessions = "\n".join(_CARD_SESSION.format(key=k, messages=_card_messages(8, sequence_messages))
                         for k in range(3))
    (path / "README.md").write_text(
        _CARD.format(messages=_card_messages(4, sequence_messages), sessions=sessions), encoding="utf-8")
    return path


def write_collabllm_fixture(
    path: str | Path,
    layout: Literal["list", "struct", "large"] = "list",
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
        layout: ``sessions`` layout, ``"list"``, ``"struct"`` or ``"large"``.
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
    elif fmt == "parquet" and layout == "large" and not drop:
        _large_dataset(rows).to_parquet(str(path))  # with the hub's features, as the hub files are
    elif fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        raise ValueError(f"fmt must be 'jsonl', 'json' or 'parquet', got {fmt!r}")
    return path

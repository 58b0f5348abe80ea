"""Result files of an evaluation: writing each finished episode durably, the failures sidecar,
reading and resuming a run."""

from __future__ import annotations

import errno
import json
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from collab_env._json import depth_problem
from collab_env.errors import ConfigError
from collab_env.eval.results import FAILURES_SUFFIX
from collab_env.types import Episode

__all__ = ["load_results", "prepare_output_file", "failures_path", "ResultSink", "read_run", "repair_tail",
           "parse_lines", "check_same_run", "check_result_file"]


def load_results(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of a result file, in file order (a line cut short by a kill is skipped).

    Each record is a dict: ``Episode.from_dict(record)`` rebuilds the episode; the keys
    ``episode_id``, ``status`` and ``run`` describe where it belongs.
    """
    return [rec for _, rec in parse_lines(Path(path), strict=True)]


def prepare_output_file(path: str | os.PathLike[str], *, resume: bool = False) -> Path:
    """Make sure results can be appended to ``path`` before any work starts: create its folder
    and open it for appending (an existing file is left as it is; a new one is created empty).

    With ``resume``, an existing ``path`` is first checked to be a result file
    (:func:`check_result_file`); one that is not is refused before it is opened, byte for byte
    as it was.

    Raises:
        ConfigError: ``path`` is a folder, or (``resume``) a file that is not a result file.
        OSError: The folder cannot be created or the file cannot be written (a read-only or
            pseudo file system such as ``/proc``, a parent that is a file, no permission, a full
            disk); the ``collab-env`` command reports it on one line with the path.
    """
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"--out {path} is a folder; give a file path such as {path / 'results.jsonl'}.")
    if resume:
        check_result_file(path)
        check_result_file(failures_path(path))
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




class ResultSink:
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
        # episode_id first: a line cut short then starts with _RECORD_START (check_result_file).
        # ASCII-escaped like Episode.to_json, so any text (even lone surrogates) round-trips.
        record = {"episode_id": record["episode_id"], **record}
        f.write(json.dumps(record, ensure_ascii=True) + "\n")
        f.flush()
        os.fsync(f.fileno())

    def close(self) -> None:
        for f in self.files.values():
            f.close()


#: How every record line begins (``json.dumps`` of a dict whose first key is ``episode_id``):
#: a last line cut short by a kill is a prefix of a line that begins so.
_RECORD_START = b'{"episode_id": '


def check_result_file(path: str | os.PathLike[str], run: Mapping[str, Any] | None = None) -> None:
    """Refuse, without changing a byte, a file that resuming must not append to or repair.

    Every complete line must be a JSON object with run settings (and, given ``run``, the settings
    of this run), and a last line without its newline must be the start of a record (what a kill
    in the middle of a write leaves; :func:`repair_tail` drops it). A missing or empty file passes.

    Raises:
        ConfigError: The file is not a result file (a text file, another JSON...), is damaged, or
            was written by another run. The message names the path and the line, and says the file
            was left as it was.
    """
    path = Path(path)
    if not path.is_file() or path.stat().st_size == 0:
        return
    for line, rec in parse_lines(path, strict=True):
        check_same_run(path, line, rec.get("run"), run)
    data = path.read_bytes()
    tail = data[data.rfind(b"\n") + 1:]
    if tail.strip() and not (tail.startswith(_RECORD_START) or _RECORD_START.startswith(tail)):
        line = data.count(b"\n") + 1
        raise ConfigError(
            f"{path}, line {line} (the last, without a newline) is not the start of a result record, so "
            "the file is not a collab-env result file (or was edited); it was left as it was. Use "
            "another --out path."
        )


def repair_tail(path: Path) -> bool:
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


def parse_lines(path: Path, *, strict: bool) -> list[tuple[int, dict[str, Any]]]:
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
            problem = depth_problem(raw)
            if problem is not None:  # before the reader: it recurses once per level
                raise ValueError(problem)
            rec = json.loads(raw)
            if not isinstance(rec, dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:
            if strict:
                raise ConfigError(
                    f"{path}, line {i} is not a result record ({_reason(exc)}); the file is damaged "
                    "or is not a collab-env result file, and was left as it was. Use another --out path."
                ) from exc
            continue
        out.append((i, rec))
    return out


def _reason(exc: ValueError) -> str:
    if isinstance(exc, UnicodeDecodeError):
        return f"byte 0x{exc.object[exc.start]:02x} at offset {exc.start} of the line is not UTF-8"
    return str(exc)


def read_run(path: Path, run: Mapping[str, Any]) -> dict[int, Episode]:
    """The finished episodes recorded in ``path`` for this run; refuse a different run's file
    (or one that is not a result file) before changing anything in it."""
    check_result_file(path, run)
    repair_tail(path)
    episodes: dict[int, Episode] = {}
    for line, rec in parse_lines(path, strict=True):
        check_same_run(path, line, rec.get("run"), run)
        if rec.get("status") != "ok":
            continue
        k = rec.get("episode_id")
        if isinstance(k, int) and k not in episodes:
            episodes[k] = Episode.from_dict(rec)
    return episodes


def check_same_run(path: Path, line: int, found: Any, run: Mapping[str, Any] | None) -> None:
    """Refuse a record without run settings, or (given ``run``) with other settings."""
    if not isinstance(found, Mapping):
        raise ConfigError(
            f"{path}, line {line} has no run settings; it was not written by collab_env.eval, and "
            "was left as it was. Use another --out path."
        )
    if run is None:
        return
    diffs = [
        f"{key}: file has {found.get(key)!r}, this run has {run[key]!r}"
        for key in run
        if found.get(key) != run[key]
    ]
    if diffs:
        raise ConfigError(
            f"cannot resume {path}: it was written by a different run ("
            + "; ".join(diffs)
            + "); it was left as it was. Resume with the same settings, or write to another --out path."
        )

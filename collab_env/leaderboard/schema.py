"""The shape of the board data (:func:`collab_env.leaderboard.board_data`), checked.

:func:`validate_board_data` raises a :class:`~collab_env.errors.ConfigError` naming the first
path that is wrong (``entries[2].metrics.reward.lo: expected a number, got 'x'``). Keys beyond
those listed are allowed (the board may carry more, e.g. an entry's ``cost_unit``); the listed
ones must be present with these types. Numbers must be finite except where ``null`` is allowed.
The page (:mod:`collab_env.leaderboard.page`) may call it on its input.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from collab_env.errors import ConfigError

__all__ = ["validate_board_data", "check_shape", "BOARD_SHAPE", "REJECTED_SHAPE"]

NUM = "number"
INT = "int"
STR = "str"
BOOL = "bool"
ANY = "any"

_STAT = {"mean": NUM, "lo": NUM, "hi": NUM, "n": INT}
_PASS = {"mean": NUM, "lo": NUM, "hi": NUM}
_TURN = {"player": STR, "text": STR, "reward": (NUM, None), "components": {"*": NUM}}
_TRAJ = {"episode": INT, "task": STR, "seed": INT, "hidden_goal": ANY, "reward": NUM, "success": BOOL,
         "turns": [_TURN]}

#: The board's shape: dicts list their keys, ``[x]`` is a list of x, ``{"*": x}`` a mapping of
#: any keys to x, a tuple is "one of", ``None`` allows null.
BOARD_SHAPE: dict[str, Any] = {
    "generated": STR,
    "code_version": STR,
    "tracks": [{"id": STR, "env_id": STR, "version": INT, "status": ("current", "legacy"), "title": STR,
                "description": STR, "metrics": [STR], "k": INT, "seeds": INT, "episodes": INT,
                "user": STR, "judge": (STR, None), "user_identity": STR, "judge_identity": (STR, None)}],
    "entries": [{"id": STR, "track": STR, "name": STR, "model": STR, "kind": ("standard", "custom"),
                 "verified": BOOL, "metrics": {"*": _STAT}, "pass_k": {"*": _PASS},
                 "cost_per_episode": (NUM, None), "simulator_fault_rate": NUM, "judge_fault_rate": NUM,
                 "seeds": INT, "episodes": INT, "trajectories": [_TRAJ],
                 "simulator": {"user": STR, "judge": (STR, None)}, "trials": INT,
                 "flip_rate": (NUM, None), "flip_tasks": INT, "mdd": (NUM, None)}],
    "comparisons": [{"track": STR, "a": STR, "b": STR, "metric": STR, "diff": NUM, "lo": NUM, "hi": NUM,
                     "n": INT, "distinguishable": BOOL}],
}
#: Folders the build could not list as entries (unreadable submission.json, unknown track):
#: optional in older board data.
REJECTED_SHAPE = [{"path": STR, "reason": STR}]


def check_shape(x: Any, shape: Any, path: str) -> None:
    """Raise :class:`ConfigError` naming ``path`` when ``x`` does not have ``shape`` (one part of
    the board, e.g. one entry against ``BOARD_SHAPE["entries"][0]``)."""
    _check(x, shape, path)


def _check(x: Any, shape: Any, path: str) -> None:
    if isinstance(shape, tuple):
        errors = []
        for option in shape:
            if option is None:
                if x is None:
                    return
                continue
            if isinstance(option, str) and option not in (NUM, INT, STR, BOOL, ANY):
                if x == option:
                    return
                errors.append(repr(option))
                continue
            try:
                _check(x, option, path)
                return
            except ConfigError:
                errors.append(str(option))
        expected = ", ".join(errors + (["null"] if None in shape else []))
        raise ConfigError(f"{path}: expected one of {expected}, got {x!r:.80}.")
    if shape == ANY:
        try:
            json.dumps(x, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{path}: not plain JSON ({exc}).") from exc
        return
    if shape == NUM:
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
            raise ConfigError(f"{path}: expected a finite number, got {x!r:.80}.")
        return
    if shape == INT:
        if isinstance(x, bool) or not isinstance(x, int):
            raise ConfigError(f"{path}: expected an int, got {x!r:.80}.")
        return
    if shape == STR:
        if not isinstance(x, str):
            raise ConfigError(f"{path}: expected a string, got {x!r:.80}.")
        return
    if shape == BOOL:
        if not isinstance(x, bool):
            raise ConfigError(f"{path}: expected true or false, got {x!r:.80}.")
        return
    if isinstance(shape, list):
        if not isinstance(x, list):
            raise ConfigError(f"{path}: expected a list, got {type(x).__name__}.")
        for i, item in enumerate(x):
            _check(item, shape[0], f"{path}[{i}]")
        return
    if isinstance(shape, dict):
        if not isinstance(x, Mapping):
            raise ConfigError(f"{path}: expected an object, got {type(x).__name__}.")
        if "*" in shape:
            for k, v in x.items():
                if not isinstance(k, str):
                    raise ConfigError(f"{path}: keys must be strings, got {k!r}.")
                _check(v, shape["*"], f"{path}.{k}")
            return
        for k, sub in shape.items():
            if k not in x:
                raise ConfigError(f"{path}.{k}: missing." if path else f"{k}: missing.")
            _check(x[k], sub, f"{path}.{k}" if path else k)
        return
    raise TypeError(f"bad shape {shape!r}")  # a bug in BOARD_SHAPE, not in the data


def validate_board_data(d: Any) -> None:
    """Check that ``d`` has the board's shape (:data:`BOARD_SHAPE`) and cross-references:
    every entry's track is a listed track, every comparison names listed entries, pass^k keys
    are ``"1".."k"``, and the whole is plain JSON.

    Raises:
        ConfigError: The first problem, with its path.
    """
    _check(d, BOARD_SHAPE, "")
    if "rejected" in d:
        _check(d["rejected"], REJECTED_SHAPE, "rejected")
    try:
        json.dumps(d, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"board data is not plain JSON ({exc}).") from exc
    track_ids = [t["id"] for t in d["tracks"]]
    if len(set(track_ids)) != len(track_ids):
        raise ConfigError("tracks: duplicate track ids.")
    ks = {t["id"]: t["k"] for t in d["tracks"]}
    entry_ids = set()
    for i, e in enumerate(d["entries"]):
        if e["track"] not in ks:
            raise ConfigError(f"entries[{i}].track: {e['track']!r} is not among the tracks {track_ids}.")
        if e["id"] in entry_ids:
            raise ConfigError(f"entries[{i}].id: duplicate entry id {e['id']!r}.")
        entry_ids.add(e["id"])
        bad = [k for k in e["pass_k"] if not k.isdigit() or not 1 <= int(k) <= ks[e["track"]]]
        if bad:
            raise ConfigError(f"entries[{i}].pass_k: keys {bad} are not in 1..{ks[e['track']]}.")
        for name, s in e["metrics"].items():
            if not s["lo"] <= s["hi"]:
                raise ConfigError(f"entries[{i}].metrics.{name}: interval [{s['lo']}, {s['hi']}] has lo > hi.")
    for i, c in enumerate(d["comparisons"]):
        if c["distinguishable"] != (not c["lo"] <= 0.0 <= c["hi"]):
            raise ConfigError(f"comparisons[{i}].distinguishable: {c['distinguishable']} but the interval is "
                              f"[{c['lo']}, {c['hi']}] (distinguishable means it excludes 0).")
        for side in ("a", "b"):
            if c[side] not in entry_ids:
                raise ConfigError(f"comparisons[{i}].{side}: {c[side]!r} is not an entry id.")

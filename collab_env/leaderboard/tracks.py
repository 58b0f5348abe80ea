"""Tracks: the fixed conditions a leaderboard entry is played under, as data.

A track is a JSON file in ``collab_env/leaderboard/tracks/`` named ``<name>@v<version>.json``.
It fixes everything but the submitted policy:

* the environment: ``env_id`` (a versioned id) and ``env_kwargs`` (the split, the number of items);
* the players the submission does *not* provide (``players``: the user simulator, a partner),
  each a scripted policy or an LLM user simulator on a named backend, with its sampling;
* the ``judge`` of judge-scored metrics (``null`` when the reward is rule-based);
* the episodes: ``tasks`` distinct task items, each played ``trials`` times; episode ``k``
  resets with seed ``seed + k`` on item ``k % tasks`` (the eval runner's mapping);
* ``k`` (pass^1 .. pass^k are reported), ``success_threshold`` (an episode succeeds when the
  submitted players' mean return reaches it) and the ``metrics`` shown.

``kind`` is ``"offline"`` (rule-based or scripted players, or the embedded model: runs without
network) or ``"api"`` (an API model plays the user or judges: needs a key).

Versions
    The *fixed fields* (:data:`FIXED_FIELDS`) are hashed (:meth:`Track.content_hash`); the hash
    of every published version is kept in ``tracks/LOCK.json``, and a test fails when a track's
    content no longer matches its locked hash. Changing a fixed field therefore means a new file
    with the next version (the old one stays, listed as ``"legacy"``); the title and description
    may be edited in place. A submission records the hash of the track it was played on, and
    ``verify`` refuses one whose hash differs from the registered track's.

Your own tracks
    A track of your own is a file of the same form. ``collab-env leaderboard run my-track.json``
    plays it; keep it in a folder of track files named ``<id>.json`` (``my-track@v1.json``),
    either ``tracks/`` inside the board folder (``build`` and ``verify`` find it there, and
    ``verify`` looks for it in the ancestors of the submission folder) or any folder given as
    ``--tracks DIR``. :func:`user_tracks` reads such a folder; an id of a built-in track is
    refused there. A submission names its track by id only (:func:`resolve_track`), never by path.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from collab_env.errors import ConfigError, UnknownEnvError, did_you_mean

__all__ = [
    "Track",
    "FIXED_FIELDS",
    "TRACKS_DIR",
    "LOCK_FILE",
    "load_track_file",
    "builtin_tracks",
    "get_track",
    "track_status",
    "locked_hashes",
    "MIN_STANDARD_TRIALS",
    "TRACK_ID",
    "TRACKS_FOLDER",
    "MAX_TRACK_FILE_BYTES",
    "user_tracks",
    "find_tracks_dir",
    "known_tracks",
    "resolve_track",
    "fixed_spec",
    "CONNECTION_FIELDS",
]

#: Folder of the built-in track files.
TRACKS_DIR = Path(__file__).with_name("tracks")
#: ``{track id: content hash}`` of every published track version.
LOCK_FILE = TRACKS_DIR / "LOCK.json"

#: Trials per task a track needs before an entry on it can be *standard*: with fewer, a row's
#: flip rate and minimum detectable difference rest on too little (issue 24). Every current
#: track has at least this many; legacy ones with fewer take custom entries only.
MIN_STANDARD_TRIALS = 4
#: Fields that define what an entry is measured on: changing one needs a new version.
FIXED_FIELDS = (
    "env_id", "env_kwargs", "kind", "submitted", "players", "judge", "seed", "tasks", "trials",
    "k", "success_threshold", "metrics",
)
_KINDS = ("offline", "api")
#: Where a fixed role's backend is served: passed, as given, to the backend's
#: :class:`~collab_env.policy.PolicySpec` (the key itself never: its variable's name).
CONNECTION_FIELDS = ("api_base", "api_key_env")
_PLAYER_KEYS = ("policy", "simulator", "backend", "options", "sampling", *CONNECTION_FIELDS)
_JUDGE_KEYS = ("backend", "reward", "options", *CONNECTION_FIELDS)
#: A track id: ``<name>@v<version>`` (what a submission's ``track`` field must be).
TRACK_ID = re.compile(r"^[a-z0-9][a-z0-9-]{0,99}@v[1-9][0-9]{0,5}$")
#: The folder of a board's own track files (``<board>/tracks/<id>.json``).
TRACKS_FOLDER = "tracks"
#: The largest track file read (bytes); a larger one is refused unread.
MAX_TRACK_FILE_BYTES = 1 << 20
_NAME = re.compile(r"^[a-z0-9][a-z0-9-]*$")
#: The metrics a track may show (see :mod:`collab_env.leaderboard.stats`).
KNOWN_METRICS = ("success", "reward", "turns", "tokens", "interactivity", "token_amount",
                 "accuracy", "accuracy_rule", "bleu_score", "pass_rate", "length_ratio",
                 "aptitude", "unreliability")


@dataclass(frozen=True)
class Track:
    """One version of a leaderboard track.

    Args:
        name: The track's name (``hidden-facts-easy``); with the version it makes the id.
        version: Version number, from 1; a new one for any change of a fixed field.
        title: A short title for tables.
        description: What the track measures, in a sentence or two.
        kind: ``"offline"`` or ``"api"``.
        env_id: The versioned env id (``hidden-facts-easy-v2``).
        env_kwargs: Keyword arguments of :func:`collab_env.make` (JSON values only).
        submitted: The players whose policy the submission provides.
        players: Every other player -> how it is played: ``{"policy": ref}`` (a scripted or
            registered policy), or ``{"simulator": "llm-user", "backend": ref, "options": {...},
            "sampling": {...}}`` (an LLM user simulator whose backend calls are recorded).
            Either form may name the backend's server: ``"api_base": URL`` and
            ``"api_key_env": VAR`` (the variable that holds the key, never the key), as
            ``--api-base``/``--api-key-env`` do for a submitted player (:func:`fixed_spec`).
        judge: ``None``, or ``{"backend": ref, "reward": "conversation", "options": {...}}``
            (with ``api_base``/``api_key_env`` too): the judge model of the judge metrics, its
            calls recorded.
        seed: Base seed: episode ``k`` resets with ``seed + k``.
        tasks: Distinct task items (the env must have exactly this many items), or ``None``
            for tracks on data files: every item of the files given (the submission records
            the files' SHA-256 and the item count).
        trials: Episodes per task (distinct seeds); ``episodes = tasks * trials``.
        k: Largest k of pass^k (``<= trials``).
        success_threshold: An episode succeeds when its reward reaches this value.
        metrics: The metrics shown, in order (:data:`KNOWN_METRICS`).
        data: For tracks that read data files: where to get them (shown to submitters).
    """

    name: str
    version: int
    title: str
    description: str
    kind: str
    env_id: str
    env_kwargs: Mapping[str, Any]
    submitted: tuple[str, ...]
    players: Mapping[str, Mapping[str, Any]]
    judge: Mapping[str, Any] | None
    seed: int
    tasks: int | None
    trials: int
    k: int
    success_threshold: float
    metrics: tuple[str, ...]
    data: str | None = None
    source: Path | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        where = f"track {self.name!r}" + (f" ({self.source})" if self.source else "")
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ConfigError(f"{where}: name must be lower-case letters, digits and '-', got {self.name!r}.")
        for key in ("version", "seed", "tasks", "trials", "k"):
            v = getattr(self, key)
            if key == "tasks" and v is None:
                continue
            low = 0 if key == "seed" else 1
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ConfigError(f"{where}: {key} must be an int >= {low}, got {v!r}.")
        if self.k > self.trials:
            raise ConfigError(f"{where}: k={self.k} needs at least k trials per task; trials={self.trials}.")
        if self.kind not in _KINDS:
            raise ConfigError(f"{where}: kind must be one of {_KINDS}, got {self.kind!r}.")
        if not re.search(r"-v\d+$", str(self.env_id)):
            raise ConfigError(f"{where}: env_id must be a versioned id such as 'hidden-facts-v2', got {self.env_id!r}.")
        if not self.submitted:
            raise ConfigError(f"{where}: submitted must name at least one player.")
        for p, how in self.players.items():
            if p in self.submitted:
                raise ConfigError(f"{where}: player {p!r} is both submitted and fixed by the track.")
            if not isinstance(how, Mapping) or ("policy" in how) == ("simulator" in how):
                raise ConfigError(f"{where}: player {p!r} needs exactly one of 'policy' or 'simulator', got {how!r}.")
            if "simulator" in how and ("backend" not in how or how["simulator"] != "llm-user"):
                raise ConfigError(f"{where}: player {p!r}: a simulator is "
                                  f"{{'simulator': 'llm-user', 'backend': ref}}, got {how!r}.")
        if self.judge is not None and "backend" not in self.judge:
            raise ConfigError(f"{where}: judge must be null or {{'backend': ref, ...}}, got {self.judge!r}.")
        for role, how, keys in [*((p, h, _PLAYER_KEYS) for p, h in self.players.items()),
                                *([("judge", self.judge, _JUDGE_KEYS)] if self.judge is not None else [])]:
            unknown = sorted(set(how) - set(keys))
            if unknown:
                hint = (" A track names the environment variable that holds the key (api_key_env), never the key."
                        if "api_key" in unknown else did_you_mean(str(unknown[0]), keys))
                raise ConfigError(f"{where}: {role} has unknown key(s) {unknown}; valid: {list(keys)}." + hint)
            try:
                fixed_spec(how)
            except ConfigError as exc:
                raise ConfigError(f"{where}: {role}: {exc}") from None
        unknown = [m for m in self.metrics if m not in KNOWN_METRICS]
        if unknown or not self.metrics:
            raise ConfigError(f"{where}: unknown metrics {unknown}; known: {list(KNOWN_METRICS)}.")
        try:
            json.dumps(self.fixed(), allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{where}: fixed fields must be plain JSON ({exc}).") from exc

    @property
    def id(self) -> str:
        """``<name>@v<version>``, e.g. ``hidden-facts-easy@v1``."""
        return f"{self.name}@v{self.version}"

    @property
    def episodes(self) -> int | None:
        """Episodes of a full submission: ``tasks * trials`` (``None`` when ``tasks`` is)."""
        return None if self.tasks is None else self.tasks * self.trials

    @property
    def user(self) -> str:
        """A short description of the fixed players (for tables)."""
        parts = []
        for p, how in self.players.items():
            if "policy" in how:
                parts.append(f"{p}: {how['policy']}")
            else:
                parts.append(f"{p}: llm-user({how['backend']})")
        return "; ".join(parts) or "-"

    @property
    def judge_name(self) -> str | None:
        """The judge backend's name, or ``None``."""
        return None if self.judge is None else str(self.judge["backend"])

    def fixed(self) -> dict[str, Any]:
        """The fixed fields as plain JSON (what the hash covers)."""
        out: dict[str, Any] = {}
        for key in FIXED_FIELDS:
            v = getattr(self, key)
            out[key] = list(v) if isinstance(v, tuple) else v
        return json.loads(json.dumps(out, sort_keys=True))

    def content_hash(self) -> str:
        """SHA-256 of the canonical JSON of the fixed fields and the id."""
        payload = {"name": self.name, "version": self.version, **self.fixed()}
        text = json.dumps(payload, sort_keys=True, ensure_ascii=True, separators=(",", ":"))
        return hashlib.sha256(text.encode("ascii")).hexdigest()

    def to_dict(self) -> dict[str, Any]:
        """The track file's content."""
        return {"name": self.name, "version": self.version, "title": self.title,
                "description": self.description, **self.fixed(), "data": self.data}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], source: Path | None = None) -> Track:
        """A track from a file's content; unknown or missing keys are errors."""
        names = {f for f in cls.__dataclass_fields__ if f != "source"}
        where = f"track file {source}" if source else "track"
        unknown = sorted(set(d) - names)
        if unknown:
            raise ConfigError(f"{where}: unknown keys {unknown}; a track has {sorted(names)}.")
        required = names - {"data"}
        missing = sorted(required - set(d))
        if missing:
            raise ConfigError(f"{where}: missing keys {missing}.")
        kw = dict(d)
        kw["submitted"] = tuple(kw["submitted"])
        kw["metrics"] = tuple(kw["metrics"])
        kw["success_threshold"] = float(kw["success_threshold"])
        return cls(**kw, source=source)


def fixed_spec(how: Mapping[str, Any]) -> Any:
    """The policy reference of a track's fixed role (a player's or the judge's mapping): its
    ``backend`` (or ``policy``) string, or, when the mapping names a server (``api_base``,
    ``api_key_env``: :data:`CONNECTION_FIELDS`), a :class:`~collab_env.policy.PolicySpec` with
    them, the same path ``--api-base ROLE=URL`` takes on the command line.

    Raises:
        ConfigError: A connection setting that is not a non-empty string, or an ``api_base``
            that is not an http(s) URL.
    """
    ref = str(how["backend"] if "backend" in how else how["policy"])
    if not any(how.get(k) is not None for k in CONNECTION_FIELDS):
        return ref
    from collab_env.policy import policy_spec

    for k in CONNECTION_FIELDS:
        if k in how and (not isinstance(how[k], str) or not how[k].strip()):
            raise ConfigError(f"{k} must be a non-empty string, got {how[k]!r}.")
    return policy_spec(ref, api_base=how.get("api_base"), api_key_env=how.get("api_key_env"))


def load_track_file(path: str | Path) -> Track:
    """Read one track file (JSON).

    Raises:
        ConfigError: The file is not a valid track, or its name does not match its id.
    """
    from collab_env._json import loads

    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise ConfigError(f"track file {path} cannot be read ({exc.strerror or exc}).") from None
    if size > MAX_TRACK_FILE_BYTES:
        raise ConfigError(f"track file {path} is {size} bytes, over the {MAX_TRACK_FILE_BYTES} a track file may "
                          "have; refused unread.")
    d = loads(path.read_bytes(), f"track file {path}")
    if not isinstance(d, dict):
        raise ConfigError(f"track file {path} must hold a JSON object.")
    t = Track.from_dict(d, source=path)
    if path.parent == TRACKS_DIR and path.stem != t.id:
        raise ConfigError(f"track file {path} holds {t.id}; name it {t.id}.json.")
    return t


@lru_cache(maxsize=1)
def builtin_tracks() -> dict[str, Track]:
    """Every built-in track version, by id (sorted by name, then version)."""
    tracks = [load_track_file(p) for p in sorted(TRACKS_DIR.glob("*@v*.json"))]
    return {t.id: t for t in sorted(tracks, key=lambda t: (t.name, t.version))}


def locked_hashes() -> dict[str, str]:
    """``{track id: hash}`` from ``tracks/LOCK.json``."""
    return dict(json.loads(LOCK_FILE.read_text(encoding="utf-8")))


def track_status(track: Track, tracks: Mapping[str, Track] | None = None) -> str:
    """``"current"`` for the newest version of its name, ``"legacy"`` for older ones."""
    tracks = builtin_tracks() if tracks is None else tracks
    newest = max((t.version for t in tracks.values() if t.name == track.name), default=track.version)
    return "current" if track.version >= newest else "legacy"


def user_tracks(folder: str | os.PathLike[str] | None) -> dict[str, Track]:
    """The tracks of a folder of track files (``<id>.json`` each), by id; ``{}`` when ``folder``
    is ``None`` or does not exist.

    Raises:
        ConfigError: A file that is not a track, is not named after its id, or takes the id of a
            built-in track.
    """
    if folder is None or not Path(folder).is_dir():
        return {}
    builtin = builtin_tracks()
    out: dict[str, Track] = {}
    for path in sorted(Path(folder).glob("*.json")):
        if path.name == LOCK_FILE.name:
            continue
        t = load_track_file(path)
        if path.stem != t.id:
            raise ConfigError(f"track file {path} holds {t.id}; in a tracks folder name it {t.id}.json.")
        if t.id in builtin and Path(folder).resolve() != TRACKS_DIR.resolve():
            raise ConfigError(f"track file {path} takes the id of the built-in track {t.id}; give your track "
                              "another name.")
        out[t.id] = t
    return out


def find_tracks_dir(start: str | os.PathLike[str], levels: int = 4) -> Path | None:
    """The nearest ``tracks/`` folder holding track files beside ``start`` or one of its
    ancestors (at most ``levels`` up): where ``verify`` finds the board's own tracks."""
    here = Path(start).resolve()
    for folder in [here, *here.parents][: levels + 1]:
        candidate = folder / TRACKS_FOLDER
        if candidate.is_dir() and candidate.resolve() != TRACKS_DIR.resolve() and any(candidate.glob("*@v*.json")):
            return candidate
    return None


def known_tracks(tracks_dir: str | os.PathLike[str] | None = None) -> dict[str, Track]:
    """The built-in tracks and those of ``tracks_dir`` (:func:`user_tracks`), by id."""
    return {**builtin_tracks(), **user_tracks(tracks_dir)}


def resolve_track(ref: Any, tracks: Mapping[str, Track]) -> Track:
    """The track a submission names: ``ref`` must be a track id (:data:`TRACK_ID`) among
    ``tracks``. Never a path: a submission's field never makes the builder open a file.

    Raises:
        UnknownEnvError: Not such an id (the message says what a track id is).
    """
    if not isinstance(ref, str) or not TRACK_ID.match(ref):
        raise UnknownEnvError(f"the submission's track {str(ref)[:80]!r} is not a track id (name@vN, e.g. "
                              "hidden-facts-easy@v2); a submission names its track by id, never by path.")
    if ref not in tracks:
        raise UnknownEnvError(f"no leaderboard track {ref!r}: not a built-in track, nor one of the board's "
                              f"{TRACKS_FOLDER}/ folder (or --tracks DIR)." + did_you_mean(ref, sorted(tracks)))
    return tracks[ref]


def get_track(ref: str | Path, tracks_dir: str | os.PathLike[str] | None = None) -> Track:
    """A track by id (``hidden-facts-easy@v1``), by name (its current version) or by a path
    to a track file (what a person types; a submission's field goes through
    :func:`resolve_track` instead). ``tracks_dir``: a folder of your own track files, searched
    too (:func:`user_tracks`).

    Raises:
        UnknownEnvError: No such track (the message lists the ids).
    """
    text = str(ref)
    if text.endswith(".json") or Path(text).is_file():
        return load_track_file(text)
    tracks = known_tracks(tracks_dir)
    if text in tracks:
        return tracks[text]
    versions = [t for t in tracks.values() if t.name == text]
    if versions:
        return max(versions, key=lambda t: t.version)
    names = sorted({t.name for t in tracks.values()} | set(tracks))
    raise UnknownEnvError(f"no leaderboard track {text!r}; tracks: {sorted(tracks)}." + did_you_mean(text, names))

"""Record/replay cache of model calls, so that an evaluation can be re-run without any model.

:class:`ResponseCache` is a SQLite file of completions keyed by a content hash of the request;
:class:`CachedPolicy` wraps any :class:`~collab_env.policy.Policy` (usually the backend of a
user simulator or a judge) and consults it.

Modes
    * ``"record"``: a hit returns the stored completion without calling the backend; a miss calls
      the backend and stores what it returned.
    * ``"replay"``: a hit returns the stored completion; a miss raises :class:`CacheMissError`
      (naming the key and how to record it), so a replayed run never calls a model by accident.
    * ``"off"``: pass every call through; nothing is read or written.

Keys
    SHA-256 of a canonical JSON of (key version, model name, the messages' ``(role, content)``
    pairs, the full sampling parameters with defaults filled in). The model name is
    ``name_for_key`` (default: the backend's ``model`` attribute, else its ``name``); replay must
    use the same name as the recording. Because the sampling ``seed`` is part of the key, the same
    prompt asked twice under different seeds (the rollout passes ``seed + step``) is stored twice;
    without a seed, identical requests share one entry, as they should for a deterministic run.

Scoring
    :meth:`CachedPolicy.score_continuations` exists on every cached policy, and
    :func:`~collab_env.agents.base.can_score_continuations` of a cached policy is that of its
    backend (or the ``scoring=`` argument), so a judge on a cached local model scores by
    log-probs as it would on the bare model. Each observation's scores are one entry of the
    ``scores`` table, keyed by SHA-256 of (key version, ``"score"``, model name, the messages'
    ``(role, content)`` pairs, whether the last one is a prefill, the continuations in order);
    the value is the JSON list of floats, which reads back bit for bit (JSON writes a float's
    shortest repr). Misses in replay mode raise :class:`CacheMissError`, as for ``act``. Files
    recorded before this table existed gain it on first use; their responses are untouched.

What is stored
    ``Completion.to_dict()`` as JSON. A hit returns that completion unchanged, ``usage`` included
    (the cost of producing it when it was recorded), and a miss in record mode returns the same
    JSON round-trip of the fresh completion, so a recorded and a replayed run produce *equal*
    episodes. Cache traffic is counted on the cache (:attr:`ResponseCache.stats`), not in the
    completions. Fault completions (``finish_reason="fault"``) are never stored: they are
    transient and must be retried.

Concurrency
    The database runs in WAL mode with a ``busy_timeout``; writes are single ``INSERT OR
    IGNORE`` statements (first writer of a key wins, which is harmless since the key names the
    request). Several processes may record into one file at once. Each process (and each fork)
    opens its own connection; the object pickles without it.

Safety
    Reading a cache runs no code: the file is SQLite and every value is JSON text read back
    as plain data (no pickle anywhere). A file that is not such a database (a pickle, another
    program's file) is refused with a :class:`~collab_env.errors.ConfigError`, as is an entry
    whose JSON is damaged, nested more than :data:`MAX_DEPTH` deep, or not a completion's
    fields. The file and its ``-wal``, ``-shm`` and ``-journal`` companions must be regular
    files (a FIFO or device is refused before SQLite opens it, so nothing hangs), and a SQLite
    file of another program is refused before anything is written to it: a refused file is
    left as it was.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import stat
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from collab_env.agents.base import ContinuationScorer, can_score_continuations, check_continuations, is_prefilled
from collab_env.errors import CacheMissError, ConfigError, PolicyError
from collab_env.policy import Policy, SamplingParams, describe, resolve_policy
from collab_env.types import Completion, Conversation

__all__ = ["ResponseCache", "CachedPolicy", "request_key", "score_key", "KEY_VERSION",
           "MAX_DEPTH"]

#: Bump when the key recipe changes (old recordings then miss instead of matching wrongly).
KEY_VERSION = 1
_MODES = ("record", "replay", "off")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    key        TEXT PRIMARY KEY,
    model      TEXT NOT NULL,
    request    TEXT NOT NULL,
    completion TEXT NOT NULL,
    created    REAL NOT NULL
)
"""

# A separate table (not a key namespace in ``responses``): files recorded before scoring was
# cached keep their layout and gain this table on first use.
_SCORES_SCHEMA = """
CREATE TABLE IF NOT EXISTS scores (
    key     TEXT PRIMARY KEY,
    model   TEXT NOT NULL,
    request TEXT NOT NULL,
    scores  TEXT NOT NULL,
    created REAL NOT NULL
)
"""
_COLUMNS = {"responses": ["key", "model", "request", "completion", "created"],
            "scores": ["key", "model", "request", "scores", "created"]}
#: Deepest nesting of lists and dicts read from a stored entry (a completion needs 3).
MAX_DEPTH = 64
#: Files SQLite opens next to the database.
_COMPANIONS = ("", "-wal", "-shm", "-journal")
_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _loads_bounded(text: Any) -> Any:
    """JSON text read as plain data, nested at most :data:`MAX_DEPTH` deep (checked before it
    is parsed, by :func:`collab_env._json.depth_problem`); ``ValueError`` otherwise."""
    from collab_env._json import depth_problem

    if not isinstance(text, str):
        raise ValueError(f"the stored value is {type(text).__name__}, not JSON text")
    problem = depth_problem(text, limit=MAX_DEPTH)
    if problem is not None:
        raise ValueError(f"its lists and dicts are nested more than {MAX_DEPTH} deep")
    return json.loads(text)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _check_completion_dict(d: Any) -> None:
    """``ValueError`` unless ``d`` has the types ``Completion.to_dict()`` writes."""
    if not isinstance(d, dict):
        raise ValueError(f"expected a JSON object, got {type(d).__name__}")
    if not isinstance(d.get("text"), str):
        raise ValueError("its text is not a string")
    for name, ok in (("token_ids", lambda v: type(v) is int), ("prompt_token_ids", lambda v: type(v) is int),
                     ("logprobs", _is_number)):
        v = d.get(name)
        if v is not None and not (isinstance(v, list) and all(ok(x) for x in v)):
            raise ValueError(f"its {name} is not a list of numbers")
    if d.get("finish_reason") is not None and not isinstance(d["finish_reason"], str):
        raise ValueError("its finish_reason is not a string")
    for name in ("usage", "meta"):
        if name in d and not isinstance(d[name], dict):
            raise ValueError(f"its {name} is not a JSON object")


def _canonical_sampling(sampling: Mapping[str, Any]) -> dict[str, Any]:
    """Sampling with defaults filled in, so ``act(x)`` and ``act(x, temperature=1.0)`` share a
    key. Keys :class:`SamplingParams` does not know are kept as given (the backend judges them)."""
    known = {k: v for k, v in sampling.items() if k in SamplingParams.__dataclass_fields__}
    extra = {k: v for k, v in sampling.items() if k not in known}
    out = SamplingParams.from_kwargs(**known).to_dict()
    out.update(extra)
    return out


def request_payload(model: str, observation: Conversation, sampling: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON-friendly request that a key hashes (also stored next to the response)."""
    return {
        "v": KEY_VERSION,
        "model": model,
        "messages": [[m.role, m.content] for m in observation],
        "sampling": _canonical_sampling(sampling),
    }


def request_key(model: str, observation: Conversation, sampling: Mapping[str, Any]) -> str:
    """Stable hex key of one request (see the module docstring)."""
    payload = json.dumps(request_payload(model, observation, sampling), sort_keys=True,
                         ensure_ascii=True, separators=(",", ":"), default=str)
    return hashlib.sha256(payload.encode("ascii")).hexdigest()


def score_payload(model: str, observation: Conversation, continuations: Sequence[str]) -> dict[str, Any]:
    """The JSON-friendly scoring request that :func:`score_key` hashes (stored next to the scores)."""
    return {
        "v": KEY_VERSION,
        "kind": "score",
        "model": model,
        "messages": [[m.role, m.content] for m in observation],
        # A prefilled reply is continued, a plain final assistant message is not: other prompts.
        "prefill": is_prefilled(observation),
        "continuations": list(continuations),
    }


def score_key(model: str, observation: Conversation, continuations: Sequence[str]) -> str:
    """Stable hex key of scoring ``continuations`` after one observation (see the module docstring)."""
    payload = json.dumps(score_payload(model, observation, continuations), sort_keys=True,
                         ensure_ascii=True, separators=(",", ":"))
    return hashlib.sha256(payload.encode("ascii")).hexdigest()


def _roundtrip(completion: Completion) -> tuple[Completion, str]:
    """The completion as stored (JSON round-trip) and its JSON text."""
    text = json.dumps(completion.to_dict(), ensure_ascii=True, sort_keys=True)
    return Completion.from_dict(json.loads(text)), text


class ResponseCache:
    """A SQLite store of completions keyed by request hash.

    Args:
        path: Database file (created with its folder if missing). Unused in mode ``"off"``.
        mode: ``"record"``, ``"replay"`` or ``"off"`` (see the module docstring).
        busy_timeout_s: How long a writer waits for another process's lock before failing.

    Attributes:
        stats: In-process counters: ``hits``, ``misses``, ``writes``.
    """

    def __init__(self, path: str | os.PathLike[str], mode: Literal["record", "replay", "off"] = "record",
                 *, busy_timeout_s: float = 30.0) -> None:
        if mode not in _MODES:
            raise ConfigError(f"cache mode must be one of {_MODES}, got {mode!r}.")
        if busy_timeout_s <= 0:
            raise ConfigError(f"busy_timeout_s must be > 0, got {busy_timeout_s}.")
        self.path = Path(path)
        self.mode = mode
        self.busy_timeout_s = float(busy_timeout_s)
        self.stats = {"hits": 0, "misses": 0, "writes": 0}
        self._conn: sqlite3.Connection | None = None
        self._pid: int | None = None
        self._lock = threading.Lock()
        if mode == "replay" and not self.path.exists():
            raise ConfigError(
                f"replay cache {str(self.path)!r} does not exist; record it first with "
                f"ResponseCache({str(self.path)!r}, mode='record')."
            )
        if mode != "off":
            self._check_file_types()

    # -- connection -------------------------------------------------------------------------
    def _check_file_types(self) -> None:
        """Refuse a cache path (or a ``-wal``/``-shm``/``-journal`` companion SQLite would open)
        that exists but is not a regular file: SQLite would block on a FIFO and write into a
        device. Checked with ``os.stat``, which opens nothing."""
        for suffix in _COMPANIONS:
            path = Path(f"{self.path}{suffix}")
            try:
                mode = os.stat(path).st_mode
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise ConfigError(f"cannot use {str(self.path)!r} as a response cache: {str(path)!r} cannot be "
                                  f"read ({exc.strerror or exc}). Pass the cache you recorded, or a new path.") from exc
            if not stat.S_ISREG(mode):
                kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
                raise ConfigError(f"cannot use {str(self.path)!r} as a response cache: {str(path)!r} is {kind}, not "
                                  "a regular file, so it is not opened. Pass the SQLite file you recorded, or a new "
                                  "path to record into.")

    def _connect(self) -> sqlite3.Connection:
        # A connection must not cross a fork: reopen when the process changed.
        if self._conn is not None and self._pid == os.getpid():
            return self._conn
        self._check_file_types()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = None
        try:
            conn = sqlite3.connect(str(self.path), timeout=self.busy_timeout_s, isolation_level=None,
                                   check_same_thread=False)
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_s * 1000)}")
            # Read the layout first (the first read of the file's header): another program's
            # SQLite file is refused before the pragmas and tables below write to it.
            tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            columns = {t: [row[1] for row in conn.execute(f"PRAGMA table_info({t})")] for t in _COLUMNS}
            foreign = [t for t, want in _COLUMNS.items() if t in tables and columns[t] != want]
            if not foreign and tables and "responses" not in tables:
                foreign = ["responses"]
            if foreign:
                table = foreign[0]
                conn.close()
                found = (f"its {table} table has columns {columns[table]}" if table in tables
                         else f"it has no {table} table; its tables: {sorted(tables)[:8]}")
                raise ConfigError(f"{str(self.path)!r} is a SQLite file, but not a response cache ({found}); it was "
                                  "left as it was. Pass the cache you recorded, or a new path.")
            self._use_wal(conn)
            conn.execute("PRAGMA synchronous = NORMAL")  # WAL + NORMAL: durable at checkpoints, fast
            conn.execute(_SCHEMA)
            conn.execute(_SCORES_SCHEMA)
        except sqlite3.DatabaseError as exc:
            if conn is not None:
                conn.close()
            raise ConfigError(
                f"cannot use {str(self.path)!r} as a response cache ({exc}): it must be a SQLite file "
                "written by ResponseCache, in a folder you can write. Pass the cache you recorded, or a "
                "new path to record into."
            ) from exc
        self._conn, self._pid = conn, os.getpid()
        return conn

    def _use_wal(self, conn: sqlite3.Connection) -> None:
        """Put the file in WAL mode (persistent: done once per file). Changing the journal mode
        takes an exclusive lock for which SQLite may answer "database is locked" at once, without
        waiting out the busy timeout, while other processes open the same file (seen with 4
        writers starting together): so it is asked only when the file is not in WAL mode yet, and
        retried until ``busy_timeout_s`` has passed."""
        deadline = time.monotonic() + self.busy_timeout_s
        delay = 0.005
        while True:
            try:
                if str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
                    conn.execute("PRAGMA journal_mode = WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() >= deadline:
                    raise
            time.sleep(delay)
            delay = min(2 * delay, 0.2)

    def _completion(self, key: str, text: str) -> Completion:
        """A stored completion read back as plain data; damaged JSON is an error naming the key."""
        try:
            d = _loads_bounded(text)
            _check_completion_dict(d)
            return Completion.from_dict(d)
        except (TypeError, ValueError, KeyError) as exc:
            raise ConfigError(f"response cache {str(self.path)!r}: the entry for key {key} is damaged ({exc}); "
                              "record it again into a new cache file.") from exc

    def close(self) -> None:
        """Close this process's connection (it reopens on the next use)."""
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
            self._conn = None

    def __enter__(self) -> ResponseCache:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_conn"], state["_pid"], state["_lock"] = None, None, None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"ResponseCache({str(self.path)!r}, mode={self.mode!r})"

    # -- access -----------------------------------------------------------------------------
    def get(self, key: str) -> Completion | None:
        """The stored completion for ``key``, or ``None``."""
        with self._lock:
            row = self._connect().execute("SELECT completion FROM responses WHERE key = ?", (key,)).fetchone()
        if row is None:
            self.stats["misses"] += 1
            return None
        self.stats["hits"] += 1
        return self._completion(key, row[0])

    def put(self, key: str, request: Mapping[str, Any], completion: Completion) -> Completion:
        """Store ``completion`` under ``key`` (unless one is stored already); return the stored
        form. Faults are returned unstored."""
        if completion.is_fault:
            return completion
        stored, text = _roundtrip(completion)
        req = json.dumps(request, sort_keys=True, ensure_ascii=True, default=str)
        with self._lock:
            conn = self._connect()
            cur = conn.execute(
                "INSERT OR IGNORE INTO responses (key, model, request, completion, created) VALUES (?, ?, ?, ?, ?)",
                (key, str(request.get("model", "")), req, text, time.time()),
            )
            if cur.rowcount == 0:
                # Another writer stored this key first: everyone returns the same, first answer.
                row = conn.execute("SELECT completion FROM responses WHERE key = ?", (key,)).fetchone()
                return self._completion(key, row[0])
        self.stats["writes"] += 1
        return stored

    def get_scores(self, key: str, n: int) -> tuple[float, ...] | None:
        """The stored scores for ``key`` (``n`` floats), or ``None``.

        Raises:
            ConfigError: The entry is damaged or holds another number of scores than ``n`` (a
                key collision is not credible: the key covers the continuations).
        """
        with self._lock:
            row = self._connect().execute("SELECT scores FROM scores WHERE key = ?", (key,)).fetchone()
        if row is None:
            self.stats["misses"] += 1
            return None
        self.stats["hits"] += 1
        return self._scores(key, row[0], n)

    def put_scores(self, key: str, request: Mapping[str, Any], scores: Sequence[float]) -> tuple[float, ...]:
        """Store ``scores`` under ``key`` (unless some are stored already); return the stored
        scores (the first writer's, when another process stored the key first)."""
        values = [float(x) for x in scores]
        text = json.dumps(values)  # repr of each float: read back bit for bit
        req = json.dumps(request, sort_keys=True, ensure_ascii=True)
        with self._lock:
            conn = self._connect()
            cur = conn.execute(
                "INSERT OR IGNORE INTO scores (key, model, request, scores, created) VALUES (?, ?, ?, ?, ?)",
                (key, str(request.get("model", "")), req, text, time.time()),
            )
            if cur.rowcount == 0:
                row = conn.execute("SELECT scores FROM scores WHERE key = ?", (key,)).fetchone()
                return self._scores(key, row[0], len(values))
        self.stats["writes"] += 1
        return tuple(values)

    def _scores(self, key: str, text: str, n: int) -> tuple[float, ...]:
        try:
            values = _loads_bounded(text)
            if (not isinstance(values, list) or len(values) != n
                    or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in values)):
                raise ValueError(f"expected a list of {n} numbers, got {text[:80]!r}")
        except ValueError as exc:
            raise ConfigError(f"response cache {str(self.path)!r}: the scores for key {key} are damaged ({exc}); "
                              "record them again into a new cache file.") from exc
        return tuple(float(x) for x in values)

    def num_scores(self) -> int:
        """How many scoring entries (one per observation scored) the file holds."""
        with self._lock:
            return int(self._connect().execute("SELECT COUNT(*) FROM scores").fetchone()[0])

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return self._connect().execute("SELECT 1 FROM responses WHERE key = ?", (key,)).fetchone() is not None

    def __len__(self) -> int:
        with self._lock:
            return int(self._connect().execute("SELECT COUNT(*) FROM responses").fetchone()[0])

    def keys(self) -> Iterator[str]:
        """Every stored key."""
        with self._lock:
            rows = self._connect().execute("SELECT key FROM responses ORDER BY created, key").fetchall()
        return iter(r[0] for r in rows)


class CachedPolicy:
    """Any policy behind a :class:`ResponseCache` (record, replay or off).

    Args:
        backend: The policy to call on a miss (an object or a reference accepted by
            :func:`~collab_env.policy.resolve_policy`). In replay mode it is never called.
        cache: The cache, or a path (then opened in ``mode``).
        mode: Only with a path: the cache mode.
        name_for_key: The model name in every key (default: the backend's ``model`` attribute
            when it is a string, as on the litellm backend, else its ``name``). Set it explicitly
            when the replaying backend differs from the recording one.
        name: Name for logs (default ``cached(<name_for_key>)``).
        scoring: Whether :meth:`score_continuations` is usable (what
            :func:`~collab_env.agents.base.can_score_continuations` says of this policy).
            ``None`` (default): as the backend. ``True`` lets a replay behind a stand-in backend
            that cannot score (never called in replay mode) answer the log-prob judgements a
            local model recorded; outside replay mode it needs a backend that can score.

    Raises:
        ConfigError: ``scoring=True`` outside replay mode with a backend that cannot score.
    """

    def __init__(self, backend: Policy | str, cache: ResponseCache | str | os.PathLike[str], *,
                 mode: Literal["record", "replay", "off"] | None = None, name_for_key: str | None = None,
                 name: str | None = None, scoring: bool | None = None) -> None:
        self.backend = resolve_policy(backend)
        if isinstance(cache, ResponseCache):
            if mode is not None and mode != cache.mode:
                raise ConfigError(f"mode={mode!r} conflicts with the cache's own mode {cache.mode!r}; "
                                  "pass one or the other.")
            self.cache = cache
        else:
            self.cache = ResponseCache(cache, mode or "record")
        model = getattr(self.backend, "model", None)
        # Only a model *name* identifies the model (an HF backend's .model is the torch module).
        self.name_for_key = name_for_key or (model if isinstance(model, str) and model else describe(self.backend))
        # Named after the key's model, not the backend object: a replay (whose backend may be
        # a stub) then reports the same policy name as the recording.
        self.name = name or f"cached({self.name_for_key})"
        backend_scores = can_score_continuations(self.backend)
        if scoring and not backend_scores and self.cache.mode != "replay":
            raise ConfigError(
                f"scoring=True, but the backend {describe(self.backend)} cannot score continuations and "
                f"the cache is in {self.cache.mode!r} mode, where misses call it. Use a local backend "
                "(HF, embedded, vLLM), or leave scoring=None."
            )
        self._scoring = backend_scores if scoring is None else bool(scoring)

    @property
    def supports_prefill(self) -> bool:
        """As the backend: prompts (and so cache keys) are built the same way when recording
        and when replaying with the same kind of backend."""
        return bool(getattr(self.backend, "supports_prefill", False))

    @property
    def scores_continuations(self) -> bool:
        """Whether :meth:`score_continuations` is usable: as the backend unless ``scoring=``
        said otherwise (read by :func:`~collab_env.agents.base.can_score_continuations`)."""
        return self._scoring

    def __repr__(self) -> str:
        return f"CachedPolicy({describe(self.backend)!r}, {self.cache!r})"

    async def act(self, observations: Sequence[Conversation], **sampling: Any) -> list[Completion]:
        """Completions from the cache where recorded; the misses in one batched backend call.

        Raises:
            CacheMissError: Replay mode, and a request was never recorded.
        """
        cache = self.cache
        if cache.mode == "off":
            return await self.backend.act(observations, **sampling)
        payloads = [request_payload(self.name_for_key, o, sampling) for o in observations]
        keys = [request_key(self.name_for_key, o, sampling) for o in observations]
        results: list[Completion | None] = [cache.get(k) for k in keys]
        misses = [i for i, r in enumerate(results) if r is None]
        if misses and cache.mode == "replay":
            i = misses[0]
            last = observations[i][-1].content if len(observations[i]) else ""
            raise CacheMissError(
                f"replay cache {str(cache.path)!r} has no response for {len(misses)} request(s) of "
                f"{self.name_for_key!r}; first key {keys[i]} (last message {last[:80]!r}, sampling "
                f"{payloads[i]['sampling']}). Record it by running the same evaluation with "
                f"ResponseCache({str(cache.path)!r}, mode='record'), with the same name_for_key, "
                "prompts and seeds."
            )
        if misses:
            outs = await self.backend.act([observations[i] for i in misses], **sampling)
            if not isinstance(outs, list) or len(outs) != len(misses):
                raise PolicyError(f"backend {describe(self.backend)} returned {outs!r:.200} for "
                                  f"{len(misses)} observation(s).")
            for i, out in zip(misses, outs, strict=True):
                results[i] = cache.put(keys[i], payloads[i], out)
        return list(results)  # type: ignore[arg-type]

    async def score_continuations(
        self, observations: Sequence[Conversation], continuations: Sequence[Sequence[str]]
    ) -> list[tuple[float, ...]]:
        """The backend's log-probs of the continuations (see
        :class:`~collab_env.agents.base.ContinuationScorer`), from the cache where recorded;
        the misses in one backend call. Values come back exactly as the backend gave them.

        Raises:
            ConfigError: This policy cannot score (:attr:`scores_continuations` is false), or
                the continuations are malformed.
            CacheMissError: Replay mode, and a scoring request was never recorded.
        """
        check_continuations(observations, continuations)
        if not self._scoring:
            raise ConfigError(
                f"{self.name}: the backend {describe(self.backend)} cannot score continuations (API "
                "backends cannot; the HF, embedded and vLLM backends can). Check "
                "can_score_continuations(policy) first, as judges do."
            )
        cache = self.cache
        scorer = self.backend
        if cache.mode == "off":
            assert isinstance(scorer, ContinuationScorer)  # scoring outside replay needs a scorer (__init__)
            return await scorer.score_continuations(observations, continuations)
        conts = [list(c) for c in continuations]
        payloads = [score_payload(self.name_for_key, o, c) for o, c in zip(observations, conts, strict=True)]
        keys = [score_key(self.name_for_key, o, c) for o, c in zip(observations, conts, strict=True)]
        results: list[tuple[float, ...] | None] = [
            cache.get_scores(k, len(c)) for k, c in zip(keys, conts, strict=True)]
        misses = [i for i, r in enumerate(results) if r is None]
        if misses and cache.mode == "replay":
            i = misses[0]
            last = observations[i][-1].content if len(observations[i]) else ""
            raise CacheMissError(
                f"replay cache {str(cache.path)!r} has no scores for {len(misses)} scoring request(s) of "
                f"{self.name_for_key!r}; first key {keys[i]} (last message {last[:80]!r}, "
                f"{len(conts[i])} continuation(s) starting {conts[i][0][:40]!r}). Record it by running "
                f"the same evaluation with ResponseCache({str(cache.path)!r}, mode='record') on a backend "
                "that scores continuations, with the same name_for_key and prompts."
            )
        if misses:  # not in replay mode (raised above): scoring needs a scorer here (__init__)
            assert isinstance(scorer, ContinuationScorer)
            outs = await scorer.score_continuations([observations[i] for i in misses],
                                                    [conts[i] for i in misses])
            if not isinstance(outs, list) or len(outs) != len(misses) or not all(
                    len(row) == len(conts[i]) for i, row in zip(misses, outs, strict=True)):
                raise PolicyError(f"backend {describe(self.backend)} returned {outs!r:.200} when scoring "
                                  f"{len(misses)} observation(s).")
            for i, row in zip(misses, outs, strict=True):
                results[i] = cache.put_scores(keys[i], payloads[i], row)
        return list(results)  # type: ignore[arg-type]

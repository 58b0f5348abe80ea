"""Loading CollabLLM rows: local parquet / json / jsonl files, a dataset directory, or the hub.

:func:`load_collabllm_dataset` reads the rows and checks the required columns of the schema
documented in :mod:`collab_env.tasks.collabllm`. Without ``data_files`` the rows come from the
Hugging Face Hub: with ``HF_HUB_OFFLINE`` / ``HF_DATASETS_OFFLINE`` set only the local cache is
used; otherwise the hub endpoint is probed first (3 s TCP connect) and an unreachable hub raises
:class:`~collab_env.errors.DatasetUnavailableError` at once, saying what to do instead.
``datasets`` is imported only when rows are loaded.
"""

from __future__ import annotations

import os
import socket
import threading
import warnings
from collections.abc import Mapping, Sequence
from pathlib import PurePath
from typing import Any
from urllib.parse import urlparse

from collab_env.errors import ConfigError, DataSchemaError, DatasetUnavailableError
from collab_env.tasks.collabllm_rows import OPTIONAL_COLUMNS, REQUIRED_COLUMNS, is_rl_layout, schema_row_from_rl

__all__ = ["load_collabllm_dataset", "check_data_files", "data_file_list", "check_utf8", "check_nesting"]

_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet"}
_COMPRESSION = (".gz", ".bz2", ".xz", ".zst", ".zip")
_TRUE = ("1", "true", "yes", "on")
_PROBE_TIMEOUT_S = 3.0

_OFFLINE_HINT = (
    "To run without the hub, pass data_files= with a local copy in the documented schema "
    "(parquet, json or jsonl; see the collab_env.tasks.collabllm docstring), e.g. "
    "collab_env.make('collabllm-math-hard', data_files='math-hard.parquet'), or use the offline "
    "suites 'hidden-facts' / 'length-ratio'. Set HF_DATASETS_OFFLINE=1 (and HF_HUB_OFFLINE=1) "
    "to skip network access altogether."
)


# ---------------------------------------------------------------------------------------------
# data_files
# ---------------------------------------------------------------------------------------------
def check_data_files(data_files: Any) -> str | list[str] | dict[str, Any] | None:
    """``data_files`` as given to :class:`~collab_env.tasks.collabllm.CollabLLMConfig` and
    :func:`load_collabllm_dataset`, normalised: paths become ``str``, lists and ``{split: paths}``
    dicts are checked entry by entry; ``None`` stays ``None``.

    Raises:
        ConfigError: An empty list or dict, or a value that is not a path, a list of paths or a
            ``{split: paths}`` dict.
    """
    if data_files is None:
        return None
    if isinstance(data_files, (str, os.PathLike)):
        return os.fspath(data_files)
    if isinstance(data_files, Mapping):
        if not data_files:
            raise ConfigError("data_files={} names no file; pass a path, a list or {split: path}.")
        return {str(k): check_data_files(v) for k, v in data_files.items()}
    if isinstance(data_files, Sequence) and not isinstance(data_files, bytes):
        if not data_files:
            raise ConfigError("data_files=[] names no file; pass at least one path.")
        out = []
        for f in data_files:
            if not isinstance(f, (str, os.PathLike)):
                raise ConfigError(f"data_files entries must be paths, got {type(f).__name__}.")
            out.append(os.fspath(f))
        return out
    raise ConfigError(
        f"data_files must be a path, a list of paths or a {{split: paths}} dict, got {type(data_files).__name__}."
    )


def data_file_list(data_files: str | list[str] | dict[str, Any]) -> list[str]:
    """Every path of normalised ``data_files`` (see :func:`check_data_files`) in one flat list,
    in order (the values of a ``{split: paths}`` dict one after the other)."""
    if isinstance(data_files, str):
        return [data_files]
    if isinstance(data_files, Mapping):
        return [f for v in data_files.values() for f in data_file_list(v)]
    return list(data_files)


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------
def _builder_for(files: list[str]) -> str:
    """The ``datasets`` builder for the files' extension (compression suffixes ignored)."""
    builders = set()
    for f in files:
        suffixes = [s.lower() for s in PurePath(f).suffixes]
        while suffixes and suffixes[-1] in _COMPRESSION:
            suffixes.pop()
        ext = suffixes[-1] if suffixes else ""
        if ext not in _BUILDERS:
            raise ConfigError(
                f"cannot tell the format of data file {f!r} from its extension {ext or '(none)'!r}; "
                f"supported: {sorted(_BUILDERS)} (optionally compressed)."
            )
        builders.add(_BUILDERS[ext])
    if len(builders) > 1:
        raise ConfigError(f"data_files mix formats {sorted(builders)}; pass files of one format.")
    return builders.pop()


_OPENERS = {".gz": "gzip", ".bz2": "bz2", ".xz": "lzma"}


def check_utf8(path: str, *, where: str = "collabllm") -> None:
    """Refuse a local JSON / JSONL data file that is not UTF-8 text, naming the first byte that
    is not (its offset and line), before ``datasets`` reads it: its JSON reader would otherwise
    fail with a bare "An error occurred while generating the dataset", or load the bytes and let
    the first row read fail later with a bare ``UnicodeDecodeError``. ``.gz``, ``.bz2`` and
    ``.xz`` files are checked decompressed; other paths (globs, URLs) are left to ``datasets``.

    Raises:
        DataSchemaError: The file holds bytes that are not UTF-8.
    """
    import codecs
    import importlib

    local = os.path.expanduser(path)
    if not os.path.isfile(local):
        return
    suffix = PurePath(local).suffix.lower()
    if suffix in _OPENERS:
        opener = importlib.import_module(_OPENERS[suffix]).open
    elif suffix in _COMPRESSION:  # .zst, .zip: not read here
        return
    else:
        opener = open
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    offset = 0  # bytes of the file before ``chunk``
    lines = 1
    with opener(local, "rb") as f:
        while True:
            chunk = f.read(1 << 20)
            pending = len(decoder.getstate()[0])  # an unfinished character from the last chunk
            try:
                decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as exc:
                at = offset - pending + exc.start
                lines += chunk[: max(0, exc.start - pending)].count(b"\n")
                raise DataSchemaError(
                    f"{where}: data file {path} is not UTF-8 text: byte 0x{exc.object[exc.start]:02x} at offset "
                    f"{at} (line {lines}) is not valid UTF-8 ({exc.reason}). Re-encode the file as UTF-8 "
                    "(e.g. iconv -f latin1 -t utf-8 IN > OUT, with the file's real encoding) and pass it again."
                ) from None
            if not chunk:
                return
            lines += chunk.count(b"\n")
            offset += len(chunk)


def check_nesting(path: str, *, where: str = "collabllm") -> None:
    """Refuse a local data file whose rows nest lists and objects deeper than
    :data:`collab_env._json.MAX_DEPTH`, before any reader sees a row: the JSON readers recurse
    once per level (a 5,000-deep row is a bare ``RecursionError``, a 100,000-deep one crashes the
    process inside pyarrow's reader). JSON / JSONL files (``.gz``, ``.bz2``, ``.xz`` read
    decompressed) are scanned as text, naming the line; a parquet file by its schema (the footer
    only), naming the column. Other paths (globs, URLs, ``.zst``) are left to ``datasets``.

    Raises:
        DataSchemaError: A row (a column) nests too deep, or the parquet footer cannot be read.
    """
    import importlib

    from collab_env._json import MAX_DEPTH, check_depth

    local = os.path.expanduser(path)
    if not os.path.isfile(local):
        return
    suffixes = [x.lower() for x in PurePath(local).suffixes]
    fix = "Flatten that row or remove it from the file."
    if suffixes and suffixes[-1] == ".parquet":
        import pyarrow.parquet as pq

        try:
            schema = pq.read_schema(local)
        except Exception as exc:  # noqa: BLE001 - pyarrow's own depth limit, a damaged footer
            raise DataSchemaError(f"{where}: data file {path} is not a readable parquet file "
                                  f"({type(exc).__name__}: {str(exc)[:200]}).") from None
        for f in schema:
            depth = _arrow_depth(f.type)
            if depth + 1 > MAX_DEPTH:  # + 1: the row itself, as in a JSON line
                raise DataSchemaError(f"{where}: data file {path}, column {f.name!r} nests lists and structs "
                                      f"{depth} deep, over the limit of {MAX_DEPTH - 1}. {fix}")
        return
    if suffixes and suffixes[-1] in _OPENERS:
        opener = importlib.import_module(_OPENERS[suffixes[-1]]).open
        suffixes.pop()
    elif suffixes and suffixes[-1] in _COMPRESSION:
        return
    else:
        opener = open
    with opener(local, "rb") as fh:
        data = fh.read()
    check_depth(data, f"{where}: data file {path}", lines=bool(suffixes) and suffixes[-1] == ".jsonl",
                error=DataSchemaError, fix=fix)


def _arrow_depth(t: Any) -> int:
    """How deep an arrow type nests lists, structs and maps (walked without recursion)."""
    deepest, stack = 0, [(t, 0)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if deepest > 10 * 1024:  # pragma: no cover - pyarrow refuses such schemas first
            break
        kids = [node.field(i).type for i in range(node.num_fields)] if node.num_fields else []
        stack.extend((k, depth + 1) for k in kids)
    return deepest


def _json_problem(path: str) -> str | None:
    """Why local JSON / JSONL file ``path`` cannot be read, said with its line: empty, or the
    first line that is not JSON (a ``.json`` file may hold one JSON document or JSON lines).
    ``None`` when no such reason is found (the caller then reports the reader's own error)."""
    import json

    local = os.path.expanduser(path)
    if not os.path.isfile(local) or PurePath(local).suffix.lower() not in (".json", ".jsonl"):
        return None
    with open(local, "rb") as f:
        data = f.read()
    if not data.strip():
        return f"data file {path} is empty: it holds no rows. Pass a file with rows in the documented schema."
    try:
        json.loads(data)
        return None  # one JSON document: not a syntax problem
    except ValueError:
        pass
    for number, line in enumerate(data.split(b"\n"), 1):
        if not line.strip():
            continue
        try:
            json.loads(line)
        except ValueError as exc:
            return (f"data file {path}, line {number} is not JSON ({exc}): every line must be one JSON "
                    "object (a row). Fix or remove that line.")
    return None


def _env_offline() -> bool:
    return any(os.environ.get(k, "").strip().lower() in _TRUE for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


class _ForceOffline:
    """Make ``datasets`` and ``huggingface_hub`` honour offline flags set after their import.

    Both libraries read ``HF_HUB_OFFLINE`` once, at import; a flag set later (a notebook, a
    test's monkeypatch) would otherwise still mean ~25 s of network retries. The constants are
    restored on exit. Not thread-safe: two loads racing may see each other's setting, which is
    harmless since both asked for offline mode.
    """

    def __enter__(self) -> None:
        import datasets.config
        import huggingface_hub.constants

        self._saved = (datasets.config.HF_HUB_OFFLINE, huggingface_hub.constants.HF_HUB_OFFLINE)
        datasets.config.HF_HUB_OFFLINE = True
        huggingface_hub.constants.HF_HUB_OFFLINE = True

    def __exit__(self, *exc: Any) -> None:
        import datasets.config
        import huggingface_hub.constants

        datasets.config.HF_HUB_OFFLINE, huggingface_hub.constants.HF_HUB_OFFLINE = self._saved


def _hub_endpoint() -> str:
    from huggingface_hub import constants

    return os.environ.get("HF_ENDPOINT") or constants.ENDPOINT


def _probe(endpoint: str, timeout: float = _PROBE_TIMEOUT_S) -> str | None:
    """``None`` when a TCP connection to ``endpoint`` opens within ``timeout``, else why not.

    Runs in a daemon thread so that a slow DNS lookup (which ``socket`` timeouts do not bound)
    cannot hold ``make`` longer than ``timeout``.
    """
    url = urlparse(endpoint)
    host = url.hostname
    if not host:
        return f"cannot parse the hub endpoint {endpoint!r}"
    port = url.port or (443 if url.scheme == "https" else 80)
    result: list[str | None] = []

    def connect() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            result.append(None)
        except OSError as exc:
            result.append(f"{type(exc).__name__}: {exc}")

    t = threading.Thread(target=connect, name="collabllm-hub-probe", daemon=True)
    t.start()
    t.join(timeout)
    if not result:
        return f"no answer within {timeout:.0f} s"
    return result[0]


def load_collabllm_dataset(dataset: str, data_files: Any = None, split: str | None = "train",
                           *, num_proc: int | None = None):
    """Load CollabLLM rows as a ``datasets.Dataset`` and check the required columns.

    Files of RL rows (the recipe's ``process_dataset.py`` output, or ``collab-env data
    --dataset_type rl``: columns ``prompt``, ``reward_model``, ``extra_info``) are read back into
    the schema (:func:`~collab_env.tasks.collabllm_rows.schema_row_from_rl`), so an env plays the
    very rows a trainer trains on (their ``prompt`` keeps its system message).

    Args:
        dataset: Hub id (``"collabllm/collabllm-multiturn-math-hard"``) or a local dataset
            directory; ignored when ``data_files`` is given.
        data_files: Local parquet/json/jsonl file(s): a path, a list or a ``{split: paths}`` dict.
        split: Split to return; ``None``: every split, concatenated in name order.
        num_proc: Worker processes ``datasets`` reads the files with (``None``: one).

    Returns:
        The ``datasets.Dataset`` of that split.

    Raises:
        DatasetUnavailableError: The hub is unreachable or offline without a cached copy, or a
            file does not exist. The message says how to run offline.
        DataSchemaError: A file cannot be parsed, or a required column is missing.
        ConfigError: Unknown file format or split.
    """
    import datasets  # a core dependency, imported here to keep ``import collab_env`` light

    data_files = check_data_files(data_files)
    if data_files is not None:
        files = data_file_list(data_files)
        source = ", ".join(files)
        builder = _builder_for(files)
        for f in files:
            if os.path.isdir(os.path.expanduser(f)):
                raise ConfigError(
                    f"collabllm: data file {f} is a folder; pass the files inside it (e.g. "
                    f"data_files='{os.path.join(f, '*.jsonl')}'), or the folder as the dataset (dataset='{f}')."
                )
            if builder == "json":
                check_utf8(f)
            check_nesting(f)
        try:
            loaded = datasets.load_dataset(builder, data_files=data_files, num_proc=num_proc)
        except FileNotFoundError as exc:
            raise DatasetUnavailableError(
                f"collabllm: data file not found ({source}): {exc}. Check the path(s) given as data_files=."
            ) from exc
        except Exception as exc:  # parse errors of every kind: report as a schema problem
            problem = next(filter(None, map(_json_problem, files)), None) if builder == "json" else None
            if problem is not None:
                raise DataSchemaError(f"collabllm: {problem}") from exc
            raise DataSchemaError(
                f"collabllm: cannot read {source} as {builder}: {type(exc).__name__}: {exc}. "
                "The files must hold rows in the schema documented in collab_env.tasks.collabllm."
            ) from exc
    else:
        source = dataset
        if os.path.isdir(os.path.expanduser(dataset)):
            for root, _, names in os.walk(os.path.expanduser(dataset)):
                for name in sorted(names):
                    if PurePath(name).suffix.lower() in _BUILDERS:
                        check_nesting(os.path.join(root, name))
            # ``datasets`` caches a local folder under its name and card, not its files' content:
            # a folder rewritten (or another folder of the same name) would be read from the stale
            # cache. Local files are cheap to prepare again, so they always are.
            loaded = datasets.load_dataset(os.path.expanduser(dataset), num_proc=num_proc,
                                           download_mode="force_redownload", verification_mode="no_checks")
        else:
            loaded = _load_from_hub(datasets, dataset, num_proc)

    if split is None:
        if len(loaded) > 1 and any("test" in k.lower() for k in loaded):
            warnings.warn(
                f"collabllm: {source}: every split is read, {sorted(loaded)} (the verl recipe's rule), so "
                "rows of its test split go into the training files, and the collabllm-* leaderboard tracks "
                "play that test split; pass split='train' (collab-env data --split train) to keep them out.",
                UserWarning, stacklevel=2)
        parts = [loaded[k] for k in sorted(loaded)]
        ds = parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)
    elif split not in loaded:
        raise ConfigError(f"collabllm: {source} has no split {split!r}; splits: {sorted(loaded)}.")
    else:
        ds = loaded[split]
    if is_rl_layout(ds.column_names):
        ds = datasets.Dataset.from_list(
            [schema_row_from_rl(row, where=f"collabllm: {source}, row {i}") for i, row in enumerate(ds)])
    missing = [c for c in REQUIRED_COLUMNS if c not in ds.column_names]
    if missing:
        raise DataSchemaError(
            f"collabllm: {source} lacks required column(s) {missing} (it has {ds.column_names}). "
            f"Required: {list(REQUIRED_COLUMNS)}; optional: {list(OPTIONAL_COLUMNS)}."
        )
    if len(ds) == 0:
        raise DataSchemaError(f"collabllm: {source} (split {split!r}) has no rows.")
    return ds


def _load_from_hub(datasets: Any, dataset: str, num_proc: int | None = None):
    """``load_dataset(dataset)`` that fails within seconds when the hub cannot be used."""
    if _env_offline() or datasets.config.HF_HUB_OFFLINE:
        try:
            with _ForceOffline():
                return datasets.load_dataset(dataset, num_proc=num_proc)
        except Exception as exc:
            raise DatasetUnavailableError(
                f"collabllm: offline mode is on (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE) and "
                f"{dataset!r} is not in the local Hugging Face cache ({type(exc).__name__}: {exc}). "
                + _OFFLINE_HINT
            ) from exc
    endpoint = _hub_endpoint()
    # Through a proxy a direct connection says nothing about reachability: skip the probe.
    proxied = any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY"))
    if not proxied:
        why = _probe(endpoint)
        if why is not None:
            raise DatasetUnavailableError(
                f"collabllm: the Hugging Face Hub ({endpoint}) is unreachable ({why}), so "
                f"{dataset!r} cannot be downloaded. " + _OFFLINE_HINT
            )
    try:
        return datasets.load_dataset(dataset, num_proc=num_proc)
    except Exception as exc:
        raise DatasetUnavailableError(
            f"collabllm: cannot load {dataset!r} from the Hugging Face Hub ({type(exc).__name__}: {exc}). "
            + _OFFLINE_HINT
        ) from exc


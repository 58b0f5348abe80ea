"""Playing a track: ``collab-env leaderboard run TRACK --policy PLAYER=SPEC``.

:func:`run_submission` plays every episode of a track through the eval runner
(:func:`collab_env.eval.evaluate`: seeded, concurrent, each finished episode flushed to disk,
resumable) and writes a submission folder:

``trajectories.jsonl``
    The eval runner's result file: one line per finished episode (the whole transcript, every
    move's completion, rewards and their components, costs, the run settings).
``trajectories.jsonl.failures.jsonl``
    Episodes that raised (only when some did); they are retried by the next run.
``calls.sqlite``
    The record/replay cache (:class:`collab_env.agents.cache.ResponseCache`) of every call the
    track's LLM user simulators and judge made (tracks whose fixed players are scripted make
    none; the file is then absent).
``submission.json``
    What was played (track id, version and hash, the policies, their sampling, the model's
    name), the code version, the cost, the faults of the environment's own players (simulator
    faults, judge faults, failed episodes), the SHA-256 of the files above, and whether the
    entry is *standard* or *custom* (:func:`entry_kind`). Written last, atomically: a folder
    without it is a run still in progress.

Resume
    Running the same command again on the same ``--out`` continues the run: the eval runner keeps
    the episodes already recorded (a line cut short by a kill is dropped and redone) and plays only
    the missing ones; the cache answers the calls it already holds. A folder written for another
    track, policy or sampling is refused.

Policy specs
    As ``collab-env eval`` (an alias, ``module:Class``, ``<backend>:<model>``), plus
    ``proactive(SPEC)``: SPEC wrapped in :class:`~collab_env.agents.proactive.Proactive`
    (CollabLLM's prompting baseline). A wrapper that changes the prompts makes the entry custom.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collab_env.errors import ConfigError, did_you_mean
from collab_env.leaderboard.tracks import MIN_STANDARD_TRIALS, Track, fixed_spec, get_track

__all__ = [
    "SUBMISSION_FILE",
    "TRAJECTORIES_FILE",
    "CACHE_FILE",
    "FORMAT",
    "run_submission",
    "build_policy",
    "fixed_players",
    "FixedPlayers",
    "code_version",
    "file_sha256",
    "entry_kind",
    "episode_faults",
    "submitted_usage",
    "load_submission",
    "data_file_digests",
    "track_env_kwargs",
    "submission_files",
    "SUBMISSION_FILES",
    "MAX_FILE_BYTES",
    "MAX_SUBMISSION_BYTES",
    "FIELD_LIMITS",
    "check_page_fields",
]

SUBMISSION_FILE = "submission.json"
TRAJECTORIES_FILE = "trajectories.jsonl"
CACHE_FILE = "calls.sqlite"
#: Version of the submission.json layout.
FORMAT = 1

_WRAPPED = re.compile(r"^(?P<wrapper>[a-z]+)\((?P<inner>.+)\)$")
#: Wrappers a policy spec may name, and why each makes an entry custom.
WRAPPERS = {"proactive": "the Proactive wrapper adds a collaborative system prompt to the policy's observations"}


def build_policy(player: str, spec: Any) -> tuple[Any, str | None]:
    """The policy of a submitted player from its spec (a string, or a
    :class:`~collab_env.policy.PolicySpec` with connection settings: ``--api-base``), and why it
    makes the entry custom (``None`` for an unmodified policy).

    Raises:
        ConfigError: An unknown wrapper or a policy that cannot be loaded.
    """
    from collab_env.eval import load_policy
    from collab_env.policy import PolicySpec

    text = spec.spec_string if isinstance(spec, PolicySpec) else str(spec)
    m = _WRAPPED.match(text.strip())
    if m is None:
        return load_policy(player, spec), None
    wrapper, inner = m["wrapper"], m["inner"]
    if wrapper not in WRAPPERS:
        raise ConfigError(f"--policy {player}={spec}: unknown wrapper {wrapper!r}; wrappers: "
                          f"{sorted(WRAPPERS)} (e.g. proactive(embedded))." + did_you_mean(wrapper, WRAPPERS))
    from collab_env.agents.proactive import Proactive

    # a spec's connection settings reach the wrapped policy's backend
    inner_spec = spec.replace(backend=inner) if isinstance(spec, PolicySpec) else inner
    return Proactive(load_policy(player, inner_spec), name=f"{wrapper}({inner})"), WRAPPERS[wrapper]


class _NoCalls:
    """The backend behind a replay cache during verification: it is never called (a miss is a
    :class:`~collab_env.errors.CacheMissError`), and it reports the recorded backend's
    capabilities, so prompts are built exactly as when recording."""

    def __init__(self, name: str, supports_prefill: bool, scores: bool) -> None:
        self.name = name
        self.supports_prefill = supports_prefill
        self.scores_continuations = scores

    async def act(self, observations: Any, **sampling: Any) -> list[Any]:
        raise ConfigError(f"verification called the model {self.name!r}; it may only replay recorded calls.")

    async def score_continuations(self, observations: Any, continuations: Any) -> list[Any]:
        raise ConfigError(f"verification asked the model {self.name!r} to score; it may only replay recorded calls.")


@dataclass
class FixedPlayers:
    """The track's own players and judge, built for a run or a verification.

    Args:
        policies: Player -> policy (object or reference).
        sampling: Player -> sampling keywords.
        env_kwargs: Extra env keyword arguments (the judge's reward).
        backends: Backend name -> ``{"supports_prefill", "scores"}``.
        cache: The cache of their calls, or ``None``.
    """

    policies: dict[str, Any]
    sampling: dict[str, dict[str, Any]]
    env_kwargs: dict[str, Any]
    backends: dict[str, Any]
    cache: Any = None

    def close(self) -> None:
        """Close the cache's connection (its write-ahead log is folded into the file)."""
        if self.cache is not None:
            self.cache.close()


def fixed_players(track: Track, cache_path: Path | None, *, mode: str = "record",
                  backends: Mapping[str, Mapping[str, Any]] | None = None) -> FixedPlayers:
    """The track's own players and judge, ready for the eval runner.

    Args:
        track: The track.
        cache_path: The cache file of the simulators' and judge's calls (``None``: the track
            has none, which is an error if it needs one).
        mode: ``"record"`` (a run) or ``"replay"`` (verification: no model is loaded or called).
        backends: For replay: backend name -> ``{"supports_prefill", "scores"}`` as recorded.

    Returns:
        The :class:`FixedPlayers`.
    """
    from collab_env.policy import resolve_policy

    policies: dict[str, Any] = {}
    sampling: dict[str, dict[str, Any]] = {}
    env_kwargs: dict[str, Any] = {}
    info: dict[str, Any] = {}
    cache = None
    loaded: dict[str, Any] = {}

    def cached(how: Mapping[str, Any]) -> Any:
        nonlocal cache
        ref = str(how["backend"])  # the calls are keyed by the model, wherever it is served
        from collab_env.agents.base import can_score_continuations
        from collab_env.agents.cache import CachedPolicy, ResponseCache

        if cache_path is None:
            raise ConfigError(f"track {track.id} records model calls: it needs a cache file.")
        if cache is None:
            cache = ResponseCache(cache_path, mode)  # type: ignore[arg-type]
        if ref not in loaded:
            if mode == "replay":
                caps = dict((backends or {}).get(ref) or {})
                if not caps:
                    raise ConfigError(f"the submission records no calls of the backend {ref!r} that track "
                                      f"{track.id} uses: the track's players or judge differ from the run's.")
                backend: Any = _NoCalls(ref, bool(caps.get("supports_prefill")), bool(caps.get("scores")))
                loaded[ref] = CachedPolicy(backend, cache, name_for_key=ref, scoring=bool(caps.get("scores")))
            else:
                backend = resolve_policy(fixed_spec(how))
                loaded[ref] = CachedPolicy(backend, cache, name_for_key=ref)
            info[ref] = {"supports_prefill": bool(getattr(loaded[ref], "supports_prefill", False)),
                         "scores": bool(can_score_continuations(loaded[ref]))}
        return loaded[ref]

    for player, how in track.players.items():
        if "policy" in how:
            policies[player] = fixed_spec(how)
        else:
            from collab_env.agents.users import LLMUserSimulator

            policies[player] = LLMUserSimulator(cached(how), **dict(how.get("options") or {}))
        if how.get("sampling"):
            sampling[player] = dict(how["sampling"])
    if track.judge is not None:
        env_kwargs["reward"] = track.judge.get("reward", "conversation")
        # the track's own reward keywords (weights, say) stay; the judge is the track's
        env_kwargs["reward_kwargs"] = {**dict(env_kwargs.get("reward_kwargs") or {}),
                                       "judge": cached(track.judge),
                                       **dict(track.judge.get("options") or {})}
    return FixedPlayers(policies, sampling, env_kwargs, info, cache)


def code_version(root: str | os.PathLike[str] | None = None) -> str:
    """The git commit of the collab_env checkout (``+dirty`` when tracked files under
    ``collab_env/``, ``agents/`` or ``adapters/`` have uncommitted changes: the code that played
    is then not that commit), else the installed package's version. ``root``: the checkout
    (default: the one this module is in)."""
    root = Path(root) if root is not None else Path(__file__).resolve().parents[2]
    if (root / ".git").exists():
        try:
            def git(*args: str) -> str:
                return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                                      timeout=10, check=True).stdout.strip()

            sha = git("rev-parse", "HEAD")
            if sha:
                dirty = git("status", "--porcelain", "--untracked-files=no", "--",
                            "collab_env", "agents", "adapters")
                return sha + ("+dirty" if dirty else "")
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        from importlib.metadata import version

        return version("collab-env")
    except Exception:  # noqa: BLE001 - not installed: say so rather than guess
        return "unknown"


def file_sha256(path: str | os.PathLike[str]) -> str:
    """SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def entry_kind(reasons: Sequence[str]) -> str:
    """``"standard"`` when nothing was changed (unmodified prompts and track, no omitted or
    failed task: what τ²-bench calls verified-eligible), else ``"custom"``."""
    return "custom" if reasons else "standard"


def submitted_usage(record: Mapping[str, Any], submitted: Sequence[str]) -> dict[str, float]:
    """The submitted players' model usage in one episode record: ``model_calls``,
    ``prompt_tokens``, ``completion_tokens`` and ``cost`` (dollars, where the provider said)."""
    out = {"model_calls": 0.0, "prompt_tokens": 0.0, "completion_tokens": 0.0, "cost": 0.0}
    for t in record.get("turns", []):
        comp = t.get("completion")
        if t.get("player") in submitted and comp:
            usage = comp.get("usage") or {}
            for key in out:
                v = usage.get(key)
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    out[key] += float(v)
    return out


def episode_faults(record: Mapping[str, Any], submitted: Sequence[str]) -> dict[str, int]:
    """Faults in one finished episode: ``simulator`` (a fixed player, e.g. the user simulator,
    gave up and ended the episode) and ``policy`` (a submitted player gave up)."""
    sim = pol = 0
    for f in (record.get("info") or {}).get("faults", []) or []:
        if f.get("player") in submitted:
            pol += 1
        else:
            sim += 1
    return {"simulator": sim, "policy": pol}


#: The files a submission folder may hold besides ``submission.json``, by key of its
#: ``"files"`` block: every one present is hashed there, and ``verify`` refuses any other file.
SUBMISSION_FILES = {"trajectories": TRAJECTORIES_FILE, "failures": TRAJECTORIES_FILE + ".failures.jsonl",
                    "cache": CACHE_FILE}
#: The largest file ``verify`` reads (bytes); a larger one is refused unread.
MAX_FILE_BYTES = 512 * 2**20


def submission_files(folder: Path) -> dict[str, dict[str, Any]]:
    """The ``"files"`` block of ``submission.json``: for every file of :data:`SUBMISSION_FILES`
    present in ``folder``, its name, size and SHA-256 (the integrity digest of the folder)."""
    out = {}
    for key, name in SUBMISSION_FILES.items():
        f = Path(folder) / name
        if f.is_file() and not f.is_symlink():
            out[key] = {"file": name, "bytes": f.stat().st_size, "sha256": file_sha256(f)}
    return out


def track_env_kwargs(t: Track, fixed: Mapping[str, Any], data_files: Sequence[str] | None) -> dict[str, Any]:
    """The keyword arguments of ``make(t.env_id, ...)`` for a run or a replay of ``t``: the
    track's ``env_kwargs``, the fixed players' (``fixed``), and the local ``data_files``. The
    files passed for a track that names a ``split`` *are* that split (``{split: files}``): a
    single file would otherwise load as ``"train"`` and the track's ``"test"`` would not be
    found."""
    kwargs = {**dict(t.env_kwargs), **dict(fixed)}
    if data_files:
        files: Any = list(data_files) if len(data_files) > 1 else data_files[0]
        split = t.env_kwargs.get("split")
        kwargs["data_files"] = {str(split): files} if isinstance(split, str) else files
    return kwargs


def data_file_digests(paths: Sequence[str] | None) -> list[dict[str, str]]:
    out = []
    for p in paths or ():
        if not Path(p).is_file():
            raise FileNotFoundError(2, "No such file or directory", str(p))
        out.append({"name": Path(p).name, "sha256": file_sha256(p)})
    return out


#: The largest ``submission.json`` read (bytes); a larger one is refused unread.
MAX_SUBMISSION_BYTES = 1 << 20
#: The limits of the ``submission.json`` fields that reach the page: characters of a text, and
#: entries of a list or mapping.
FIELD_LIMITS = {"name": 200, "model": 300, "code_version": 100, "created": 64, "policy_players": 16,
                "policy_spec": 1000, "sampling_keys": 32, "sampling_text": 200, "custom_reasons": 32,
                "custom_reason": 500}


def load_submission(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """The ``submission.json`` of a submission folder (or the file itself): at most
    :data:`MAX_SUBMISSION_BYTES`, nested at most :data:`collab_env._json.MAX_DEPTH` deep (both
    checked before it is parsed), its ``track`` a track id and every field the page shows within
    :data:`FIELD_LIMITS` (:func:`check_page_fields`).

    Raises:
        ConfigError: Missing (a run still in progress), not a submission, too large, too deep,
            or a field over its limit (the message names the field and the limit).
    """
    from collab_env._json import loads

    path = Path(folder)
    if path.is_dir():
        path = path / SUBMISSION_FILE
    if not path.is_file():
        raise ConfigError(f"{path} does not exist: the run did not finish. Run the same "
                          "`collab-env leaderboard run` command again to resume it.")
    size = path.stat().st_size
    if size > MAX_SUBMISSION_BYTES:
        raise ConfigError(f"{path} is {size} bytes, over the {MAX_SUBMISSION_BYTES} a submission.json may have; "
                          "refused unread.")
    d = loads(path.read_bytes(), str(path))
    if not isinstance(d, dict) or d.get("format") != FORMAT or "track" not in d:
        raise ConfigError(f"{path} is not a collab-env submission (format {FORMAT}).")
    problem = check_page_fields(d)
    if problem:
        raise ConfigError(f"{path}: {problem}.")
    return d


def _text_problem(field: str, v: Any, limit: int, *, optional: bool = False) -> str | None:
    if v is None and optional:
        return None
    if not isinstance(v, str):
        return f"{field} must be a string, got {type(v).__name__}"
    if len(v) > limit:
        return f"{field} is {len(v)} characters, over the limit of {limit}"
    return None


def check_page_fields(sub: Mapping[str, Any]) -> str | None:
    """Why a submission's fields that reach the page break :data:`FIELD_LIMITS` (or their
    types), or ``None``: ``track`` is a track id, never a path; ``name``, ``model``,
    ``code_version`` and ``created`` are short texts; ``policies`` maps a few players to specs;
    ``sampling`` maps players to a few plain values; ``custom_reasons`` is a short list of texts;
    ``kind`` is standard or custom."""
    from collab_env.leaderboard.tracks import TRACK_ID

    lim = FIELD_LIMITS
    track = sub.get("track")
    if not isinstance(track, str) or not TRACK_ID.match(track):
        return (f"track must be a track id such as hidden-facts-easy@v2 (never a path), got "
                f"{str(track)[:80]!r}")
    for key in ("name", "model", "code_version", "created"):
        p = _text_problem(key, sub.get(key), lim[key], optional=key not in ("name", "model"))
        if p:
            return p
    if sub.get("kind") not in ("standard", "custom"):
        return f"kind must be 'standard' or 'custom', got {str(sub.get('kind'))[:40]!r}"
    policies = sub.get("policies")
    if not isinstance(policies, Mapping) or len(policies) > lim["policy_players"]:
        return f"policies must map at most {lim['policy_players']} players to specs"
    for p, spec in policies.items():
        bad = _text_problem("policies key", p, 64) or _text_problem(f"policies[{str(p)[:40]!r}]", spec,
                                                                    lim["policy_spec"])
        if bad:
            return bad
    sampling = sub.get("sampling") or {}
    if not isinstance(sampling, Mapping) or len(sampling) > lim["policy_players"]:
        return f"sampling must map at most {lim['policy_players']} players to settings"
    for p, kw in sampling.items():
        if _text_problem("sampling key", p, 64):
            return _text_problem("sampling key", p, 64)
        if not isinstance(kw, Mapping) or len(kw) > lim["sampling_keys"]:
            return f"sampling[{str(p)[:40]!r}] must map at most {lim['sampling_keys']} names to plain values"
        for k, v in kw.items():
            if _text_problem("sampling name", k, 64):
                return _text_problem("sampling name", k, 64)
            if isinstance(v, (list, dict)) or (isinstance(v, str) and len(v) > lim["sampling_text"]):
                return (f"sampling[{str(p)[:40]!r}][{str(k)[:40]!r}] must be a number, a boolean or a text of at "
                        f"most {lim['sampling_text']} characters")
    reasons = sub.get("custom_reasons") or []
    if not isinstance(reasons, list) or len(reasons) > lim["custom_reasons"]:
        return f"custom_reasons must be a list of at most {lim['custom_reasons']} texts"
    for r in reasons:
        if _text_problem("a custom reason", r, lim["custom_reason"]):
            return _text_problem("a custom reason", r, lim["custom_reason"])
    return None


def run_submission(
    track: Track | str,
    policies: Mapping[str, Any],
    *,
    out: str | os.PathLike[str],
    name: str | None = None,
    model: str | None = None,
    sampling: Mapping[str, Mapping[str, Any]] | None = None,
    data_files: Sequence[str] | None = None,
    episodes: int | None = None,
    custom: Sequence[str] = (),
    concurrency: int = 8,
    progress: bool = True,
    tracks_dir: str | os.PathLike[str] | None = None,
) -> Path:
    """Play ``track`` with the submitted ``policies`` and write the submission folder ``out``.

    Args:
        track: A :class:`Track`, a track id, name or file.
        policies: Submitted player -> policy spec (see the module docstring): a string, or a
            :class:`~collab_env.policy.PolicySpec` (how ``--api-base``/``--api-key-env`` reach
            it); the submission records its text (the server and the key's variable, never a key).
        out: The submission folder (created; an unfinished one is resumed).
        name: The entry's name on the board (default: the policy specs).
        model: The model's name (default: the submitted policies' names).
        sampling: Submitted player -> sampling keywords (recorded).
        data_files: Local data files, for tracks on data (their SHA-256 is recorded).
        episodes: Play only the first ``episodes`` episodes (the entry is then custom).
        custom: Other reasons this entry is custom (e.g. ``"fine-tuned on the test split"``).
        concurrency: Episodes in flight.
        progress: Progress bar on a terminal.
        tracks_dir: A folder of your own track files, where ``track`` (an id or name) is
            looked up too (:func:`~collab_env.leaderboard.tracks.user_tracks`).

    Returns:
        The path of ``submission.json``.

    Raises:
        ConfigError: A policy for a player the track fixes, a missing submitted player, bad
            sampling, an env whose number of items is not the track's, a folder of another run.
    """
    from collab_env.eval import evaluate
    from collab_env.eval.files import check_result_file

    t = track if isinstance(track, Track) else get_track(track, tracks_dir)
    for key, given in (("name", name), ("model", model)):
        if given is not None and len(given) > FIELD_LIMITS[key]:
            raise ConfigError(f"--{key} is {len(given)} characters; the board shows at most {FIELD_LIMITS[key]}.")
    out = Path(out).resolve()
    sampling = {p: dict(kw) for p, kw in (sampling or {}).items()}
    specs = dict(policies)
    pols = {p: str(v) for p, v in specs.items()}  # recorded; a PolicySpec's text names no key
    _check_submitted_players(t, pols, sampling)
    _check_env_id_pinned(t)
    reasons = [str(r) for r in custom]
    if t.trials < MIN_STANDARD_TRIALS:
        reasons.append(f"{t.id} plays {t.trials} trials per task, under the {MIN_STANDARD_TRIALS} a standard "
                       "entry needs")
    built = _build_submitted(t, specs, reasons)
    data = _check_data_files(t, data_files)
    # A trajectories file that is not a result file is refused before anything in the folder
    # changes (its submission.json is removed below, while the run is unfinished).
    check_result_file(out / TRAJECTORIES_FILE)

    out.mkdir(parents=True, exist_ok=True)
    cache_path = out / CACHE_FILE
    needs_cache = t.judge is not None or any("simulator" in h for h in t.players.values())
    fp = fixed_players(t, cache_path if needs_cache else None)
    env_kwargs = track_env_kwargs(t, fp.env_kwargs, data_files)
    tasks = _check_task_count(t, env_kwargs)
    full = tasks * t.trials
    n = full if episodes is None else int(episodes)
    if not 1 <= n <= full:
        raise ConfigError(f"--episodes must be in [1, {full}] for track {t.id}, got {episodes!r}.")
    if n < full:
        reasons.append(f"{full - n} of {full} episodes omitted")

    traj = out / TRAJECTORIES_FILE
    resume = traj.exists() and traj.stat().st_size > 0
    old = out / SUBMISSION_FILE
    if old.exists():
        old.unlink()  # rewritten at the end; meanwhile the folder reads as unfinished
    try:
        result = evaluate(t.env_id, {**fp.policies, **built}, num_episodes=n, seed=t.seed, out=traj,
                          resume=resume, concurrency=concurrency, env_kwargs=env_kwargs,
                          sampling={**fp.sampling, **sampling}, progress=progress,
                          label=name or ", ".join(pols.values()),
                          # the board shows the track judge's validity card beside its identity
                          # (board.judge_card), and hides the judged metrics of a judge below the bar
                          judge_check=False)
    finally:
        fp.close()
    totals = _run_totals(t, traj, n, result)
    if totals.failed:
        reasons.append(f"{len(totals.failed)} episode(s) failed and are not scored: {totals.failed[:10]}")
    from collab_env.policy import describe

    sub = {
        "format": FORMAT,
        "track": t.id,
        "track_version": t.version,
        "track_hash": t.content_hash(),
        "track_content": t.to_dict(),
        "name": name or _clip(pols[t.submitted[0]] if len(pols) == 1
                              else ", ".join(f"{p}={v}" for p, v in pols.items()), FIELD_LIMITS["name"]),
        "model": model or _clip(", ".join(dict.fromkeys(describe(built[p]) for p in t.submitted)),
                                FIELD_LIMITS["model"]),
        "policies": pols,
        "sampling": sampling,
        "kind": entry_kind(reasons),
        "custom_reasons": reasons,
        "code_version": code_version(),
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "episodes": {"requested": n, "full": full, "recorded": totals.recorded, "failed": totals.failed},
        "tasks": tasks,
        "cost": totals.usage,
        "faults": {**totals.faults, "end_reasons": totals.end_reasons},
        "cache": _cache_info(cache_path, fp.backends) if needs_cache else None,
        "data_files": data,
        "files": submission_files(out),
    }
    tmp = out / (SUBMISSION_FILE + ".tmp")
    tmp.write_text(json.dumps(sub, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    os.replace(tmp, out / SUBMISSION_FILE)
    return out / SUBMISSION_FILE


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _check_submitted_players(t: Track, pols: Mapping[str, str], sampling: Mapping[str, Any]) -> None:
    """Policies and sampling name the track's submitted players only, and every one of them has a
    policy (a player the track fixes is refused with that reason)."""
    for p in list(pols) + list(sampling):
        if p not in t.submitted:
            fixed = " (the track fixes it)" if p in t.players else ""
            raise ConfigError(f"track {t.id} takes policies for {list(t.submitted)} only; got {p!r}{fixed}."
                              + did_you_mean(str(p), t.submitted))
    missing = [p for p in t.submitted if p not in pols]
    if missing:
        raise ConfigError(f"track {t.id} needs a policy for {missing}: --policy {missing[0]}=SPEC.")


def _check_env_id_pinned(t: Track) -> None:
    """The track's env id is a registered version itself (not resolved to another one)."""
    from collab_env.registry import spec

    s = spec(t.env_id)
    if s.id != t.env_id:
        raise ConfigError(f"track {t.id} is played on {t.env_id}, but that id resolves to {s.id}.")


def _build_submitted(t: Track, pols: Mapping[str, Any], reasons: list[str]) -> dict[str, Any]:
    """The submitted players' policies, built from their specs; a wrapper that makes the entry
    custom adds its reason to ``reasons``."""
    built: dict[str, Any] = {}
    for p in t.submitted:
        built[p], why = build_policy(p, pols[p])
        if why:
            reasons.append(f"{p}: {why}")
    return built


def _check_data_files(t: Track, data_files: Sequence[str] | None) -> list[dict[str, str]]:
    """Data files are given exactly for a track that reads them; their names and SHA-256."""
    if data_files and not t.data:
        raise ConfigError(f"track {t.id} reads no data files; drop --data-files.")
    if t.data and not data_files:
        raise ConfigError(f"track {t.id} needs its data files: {t.data}. Pass them with --data-files.")
    return data_file_digests(data_files)


def _check_task_count(t: Track, env_kwargs: Mapping[str, Any]) -> int:
    """The number of task items of the track's env as built for the run: the track's own count
    (when it names one), which a probe env must have."""
    from collab_env.compose import make

    probe = make(t.env_id, **env_kwargs)
    try:
        num_items = getattr(probe, "unwrapped", probe).task.num_items()
    finally:
        probe.close()
    tasks = t.tasks if t.tasks is not None else num_items
    if not tasks or num_items != tasks:
        raise ConfigError(f"track {t.id} expects {t.tasks} task items, but {t.env_id} with {dict(t.env_kwargs)} "
                          f"has {num_items}; the track's env or data files do not match it.")
    return int(tasks)


@dataclass(frozen=True)
class _RunTotals:
    """What a finished run recorded: the failed episode ids, the number of scored episodes, the
    submitted players' usage, the faults and the end reasons (sorted)."""

    failed: list[int]
    recorded: int
    usage: dict[str, float]
    faults: dict[str, int]
    end_reasons: dict[str, int]


def _run_totals(t: Track, traj: Path, n: int, result: Any) -> _RunTotals:
    """Sum the scored episodes of the run's first ``n`` (a longer run resumed with a smaller
    ``--episodes`` keeps episodes beyond ``n``, which are not part of it): the submitted players'
    usage, the episodes with simulator or policy faults, those that failed on a judge error, the
    end reasons."""
    from collab_env.eval import failures_path, load_results

    failed = sorted(f.episode_id for f in result.failures)
    records = [r for r in load_results(traj) if r.get("status") == "ok" and r.get("episode_id", n) < n]
    fail_path = failures_path(traj)
    fail_records = load_results(fail_path) if fail_path.exists() else []
    judge_faults = sorted({r["episode_id"] for r in fail_records if str(r.get("error", "")).startswith("JudgeError")
                           and r["episode_id"] not in result.episodes})
    usage = {"model_calls": 0.0, "prompt_tokens": 0.0, "completion_tokens": 0.0, "cost": 0.0}
    faults = {"simulator_episodes": 0, "policy_episodes": 0, "judge_episodes": len(judge_faults)}
    end_reasons: dict[str, int] = {}
    for r in records:
        for key, v in submitted_usage(r, t.submitted).items():
            usage[key] += v
        f = episode_faults(r, t.submitted)
        faults["simulator_episodes"] += int(f["simulator"] > 0)
        faults["policy_episodes"] += int(f["policy"] > 0)
        reason = str(r.get("end_reason") or "none")
        end_reasons[reason] = end_reasons.get(reason, 0) + 1
    return _RunTotals(failed, len(records), usage, faults, dict(sorted(end_reasons.items())))


def _cache_info(cache_path: Path, backends: Any) -> dict[str, Any]:
    """The ``"cache"`` block of ``submission.json``: the call cache's digest and counts, and the
    fixed players' backends (the cache is created if no call was made)."""
    from collab_env.agents.cache import ResponseCache

    with ResponseCache(cache_path, "record") as c:  # "record": creates it if no call was made
        num = (len(c), c.num_scores())
    return {"file": CACHE_FILE, "sha256": file_sha256(cache_path), "responses": num[0],
            "scores": num[1], "backends": backends}

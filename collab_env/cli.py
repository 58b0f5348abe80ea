"""The ``collab-env`` command.

::

    collab-env list [--suite S]                 registered environments
    collab-env info ID [--json]                 one environment's spec
    collab-env check ID [--data-files F]        run the conformance checker on an env
    collab-env play ID [--player P] ...         play one player yourself in the terminal
    collab-env eval ID --policy P=SPEC ...      evaluation run, results to a JSONL file
    collab-env data --data_files F --output_dir D   CollabLLM RL/SFT/DPO datasets
    collab-env leaderboard run|verify|build|tracks  leaderboard tracks, submissions and page

A policy ``SPEC`` is an alias (``ask-then-answer``, ``answer-at-once``...), ``default`` (the
spec's default policy for that player) or ``module:Class``. ``--import MODULE`` (before the
subcommand, repeatable) imports a module first, so environments and policies it registers are
available: ``collab-env --import my_envs check my-env-v0``.

Exit status: 0 success; 1 a check failed, an evaluation had failed episodes, ``play`` input
ended early, or ``data`` rejected its rows; 2 a usage or configuration error; 3 a file error (a
missing input, an output that cannot be written: read-only or pseudo file system, a parent that
is a file, a folder where a file belongs, no permission, a full disk); 130 Ctrl-C. Errors are one
line on stderr, with the path and what to do, never a traceback. Commands that write check
their output path before doing any long work. :func:`main` takes ``argv`` and returns the
status, so the CLI is testable in-process.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import json
import os
import sys
import textwrap
import warnings
from collections.abc import Sequence
from typing import Any, TextIO

from collab_env.errors import CollabEnvError, ConfigError, did_you_mean

__all__ = ["main", "build_parser", "os_error_message"]

PROG = "collab-env"


# ---------------------------------------------------------------------------------------------
# Argument parsing helpers
# ---------------------------------------------------------------------------------------------
def _parse_value(text: str) -> Any:
    """``--env-arg`` values: JSON when they parse (numbers, booleans, lists), else the string."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _pairs(items: Sequence[str] | None, what: str, example: str) -> dict[str, str]:
    """``["a=b", ...]`` -> ``{"a": "b"}``; a malformed or repeated key is a usage error."""
    out: dict[str, str] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise ConfigError(f"{what} takes KEY=VALUE, e.g. {example}; got {item!r}.")
        if key in out:
            raise ConfigError(f"{what} gives {key!r} twice ({out[key]!r} and {value!r}).")
        out[key] = value
    return out


def _env_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    kwargs = {k: _parse_value(v) for k, v in
              _pairs(getattr(args, "env_arg", None), "--env-arg", "--env-arg max_steps=8").items()}
    files = getattr(args, "data_files", None)
    if files:
        kwargs["data_files"] = files[0] if len(files) == 1 else list(files)
    return kwargs


def _sampling(items: Sequence[str] | None) -> dict[str, dict[str, Any]]:
    """``--sampling assistant.temperature=0.7`` -> ``{"assistant": {"temperature": 0.7}}``.

    Each parameter is checked here, before any work, against
    :class:`~collab_env.policy.SamplingParams` (the keywords every backend takes): an unknown name,
    a value of the wrong type or out of range is a usage error naming the flag.
    """
    from collab_env.policy import SamplingParams

    names = list(SamplingParams.__dataclass_fields__)
    out: dict[str, dict[str, Any]] = {}
    for key, value in _pairs(items, "--sampling", "--sampling assistant.temperature=0.7").items():
        player, dot, name = key.partition(".")
        if not dot or not player or not name:
            raise ConfigError(f"--sampling takes PLAYER.KEY=VALUE, e.g. assistant.temperature=0.7; got {key!r}.")
        flag = f"--sampling {key}={value}"
        if name not in names:
            raise ConfigError(f"{flag}: {name!r} is not a sampling parameter." + did_you_mean(name, names)
                              + f" Valid: {', '.join(names)}.")
        parsed = _parse_value(value)
        try:
            SamplingParams(**{name: parsed})  # its type and range: temperature a number >= 0...
        except ConfigError as exc:
            raise ConfigError(f"{flag}: {exc}") from None
        out.setdefault(player, {})[name] = parsed
    return out


def _one_line(text: str, width: int = 76) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3].rstrip() + "..."


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


# ---------------------------------------------------------------------------------------------
# Subcommands
# ---------------------------------------------------------------------------------------------
def _cmd_list(args: argparse.Namespace, out: TextIO) -> int:
    from collab_env.registry import list_envs, registry, spec

    ids = list_envs(args.suite)
    if not ids:
        suites = sorted({s.suite for s in registry.values()})
        raise ConfigError(f"no environments in suite {args.suite!r}; suites: {suites}."
                          + did_you_mean(args.suite, suites))
    rows = [["ID", "SUITE", "PLAYERS", "DESCRIPTION"]]
    for env_id in ids:
        s = spec(env_id)
        rows.append([s.id, s.suite, ",".join(s.players), _one_line(s.description)])
    print(_table(rows), file=out)
    return 0


def _cmd_info(args: argparse.Namespace, out: TextIO) -> int:
    from collab_env.registry import spec

    s = spec(args.id)
    d = s.to_dict()
    if args.json:
        print(json.dumps(d, indent=2, default=repr), file=out)
        return 0

    def kv(mapping: dict[str, Any], sep: str = "=") -> str:
        return ", ".join(f"{k}{sep}{v}" for k, v in mapping.items()) or "-"

    fields = [
        ("suite", s.suite),
        ("players", ", ".join(s.players)),
        ("trainable", ", ".join(s.trainable) or "-"),
        ("turn order", " -> ".join("+".join(t) for t in s.turn_order)),
        ("default policies", kv(dict(s.default_policies), ": ")),
        ("reward", kv(dict(s.reward), " x ")),
        ("reward range", f"[{s.reward_range[0]}, {s.reward_range[1]}]"),
        ("limits", kv(dict(s.limits))),
        ("env arguments", kv(d["kwargs"])),
        ("entry point", d["entry_point"]),
        ("gymnasium id", s.gym_id),
        ("needs data", "yes (pass --data-files to work offline)" if s.needs_data else "no"),
    ]
    print(s.id, file=out)
    if s.description:
        print(textwrap.fill(s.description, width=88, initial_indent="  ", subsequent_indent="  "),
              file=out)
    print(file=out)
    width = max(len(k) for k, _ in fields)
    for k, v in fields:
        print(f"{k.ljust(width)}  {v}", file=out)
    print(file=out)
    if s.card is None:
        print("card              none (register the spec with card=EnvCard(...))", file=out)
        return 0
    c = s.card
    ranges = {k: c.format_range(b) for k, b in c.reward_range.items()}
    print("card", file=out)
    for heading, value in (("tests", c.tests), ("players", c.players), ("sees", c.sees),
                           ("reward", c.reward), ("reward range", ranges), ("limits", c.limits),
                           ("data", c.data), ("licence", c.licence), ("baselines", c.baselines),
                           ("exploit audit", c.exploits or "not audited (collab-env check ID --exploits)")):
        if isinstance(value, str):
            print(textwrap.fill(value, width=88, initial_indent=f"  {heading.ljust(14)}",
                                subsequent_indent=" " * 16), file=out)
            continue
        print(f"  {heading}", file=out)
        for k, v in value.items():
            print(textwrap.fill(f"{k}: {v}", width=88, initial_indent=" " * 4,
                                subsequent_indent=" " * 6), file=out)
    return 0


def _cmd_check(args: argparse.Namespace, out: TextIO) -> int:
    from collab_env.checker import check_env
    from collab_env.registry import spec

    s = spec(args.id)
    kwargs: dict[str, Any] = {"make_kwargs": _env_kwargs(args)}
    if args.cycles is not None:
        if args.cycles < 1:
            raise ConfigError(f"--cycles must be >= 1, got {args.cycles}.")
        kwargs["cycles"] = args.cycles
    if args.exploits:
        ekw: dict[str, Any] = {}
        if args.episodes is not None:
            ekw["episodes"] = args.episodes
        if args.judge:
            audit = s.card.audit if s.card is not None else {}
            rkw = {k: dict(v) for k, v in dict(audit.get("reward_kwargs", {})).items()}
            for option in ("mr", "conversation"):
                rkw.setdefault(option, {})["judge"] = args.judge
            ekw["reward_kwargs"] = rkw
        kwargs.update(exploits=True, exploit_kwargs=ekw)
    elif args.episodes is not None or args.judge:
        raise ConfigError("--episodes and --judge are options of the exploit audit: add --exploits.")
    print(f"checking {s.id} ...", file=out, flush=True)
    # The report, not the exception: every check gets its line, failed or not.
    report = check_env(s.id, raise_on_failure=False, **kwargs)
    status = {True: "PASS", False: "FAIL", None: "SKIP"}
    for r in report.results:
        if r.name == "exploits" and report.exploits is not None:
            print(f"{status[r.passed]}  exploits: {report.exploits.summary()}", file=out)
            print(report.exploits.format(), file=out)
            continue
        print(f"{status[r.passed]}  {r.name}" + (f": {r.detail}" if r.detail else ""), file=out)
    n_failed = len(report.failed)
    print(f"{s.id}: " + (f"{n_failed} check(s) failed" if n_failed else "all checks passed"),
          file=out)
    return 1 if n_failed else 0


def _cmd_play(args: argparse.Namespace, out: TextIO, inp: TextIO) -> int:
    from collab_env._async import run_sync
    from collab_env.compose import make
    from collab_env.eval import choose_policies, load_policy
    from collab_env.registry import spec
    from collab_env.rollout import advance

    s = spec(args.id)
    player = args.player or (s.trainable[0] if s.trainable else s.players[0])
    if player not in s.players:
        raise ConfigError(f"--player {player!r} is not a player of {s.id}; players: {list(s.players)}."
                          + did_you_mean(player, s.players))
    given = _pairs(args.policy, "--policy", "--policy user=default")
    if player in given:
        raise ConfigError(f"you play {player!r}; give policies only for the other players.")
    sampling = _sampling(args.sampling)  # before a policy (a model) is loaded
    others = [p for p in s.players if p != player]
    refs = choose_policies(s, given, others)
    policies = {p: load_policy(p, ref) for p, ref in refs.items()}

    env = make(s.id, **_env_kwargs(args))
    seed = args.seed
    if seed is None:  # a fresh game each time, but printed so it can be replayed
        import secrets

        seed = secrets.randbelow(2**31)
    options = {"index": args.index} if args.index is not None else None
    obs, infos = env.reset(seed=seed, options=options)
    print(f"{s.id}: you are {player!r} (seed {seed}). Type your message; a line with only '.' "
          "sends it, /quit leaves.", file=out)
    shown = 0
    typed = 0  # messages the person typed, which are not echoed back

    def show_new() -> None:
        # Print what this player can see and has not seen yet. Its own messages are skipped,
        # except those the env wrote in its name (e.g. a simulated user's opening request).
        nonlocal shown
        view = env.observe(player)
        own_total = sum(1 for m in view.messages if m.author == player)
        own_seen = sum(1 for m in view.messages[:shown] if m.author == player)
        for m in view.messages[shown:]:
            if m.author == player:
                own_seen += 1
                if own_seen > own_total - typed:
                    continue
            who = "system" if m.role == "system" else m.author
            if m.author == player:
                who += " (you, written for you)"
            print(f"\n[{who}]\n{m.content}", file=out)
        shown = len(view)

    step = 0
    returns = dict.fromkeys(s.players, 0.0)
    mine: dict[str, str] | None = None  # the person's message, sent in the next round
    try:
        while True:
            # The bots play (the episode driver) until it is the person's turn again.
            run = run_sync(advance(env, policies, obs=obs, infos=infos, until=(player,), actions=mine,
                                   sampling=sampling, seed=lambda k, base=step: seed + base + k))
            mine = None
            step += len(run.steps)
            for st in run.steps:
                for p, r in st.rewards.items():
                    returns[p] += r
            obs, infos = run.obs, run.infos
            if run.done or not env.agents:
                break
            show_new()
            text = _read_message(inp, out, player)
            if text is None:
                print("\n(left the game)", file=out)
                return 0
            if text is EOF:
                print(f"{PROG}: input ended before the episode did.", file=sys.stderr)
                return 1
            mine = {player: text}
            typed += 1
        show_new()
        st = env.episode
        how = "terminated" if st.terminated else "truncated" if st.truncated else "ended"
        print(f"\n=== episode {how}: {st.end_reason} after {st.step} step(s) ===", file=out)
        for p in s.players:
            mark = "  (you)" if p == player else ""
            print(f"reward {p}: {returns[p]:g}{mark}", file=out)
        return 0
    finally:
        env.close()


class _EOF:
    """Sentinel: stdin ended in the middle of the game."""


EOF = _EOF()


def _read_message(inp: TextIO, out: TextIO, player: str) -> str | None | _EOF:
    """One message from ``inp``: lines up to a line holding only ``.`` (or the end of input).

    Returns the text, ``None`` for ``/quit``, or :data:`EOF` when input ended with nothing typed.
    """
    print(f"\n[{player}] (you; end with a line '.')", file=out, flush=True)
    lines: list[str] = []
    while True:
        line = inp.readline()
        if not line:  # end of input: send what was typed, if anything
            return "\n".join(lines) if lines else EOF
        line = line.rstrip("\r\n")
        if not lines and line.strip() == "/quit":
            return None
        if line.strip() == ".":
            return "\n".join(lines)
        lines.append(line)


def _cmd_eval(args: argparse.Namespace, out: TextIO) -> int:
    from collab_env.eval import evaluate, failures_path

    policies = _pairs(args.policy, "--policy", "--policy assistant=ask-then-answer")
    result = evaluate(
        args.id,
        policies,
        num_episodes=args.episodes,
        seed=args.seed,
        out=args.out,
        resume=args.resume,
        concurrency=args.concurrency,
        env_kwargs=_env_kwargs(args),
        sampling=_sampling(args.sampling),
        progress=not args.no_progress,
    )
    print(result.summary_table(), file=out)
    if args.out:
        print(f"\n{len(result.episodes)} episode records in {args.out}", file=out)
    if result.failures:
        where = f" (logged in {failures_path(args.out)})" if args.out else ""
        first = result.failures[0]
        print(f"{PROG}: {len(result.failures)} episode(s) failed{where}; first: episode "
              f"{first.episode_id}: {first.error}", file=sys.stderr)
        if args.out:
            print(f"{PROG}: rerun the same command with --resume to retry them.", file=sys.stderr)
        return 1
    return 0


def _cmd_leaderboard(args: argparse.Namespace, out: TextIO) -> int:
    """``collab-env leaderboard tracks|run|verify|build|sign`` (see :mod:`collab_env.leaderboard`)."""
    from pathlib import Path

    if args.lb_command == "tracks":
        from collab_env.leaderboard.tracks import builtin_tracks, track_status

        rows = [["TRACK", "STATUS", "KIND", "ENV", "EPISODES", "USER"]]
        for t in builtin_tracks().values():
            eps = f"{t.tasks}x{t.trials}" if t.tasks is not None else f"all x{t.trials}"
            rows.append([t.id, track_status(t), t.kind, t.env_id, eps, t.user])
        print(_table(rows), file=out)
        return 0
    if args.lb_command == "run":
        from collab_env.leaderboard.submission import load_submission, run_submission

        policies = _pairs(args.policy, "--policy", "--policy assistant=ask-then-answer")
        path = run_submission(args.track, policies, out=args.out, name=args.name, model=args.model,
                              sampling=_sampling(args.sampling), data_files=args.data_files,
                              episodes=args.episodes, custom=args.custom or (),
                              concurrency=args.concurrency, progress=not args.no_progress)
        sub = load_submission(path)
        eps = sub["episodes"]
        print(f"{sub['track']}: {eps['recorded']}/{eps['requested']} episodes recorded, "
              f"{sub['kind']} entry; submission in {path}", file=out)
        if eps["recorded"]:
            from collab_env.leaderboard.board import entry_row_text

            print(f"row: {entry_row_text(path)}", file=out)
        if eps["failed"]:
            print(f"{PROG}: {len(eps['failed'])} episode(s) failed: {eps['failed'][:10]}; rerun the same "
                  "command to retry them.", file=sys.stderr)
            return 1
        return 0
    if args.lb_command == "verify":
        from collab_env.leaderboard.verify import verify_submission

        v = verify_submission(args.submission, track=args.track, data_files=args.data_files,
                              regenerate=args.regenerate, full=args.full)
        print(v.report(), file=out)
        return 0 if v.ok else 1
    if args.lb_command == "sign":
        return _cmd_sign(args, out)
    # build
    from collab_env.leaderboard.board import board_data

    data = board_data(args.directory, verify=not args.no_verify, reverify=args.reverify,
                      progress=lambda line: print(line, file=sys.stderr, flush=True))
    target = Path(args.out) if args.out else Path(args.directory) / "index.html"
    try:
        from collab_env.leaderboard.page import build_page
    except ImportError as exc:
        raise ConfigError(f"the page builder collab_env.leaderboard.page is not available ({exc}).") from exc
    written = build_page(data, target)
    n_ok = sum(e["verified"] for e in data["entries"])
    n_failed = sum(bool(e.get("failed")) for e in data["entries"])
    extra = "".join([f", {n_failed} failed" if n_failed else "",
                     f"; {len(data['rejected'])} folder(s) rejected" if data.get("rejected") else ""])
    print(f"{len(data['entries'])} entries ({n_ok} verified{extra}) on {len(data['tracks'])} tracks: {written}", file=out)
    return 0


def _cmd_sign(args: argparse.Namespace, out: _Output) -> int:
    """``collab-env leaderboard sign DIRECTORY --key FILE``: verify the board (re-playing what this
    machine has not verified yet) and sign every entry's verdict into DIRECTORY/verdicts.signed.json."""
    from pathlib import Path

    from collab_env.leaderboard.board import STAMPS_FILE, board_data
    from collab_env.leaderboard.signing import SIGNED_FILE, sign_verdicts

    directory = Path(args.directory)
    data = board_data(directory, verify=True, reverify=args.reverify, num_boot=10,
                      progress=lambda line: print(line, file=sys.stderr, flush=True))
    stamps = json.loads((directory / STAMPS_FILE).read_text()) if (directory / STAMPS_FILE).is_file() else {}
    signed = sign_verdicts(stamps, args.key)
    (directory / SIGNED_FILE).write_text(json.dumps(signed, indent=1, sort_keys=True) + "\n")
    n_ok = sum(s["ok"] for s in signed["verdicts"].values())
    print(f"{len(signed['verdicts'])} verdicts ({n_ok} verified) of {len(data['entries'])} entries signed with "
          f"{signed['key_id']}: {directory / SIGNED_FILE}", file=out)
    return 0


def _data_output_dir(argv: Sequence[str]) -> str | None:
    """The ``--output_dir`` (alias ``--local_dir``) that ``collab-env data`` was given, if any."""
    q = argparse.ArgumentParser(add_help=False)
    q.add_argument("--output_dir", "--local_dir", dest="output_dir")
    return q.parse_known_args(list(argv))[0].output_dir


def _check_writable_dir(path: str) -> None:
    """Create ``path`` and write a probe file in it, so an unwritable output folder fails before
    the work that would fill it (OSError, reported by :func:`main`)."""
    import tempfile

    folder = os.path.expanduser(path)
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise ConfigError(f"--output_dir {folder} is a file; give a folder (it is created if missing).")
    os.makedirs(folder, exist_ok=True)
    with tempfile.TemporaryFile(dir=folder):
        pass


def _cmd_data(argv: Sequence[str]) -> int:
    from collab_env.tasks.collabllm_data import RECIPE_LOCAL_DIR
    from collab_env.tasks.collabllm_data import main as data_main

    if not any(a in ("-h", "--help") for a in argv):
        _check_writable_dir(_data_output_dir(argv) or RECIPE_LOCAL_DIR)
    try:
        return data_main(list(argv))
    except SystemExit as exc:  # its --help or a usage error: argparse already printed
        return exc.code if isinstance(exc.code, int) else 0


#: Per errno: what went wrong, and what to do about it.
_OS_FIXES: dict[int, tuple[str, str]] = {
    errno.ENOENT: ("no such file or folder",
                   "check the path: an input must exist, an output must go in a folder that exists "
                   "or can be created (pseudo file systems such as /proc and /sys take no new files)"),
    errno.ENOTDIR: ("a part of the path is a file, not a folder",
                    "choose a path whose parent folders are folders"),
    errno.EISDIR: ("is a folder, where a file is needed", "give the path of a file inside it"),
    errno.EEXIST: ("already exists", "remove it or choose another path"),
    errno.EACCES: ("permission denied", "choose a path you may use, or change its permissions"),
    errno.EPERM: ("operation not permitted", "choose a path you may use, or change its permissions"),
    errno.EROFS: ("read-only file system", "choose a path on a writable file system"),
    errno.ENOSPC: ("no space left on the device", "free some space or write to another disk"),
    errno.EDQUOT: ("disk quota exceeded", "free some space or write to another disk"),
    errno.EIO: ("input/output error (a disk or network file system fault)",
                "check the device, then run the command again"),
    errno.ENAMETOOLONG: ("file name too long", "use a shorter path"),
    errno.EMFILE: ("too many open files", "raise the limit (ulimit -n) or lower --concurrency"),
    errno.ENFILE: ("too many open files in the system", "close other programs or lower --concurrency"),
}
_NETWORK_FIX = "check the server's address, that it is running and reachable, then run the command again"


def os_error_message(exc: OSError) -> str:
    """One line for an OS or I/O error: the path, what went wrong, and the fix."""
    default = _NETWORK_FIX if isinstance(exc, (ConnectionError, TimeoutError)) else \
        "check the path and the disk, then run the command again"
    what, fix = _OS_FIXES.get(exc.errno or -1, (None, default))
    what = what or exc.strerror or (str(exc) if str(exc) else type(exc).__name__)
    paths = [os.fsdecode(f) for f in (exc.filename, exc.filename2) if f is not None]
    where = " -> ".join(paths)
    text = f"{where}: {what}" if where else what
    return " ".join(f"{text}; {fix}.".split())


class _Output:
    """The stream commands print to; an OS error writing it names it (a full disk behind
    ``> file``, a closed pipe), since such errors carry no file name of their own."""

    def __init__(self, stream: TextIO, name: str = "standard output") -> None:
        self.stream = stream
        self.name = name

    def _named(self, exc: OSError) -> OSError:
        if exc.filename is None:
            exc.filename = self.name
        return exc

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)
        except OSError as exc:
            raise self._named(exc) from None

    def flush(self) -> None:
        try:
            self.stream.flush()
        except OSError as exc:
            raise self._named(exc) from None


def _drop_stdout(out: _Output) -> None:
    """After a failed write to the process's stdout, point it at /dev/null so the interpreter's
    final flush does not fail a second time with a traceback."""
    if out.stream is not sys.stdout:
        return
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):  # no real file descriptor behind sys.stdout
        pass


# ---------------------------------------------------------------------------------------------
# Parser and entry point
# ---------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``collab-env``."""
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Multi-turn, multi-party LLM collaboration environments.",
        epilog="Policy SPEC: an alias, 'default' (the env's default for that player) or "
               "'module:Class'.",
    )
    p.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                   help="import MODULE first (registers its environments/policies); repeatable")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    q = sub.add_parser("list", help="list registered environments")
    q.add_argument("--suite", help="only this suite (builtin, collabllm, comlrl...)")

    q = sub.add_parser("data", help="build RL/SFT/DPO datasets from CollabLLM conversations",
                       add_help=False)
    q.add_argument("data_args", nargs=argparse.REMAINDER,
                   help="arguments of python -m collab_env.tasks.collabllm_data (--help for them)")

    q = sub.add_parser("info", help="show an environment's spec")
    q.add_argument("id")
    q.add_argument("--json", action="store_true", help="print the spec as JSON")

    def env_args(q: argparse.ArgumentParser) -> None:
        q.add_argument("--data-files", nargs="+", metavar="F",
                       help="local dataset file(s), for suites that read data (works offline)")
        q.add_argument("--env-arg", action="append", metavar="KEY=VALUE",
                       help="keyword argument for the env (VALUE parsed as JSON if it can be); repeatable")

    q = sub.add_parser("check", help="run the conformance checker on an environment")
    q.add_argument("id")
    q.add_argument("--cycles", type=int, help="episodes/steps the checker plays")
    q.add_argument("--exploits", action="store_true",
                   help="also run the exploit audit: every gaming policy against the card's naive baseline")
    q.add_argument("--episodes", type=int, help="episodes per exploit and reward option (with --exploits)")
    q.add_argument("--judge", metavar="SPEC",
                   help="judge for the mr/conversation options of the audit, e.g. 'embedded' (with --exploits)")
    env_args(q)

    q = sub.add_parser("play", help="play one player yourself; the others run their policies")
    q.add_argument("id")
    q.add_argument("--player", help="the player you play (default: the first trainable one)")
    q.add_argument("--policy", action="append", metavar="PLAYER=SPEC",
                   help="policy of another player (default: the env's); repeatable")
    q.add_argument("--seed", type=int, help="reset seed (default: random, printed)")
    q.add_argument("--index", type=int, help="task item index")
    q.add_argument("--sampling", action="append", metavar="PLAYER.KEY=VALUE",
                   help="sampling parameter for a policy, e.g. user.temperature=0.7; repeatable")
    env_args(q)

    q = sub.add_parser("eval", help="evaluate policies over many seeded episodes")
    q.add_argument("id")
    q.add_argument("--policy", action="append", metavar="PLAYER=SPEC",
                   help="policy of a player (trainable players need one); repeatable")
    q.add_argument("--episodes", type=int, required=True, help="number of episodes")
    q.add_argument("--seed", type=int, default=0, help="base seed; episode k uses seed+k (default 0)")
    q.add_argument("--out", help="JSONL result file, written as episodes finish")
    q.add_argument("--resume", action="store_true",
                   help="continue the run in --out: run only the episodes it lacks")
    q.add_argument("--concurrency", type=int, default=8, help="episodes in flight (default 8)")
    q.add_argument("--sampling", action="append", metavar="PLAYER.KEY=VALUE",
                   help="sampling parameter for a policy, e.g. assistant.temperature=0.7; repeatable")
    q.add_argument("--no-progress", action="store_true", help="no progress bar")
    env_args(q)

    q = sub.add_parser("leaderboard", help="leaderboard: tracks, run and verify submissions, build the page")
    lb = q.add_subparsers(dest="lb_command", metavar="ACTION", required=True)
    lb.add_parser("tracks", help="list the tracks (current and legacy)")
    r = lb.add_parser("run", help="play a track with your policy; write a submission folder (resumable)")
    r.add_argument("track", help="track id (hidden-facts@v1), name (its current version) or track file")
    r.add_argument("--policy", action="append", metavar="PLAYER=SPEC",
                   help="policy of a submitted player: alias, module:Class, backend:model or proactive(SPEC)")
    r.add_argument("--out", required=True, help="submission folder (an unfinished one is resumed)")
    r.add_argument("--name", help="the entry's name on the board")
    r.add_argument("--model", help="the model's name on the board")
    r.add_argument("--sampling", action="append", metavar="PLAYER.KEY=VALUE",
                   help="sampling of a submitted player, e.g. assistant.temperature=0.7; repeatable")
    r.add_argument("--episodes", type=int, help="play only the first N episodes (a custom entry)")
    r.add_argument("--custom", action="append", metavar="REASON",
                   help="mark the entry custom, saying why (e.g. 'fine-tuned on the test split')")
    r.add_argument("--concurrency", type=int, default=8, help="episodes in flight (default 8)")
    r.add_argument("--data-files", nargs="+", metavar="F", help="the track's data files (tracks on data)")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    v = lb.add_parser("verify", help="re-play a submission offline; exit 1 with the reasons if it does not match")
    v.add_argument("submission", help="submission folder")
    v.add_argument("--track", help="track file to check against (default: the registered track it names)")
    v.add_argument("--data-files", nargs="+", metavar="F", help="the track's data files (tracks on data)")
    v.add_argument("--regenerate", type=int, metavar="N",
                   help="on tracks with an LLM user or judge: regenerate N random episodes with the track's own "
                        "pinned models (default 2)")
    v.add_argument("--full", action="store_true", help="regenerate every episode with the track's own models")
    g = lb.add_parser("sign", help="verify a board and sign its verdicts (maintainers; the key stays outside the repository)")
    g.add_argument("directory", help="folder of submission folders (e.g. benchmarks/leaderboard)")
    g.add_argument("--key", required=True, help="the Ed25519 private key file (its public key pinned in collab_env.leaderboard.signing)")
    g.add_argument("--reverify", action="store_true", help="re-play every entry first")
    b = lb.add_parser("build", help="write the static HTML page of a folder of submissions")
    b.add_argument("directory", help="folder of submission folders (e.g. benchmarks/leaderboard)")
    b.add_argument("--out", help="HTML file (default DIRECTORY/index.html)")
    b.add_argument("--no-verify", action="store_true", help="do not re-play the submissions (marks them unverified)")
    b.add_argument("--reverify", action="store_true",
                   help="re-play every submission, ignoring the verdicts kept in DIRECTORY/.verified.json")
    return p


def _show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  file: TextIO | None = None, line: str | None = None) -> None:
    """A warning as one line on stderr, like the errors: ``collab-env: warning: ...``. (Python's
    own format adds the file and line of whoever warned, which for a warning raised inside an
    evaluation's event loop is a line of asyncio's, and the source line.)"""
    kind = "" if category is UserWarning else f" ({category.__name__})"
    text = " ".join(str(message).split())
    try:
        print(f"{PROG}: warning{kind}: {text}", file=file or sys.stderr)
    except (OSError, ValueError):  # stderr closed: a warning is not worth failing for
        pass


def main(argv: list[str] | None = None, *, stdin: TextIO | None = None,
         stdout: TextIO | None = None) -> int:
    """Run ``collab-env`` with ``argv`` (default ``sys.argv[1:]``); return the exit status.

    ``stdin``/``stdout`` default to the process's streams (tests may pass their own). Warnings
    are printed as one line each (``collab-env: warning: ...``) while the command runs.
    """
    saved = warnings.showwarning
    warnings.showwarning = _show_warning
    try:
        return _main(argv, stdin=stdin, stdout=stdout)
    finally:
        warnings.showwarning = saved


def _main(argv: list[str] | None, *, stdin: TextIO | None, stdout: TextIO | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args: argparse.Namespace | None = None
    out = _Output(stdout or sys.stdout)
    # Every command's errors end here: one line on stderr, never a traceback.
    try:
        if argv[:1] == ["data"]:  # its own parser (collab_env.tasks.collabllm_data)
            return _cmd_data(argv[1:])
        try:
            args = parser.parse_args(argv)
        except SystemExit as exc:  # --help or a usage error: argparse already printed
            return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
        for mod in args.imports:
            try:
                importlib.import_module(mod)
            except ImportError as exc:
                raise ConfigError(f"--import {mod}: {exc}") from exc
        commands = {"list": lambda: _cmd_list(args, out), "info": lambda: _cmd_info(args, out),
                    "check": lambda: _cmd_check(args, out), "eval": lambda: _cmd_eval(args, out),
                    "play": lambda: _cmd_play(args, out, stdin or sys.stdin),
                    "leaderboard": lambda: _cmd_leaderboard(args, out)}
        status = commands[args.command]()
        out.flush()  # a full disk or a closed pipe behind stdout shows here, not at exit
        return status
    except CollabEnvError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader went away (``collab-env list | head``): stop quietly, as Unix tools do.
        _drop_stdout(out)
        return 141
    except OSError as exc:
        _drop_stdout(out)
        print(f"{PROG}: error: {os_error_message(exc)}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        hint = ""
        if getattr(args, "command", None) == "eval" and getattr(args, "out", None):
            hint = f" Finished episodes are in {args.out}; rerun with --resume to continue."
        elif getattr(args, "lb_command", None) == "run":
            hint = f" Finished episodes are in {args.out}; rerun the same command to resume."
        print(f"\n{PROG}: interrupted.{hint}", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``collab-env leaderboard tracks|run|verify|sign|build``: the leaderboard's tracks, playing and
verifying submissions, signing verdicts and building the page (see :mod:`collab_env.leaderboard`)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from collab_env.cli._common import PROG, add_connection_args, parse_policies, parse_sampling, table
from collab_env.cli.output import Writer
from collab_env.errors import ConfigError

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``leaderboard`` and its actions to the subcommands ``sub``."""
    q = sub.add_parser("leaderboard", help="leaderboard: tracks, run and verify submissions, build the page")
    lb = q.add_subparsers(dest="lb_command", metavar="ACTION", required=True)
    lb.add_parser("tracks", help="list the tracks (current and legacy)")
    r = lb.add_parser("run", help="play a track with your policy; write a submission folder (resumable)")
    r.add_argument("track", help="track id (hidden-facts@v1), name (its current version) or your own track file")
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
    add_connection_args(r)
    _tracks_arg(r)
    v = lb.add_parser("verify", help="re-play a submission offline; exit 1 with the reasons if it does not match "
                                     "(a passing verdict is kept in the user cache for `build`, keyed by the files' "
                                     "digest)")
    v.add_argument("submission", help="submission folder")
    v.add_argument("--track", help="track file to check against (default: the track whose id it names)")
    v.add_argument("--data-files", nargs="+", metavar="F", help="the track's data files (tracks on data)")
    v.add_argument("--regenerate", type=int, metavar="N",
                   help="on tracks with an LLM user or judge: regenerate N random episodes with the track's own "
                        "pinned models (default: enough to catch one forged episode with probability 0.95)")
    v.add_argument("--full", action="store_true", help="regenerate every episode with the track's own models")
    _tracks_arg(v, "the nearest tracks/ folder beside the submission or above it")
    g = lb.add_parser("sign", help="verify a board and sign its verdicts (maintainers; the key stays outside the "
                                   "repository)")
    g.add_argument("directory", help="folder of submission folders (e.g. benchmarks/leaderboard)")
    g.add_argument("--key", required=True,
                   help="the Ed25519 private key file (its public key pinned in collab_env.leaderboard.signing)")
    g.add_argument("--reverify", action="store_true", help="re-play every entry first")
    _board_data_arg(g)
    _tracks_arg(g, "DIRECTORY/tracks")
    b = lb.add_parser("build", help="write the static HTML page of a folder of submissions")
    b.add_argument("directory", help="folder of submission folders (e.g. benchmarks/leaderboard)")
    b.add_argument("--out", help="HTML file (default DIRECTORY/index.html)")
    b.add_argument("--no-verify", action="store_true", help="do not re-play the submissions (marks them unverified)")
    b.add_argument("--reverify", action="store_true",
                   help="re-play every submission, ignoring the kept verdicts (in the user cache: the builds', "
                        "keyed by DIRECTORY's path, and verify's, keyed by the files' digest) and the signed ones")
    _board_data_arg(b)
    _tracks_arg(b, "DIRECTORY/tracks")


def _board_data_arg(q: argparse.ArgumentParser) -> None:
    q.add_argument("--data-files", nargs="+", metavar="F",
                   help="data files of the entries on tracks that read data; each entry is re-played with the "
                        "files whose SHA-256 it recorded")


def _tracks_arg(q: argparse.ArgumentParser, default: str | None = None) -> None:
    q.add_argument("--tracks", metavar="DIR",
                   help="a folder of your own track files, named <id>.json (e.g. my-track@v1.json)"
                        + (f"; default {default}" if default else ""))


def run(args: argparse.Namespace, out: Writer) -> int:
    """``collab-env leaderboard tracks|run|verify|build|sign`` (see :mod:`collab_env.leaderboard`)."""
    from pathlib import Path

    if args.lb_command == "tracks":
        from collab_env.leaderboard.tracks import builtin_tracks, track_status

        rows = [["TRACK", "STATUS", "KIND", "ENV", "EPISODES", "USER"]]
        for t in builtin_tracks().values():
            eps = f"{t.tasks}x{t.trials}" if t.tasks is not None else f"all x{t.trials}"
            rows.append([t.id, track_status(t), t.kind, t.env_id, eps, t.user])
        print(table(rows), file=out)
        return 0
    if args.lb_command == "run":
        from collab_env.leaderboard.submission import load_submission, run_submission
        from collab_env.leaderboard.tracks import get_track

        track = get_track(args.track, args.tracks)
        _check_connection_roles(args, track)
        policies, _ = parse_policies(args)
        path = run_submission(track, policies, out=args.out, name=args.name, model=args.model,
                              sampling=parse_sampling(args.sampling), data_files=args.data_files,
                              episodes=args.episodes, custom=args.custom or (),
                              concurrency=args.concurrency, progress=not args.no_progress)
        sub = load_submission(path)
        eps = sub["episodes"]
        print(f"{sub['track']}: {eps['recorded']}/{eps['requested']} episodes recorded, "
              f"{sub['kind']} entry; submission in {path}", file=out)
        if eps["recorded"]:
            from collab_env.leaderboard.board import entry_row_text

            print(f"row: {entry_row_text(path, track=track)}", file=out)
        if eps["failed"]:
            print(f"{PROG}: {len(eps['failed'])} episode(s) failed: {eps['failed'][:10]}; rerun the same "
                  "command to retry them.", file=sys.stderr)
            return 1
        return 0
    if args.lb_command == "verify":
        from collab_env.leaderboard.verify import verify_submission

        v = verify_submission(args.submission, track=args.track, data_files=args.data_files,
                              regenerate=args.regenerate, full=args.full, tracks_dir=args.tracks, keep=True)
        print(v.report(), file=out)
        return 0 if v.ok else 1
    if args.lb_command == "sign":
        return _sign(args, out)
    # build
    from collab_env.leaderboard.board import board_data

    data = board_data(args.directory, verify=not args.no_verify, reverify=args.reverify, tracks_dir=args.tracks,
                      data_files=args.data_files, progress=lambda line: print(line, file=sys.stderr, flush=True))
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
    print(f"{len(data['entries'])} entries ({n_ok} verified{extra}) on {len(data['tracks'])} tracks: {written}",
          file=out)
    return 0


def _check_connection_roles(args: argparse.Namespace, track: Any) -> None:
    """``--api-base``/``--api-key-env`` connect submitted players only: the server of a role the
    track fixes (its user simulator, its judge) is the track file's (``api_base``, ``api_key_env``)."""
    for flag, items in (("--api-base", args.api_base), ("--api-key-env", args.api_key_env)):
        for item in items or ():
            role = item.partition("=")[0]
            if role in track.players or (role == "judge" and track.judge is not None):
                raise ConfigError(f"{flag} {role}=...: track {track.id} fixes the {role}, and where it is served; "
                                  f"its track file names the server ({role}: \"api_base\", \"api_key_env\"). "
                                  f"{flag} connects the submitted players {list(track.submitted)}.")


def _sign(args: argparse.Namespace, out: Writer) -> int:
    """``collab-env leaderboard sign DIRECTORY --key FILE``: verify the board (re-playing what this
    machine has not verified yet, every episode's calls regenerated on tracks with an LLM user or
    judge) and sign every entry's verdict into DIRECTORY/verdicts.signed.json."""
    from pathlib import Path

    from collab_env.leaderboard.board import board_data, read_stamps
    from collab_env.leaderboard.signing import SIGNED_FILE, sign_verdicts

    directory = Path(args.directory)
    data = board_data(directory, verify=True, reverify=args.reverify, num_boot=10, full=True, tracks_dir=args.tracks,
                      data_files=args.data_files, progress=lambda line: print(line, file=sys.stderr, flush=True))
    stamps, _ = read_stamps(directory)
    listed = {Path(e["path"]).resolve().relative_to(directory.resolve()).as_posix() for e in data["entries"]}
    signed = sign_verdicts({rel: s for rel, s in stamps.items() if rel in listed}, args.key)
    (directory / SIGNED_FILE).write_text(json.dumps(signed, indent=1, sort_keys=True) + "\n")
    n_ok = sum(s["ok"] for s in signed["verdicts"].values())
    print(f"{len(signed['verdicts'])} verdicts ({n_ok} verified) of {len(data['entries'])} entries signed with "
          f"{signed['key_id']}: {directory / SIGNED_FILE}", file=out)
    return 0

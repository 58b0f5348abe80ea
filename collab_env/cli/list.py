"""``collab-env list [--suite S] [--all]``: the registered environments, one row each.

Superseded versions (a newer version of the same name is registered) are hidden unless
``--all`` is given; then their rows say which id supersedes them."""

from __future__ import annotations

import argparse

from collab_env.cli._common import one_line, table
from collab_env.cli.output import Writer
from collab_env.errors import ConfigError, did_you_mean

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``list`` and its options to the subcommands ``sub``."""
    q = sub.add_parser("list", help="list registered environments")
    q.add_argument("--suite", help="only this suite (builtin, collabllm, comlrl...)")
    q.add_argument("--all", action="store_true",
                   help="also list superseded versions (kept so that old results reproduce)")


def run(args: argparse.Namespace, out: Writer) -> int:
    from collab_env.registry import latest_spec, list_envs, registry, spec

    ids = list_envs(args.suite, superseded=args.all)
    if not ids:
        suites = sorted({s.suite for s in registry.values()})
        raise ConfigError(f"no environments in suite {args.suite!r}; suites: {suites}."
                          + did_you_mean(args.suite, suites))
    rows = [["ID", "SUITE", "PLAYERS", "DESCRIPTION"]]
    for env_id in ids:
        s = spec(env_id)
        newest = latest_spec(s.id)
        note = f"Superseded by {newest.id}. " if newest.id != s.id else ""
        rows.append([s.id, s.suite, ",".join(s.players), one_line(note + s.description)])
    print(table(rows), file=out)
    if not args.all and len(ids) < len(list_envs(args.suite)):
        hidden = len(list_envs(args.suite)) - len(ids)
        print(f"({hidden} superseded version{'s' if hidden != 1 else ''} hidden; --all lists them)",
              file=out)
    return 0

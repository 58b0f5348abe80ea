"""``collab-env list [--suite S]``: the registered environments, one row each."""

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


def run(args: argparse.Namespace, out: Writer) -> int:
    from collab_env.registry import list_envs, registry, spec

    ids = list_envs(args.suite)
    if not ids:
        suites = sorted({s.suite for s in registry.values()})
        raise ConfigError(f"no environments in suite {args.suite!r}; suites: {suites}."
                          + did_you_mean(args.suite, suites))
    rows = [["ID", "SUITE", "PLAYERS", "DESCRIPTION"]]
    for env_id in ids:
        s = spec(env_id)
        rows.append([s.id, s.suite, ",".join(s.players), one_line(s.description)])
    print(table(rows), file=out)
    return 0

"""``collab-env data``: RL/SFT/DPO training sets from CollabLLM conversations. The command is
:func:`collab_env.tasks.collabllm_data.main` (its own parser, ``collab-env data --help``); this
module checks the output folder first, before the work that would fill it."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

from collab_env.errors import ConfigError

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``data`` and its options to the subcommands ``sub``."""
    q = sub.add_parser("data", help="build RL/SFT/DPO datasets from CollabLLM conversations",
                       add_help=False)
    q.add_argument("data_args", nargs=argparse.REMAINDER,
                   help="the arguments of collab-env data (collab-env data --help lists them)")


def _output_dir(argv: Sequence[str]) -> str | None:
    """The ``--output_dir`` (alias ``--local_dir``) that ``collab-env data`` was given, if any."""
    q = argparse.ArgumentParser(add_help=False)
    q.add_argument("--output_dir", "--local_dir", dest="output_dir")
    return q.parse_known_args(list(argv))[0].output_dir


def _check_writable_dir(path: str) -> None:
    """Create ``path`` and write a probe file in it, so an unwritable output folder fails before
    the work that would fill it (OSError, reported by :func:`collab_env.cli.main`)."""
    import tempfile

    folder = os.path.expanduser(path)
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise ConfigError(f"--output_dir {folder} is a file; give a folder (it is created if missing).")
    os.makedirs(folder, exist_ok=True)
    with tempfile.TemporaryFile(dir=folder):
        pass


def run(argv: Sequence[str]) -> int:
    """``collab-env data ARGV...``: its exit status (that of its own parser for ``--help`` or a
    usage error)."""
    from collab_env.tasks.collabllm_data import RECIPE_LOCAL_DIR
    from collab_env.tasks.collabllm_data import main as data_main

    if not any(a in ("-h", "--help") for a in argv):
        _check_writable_dir(_output_dir(argv) or RECIPE_LOCAL_DIR)
    try:
        return data_main(list(argv))
    except SystemExit as exc:  # its --help or a usage error: argparse already printed
        return exc.code if isinstance(exc.code, int) else 0

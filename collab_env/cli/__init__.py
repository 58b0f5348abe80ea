"""The ``collab-env`` command.

::

    collab-env list [--suite S] [--all]         registered environments (--all: superseded versions too)
    collab-env info ID [--json]                 one environment's spec
    collab-env check ID [--data-files F]        run the conformance checker on an env
    collab-env check-user SPEC [--episodes N]   a user simulator's fidelity card (docs/check_user.md)
    collab-env play ID [--player P] ...         play one player yourself in the terminal
    collab-env eval ID --policy P=SPEC ...      evaluation run, results to a JSONL file
    collab-env data --data_files F --output_dir D   CollabLLM RL/SFT/DPO datasets
    collab-env leaderboard run|verify|build|tracks  leaderboard tracks, submissions and page
    collab-env model-dir                        the embedded model's folder (converted once)

A policy ``SPEC`` is an alias (``ask-then-answer``, ``answer-at-once``...), ``default`` (the
spec's default policy for that player) or ``module:Class``. ``--import MODULE`` (before the
subcommand, repeatable) imports a module first, so environments and policies it registers are
available: ``collab-env --import my_envs check my-env-v0``; it is looked up on the Python path,
then in the current folder (``my_envs.py`` or ``my_envs/``).

Exit status: 0 success; 1 a check failed (``check-user``: a measure is flagged), an evaluation had
failed episodes, ``play`` input ended early, or ``data`` rejected its rows; 2 a usage or
configuration error; 3 a file error (a missing input, an output that cannot be written: read-only
or pseudo file system, a parent that is a file, a folder where a file belongs, no permission, a
full disk); 130 Ctrl-C. Errors are one line on stderr, with the path and what to do, never a
traceback. Commands that write check their output path before doing any long work. :func:`main`
takes ``argv`` and returns the status, so the CLI is testable in-process.

The package: :mod:`~collab_env.cli.app` (the parser and :func:`main`), one module per command
(:mod:`~collab_env.cli.list`, :mod:`~collab_env.cli.info`, :mod:`~collab_env.cli.check`,
:mod:`~collab_env.cli.check_user`,
:mod:`~collab_env.cli.play`, :mod:`~collab_env.cli.eval`, :mod:`~collab_env.cli.data`,
:mod:`~collab_env.cli.leaderboard`, :mod:`~collab_env.cli.model_dir`: each adds its options to the
parser and runs the command),
:mod:`~collab_env.cli.output` (the output stream, OS errors as one line) and the helpers they
share. ``python -m collab_env.cli`` runs the command too.
"""

from __future__ import annotations

from collab_env.cli.app import build_parser, main
from collab_env.cli.output import os_error_message

__all__ = ["main", "build_parser", "os_error_message"]

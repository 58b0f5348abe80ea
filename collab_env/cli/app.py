"""The entry point of ``collab-env``: the argument parser (each command adds its own options, see
the command's module) and :func:`main`, which runs a command and turns every error into one line
on stderr and an exit status (see :mod:`collab_env.cli`)."""

from __future__ import annotations

import argparse
import importlib
import sys
import warnings
from collections.abc import Sequence
from typing import TextIO

from collab_env.cli import check as check_cmd
from collab_env.cli import check_user as check_user_cmd
from collab_env.cli import data as data_cmd
from collab_env.cli import eval as eval_cmd
from collab_env.cli import info as info_cmd
from collab_env.cli import leaderboard as leaderboard_cmd
from collab_env.cli import list as list_cmd
from collab_env.cli import model_dir as model_dir_cmd
from collab_env.cli import play as play_cmd
from collab_env.cli import serve as serve_cmd
from collab_env.cli._common import PROG
from collab_env.cli.output import Output, drop_stdout, os_error_message
from collab_env.errors import CollabEnvError, ConfigError
from collab_env.policy import SPEC_HELP

__all__ = ["main", "build_parser", "import_user_module"]

#: The command modules, in the order ``collab-env --help`` lists them.
COMMANDS = (list_cmd, data_cmd, info_cmd, check_cmd, check_user_cmd, play_cmd, eval_cmd, serve_cmd, leaderboard_cmd,
            model_dir_cmd)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``collab-env``."""
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Multi-turn, multi-party LLM collaboration environments.",
        epilog="Policy SPEC: 'default' (the env's default for that player) or " + SPEC_HELP + ".",
    )
    p.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                   help="import MODULE first (registers its environments/policies); looked up on the Python "
                        "path, then in the current folder (MODULE.py or MODULE/); repeatable")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        command.add_parser(sub)
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


def import_user_module(name: str) -> None:
    """``--import NAME``: import ``NAME`` from the Python path, else from the current folder
    (``NAME.py`` or a package ``NAME/`` there; the folder is appended to ``sys.path``, after the
    installed packages, so a file there never shadows one of them). The ``collab-env`` script's
    own folder, not the current one, heads ``sys.path``, so without this a module beside the
    user needs ``PYTHONPATH=.``.

    Raises:
        ConfigError: The module is nowhere to be found (the message says where it looked and
            how to point at it), or importing it failed (the message names the error).
    """
    import os
    from pathlib import Path

    top = name.split(".")[0]
    try:
        importlib.import_module(name)
        return
    except ModuleNotFoundError as exc:
        if exc.name not in {top, name}:  # the module was found; something it imports is missing
            raise ConfigError(f"--import {name}: {exc}") from exc
        missing = exc
    except ImportError as exc:
        raise ConfigError(f"--import {name}: {exc}") from exc
    except Exception as exc:  # noqa: BLE001 - the user's module raised while importing: one line
        raise ConfigError(f"--import {name}: importing it raised {type(exc).__name__}: {exc}") from exc
    cwd = os.getcwd()
    here = Path(cwd)
    if (here / f"{top}.py").is_file() or (here / top / "__init__.py").is_file():
        if cwd not in sys.path:
            sys.path.append(cwd)
        importlib.invalidate_caches()
        try:
            importlib.import_module(name)
            return
        except Exception as exc:  # noqa: BLE001 - as above, from the current folder
            raise ConfigError(f"--import {name}: {here / top} was found in the current folder, but importing it "
                              f"raised {type(exc).__name__}: {exc}") from exc
    raise ConfigError(f"--import {name}: no module {top!r} on the Python path ({missing}) nor in the current folder "
                      f"{cwd} ({top}.py or {top}/__init__.py). Run collab-env from the folder that holds it, install "
                      f"it (pip install -e DIR), or set PYTHONPATH=DIR.")


def _data_split(argv: Sequence[str]) -> int | None:
    """Where ``data`` stands in ``argv`` when it is the command (after any ``--import M``), else
    ``None``. ``data`` has a parser of its own, which gets every argument after it."""
    i = 0
    while i < len(argv) and (argv[i] == "--import" or argv[i].startswith("--import=")):
        i += 2 if argv[i] == "--import" else 1
    return i if argv[i:i + 1] == ["data"] else None


def _main(argv: list[str] | None, *, stdin: TextIO | None, stdout: TextIO | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args: argparse.Namespace | None = None
    out = Output(stdout or sys.stdout)
    # Every command's errors end here: one line on stderr, never a traceback.
    try:
        at = _data_split(argv)
        try:  # data: only the options before it here; its own parser reads the rest
            args = parser.parse_args(argv if at is None else argv[:at + 1])
        except SystemExit as exc:  # --help or a usage error: argparse already printed
            return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
        for mod in args.imports:
            import_user_module(mod)
        data_argv = [] if at is None else argv[at + 1:]
        commands = {"list": lambda: list_cmd.run(args, out), "info": lambda: info_cmd.run(args, out),
                    "check": lambda: check_cmd.run(args, out),
                    "check-user": lambda: check_user_cmd.run(args, out), "eval": lambda: eval_cmd.run(args, out),
                    "serve": lambda: serve_cmd.run(args, out),
                    "play": lambda: play_cmd.run(args, out, stdin or sys.stdin),
                    "leaderboard": lambda: leaderboard_cmd.run(args, out),
                    "model-dir": lambda: model_dir_cmd.run(args, out),
                    "data": lambda: data_cmd.run(data_argv)}
        status = commands[args.command]()
        out.flush()  # a full disk or a closed pipe behind stdout shows here, not at exit
        return status
    except CollabEnvError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader went away (``collab-env list | head``): stop quietly, as Unix tools do.
        drop_stdout(out)
        return 141
    except OSError as exc:
        drop_stdout(out)
        print(f"{PROG}: error: {os_error_message(exc)}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        hint = ""
        results = getattr(args, "out", None)
        if getattr(args, "command", None) == "eval" and results:
            hint = f" Finished episodes are in {results}; rerun with --resume to continue."
        elif getattr(args, "lb_command", None) == "run":
            hint = f" Finished episodes are in {results}; rerun the same command to resume."
        print(f"\n{PROG}: interrupted.{hint}", file=sys.stderr)
        return 130
    return 0

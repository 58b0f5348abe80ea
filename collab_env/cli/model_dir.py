"""``collab-env model-dir``: the folder of the embedded model (SmolLM2-135M-Instruct), converted
from the packaged GGUF file on first use, printed alone on stdout so that a shell can take it
(``MODEL=$(collab-env model-dir)``) and give it to a trainer or ``hf:<folder>``."""

from __future__ import annotations

import argparse

from collab_env.cli.output import Writer

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``model-dir`` to the subcommands ``sub``."""
    sub.add_parser("model-dir", help="print the embedded model's folder (converted once, on first use)")


def run(args: argparse.Namespace, out: Writer) -> int:
    from collab_env.agents import embedded_model_dir

    print(embedded_model_dir(), file=out)
    return 0

"""``collab-env info ID [--json]``: one environment's spec and card."""

from __future__ import annotations

import argparse
import json
import textwrap
from typing import Any

from collab_env.cli.output import Writer

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``info`` and its options to the subcommands ``sub``."""
    q = sub.add_parser("info", help="show an environment's spec")
    q.add_argument("id")
    q.add_argument("--json", action="store_true", help="print the spec as JSON")


def run(args: argparse.Namespace, out: Writer) -> int:
    from collab_env.registry import deprecation_message, spec

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
    superseded = deprecation_message(s.id)
    if superseded:
        print(textwrap.fill("SUPERSEDED: " + superseded, width=88, initial_indent="  ",
                            subsequent_indent="  "), file=out)
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

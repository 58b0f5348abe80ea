"""``collab-env check-user SPEC``: the fidelity card of a user simulator
(:func:`collab_env.eval.check_user.check_user`); exit 1 when a measure is flagged."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from collab_env.cli._common import add_connection_args, add_env_args, env_kwargs, parse_policies, parse_sampling
from collab_env.cli.output import Writer
from collab_env.errors import ConfigError

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``check-user`` and its options to the subcommands ``sub``."""
    q = sub.add_parser("check-user", help="measure a user simulator's fidelity card (leaks, role breaks, "
                                          "injections, consistency...)")
    q.add_argument("spec", metavar="SPEC",
                   help="the user simulator, a policy SPEC as --policy user=SPEC takes it, e.g. llm-user:embedded, "
                        "llm-user:litellm:openai/<model> (with --api-base user=URL), a policy config file, or "
                        "module:Class")
    q.add_argument("--env", default=None, metavar="ID",
                   help="hidden-facts env the probes play (default hidden-facts-v3; its opening must name the objects)")
    q.add_argument("--episodes", type=int, default=8, help="episodes per probe (default 8)")
    q.add_argument("--seed", type=int, default=0, help="base seed; episode k uses seed+k (default 0)")
    q.add_argument("--tolerance", type=float, default=0.1,
                   help="flag a measure when its 95%% interval's lower bound is above this rate (default 0.1)")
    q.add_argument("--sampling", action="append", metavar="user.KEY=VALUE",
                   help="sampling parameter of the simulator, e.g. user.temperature=0; repeatable")
    q.add_argument("--concurrency", type=int, default=None,
                   help="episodes in flight per probe (default: all of them; the probes play at the same time)")
    q.add_argument("--out", metavar="FILE.json", help="write the card as JSON (and its table beside it, FILE.md)")
    q.add_argument("--no-progress", action="store_true", help="no progress lines")
    add_connection_args(q)
    add_env_args(q)


def run(args: argparse.Namespace, out: Writer) -> int:
    from collab_env.eval.check_user import DEFAULT_ENV, check_user

    ns = argparse.Namespace(policy=[f"user={args.spec}"], api_base=args.api_base, api_key_env=args.api_key_env)
    specs, _ = parse_policies(ns)
    sampling = parse_sampling(args.sampling)
    other = sorted(set(sampling) - {"user"})
    if other:
        raise ConfigError(f"--sampling {other[0]}.*: check-user samples only the simulator; write user.KEY=VALUE.")
    if args.out:  # a path that cannot be written fails now, not after the episodes
        for path in (Path(args.out), Path(args.out).with_suffix(".md")):
            path.open("a", encoding="utf-8").close()
    card = check_user(specs["user"], env_id=args.env or DEFAULT_ENV, episodes=args.episodes, seed=args.seed,
                      tolerance=args.tolerance, sampling=sampling.get("user"), env_kwargs=env_kwargs(args),
                      concurrency=args.concurrency, progress=not args.no_progress)
    if isinstance(specs["user"], str):
        card.simulator = args.spec
    print(card.table(), file=out)
    print(f"\n{card.summary()}", file=out)
    if args.out:
        path = Path(args.out)
        path.write_text(json.dumps(card.to_dict(), indent=2) + "\n", encoding="utf-8")
        path.with_suffix(".md").write_text(f"# Fidelity card: {card.simulator}\n\n{card.table()}\n\n{card.summary()}\n",
                                           encoding="utf-8")
        print(f"card written to {path} and {path.with_suffix('.md')}", file=out)
    return 0 if card.passed else 1

"""``collab-env check ID``: the conformance checker (and, with ``--exploits``, the exploit audit)
on an environment; exit 1 when a check fails."""

from __future__ import annotations

import argparse
from typing import Any

from collab_env.cli._common import add_env_args, env_kwargs
from collab_env.cli.output import Writer
from collab_env.errors import ConfigError

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``check`` and its options to the subcommands ``sub``."""
    q = sub.add_parser("check", help="run the conformance checker on an environment")
    q.add_argument("id")
    q.add_argument("--cycles", type=int, help="episodes/steps the checker plays")
    q.add_argument("--exploits", action="store_true",
                   help="also run the exploit audit: every gaming policy against the card's naive baseline")
    q.add_argument("--episodes", type=int, help="episodes per exploit and reward option (with --exploits)")
    q.add_argument("--judge", metavar="SPEC",
                   help="judge for the mr/conversation options of the audit, e.g. 'embedded', or the judge double "
                        "'collab_env.testing.judge_injection:FenceReadingJudge' (with --exploits; the collabllm-* "
                        "envs also need --data-files)")
    q.add_argument("--prompts", metavar="PATH",
                   help="judge with the reference's own rubrics (prompts=: the CollabLLM recipe, a verl or "
                        "verl-recipe checkout, or 'collabllm'); they read the transcript unfenced, as the "
                        "recipe's do (with --exploits --judge)")
    add_env_args(q)


def run(args: argparse.Namespace, out: Writer) -> int:
    from collab_env.checker import check_env
    from collab_env.registry import spec

    s = spec(args.id)
    kwargs: dict[str, Any] = {"make_kwargs": env_kwargs(args)}
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
                if args.prompts:
                    rkw[option]["prompts"] = args.prompts
            ekw["reward_kwargs"] = rkw
        elif args.prompts:
            raise ConfigError("--prompts picks the judges' rubrics: give the judge too (--judge SPEC).")
        kwargs.update(exploits=True, exploit_kwargs=ekw)
    elif args.episodes is not None or args.judge or args.prompts:
        raise ConfigError("--episodes, --judge and --prompts are options of the exploit audit: add --exploits.")
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

"""``collab-env eval ID --policy P=SPEC --episodes N``: an evaluation run, its episode records
written to a JSONL file as they finish (resumable); exit 1 when episodes failed."""

from __future__ import annotations

import argparse
import sys

from collab_env.cli._common import (
    PROG,
    add_connection_args,
    add_env_args,
    add_reward,
    add_reward_args,
    env_kwargs,
    parse_policies,
    parse_sampling,
)
from collab_env.cli.output import Writer

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``eval`` and its options to the subcommands ``sub``."""
    q = sub.add_parser("eval", help="evaluate policies over many seeded episodes")
    q.add_argument("id")
    q.add_argument("--policy", action="append", metavar="PLAYER=SPEC",
                   help="policy of a player (trainable players need one), e.g. assistant=hf:./my-model, "
                        "user=llm-user:litellm:openai/gpt-4o-mini; repeatable (SPEC: see collab-env --help)")
    q.add_argument("--episodes", type=int, required=True, help="number of episodes")
    q.add_argument("--seed", type=int, default=0, help="base seed; episode k uses seed+k (default 0)")
    q.add_argument("--out", help="JSONL result file, written as episodes finish")
    q.add_argument("--resume", action="store_true",
                   help="continue the run in --out: run only the episodes it lacks")
    q.add_argument("--concurrency", type=int, default=8, help="episodes in flight (default 8)")
    q.add_argument("--sampling", action="append", metavar="PLAYER.KEY=VALUE",
                   help="sampling parameter for a policy, e.g. assistant.temperature=0.7; repeatable")
    q.add_argument("--no-progress", action="store_true", help="no progress bar")
    q.add_argument("--no-judge-check", action="store_true",
                   help="with a judged reward, skip the judge's validity check (its judged columns are then "
                        "reported unchecked, and the result file says so); by default a judge below the bar "
                        "(collab_env.eval.judge_check) has its judged columns refused")
    add_reward_args(q)
    add_connection_args(q)
    add_env_args(q)


def run(args: argparse.Namespace, out: Writer) -> int:
    from collab_env.eval import evaluate, failures_path

    policies, judge = parse_policies(args)
    kwargs = env_kwargs(args)
    add_reward(args, judge, kwargs)
    result = evaluate(
        args.id,
        policies,
        num_episodes=args.episodes,
        seed=args.seed,
        out=args.out,
        resume=args.resume,
        concurrency=args.concurrency,
        env_kwargs=kwargs,
        sampling=parse_sampling(args.sampling),
        progress=not args.no_progress,
        judge_check=not args.no_judge_check,
    )
    print(result.summary_table(), file=out)
    if args.out:
        print(f"\n{len(result.episodes)} episode records in {args.out}", file=out)
    if result.failures:
        where = f" (logged in {failures_path(args.out)})" if args.out else ""
        first = result.failures[0]
        print(f"{PROG}: {len(result.failures)} episode(s) failed{where}; first: episode "
              f"{first.episode_id}: {first.error}", file=sys.stderr)
        if args.out:
            print(f"{PROG}: rerun the same command with --resume to retry them.", file=sys.stderr)
        return 1
    return 0

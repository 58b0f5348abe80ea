"""``collab-env eval ID --policy P=SPEC --episodes N``: an evaluation run, its episode records
written to a JSONL file as they finish (resumable); exit 1 when episodes failed."""

from __future__ import annotations

import argparse
import sys

from collab_env.cli._common import (
    PROG,
    add_connection_args,
    add_env_args,
    env_kwargs,
    parse_pairs,
    parse_policies,
    parse_sampling,
    parse_value,
)
from collab_env.cli.output import Writer
from collab_env.errors import ConfigError

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
    q.add_argument("--reward", metavar="OPTION",
                   help="score with a reward option: mr (CollabLLM's multiturn-aware reward), conversation, or "
                        "an option of the env (collab-env info ID); default: the env's own reward")
    q.add_argument("--judge", metavar="SPEC",
                   help="the LLM judge of the reward's judged metrics, a policy SPEC (e.g. "
                        "litellm:openai/gpt-4o-mini, with --api-base judge=URL for a local server)")
    q.add_argument("--reward-arg", action="append", metavar="KEY=VALUE",
                   help="keyword of the reward, e.g. num_rollouts=3, max_user_turns=2, aggregation=verl "
                        "(VALUE parsed as JSON if it can be); repeatable")
    add_connection_args(q)
    add_env_args(q)


def run(args: argparse.Namespace, out: Writer) -> int:
    from collab_env.eval import evaluate, failures_path

    policies, judge = parse_policies(args)
    kwargs = env_kwargs(args)
    reward_kwargs = {k: parse_value(v) for k, v in
                     parse_pairs(args.reward_arg, "--reward-arg", "--reward-arg num_rollouts=3").items()}
    if args.reward is not None:
        if "reward" in kwargs or "reward_kwargs" in kwargs:
            raise ConfigError("give the reward once: --reward (with --judge, --reward-arg) or --env-arg reward=..., "
                              "not both.")
        kwargs["reward"] = args.reward
        if judge is not None:
            reward_kwargs["judge"] = judge
        if reward_kwargs:
            kwargs["reward_kwargs"] = reward_kwargs
    elif judge is not None or reward_kwargs:
        raise ConfigError("--judge and --reward-arg configure a reward option: add --reward mr (CollabLLM's "
                          "multiturn-aware reward) or --reward conversation.")
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

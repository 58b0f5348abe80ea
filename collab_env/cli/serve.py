"""``collab-env serve ID``: one seat of a registered env served as an OpenEnv environment
(:mod:`collab_env.serve.server`), the other seats played by ``--policy PLAYER=SPEC`` (the spec
grammar of ``collab-env eval``), with ``eval``'s reward options."""

from __future__ import annotations

import argparse

from collab_env.cli._common import (
    add_connection_args,
    add_env_args,
    add_reward,
    add_reward_args,
    env_kwargs,
    parse_policies,
)
from collab_env.cli.output import Writer

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``serve`` and its options to the subcommands ``sub``."""
    q = sub.add_parser("serve", help="serve one seat of an env over OpenEnv (HTTP + WebSocket)")
    q.add_argument("id")
    q.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    q.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    q.add_argument("--seat", help="the player served over the wire (default: the env's first trainable player)")
    q.add_argument("--policy", action="append", metavar="PLAYER=SPEC",
                   help="policy of another seat (default: the env's), e.g. user=llm-user:litellm:openai/<model>; "
                        "for the served seat, the policy the multiturn-aware reward's futures use (a session's "
                        "reset(api_base=URL) points it at the trained model); repeatable")
    q.add_argument("--max-sessions", type=int, default=64,
                   help="most sessions (WebSocket connections) at once (default 64)")
    q.add_argument("--max-message-bytes", type=int, default=1 << 20,
                   help="largest WebSocket message read (default 1 MiB)")
    q.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"],
                   help="the web server's log level (default warning)")
    add_reward_args(q)
    add_connection_args(q)
    add_env_args(q)


def run(args: argparse.Namespace, out: Writer) -> int:
    from collab_env.errors import require

    require("openenv", "serve", "collab-env serve")
    from collab_env.serve.server import ServeConfig, serve

    policies, judge = parse_policies(args)
    kwargs = env_kwargs(args)
    add_reward(args, judge, kwargs)
    reward, reward_kwargs = kwargs.pop("reward", None), kwargs.pop("reward_kwargs", {})
    config = ServeConfig(args.id, seat=args.seat, policies=policies, reward=reward, reward_kwargs=reward_kwargs,
                         env_kwargs=kwargs, max_sessions=args.max_sessions, max_message_bytes=args.max_message_bytes)
    try:
        serve(config, args.host, args.port, log_level=args.log_level, announce=out)
    except KeyboardInterrupt:
        pass
    return 0

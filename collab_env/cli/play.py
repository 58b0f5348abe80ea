"""``collab-env play ID``: a person plays one player in the terminal; the other players run their
policies."""

from __future__ import annotations

import argparse
import functools
import sys
from typing import TextIO

from collab_env.cli._common import PROG, add_connection_args, add_env_args, env_kwargs, parse_policies, parse_sampling
from collab_env.cli.output import Writer
from collab_env.errors import ConfigError, did_you_mean

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``play`` and its options to the subcommands ``sub``."""
    q = sub.add_parser("play", help="play one player yourself; the others run their policies")
    q.add_argument("id")
    q.add_argument("--player", help="the player you play (default: the first trainable one)")
    q.add_argument("--policy", action="append", metavar="PLAYER=SPEC",
                   help="policy of another player (default: the env's); repeatable")
    q.add_argument("--seed", type=int, help="reset seed (default: random, printed)")
    q.add_argument("--index", type=int, help="task item index")
    q.add_argument("--sampling", action="append", metavar="PLAYER.KEY=VALUE",
                   help="sampling parameter for a policy, e.g. user.temperature=0.7; repeatable")
    add_connection_args(q)
    add_env_args(q)


def run(args: argparse.Namespace, out: Writer, inp: TextIO) -> int:
    from collab_env._async import run_sync
    from collab_env.compose import make
    from collab_env.eval import choose_policies, load_policy
    from collab_env.registry import spec
    from collab_env.rollout import advance

    s = spec(args.id)
    player = args.player or (s.trainable[0] if s.trainable else s.players[0])
    if player not in s.players:
        raise ConfigError(f"--player {player!r} is not a player of {s.id}; players: {list(s.players)}."
                          + did_you_mean(player, s.players))
    given, _ = parse_policies(args)
    if player in given:
        raise ConfigError(f"you play {player!r}; give policies only for the other players.")
    sampling = parse_sampling(args.sampling)  # before a policy (a model) is loaded
    others = [p for p in s.players if p != player]
    refs = choose_policies(s, given, others)
    policies = {p: load_policy(p, ref) for p, ref in refs.items()}

    env = make(s.id, **env_kwargs(args))
    seed = args.seed
    if seed is None:  # a fresh game each time, but printed so it can be replayed
        import secrets

        seed = secrets.randbelow(2**31)
    options = {"index": args.index} if args.index is not None else None
    obs, infos = env.reset(seed=seed, options=options)
    print(f"{s.id}: you are {player!r} (seed {seed}). Type your message; a line with only '.' "
          "sends it, /quit leaves.", file=out)
    shown = 0
    typed = 0  # messages the person typed, which are not echoed back

    def show_new() -> None:
        # Print what this player can see and has not seen yet. Its own messages are skipped,
        # except those the env wrote in its name (e.g. a simulated user's opening request).
        nonlocal shown
        view = env.observe(player)
        own_total = sum(1 for m in view.messages if m.author == player)
        own_seen = sum(1 for m in view.messages[:shown] if m.author == player)
        for m in view.messages[shown:]:
            if m.author == player:
                own_seen += 1
                if own_seen > own_total - typed:
                    continue
            who = "system" if m.role == "system" else m.author
            if m.author == player:
                who += " (you, written for you)"
            print(f"\n[{who}]\n{m.content}", file=out)
        shown = len(view)

    step = 0
    returns = dict.fromkeys(s.players, 0.0)
    mine: dict[str, str] | None = None  # the person's message, sent in the next round
    try:
        while True:
            # The bots play (the episode driver) until it is the person's turn again.
            run = run_sync(advance(env, policies, obs=obs, infos=infos, until=(player,), actions=mine,
                                   sampling=sampling, seed=functools.partial(_round_seed, seed + step)))
            mine = None
            step += len(run.steps)
            for st in run.steps:
                for p, r in st.rewards.items():
                    returns[p] += r
            obs, infos = run.obs, run.infos
            if run.done or not env.agents:
                break
            show_new()
            text = _read_message(inp, out, player)
            if text is None:
                print("\n(left the game)", file=out)
                return 0
            if isinstance(text, _EOF):
                print(f"{PROG}: input ended before the episode did.", file=sys.stderr)
                return 1
            mine = {player: text}
            typed += 1
        show_new()
        st = env.episode
        how = "terminated" if st.terminated else "truncated" if st.truncated else "ended"
        print(f"\n=== episode {how}: {st.end_reason} after {st.step} step(s) ===", file=out)
        for p in s.players:
            mark = "  (you)" if p == player else ""
            print(f"reward {p}: {returns[p]:g}{mark}", file=out)
        return 0
    finally:
        env.close()


def _round_seed(base: int, k: int) -> int:
    """The seed of round ``k`` of one call of the episode driver that starts at seed ``base``."""
    return base + k


class _EOF:
    """Sentinel: stdin ended in the middle of the game."""


EOF = _EOF()


def _read_message(inp: TextIO, out: Writer, player: str) -> str | None | _EOF:
    """One message from ``inp``: lines up to a line holding only ``.`` (or the end of input).

    Returns the text, ``None`` for ``/quit``, or :data:`EOF` when input ended with nothing typed.
    """
    print(f"\n[{player}] (you; end with a line '.')", file=out, flush=True)
    lines: list[str] = []
    while True:
        line = inp.readline()
        if not line:  # end of input: send what was typed, if anything
            return "\n".join(lines) if lines else EOF
        line = line.rstrip("\r\n")
        if not lines and line.strip() == "/quit":
            return None
        if line.strip() == ".":
            return "\n".join(lines)
        lines.append(line)

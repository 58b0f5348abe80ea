"""What the commands share: the program's name, parsing the ``KEY=VALUE`` options
(``--policy``, ``--env-arg``, ``--sampling``) and the env options (``--data-files``,
``--env-arg``), and the plain-text table."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from collab_env.errors import ConfigError, did_you_mean

__all__ = ["PROG", "parse_value", "parse_pairs", "env_kwargs", "add_env_args", "parse_sampling", "one_line",
           "table", "add_connection_args", "parse_policies", "add_reward_args", "add_reward"]

PROG = "collab-env"


def parse_value(text: str, flag: str = "--env-arg") -> Any:
    """``--env-arg`` values: JSON when they parse (numbers, booleans, lists), else the string;
    JSON nested deeper than :data:`collab_env._json.MAX_DEPTH` is refused before it is parsed."""
    from collab_env._json import check_depth

    check_depth(text, f"{flag} value {text[:40]!r}{'...' if len(text) > 40 else ''}")
    try:
        return json.loads(text)
    except ValueError:
        return text


def parse_pairs(items: Sequence[str] | None, what: str, example: str) -> dict[str, str]:
    """``["a=b", ...]`` -> ``{"a": "b"}``; a malformed or repeated key is a usage error."""
    out: dict[str, str] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise ConfigError(f"{what} takes KEY=VALUE, e.g. {example}; got {item!r}.")
        if key in out:
            raise ConfigError(f"{what} gives {key!r} twice ({out[key]!r} and {value!r}).")
        out[key] = value
    return out


def env_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    kwargs = {k: parse_value(v, f"--env-arg {k}") for k, v in
              parse_pairs(getattr(args, "env_arg", None), "--env-arg", "--env-arg max_steps=8").items()}
    files = getattr(args, "data_files", None)
    if files:
        kwargs["data_files"] = files[0] if len(files) == 1 else list(files)
    return kwargs



def add_env_args(q: argparse.ArgumentParser) -> None:
    """Add ``--data-files`` and ``--env-arg`` (read by :func:`env_kwargs`) to a command's parser."""
    q.add_argument("--data-files", nargs="+", metavar="F",
                   help="local dataset file(s), for suites that read data (works offline)")
    q.add_argument("--env-arg", action="append", metavar="KEY=VALUE",
                   help="keyword argument for the env (VALUE parsed as JSON if it can be); repeatable")


def add_reward_args(q: argparse.ArgumentParser) -> None:
    """Add ``--reward``, ``--judge`` and ``--reward-arg`` (read by :func:`add_reward`) to a command's parser."""
    q.add_argument("--reward", metavar="OPTION",
                   help="score with a reward option: mr (CollabLLM's multiturn-aware reward), conversation, or "
                        "an option of the env (collab-env info ID); default: the env's own reward")
    q.add_argument("--judge", metavar="SPEC",
                   help="the LLM judge of the reward's judged metrics, a policy SPEC (e.g. "
                        "litellm:openai/gpt-4o-mini, with --api-base judge=URL for a local server)")
    q.add_argument("--reward-arg", action="append", metavar="KEY=VALUE",
                   help="keyword of the reward, e.g. num_rollouts=3, max_user_turns=2, aggregation=verl "
                        "(VALUE parsed as JSON if it can be); repeatable")


def add_reward(args: argparse.Namespace, judge: Any, kwargs: dict[str, Any]) -> None:
    """Put ``--reward`` (with ``--judge`` and ``--reward-arg``) into ``kwargs`` as
    :func:`collab_env.make`'s ``reward`` and ``reward_kwargs``; ``judge`` is the judge's spec
    from :func:`parse_policies`."""
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


def add_connection_args(q: argparse.ArgumentParser) -> None:
    """Add ``--api-base ROLE=URL`` and ``--api-key-env ROLE=VAR`` (read by :func:`parse_policies`)."""
    q.add_argument("--api-base", action="append", metavar="ROLE=URL",
                   help="server of a role's API backend (a player or 'judge'), e.g. user=http://127.0.0.1:8000/v1 "
                        "for --policy user=llm-user:litellm:openai/<served model>; repeatable")
    q.add_argument("--api-key-env", action="append", metavar="ROLE=VAR",
                   help="environment variable holding a role's API key (default: the provider's own, e.g. "
                        "OPENAI_API_KEY); repeatable")


def parse_policies(args: argparse.Namespace) -> tuple[dict[str, Any], Any]:
    """``--policy PLAYER=SPEC`` (and ``--judge SPEC`` where the command has it) joined with
    ``--api-base ROLE=URL`` and ``--api-key-env ROLE=VAR``: player -> spec, and the judge's spec
    (``None`` without ``--judge``). A spec with connection settings, or a config file, becomes a
    :class:`~collab_env.policy.PolicySpec` (checked here, before any work); others stay strings."""
    from collab_env.policy import is_spec_file, policy_spec

    specs: dict[str, Any] = dict(parse_pairs(args.policy, "--policy", "--policy assistant=ask-then-answer"))
    bases = parse_pairs(getattr(args, "api_base", None), "--api-base", "--api-base user=http://127.0.0.1:8000/v1")
    keys = parse_pairs(getattr(args, "api_key_env", None), "--api-key-env", "--api-key-env user=OPENAI_API_KEY")
    judge = getattr(args, "judge", None)
    roles = dict(specs)
    if judge is not None:
        roles["judge"] = judge
    for flag, given in (("--api-base", bases), ("--api-key-env", keys)):
        for role in given:
            if role not in roles:
                spec = "--judge SPEC" if role == "judge" else f"--policy {role}=SPEC"
                raise ConfigError(f"{flag} {role}=...: no {spec} to connect; give it one, e.g. "
                                  + ("--judge litellm:openai/<model>." if role == "judge"
                                     else f"--policy {role}=llm-user:litellm:openai/<model> (a user simulator) or "
                                          f"--policy {role}=litellm:openai/<model>."))
    out: dict[str, Any] = {}
    for role, ref in roles.items():
        if role in bases or role in keys or is_spec_file(ref):
            try:
                out[role] = policy_spec(ref, api_base=bases.get(role), api_key_env=keys.get(role))
            except ConfigError as exc:
                raise ConfigError(f"{'--judge' if role == 'judge' and judge is not None else '--policy ' + role}: "
                                  f"{exc}") from None
        else:
            out[role] = ref
    judge_spec = out.pop("judge") if judge is not None else None
    return out, judge_spec


def parse_sampling(items: Sequence[str] | None) -> dict[str, dict[str, Any]]:
    """``--sampling assistant.temperature=0.7`` -> ``{"assistant": {"temperature": 0.7}}``.

    Each parameter is checked here, before any work, against
    :class:`~collab_env.policy.SamplingParams` (the keywords every backend takes): an unknown name,
    a value of the wrong type or out of range is a usage error naming the flag.
    """
    from collab_env.policy import SamplingParams

    names = list(SamplingParams.__dataclass_fields__)
    out: dict[str, dict[str, Any]] = {}
    for key, value in parse_pairs(items, "--sampling", "--sampling assistant.temperature=0.7").items():
        player, dot, name = key.partition(".")
        if not dot or not player or not name:
            raise ConfigError(f"--sampling takes PLAYER.KEY=VALUE, e.g. assistant.temperature=0.7; got {key!r}.")
        flag = f"--sampling {key}={value}"
        if name not in names:
            raise ConfigError(f"{flag}: {name!r} is not a sampling parameter." + did_you_mean(name, names)
                              + f" Valid: {', '.join(names)}.")
        parsed = parse_value(value, f"--sampling {key}")
        try:
            SamplingParams(**{name: parsed})  # its type and range: temperature a number >= 0...
        except ConfigError as exc:
            raise ConfigError(f"{flag}: {exc}") from None
        out.setdefault(player, {})[name] = parsed
    return out


def one_line(text: str, width: int = 76) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3].rstrip() + "..."


def table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)

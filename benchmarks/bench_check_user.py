"""Fidelity cards of the user simulators (collab_env.eval.check_user), as tables in benchmarks/results/.

    python benchmarks/bench_check_user.py scripted   # the env's scripted user, on three levels
    python benchmarks/bench_check_user.py doubles    # the one-defect doubles and the injection double
    python benchmarks/bench_check_user.py embedded --episodes 3 --persona-episodes 2 --allow-loaded

Each writes ``check_user_<which>.{md,json}``: the cards side by side, the command, the wall time
and how busy the machine was. ``embedded`` measures the embedded LLM user and, at the same time
over the same loaded model (the probes' and the personas' calls batch together), each persona
of it (``check_user_personas.{md,json}``); it also records the cards' summaries in
``collab_env/leaderboard/user_cards.json``, which the board shows beside the simulator of every
track that pins the same simulator (the same spec). The embedded user is the one of the
``hidden-facts-easy-llm-user`` track (SmolLM2-135M, plain replies, greedy, 48 new tokens).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import _machine  # noqa: E402

#: The embedded user of the hidden-facts-easy-llm-user track, as a policy spec mapping.
EMBEDDED_USER: dict[str, Any] = {"kind": "llm-user", "backend": "embedded",
                                 "options": {"reply_format": "plain", "max_retries": 2},
                                 "sampling": {"temperature": 0.0, "max_new_tokens": 48}}
DOUBLES = ("LeakingUser", "OverAnsweringUser", "RefusingUser", "RoleBreakingUser", "EarlyQuitter", "NeverEnding",
           "InjectionFollower", "MindChanger")
CARDS_FILE = ROOT / "collab_env" / "leaderboard" / "user_cards.json"


def _subjects(which: str) -> list[tuple[str, Any, str]]:
    """(label, spec or policy, env id) of each card of ``scripted`` and ``doubles``."""
    if which == "scripted":
        return [("hidden-facts-user on hidden-facts-v3", "hidden-facts-user", "hidden-facts-v3"),
                ("hidden-facts-user on hidden-facts-easy-v3", "hidden-facts-user", "hidden-facts-easy-v3"),
                ("hidden-facts-user on hidden-facts-copy-v2", "hidden-facts-user", "hidden-facts-copy-v2")]
    from collab_env.agents.users import LLMUserSimulator
    from collab_env.testing.user_injection import InjectionObeyingUser

    out: list[tuple[str, Any, str]] = [(d, f"collab_env.testing.user_doubles:{d}", "hidden-facts-v3")
                                       for d in DOUBLES]
    out.append(("llm-user on InjectionObeyingUser, fenced", LLMUserSimulator(InjectionObeyingUser()),
                "hidden-facts-v3"))
    out.append(("llm-user on InjectionObeyingUser, unfenced",
                LLMUserSimulator(InjectionObeyingUser(), fence_transcript=False), "hidden-facts-v3"))
    return out


async def _embedded_cards(episodes: int, persona_episodes: int, seed: int) -> tuple[list, list]:
    """The embedded user's card and each persona's, measured at once over one loaded model."""
    import asyncio

    from collab_env.agents.personas import PERSONAS
    from collab_env.agents.users import LLMUserSimulator
    from collab_env.eval.check_user import acheck_user
    from collab_env.policy import resolve_policy

    backend = resolve_policy("embedded")

    def simulator(spec: dict[str, Any]) -> Any:
        return LLMUserSimulator(backend, **spec["options"], sampling=spec["sampling"])

    base = [("llm-user:embedded (track hidden-facts-easy-llm-user)", EMBEDDED_USER)]
    personas = [(f"persona {p}", {**EMBEDDED_USER, "options": {**EMBEDDED_USER["options"], "persona": p}})
                for p in PERSONAS]
    cards = await asyncio.gather(
        *(acheck_user(simulator(spec), episodes=episodes, seed=seed) for _, spec in base),
        *(acheck_user(simulator(spec), episodes=persona_episodes, seed=seed) for _, spec in personas))
    for (label, _), card in zip(base + personas, cards, strict=True):
        card.simulator = label
    pairs = [(spec, card) for (_, spec), card in zip(base + personas, cards, strict=True)]
    return pairs[:len(base)], pairs[len(base):]


def _record_board_cards(cards: list[tuple[Any, Any]], source: str) -> None:
    from collab_env.policy import policy_spec

    data = json.loads(CARDS_FILE.read_text()) if CARDS_FILE.exists() else {"cards": []}
    for spec, card in cards:
        key = policy_spec(spec).to_dict()
        data["cards"] = [c for c in data["cards"] if c["spec"] != key]
        data["cards"].append({"spec": key, "summary": card.summary(), "source": source})
    CARDS_FILE.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _write(stem: Path, which: str, command: str, wall: float, episodes: str, seed: int, load: Any, during: Any,
           cards: list[tuple[Any, Any]]) -> None:
    from collab_env.eval.check_user import card_rows

    record = {"command": command, "wall_s": round(wall, 1), "episodes_per_probe": episodes, "seed": seed,
              "load_before": load.to_dict(), "load_during": during.to_dict(),
              "threads": os.environ.get("OMP_NUM_THREADS"),
              "cards": [c.to_dict() for _, c in cards]}
    stem.with_suffix(".json").write_text(json.dumps(record, indent=2, allow_nan=True) + "\n")
    lines = [f"# Fidelity cards: {which}", "",
             f"`{command}`: {len(cards)} card(s), {episodes} episode(s) per probe, seed {seed}, "
             f"wall {wall:.0f} s for the run; other processes kept {during.other_busy_cores:.1f} of {during.cores} "
             f"cores busy (load average {during.load_average[0]:.1f}). Rate and 95% interval per measure (Wilson "
             "over episodes; facts_revealed: Student's t); **flag**: the interval's lower bound is above the "
             f"tolerance ({cards[0][1].tolerance}). Rules: docs/check_user.md.", "",
             card_rows([c for _, c in cards]), ""]
    lines += [f"* {c.simulator}: {c.summary()}" for _, c in cards]
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(f"wrote {stem}.md and {stem}.json", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("which", choices=("scripted", "doubles", "embedded"))
    p.add_argument("--episodes", type=int, default=None,
                   help="episodes per probe (default 10 for scripted and doubles, 3 for the embedded user)")
    p.add_argument("--persona-episodes", type=int, default=2, help="episodes per probe of each persona (embedded)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", default=str(ROOT / "benchmarks" / "results"))
    _machine.add_load_arguments(p)
    args = p.parse_args(argv)
    load = _machine.check(args)
    from collab_env._async import run_sync
    from collab_env.eval.check_user import check_user

    episodes = args.episodes or {"scripted": 10, "doubles": 10, "embedded": 3}[args.which]
    command = "python benchmarks/bench_check_user.py " + " ".join(argv if argv is not None else sys.argv[1:])
    out = Path(args.out_dir)
    meter = _machine.LoadMeter().start()
    t0 = time.monotonic()
    if args.which == "embedded":
        base, personas = run_sync(_embedded_cards(episodes, args.persona_episodes, args.seed))
        wall = time.monotonic() - t0
        during = meter.stop()
        for _, card in base + personas:
            print(f"{card.simulator}: {card.summary()}", file=sys.stderr)
        _write(out / "check_user_embedded", "the embedded LLM user", command, wall, str(episodes), args.seed, load,
               during, base)
        _write(out / "check_user_personas", "the embedded LLM user's personas", command, wall,
               str(args.persona_episodes), args.seed, load, during, personas)
        _record_board_cards(base, "benchmarks/results/check_user_embedded.json")
        _record_board_cards(personas, "benchmarks/results/check_user_personas.json")
        return 0
    cards = []
    for label, spec, env_id in _subjects(args.which):
        card = check_user(spec, env_id=env_id, episodes=episodes, seed=args.seed, progress=True)
        card.simulator = label
        cards.append((spec, card))
        print(f"{label}: {card.summary()} ({card.wall_s:.0f} s)", file=sys.stderr)
    wall = time.monotonic() - t0
    _write(out / f"check_user_{args.which}", args.which, command, wall, str(episodes), args.seed, load, meter.stop(),
           cards)
    return 0


if __name__ == "__main__":
    sys.exit(main())

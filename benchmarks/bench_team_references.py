"""The team-facts reference teams: success rate and mean return per level, through the eval runner.

Every agent of a level plays the same reference policy (``team-coordinated``, ``team-naive``,
``team-random``), the user is the default scripted :class:`~collab_env.tasks.team.TeamFactsUser`;
episode ``k`` resets with seed ``k`` (:func:`collab_env.eval.evaluate`). Success is the captain's
exact answer (the episode's ``accuracy`` component); wasted (duplicate or useless) questions are
the episode's ``question_cost`` component divided by -0.1.

    python benchmarks/bench_team_references.py                # 200 episodes per level and team
    python benchmarks/bench_team_references.py --episodes 20  # quick look

Writes ``benchmarks/results/team_references.json`` and ``.md`` (``--out`` changes the stem).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TEAMS = ("team-coordinated", "team-naive", "team-random")
LEVELS = ("team-facts-easy-v0", "team-facts-hard-v0", "team-facts-easy-v1", "team-facts-hard-v1",
          "team-facts-easy-v2", "team-facts-hard-v2")


def measure(env_id: str, team: str, episodes: int) -> dict:
    """Success rate, mean return and wasted questions of ``team`` on ``env_id``."""
    from collab_env.eval import evaluate
    from collab_env.registry import spec

    s = spec(env_id)
    result = evaluate(env_id, dict.fromkeys(s.trainable, team), num_episodes=episodes, progress=False)
    returns, successes, wasted = [], [], []
    for ep in result.episodes.values():
        comp = ep.components["agent_0"]  # summed over the episode
        returns.append(ep.returns["agent_0"])
        successes.append(comp["accuracy"])
        wasted.append(round(-comp["question_cost"] / 0.1))
    n = len(returns)
    return {
        "episodes": n,
        "failed": result.summary.failed,
        "success": sum(successes) / n,
        "mean_return": sum(returns) / n,
        "mean_wasted_questions": sum(wasted) / n,
        "mean_steps": result.summary.mean_steps,
        "end_reasons": dict(result.summary.end_reasons),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--episodes", type=int, default=200)
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "team_references"))
    args = p.parse_args(argv)

    results = {env_id: {team: measure(env_id, team, args.episodes) for team in TEAMS} for env_id in LEVELS}
    doc = {"episodes": args.episodes, "seeds": f"0-{args.episodes - 1}", "results": results}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
    lines = [f"# team-facts reference teams ({args.episodes} episodes per level and team, seeds "
             f"0-{args.episodes - 1})", "",
             "| level | team | success | mean return | wasted questions / ep | mean steps | end reasons |",
             "|---|---|---|---|---|---|---|"]
    for env_id, runs in results.items():
        for team, r in runs.items():
            lines.append(f"| `{env_id}` | {team} | {r['success']:.3f} | {r['mean_return']:.3f} | "
                         f"{r['mean_wasted_questions']:.2f} | {r['mean_steps']:.2f} | "
                         + ", ".join(f"{k} {v}" for k, v in sorted(r["end_reasons"].items())) + " |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

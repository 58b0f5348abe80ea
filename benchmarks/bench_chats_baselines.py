"""Reference baselines of ``math-chat`` and ``humaneval-chat`` with the scripted user
(``chat-sentence-user``), scored by the conversation reward (``make(id, reward="conversation")``).

Episode ``k`` resets with seed ``k`` through the one driver (:func:`collab_env.rollout.run_episode`).
Scores only, no timing::

    .venv/bin/python -m benchmarks.bench_chats_baselines --episodes 200
    .venv/bin/python -m benchmarks.bench_chats_baselines --episodes 200 --ids math-chat-v1   # merge

* ``math-chat-v0``, ``math-chat-v1``: ``math-chat-solver`` (asks for each detail, then computes: should win) and
  ``answer-at-once`` (boxes a guess, 10, in its first reply: should lose).
* ``humaneval-chat``: ``canonical-at-once`` (an oracle that delivers the canonical program in its
  first reply: the sandbox's pass rate of the reference solutions) and ``asks-only`` (never
  delivers code). ``--episodes`` is capped at the 164 problems; episode ``k`` plays problem ``k``.

Writes ``benchmarks/results/chats_baselines.json`` (``--ids`` measures only those ids and merges them
into the file).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent / "results" / "chats_baselines.json"
#: The ids measured (each unversioned name pinned: "math-chat" alone is the latest version).
IDS = ("math-chat-v0", "math-chat-v1", "humaneval-chat-v0")


def judge_free(env_id: str) -> dict:
    """humaneval-chat's spec weighs an LLM-judged interactivity term too; these baselines score
    pass rate and token amount alone (no judge), as recorded."""
    from collab_env.tasks.chats import JUDGE_FREE_WEIGHTS

    return {"reward_kwargs": {"weights": dict(JUDGE_FREE_WEIGHTS)}} if env_id.startswith("humaneval") else {}


def _oracle():
    from collab_env.policy import ScriptedPolicy

    class CanonicalAtOnce(ScriptedPolicy):
        """Oracle: the canonical program of the episode's problem (read from the env's item)."""

        name = "canonical-at-once"

        def __init__(self) -> None:
            self.program = ""

        def respond(self, observation, rng):
            return f"```python\n{self.program}```"

    return CanonicalAtOnce()


def run(env_id: str, name: str, assistant, episodes: int) -> dict[str, float]:
    import collab_env
    from collab_env.rollout import run_episode
    from collab_env.tasks.chats import SentenceRevealUser

    env = collab_env.make(env_id, reward="conversation", **judge_free(env_id))
    metric = "accuracy_rule" if env_id.startswith("math") else "pass_rate"
    total = solved = 0.0
    for k in range(episodes):
        if name == "canonical-at-once":
            assistant.program = env.unwrapped.task.get_item(k)["single_turn_completion"]
        ep = run_episode(env, {"assistant": assistant, "user": SentenceRevealUser()}, seed=k,
                         index=k if env_id.startswith("humaneval") else None)
        total += ep.returns["assistant"]
        solved += ep.components["assistant"][metric]
    return {"episodes": episodes, "mean_conversation_reward": round(total / episodes, 6),
            metric: round(solved / episodes, 6)}


def main(argv: list[str] | None = None) -> int:
    from collab_env.policy import FixedTextPolicy
    from collab_env.tasks.chats import MathChatSolver

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--episodes", type=int, default=200)
    ap.add_argument("--ids", nargs="+", default=None, choices=IDS,
                    help="measure only these ids and merge them into the existing file")
    args = ap.parse_args(argv)
    n_code = min(args.episodes, 164)
    runs = {
        **{env_id: lambda env_id=env_id: {
            "math-chat-solver": run(env_id, "math-chat-solver", MathChatSolver(), args.episodes),
            "answer-at-once": run(env_id, "answer-at-once",
                                  FixedTextPolicy("The answer is \\boxed{10}."), args.episodes),
        } for env_id in ("math-chat-v0", "math-chat-v1")},
        "humaneval-chat-v0": lambda: {
            "canonical-at-once": run("humaneval-chat-v0", "canonical-at-once", _oracle(), n_code),
            "asks-only": run("humaneval-chat-v0", "asks-only",
                             FixedTextPolicy("What should the function do?"), n_code),
        },
    }
    results = {
        "command": f"python -m benchmarks.bench_chats_baselines --episodes {args.episodes}",
        "user": "chat-sentence-user",
    }
    if args.ids and OUT.exists():
        results = json.loads(OUT.read_text())  # the other ids' numbers (and the command) are kept
    for env_id, measure in runs.items():
        if not args.ids or env_id in args.ids:
            results[env_id] = measure()
    OUT.write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

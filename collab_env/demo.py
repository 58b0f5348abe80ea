"""The main job on the embedded default: evaluate the baselines on the built-in collaboration
suite, offline, and print the table (``make demo``).

Each policy set plays the same seeded episodes (the same items) of every difficulty level; each
episode is appended to ``runs/demo/<time>/<env>/<policy>.jsonl`` as it ends.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from collab_env.eval import compare

ENVS = ("hidden-facts-easy", "hidden-facts", "hidden-facts-hard")
POLICY_SETS = {
    "ask-then-answer": {"assistant": "ask-then-answer"},
    "answer-at-once": {"assistant": "answer-at-once"},
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m collab_env.demo", description=__doc__)
    parser.add_argument("--episodes", type=int, default=100, help="episodes per env and policy set")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/demo", help="directory for the JSONL result files")
    args = parser.parse_args(argv)
    run_dir = Path(args.out) / time.strftime("%Y%m%d-%H%M%S")
    print(f"collab_env demo: {args.episodes} episodes per env and policy, seed {args.seed}, "
          f"user = the suite's scripted user; results in {run_dir}/\n")
    for env_id in ENVS:
        result = compare(env_id, POLICY_SETS, num_episodes=args.episodes, seed=args.seed,
                         out_dir=run_dir / env_id, progress=False)
        print(result.summary_table())
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

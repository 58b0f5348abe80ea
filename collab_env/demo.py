"""The main job on the embedded default, offline (``make demo``).

1. The scripted baselines ("ask then answer", "answer at once") on the three levels of the
   built-in collaboration suite, the same seeded episodes for each.
2. The embedded model (SmolLM2-135M-Instruct, a real but weak chat model shipped as a PyPI
   package) as the assistant on ``hidden-facts``, plain and with CollabLLM's collaborative
   system prompt (the paper's "Proactive Base"); its calls from concurrent episodes are merged
   into batched ``generate`` calls.

The user is the suite's scripted user. Each episode is appended to
``runs/demo/<time>/<env>/<policy>.jsonl`` as it ends.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from collab_env.eval import compare

ENVS = ("hidden-facts-easy", "hidden-facts", "hidden-facts-hard")
BASELINES = {
    "ask-then-answer": {"assistant": "ask-then-answer"},
    "answer-at-once": {"assistant": "answer-at-once"},
}


def model_policy_sets(max_new_tokens: int) -> dict[str, dict[str, object]]:
    from transformers.utils import logging as hf_logging

    from collab_env.agents.embedded import EmbeddedPolicy
    from collab_env.agents.proactive import Proactive

    hf_logging.disable_progress_bar()  # the weight-loading bar would break up the table output

    # One model serves both sets; greedy decoding so the table is reproducible.
    model = EmbeddedPolicy(max_batch_size=32, temperature=0.0, max_new_tokens=max_new_tokens)
    return {
        "embedded": {"assistant": model},
        "embedded+proactive": {"assistant": Proactive(model)},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m collab_env.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=100, help="episodes per env for the baselines")
    parser.add_argument("--model-episodes", type=int, default=16,
                        help="episodes for each embedded-model set (0 skips the model)")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/demo", help="directory for the JSONL result files")
    args = parser.parse_args(argv)
    run_dir = Path(args.out) / time.strftime("%Y%m%d-%H%M%S")
    print(f"collab_env demo: seed {args.seed}; user = the suite's scripted user; results in {run_dir}/\n")
    for env_id in ENVS:
        result = compare(env_id, BASELINES, num_episodes=args.episodes, seed=args.seed,
                         out_dir=run_dir / env_id, progress=False)
        print(result.summary_table(), end="\n\n", flush=True)
    if args.model_episodes > 0:
        print("Loading the embedded model (the first run converts it once, about a minute)...", flush=True)
        t0 = time.perf_counter()
        sets = {**model_policy_sets(args.max_new_tokens), **BASELINES}
        result = compare("hidden-facts", sets, num_episodes=args.model_episodes, seed=args.seed,
                         out_dir=run_dir / "hidden-facts-model", progress=False,
                         concurrency=args.model_episodes)
        print(result.summary_table())
        print(f"({time.perf_counter() - t0:.0f} s for the model rows; a 135M model rarely asks "
              "the right questions: this is the gap training closes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

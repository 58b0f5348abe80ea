"""The main job on the embedded default, offline (``make demo``).

1. The scripted baselines ("ask then answer", "answer at once") on the three levels of the
   built-in collaboration suite, the same seeded episodes for each.
2. The embedded model (SmolLM2-135M-Instruct, a real but weak chat model shipped as a PyPI
   package) as the assistant on held-out test items of ``hidden-facts-easy``, **before and
   after collab_env training**: the base model, then the same model with the LoRA adapter that
   ``benchmarks/bench_embedded_learning.py`` trained with GRPO on the multiturn-aware reward
   (committed in ``benchmarks/results/embedded_learning_adapter/``; when it is missing, the
   demo says so and prints the one command that regenerates it). Greedy decoding, so the rows
   are reproducible; two assistant turns per episode, as the benchmark evaluates; the
   episodes' calls are merged into batched ``generate`` calls.
   ``--proactive`` adds CollabLLM's collaborative system prompt on the base model (the paper's
   "Proactive Base"). Below the table: questions asked per episode, and the share of episodes
   in which the user revealed the withheld fact. On the question-only user the adapter has
   learned nothing useful yet (its replies collapsed to a few tokens; success stays 0):
   ``benchmarks/results/embedded_learning.md`` says how it was measured.

The user is the suite's scripted user. Each episode is appended to
``runs/demo/<time>/<env>/<policy>.jsonl`` as it ends. A progress bar (on a terminal) runs over
the steps and over the episodes of every model evaluation.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from collab_env.eval import compare

ENVS = ("hidden-facts-easy", "hidden-facts", "hidden-facts-hard")
BASELINES = {
    "ask-then-answer": {"assistant": "ask-then-answer"},
    "answer-at-once": {"assistant": "answer-at-once"},
}
#: The env the adapter was trained on; the model rows use its held-out test split.
MODEL_ENV = "hidden-facts-easy"
#: Env steps of a model-row episode: two assistant turns (elicit the withheld fact, then answer),
#: as the benchmark evaluates the adapter.
MODEL_MAX_STEPS = 4
#: Where ``benchmarks/bench_embedded_learning.py`` saves the adapter (relative to the repository).
ADAPTER = Path("benchmarks") / "results" / "embedded_learning_adapter"
#: The one command that trains and saves that adapter (and the benchmark's results).
TRAIN_COMMAND = "python benchmarks/bench_embedded_learning.py"


def default_adapter() -> Path:
    """The committed adapter of a source checkout (``<repo>/benchmarks/results/...``), else the
    same path under the working directory."""
    repo = Path(__file__).resolve().parents[1] / ADAPTER
    return repo if repo.is_dir() else ADAPTER


def model_policy_sets(max_new_tokens: int, adapter: Path | None, proactive: bool = False
                      ) -> dict[str, dict[str, object]]:
    """Label -> policies of the model rows: the base embedded model, optionally Proactive on it,
    and with an ``adapter`` folder the model with that LoRA adapter."""
    from transformers.utils import logging as hf_logging

    from collab_env.agents.embedded import EmbeddedPolicy

    hf_logging.disable_progress_bar()  # the weight-loading bar would break up the table output

    # Greedy decoding so the table is reproducible.
    base = EmbeddedPolicy(max_batch_size=32, temperature=0.0, max_new_tokens=max_new_tokens)
    sets: dict[str, dict[str, object]] = {"embedded (before training)": {"assistant": base}}
    if proactive:
        from collab_env.agents.proactive import Proactive

        sets["embedded+proactive"] = {"assistant": Proactive(base)}
    if adapter is not None:
        trained = EmbeddedPolicy(max_batch_size=32, temperature=0.0, max_new_tokens=max_new_tokens,
                                 adapter=str(adapter), name="embedded+trained")
        sets["embedded (after collab_env training)"] = {"assistant": trained}
    return sets


def questions_per_episode(result: Any) -> float:
    """Mean assistant turns per episode that ask something (a ``?`` and no boxed answer)."""
    from collab_env.tasks.hidden_facts import extract_boxed

    eps = list(result.episodes.values())
    if not eps:
        return float("nan")
    asked = [sum(1 for t in e.turns if t.player == "assistant" and "?" in t.text and extract_boxed(t.text) is None)
             for e in eps]
    return sum(asked) / len(eps)


def facts_elicited(result: Any, split: str = "test") -> float:
    """Share of the episodes in which the user revealed a fact the opening withheld (the user
    states a fact by its sentence, and only when asked about it): what training improves."""
    import collab_env

    task = collab_env.make(MODEL_ENV, split=split).unwrapped.task
    eps = list(result.episodes.values())
    if not eps:
        return float("nan")
    hits = 0
    for e in eps:
        hidden = [f["sentence"] for f in task.get_item(e.index)["facts"] if f["hidden"]]
        said = " ".join(m.content for m in e.conversation if m.role == "user" and m.author == "user")
        hits += any(h in said for h in hidden)
    return hits / len(eps)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m collab_env.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=100, help="episodes per env for the baselines")
    parser.add_argument("--model-episodes", type=int, default=24,
                        help="held-out episodes for each embedded-model row (0 skips the model)")
    parser.add_argument("--max-new-tokens", type=int, default=32,
                        help="reply length of the model rows (the adapter was trained with 32)")
    parser.add_argument("--adapter", default=None,
                        help=f"LoRA adapter folder of the 'after' row (default: {ADAPTER})")
    parser.add_argument("--proactive", action="store_true", help="add the Proactive row (CollabLLM's prompt)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/demo", help="directory for the JSONL result files")
    args = parser.parse_args(argv)
    from tqdm.auto import tqdm

    run_dir = Path(args.out) / time.strftime("%Y%m%d-%H%M%S")
    print(f"collab_env demo: seed {args.seed}; user = the suite's scripted user; results in {run_dir}/\n")
    adapter = Path(args.adapter) if args.adapter else default_adapter()
    model_steps = ["load the embedded model", "evaluate the model rows"] if args.model_episodes > 0 else []
    steps = tqdm(total=len(ENVS) + len(model_steps), desc="demo", unit="step", leave=False)
    for env_id in ENVS:
        steps.set_postfix_str(f"baselines on {env_id}")
        result = compare(env_id, BASELINES, num_episodes=args.episodes, seed=args.seed,
                         out_dir=run_dir / env_id, progress=False)
        steps.update()
        tqdm.write(result.summary_table() + "\n")
    if args.model_episodes > 0:
        t0 = time.perf_counter()
        if not adapter.is_dir():
            tqdm.write(f"No trained adapter at {adapter}: the 'after' row is skipped. Train it (about 45 min "
                       f"on 2 cores) with:\n    {TRAIN_COMMAND}\n")
        steps.set_postfix_str("loading the embedded model (the first run converts it once, about a minute)")
        sets = model_policy_sets(args.max_new_tokens, adapter if adapter.is_dir() else None, args.proactive)
        steps.update()
        steps.set_postfix_str(f"model rows on {MODEL_ENV} (test split)")
        result = compare(MODEL_ENV, {**sets, **BASELINES}, num_episodes=args.model_episodes, seed=args.seed,
                         out_dir=run_dir / f"{MODEL_ENV}-model", progress=True, concurrency=args.model_episodes,
                         env_kwargs={"split": "test", "max_steps": MODEL_MAX_STEPS})
        steps.update()
        steps.close()
        print(f"Held-out test items of {MODEL_ENV} (two assistant turns): the embedded model before and "
              "after collab_env training")
        print(result.summary_table())
        asked = ", ".join(f"{label} {questions_per_episode(res):.2f}" for label, res in result.results.items())
        print(f"questions asked per episode: {asked}")
        elicited = ", ".join(f"{label} {facts_elicited(res):.2f}" for label, res in result.results.items())
        print(f"episodes where the user revealed the withheld fact: {elicited}")
        print(f"({time.perf_counter() - t0:.0f} s for the model rows; the adapter is "
              f"{'loaded from ' + str(adapter) if adapter.is_dir() else 'missing'}; how it was trained and "
              "what it learned: benchmarks/results/embedded_learning.md)")
    else:
        steps.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

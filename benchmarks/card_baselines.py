"""The reference baselines of the env cards, measured through the eval runner.

Every built-in id that runs offline with scripted players gets its reference policy set (the
one that should win) and its naive one (the one that should lose), ``--episodes`` seeded
episodes each (episode ``k`` resets with seed ``k``), through :func:`collab_env.eval.evaluate`.
The numbers go to ``benchmarks/results/card_baselines.json``; the cards in
:mod:`collab_env.tasks.cards` quote them and ``tests/test_readme.py`` checks that they agree.

Scores only (no timing), so no load check is needed::

    .venv/bin/python -m benchmarks.card_baselines --episodes 200
    .venv/bin/python -m benchmarks.card_baselines --episodes 200 --ids hidden-facts-v1 hidden-facts-easy-v1

``--ids`` measures only those ids and merges them into the existing file (the other ids' numbers
are kept; the episode count must match the file's). On the hidden-facts v1 ids the generic
gaming policies of :mod:`collab_env.exploits.policies` (a keyword dump, the task restated) are
measured too (and on the v2 ids, v1 in text that reads as sense; on the v3 ids, the syntax rule): the user answers questions
only, so they must score no better than the naive set (and on hidden-facts-choose-v0, issue 45, with
the held-out scenarios' words added to the dump's vocabulary).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import collab_env
from collab_env.eval import evaluate
from collab_env.policy import FixedTextPolicy
from collab_env.exploits.policies import KeywordDump, RestateTask
from collab_env.tasks.cards import SAME_TEXT

OUT = Path(__file__).resolve().parent / "results" / "card_baselines.json"

#: What a hostile learner on hidden-facts could know: every attribute keyword of every scenario.
HF_VOCABULARY = ("how many", "number of", "quantity", "count", "price", "cost", "how much", "each",
                 "per", "batches", "sugar", "grams", "per batch", "each batch", "boxes", "weigh",
                 "weight", "kg", "what items", "which items", "what exactly")
#: hidden-facts-choose (issue 45) adds the held-out scenarios' attribute words.
HF_CHOOSE_VOCABULARY = HF_VOCABULARY + ("yarn", "meters", "rows", "water", "liters", "copies", "sheets", "paper")


def baseline_runs() -> dict[str, dict[str, dict[str, object]]]:
    """Env id -> baseline name -> policies (player -> reference) to evaluate."""
    runs: dict[str, dict[str, dict[str, object]]] = {}
    for env_id in ("hidden-facts-easy-v0", "hidden-facts-v0", "hidden-facts-hard-v0"):
        runs[env_id] = {
            "ask-then-answer": {"assistant": "ask-then-answer"},
            "answer-at-once": {"assistant": "answer-at-once"},
        }
    for env_id in ("hidden-facts-easy-v1", "hidden-facts-v1", "hidden-facts-hard-v1", "hidden-facts-copy-v1",
                   "hidden-facts-easy-v2", "hidden-facts-v2", "hidden-facts-hard-v2",
                   "hidden-facts-easy-v3", "hidden-facts-v3", "hidden-facts-hard-v3", "hidden-facts-copy-v2"):
        runs[env_id] = {
            "ask-then-answer": {"assistant": "ask-then-answer"},
            "answer-at-once": {"assistant": "answer-at-once"},
            "keyword-dump (gaming)": {"assistant": KeywordDump("what", vocabulary=HF_VOCABULARY)},
            "restate-task (gaming)": {"assistant": RestateTask("one-clause")},
        }
    runs["hidden-facts-choose-v0"] = {
        "ask-then-answer": {"assistant": "ask-then-answer"},
        "answer-at-once": {"assistant": "answer-at-once"},
        "keyword-dump (gaming)": {"assistant": KeywordDump("what", vocabulary=HF_CHOOSE_VOCABULARY)},
        "restate-task (gaming)": {"assistant": RestateTask("one-clause")},
    }
    runs["length-ratio-v0"] = {
        "length-ratio-partner x2": {"agent_0": "length-ratio-partner", "agent_1": "length-ratio-partner"},
        "same text x2": {"agent_0": FixedTextPolicy(SAME_TEXT), "agent_1": FixedTextPolicy(SAME_TEXT)},
    }
    from collab_env.tasks.letter_requests import NAIVE_TEXT

    runs["letter-requests-v0"] = {
        "letter-requests-solver": {"assistant": "letter-requests-solver"},
        "fixed text (naive)": {"assistant": FixedTextPolicy(NAIVE_TEXT)},
    }
    runs["phone-support-v0"] = {
        "phone-support-reference": {"assistant": "phone-support-reference"},
        "phone-support-naive": {"assistant": "phone-support-naive"},
    }
    # issue 46: the sharded envs in their default mode ('sharded'): the reference waits for every
    # shard, the naive one answers every turn from what it has.
    for env_id in ("sharded-math-v0", "sharded-humaneval-v0"):
        runs[env_id] = {
            "sharded-solver": {"assistant": "sharded-solver"},
            "sharded-answer-now (naive)": {"assistant": "sharded-answer-now"},
        }
    return runs


def measure(episodes: int, ids: list[str] | None = None) -> dict[str, object]:
    """Run every baseline (of ``ids`` only, when given); returns the results document written
    to :data:`OUT`."""
    results: dict[str, object] = {}
    runs = baseline_runs()
    unknown = sorted(set(ids or ()) - set(runs))
    if unknown:
        raise SystemExit(f"--ids: no baselines for {unknown}; choose from {sorted(runs)}")
    for env_id, sets in runs.items():
        if ids and env_id not in ids:
            continue
        per_env = {}
        for name, policies in sets.items():
            r = evaluate(env_id, policies, num_episodes=episodes, seed=0, progress=False)
            if r.failures:
                raise RuntimeError(f"{env_id} / {name}: {len(r.failures)} episode(s) failed: {r.failures[0]}")
            s = r.summary
            player = collab_env.spec(env_id).trainable[0]
            stats = s.players[player]
            per_env[name] = {"player": player, "mean_return": round(stats.mean_return, 6),
                             "success": None if stats.success_rate is None else round(stats.success_rate, 6),
                             "episodes": s.completed, "mean_steps": round(s.mean_steps, 3)}
            print(f"{env_id:22s} {name:26s} return {stats.mean_return:.3f}  success "
                  f"{'-' if stats.success_rate is None else f'{stats.success_rate:.3f}'}  ({s.completed} ep)")
        results[env_id] = per_env
    return {"episodes": episodes, "seed": 0, "results": results}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--episodes", type=int, default=200)
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--ids", nargs="+", default=None,
                   help="measure only these ids and merge them into the existing --out file")
    args = p.parse_args(argv)
    doc = measure(args.episodes, args.ids)
    if args.ids and args.out.exists():
        old = json.loads(args.out.read_text())
        if old["episodes"] != args.episodes:
            raise SystemExit(f"--ids merges into {args.out}, measured with {old['episodes']} episodes: "
                             f"pass --episodes {old['episodes']}")
        doc = {**old, "results": {**old["results"], **doc["results"]}}
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

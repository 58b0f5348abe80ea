"""Evaluation runs: many seeded episodes of one env with fixed policies, results on disk.

>>> from collab_env.eval import evaluate
>>> result = evaluate("hidden-facts", {"assistant": "ask-then-answer"}, num_episodes=50,
...                   out="runs/ask.jsonl")
>>> print(result.summary_table())

Episodes
    Episode ``k`` (its *episode id*) resets the env with ``seed = seed + k``; on suites with a
    finite number of items it also picks item ``k % num_items``, so the same episode ids map to
    the same items in every run and two policy sets evaluated with the same seed are compared on
    the same tasks. Episodes run concurrently (:class:`collab_env.rollout.RolloutEngine`); every
    policy is resolved once per run and shared by all episodes.

Result file (``out``)
    One JSON line per finished episode, appended the moment the episode ends and flushed to disk
    (``fsync``), so a run that is interrupted (Ctrl-C, a killed job) loses no finished episode.
    A line is ``Episode.to_dict()`` plus ``"episode_id"``, ``"status": "ok"`` and ``"run"``: the
    settings that define the run (env id, seed, policy per player, env keyword arguments,
    sampling). Lines are in order of completion, not of episode id.

Failures
    An episode whose policy (or env) raises is *not* scored: it is counted in
    :attr:`EvalResult.failures` and logged to the sidecar file ``<out>.failures.jsonl`` (one
    line with ``"status": "failed"``, the episode id, seed, index, error text and traceback).
    Keeping failures out of the main file means the main file holds exactly one record per
    finished episode id. A failed episode is retried by the next ``resume=True`` run.

    A request that a provider *rejects* (:class:`~collab_env.errors.FatalPolicyError`: a missing
    or invalid API key, another 4xx) is not a per-episode failure: every episode would send one
    doomed request. The run stops at once (no episode starts after it, those in flight are
    cancelled) and raises a ``FatalPolicyError`` with the provider's message, how many episodes
    the file holds, and how to fix the key and continue with ``resume=True`` (``--resume``).

Resume
    ``resume=True`` continues the run in ``out``: episode ids already recorded are kept as they
    are (the file is only appended to) and only the missing or failed ones run. A last line cut
    short by a kill is dropped and its episode redone. A file written with other settings (env
    id, seed, policies, env arguments, sampling) is refused: results of different runs must not
    mix. ``num_episodes`` may grow on resume, to extend a finished run. Without ``resume``, an
    existing non-empty ``out`` is an error, so a run never silently appends to another.
"""


from collab_env.eval.files import failures_path, load_results, prepare_output_file
from collab_env.eval.results import (
    FAILURES_SUFFIX,
    Comparison,
    EpisodeFailure,
    EvalResult,
    EvalSummary,
    PlayerStats,
)
from collab_env.eval.run import (
    aevaluate,
    choose_policies,
    compare,
    evaluate,
    load_policy,
    policy_ref,
)

__all__ = [
    "evaluate",
    "aevaluate",
    "compare",
    "load_results",
    "EvalResult",
    "EpisodeFailure",
    "PlayerStats",
    "EvalSummary",
    "Comparison",
    "failures_path",
    "prepare_output_file",
    "policy_ref",
    "choose_policies",
    "load_policy",
    "FAILURES_SUFFIX",
]

"""Running episodes: players driven by policies, results as :class:`~collab_env.types.Episode`.

A package split by job:

* :mod:`~collab_env.rollout.driver`: **the one episode driver**. :func:`advance` plays an env
  with one policy per player until a chosen player is on turn, the episode ends or a hook says
  stop; :func:`arun_episode` / :func:`run_episode` play one whole episode with it. The engine,
  eval, the single-agent view, the multiturn-aware reward's futures and the learners' rollout
  trees all call :func:`advance`.
* :mod:`~collab_env.rollout.batching`: :class:`BatchedPolicy` wraps **any** policy and merges
  the concurrent ``act`` calls of many episodes (and forks) into one call of the wrapped policy.
* :mod:`~collab_env.rollout.limits`: a global token-bucket :class:`RateLimiter` and the
  concurrency cap on policy calls.
* :mod:`~collab_env.rollout.engine`: :class:`RolloutEngine` (and the shortcuts
  :func:`rollout` / :func:`arollout`) runs **many** episodes at once on one event loop, batching
  policy calls across episodes, with global limits, streaming results, a progress bar, and a
  :class:`~collab_env.errors.FatalPolicyError` that stops the whole run.
* :mod:`~collab_env.rollout.ray_engine`: :class:`~collab_env.rollout.ray_engine.RayRolloutEngine`
  runs the same engine on Ray workers.
* :mod:`~collab_env.rollout.config`, :mod:`~collab_env.rollout.jobs`: settings, counters, job
  lists and plumbing.

Token-exactness
    The driver never re-tokenises or edits what a policy returns: every
    :class:`~collab_env.types.TurnRecord` holds the policy's :class:`~collab_env.types.Completion`
    as it came back (``prompt_token_ids``, ``token_ids``, ``logprobs``), and ``trainable`` is the
    task's verdict (simulated users and the environment are never trainable).
    :func:`trainable_turns` lists what a learner may train on; :func:`token_transcript` gives one
    player's whole episode as one token sequence with a per-token trainable mask.

Seeds
    A job's ``seed`` seeds ``env.reset``; policies get ``seed=seed + step`` at each step (set
    ``policy_seeds=False`` to pass none). See :class:`BatchedPolicy` for how seeds travel in a
    batch.
"""

from collab_env.rollout.batching import BatchedPolicy, BatchStats, batches_itself
from collab_env.rollout.config import RolloutConfig, RolloutStats
from collab_env.rollout.driver import (
    USAGE_KEYS,
    Advance,
    Step,
    act_for,
    advance,
    arun_episode,
    check_policies,
    fatal_error,
    run_episode,
    trainable_turns,
)
from collab_env.rollout.engine import RolloutEngine
from collab_env.rollout.jobs import (
    Result,
    env_factory,
    iterate_in_thread,
    normalize_jobs,
    picklable_error,
)
from collab_env.rollout.limits import RateLimiter
from collab_env.rollout.shortcuts import arollout, rollout
from collab_env.rollout.tokens import TokenTranscript, TurnSample, token_transcript, turn_rewards, turn_samples

__all__ = [
    "advance",
    "Advance",
    "Step",
    "act_for",
    "arun_episode",
    "run_episode",
    "check_policies",
    "BatchedPolicy",
    "BatchStats",
    "batches_itself",
    "RateLimiter",
    "RolloutConfig",
    "RolloutStats",
    "RolloutEngine",
    "rollout",
    "arollout",
    "normalize_jobs",
    "trainable_turns",
    "token_transcript",
    "TokenTranscript",
    "TurnSample",
    "turn_rewards",
    "turn_samples",
    "fatal_error",
    "env_factory",
    "iterate_in_thread",
    "picklable_error",
    "Result",
    "USAGE_KEYS",
]

"""The multiturn-aware reward (MR) of CollabLLM, and the conversation-level reward.

:class:`MultiturnAwareReward` rewards a reply by the conversations that *follow* it. After the
rewarded player (the assistant) moves, the wrapper forks the env ``num_rollouts`` times, rolls
every fork forward with the given policies (the assistant's own policy for future assistant
turns, the user simulator for the user) up to a window, scores each future with weighted
metrics (:mod:`collab_env.rewards.metrics`) and aggregates::

    from collab_env.rewards.mr import MultiturnAwareReward

    env = MultiturnAwareReward(
        base_env,
        policies={"assistant": policy, "user": LLMUserSimulator("litellm:openai/gpt-4o-mini")},
        weights={"accuracy": 1.0, "interactivity": 1.0, "token_amount": -1e-4},
        metric_ctx={"judge_backend": "litellm:openai/gpt-4o-mini"},
    )

:class:`ConversationReward` scores the finished conversation once, at the end of an (evaluation)
episode, with the same metrics and rules. :func:`default_reward` builds either from an env's
spec (the ``collabllm-*`` envs' weights from the paper and the verl recipe), with the judge, the
user simulator and the future policy given as an API model string, ``"embedded"`` or a policy
object; ``collab_env.make(id, reward="mr", reward_kwargs={...})`` calls it.

Aggregation rules (``aggregation=``), for metric values ``v[m][r]`` of rollout ``r``, weights
``w[m]`` and ``n`` scored rollouts:

``"verl"`` (default; the CollabLLM recipe on verl: its ``collabllm`` reward manager, agent loop
and interaction)
    Per metric, the mean over rollouts times the weight, clamped to [-1, 1]; the reward is the
    sum: ``R = sum_m clamp(w[m] * mean_r v[m][r], -1, 1)``.
``"collabllm"`` (the collabllm package's ``multiturn_aware_reward``)
    Per rollout, the weighted sum of the metrics; the reward is the mean over rollouts:
    ``R = mean_r sum_m w[m] * v[m][r]``. Without the clamp it equals the verl rule whenever no
    weighted mean leaves [-1, 1].
``"paper"`` (the CollabLLM paper)
    Per rollout, task metric + judge score - ``min(lambda * tokens, 1)``, where ``lambda`` is
    ``-w[token_metric]`` (so the token weight must be negative) and every other metric counts
    with its weight: ``R = mean_r (sum_{m != tok} w[m] v[m][r] - min(lambda * v[tok][r], 1))``.

Every rule reports one *contribution* per metric, and the contributions sum to the reward
(``infos[player]["reward_components"]``). Each rule also brings its reference's edge cases:

=============================  ==============================  ======================  ==================
case                           ``"verl"``                      ``"collabllm"``         ``"paper"``
=============================  ==============================  ======================  ==================
invalid reply (empty or        reward 0, no future rolled      scored like any text    scored like any
blank; unbalanced, nested,     (``zero_reason:                 (the package checks     text (the paper
repeated or empty ``<think>``  "invalid_reply"``), see         nothing)                states no rule)
block; no visible text left)   :func:`is_valid_reply`
reply leaves no turn budget    reward 0, no future             scored as it stands,    as ``"collabllm"``
(``max_assistant_turns <= 1``  (``"turn_budget"``): verl       once (the package's
or the env truncated the       ends the sample before any      ``max_new_turns=0``
episode at the reply)          interaction                     scores the chat as is)
``<think>...</think>``         removed (and each message       kept                    kept
                               whitespace-trimmed) before the
                               user simulator and the
                               metrics read a transcript
last future assistant turn     dropped: verl generates it,     kept: the package's     as ``"collabllm"``
when the turn budget ends      sees the budget spent and       window counts messages
                               discards it, so futures end     of both sides
                               on a user turn (here it is      (``max_new_turns=N``
                               not generated: its text could   ~ ``max_user_turns=
                               not change the reward)          ceil(N/2)``,
                                                               ``max_assistant_turns=
                                                               floor(N/2)+1``)
``future_token_budget``        the reply and its future share  off by default; same    as ``"collabllm"``
(recipe: 2,048 =               it: a reply that reaches it     cut when set
``max_response_length``)       gets 0 (``"token_budget"``); a
                               future assistant turn that
                               reaches it is dropped and ends
                               the future; user turns count
                               but never cut
a judge / simulator fault in   metric 0 / empty user message   raises                  (no rule)
the reference                  after retries
here, by default               drop the future and count it    drop and count          drop and count
                               (``on_fault="zero"``            (``on_fault="raise"``
                               reproduces verl)                reproduces the package)
``max_user_turns=0``           the immediate reward here       the immediate reward    the immediate
                               (verl's 0 disables the limit)                           reward
=============================  ==============================  ======================  ==================

Choices made where the implementations disagree or leave a gap (stated here, tested in
``tests/rewards/test_mr.py``):

* **The window counts turns per side, and the candidate reply counts**, as in the verl agent
  loop: a future continues while the user has written fewer than ``max_user_turns`` messages
  and the assistant fewer than ``max_assistant_turns`` *including the reply being rewarded*.
  With the recipe's defaults (2 user, 3 assistant turns) a future is
  ``reply, user, assistant, user``: **the last future turn is the user's**. Under the
  ``"collabllm"`` and ``"paper"`` rules ``max_user_turns >= max_assistant_turns`` ends futures
  on an assistant turn instead; under ``"verl"`` a future never ends on an assistant turn the
  turn budget cut (see the table). Turns are messages of a side, not env steps.
* **Window 0 is the immediate reward**: ``max_user_turns=0`` (or, outside ``"verl"``,
  ``max_assistant_turns=1``) scores the conversation as it stands after the reply, once
  (``n = 1``; a deterministic env and temperature-0 judges gain nothing from repeats). The same
  happens when the reply *terminated* the episode (the task ended): there is no future.
* **Token counts start at the reply**: metrics get ``start`` = the index of the rewarded reply,
  so ``token_amount`` (scope ``"future"``) counts the reply and everything after it, as the
  verl metric counts every message after the prompt. The ``future_token_budget`` counts with
  ``token_counter`` (default: whitespace words, the recipe's own token estimate; pass the
  policy's tokenizer for verl's token ids; chat-template tokens are not counted).
* **Faults are never a silent score.** A future whose policy returns a fault completion or
  raises :class:`~collab_env.errors.PolicyError`, or whose scoring raises
  :class:`~collab_env.errors.JudgeError` / :class:`~collab_env.errors.SandboxError`, is
  dropped from the aggregate and reported in ``infos[player]["mr"]["faults"]``
  (``on_fault="drop"``, default); with ``on_fault="raise"`` the first fault raises; with
  ``on_fault="zero"`` (verl's numbers) a failed metric is 0 for that future, a failed user
  simulator writes an empty message and the future goes on, and a failed policy of another
  player raises (verl's rollout fails too). Every fault, zeroed or dropped, is in ``faults``
  (zeroed ones with ``"zeroed": True``) and in ``cost["faults"]``. When no future could be
  scored, :class:`~collab_env.errors.RewardError` is raised: the step fails loudly (a rollout
  engine counts the episode as failed) instead of getting a made-up reward.
* **The user simulator must be named** (``policies={"user": ...}`` or ``default_reward(user=...)``)
  when the env's default user *ignores the candidate*: a policy class with
  ``ignores_candidate = True``, such as the ``collabllm-*`` envs'
  :class:`~collab_env.tasks.collabllm.SessionReplayUser`, which replays recorded turns whatever
  the reply says. ``"replay"`` selects that default on purpose. Reactive scripted users (the
  hidden-facts user answers the reply's questions) stay the default.
* The standard deviation reported per metric is the population one over scored rollouts.

The code, one job a module (every name below stays importable from here):
:mod:`~collab_env.rewards.reply_rules` (the verl recipe's reply rules),
:mod:`~collab_env.rewards.aggregation` (:func:`aggregate`, :class:`MetricSet`,
:class:`ScoredFutures`), :mod:`~collab_env.rewards.common` (the rewarded player, the weights,
the user-simulator rules), :mod:`~collab_env.rewards.multiturn` (:class:`MultiturnAwareReward`,
and :class:`MRScorer`, the driver stage whose futures are played by
:func:`collab_env.rollout.driver.advance` with the driver's own policies),
:mod:`~collab_env.rewards.conversation` (:class:`ConversationReward`) and
:mod:`~collab_env.rewards.defaults` (:func:`default_reward`). Nothing is bound into an env: played
through the episode driver, the futures' assistant is the policy that plays the episode (a
learner's live model, sampling as its rollouts do).

Version history of the reward (not of the envs):

* v1: the ``"verl"`` rule's edge cases (invalid reply, turn budget, ``<think>`` stripping, the
  dropped last assistant turn), ``future_token_budget``, ``on_fault="zero"``; MR refuses to
  roll futures with a user that ignores the candidate unless asked (``"replay"``).
* v0: aggregation only.
"""

from __future__ import annotations

from collab_env.rewards.aggregation import (
    AGGREGATIONS,
    DEFAULT_WEIGHTS,
    ON_FAULT,
    MetricSet,
    ScoredFutures,
    aggregate,
)
from collab_env.rewards.common import REPLAY, USER_CHOICES, check_explicit_user, ignores_candidate
from collab_env.rewards.conversation import ConversationReward
from collab_env.rewards.defaults import default_reward
from collab_env.rewards.multiturn import MRScorer, MultiturnAwareReward, rolls_futures
from collab_env.rewards.reply_rules import is_valid_reply, strip_think, strip_think_conversation

__all__ = [
    "AGGREGATIONS",
    "DEFAULT_WEIGHTS",
    "MetricSet",
    "ScoredFutures",
    "aggregate",
    "MRScorer",
    "MultiturnAwareReward",
    "rolls_futures",
    "ConversationReward",
    "default_reward",
    "REPLAY",
    "ON_FAULT",
    "is_valid_reply",
    "strip_think",
    "strip_think_conversation",
    "ignores_candidate",
    "check_explicit_user",
    "USER_CHOICES",
]

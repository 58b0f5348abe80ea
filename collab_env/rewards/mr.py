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
``tests/test_mr.py``):

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

Version history of the reward (not of the envs):

* v1: the ``"verl"`` rule's edge cases (invalid reply, turn budget, ``<think>`` stripping, the
  dropped last assistant turn), ``future_token_budget``, ``on_fault="zero"``; MR refuses to
  roll futures with a user that ignores the candidate unless asked (``"replay"``).
* v0: aggregation only.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from collab_env.errors import (
    ConfigError,
    FatalPolicyError,
    JudgeError,
    PolicyError,
    RewardError,
    SandboxError,
)
from collab_env.rewards.metrics import Metric, get_metric
from collab_env.types import Conversation
from collab_env.wrappers.base import EnvWrapper

__all__ = [
    "AGGREGATIONS",
    "DEFAULT_WEIGHTS",
    "MetricSet",
    "ScoredFutures",
    "aggregate",
    "MultiturnAwareReward",
    "ConversationReward",
    "default_reward",
    "bind_learner_policies",
    "LEARNER",
    "REPLAY",
    "ON_FAULT",
    "is_valid_reply",
    "strip_think",
    "strip_think_conversation",
    "ignores_candidate",
    "check_explicit_user",
    "USER_CHOICES",
]

#: Put in ``policies`` for a player whose future turns a learner will play: the trainer binds
#: its own (current) policy with :func:`bind_learner_policies` before rolling out.
LEARNER = "learner"

#: ``user="replay"`` (or ``policies={user: "replay"}``): roll futures with the env's default user
#: even though it ignores the candidate (``SessionReplayUser`` replays recorded turns).
REPLAY = "replay"

#: What a fault in a future does (see the module docstring).
ON_FAULT: tuple[str, ...] = ("drop", "raise", "zero")

#: The aggregation rules (see the module docstring).
AGGREGATIONS: tuple[str, ...] = ("verl", "collabllm", "paper")

#: The verl recipe's metric weights (math-hard).
DEFAULT_WEIGHTS: dict[str, float] = {"accuracy": 1.0, "interactivity": 1.0, "token_amount": -1e-4}

#: Errors that make one future unusable (counted as a fault) rather than the whole reward wrong.
_FAULT_ERRORS = (PolicyError, JudgeError, SandboxError)


# ---------------------------------------------------------------------------------------------
# The verl recipe's reply rules
# ---------------------------------------------------------------------------------------------
_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"
_THINK_BLOCK = re.compile(r"<think>(.*?)</think>", re.DOTALL)
_END_OF_TURN = "<|im_end|>"


def is_valid_reply(text: str) -> bool:
    """Whether the verl recipe rolls futures for a reply (else it rewards it 0).

    A reply is valid when it is not blank, holds at most one ``<think>...</think>`` block (as
    many opening as closing tags, so neither unbalanced nor nested), that block is not blank
    inside, and some visible text remains outside it once a trailing ``<|im_end|>`` is removed.
    """
    if not isinstance(text, str) or not text.strip():
        return False
    opens, closes = text.count(_THINK_OPEN), text.count(_THINK_CLOSE)
    if opens != closes or opens > 1:
        return False
    visible = text
    if opens == 1:
        block = _THINK_BLOCK.search(text)
        if block is None or not block.group(1).strip():  # "</think>...<think>" or an empty block
            return False
        visible = _THINK_BLOCK.sub("", text)
    visible = visible.strip()
    if visible.endswith(_END_OF_TURN):
        visible = visible[: -len(_END_OF_TURN)]
    return bool(visible.strip())


def strip_think(text: str) -> str:
    """``text`` without its ``<think>...</think>`` blocks, whitespace-trimmed (what verl's user
    simulator and judges read)."""
    return _THINK_BLOCK.sub("", text).strip()


def strip_think_conversation(conversation: Conversation) -> Conversation:
    """The conversation with :func:`strip_think` applied to every message (same length, so
    message indices such as a metric's ``start`` keep their meaning)."""
    return Conversation(tuple(replace(m, content=strip_think(m.content)) for m in conversation.messages),
                        conversation.viewer)


def _token_count_fn(counter: Any):
    """``text -> count`` from ``token_counter=``: None (whitespace words), a tokenizer (its
    ``encode``) or a callable."""
    if counter is None:
        return lambda text: len(text.split())
    if hasattr(counter, "encode"):
        def count(text: str) -> int:
            try:
                return len(counter.encode(text, add_special_tokens=False))
            except TypeError:  # an encoder without that keyword (e.g. tiktoken)
                return len(counter.encode(text))
        return count
    if callable(counter):
        return lambda text: int(counter(text))
    raise ConfigError(
        f"token_counter must be None (words), a tokenizer with encode() or a callable text -> int, got {counter!r}."
    )


# ---------------------------------------------------------------------------------------------
# Aggregation
# ---------------------------------------------------------------------------------------------
def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def _std(xs: Sequence[float]) -> float:
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))


def aggregate(values: Mapping[str, Sequence[float]], weights: Mapping[str, float],
              rule: str = "verl", *, token_metric: str = "token_amount") -> tuple[float, dict[str, float]]:
    """The reward and each metric's contribution from per-rollout metric values.

    Args:
        values: Metric name -> its value in each scored rollout (same length ``n >= 1``).
        weights: Metric name -> weight (every metric of ``values``).
        rule: ``"verl"``, ``"collabllm"`` or ``"paper"`` (module docstring).
        token_metric: The metric whose penalty the ``"paper"`` rule caps at 1.

    Returns:
        ``(reward, {metric: contribution})``; the contributions sum to the reward.

    Raises:
        ConfigError: Unknown rule, mismatched lengths, a missing weight, or the ``"paper"``
            rule without a negative weight on ``token_metric``.
    """
    if rule not in AGGREGATIONS:
        raise ConfigError(f"aggregation must be one of {list(AGGREGATIONS)}, got {rule!r}.")
    if not values:
        raise ConfigError("aggregate() needs at least one metric.")
    lengths = {len(v) for v in values.values()}
    if len(lengths) != 1 or 0 in lengths:
        raise ConfigError(f"every metric needs one value per scored rollout (n >= 1); got lengths {sorted(lengths)}.")
    missing = [m for m in values if m not in weights]
    if missing:
        raise ConfigError(f"no weight for metrics {missing}.")
    contrib: dict[str, float] = {}
    if rule == "verl":
        for m, vs in values.items():
            contrib[m] = min(1.0, max(-1.0, weights[m] * _mean(vs)))
    elif rule == "collabllm":
        n = len(next(iter(values.values())))
        per_rollout = [sum(weights[m] * values[m][r] for m in values) for r in range(n)]
        for m, vs in values.items():
            contrib[m] = weights[m] * _mean(vs)
        # Same number, computed the package's way; the contributions split it by metric.
        contrib_sum = sum(contrib.values())
        if not math.isclose(contrib_sum, _mean(per_rollout), rel_tol=1e-9, abs_tol=1e-12):
            raise AssertionError("internal: collabllm aggregation mismatch")  # pragma: no cover
    else:  # paper
        if token_metric not in values:
            raise ConfigError(
                f"the 'paper' rule needs the token metric {token_metric!r} among the metrics "
                f"{sorted(values)} (or pass token_metric=...)."
            )
        lam = -weights[token_metric]
        if not lam > 0:
            raise ConfigError(
                f"the 'paper' rule subtracts min(lambda * tokens, 1) with lambda = -weight; the weight "
                f"of {token_metric!r} must be negative (e.g. -1e-4), got {weights[token_metric]}."
            )
        for m, vs in values.items():
            if m == token_metric:
                contrib[m] = -_mean([min(lam * v, 1.0) for v in vs])
            else:
                contrib[m] = weights[m] * _mean(vs)
    return sum(contrib.values()), contrib


# ---------------------------------------------------------------------------------------------
# Scoring a set of conversations
# ---------------------------------------------------------------------------------------------
@dataclass
class ScoredFutures:
    """What scoring a set of futures gave.

    Attributes:
        reward: The aggregated reward.
        contributions: Metric -> its share of the reward (they sum to ``reward``).
        values: Metric -> the raw value of each *scored* rollout.
        details: Per scored rollout, metric -> the metric's ``detail``.
        scored: Indices of the rollouts that were scored.
        faults: One record per dropped rollout: ``{"rollout", "stage", "error"}`` (+ ``player``).
        cost: Summed usage of the futures' policy calls and of the metrics (judge calls...).
    """

    reward: float
    contributions: dict[str, float]
    values: dict[str, list[float]]
    details: list[dict[str, Any]]
    scored: list[int]
    faults: list[dict[str, Any]] = field(default_factory=list)
    cost: dict[str, float] = field(default_factory=dict)

    def summary(self, weights: Mapping[str, float]) -> dict[str, Any]:
        """JSON-friendly per-metric summary: mean, std, weight, contribution, values."""
        return {
            m: {"mean": _mean(vs) if vs else 0.0, "std": _std(vs) if vs else 0.0, "weight": float(weights[m]),
                "contribution": self.contributions[m], "values": list(vs)}
            for m, vs in self.values.items()
        }


def _add(total: dict[str, float], part: Mapping[str, Any]) -> None:
    for k, v in part.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            total[k] = total.get(k, 0.0) + float(v)


class MetricSet:
    """Weighted metrics, the resources they need and an aggregation rule.

    Args:
        weights: Metric name (or ``"extract->NAME"``) -> weight.
        aggregation: ``"verl"``, ``"collabllm"`` or ``"paper"``.
        ctx: Resources passed to every metric (``judge``, ``judge_backend``, ``tokenizer``,
            ``sandbox``, ``scope``, ``rubric``...; see :mod:`collab_env.rewards.metrics`).
        token_metric: The metric the ``"paper"`` rule caps.
        on_fault: ``"drop"``, ``"raise"`` or ``"zero"`` (a failed metric counts 0 for that
            conversation; module docstring).
        strip_think: Remove ``<think>`` blocks before the metrics read a conversation (default:
            on for the ``"verl"`` rule only, as the recipe does).
    """

    def __init__(self, weights: Mapping[str, float], *, aggregation: str = "verl",
                 ctx: Mapping[str, Any] | None = None, token_metric: str = "token_amount",
                 on_fault: Literal["drop", "raise", "zero"] = "drop", strip_think: bool | None = None) -> None:
        if not isinstance(weights, Mapping) or not weights:
            raise ConfigError(f"weights must be a non-empty mapping metric -> weight, got {weights!r}.")
        for m, w in weights.items():
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w):
                raise ConfigError(f"the weight of {m!r} must be a finite number, got {w!r}.")
        if aggregation not in AGGREGATIONS:
            raise ConfigError(f"aggregation must be one of {list(AGGREGATIONS)}, got {aggregation!r}.")
        if on_fault not in ON_FAULT:
            raise ConfigError(
                f"on_fault must be one of {list(ON_FAULT)} ('zero' reproduces verl's numbers), got {on_fault!r}."
            )
        if strip_think is not None and not isinstance(strip_think, bool):
            raise ConfigError(f"strip_think must be True, False or None (the rule's default), got {strip_think!r}.")
        self.metrics: dict[str, Metric] = {m: get_metric(m) for m in weights}
        self.weights = {m: float(w) for m, w in weights.items()}
        self.aggregation = aggregation
        self.ctx = dict(ctx or {})
        self.token_metric = token_metric
        self.on_fault = on_fault
        self.strip_think = (aggregation == "verl") if strip_think is None else strip_think
        if aggregation == "paper":  # fail at construction, not at the first reward
            aggregate({m: [0.0] for m in weights}, self.weights, "paper", token_metric=token_metric)

    async def score(self, conversations: Sequence[Conversation | None], item: Mapping[str, Any], *,
                    start: int, faults: Sequence[dict[str, Any]] = (),
                    cost: Mapping[str, float] | None = None, player: str | None = None) -> ScoredFutures:
        """Score every conversation (``None``: a future that already faulted), all metrics of
        all conversations concurrently, and aggregate the ones that scored.

        Raises:
            RewardError: No conversation could be scored.
        """
        faults = list(faults)
        total = dict(cost or {})
        if self.strip_think:
            conversations = [None if c is None else strip_think_conversation(c) for c in conversations]
        ctx = {**self.ctx, **({"player": player} if player is not None and "player" not in self.ctx else {})}
        jobs = [(r, m) for r, conv in enumerate(conversations) if conv is not None for m in self.metrics]

        async def one(r: int, m: str):
            try:
                return await self.metrics[m](conversations[r], item, start=start, **ctx)
            except _FAULT_ERRORS as exc:
                if self.on_fault == "raise" or isinstance(exc, FatalPolicyError):
                    raise  # a rejected request (no API key...) fails every future alike
                return exc

        results = await asyncio.gather(*(one(r, m) for r, m in jobs))
        by_rollout: dict[int, dict[str, Any]] = {}
        for (r, m), res in zip(jobs, results, strict=True):
            by_rollout.setdefault(r, {})[m] = res
        values: dict[str, list[float]] = {m: [] for m in self.metrics}
        details: list[dict[str, Any]] = []
        scored: list[int] = []
        for r in sorted(by_rollout):
            res = by_rollout[r]
            for m_res in res.values():
                if not isinstance(m_res, Exception):
                    _add(total, m_res.usage)
            bad = {m: e for m, e in res.items() if isinstance(e, Exception)}
            if bad and self.on_fault == "zero":  # verl: a metric that still fails counts 0
                for m, e in bad.items():
                    faults.append({"rollout": r, "stage": f"metric:{m}", "error": f"{type(e).__name__}: {e}"[:500],
                                   "zeroed": True})
            elif bad:
                m, e = next(iter(bad.items()))
                faults.append({"rollout": r, "stage": f"metric:{m}", "error": f"{type(e).__name__}: {e}"[:500]})
                continue
            scored.append(r)
            for m in self.metrics:
                values[m].append(0.0 if m in bad else res[m].value)
            details.append({m: ({"fault": f"{type(bad[m]).__name__}: {bad[m]}"[:500]} if m in bad else res[m].detail)
                            for m in self.metrics})
        total["faults"] = total.get("faults", 0.0) + len(faults)
        if not scored:
            reasons = "; ".join(f"rollout {f['rollout']} ({f['stage']}): {f['error'][:200]}" for f in faults[:3])
            raise RewardError(
                f"no future could be scored ({len(faults)} fault(s)): {reasons}. Check the user "
                "simulator / judge backends (a larger model, more retries), or pass on_fault='raise' "
                "to stop at the first fault."
            )
        reward, contrib = aggregate(values, self.weights, self.aggregation, token_metric=self.token_metric)
        return ScoredFutures(reward, contrib, values, details, scored, faults, total)


# ---------------------------------------------------------------------------------------------
# The multiturn-aware reward
# ---------------------------------------------------------------------------------------------
def _as_policy(ref: Any) -> Any:
    from collab_env.agents.base import resolve_policy

    return resolve_policy(ref)


def _mix_seed(*parts: int) -> int:
    h = 1469598103934665603
    for p in parts:
        h = ((h ^ (p & 0xFFFFFFFFFFFFFFFF)) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h % (2**31 - 1)


class MultiturnAwareReward(EnvWrapper):
    """Reward ``player``'s replies by sampled future conversations (CollabLLM's MR).

    Args:
        env: The env to wrap (a ``CollabEnv`` or a wrapper of one; it must support ``clone()``).
        policies: Player -> policy (object, alias or ``"<backend>:<model>"``) for the future
            turns. ``player``'s own policy is required when the window is not 0 (in training,
            the policy being trained); other players default to the spec's default policies,
            except a default user that ignores the candidate (``SessionReplayUser`` of the
            ``collabllm-*`` envs): name the user simulator (an LLM user simulator, or
            :data:`REPLAY` to replay the recorded turns on purpose).
        weights: Metric -> weight (default: the env spec's ``reward`` weights when they name
            registered metrics, else :data:`DEFAULT_WEIGHTS`).
        num_rollouts: Futures sampled per reply (recipe: 3).
        max_user_turns: Future user messages at most (recipe: 2). 0 = the immediate reward.
        max_assistant_turns: ``player`` messages at most, the rewarded reply included (recipe: 3).
        aggregation: ``"verl"`` (default), ``"collabllm"`` or ``"paper"``.
        player: The rewarded player (default: the only trainable player of the task).
        metric_ctx: Resources for the metrics (``judge``, ``judge_backend``, ``tokenizer``,
            ``sandbox``, ``rubric``, ``scope``...).
        sampling: Player -> sampling keywords for the future turns.
        token_metric: The metric the ``"paper"`` rule caps at 1.
        on_fault: ``"drop"`` (default), ``"raise"`` or ``"zero"`` (verl: a failed metric counts 0,
            a failed user simulator writes an empty message).
        return_futures: Put the sampled futures (message dicts) in the infos.
        future_token_budget: Tokens the reply and each of its futures may use together (verl's
            ``max_response_length``, 2,048 in the recipe); ``None`` (default): no budget.
        token_counter: How the budget counts: ``None`` (whitespace words), a tokenizer (its
            ``encode``) or a callable ``text -> int``.

    Rewards: ``player`` gets the MR at every step where it moved; other players (and
    ``player`` at steps where it did not move) keep the env's reward.

    Infos: at a rewarded step, ``infos[player]["mr"]`` holds ``reward``, ``aggregation``,
    ``num_rollouts``, ``scored`` (rollouts scored), ``metrics`` (per metric ``mean``, ``std``,
    ``weight``, ``contribution``, ``values``), ``cost`` (summed usage of the futures' policy
    calls and of the metrics: ``model_calls``, ``prompt_tokens``, ``completion_tokens``,
    ``judge_calls``, ``policy_calls``, ``faults``...), ``faults`` (one record per dropped
    future), ``future_turns`` (messages generated per future), ``dropped_turns`` (future
    assistant turns the verl rule or the token budget dropped, per future), ``zero_reason``
    (``None``, or why the verl rule gave 0 without futures: ``"invalid_reply"``,
    ``"turn_budget"``, ``"token_budget"``), ``window`` and, with ``return_futures``,
    ``futures``. ``infos[player]["reward_components"]`` adds each metric's
    contribution, ``"mr"`` (the reward) and ``"env"`` (the env's own reward).

    Cumulative counters are in :attr:`stats`.
    """

    def __init__(
        self,
        env: Any,
        *,
        policies: Mapping[str, Any] | None = None,
        weights: Mapping[str, float] | None = None,
        num_rollouts: int = 3,
        max_user_turns: int = 2,
        max_assistant_turns: int = 3,
        aggregation: str = "verl",
        player: str | None = None,
        metric_ctx: Mapping[str, Any] | None = None,
        sampling: Mapping[str, Mapping[str, Any]] | None = None,
        token_metric: str = "token_amount",
        on_fault: Literal["drop", "raise", "zero"] = "drop",
        return_futures: bool = False,
        future_token_budget: int | None = None,
        token_counter: Any = None,
    ) -> None:
        super().__init__(env)
        for name, v, lo in (("num_rollouts", num_rollouts, 1), ("max_user_turns", max_user_turns, 0),
                            ("max_assistant_turns", max_assistant_turns, 1)):
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ConfigError(f"{name} must be an int >= {lo}, got {v!r}.")
        if future_token_budget is not None and (isinstance(future_token_budget, bool)
                                                or not isinstance(future_token_budget, int) or future_token_budget < 1):
            raise ConfigError(f"future_token_budget must be None or an int >= 1 (recipe: 2048), got {future_token_budget!r}.")
        task = env.unwrapped.task
        self.player = _rewarded_player(env, player)
        self.user_players = tuple(task.user_players)
        self.num_rollouts = num_rollouts
        self.max_user_turns = max_user_turns
        self.max_assistant_turns = max_assistant_turns
        self.metric_set = MetricSet(_weights_for(env, weights), aggregation=aggregation, ctx=metric_ctx,
                                    token_metric=token_metric, on_fault=on_fault)
        self.sampling = {p: dict(v) for p, v in (sampling or {}).items()}
        self.return_futures = bool(return_futures)
        self.future_token_budget = future_token_budget
        self._count_tokens = _token_count_fn(token_counter)
        self.policies = self._future_policies(env, policies)
        self.stats: dict[str, float] = {"rewards": 0.0, "rollouts": 0.0, "scored": 0.0, "faults": 0.0}
        self._seed: int | None = None

    @property
    def window_is_zero(self) -> bool:
        """True when no future turn is ever sampled (the immediate reward)."""
        return self.max_user_turns == 0 or self.max_assistant_turns <= 1

    @property
    def weights(self) -> dict[str, float]:
        return dict(self.metric_set.weights)

    @property
    def aggregation(self) -> str:
        return self.metric_set.aggregation

    def _future_policies(self, env: Any, policies: Mapping[str, Any] | None) -> dict[str, Any]:
        given = dict(policies or {})
        unknown = [p for p in given if p not in env.possible_agents]
        if unknown:
            raise ConfigError(f"policies for unknown players {unknown}; players are {list(env.possible_agents)}.")
        defaults = dict(env.spec.default_policies) if env.spec is not None else {}
        if self.window_is_zero:  # nothing is rolled: the policies given are kept, unused
            return {p: _as_policy(defaults[p] if _is_replay(v) else v) for p, v in given.items()
                    if not (_is_replay(v) and p not in defaults)}
        check_explicit_user(env, given)
        out: dict[str, Any] = {}
        for p in env.possible_agents:
            ref = given.get(p, defaults.get(p) if p != self.player else None)
            if isinstance(ref, str) and ref == LEARNER:
                out[p] = LEARNER  # bound by the learner (bind_policy) before the first future
                continue
            if ref is None:
                raise ConfigError(
                    f"MultiturnAwareReward needs a policy for {p!r} to roll futures"
                    + (" (its own future turns; in training, the policy being trained)" if p == self.player else "")
                    + f": pass policies={{{p!r}: ...}}, or max_user_turns=0 for the immediate reward."
                )
            out[p] = _as_policy(defaults[p] if _is_replay(ref) else ref)
        return out

    def bind_policy(self, player: str, policy: Any) -> None:
        """Use ``policy`` for ``player``'s future turns (a learner binds the policy it trains)."""
        if player not in self.possible_agents:
            raise ConfigError(f"bind_policy: {player!r} is not a player of the env {list(self.possible_agents)}.")
        self.policies[player] = _as_policy(policy)

    def clone(self) -> MultiturnAwareReward:
        new = super().clone()
        new.stats = dict(self.stats)
        return new

    def __repr__(self) -> str:
        return (f"<MultiturnAwareReward {self.aggregation} rollouts={self.num_rollouts} "
                f"window=({self.max_user_turns}u,{self.max_assistant_turns}a) {self.env!r}>")

    # -- async core ----------------------------------------------------------------------------
    async def areset(self, seed: int | None = None, options: Mapping[str, Any] | None = None):
        self._seed = seed
        return await self.env.areset(seed=seed, options=options)

    async def astep(self, actions: Mapping[str, str]):
        state = self.env.unwrapped.episode
        start = len(state.messages)  # the rewarded reply will be this message
        step = state.step
        moved = self.player in state.on_turn
        obs, rewards, terms, truncs, infos = await self.env.astep(actions)
        if not moved or self.player not in rewards:
            return obs, rewards, terms, truncs, infos
        result, extra = await self.score_reply(start=start, step=step)
        info = _record(infos, self.player, rewards, result, "mr")
        info["mr"] = {
            "reward": result.reward,
            "aggregation": self.aggregation,
            "num_rollouts": extra["num_rollouts"],
            "scored": len(result.scored),
            "metrics": result.summary(self.metric_set.weights),
            "cost": result.cost,
            "faults": result.faults,
            "future_turns": extra["future_turns"],
            "dropped_turns": extra["dropped_turns"],
            "zero_reason": extra["zero_reason"],
            "window": {"max_user_turns": self.max_user_turns, "max_assistant_turns": self.max_assistant_turns,
                       "future_token_budget": self.future_token_budget, "immediate": extra["immediate"]},
        }
        if self.return_futures:
            info["mr"]["futures"] = extra["futures"]
        rewards = dict(rewards)
        rewards[self.player] = result.reward
        self.stats["rewards"] += 1
        self.stats["rollouts"] += extra["num_rollouts"]
        self.stats["scored"] += len(result.scored)
        self.stats["faults"] += len(result.faults)
        return obs, rewards, terms, truncs, infos

    def zero_reason(self, reply: str) -> str | None:
        """Why the ``"verl"`` rule rewards the reply just taken 0 without rolling futures, in
        verl's order (token budget, turn budget, validity), or ``None``. Other rules: ``None``
        unless the reply alone reaches ``future_token_budget``."""
        state = self.env.unwrapped.episode
        if self.future_token_budget is not None and self._count_tokens(reply) >= self.future_token_budget:
            return "token_budget"
        if self.aggregation != "verl":
            return None
        if self.max_assistant_turns <= 1 or (state.done and state.truncated):
            return "turn_budget"
        if not is_valid_reply(reply):
            return "invalid_reply"
        return None

    async def score_reply(self, *, start: int, step: int) -> tuple[ScoredFutures, dict[str, Any]]:
        """Sample and score the futures of the reply at message index ``start`` (the env has
        just taken it). Returns the scores and ``{num_rollouts, future_turns, dropped_turns,
        zero_reason, immediate, futures}``."""
        base = self.env.unwrapped
        state = base.episode
        reply = state.messages[start].content
        reason = self.zero_reason(reply)
        if reason is not None:  # verl: no interaction at all, the reward manager scores 0
            zero = ScoredFutures(0.0, {m: 0.0 for m in self.metric_set.metrics},
                                 {m: [] for m in self.metric_set.metrics}, [], [], [], {"faults": 0.0})
            return zero, {"num_rollouts": 0, "future_turns": [], "dropped_turns": [], "zero_reason": reason,
                          "immediate": False, "futures": []}
        immediate = self.window_is_zero or state.done  # (verl gave 0 above to a truncating reply)
        if immediate:
            convs: list[Conversation | None] = [state.conversation]
            faults: list[dict[str, Any]] = []
            cost: dict[str, float] = {}
            turns, dropped = [0], [0]
        else:
            forks = [self.env.clone() for _ in range(self.num_rollouts)]
            outs = await asyncio.gather(*(self._roll(f, r, step, self._count_tokens(reply))
                                          for r, f in enumerate(forks)))
            convs, faults, cost, turns, dropped = [], [], {}, [], []
            for r, out in enumerate(outs):
                _add(cost, out["usage"])
                turns.append(out["generated"])
                dropped.append(out["dropped"])
                faults.extend({"rollout": r, **f} for f in out["zeroed"])
                if out["fault"] is not None:
                    faults.append({"rollout": r, **out["fault"]})
                    convs.append(None)
                else:
                    convs.append(out["conversation"])
        result = await self.metric_set.score(convs, state.item, start=start, faults=faults, cost=cost,
                                             player=self.player)
        futures = [None if c is None else [m.to_dict() for m in c.messages[start:]] for c in convs]
        return result, {"num_rollouts": len(convs), "future_turns": turns, "dropped_turns": dropped,
                        "zero_reason": None, "immediate": immediate, "futures": futures}

    async def _act(self, p: str, obs: Conversation, seed: int | None, r: int) -> tuple[Any, dict | None]:
        """One player's move in a future: ``(completion, None)``, or ``(None, fault)`` when its
        policy raised or gave up (``on_fault="raise"`` raises instead)."""
        from collab_env.rollout import act_for

        try:
            comp = (await act_for([p], {p: obs}, self.policies, self.sampling, seed))[p]
        except PolicyError as exc:
            if self.metric_set.on_fault == "raise" or isinstance(exc, FatalPolicyError):
                raise  # a rejected request (no API key...) fails every future alike
            return None, {"stage": "policy", "player": p, "error": str(exc)[:500]}
        if comp.is_fault:
            err = f"policy of {p!r} gave up: {comp.meta.get('fault', '')}"
            if self.metric_set.on_fault == "raise":
                raise PolicyError(f"MultiturnAwareReward future {r}: {err}")
            return comp, {"stage": "policy", "player": p, "error": err}
        return comp, None

    async def _roll(self, fork: Any, r: int, step: int, reply_tokens: int) -> dict[str, Any]:
        """Roll one fork forward through the window. Returns ``{conversation, fault (None or the
        fault that dropped it), zeroed (faults replaced by an empty user message), usage,
        generated (messages), dropped (assistant turns cut)}``."""
        unbound = [p for p, pol in self.policies.items() if isinstance(pol, str) and pol == LEARNER]
        if unbound:
            raise ConfigError(
                f"the future policy of {unbound} is {LEARNER!r} but no learner bound one: call "
                "env.bind_policy(player, policy) (or collab_env.rewards.mr.bind_learner_policies)."
            )
        verl = self.aggregation == "verl"
        usage: dict[str, float] = {}
        zeroed: list[dict[str, Any]] = []
        user_turns, assistant_turns, generated, dropped, k = 0, 1, 0, 0, 0
        tokens = reply_tokens
        obs = {a: fork.observe(a) for a in fork.agents}
        out = {"fault": None, "zeroed": zeroed, "usage": usage}
        while fork.agents:
            on_turn = list(fork.on_turn)
            if verl and self.player in on_turn and (assistant_turns + 1 >= self.max_assistant_turns
                                                    or user_turns >= self.max_user_turns):
                # verl generates this turn, then finds a turn budget spent and discards it: it
                # cannot reach the reward, so it is not generated here.
                dropped += 1
                break
            if user_turns >= self.max_user_turns or assistant_turns >= self.max_assistant_turns:
                break
            seed = None if self._seed is None else _mix_seed(self._seed, step, r, k)
            seen = {p: strip_think_conversation(obs[p]) if self.metric_set.strip_think and p in self.user_players
                    else obs[p] for p in on_turn}
            moves = await asyncio.gather(*(self._act(p, seen[p], seed, r) for p in on_turn))
            texts: dict[str, str] = {}
            for p, (comp, fault) in zip(on_turn, moves, strict=True):
                if comp is not None:
                    _add(usage, comp.usage)
                    usage["policy_calls"] = usage.get("policy_calls", 0.0) + 1
                if fault is None:
                    texts[p] = comp.text
                elif self.metric_set.on_fault == "zero" and p in self.user_players:
                    zeroed.append({**fault, "zeroed": True})  # verl: the interaction answers ""
                    texts[p] = ""
                elif self.metric_set.on_fault == "zero":
                    raise PolicyError(f"MultiturnAwareReward future {r}: {fault['error']} (on_fault='zero' "
                                      "replaces only a failed user simulator's message, as verl does)")
                elif out["fault"] is None:
                    out["fault"] = fault
            if out["fault"] is not None:
                break
            if self.future_token_budget is not None:
                mine = self._count_tokens(texts[self.player]) if self.player in texts else 0
                if self.player in texts and tokens + mine >= self.future_token_budget:
                    dropped += 1  # verl: the turn that reaches the budget is discarded
                    break
                tokens += sum(self._count_tokens(t) for t in texts.values())
            obs, _, _, _, _ = await fork.astep(texts)
            generated += len(texts)
            k += 1
            for p in texts:
                if p in self.user_players:
                    user_turns += 1
                elif p == self.player:
                    assistant_turns += 1
        out.update(conversation=fork.unwrapped.episode.conversation, generated=generated, dropped=dropped)
        return out


# ---------------------------------------------------------------------------------------------
# Conversation-level reward
# ---------------------------------------------------------------------------------------------
class ConversationReward(EnvWrapper):
    """Score the finished conversation with weighted metrics, at the end of the episode.

    For evaluation: the same metrics and aggregation rules as :class:`MultiturnAwareReward`,
    applied once to the whole conversation when the episode ends (terminated or truncated by
    the env). ``player`` gets the conversation reward at the final step (its other steps keep
    the env's reward); ``infos[player]["conversation_reward"]`` holds the reward and, per metric,
    the raw value, weight and contribution; ``reward_components`` adds the contributions,
    ``"conversation"`` and ``"env"``. ``start`` for future-scoped metrics is the first message
    written after the reset (the whole episode counts; a dataset prefix does not).

    Args:
        env: The env to wrap.
        weights: Metric -> weight (default: the spec's reward weights, else
            :data:`DEFAULT_WEIGHTS`).
        aggregation: ``"verl"``, ``"collabllm"`` (default: the plain weighted sum) or ``"paper"``.
        player: The rewarded player (default: the only trainable player).
        metric_ctx: Resources for the metrics.
        token_metric: The metric the ``"paper"`` rule caps.

    A metric fault (judge, sandbox) raises :class:`~collab_env.errors.RewardError`: an
    evaluation episode without its score is a failed episode, reported as such.
    """

    def __init__(self, env: Any, *, weights: Mapping[str, float] | None = None, aggregation: str = "collabllm",
                 player: str | None = None, metric_ctx: Mapping[str, Any] | None = None,
                 token_metric: str = "token_amount") -> None:
        super().__init__(env)
        self.player = _rewarded_player(env, player)
        self.metric_set = MetricSet(_weights_for(env, weights), aggregation=aggregation, ctx=metric_ctx,
                                    token_metric=token_metric, on_fault="drop")
        self._start = 0

    async def areset(self, seed: int | None = None, options: Mapping[str, Any] | None = None):
        out = await self.env.areset(seed=seed, options=options)
        state = self.env.unwrapped.episode
        # A dataset prefix is not the episode's own text: start after it.
        prefix = [i for i, m in enumerate(state.messages) if m.meta.get("from_data")]
        self._start = (prefix[-1] + 1) if prefix else len(state.messages)
        return out

    async def astep(self, actions: Mapping[str, str]):
        obs, rewards, terms, truncs, infos = await self.env.astep(actions)
        state = self.env.unwrapped.episode
        if not state.done or self.player not in rewards:
            return obs, rewards, terms, truncs, infos
        result = await self.metric_set.score([state.conversation], state.item, start=self._start,
                                             player=self.player)
        info = _record(infos, self.player, rewards, result, "conversation")
        info["conversation_reward"] = {
            "reward": result.reward,
            "aggregation": self.metric_set.aggregation,
            "metrics": {m: {"value": result.values[m][0], "weight": self.metric_set.weights[m],
                            "contribution": result.contributions[m], "detail": result.details[0][m]}
                        for m in result.values},
            "cost": result.cost,
        }
        rewards = dict(rewards)
        rewards[self.player] = result.reward
        return obs, rewards, terms, truncs, infos


# ---------------------------------------------------------------------------------------------
# Helpers and the default-reward builder
# ---------------------------------------------------------------------------------------------
def _record(infos: dict, player: str, rewards: Mapping[str, float], result: ScoredFutures, name: str) -> dict:
    """Add the env's reward (``"env"``), each metric's contribution and the reward (``name``) to
    ``player``'s reward components; return its info dict."""
    info = infos.setdefault(player, {})
    components = dict(info.get("reward_components", {}))
    components["env"] = float(rewards[player])
    components.update(result.contributions)
    components[name] = result.reward
    info["reward_components"] = components
    return info


def bind_learner_policies(env: Any, policies: Mapping[str, Any]) -> int:
    """Bind ``policies`` (player -> policy) in every wrapper of ``env`` that rolls futures
    (:class:`MultiturnAwareReward` and others with ``bind_policy``). Returns how many bound."""
    bound, seen = 0, env
    while seen is not None:
        if hasattr(seen, "bind_policy") and hasattr(seen, "policies"):
            for p, pol in policies.items():
                if isinstance(seen.policies.get(p), str) and seen.policies[p] == LEARNER:
                    seen.bind_policy(p, pol)
                    bound += 1
        seen = getattr(seen, "env", None)
    return bound


def _is_replay(ref: Any) -> bool:
    return isinstance(ref, str) and ref == REPLAY


def ignores_candidate(policy: Any) -> bool:
    """Whether ``policy`` (an object, or a ``"module:Class"`` spec) declares that its messages
    do not depend on the conversation (``ignores_candidate = True``, e.g. a user replaying
    recorded turns): futures rolled with it cannot tell one candidate reply from another."""
    if isinstance(policy, str):
        if ":" not in policy:
            return False
        from collab_env.registry import load_entry_point

        try:
            policy = load_entry_point(policy)
        except (ImportError, AttributeError):
            return False
    return bool(getattr(policy, "ignores_candidate", False))


#: The ways to name the user simulator of MR futures, for error messages.
USER_CHOICES = ("'embedded' (the local SmolLM2 model)", "an API model string such as 'litellm:openai/gpt-4o-mini'",
                "a policy object (e.g. collab_env.agents.users.LLMUserSimulator(...))",
                "'replay' (replay the dataset's recorded user turns; they ignore the candidate reply)")


def check_explicit_user(env: Any, given: Mapping[str, Any]) -> None:
    """Refuse to roll futures with a default user that ignores the candidate.

    Args:
        env: The env whose futures will be rolled.
        given: Player -> future policy the caller named (``"replay"`` allowed).

    Raises:
        ConfigError: A user player has no policy in ``given`` and the spec's default for it
            ignores the candidate, or ``"replay"`` names a player whose default does not replay.
    """
    defaults = dict(env.spec.default_policies) if env.spec is not None else {}
    env_id = env.spec.id if env.spec is not None else type(env.unwrapped).__name__
    for u in env.unwrapped.task.user_players:
        ref = given.get(u)
        if _is_replay(ref):
            if u not in defaults or not ignores_candidate(defaults[u]):
                raise ConfigError(
                    f"user={REPLAY!r} replays a dataset's recorded user turns, but the default user of {env_id} "
                    f"({defaults.get(u)!r}) is not a replaying one: pass the simulator itself (or leave user unset "
                    "to use the env's reactive default)."
                )
        elif ref is None and u in defaults and ignores_candidate(defaults[u]):
            raise ConfigError(
                f"the multiturn-aware reward on {env_id} needs an explicit user simulator for {u!r}: the env's "
                f"default user ({defaults[u]}) replays recorded turns and ignores the reply being rewarded, so "
                "every candidate would get the same futures. Name the user simulator with "
                "collab_env.make(..., reward='mr', reward_kwargs={'user': ...}) or default_reward(..., user=...), "
                "as one of: " + "; ".join(USER_CHOICES) + " (MultiturnAwareReward itself takes a simulator policy "
                "or 'replay' in policies={'user': ...})."
            )


def _rewarded_player(env: Any, player: str | None) -> str:
    task = env.unwrapped.task
    if player is None:
        trainable = [p for p in env.possible_agents if task.is_trainable(p)]
        if len(trainable) != 1:
            raise ConfigError(
                f"the env has {len(trainable)} trainable players {trainable}; pass player=... to say "
                "whose replies are rewarded."
            )
        return trainable[0]
    if player not in env.possible_agents:
        raise ConfigError(f"player {player!r} is not a player of the env {list(env.possible_agents)}.")
    return player


def _weights_for(env: Any, weights: Mapping[str, float] | None) -> dict[str, float]:
    if weights is not None:
        return dict(weights)
    from collab_env.rewards.metrics import list_metrics

    spec_w = dict(env.spec.reward) if env.spec is not None else {}
    if spec_w and all(m in list_metrics() or m.startswith("extract->") for m in spec_w):
        return spec_w
    return dict(DEFAULT_WEIGHTS)




def default_reward(
    env: Any,
    kind: Literal["mr", "conversation"] = "mr",
    *,
    judge: Any = None,
    user: Any = None,
    policy: Any = None,
    weights: Mapping[str, float] | None = None,
    rubric: Literal["verl", "paper"] = "verl",
    judge_prefill: bool | None = None,
    judge_kwargs: Mapping[str, Any] | None = None,
    metric_ctx: Mapping[str, Any] | None = None,
    **kwargs: Any,
):
    """Wrap ``env`` in its default reward: the spec's metric weights (for ``collabllm-*``:
    math-hard accuracy + interactivity + token_amount, medium BLEU + token_amount,
    bigcodebench pass_rate + token_amount) as a :class:`MultiturnAwareReward` (``kind="mr"``)
    or a :class:`ConversationReward` (``kind="conversation"``).

    Args:
        env: The env to wrap.
        kind: ``"mr"`` or ``"conversation"``.
        judge: The judge model of the judge metrics (accuracy, interactivity): an API model
            string (``"litellm:openai/gpt-4o-mini"``), ``"embedded"``, any policy, an
            ``LLMJudge`` (used for every judge metric) or a mapping metric -> judge. A model
            string or policy also extracts the final document before the BLEU metrics score it
            (the recipe's step, e.g. on ``collabllm-medium``); without ``judge=`` they score the
            last assistant message.
        user: The user simulator of the futures (``kind="mr"``): a model string or
            ``"embedded"`` (wrapped in :class:`~collab_env.agents.users.LLMUserSimulator`; the
            embedded model replies in plain text), a ready policy object (used as is), or
            :data:`REPLAY` (``"replay"``: the env's recorded-turn user, which ignores the
            candidate). Required when futures are rolled and the env's default user ignores the
            candidate (the ``collabllm-*`` envs); envs with a reactive default user (hidden-facts)
            use it when ``user`` is not given.
        policy: The rewarded player's policy for future turns (``kind="mr"``): a model string,
            ``"embedded"``, a policy object, or :data:`LEARNER` (``"learner"``: the trainer binds
            the policy it trains).
        weights: Override the spec's weights.
        rubric: Interactivity rubric: ``"verl"`` or ``"paper"``.
        judge_prefill: Start judge replies with the score field (see
            ``LLMJudge.preset(prefill=...)``); default: on for the embedded model only.
        judge_kwargs: Extra ``LLMJudge`` settings for the judges built here
            (``max_new_tokens``, ``max_retries``...).
        metric_ctx: Extra metric resources (``tokenizer``, ``sandbox``, ``scope``...).
        **kwargs: Passed to the wrapper (``num_rollouts``, ``max_user_turns``,
            ``aggregation``, ``sampling``, ``return_futures``...).

    The same string given for several roles (e.g. ``"embedded"``) loads one model.
    """
    if kind not in ("mr", "conversation"):
        raise ConfigError(f"reward kind must be 'mr' or 'conversation', got {kind!r}.")
    if kind == "mr" and user is None:  # before the judge check: this mistake is silent otherwise
        rolls = kwargs.get("max_user_turns", 2) != 0 and kwargs.get("max_assistant_turns", 3) > 1
        if rolls:
            check_explicit_user(env, dict(kwargs.get("policies") or {}))
    loaded: dict[str, Any] = {}

    def backend(ref: Any) -> Any:
        if isinstance(ref, str):
            if ref not in loaded:
                loaded[ref] = _as_policy(ref)
            return loaded[ref]
        return _as_policy(ref)

    w = _weights_for(env, weights)
    ctx: dict[str, Any] = {"rubric": rubric, **dict(metric_ctx or {})}
    needs_judge = [m for m in w if get_metric(m).needs and set(get_metric(m).needs) & {"judge", "extractor"}]
    if "judge" not in ctx and "judge_backend" not in ctx:
        if judge is not None:  # also the BLEU metrics' document extractor: the recipe extracts first
            ctx.update(_judges(judge, rubric, judge_prefill, dict(judge_kwargs or {}), backend))
        elif needs_judge:
            raise ConfigError(
                f"the metrics {needs_judge} need an LLM judge: pass judge='litellm:<model>', "
                "judge='embedded' or a policy / LLMJudge."
            )
    if kind == "conversation":
        if user is not None or policy is not None:
            raise ConfigError("user= and policy= are for kind='mr' (futures); the conversation reward samples nothing.")
        return ConversationReward(env, weights=w, metric_ctx=ctx, **kwargs)
    policies = dict(kwargs.pop("policies", None) or {})
    if policy is not None:
        policies[_rewarded_player(env, kwargs.get("player"))] = policy if policy == LEARNER else backend(policy)
    if user is not None:
        users = env.unwrapped.task.user_players
        if not users:
            raise ConfigError("user= was given but the env has no user player.")
        sim = user
        if _is_replay(user):
            check_explicit_user(env, {u: REPLAY for u in users})
        elif isinstance(user, str):
            # The embedded 135M model cannot keep the recipe's JSON format: it writes plain text.
            from collab_env.agents.base import EMBEDDED_NAMES
            from collab_env.agents.users import LLMUserSimulator

            fmt = "plain" if user in EMBEDDED_NAMES else "json"
            sim = LLMUserSimulator(backend(user), reply_format=fmt)
        for u in users:
            policies[u] = sim
    return MultiturnAwareReward(env, policies=policies, weights=w, metric_ctx=ctx, **kwargs)


def _judges(judge: Any, rubric: str, prefill: bool | None, kw: dict[str, Any], backend) -> dict[str, Any]:
    """ctx entries for the judge metrics from a ``judge=`` argument."""
    from collab_env.agents.judges import ExtractThenScore, LLMJudge

    if isinstance(judge, Mapping):
        return {"judge": dict(judge)}
    if isinstance(judge, (LLMJudge, ExtractThenScore)):
        return {"judge": judge}
    b = backend(judge)
    if prefill is None:  # the embedded 135M model needs it to stay in the JSON format
        from collab_env.agents.base import EMBEDDED_NAMES

        prefill = judge in EMBEDDED_NAMES or any(c.__name__ == "EmbeddedPolicy" for c in type(b).__mro__)
    judges = {
        "accuracy": LLMJudge.preset("accuracy", b, prefill=prefill, **kw),
        "interactivity": LLMJudge.preset("interactivity" if rubric == "verl" else "interactivity_paper", b,
                                         prefill=prefill, **kw),
    }
    from collab_env.rewards.metrics import document_extractor

    return {"judge": judges, "extractor": LLMJudge.preset("extract_answer", b, prefill=prefill, **kw),
            "document_extractor": document_extractor(b, prefill=prefill, **kw)}

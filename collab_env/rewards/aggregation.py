"""Scoring futures: the aggregation rules and the weighted metric set of the conversation rewards.

:func:`aggregate` turns per-rollout metric values into a reward and one contribution per metric
by the ``"verl"``, ``"collabllm"`` or ``"paper"`` rule; :class:`MetricSet` scores a set of
conversations with weighted metrics (:mod:`collab_env.rewards.metrics`), counts the faults and
aggregates what scored into a :class:`ScoredFutures`. The rules, their formulas and their edge
cases are stated in :mod:`collab_env.rewards.mr`.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from collab_env.errors import (
    ConfigError,
    FatalPolicyError,
    JudgeError,
    PolicyError,
    RewardError,
    SandboxError,
)
from collab_env.policy import add_usage
from collab_env.rewards.metrics import Metric, get_metric
from collab_env.rewards.reply_rules import strip_think_conversation
from collab_env.types import Conversation

__all__ = [
    "AGGREGATIONS",
    "ON_FAULT",
    "DEFAULT_WEIGHTS",
    "FAULT_ERRORS",
    "aggregate",
    "ScoredFutures",
    "MetricSet",
]

#: The aggregation rules (see :mod:`collab_env.rewards.mr`).
AGGREGATIONS: tuple[str, ...] = ("verl", "collabllm", "paper")

#: What a fault in a future does (see :mod:`collab_env.rewards.mr`).
ON_FAULT: tuple[str, ...] = ("drop", "raise", "zero")

#: The verl recipe's metric weights (math-hard).
DEFAULT_WEIGHTS: dict[str, float] = {"accuracy": 1.0, "interactivity": 1.0, "token_amount": -1e-4}

#: Errors that make one future unusable (counted as a fault) rather than the whole reward wrong.
FAULT_ERRORS = (PolicyError, JudgeError, SandboxError)


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
        rule: ``"verl"``, ``"collabllm"`` or ``"paper"`` (see :mod:`collab_env.rewards.mr`).
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


class MetricSet:
    """Weighted metrics, the resources they need and an aggregation rule.

    Args:
        weights: Metric name (or ``"extract->NAME"``) -> weight.
        aggregation: ``"verl"``, ``"collabllm"`` or ``"paper"``.
        ctx: Resources passed to every metric (``judge``, ``judge_backend``, ``tokenizer``,
            ``sandbox``, ``scope``, ``rubric``...; see :mod:`collab_env.rewards.metrics`).
        token_metric: The metric the ``"paper"`` rule caps.
        on_fault: ``"drop"``, ``"raise"`` or ``"zero"`` (a failed metric counts 0 for that
            conversation; see :mod:`collab_env.rewards.mr`).
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
        all conversations concurrently, and aggregate the ones that scored
        (:meth:`evaluate` each, then :meth:`combine`).

        Raises:
            RewardError: No conversation could be scored.
        """
        async def one(conversation: Conversation | None) -> dict[str, Any] | None:
            return None if conversation is None else await self.evaluate(conversation, item, start=start, player=player)

        results = await asyncio.gather(*(one(c) for c in conversations))
        return self.combine(results, faults=faults, cost=cost)

    async def evaluate(self, conversation: Conversation, item: Mapping[str, Any], *, start: int,
                       player: str | None = None) -> dict[str, Any]:
        """Every metric of one conversation, concurrently: ``{metric: its result, or the fault
        that stopped it}``. A caller with several futures can start each one's metrics as soon
        as that future ends, and :meth:`combine` them.

        Raises:
            Exception: A metric's fault with ``on_fault="raise"``, or a
                :class:`~collab_env.errors.FatalPolicyError` always.
        """
        if self.strip_think:
            conversation = strip_think_conversation(conversation)
        ctx = {**self.ctx, **({"player": player} if player is not None and "player" not in self.ctx else {})}

        async def one(m: str):
            try:
                return await self.metrics[m](conversation, item, start=start, **ctx)
            except FAULT_ERRORS as exc:
                if self.on_fault == "raise" or isinstance(exc, FatalPolicyError):
                    raise  # a rejected request (no API key...) fails every future alike
                return exc

        results = await asyncio.gather(*(one(m) for m in self.metrics))
        return dict(zip(self.metrics, results, strict=True))

    def combine(self, results: Sequence[Mapping[str, Any] | None], *, faults: Sequence[dict[str, Any]] = (),
                cost: Mapping[str, float] | None = None) -> ScoredFutures:
        """Aggregate the :meth:`evaluate` results of each future (``None``: a future that already
        faulted), with the futures' ``faults`` and ``cost`` so far.

        Raises:
            RewardError: No conversation could be scored.
        """
        faults = list(faults)
        total = dict(cost or {})
        values: dict[str, list[float]] = {m: [] for m in self.metrics}
        details: list[dict[str, Any]] = []
        scored: list[int] = []
        for r, res in enumerate(results):
            if res is None:
                continue
            for m_res in res.values():
                if not isinstance(m_res, Exception):
                    add_usage(total, m_res.usage)
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

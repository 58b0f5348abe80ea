"""The results of an evaluation: per-episode failures, per-player statistics, summaries,
comparisons and their tables."""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from collab_env.types import Episode

if TYPE_CHECKING:
    from collab_env.eval.judge_check import JudgeCheck

__all__ = ["EpisodeFailure", "PlayerStats", "EvalSummary", "EvalResult", "Comparison", "FAILURES_SUFFIX",
           "format_table", "jsonable"]

#: Suffix of the sidecar file that logs failed episodes next to the result file.
FAILURES_SUFFIX = ".failures.jsonl"


# ---------------------------------------------------------------------------------------------
# Result types
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class EpisodeFailure:
    """An episode that raised instead of finishing.

    Args:
        episode_id: The episode id ``k``.
        seed: The reset seed (``seed + k``).
        index: The task item index (``None`` for unlimited generated suites).
        error: ``"ExceptionType: message"``.
        traceback: The formatted traceback, for debugging a policy.
    """

    episode_id: int
    seed: int
    index: int | None
    error: str
    traceback: str = ""


@dataclass(frozen=True)
class PlayerStats:
    """Statistics of one trainable player's returns over the finished episodes.

    Args:
        player: The player id.
        mean_return: Mean episode return.
        std_return: Population standard deviation of the returns.
        sem_return: Standard error of the mean (``std / sqrt(n - 1)``; 0 for one episode).
        success_rate: Fraction of episodes with return > 0, reported only when the spec's
            reward range is non-negative (otherwise a positive return does not mean success).
        mean_moves: Mean number of messages the player wrote per episode.
    """

    player: str
    mean_return: float
    std_return: float
    sem_return: float
    success_rate: float | None
    mean_moves: float


@dataclass(frozen=True)
class EvalSummary:
    """Aggregate numbers of an evaluation run.

    Args:
        env_id: The env id.
        policies: Player -> short policy name.
        requested: Episodes requested (``num_episodes``).
        completed: Episodes finished (and recorded).
        failed: Episodes that raised in this run and remain unfinished.
        mean_steps: Mean env steps per finished episode.
        end_reasons: End reason -> number of finished episodes.
        players: Trainable player -> :class:`PlayerStats`.
        costs: Cost counters summed over finished episodes (model calls, tokens...).
    """

    env_id: str
    policies: dict[str, str]
    requested: int
    completed: int
    failed: int
    mean_steps: float
    end_reasons: dict[str, int]
    players: dict[str, PlayerStats]
    costs: dict[str, float]

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly dict (``NaN`` for statistics of an empty run)."""
        return {
            "env_id": self.env_id,
            "policies": dict(self.policies),
            "requested": self.requested,
            "completed": self.completed,
            "failed": self.failed,
            "mean_steps": self.mean_steps,
            "end_reasons": dict(self.end_reasons),
            "players": {p: vars(s).copy() for p, s in self.players.items()},
            "costs": dict(self.costs),
        }


@dataclass
class EvalResult:
    """The outcome of :func:`evaluate`.

    Args:
        env_id: Canonical (versioned) env id.
        seed: Base seed; episode ``k`` used ``seed + k``.
        num_episodes: Episodes requested.
        policies: Player -> policy reference (``"module:Class"``) that ran it.
        policy_names: Player -> short policy name (for tables).
        trainable: Players the summary reports on.
        episodes: Episode id -> finished :class:`Episode`, by id; includes episodes recorded by
            an earlier run of the same file (``resume=True``).
        failures: Episodes that raised in this run (not scored, retried on resume).
        out: The result file, or ``None``.
        reward_range: The spec's bounds of one episode's return.
        label: Name of this policy set in comparison tables.
        notes: Lines the summary prints under its table (an env whose own reward is 0 by
            construction says which reward options score it).
        judge_check: With a reward that an LLM judges, the judge's validity check
            (:class:`~collab_env.eval.judge_check.JudgeCheck`): a judge that failed it has its
            judged columns (the judged components, the reward's total, so the return) printed
            as ``judge failed validity check (AUC x.xxx < 0.8)`` instead of numbers, the
            per-episode values kept in the file marked invalid. ``None``: nothing is judged.
    """

    env_id: str
    seed: int
    num_episodes: int
    policies: dict[str, str]
    policy_names: dict[str, str]
    trainable: tuple[str, ...]
    episodes: dict[int, Episode] = field(default_factory=dict)
    failures: list[EpisodeFailure] = field(default_factory=list)
    out: Path | None = None
    reward_range: tuple[float, float] = (-math.inf, math.inf)
    label: str = ""
    notes: list[str] = field(default_factory=list)
    judge_check: JudgeCheck | None = None

    @property
    def missing(self) -> list[int]:
        """Episode ids in ``range(num_episodes)`` without a finished record."""
        return [k for k in range(self.num_episodes) if k not in self.episodes]

    @property
    def complete(self) -> bool:
        """Every requested episode finished."""
        return not self.missing

    @property
    def summary(self) -> EvalSummary:
        """Aggregate statistics over the finished episodes (see :class:`EvalSummary`)."""
        eps = [self.episodes[k] for k in sorted(self.episodes) if k < self.num_episodes]
        players = {}
        for p in self.trainable:
            rets = [float(e.returns.get(p, 0.0)) for e in eps]
            moves = [sum(1 for t in e.turns if t.player == p) for e in eps]
            mean, std = mean_std(rets)
            sem = std / math.sqrt(len(rets) - 1) if len(rets) > 1 else 0.0
            # "Return > 0" only means success when returns cannot be negative (e.g. accuracy).
            success = (
                sum(r > 0 for r in rets) / len(rets)
                if rets and self.reward_range[0] >= 0
                else None
            )
            players[p] = PlayerStats(p, mean, std, sem, success, mean_std(moves)[0])
        costs: Counter[str] = Counter()
        for e in eps:
            costs.update({k: float(v) for k, v in e.costs.items()})
        return EvalSummary(
            env_id=self.env_id,
            policies=dict(self.policy_names),
            requested=self.num_episodes,
            completed=len(eps),
            failed=len(self.failures),
            mean_steps=mean_std([e.num_steps for e in eps])[0],
            end_reasons=dict(Counter(e.end_reason or "none" for e in eps).most_common()),
            players=players,
            costs=dict(costs),
        )

    def component_means(self, player: str) -> dict[str, float]:
        """``player``'s reward components (``Episode.components``: each metric's contribution,
        ``"mr"``, ``"env"``...), mean per finished episode; empty when the reward has none."""
        eps = [self.episodes[k] for k in sorted(self.episodes) if k < self.num_episodes]
        totals: Counter[str] = Counter()
        for e in eps:
            totals.update({k: float(v) for k, v in e.components.get(player, {}).items()})
        return {k: totals[k] / len(eps) for k in sorted(totals)} if eps else {}

    def summary_table(self) -> str:
        """The summary as a plain-text table, one row per trainable player, then each player's
        reward components (when the reward has any) and the notes."""
        lines = [format_table({self.label or policy_label(self.policy_names, self.trainable): self})]
        check = self.judge_check
        refused = set(check.columns) if check is not None and check.refused else set()
        for p in self.trainable:
            comps = self.component_means(p)
            if comps:
                shown = ", ".join(f"{k} {v:.3f}" for k, v in comps.items() if k not in refused)
                gone = [k for k in comps if k in refused]
                if gone and check is not None:
                    shown += ("; " if shown else "") + f"{', '.join(gone)}: {check.refusal()}"
                lines.append(f"{p} reward components (mean per episode): {shown}")
        lines += [f"note: {n}" for n in self.notes]
        if check is not None:
            lines.append(f"note: {check.note()}")
        return "\n".join(lines)


@dataclass
class Comparison:
    """Several policy sets evaluated on the same env and seeds (see :func:`compare`).

    Args:
        env_id: The env id.
        results: Label -> :class:`EvalResult`, in the order given.
    """

    env_id: str
    results: dict[str, EvalResult]

    def summary_table(self) -> str:
        """One table with a row per policy set and trainable player."""
        return format_table(self.results)



def jsonable(x: Any) -> Any:
    """``x`` as it reads back from JSON, so settings compare equal to a file's."""
    return json.loads(json.dumps(x, sort_keys=True, default=repr))


def mean_std(xs: list[float] | list[int]) -> tuple[float, float]:
    if not xs:
        return math.nan, math.nan
    mean = sum(xs) / len(xs)
    return mean, math.sqrt(sum((x - mean) ** 2 for x in xs) / len(xs))


def policy_label(names: Mapping[str, str], players: tuple[str, ...]) -> str:
    """The trained players' policy names: the part that differs between compared runs."""
    if len(players) == 1:
        return names.get(players[0], "?")
    return ", ".join(f"{p}={names.get(p, '?')}" for p in players)


def fmt_number(x: float | None, spec: str = ".3f") -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and math.isnan(x):
        return "nan"
    return format(x, spec)


def format_table(results: Mapping[str, EvalResult]) -> str:
    """Rows: one per (policy set, trainable player). Plain text, aligned columns."""
    header = ["policies", "player", "episodes", "return", "std", "sem", "success", "steps",
              "moves", "failed", "end reasons"]
    rows = []
    env_ids = []
    for label, res in results.items():
        summ = res.summary
        env_ids.append(summ.env_id)
        reasons = ", ".join(f"{r}:{n}" for r, n in summ.end_reasons.items()) or "-"
        # The return is the reward's total: a judge that failed its validity check makes it a
        # judged column, printed as the refusal, never as a number.
        refusal = res.judge_check.refusal() if res.judge_check is not None and res.judge_check.refused else ""
        for p, st in summ.players.items():
            judged = [fmt_number(st.mean_return), fmt_number(st.std_return), fmt_number(st.sem_return),
                      fmt_number(st.success_rate, ".1%") if st.success_rate is not None else "-"]
            if refusal:
                judged = [refusal, "refused", "refused", "refused" if st.success_rate is not None else "-"]
            rows.append([
                label, p, f"{summ.completed}/{summ.requested}", *judged,
                fmt_number(summ.mean_steps, ".2f"), fmt_number(st.mean_moves, ".2f"), str(summ.failed),
                reasons,
            ])
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    # Text columns left-aligned, numbers right-aligned: easier to scan down a column.
    left = {0, 1, len(header) - 1}

    def fmt_row(r: list[str]) -> str:
        cells = [c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))]
        return "  ".join(cells).rstrip()

    title = "env: " + ", ".join(dict.fromkeys(env_ids))
    lines = [title, fmt_row(header), "  ".join("-" * w for w in widths)]
    lines += [fmt_row(r) for r in rows]
    return "\n".join(lines)

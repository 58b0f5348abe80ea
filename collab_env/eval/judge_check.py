"""Is a judge valid? Score it on conversations whose verdict is known by rule, before any judged number.

A judged column (interactivity, judged accuracy, a multiturn-aware reward with an LLM metric)
means something only if the judge can tell right from wrong. This module measures that on
**rule-labelled conversations**: scripted assistants play the built-in ``hidden-facts`` suite
against its scripted user in four kinds that cross asking with answering correctly, and whether
the final answer is correct is the env's own rule (the ``accuracy`` reward component), never the
kind's label:

=================  ======================================================================
``ask-correct``    :class:`~collab_env.tasks.hidden_facts.AskThenAnswer`: asks for every
                   missing quantity, then boxes the exact total.
``ask-wrong``      :class:`AskThenMiscount`: asks the same questions, then boxes a wrong total.
``direct-correct`` :class:`~collab_env.tasks.hidden_facts.AnswerAtOnce` on items with nothing
                   hidden (``vagueness=0``): answers at once, correctly.
``direct-wrong``   ``AnswerAtOnce`` on the default items: answers at once, guessing 1 for every
                   withheld quantity.
=================  ======================================================================

:func:`check_judge` asks an accuracy judge (``LLMJudge.preset("accuracy", backend)`` or any
object with ``score_many``) about each conversation and reports:

* ``auc``: the probability that a correct conversation gets a higher score than a wrong one
  (ties count half), from ``P(true)`` where the judge reports its log-prob verdict's
  probabilities, else from its score;
* ``ece`` (calibration): the expected calibration error of that probability over 10 equal-width
  bins (the mean gap between the predicted probability and the share of correct conversations,
  weighted by the bin's size), and ``brier``, the mean squared error;
* ``agreement``: the share of verdicts equal to the rule; ``errors``: items the judge could not
  score (:class:`~collab_env.errors.JudgeError`), counted as wrong verdicts.

The bar (:data:`MIN_AUC` 0.8 and :data:`MAX_ECE` 0.25 by default) is stated in the result;
:meth:`JudgeValidity.require` (or :func:`require_valid_judge`) raises
:class:`~collab_env.errors.JudgeValidityError` for a judge below it, so a results file can refuse
to report judged columns from a judge that measures nothing. ``benchmarks/judge_validity.py``
writes the table (``benchmarks/results/judge_validity.{md,json}``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from collab_env.errors import ConfigError, JudgeError, JudgeValidityError
from collab_env.tasks.hidden_facts import AnswerAtOnce, AskThenAnswer, HiddenFactsUser
from collab_env.types import Conversation

__all__ = ["KINDS", "MIN_AUC", "MAX_ECE", "AskThenMiscount", "JudgedConversation", "judged_conversations",
           "JudgeValidity", "check_judge", "acheck_judge", "require_valid_judge", "auc", "calibration",
           "validity_table", "CACHE_DIR", "CHECK_ITEMS", "JudgeCheck", "judged_metrics", "judge_identity",
           "identity_key", "cache_dir", "checked_validity", "reward_judges", "run_judge_check",
           "failure_reasons", "refusal_text"]

KINDS = ("ask-correct", "ask-wrong", "direct-correct", "direct-wrong")
#: The default bar: a judge below it refuses to report judged columns.
MIN_AUC = 0.8
MAX_ECE = 0.25


class AskThenMiscount(AskThenAnswer):
    """Asks like :class:`~collab_env.tasks.hidden_facts.AskThenAnswer`, then boxes the total
    plus 7 (always wrong)."""

    name = "ask-then-miscount"

    def respond(self, observation, rng):
        text = super().respond(observation, rng)
        return re.sub(r"\\boxed\{(\d+)\}", lambda m: f"\\boxed{{{int(m.group(1)) + 7}}}", text)


@dataclass(frozen=True)
class JudgedConversation:
    """One finished conversation and what a judge is asked about it.

    Args:
        kind: One of :data:`KINDS`.
        conversation: The whole transcript (judges render its public messages only).
        problem: The full problem, every fact included (the accuracy rubric's ``problem``).
        reference: The correct answer, as text.
        correct: The env's rule-based accuracy of the final answer.
        asked: Whether the assistant asked a question before answering.
    """

    kind: str
    conversation: Conversation
    problem: str
    reference: str
    correct: bool
    asked: bool


def judged_conversations(n: int, *, first_seed: int = 0) -> list[JudgedConversation]:
    """``n`` conversations cycling through :data:`KINDS` (seeds ``first_seed``, ``first_seed+1``...),
    played through the episode driver on ``hidden-facts``."""
    import collab_env
    from collab_env.rollout import run_episode

    out = []
    for i in range(n):
        kind = KINDS[i % len(KINDS)]
        overrides: dict[str, Any] = {"vagueness": 0.0} if kind == "direct-correct" else {}
        env = collab_env.make("hidden-facts", **overrides)
        assistant = {"ask-correct": AskThenAnswer, "ask-wrong": AskThenMiscount}.get(kind, AnswerAtOnce)()
        ep = run_episode(env, {"assistant": assistant, "user": HiddenFactsUser()}, seed=first_seed + i)
        item = env.unwrapped.task.get_item(ep.index)
        said = [m.content for m in ep.conversation if m.author == "assistant"]
        out.append(JudgedConversation(
            kind=kind,
            conversation=ep.conversation,
            problem=item["single_turn_prompt"],
            reference=str(item["answer"]),
            correct=ep.components["assistant"]["accuracy"] == 1.0,
            asked=any("?" in s for s in said[:-1]),
        ))
        env.close()
    return out


def auc(scores: Sequence[float], labels: Sequence[bool]) -> float:
    """P(a positive scores above a negative), ties half; NaN without both classes."""
    pos = [s for s, y in zip(scores, labels, strict=True) if y]
    neg = [s for s, y in zip(scores, labels, strict=True) if not y]
    if not pos or not neg:
        return float("nan")
    wins = sum((p > q) + 0.5 * (p == q) for p in pos for q in neg)
    return wins / (len(pos) * len(neg))


def calibration(probs: Sequence[float], labels: Sequence[bool], bins: int = 10) -> dict[str, Any]:
    """Expected calibration error over ``bins`` equal-width bins, the Brier score, and the
    reliability table (per non-empty bin: its range, size, mean probability, share correct)."""
    p, y = np.asarray(probs, dtype=float), np.asarray(labels, dtype=float)
    if len(p) == 0:
        return {"ece": float("nan"), "brier": float("nan"), "bins": []}
    which = np.minimum((p * bins).astype(int), bins - 1)
    table, ece = [], 0.0
    for b in range(bins):
        mask = which == b
        if not mask.any():
            continue
        gap = abs(float(p[mask].mean()) - float(y[mask].mean()))
        ece += mask.sum() / len(p) * gap
        table.append({"range": [b / bins, (b + 1) / bins], "n": int(mask.sum()),
                      "mean_probability": float(p[mask].mean()), "share_correct": float(y[mask].mean())})
    return {"ece": float(ece), "brier": float(np.mean((p - y) ** 2)), "bins": table}


@dataclass(frozen=True)
class JudgeValidity:
    """A judge's scores on rule-labelled conversations, and whether it clears the bar.

    Args:
        judge: The judge's name (its backend's, where it has one).
        items: Conversations judged; ``correct``: how many the rule says are correct.
        auc: See the module docstring (NaN when one class is missing).
        ece: Expected calibration error of the judge's probability of "correct".
        brier: Mean squared error of that probability.
        agreement: Share of verdicts equal to the rule (an unscored item counts as wrong).
        errors: Items the judge could not score.
        probability: ``"p_true"`` (the log-prob verdict's probability) or ``"score"``.
        min_auc: The bar's AUC; ``max_ece``: the bar's calibration error.
        passed: ``auc >= min_auc`` and ``ece <= max_ece`` and every item scored.
        reason: Why it failed (``""`` when it passed).
        per_kind: Per kind of conversation: items and mean probability of "correct".
        reliability: The calibration bins (:func:`calibration`).
        seconds: Wall time of the judging.
    """

    judge: str
    items: int
    correct: int
    auc: float
    ece: float
    brier: float
    agreement: float
    errors: int
    probability: str
    min_auc: float
    max_ece: float
    passed: bool
    reason: str
    per_kind: dict[str, dict[str, float]] = field(default_factory=dict)
    reliability: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0

    def require(self, what: str = "judged columns") -> None:
        """Raise :class:`~collab_env.errors.JudgeValidityError` unless the judge passed."""
        if not self.passed:
            raise JudgeValidityError(
                f"{what} refused: judge {self.judge!r} fails the validity check ({self.reason}, on "
                f"{self.items} rule-labelled conversations; bar AUC >= {self.min_auc}, calibration error "
                f"<= {self.max_ece}); use a judge that passes collab_env.eval.judge_check.check_judge.")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def require_valid_judge(validity: JudgeValidity, what: str = "judged columns") -> None:
    """:meth:`JudgeValidity.require` as a function."""
    validity.require(what)


def _name(judge: Any) -> str:
    backend = getattr(judge, "backend", None)
    for obj in (backend, judge):
        if obj is None:
            continue
        name = getattr(obj, "model_name", None) or getattr(obj, "name", None)
        if isinstance(name, str) and name:
            return name
    return type(judge).__name__


async def acheck_judge(judge: Any, conversations: Sequence[JudgedConversation] | None = None, *, n: int = 40,
                       first_seed: int = 0, min_auc: float = MIN_AUC, max_ece: float = MAX_ECE,
                       batch: int = 10) -> JudgeValidity:
    """Async :func:`check_judge` (same arguments)."""
    import time

    if not 0.5 <= min_auc <= 1.0 or not 0.0 <= max_ece <= 1.0:
        raise ConfigError(f"min_auc must be in [0.5, 1] and max_ece in [0, 1]; got {min_auc}, {max_ece}.")
    if not hasattr(judge, "score_many"):
        raise ConfigError(f"check_judge needs a judge with score_many (an LLMJudge, e.g. "
                          f"LLMJudge.preset('accuracy', backend)); got {type(judge).__name__}.")
    convs = list(conversations) if conversations is not None else judged_conversations(n, first_seed=first_seed)
    labels = [c.correct for c in convs]
    if not any(labels) or all(labels):
        raise ConfigError("check_judge needs correct and wrong conversations both; pass n >= 4 (the kinds cycle).")
    items = [dict(problem=c.problem, conversation=c.conversation, reference=c.reference) for c in convs]
    results: list[Any] = []
    t0 = time.perf_counter()
    for i in range(0, len(items), batch):
        chunk = items[i:i + batch]
        try:
            results.extend(await judge.score_many(chunk))
        except JudgeError:  # one unreadable item fails its batch: judge these one by one
            for it in chunk:
                try:
                    results.append(await judge.score(**it))
                except JudgeError:
                    results.append(None)
    seconds = time.perf_counter() - t0
    uses_p = all(r is not None and "true" in (r.meta.get("probabilities", {}).get("score") or {})
                 for r in results)
    probs = []
    for r in results:
        if r is None:
            probs.append(0.5)  # no verdict: no information
        elif uses_p:
            probs.append(float(r.meta["probabilities"]["score"]["true"]))
        else:
            probs.append(float(bool(r.score)) if isinstance(r.score, bool) else float(r.score))
    verdicts = [None if r is None else bool(r.score) for r in results]
    agreement = sum(v is not None and v == y for v, y in zip(verdicts, labels, strict=True)) / len(convs)
    a = auc(probs, labels)
    cal = calibration(probs, labels)
    errors = sum(r is None for r in results)
    fails = failure_reasons(a, cal["ece"], errors, min_auc=min_auc, max_ece=max_ece, digits=2)
    per_kind = {k: {"items": float(sum(c.kind == k for c in convs)),
                    "mean_probability_correct": float(np.mean([p for p, c in zip(probs, convs, strict=True)
                                                               if c.kind == k]))}
                for k in KINDS if any(c.kind == k for c in convs)}
    return JudgeValidity(judge=_name(judge), items=len(convs), correct=sum(labels), auc=a, ece=cal["ece"],
                         brier=cal["brier"], agreement=agreement, errors=errors,
                         probability="p_true" if uses_p else "score", min_auc=min_auc, max_ece=max_ece,
                         passed=not fails, reason="; ".join(fails), per_kind=per_kind, reliability=cal["bins"],
                         seconds=seconds)


def failure_reasons(auc: float, ece: float, errors: int, *, min_auc: float, max_ece: float,
                    digits: int = 3) -> list[str]:
    """Why a judge with these measures misses the bar (empty when it meets it): the AUC below
    ``min_auc``, the calibration error above ``max_ece``, items it could not score."""
    why = []
    if not auc >= min_auc:
        why.append(f"AUC {auc:.{digits}f} < {min_auc}")
    if not ece <= max_ece:
        why.append(f"calibration error {ece:.{digits}f} > {max_ece}")
    if errors:
        why.append(f"{errors} item(s) unscored")
    return why


def refusal_text(auc: float, ece: float, errors: int, *, min_auc: float, max_ece: float) -> str:
    """What a table or the board prints instead of a judged number of a judge below the bar:
    ``judge failed validity check (AUC 0.398 < 0.8; calibration error 0.271 > 0.25)``."""
    why = failure_reasons(auc, ece, errors, min_auc=min_auc, max_ece=max_ece)
    return f"judge failed validity check ({'; '.join(why) or 'unscored items'})"


def check_judge(judge: Any, conversations: Sequence[JudgedConversation] | None = None, *, n: int = 40,
                first_seed: int = 0, min_auc: float = MIN_AUC, max_ece: float = MAX_ECE,
                batch: int = 10) -> JudgeValidity:
    """Score an accuracy judge on rule-labelled conversations (module docstring).

    Args:
        judge: An accuracy judge (``LLMJudge.preset("accuracy", backend)``; anything with
            ``score_many`` over ``problem``/``conversation``/``reference`` items).
        conversations: The labelled conversations (default: :func:`judged_conversations`).
        n: How many to make when none are given (the four kinds cycle).
        first_seed: Their first episode seed.
        min_auc: The bar's AUC. ``max_ece``: the bar's calibration error.
        batch: Items per ``score_many`` call.

    Returns:
        A :class:`JudgeValidity`; call :meth:`~JudgeValidity.require` before reporting judged
        columns.

    Raises:
        ConfigError: A bar out of range, no ``score_many``, or conversations of one class only.
    """
    from collab_env._async import run_sync

    return run_sync(acheck_judge(judge, conversations, n=n, first_seed=first_seed, min_auc=min_auc,
                                 max_ece=max_ece, batch=batch))


def validity_table(rows: Sequence[JudgeValidity] | Sequence[Mapping[str, Any]]) -> str:
    """A Markdown table of validity results (judge, items, AUC, ECE, Brier, agreement, verdict)."""
    lines = ["| judge | items (correct) | AUC | calibration error | Brier | agreement | unscored | verdict |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        d = r.to_dict() if isinstance(r, JudgeValidity) else dict(r)
        lines.append(f"| {d['judge']} | {d['items']} ({d['correct']}) | {d['auc']:.3f} | {d['ece']:.3f} | "
                     f"{d['brier']:.3f} | {d['agreement']:.3f} | {d['errors']} | "
                     f"{'passes' if d['passed'] else 'fails: ' + d['reason']} |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# Before judged columns: the check of a run's judge, kept per judge identity
# ---------------------------------------------------------------------------------------------
#: Folder of the kept verdicts (``None``: ``<user cache>/judge_validity``, the cache of
#: :func:`collab_env.agents.embedded.default_cache_root`; ``COLLAB_ENV_CACHE`` moves it).
CACHE_DIR: Path | None = None
#: Rule-labelled conversations a run's judge is checked on (:func:`check_judge`'s ``n``).
CHECK_ITEMS = 40
#: A metric that needs one of these resources is judged by an LLM (its values are judged columns).
JUDGE_RESOURCES = ("judge", "extractor")


def judged_metrics(weights: Mapping[str, float]) -> list[str]:
    """The metrics of ``weights`` (nonzero weight) whose values an LLM judge decides: those that
    need a ``judge`` or an answer ``extractor`` (``accuracy``, ``interactivity``, ``extract->...``);
    the rule-based ones (``accuracy_rule``, ``token_amount``, ``pass_rate``...) are not."""
    from collab_env.rewards.metrics import get_metric

    return [m for m, w in weights.items() if w and set(get_metric(m).needs) & set(JUDGE_RESOURCES)]


def _backend_of(judge: Any) -> Any:
    return getattr(judge, "backend", judge)


def judge_identity(judge: Any) -> dict[str, Any]:
    """What a judge's verdicts depend on, as data: its backend (class, name, server, and for the
    embedded model the SHA-256 of its weights), the judge's settings (rubric text, reply prefix,
    method, token limit, fences), the check's bar and size, and collab_env's version. Two judges
    with one identity share a kept verdict (:func:`checked_validity`); anything else is checked
    again. A local model is named by its path: after retraining it in place, delete the kept
    verdict (or check it with ``refresh=True``)."""
    import hashlib

    import collab_env

    b = _backend_of(judge)
    cls = type(b)
    backend: dict[str, Any] = {"class": f"{cls.__module__}:{cls.__qualname__}", "name": _name(judge)}
    if getattr(b, "api_base", None):
        backend["api_base"] = str(b.api_base)
    from collab_env.agents.base import is_embedded

    if is_embedded(b):
        from collab_env.agents.embedded import embedded_weights_identity

        backend["weights"] = embedded_weights_identity()
    settings: dict[str, Any] = {}
    template = getattr(judge, "prompt_template", None)
    if isinstance(template, str):
        settings["rubric_sha256"] = hashlib.sha256(template.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    for key in ("system_prompt", "response_prefix", "method", "max_new_tokens", "max_retries", "fence",
                "transcript", "anchors", "anchor_rule"):
        value = getattr(judge, key, None)
        if value is not None:
            settings[key] = list(value) if isinstance(value, tuple) else value
    return {"backend": backend, "settings": settings,
            "check": {"items": CHECK_ITEMS, "min_auc": MIN_AUC, "max_ece": MAX_ECE},
            "collab_env": collab_env.__version__}


def identity_key(identity: Mapping[str, Any]) -> str:
    """The file name of a kept verdict: SHA-256 of the identity's canonical JSON (24 hex)."""
    import hashlib
    import json

    text = json.dumps(identity, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:24]


def cache_dir() -> Path:
    """:data:`CACHE_DIR`, default ``<user cache>/judge_validity``."""
    if CACHE_DIR is not None:
        return Path(CACHE_DIR)
    from collab_env.agents.embedded import default_cache_root

    return default_cache_root() / "judge_validity"


def _kept(path: Path, identity: Mapping[str, Any]) -> JudgeValidity | None:
    """The verdict kept in ``path`` for ``identity``, or ``None`` (missing, damaged, another
    identity or an older shape: each only costs a new check)."""
    import json

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("identity") != json.loads(json.dumps(identity, sort_keys=True, default=repr)):
            return None
        return JudgeValidity(**data["validity"])
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def checked_validity(judge: Any, *, refresh: bool = False,
                     progress: bool = True) -> tuple[JudgeValidity, dict[str, Any], bool]:
    """:func:`check_judge` of ``judge`` once per judge identity (:func:`judge_identity`): the
    verdict is kept in :func:`cache_dir`, one file per identity, and a later call with the same
    identity reads it instead of judging the :data:`CHECK_ITEMS` conversations again.

    Returns:
        ``(validity, identity, kept)``: ``kept`` is true when the verdict was read from the cache.
    """
    import json
    import os

    from collab_env._progress import say

    identity = judge_identity(judge)
    path = cache_dir() / f"{identity_key(identity)}.json"
    if not refresh:
        kept = _kept(path, identity)
        if kept is not None:
            if progress:
                say(f"judge check: {kept.judge}: kept verdict {'passes' if kept.passed else 'fails'} ({path})")
            return kept, identity, True
    if progress:
        say(f"judge check: scoring judge {_name(judge)} on {CHECK_ITEMS} rule-labelled conversations before any "
            "judged number (once per judge: the verdict is kept)")
    validity = check_judge(judge, n=CHECK_ITEMS)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"identity": identity, "validity": validity.to_dict()}, indent=1, sort_keys=True,
                              default=repr) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    if progress:
        say(f"judge check: {validity.judge}: {'passes' if validity.passed else 'fails: ' + validity.reason} "
            f"({validity.seconds:.0f} s; kept in {path})")
    return validity, identity, False


@dataclass(frozen=True)
class JudgeCheck:
    """What a run's results know about the judge behind their judged columns.

    Args:
        columns: The judged columns: the judged metrics' components and the reward's own
            (``"mr"``, ``"conversation"``), whose sum is the episode return.
        validity: The judge's :class:`JudgeValidity`, ``None`` when the check was skipped.
        identity: :func:`judge_identity` of the judge checked (empty when skipped).
        kept: The verdict was read from the cache, not measured in this run.
        skipped: The check was skipped on request (``judge_check=False``, ``--no-judge-check``):
            the judged values are reported unchecked.
    """

    columns: tuple[str, ...]
    validity: JudgeValidity | None
    identity: dict[str, Any] = field(default_factory=dict)
    kept: bool = False
    skipped: bool = False

    @property
    def status(self) -> str:
        """``"valid"`` (the judge passed), ``"invalid"`` (it failed) or ``"unchecked"`` (skipped)."""
        if self.validity is None:
            return "unchecked"
        return "valid" if self.validity.passed else "invalid"

    @property
    def refused(self) -> bool:
        """The judged columns must not be reported as numbers."""
        return self.status == "invalid"

    def refusal(self) -> str:
        """What a table prints instead of a judged number: ``judge failed validity check (AUC
        0.398 < 0.8)``."""
        v = self.validity
        if v is None or v.passed:
            return ""
        return refusal_text(v.auc, v.ece, v.errors, min_auc=v.min_auc, max_ece=v.max_ece)

    def note(self) -> str:
        """One line for the notes under a table."""
        cols = ", ".join(self.columns)
        v = self.validity
        if v is None:
            return (f"judged columns ({cols}) are UNCHECKED: the judge validity check was skipped "
                    "(--no-judge-check, judge_check=False)")
        where = "kept verdict" if self.kept else f"checked in {v.seconds:.0f} s"
        if v.passed:
            return (f"judge {v.judge} passed the validity check (AUC {v.auc:.3f} >= {v.min_auc}, calibration error "
                    f"{v.ece:.3f} <= {v.max_ece}, {v.items} rule-labelled conversations; {where}): judged columns "
                    f"({cols}) reported")
        return (f"judged columns ({cols}) refused: judge {v.judge} {self.refusal()[6:]} on {v.items} rule-labelled "
                f"conversations ({where}); the per-episode values stay in the result file, marked invalid")

    def to_dict(self) -> dict[str, Any]:
        """The record a result file's lines carry (``"judge_check"``)."""
        return {"status": self.status, "values": self.status, "columns": list(self.columns),
                "skipped": self.skipped, "kept": self.kept, "identity": self.identity,
                "validity": None if self.validity is None else self.validity.to_dict()}


def reward_judges(env: Any) -> tuple[list[str], str, Any] | None:
    """The judged metrics of ``env``'s reward wrapper (:class:`~collab_env.rewards.mr.MultiturnAwareReward`,
    :class:`~collab_env.rewards.conversation.ConversationReward`), the wrapper's name (its total's
    component) and the accuracy judge that stands for its judges in the validity check (the run's
    own ``accuracy`` judge, else the ``accuracy`` preset on its judges' backend and reply prefix);
    ``None`` when the reward judges nothing."""
    from collab_env.rewards.metrics.context import judge_for

    obj, metric_set = env, None
    for _ in range(16):  # the wrapper holds the metrics (ConversationReward) or its scorer does (MR)
        scorer = getattr(obj, "scorer", None)
        if getattr(scorer, "metric_set", None) is not None:
            obj = scorer
        metric_set = getattr(obj, "metric_set", None)
        if metric_set is not None or getattr(obj, "env", None) is None:
            break
        obj = obj.env
    if metric_set is None:
        return None
    judged = judged_metrics(metric_set.weights)
    if not judged:
        return None
    ctx = metric_set.ctx
    try:
        judge = judge_for("accuracy", "accuracy", ctx)
    except ConfigError:  # the judges of other metrics only (e.g. a mapping without accuracy)
        from collab_env.agents.judges import LLMJudge

        others = ctx.get("judge")
        one = next(iter(others.values())) if isinstance(others, Mapping) and others else others
        if one is None:
            one = ctx.get("extractor")
        judge = LLMJudge.preset("accuracy", _backend_of(one),
                                prefill=getattr(one, "response_prefix", None) is not None)
    from collab_env.rewards.conversation import ConversationReward

    # the component that holds the reward's total (record_components' name)
    total = "conversation" if isinstance(obj, ConversationReward) else str(getattr(obj, "name", "mr"))
    return judged, total, judge


def run_judge_check(env: Any, *, skip: bool = False, progress: bool = True) -> JudgeCheck | None:
    """The judge check of a run whose episodes ``env`` stands for: ``None`` when its reward
    judges nothing, else a :class:`JudgeCheck` (the judge's kept or measured verdict, or
    ``skipped``)."""
    found = reward_judges(env)
    if found is None:
        return None
    judged, total, judge = found
    columns = (*judged, total)
    if skip:
        if progress:
            from collab_env._progress import say

            say(f"judge check: SKIPPED on request; the judged columns ({', '.join(columns)}) are reported unchecked")
        return JudgeCheck(columns=columns, validity=None, skipped=True)
    validity, identity, kept = checked_validity(judge, progress=progress)
    return JudgeCheck(columns=columns, validity=validity, identity=identity, kept=kept)

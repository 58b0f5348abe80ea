"""The log-prob way of judging: compare the model's probabilities of the allowed answers.

Used by :meth:`LLMJudge.score_many <collab_env.agents.judges.LLMJudge.score_many>` when the
judgement has a finite set of allowed answers and the backend scores given continuations (the
:class:`~collab_env.agents.base.ContinuationScorer` capability); the rule is documented there.
Nothing is generated, so nothing can be unreadable: one backend call scores every item.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from collab_env.agents.base import ContinuationScorer, add_prefill
from collab_env.agents.judge_scores import JudgeResult, combine_components, spell_answer
from collab_env.agents.replies import is_config_problem
from collab_env.errors import JudgeError
from collab_env.policy import describe

if TYPE_CHECKING:
    from collab_env.agents.judges import LLMJudge

__all__ = ["VALUE_ENDS", "LOGPROB_PREFILL", "logsumexp", "score_by_logprobs"]

#: The two ways a JSON value ends in the reply the rubric asks for: another field follows, or
#: the object closes. An answer's probability is that of its spelling followed by either, so an
#: answer that is a prefix of another (``0`` and ``0.3``) is not credited with the other's mass.
VALUE_ENDS: tuple[str, ...] = (",", "}")
#: The start of the reply a log-prob judge writes for the model before the first key.
LOGPROB_PREFILL = '{"'


def logsumexp(xs: Sequence[float]) -> float:
    """``log(sum(exp(x)))``, computed without overflow; ``-inf`` when every ``x`` is."""
    m = max(xs)
    if m == -math.inf:
        return m
    return m + math.log(sum(math.exp(x - m) for x in xs))


async def score_by_logprobs(judge: LLMJudge, items: Sequence[Mapping[str, Any]]) -> list[JudgeResult]:
    """The log-prob method of :meth:`LLMJudge.score_many
    <collab_env.agents.judges.LLMJudge.score_many>`: one backend call scores the allowed
    answers of every item.

    Raises:
        JudgeError: The backend failed to score the answers or returned a malformed or
            non-finite result.
        FatalPolicyError: The backend's provider rejected the request (not retried).
    """
    prompts = [judge.build_prompt(**dict(item)) for item in items]
    if not prompts:
        return []
    answers = judge.allowed_answers
    scorer = judge.backend
    assert answers is not None and isinstance(scorer, ContinuationScorer)  # uses_logprobs guarantees both
    spellings = [spell_answer(a) for a in answers]
    conts = [f'{key}": {sp}{end}' for key in judge.score_keys for sp in spellings for end in VALUE_ENDS]
    observations = [add_prefill(p, LOGPROB_PREFILL, "judge-backend") for p in prompts]
    try:
        scored = await scorer.score_continuations(observations, [conts] * len(observations))
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        if is_config_problem(exc):
            raise
        raise JudgeError(
            f"{judge.name}: the backend {describe(judge.backend)} failed to score the allowed "
            f"answers of {len(items)} item(s): {exc!r:.300}"
        ) from exc
    if not isinstance(scored, list) or len(scored) != len(observations) or not all(
            len(row) == len(conts) for row in scored):
        raise JudgeError(f"{judge.name}: the backend {describe(judge.backend)} returned "
                         f"{scored!r:.200} for {len(observations)} x {len(conts)} continuations.")
    labels = [sp[1:-1] if isinstance(a, str) else sp for a, sp in zip(answers, spellings, strict=True)]
    ends = len(VALUE_ENDS)
    per_key = len(answers) * ends
    results = []
    for i, row in enumerate(scored):
        probabilities: dict[str, dict[str, float]] = {}
        chosen: dict[str, Any] = {}
        components: dict[str, Any] = {}
        for k, key in enumerate(judge.score_keys):
            block = [float(x) for x in row[k * per_key:(k + 1) * per_key]]
            logps = [logsumexp(block[a * ends:(a + 1) * ends]) for a in range(len(answers))]
            if not all(math.isfinite(x) for x in logps):
                raise JudgeError(f"{judge.name}: item {i}, key {key!r}: the backend gave "
                                 f"non-finite log-probs {logps} for the answers {labels}.")
            top = max(logps)
            weights = [math.exp(x - top) for x in logps]
            total = sum(weights)
            probs = [w / total for w in weights]
            best = max(range(len(answers)), key=lambda a: (probs[a], -a))  # first on ties
            probabilities[key] = dict(zip(labels, probs, strict=True))
            chosen[key] = answers[best]
            if judge.anchor_rule == "expected":
                components[key] = sum(p * float(a) for p, a in zip(probs, answers, strict=True))
            else:
                components[key] = answers[best]
        score, components = combine_components(judge.score_keys, components)
        raw = "{" + ", ".join(f'"{key}": {spell_answer(v)}' for key, v in chosen.items()) + "}"
        usage = {"judge_calls": 1.0, "retries": 0.0, "scored_continuations": float(len(conts))}
        results.append(JudgeResult(
            score=score, reason="", raw=raw, usage=usage, faults=0, components=components,
            meta={"method": "logprob", "rule": judge.anchor_rule if judge.anchors else "argmax",
                  "probabilities": probabilities, "chosen": chosen},
        ))
    return results

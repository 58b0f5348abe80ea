"""The generation way of judging: sample a reply at temperature 0 and parse the score out of it.

Used by :meth:`LLMJudge.score_many <collab_env.agents.judges.LLMJudge.score_many>` on every
backend that does not score continuations (and with ``method="generate"``). A reply the judge
cannot read is retried with the unreadable reply and :data:`CORRECTION` added to the prompt;
when the retries run out it raises :class:`~collab_env.errors.JudgeError`, never a default score.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from collab_env.agents.base import add_prefill, prefill_reply, prefill_sampling
from collab_env.agents.judge_scores import JudgeResult
from collab_env.agents.replies import attempt_pending
from collab_env.errors import JudgeError
from collab_env.types import Message

if TYPE_CHECKING:
    from collab_env.agents.judges import LLMJudge

__all__ = ["CORRECTION", "score_by_generation"]

#: The message added after an unreadable reply before the judge asks again.
CORRECTION = (
    "Your previous reply could not be read ({reason}). Reply again with only the JSON object "
    "described above, nothing else."
)


async def score_by_generation(judge: LLMJudge, items: Sequence[Mapping[str, Any]]) -> list[JudgeResult]:
    """The generation method of :meth:`LLMJudge.score_many
    <collab_env.agents.judges.LLMJudge.score_many>`: every attempt sends all pending prompts in
    one backend call; an unreadable reply or a backend error is retried up to
    ``judge.max_retries`` times.

    Raises:
        JudgeError: Some item had no readable score after the retries.
        FatalPolicyError: The backend's provider rejected the request (not retried).
    """
    prompts = [judge.build_prompt(**dict(item)) for item in items]
    usage = [{"judge_calls": 0.0, "retries": 0.0} for _ in items]
    errors: list[list[str]] = [[] for _ in items]
    results: list[JudgeResult | None] = [None] * len(items)
    pending = list(range(len(items)))
    for attempt in range(judge.max_retries + 1):
        if not pending:
            break
        if attempt:
            for i in pending:
                usage[i]["retries"] += 1
        for i in pending:
            usage[i]["judge_calls"] += 1
        replies, again = await attempt_pending(
            judge.backend, pending, [add_prefill(prompts[i], judge.prefill, "judge-backend") for i in pending],
            prefill_sampling(judge.prefill, {"temperature": 0, "max_new_tokens": judge.max_new_tokens}),
            usage=usage, errors=errors)
        for i, out in replies:
            reply = prefill_reply(judge.prefill, out)
            try:
                score, reason, comps = judge.parse(reply)
            except ValueError as exc:
                errors[i].append(f"unreadable reply ({exc}): {reply!r:.200}")
                prompts[i] = prompts[i].append(
                    Message(role="assistant", content=reply, author="judge-backend"),
                    Message(role="user", content=CORRECTION.format(reason=exc), author="judge"),
                )
                again.append(i)
                continue
            results[i] = JudgeResult(score=score, reason=reason, raw=reply, usage=usage[i],
                                     faults=len(errors[i]), components=comps,
                                     meta={"method": "generate"})
        pending = sorted(again)  # in item order, as the items were first sent
    if pending:
        i = pending[0]
        raise JudgeError(
            f"{judge.name} gave no readable score for {len(pending)} of {len(items)} item(s) after "
            f"{judge.max_retries + 1} attempt(s). Item {i}: " + " | ".join(errors[i])
            + ". Check that the backend follows the JSON format of the prompt (a larger or "
            "instruction-tuned model), or raise max_retries."
        )
    return list(results)  # type: ignore[arg-type]

"""A judge double that reads what the accuracy rubric asks by rule, the positive control of the
judge validity check. The rule-labelled conversations it is checked on live in the library
(:mod:`collab_env.eval.judge_check`): import them from there.
"""

from __future__ import annotations

import re

__all__ = ["ReferenceReadingJudge"]


class ReferenceReadingJudge:
    """A deterministic judge backend that does what the accuracy rubric asks, by rule: it reads
    the last ``\\boxed{N}`` of the conversation and the reference answer out of the rubric prompt
    and answers ``{"score": true}`` when they are the same number, else ``false``. The valid
    judge of tests: :func:`collab_env.eval.judge_check.check_judge` passes it (AUC 1), where
    :class:`~collab_env.testing.judge_injection.FenceReadingJudge`, which never reads the
    conversation, fails (AUC 0.5).
    """

    name = "reference-reading-judge"

    async def act(self, observations, **sampling):
        import json

        from collab_env.types import Completion

        out = []
        for obs in observations:
            prompt = "\n".join(m.content for m in obs if m.role != "assistant")
            chat, _, rest = prompt.partition("The reference answer:")
            boxes = re.findall(r"\\boxed\{\s*(-?\d+)\s*\}", chat)
            ref = re.findall(r"-?\d+", re.sub(r"<<<[^>]*>>>", " ", rest.split("Find the assistant")[0]))
            ok = bool(boxes and ref and int(boxes[-1]) == int(ref[0]))
            reply = {"reason": "the boxed answer matches the reference" if ok else "it does not", "score": ok}
            out.append(Completion(text=json.dumps(reply), finish_reason="stop", usage={"model_calls": 1}))
        return out

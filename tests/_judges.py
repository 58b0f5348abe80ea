"""Judge test doubles shared by the reward and task tests."""

from __future__ import annotations

import re

from collab_env.types import Completion


def fenced(prompt: str, label: str) -> str:
    """The text of the first ``label`` fence of a judge prompt (``fence_untrusted``'s
    ``<<<label-TAG>>>`` ... ``<<<end label-TAG>>>``)."""
    m = re.search(r"^<<<" + label + r"-([0-9a-f]+)>>>\n(.*?)\n<<<end " + label + r"-\1>>>$", prompt,
                  re.DOTALL | re.MULTILINE)
    assert m is not None, f"no {label} fence in the prompt"
    return m.group(2)


class JsonJudgeBackend:
    """A judge backend: answers the accuracy rubric "true" and the interactivity rubric
    understanding 1, clarification 0.7, suggestions 0.3 (the verl rubric's mean: 2/3), and keeps
    every prompt it gets."""

    name = "json-judge"

    def __init__(self):
        self.prompts = []

    async def act(self, observations, **sampling):
        out = []
        for obs in observations:
            text = obs.messages[-1].content
            self.prompts.append(text)
            if "reference answer" in text:
                out.append(Completion(text='{"reason": "ok", "score": true}', finish_reason="stop",
                                      usage={"model_calls": 1}))
            else:
                out.append(Completion(text='{"understanding": 1, "clarification": 0.7, "suggestions": 0.3}',
                                      finish_reason="stop", usage={"model_calls": 1}))
        return out

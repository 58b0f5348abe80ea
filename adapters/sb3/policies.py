"""Text policies built from dialogue acts: the random-act baseline."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from collab_env.adapters.sb3.acts import DialogueAct, hidden_facts_acts
from collab_env.errors import ConfigError
from collab_env.policy import ScriptedPolicy
from collab_env.types import Conversation

__all__ = ["RandomActPolicy"]


class RandomActPolicy(ScriptedPolicy):
    """A scripted policy that says a random act's template (seeded like every scripted policy):
    the random-act baseline as a text policy, and a candidate sampler for :class:`RerankWrapper`.

    Args:
        acts: Acts with templates (default: :func:`hidden_facts_acts`).
        weights: Probability of each act (default: uniform).
    """

    name = "random-act"

    def __init__(self, acts: Sequence[DialogueAct] | None = None, weights: Sequence[float] | None = None) -> None:
        self.acts = list(acts if acts is not None else hidden_facts_acts())
        if not self.acts:
            raise ConfigError("RandomActPolicy needs at least one act.")
        untemplated = [a.name for a in self.acts if a.template is None]
        if untemplated:
            raise ConfigError(f"RandomActPolicy says acts by their templates; {untemplated} have none.")
        if weights is None:
            weights = [1.0] * len(self.acts)
        w = np.asarray(weights, dtype=float)
        if w.shape != (len(self.acts),) or (w < 0).any() or w.sum() <= 0:
            raise ConfigError(f"weights must be {len(self.acts)} non-negative numbers with a positive sum.")
        self.weights = w / w.sum()

    def respond(self, observation: Conversation, rng: np.random.Generator) -> str:
        act = self.acts[int(rng.choice(len(self.acts), p=self.weights))]
        assert act.template is not None  # __init__ refuses acts without a template
        return act.template(observation)

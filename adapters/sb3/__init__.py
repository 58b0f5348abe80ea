"""stable-baselines3 on collab_env: dialogue as a small discrete decision problem.

SB3 cannot take text spaces, so a text env joins it through two Gymnasium wrappers over the
single-agent view (:func:`collab_env.make(id, view=player) <collab_env.make>`, which plays the
other players through the one episode driver):

* :class:`MacroActionWrapper`: ``Discrete(K)`` **dialogue acts** (ask about the next unknown
  fact, answer now, clarify, summarise...). Each act becomes a message through its template, or
  through a frozen policy told the act's instruction, or through any callable
  ``(act, observation) -> text``.
* :class:`RerankWrapper`: ``Discrete(N)`` over **N candidate replies** sampled (with seeds) from a
  policy for the current observation; the agent picks which one is sent.

Observations are ``Box`` features of the conversation (:class:`ChatFeatures`: turns, lengths,
numbers; :class:`HiddenFactsFeatures` adds what the assistant knows and still misses;
:class:`EmbeddingFeatures` appends a frozen encoder's embedding). :class:`CollabVecEnv` is an SB3
``VecEnv`` that steps many wrappers at once on one event loop (``asyncio.gather`` of their
``astep``), so the policies they share (the simulated user, the realiser, the candidate
sampler) get concurrent calls they batch. There is no episode loop here: every move goes
through the view's ``astep``, i.e. :func:`collab_env.rollout.advance`.

Modules: :mod:`~collab_env.adapters.sb3.acts` (dialogue acts and the default act sets),
:mod:`~collab_env.adapters.sb3.policies` (:class:`RandomActPolicy`),
:mod:`~collab_env.adapters.sb3.features` (observation and candidate features),
:mod:`~collab_env.adapters.sb3.wrappers` (the two Gymnasium wrappers and their base),
:mod:`~collab_env.adapters.sb3.vec_env` (:class:`CollabVecEnv`),
:mod:`~collab_env.adapters.sb3.chat` (what they read from a chat),
:mod:`~collab_env.adapters.sb3.evaluation` (:func:`success_rate` on held-out episodes). Importing the package without
stable-baselines3 raises :class:`~collab_env.errors.MissingDependencyError` naming
``collab_env[sb3]``.

Example::

    from stable_baselines3 import PPO
    from collab_env.adapters.sb3 import CollabVecEnv, MacroActionWrapper

    venv = CollabVecEnv.from_id("hidden-facts-easy", n=8, wrapper=MacroActionWrapper)
    PPO("MlpPolicy", venv, n_steps=64, seed=0).learn(4000)
"""

# ruff: noqa: E402 (the submodules import stable-baselines3: they come after the check)
from __future__ import annotations

from collab_env.errors import require

require("stable_baselines3", "sb3", "collab_env.adapters.sb3")

from collab_env.adapters.sb3.acts import DialogueAct, generic_acts, hidden_facts_acts
from collab_env.adapters.sb3.evaluation import success_rate
from collab_env.adapters.sb3.features import (
    CANDIDATE_FEATURES as CANDIDATE_FEATURES,  # public as before, not in __all__
)
from collab_env.adapters.sb3.features import (
    ChatFeatures,
    EmbeddingFeatures,
    Features,
    HiddenFactsFeatures,
    candidate_features,
)
from collab_env.adapters.sb3.policies import RandomActPolicy
from collab_env.adapters.sb3.vec_env import CollabVecEnv
from collab_env.adapters.sb3.wrappers import MacroActionWrapper, RerankWrapper

__all__ = [
    "DialogueAct",
    "hidden_facts_acts",
    "generic_acts",
    "RandomActPolicy",
    "Features",
    "ChatFeatures",
    "HiddenFactsFeatures",
    "EmbeddingFeatures",
    "candidate_features",
    "MacroActionWrapper",
    "RerankWrapper",
    "CollabVecEnv",
    "success_rate",
]

"""Scripted policies: deterministic, model-free players.

They are part of the policy contract and live in :mod:`collab_env.policy`; this module keeps
the old import path (``collab_env.agents.scripted``) working.
"""

from __future__ import annotations

from collab_env.policy import CallablePolicy, FixedTextPolicy, ScriptedPolicy, observation_rng

__all__ = ["ScriptedPolicy", "FixedTextPolicy", "CallablePolicy", "observation_rng"]

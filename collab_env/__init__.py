"""collab_env: multi-turn, multi-party LLM collaboration environments for RL research.

>>> import collab_env
>>> env = collab_env.make("hidden-facts")            # a PettingZoo ParallelEnv
>>> obs, infos = env.reset(seed=0)
>>> view = collab_env.make("hidden-facts", view="assistant")   # a Gymnasium Env

Importing this package is light: no torch, transformers, vllm, litellm or ray.
"""

from collab_env.compose import make
from collab_env.env import CollabEnv, EpisodeState, Outcome, Start, Task
from collab_env.errors import (
    ActionError,
    CollabEnvError,
    ConfigError,
    DatasetUnavailableError,
    EnvStateError,
    FatalPolicyError,
    MissingDependencyError,
    PolicyError,
    UnknownEnvError,
)
from collab_env.registry import EnvSpec, list_envs, register, registry, spec
from collab_env.types import Completion, Conversation, Episode, Message, TurnRecord

__version__ = "0.1.0"

__all__ = [
    "CollabEnv",
    "Task",
    "Start",
    "Outcome",
    "EpisodeState",
    "EnvSpec",
    "make",
    "register",
    "spec",
    "registry",
    "list_envs",
    "Message",
    "Conversation",
    "Completion",
    "Episode",
    "TurnRecord",
    "CollabEnvError",
    "ConfigError",
    "UnknownEnvError",
    "ActionError",
    "EnvStateError",
    "DatasetUnavailableError",
    "MissingDependencyError",
    "PolicyError",
    "FatalPolicyError",
    "check_env",
    "check_user",
]


def __getattr__(name):
    if name == "check_env":
        from collab_env.checker import check_env

        return check_env
    if name == "check_user":
        from collab_env.eval.check_user import check_user

        return check_user
    raise AttributeError(f"module 'collab_env' has no attribute {name!r}")


from collab_env.tasks import register_builtin  # noqa: E402

register_builtin()

"""verifiers v1 (prime-rl) adapter: collab_env envs as verifiers tasksets and envs.

Needs ``verifiers==0.4.0`` (its own venv: it pins ``openai<3``; ``make test-verifiers``)::

    from collab_env.adapters.verifiers import taskset, env_class, write_package
    ts = taskset("hidden-facts", num_tasks=8)           # a vf.Taskset: one task per seed/item
    Env = env_class("length-ratio")                     # roles agent_0 and agent_1
    write_package("hidden-facts", "envs/")              # envs/collab-hidden-facts-v2/, pip-installable

The env plays each episode with :func:`collab_env.rollout.advance`: the roles' replies come from
verifiers agents, the simulated user and other untrained players act through collab_env's
policies, and ``finalize`` records each role's episode return as its reward.
"""

from collab_env.adapters.verifiers.env import (
    REWARD_NAME,
    CollabEnvBase,
    CollabEnvConfig,
    CollabTask,
    CollabTaskData,
    CollabTaskset,
    CollabTasksetConfig,
    class_prefix,
    env_class,
    new_messages,
    taskset,
    taskset_class,
)
from collab_env.adapters.verifiers.package import package_name, write_package

__all__ = [
    "REWARD_NAME",
    "CollabEnvBase",
    "CollabEnvConfig",
    "CollabTask",
    "CollabTaskData",
    "CollabTaskset",
    "CollabTasksetConfig",
    "class_prefix",
    "env_class",
    "new_messages",
    "package_name",
    "taskset",
    "taskset_class",
    "write_package",
]

"""The old path of :mod:`collab_env.sandbox` (the code sandbox moved below the tasks layer).

A forwarding module, kept so that existing ``from collab_env.rewards.sandbox import ...`` imports
keep working; it re-exports the public names of :mod:`collab_env.sandbox`. New code imports
:mod:`collab_env.sandbox`. The old submodules (``collab_env.rewards.sandbox.run`` etc.) are not
forwarded: import them from ``collab_env.sandbox``.
"""

from __future__ import annotations

from collab_env.sandbox import (
    SandboxError,
    SandboxJob,
    SandboxLimits,
    SandboxPool,
    SandboxResult,
    Status,
    arun_python,
    live_processes_of_uid,
    run_python,
)

__all__ = [
    "SandboxError",
    "SandboxLimits",
    "SandboxResult",
    "SandboxJob",
    "SandboxPool",
    "Status",
    "run_python",
    "arun_python",
    "live_processes_of_uid",
]

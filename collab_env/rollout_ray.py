"""Former home of the Ray backend; it now lives in :mod:`collab_env.rollout.ray_engine`."""

from collab_env.rollout.ray_engine import RayRolloutEngine

__all__ = ["RayRolloutEngine"]

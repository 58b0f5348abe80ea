"""Wrappers around collab_env environments, each doing one job."""

from collab_env.wrappers.single_agent import SingleAgentEnv

__all__ = ["SingleAgentEnv"]

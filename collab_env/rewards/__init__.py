"""Rewards: metrics, joint rewards for cooperating agents, reward processors, the code sandbox.

Submodules import their heavy parts lazily: ``metrics`` (registry and CollabLLM metrics),
``joint`` (:class:`~collab_env.rewards.joint.JointReward`), ``processors``
(:class:`~collab_env.rewards.processors.RewardProcessors`), ``sandbox`` (untrusted code).
The multiturn-aware reward wrapper comes next.
"""

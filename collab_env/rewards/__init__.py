"""Rewards: metrics, joint rewards for cooperating agents, reward processors, the code sandbox.

Submodules import their heavy parts lazily: ``metrics`` (registry and CollabLLM metrics),
``mr`` (:class:`~collab_env.rewards.mr.MultiturnAwareReward`,
:class:`~collab_env.rewards.mr.ConversationReward`, :func:`~collab_env.rewards.mr.default_reward`),
``joint`` (:class:`~collab_env.rewards.joint.JointReward`), ``processors``
(:class:`~collab_env.rewards.processors.RewardProcessors`), ``sandbox`` (untrusted code).
"""

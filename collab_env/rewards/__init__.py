"""Rewards: metrics, the multiturn-aware reward, joint rewards, the code sandbox."""

"""Dataset tools above the rewards: building training data by simulation.

* :mod:`~collab_env.data.collabllm_build`: new multiturn datasets, candidate replies ranked by
  the multiturn-aware reward (``build_multiturn_dataset``).

Processing existing CollabLLM data (rows, SFT/DPO/RL datasets) needs no model and lives with
the task in :mod:`collab_env.tasks.collabllm_data`.
"""

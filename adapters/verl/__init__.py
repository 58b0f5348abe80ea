"""Train on collab_env envs with verl (0.9.1): the CollabLLM recipe on current verl.

* :class:`~collab_env.adapters.verl.loop.CollabEnvAgentLoop`, registered as ``"collab_env"``:
  a verl agent loop that plays any collab_env env through the one driver, the trained player on
  verl's rollout server, the user simulator and the other players on their own policies.
* :class:`~collab_env.adapters.verl.policy.ServerPolicy`: the collab_env policy over
  ``server_manager.generate``.
* :func:`~collab_env.adapters.verl.reward.compute_score`: the ``custom_reward_function`` that
  reads the reward the loop computed.
* :func:`dataset_rows` / :func:`write_dataset`: verl's training rows (``prompt``,
  ``agent_name``, ``collab_env``) for an env's task items.

``examples/verl/`` has the recipe's settings and a launch script. Importing this package needs
verl (``pip install verl==0.9.1``; see ``make test-verl`` for a working set of pins).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from collab_env.adapters.verl.loop import (
    AGENT_NAME,
    CONFIG_KEYS,
    CollabEnvAgentLoop,
    episode_output,
    play_episode,
    trained_player,
)
from collab_env.adapters.verl.policy import ServerPolicy
from collab_env.adapters.verl.reward import compute_score
from collab_env.types import template_chat

__all__ = ["AGENT_NAME", "CONFIG_KEYS", "CollabEnvAgentLoop", "ServerPolicy", "compute_score", "dataset_rows",
           "episode_output", "play_episode", "write_dataset"]


def dataset_rows(env_id: str, items: Iterable[int], *, seed: int = 0, env_kwargs: Mapping[str, Any] | None = None,
                 player: str | None = None) -> list[dict[str, Any]]:
    """verl rows for task items ``items`` of ``env_id``: one per item, env seed ``seed + k``.

    Each row has ``prompt`` (the trained player's first observation as chat messages: what
    verl's dataset reads and filters by length), ``data_source`` (the env id), ``agent_name``
    (``"collab_env"``), ``reward_model`` (verl's required column; the reward comes from the
    loop) and ``collab_env`` (``env_id``, ``env_kwargs``, ``index``, ``seed``, ``player``).
    """
    import collab_env

    env = collab_env.make(env_id, **dict(env_kwargs or {}))
    try:
        who = trained_player(env, player)
        rows = []
        for k, index in enumerate(items):
            obs, _ = env.reset(seed=seed + k, options={"index": int(index)})
            rows.append({
                "prompt": template_chat(obs[who].to_chat()), "data_source": env_id, "agent_name": AGENT_NAME,
                "reward_model": {"style": "collab_env", "ground_truth": ""},
                "collab_env": {"env_id": env_id, "env_kwargs": dict(env_kwargs or {}), "index": int(index),
                               "seed": seed + k, "player": who},
            })
        return rows
    finally:
        env.close()


def write_dataset(path: str | Path, rows: list[dict[str, Any]]) -> Path:
    """Write ``rows`` (:func:`dataset_rows`) as the parquet file verl's ``data.train_files`` reads."""
    import json

    from datasets import Dataset

    # env_kwargs may differ in shape between rows: stored as JSON text, read back by the loop
    flat = [{**r, "collab_env": {**r["collab_env"], "env_kwargs": json.dumps(r["collab_env"]["env_kwargs"])}}
            for r in rows]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    Dataset.from_list(flat).to_parquet(str(path))
    return path

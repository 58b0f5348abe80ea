"""verl's ``custom_reward_function`` for the collab_env agent loop.

The agent loop sets ``reward_score`` itself, and verl then uses it as is. When a run computes
rewards in verl's reward loop anyway (``reward.custom_reward_function.path`` pointing here,
``name: compute_score``), :func:`compute_score` reads the reward the loop recorded in the sample's
extra fields (verl merges them into ``extra_info``) instead of scoring the text again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from collab_env.errors import ConfigError

__all__ = ["compute_score"]


def compute_score(data_source: Any = None, solution_str: str | None = None, ground_truth: Any = None,
                  extra_info: Mapping[str, Any] | None = None, **kwargs: Any) -> dict[str, Any]:
    """``{"score": reward, <component>: value, ...}`` of the episode the agent loop played.

    Raises:
        ConfigError: ``extra_info`` holds no ``collab_env`` record: the sample was not played by
            the ``collab_env`` agent loop (check the rows' ``agent_name`` column).
    """
    record = (extra_info or {}).get("collab_env")
    if not isinstance(record, Mapping) or "reward" not in record:
        raise ConfigError("this sample carries no collab_env reward: it was not played by the collab_env agent "
                          "loop; set the rows' agent_name to 'collab_env' (collab_env.adapters.verl.dataset_rows).")
    out: dict[str, Any] = {"score": float(record["reward"])}
    out.update({f"collab_env/{k}": float(v) for k, v in dict(record.get("components", {})).items()})
    return out

"""Helpers shared by the task suites: config validation and env construction."""

from __future__ import annotations

import dataclasses
from typing import Any

from collab_env.env import CollabEnv, Task
from collab_env.errors import ConfigError, check_keyword_types, did_you_mean

ENV_KWARGS = ("max_steps", "max_message_chars", "max_total_chars", "render_mode")


def build_config(config_cls: type, kwargs: dict[str, Any], *, where: str):
    """``config_cls(**kwargs)`` where an unknown keyword is an error naming the valid ones, and a
    value of the wrong type (by the dataclass's field annotations) one naming the keyword, the
    type expected and the value given."""
    fields = [f.name for f in dataclasses.fields(config_cls)]
    for k in kwargs:
        if k not in fields:
            valid = sorted(set(fields) | set(ENV_KWARGS))
            raise ConfigError(
                f"{where}: unknown keyword {k!r}." + did_you_mean(k, valid) + f" Valid keywords: {valid}."
            )
    check_keyword_types(kwargs, config_cls, where=where)
    return config_cls(**kwargs)


def build_env(task: Task, env_kwargs: dict[str, Any]) -> CollabEnv:
    return CollabEnv(task, **env_kwargs)


def split_env_kwargs(kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split ``make`` keywords into CollabEnv keywords and task keywords."""
    env_kw = {k: kwargs.pop(k) for k in list(kwargs) if k in ENV_KWARGS}
    return env_kw, kwargs

"""The CollabLLM row schema: its columns, and rows normalised to plain messages and sessions.

The schema itself (columns, the three ``sessions`` layouts) is documented in
:mod:`collab_env.tasks.collabllm`; this module reads rows of it. It is shared by the env
(:class:`~collab_env.tasks.collabllm.CollabLLMTask`), the loader
(:mod:`collab_env.tasks.collabllm_load`) and the dataset builders
(:mod:`collab_env.tasks.collabllm_data`). It imports nothing heavy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from collab_env.errors import DataSchemaError

__all__ = [
    "REQUIRED_COLUMNS",
    "OPTIONAL_COLUMNS",
    "TASK_DESCRIPTIONS",
    "GENERIC_TASK_DESC",
    "normalize_messages",
    "normalize_sessions",
    "default_task_desc",
    "RL_LAYOUT",
    "is_rl_layout",
    "schema_row_from_rl",
]

REQUIRED_COLUMNS: tuple[str, ...] = ("prompt", "single_turn_prompt", "single_turn_completion")
OPTIONAL_COLUMNS: tuple[str, ...] = (
    "completion",
    "conv_id",
    "score",
    "single_turn_metadata",
    "turn_id",
    "sessions",
    "rewards",
    "task_desc",
)

#: Default ``task_desc`` per dataset family (matched against the dataset name); a ``task_desc``
#: column wins over it, and ``task_desc=`` at make wins over both.
TASK_DESCRIPTIONS: dict[str, str] = {
    "math-hard": "solving math problems",
    "medium": "writing and editing documents (articles)",
    "bigcodebench": "writing Python code",
}
# verl's process_dataset.py default for datasets of other families.
GENERIC_TASK_DESC = "general ask-for-assistance task"


def normalize_messages(value: Any, *, what: str, where: str) -> list[dict[str, str]]:
    """``[{"role", "content"}]`` from a message list (or the ``{"role": [...], "content": [...]}``
    form ``datasets`` gives a ``Sequence`` of structs), or DataSchemaError saying what is wrong.

    Args:
        value: The messages as read from a row.
        what: Name of the field, for the error message.
        where: Which file and row, for the error message.
    """
    if isinstance(value, Mapping) and "role" in value and not isinstance(value["role"], str):
        roles, contents = value.get("role"), value.get("content")
        if not isinstance(roles, Sequence) or not isinstance(contents, Sequence) or len(roles) != len(contents):
            raise DataSchemaError(
                f"{where}: {what} as columns must have 'role' and 'content' lists of one length."
            )
        value = [{"role": r, "content": c} for r, c in zip(roles, contents)]
    if not isinstance(value, Sequence) or isinstance(value, (str, bytes)):
        raise DataSchemaError(f"{where}: {what} must be a list of {{role, content}} messages, got "
                              f"{type(value).__name__}.")
    out = []
    for j, m in enumerate(value):
        if not isinstance(m, Mapping) or "role" not in m:
            raise DataSchemaError(f"{where}: {what}[{j}] must be a {{role, content}} dict, got {m!r:.80}.")
        role = m["role"]
        if role not in ("system", "user", "assistant"):
            raise DataSchemaError(
                f"{where}: {what}[{j}] has role {role!r}; roles must be 'system', 'user' or 'assistant'."
            )
        content = m.get("content")
        if content is not None and not isinstance(content, str):
            raise DataSchemaError(f"{where}: {what}[{j}].content must be text, got {type(content).__name__}.")
        out.append({"role": role, "content": content or ""})
    return out


def _is_message_list(value: Any) -> bool:
    """Whether ``value`` is a message list (either form), as opposed to a session struct."""
    if isinstance(value, Mapping):
        return "role" in value and not isinstance(value["role"], str)
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes))


def _drop_none(value: Any) -> Any:
    """``value`` without the ``None`` fields that arrow/``datasets`` fill in, recursively."""
    if isinstance(value, Mapping):
        return {str(k): _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, np.generic):
        return value.item()
    return value


def normalize_sessions(value: Any, *, where: str) -> tuple[list[list[dict[str, str]]], list[dict[str, Any]]]:
    """Every ``sessions`` layout (module docstring) as ``(message lists, details)``.

    Returns:
        The sessions as message lists (``forward_chat`` for the ``-large`` layout), in key
        order, absent ones dropped; and, for the ``-large`` layout, one details dict per kept
        session (``{"key": "0", "average_score": ..., "interactivity": {...}, ...}`` without
        ``None`` fill-ins), else an empty list.

    Raises:
        DataSchemaError: The value is in none of the layouts.
    """
    if value is None:
        return [], []
    keys: list[str | None]
    if isinstance(value, Mapping) and not _is_message_list(value):
        # Struct layouts: keys "0", "1", ...; keys another row had are filled with None.
        try:
            ordered = sorted(value, key=int)
        except (TypeError, ValueError) as exc:
            raise DataSchemaError(
                f"{where}: sessions struct keys must be '0', '1', ..., got {sorted(map(str, value))}."
            ) from exc
        keys, values = [str(k) for k in ordered], [value[k] for k in ordered]
    elif isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        keys, values = [None] * len(value), list(value)
    else:
        raise DataSchemaError(
            f"{where}: sessions must be a list or a struct of sessions, got {type(value).__name__}."
        )
    sessions: list[list[dict[str, str]]] = []
    details: list[dict[str, Any]] = []
    large = False
    for i, (key, v) in enumerate(zip(keys, values)):
        name = f"sessions[{key!r}]" if key is not None else f"sessions[{i}]"
        if v is None:
            continue
        if isinstance(v, Mapping) and not _is_message_list(v):  # a -large session struct
            fields = _drop_none(v)
            if not fields:  # a key only other rows have
                continue
            if "forward_chat" not in fields:
                raise DataSchemaError(
                    f"{where}: {name} is a struct without 'forward_chat' (it has {sorted(fields)}); a "
                    "session struct holds forward_chat (the messages after the completion), "
                    "average_score and judge details."
                )
            large = True
            sessions.append(normalize_messages(fields.pop("forward_chat"), what=f"{name}.forward_chat", where=where))
            details.append({"key": key if key is not None else str(i), **fields})
        else:
            sessions.append(normalize_messages(v, what=name, where=where))
            details.append({})
    if large and any(not d for d in details):
        raise DataSchemaError(
            f"{where}: sessions mix message lists and session structs; use one layout per row."
        )
    return sessions, (details if large else [])


def default_task_desc(dataset: str) -> str:
    """The task description of a CollabLLM dataset name (:data:`TASK_DESCRIPTIONS`), or
    :data:`GENERIC_TASK_DESC` for other families."""
    name = dataset.lower()
    # Longest key first so that e.g. a hypothetical "medium-x" never shadows a longer match.
    for key in sorted(TASK_DESCRIPTIONS, key=len, reverse=True):
        if key in name:
            return TASK_DESCRIPTIONS[key]
    return GENERIC_TASK_DESC



#: The columns that mark a file of RL rows (the verl recipe's ``process_dataset.py`` output, or
#: ``collab-env data --dataset_type rl``) rather than rows of the schema.
RL_LAYOUT: tuple[str, ...] = ("prompt", "reward_model", "extra_info")


def is_rl_layout(columns: Sequence[str]) -> bool:
    """Whether a dataset with these columns holds RL rows (:data:`RL_LAYOUT`, no
    ``single_turn_prompt`` column) rather than rows of the schema."""
    return all(c in columns for c in RL_LAYOUT) and "single_turn_prompt" not in columns


def schema_row_from_rl(row: Mapping[str, Any], *, where: str) -> dict[str, Any]:
    """An RL row (the recipe's columns) back as a row of the schema, for an env to play.

    ``prompt`` is the row's (its system message kept), the hidden goal and the task description
    come from ``extra_info["interaction_kwargs"]``, ``single_turn_completion`` is
    ``reward_model["ground_truth"]`` (the reference the recipe's reward scores against), and the
    optional columns (``completion``, ``conv_id``, ``sessions``...) from ``extra_info``.

    Raises:
        DataSchemaError: ``extra_info`` has no ``interaction_kwargs`` with a ``single_turn_prompt``,
            or ``reward_model`` no ``ground_truth`` text.
    """
    extra, reward = row.get("extra_info"), row.get("reward_model")
    if not isinstance(extra, Mapping) or not isinstance(reward, Mapping):
        raise DataSchemaError(f"{where}: an RL row needs extra_info and reward_model dicts, got "
                              f"{type(extra).__name__} and {type(reward).__name__}.")
    kwargs = extra.get("interaction_kwargs")
    if not isinstance(kwargs, Mapping) or not isinstance(kwargs.get("single_turn_prompt"), str):
        raise DataSchemaError(f"{where}: extra_info.interaction_kwargs.single_turn_prompt (the hidden goal of the "
                              "user simulator) is missing; write RL rows with collab-env data --dataset_type rl.")
    truth = reward.get("ground_truth")
    if not isinstance(truth, str):
        raise DataSchemaError(f"{where}: reward_model.ground_truth must be text, got {type(truth).__name__}.")
    out: dict[str, Any] = {"prompt": row["prompt"], "single_turn_prompt": kwargs["single_turn_prompt"],
                           "single_turn_completion": truth}
    if isinstance(kwargs.get("task_desc"), str) and kwargs["task_desc"]:
        out["task_desc"] = kwargs["task_desc"]
    for name in OPTIONAL_COLUMNS:
        if name not in out and extra.get(name) is not None:
            out[name] = _drop_none(extra[name]) if name != "sessions" else extra[name]
    return out

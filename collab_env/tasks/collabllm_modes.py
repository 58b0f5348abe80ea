"""The three CollabLLM training-set modes: RL prompts, SFT conversations, DPO pairs.

:func:`build_rl_dataset`, :func:`build_sft_dataset` and :func:`build_dpo_dataset` turn rows in the
CollabLLM schema (:mod:`collab_env.tasks.collabllm`) into the rows of one mode. Their columns,
selection rules and the references they follow are documented in
:mod:`collab_env.tasks.collabllm_data`, which also splits and writes the results (import this
module's names from here). ``datasets`` is imported only when a dataset is built.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from collab_env.errors import ConfigError, DataSchemaError
from collab_env.tasks.collabllm_rows import (
    GENERIC_TASK_DESC,
    REQUIRED_COLUMNS,
    default_task_desc,
    normalize_messages,
    normalize_sessions,
)

if TYPE_CHECKING:  # datasets is imported lazily, inside the functions
    import datasets

__all__ = [
    "MODES",
    "RULES",
    "RL_COLUMNS",
    "RECIPE_RL_COLUMNS",
    "SFT_COLUMNS",
    "RECIPE_SFT_COLUMNS",
    "DPO_COLUMNS",
    "RECIPE_TASK_DESC",
    "build_rl_dataset",
    "build_sft_dataset",
    "build_dpo_dataset",
]

#: The modes of :func:`process_collabllm_dataset`.
MODES: tuple[str, ...] = ("rl", "sft", "dpo")
#: Columns of a mode ``"rl"`` dataset, in order.
RL_COLUMNS: tuple[str, ...] = (
    "data_source", "agent_name", "prompt", "ability", "reward_model", "extra_info", "index",
)
#: Columns of a mode ``"rl"`` dataset under ``rules="recipe"``: the verl recipe's
#: ``process_dataset.py`` columns (``ground_truth`` and ``raw_prompt`` repeat ``reward_model`` and
#: ``prompt``; there is no ``ability``).
RECIPE_RL_COLUMNS: tuple[str, ...] = (
    "prompt", "ground_truth", "raw_prompt", "extra_info", "reward_model", "data_source", "agent_name", "index",
)
#: Columns of a mode ``"sft"`` dataset, in order.
SFT_COLUMNS: tuple[str, ...] = ("messages", "trainable", "conv_id", "turn_id", "score")
#: Columns of a mode ``"sft"`` dataset under ``rules="recipe"``: the whole conversation in
#: ``prompt``, the column the recipe's SFT script reads (``data.multiturn.messages_key=prompt``).
RECIPE_SFT_COLUMNS: tuple[str, ...] = ("prompt",)
#: The row rules: ``"collab_env"`` (this library's, the default of the Python API) and
#: ``"recipe"`` (the verl recipe's ``process_dataset.py``, the default of ``collab-env data``).
RULES: tuple[str, ...] = ("collab_env", "recipe")
#: The recipe's ``--task_desc`` default, which it gives every row of every dataset.
RECIPE_TASK_DESC = "solving math problems"
#: Columns of a mode ``"dpo"`` dataset, in order.
DPO_COLUMNS: tuple[str, ...] = (
    "prompt", "chosen", "rejected", "score_chosen", "score_rejected", "conv_id", "turn_id",
)


_GAP_TOL = 1e-9
#: ``ability`` per dataset family (matched in the dataset name, like ``TASK_DESCRIPTIONS``).
_ABILITIES = {"math-hard": "math", "medium": "writing", "bigcodebench": "code"}
#: Columns a recorded reply needs for modes "sft" and "dpo" (``turn_id`` defaults to ``len(prompt)``).
_REPLY_NEEDS = ("prompt", "completion", "conv_id", "score")


# ---------------------------------------------------------------------------------------------
# Rows in, checked
# ---------------------------------------------------------------------------------------------
def _iter_rows(data: Any, needs: Sequence[str], what: str) -> Iterable[tuple[int, dict[str, Any]]]:
    """``(row number, row dict)`` pairs of a ``datasets.Dataset`` or a sequence of mappings,
    after checking that the columns ``needs`` are present."""
    if isinstance(data, (str, bytes, os.PathLike)):
        raise ConfigError(
            f"{what} takes rows (a datasets.Dataset or a list of dicts), got the path/id {data!r}; "
            "use process_collabllm_dataset(..., data_files=...) or load_collabllm_dataset() to read files "
            "or a hub dataset."
        )
    columns = getattr(data, "column_names", None)
    if isinstance(columns, Mapping):  # a DatasetDict
        raise ConfigError(
            f"{what} takes one split, got a DatasetDict with splits {sorted(columns)}; pass e.g. data['train']."
        )
    if columns is not None:  # a datasets.Dataset: check the columns once
        missing = [c for c in needs if c not in columns]
        if missing:
            raise DataSchemaError(
                f"collabllm data: {what} needs column(s) {missing}; the dataset has {list(columns)}. "
                "Rows must follow the CollabLLM schema documented in collab_env.tasks.collabllm."
            )
        return enumerate(data)
    if not isinstance(data, Iterable) or isinstance(data, Mapping):
        raise ConfigError(
            f"{what} takes a datasets.Dataset or a list of dict rows, got {type(data).__name__}."
        )
    rows = list(data)
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise DataSchemaError(f"collabllm data: row {i} must be a dict, got {type(row).__name__}.")
        missing = [c for c in needs if c not in row]
        if missing:
            raise DataSchemaError(
                f"collabllm data: row {i} lacks column(s) {missing} that {what} needs (it has "
                f"{sorted(row)}). Rows must follow the CollabLLM schema documented in "
                "collab_env.tasks.collabllm."
            )
    return enumerate(rows)


def _where(i: int, row: Mapping[str, Any]) -> str:
    where = f"collabllm data: row {i}"
    if row.get("conv_id") is not None:
        where += f" (conv_id {row['conv_id']!r})"
    return where


def _prompt(row: Mapping[str, Any], where: str) -> list[dict[str, str]]:
    """The row's ``prompt`` as plain messages; it must end with the user turn to answer."""
    prompt = normalize_messages(row["prompt"], what="prompt", where=where)
    chat = [m for m in prompt if m["role"] != "system"]
    if not chat or chat[-1]["role"] != "user":
        raise DataSchemaError(
            f"{where}: prompt must end with a user turn (the one the completion answers); "
            f"it ends with {chat[-1]['role'] if chat else 'no chat message'!r}."
        )
    return prompt


def _text(row: Mapping[str, Any], name: str, where: str) -> str:
    value = row[name]
    if not isinstance(value, str):
        raise DataSchemaError(f"{where}: {name} must be text, got {type(value).__name__}.")
    return value


def _score(row: Mapping[str, Any], where: str) -> float:
    value = _plain(row["score"])
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise DataSchemaError(f"{where}: score must be a number, got {value!r}.")
    if not math.isfinite(value):
        raise DataSchemaError(f"{where}: score is {value!r}; drop or rescore this row.")
    return float(value)


def _conv_id(row: Mapping[str, Any], where: str) -> Any:
    value = _plain(row["conv_id"])
    if value is None:
        raise DataSchemaError(f"{where}: conv_id is missing (None); every row needs its conversation id.")
    try:
        hash(value)
    except TypeError as exc:
        raise DataSchemaError(f"{where}: conv_id must be a str or an int, got {type(value).__name__}.") from exc
    return value


def _turn_id(row: Mapping[str, Any], prompt: list[dict[str, str]], where: str) -> int:
    """The row's ``turn_id``, or ``len(prompt)`` when absent (the collabllm package's default)."""
    value = row.get("turn_id")
    if value is None:
        return len(prompt)
    value = _plain(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not float(value).is_integer():
        raise DataSchemaError(f"{where}: turn_id must be an int, got {value!r}.")
    return int(value)


def _reply(i: int, row: Mapping[str, Any]) -> dict[str, Any]:
    """Row ``i`` as a checked recorded reply (modes "sft" and "dpo"): its ``prompt``,
    ``completion``, ``conv_id``, ``turn_id`` and ``score``."""
    where = _where(i, row)
    prompt = _prompt(row, where)
    return {
        "prompt": prompt,
        "completion": _text(row, "completion", where),
        "conv_id": _conv_id(row, where),
        "turn_id": _turn_id(row, prompt, where),
        "score": _score(row, where),
    }


def _plain(value: Any) -> Any:
    """numpy scalars (from pandas-made datasets) as Python values."""
    return value.item() if hasattr(value, "item") and getattr(value, "shape", None) == () else value


def _with_system(prompt: list[dict[str, str]], system_prompt: str | None) -> list[dict[str, str]]:
    if system_prompt is None:
        return [dict(m) for m in prompt]
    return [{"role": "system", "content": system_prompt}] + [dict(m) for m in prompt if m["role"] != "system"]


def _check_system_prompt(system_prompt: Any) -> None:
    if system_prompt is not None and not isinstance(system_prompt, str):
        raise ConfigError(f"system_prompt must be a str or None, got {type(system_prompt).__name__}.")


def _check_choice(name: str, value: Any, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ConfigError(f"{name} must be one of {tuple(choices)}, got {value!r}.")


def _family_value(dataset: str | None, table: Mapping[str, str], default: str) -> str:
    name = (dataset or "").lower()
    for key in sorted(table, key=len, reverse=True):
        if key in name:
            return table[key]
    return default


def _to_dataset(records: list[dict[str, Any]], columns: Sequence[str]) -> datasets.Dataset:
    import datasets

    if not records:  # an empty dataset that still has the documented columns
        return datasets.Dataset.from_dict({c: [] for c in columns})
    return datasets.Dataset.from_list(records)


# ---------------------------------------------------------------------------------------------
# The three modes
# ---------------------------------------------------------------------------------------------
def build_rl_dataset(
    data: Any,
    *,
    system_prompt: str | None = None,
    task_desc: str | None = None,
    dataset: str | None = None,
    ability: str | None = None,
    data_source: str = "collabllm",
    agent_name: str = "collabllm_agent",
    dedup: bool = True,
    rules: Literal["collab_env", "recipe"] = "collab_env",
) -> datasets.Dataset:
    """verl RL rows: the policy prompt, the hidden goal for the user simulator, the reference.

    Columns: :data:`RL_COLUMNS`, described in the :mod:`~collab_env.tasks.collabllm_data`
    docstring. The hidden goal (``single_turn_prompt``) goes to
    ``extra_info["interaction_kwargs"]`` and the reference answer to
    ``reward_model["ground_truth"]``; neither is in ``prompt``.

    Args:
        data: A ``datasets.Dataset`` or a list of dict rows in the CollabLLM schema.
        system_prompt: System prompt of the policy; replaces the rows' own system messages
            (default: none added, the rows' own kept).
        task_desc: Task description for the user simulator, for every row (default: the row's
            ``task_desc`` column, else the default of the dataset family named by ``dataset``).
        dataset: Dataset name, used only to pick the default ``task_desc`` and ``ability``.
        ability: The ``ability`` column (default by dataset family, else ``"general"``).
        data_source: The ``data_source`` column (verl routes rewards on it).
        agent_name: The ``agent_name`` column (verl's agent loop name).
        dedup: Keep only the first row of each (prompt, hidden goal); rows that differ only in
            their recorded completion give the same RL prompt. Under ``rules="recipe"``: of each
            prompt, as the recipe does.
        rules: ``"collab_env"`` (the rules above) or ``"recipe"``: the verl recipe's
            ``process_dataset.py`` rules, exactly: the system prompt on every row (``system_prompt``,
            default :data:`~collab_env.tasks.collabllm.DEFAULT_SYSTEM_PROMPT`), dedup on the prompt
            alone, ``ground_truth`` = the row's ``ground_truth``, else ``single_turn_completion``,
            else ``completion``, else ``""``, every row's ``task_desc`` = ``task_desc`` or
            :data:`RECIPE_TASK_DESC` (the row's own column is overwritten, as the recipe's map
            does), and the columns :data:`RECIPE_RL_COLUMNS`.

    Returns:
        A ``datasets.Dataset`` with the columns :data:`RL_COLUMNS` (:data:`RECIPE_RL_COLUMNS`
        under ``rules="recipe"``).

    Raises:
        DataSchemaError: A required column is missing or a row is malformed.
        ConfigError: An argument is invalid.
    """
    _check_choice("rules", rules, RULES)
    recipe = rules == "recipe"
    if recipe and system_prompt is None:
        from collab_env.tasks.collabllm import DEFAULT_SYSTEM_PROMPT

        system_prompt = DEFAULT_SYSTEM_PROMPT
    _check_system_prompt(system_prompt)
    for name, value in (("task_desc", task_desc), ("ability", ability), ("dataset", dataset)):
        if value is not None and not isinstance(value, str):
            raise ConfigError(f"{name} must be a str or None, got {type(value).__name__}.")
    for name, value in (("data_source", data_source), ("agent_name", agent_name)):
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{name} must be a non-empty str, got {value!r}.")
    default_desc = default_task_desc(dataset) if dataset else GENERIC_TASK_DESC
    ability = ability or _family_value(dataset, _ABILITIES, "general")

    records, seen = [], set()
    needs = ("prompt", "single_turn_prompt") if recipe else REQUIRED_COLUMNS
    for i, row in _iter_rows(data, needs, "mode 'rl'"):
        where = _where(i, row)
        prompt = _with_system(_prompt(row, where), system_prompt)
        goal = _text(row, "single_turn_prompt", where)
        if recipe:
            truth = _recipe_ground_truth(row, where)
            desc = task_desc or RECIPE_TASK_DESC
        else:
            truth = _text(row, "single_turn_completion", where)
            desc = task_desc or row.get("task_desc") or default_desc
        if dedup:
            key = json.dumps(prompt if recipe else [prompt, goal], sort_keys=True, ensure_ascii=False)
            if key in seen:
                continue
            seen.add(key)
        # Everything else the row has, for custom rewards (a shallow copy, as in the recipe).
        extra = {k: _plain(v) for k, v in row.items()
                 if k not in ("prompt", "single_turn_prompt", "task_desc", "ground_truth", "extra_info")}
        if "sessions" in extra:
            extra["sessions"], details = normalize_sessions(row["sessions"], where=where)
            if details:  # the -large layout's per-session judge details
                extra["session_details"] = details
        extra.update(
            index=i,
            prompt=prompt,
            interaction_kwargs={"name": "collabllm", "single_turn_prompt": goal, "task_desc": desc},
        )
        if recipe:
            records.append({
                "prompt": prompt, "ground_truth": truth, "raw_prompt": prompt, "extra_info": extra,
                "reward_model": {"style": "rule", "ground_truth": truth}, "data_source": data_source,
                "agent_name": agent_name, "index": i,
            })
            continue
        records.append({
            "data_source": data_source,
            "agent_name": agent_name,
            "prompt": prompt,
            "ability": ability,
            "reward_model": {"style": "rule", "ground_truth": truth},
            "extra_info": extra,
            "index": i,
        })
    return _to_dataset(records, RECIPE_RL_COLUMNS if recipe else RL_COLUMNS)


def _recipe_ground_truth(row: Mapping[str, Any], where: str) -> str:
    """The recipe's reference answer: the first non-empty of ``ground_truth``,
    ``single_turn_completion`` and ``completion``, else ``""``."""
    for name in ("ground_truth", "single_turn_completion", "completion"):
        value = row.get(name)
        if value is not None and not isinstance(value, str):
            raise DataSchemaError(f"{where}: {name} must be text, got {type(value).__name__}.")
        if value:
            return value
    return ""


def build_sft_dataset(
    data: Any,
    *,
    system_prompt: str | None = None,
    select: Literal["latest", "score"] = "latest",
    min_score: float | None = None,
    train_on: Literal["assistant", "completion"] = "assistant",
    rules: Literal["collab_env", "recipe"] = "collab_env",
) -> datasets.Dataset:
    """One conversation per ``conv_id``: the best row's prompt followed by its completion.

    Columns: :data:`SFT_COLUMNS`, described in the :mod:`~collab_env.tasks.collabllm_data`
    docstring. The messages come only from the row's ``prompt`` and ``completion`` (and
    ``system_prompt``): the hidden goal and the reference answer are never in them.

    Args:
        data: A ``datasets.Dataset`` or a list of dict rows (needs ``prompt``, ``completion``,
            ``conv_id``, ``score``; ``turn_id`` defaults to ``len(prompt)``).
        system_prompt: System prompt put first; replaces the rows' own system messages
            (default: none added, the rows' own kept).
        select: ``"latest"``: the largest ``turn_id``, then the highest ``score`` (the verl
            recipe's and the collabllm package's rule). ``"score"``: the highest ``score``, then
            the largest ``turn_id``. Ties: the first row in input order.
        min_score: Drop a conversation whose selected row has ``score < min_score``.
        train_on: ``"assistant"``: every assistant message is trainable (recorded earlier
            assistant turns included, as verl's multi-turn SFT trains them); ``"completion"``:
            only the final completion.
        rules: ``"collab_env"`` (the rules above) or ``"recipe"``: the verl recipe's
            ``process_dataset.py`` rules, exactly: the system prompt first (``system_prompt``,
            default :data:`~collab_env.tasks.collabllm.DEFAULT_SYSTEM_PROMPT`), ``select="latest"``,
            conversations sorted by ``conv_id`` (the recipe's sort), and the one column
            :data:`RECIPE_SFT_COLUMNS` holding the whole conversation. ``select="score"``,
            ``min_score`` and ``train_on="completion"`` are not the recipe's: an error.

    Returns:
        A ``datasets.Dataset`` with the columns :data:`SFT_COLUMNS`, conversations in order of
        their first row (:data:`RECIPE_SFT_COLUMNS` in ``conv_id`` order under ``rules="recipe"``).

    Raises:
        DataSchemaError: A required column is missing or a row is malformed.
        ConfigError: An argument is invalid.
    """
    _check_choice("rules", rules, RULES)
    recipe = rules == "recipe"
    if recipe:
        off = [f"{k}={v!r}" for k, v, default in (("select", select, "latest"), ("min_score", min_score, None),
                                                   ("train_on", train_on, "assistant")) if v != default]
        if off:
            raise ConfigError(f"mode 'sft' with rules='recipe' takes none of {off}: the recipe keeps the latest "
                              "turn of every conversation and trains on its assistant messages; use "
                              "rules='collab_env' for these options.")
        if system_prompt is None:
            from collab_env.tasks.collabllm import DEFAULT_SYSTEM_PROMPT

            system_prompt = DEFAULT_SYSTEM_PROMPT
    _check_system_prompt(system_prompt)
    _check_choice("select", select, ("latest", "score"))
    _check_choice("train_on", train_on, ("assistant", "completion"))
    min_score = _check_number("min_score", min_score)

    best: dict[Any, tuple[tuple[float, float], dict[str, Any]]] = {}
    for i, row in _iter_rows(data, _REPLY_NEEDS, "mode 'sft'"):
        item = _reply(i, row)
        rank = (item["turn_id"], item["score"]) if select == "latest" else (item["score"], item["turn_id"])
        held = best.get(item["conv_id"])
        if held is None or rank > held[0]:  # strict: the first of equal rows stays
            best[item["conv_id"]] = (rank, item)

    records: list[dict[str, Any]] = []
    chosen = list(best.values())
    if recipe:
        chosen = [best[k] for k in _sorted_ids(best)]
    for _, item in chosen:
        if min_score is not None and item["score"] < min_score:
            continue
        messages = _with_system(item["prompt"], system_prompt)
        messages.append({"role": "assistant", "content": item["completion"]})
        if recipe:
            records.append({"prompt": messages})
            continue
        if train_on == "assistant":
            trainable = [m["role"] == "assistant" for m in messages]
        else:
            trainable = [False] * (len(messages) - 1) + [True]
        records.append({
            "messages": messages,
            "trainable": trainable,
            "conv_id": item["conv_id"],
            "turn_id": item["turn_id"],
            "score": item["score"],
        })
    return _to_dataset(records, RECIPE_SFT_COLUMNS if recipe else SFT_COLUMNS)


def _sorted_ids(best: Mapping[Any, Any]) -> list[Any]:
    """The conversation ids in the recipe's order (ascending, as its pandas sort on ``conv_id``)."""
    try:
        return sorted(best)
    except TypeError as exc:  # mixed str and int ids: pandas cannot sort them either
        raise DataSchemaError(f"collabllm data: conv_id values of different types ({exc}); the recipe sorts "
                              "conversations by conv_id, so give every row a conv_id of one type.") from exc


def build_dpo_dataset(
    data: Any,
    *,
    min_gap: float = 0.0,
    system_prompt: str | None = None,
    pairing: Literal["best_worst", "all"] = "best_worst",
    response_format: Literal["messages", "text"] = "messages",
) -> datasets.Dataset:
    """Preference pairs of recorded replies to the same conversation prefix.

    Rows with the same ``conv_id`` and the same ``prompt`` messages form a group; a pair
    (chosen, rejected) of the group is kept when ``score_chosen - score_rejected >= min_gap``
    (equality kept, absolute tolerance 1e-9), the gap is positive and the two texts differ.
    Columns: :data:`DPO_COLUMNS`, described in the :mod:`~collab_env.tasks.collabllm_data`
    docstring.

    Args:
        data: A ``datasets.Dataset`` or a list of dict rows (needs ``prompt``, ``completion``,
            ``conv_id``, ``score``; ``turn_id`` defaults to ``len(prompt)``).
        min_gap: Smallest score difference of a kept pair (``>= 0``; the collabllm package's
            ``minimum_gap``, whose training script uses 0.02).
        system_prompt: System prompt put first in ``prompt``; replaces the rows' own system
            messages (default: none added, the rows' own kept).
        pairing: ``"best_worst"``: one pair per group, the first highest-scored row against the
            first lowest-scored row. ``"all"``: every two rows of the group whose scores differ
            enough, higher-scored one chosen.
        response_format: ``"messages"``: ``chosen`` / ``rejected`` are one-message assistant
            lists (TRL's conversational format); ``"text"``: plain strings.

    Returns:
        A ``datasets.Dataset`` with the columns :data:`DPO_COLUMNS`, groups in order of their
        first row.

    Raises:
        DataSchemaError: A required column is missing or a row is malformed.
        ConfigError: An argument is invalid.
    """
    _check_system_prompt(system_prompt)
    _check_choice("pairing", pairing, ("best_worst", "all"))
    _check_choice("response_format", response_format, ("messages", "text"))
    gap = _check_number("min_gap", min_gap)
    if gap is None or gap < 0:
        raise ConfigError(f"min_gap must be a number >= 0, got {gap!r}.")
    min_gap = gap

    groups: dict[tuple[Any, str], list[dict[str, Any]]] = {}
    for i, row in _iter_rows(data, _REPLY_NEEDS, "mode 'dpo'"):
        item = _reply(i, row)
        key = (item["conv_id"], json.dumps(item["prompt"], sort_keys=True, ensure_ascii=False))
        groups.setdefault(key, []).append(item)

    def wrap(text: str) -> Any:
        return [{"role": "assistant", "content": text}] if response_format == "messages" else text

    records: list[dict[str, Any]] = []
    for items in groups.values():
        if pairing == "best_worst":
            top = max(items, key=lambda r: r["score"])  # max/min return the first of equals
            low = min(items, key=lambda r: r["score"])
            candidates = [(top, low)]
        else:
            candidates = [(a, b) if a["score"] > b["score"] else (b, a)
                          for j, a in enumerate(items) for b in items[j + 1:]]
        for chosen, rejected in candidates:
            gap = chosen["score"] - rejected["score"]
            if gap <= 0 or gap < min_gap - _GAP_TOL or chosen["completion"] == rejected["completion"]:
                continue
            records.append({
                "prompt": _with_system(chosen["prompt"], system_prompt),
                "chosen": wrap(chosen["completion"]),
                "rejected": wrap(rejected["completion"]),
                "score_chosen": chosen["score"],
                "score_rejected": rejected["score"],
                "conv_id": chosen["conv_id"],
                "turn_id": chosen["turn_id"],
            })
    return _to_dataset(records, DPO_COLUMNS)


def _check_number(name: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{name} must be a finite number or None, got {value!r}.")
    return float(value)


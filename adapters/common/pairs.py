"""Preference pairs as data: reading pair datasets and encoding them, for the learners that learn
from preferences (DPO, the joint reward model, and any other).

* **Joint pairs** (a reward model of the agents' joint responses): rows with ``prompt`` (a string,
  or one per agent), ``chosen`` and ``rejected`` (one completion per agent, in agent order, or a
  string when there is one agent): :func:`read_joint_pairs`, :func:`as_prompt`,
  :func:`as_completions`.
* **Chat pairs** (DPO): rows with ``prompt`` (chat messages, or a string taken as one user
  message) and ``chosen`` / ``rejected`` (assistant messages, or a string), one dataset per
  agent or an ``agent`` column (:func:`split_by_agent`); :func:`encode_pair` turns one into token
  ids through the chat template (:func:`encode_pair_rows`: a dataset's rows), and
  :func:`pair_logps` scores a batch of encoded pairs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from collab_env.adapters.common.chat import chat_ids, check_token_prefix, cut_at_end_of_turn
from collab_env.adapters.common.losses import pack_sequences, token_logprobs
from collab_env.adapters.common.preference import sequence_logprobs
from collab_env.errors import ConfigError, DataSchemaError

__all__ = ["JointPair", "Pair", "as_completions", "as_prompt", "read_joint_pairs", "as_messages", "encode_pair",
           "encode_pair_rows", "split_by_agent", "pair_logps"]

#: One preference pair: (prompt, chosen completions, rejected completions).
JointPair = tuple[Any, list[str], list[str]]

#: One encoded pair: (prompt ids, chosen ids, rejected ids).
Pair = tuple[list[int], list[int], list[int]]


# ---------------------------------------------------------------------------------------------
# Joint pairs
# ---------------------------------------------------------------------------------------------
def as_completions(value: Any, where: str) -> list[str]:
    """One completion per agent: ``value`` as a list (a string is one agent's).

    Raises:
        DataSchemaError: Not a string or a non-empty list of strings (``where`` names the field).
    """
    if isinstance(value, str):
        return [value]
    if isinstance(value, Sequence) and value and all(isinstance(c, str) for c in value):
        return list(value)
    raise DataSchemaError(
        f"{where} must be a string (one agent) or a non-empty list of strings (one completion per agent, "
        f"in agent order), got {value!r}."
    )


def as_prompt(value: Any, where: str) -> str | list[str] | None:
    """A joint sample's prompt: ``None``, a string, or a list with one string per agent.

    Raises:
        DataSchemaError: Anything else (``where`` names the field).
    """
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, Sequence) and all(isinstance(p, str) for p in value):
        return list(value)
    raise DataSchemaError(f"{where} must be a string or a list of strings (one prompt per agent), got {value!r}.")


def read_joint_pairs(data: Any, what: str, num_agents: int | None) -> list[JointPair]:
    """The joint pairs of ``data`` (a ``datasets.Dataset`` or a list of rows; ``None``: none),
    each with ``num_agents`` completions per side (``None``: as many as the row's ``chosen``).

    Raises:
        ConfigError: ``data`` is not a dataset or a list of rows.
        DataSchemaError: A row misses a column, or has the wrong number of completions.
    """
    if data is None:
        return []
    if isinstance(data, (str, bytes, Mapping)):
        raise ConfigError(f"{what} must be a datasets.Dataset or a list of rows, got {type(data).__name__}.")
    out: list[JointPair] = []
    for i, row in enumerate(data):
        if not isinstance(row, Mapping):
            raise DataSchemaError(f"{what} row {i} must be a dict, got {type(row).__name__}.")
        for col in ("prompt", "chosen", "rejected"):
            if col not in row:
                raise DataSchemaError(f"{what} row {i} has no {col!r} column (it has {sorted(row)}).")
        prompt = as_prompt(row["prompt"], f"{what} row {i}: prompt")
        chosen = as_completions(row["chosen"], f"{what} row {i}: chosen")
        rejected = as_completions(row["rejected"], f"{what} row {i}: rejected")
        n = num_agents if num_agents is not None else len(chosen)
        if len(chosen) != n or len(rejected) != n:
            raise DataSchemaError(
                f"{what} row {i}: chosen has {len(chosen)} and rejected {len(rejected)} completion(s), expected "
                f"{n} (one per agent); set RewardModelConfig(num_agents=...) or fix the row."
            )
        out.append((prompt, chosen, rejected))
    return out


# ---------------------------------------------------------------------------------------------
# Chat pairs
# ---------------------------------------------------------------------------------------------
def as_messages(value: Any, role: str, where: str) -> list[dict[str, Any]]:
    """``value`` as chat messages: a string is one message of ``role``; a list of
    ``{"role", "content"}`` dicts is copied (other keys dropped).

    Raises:
        DataSchemaError: Anything else (``where`` names the field).
    """
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    if isinstance(value, Sequence) and value and all(
            isinstance(m, Mapping) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in value):
        # tool calls and results travel as Conversation.to_chat writes them (the template renders them)
        return [{"role": m["role"], "content": m["content"],
                 **{key: m[key] for key in ("tool_calls", "tool_call_id") if key in m}} for m in value]
    raise DataSchemaError(f"{where} must be a string or a non-empty list of {{'role', 'content'}} dicts, "
                          f"got {value!r}.")


def encode_pair(tokenizer: Any, prompt: Any, chosen: Any, rejected: Any, *, max_length: int | None = None,
                where: str = "pair") -> Pair | None:
    """``(prompt_ids, chosen_ids, rejected_ids)`` of one preference pair, or ``None`` when the
    prompt alone does not fit in ``max_length``.

    The prompt is rendered with the chat template and its generation prompt; a completion's ids
    are the tokens the template adds after that prefix for the completion's messages, cut after
    the end-of-turn token (what generation produces). A string prompt is one user message; a
    string completion one assistant message.

    Raises:
        DataSchemaError: Malformed fields; ConfigError: a template that is not prefix-stable.
    """

    p_msgs = as_messages(prompt, "user", f"{where}: prompt")
    p_ids = chat_ids(tokenizer, p_msgs, generation_prompt=True)
    out: list[list[int]] = []
    for name, value in (("chosen", chosen), ("rejected", rejected)):
        c_msgs = as_messages(value, "assistant", f"{where}: {name}")
        if c_msgs[0]["role"] != "assistant":
            raise DataSchemaError(f"{where}: {name} must start with an assistant message, got {c_msgs[0]['role']!r}.")
        full = chat_ids(tokenizer, p_msgs + c_msgs)
        check_token_prefix(full, p_ids, where)
        end = cut_at_end_of_turn(tokenizer, full, len(p_ids), len(full)) if len(c_msgs) == 1 else len(full)
        out.append(full[len(p_ids):end])
    if max_length is not None:
        room = max_length - len(p_ids)
        if room < 1:
            return None
        out = [c[:room] for c in out]
    return p_ids, out[0], out[1]


def encode_pair_rows(tokenizer: Any, rows: Sequence[Mapping[str, Any]], *, max_length: int | None,
                     what: str) -> tuple[list[Pair], int]:
    """``(pairs, skipped)``: the chat-pair ``rows`` encoded by :func:`encode_pair`, in order, and
    how many were skipped because the prompt alone reaches ``max_length``.

    Raises:
        DataSchemaError: A row without ``prompt``, ``chosen`` or ``rejected`` (``what`` names
            the dataset), or a malformed field.
    """
    out: list[Pair] = []
    skipped = 0
    for i, row in enumerate(rows):
        for col in ("prompt", "chosen", "rejected"):
            if col not in row:
                raise DataSchemaError(f"{what} row {i} has no {col!r} column (it has {sorted(row)}).")
        pair = encode_pair(tokenizer, row["prompt"], row["chosen"], row["rejected"], max_length=max_length,
                           where=f"{what} row {i}")
        if pair is None:
            skipped += 1
            continue
        out.append(pair)
    return out, skipped


def split_by_agent(data: Any, num_agents: int, what: str) -> list[list[Mapping[str, Any]]]:
    """Rows per agent: a list of datasets (one per agent), or rows with an ``agent`` column
    (optional with one agent); ``None``: no rows.

    Raises:
        ConfigError: Not a dataset or list of rows, or a dataset list of another length.
        DataSchemaError: A row is not a dict, or its ``agent`` is not an agent index.
    """
    if data is None:
        return [[] for _ in range(num_agents)]
    if isinstance(data, (str, bytes, Mapping)):
        raise ConfigError(f"{what} must be a datasets.Dataset, a list of rows, or a list of those (one per agent).")
    items = list(data) if isinstance(data, (list, tuple)) else None
    if items and all(not isinstance(x, Mapping) for x in items):
        if len(items) != num_agents:
            raise ConfigError(f"{what} lists {len(items)} datasets for {num_agents} agents: pass one per agent.")
        return [list(x) for x in items]
    rows = list(data)
    per: list[list[Mapping[str, Any]]] = [[] for _ in range(num_agents)]
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise DataSchemaError(f"{what} row {i} must be a dict, got {type(row).__name__}.")
        agent = row.get("agent", 0 if num_agents == 1 else None)
        if isinstance(agent, bool) or not isinstance(agent, int) or not 0 <= agent < num_agents:
            raise DataSchemaError(
                f"{what} row {i}: agent must be an int in [0, {num_agents}) with num_agents={num_agents}, got "
                f"{agent!r}; add an 'agent' column or pass one dataset per agent."
            )
        per[agent].append(row)
    return per


def pair_logps(model: Any, pairs: Sequence[Pair], pad_id: int, device: Any):
    """``([B] chosen, [B] rejected)`` summed completion log-probs of ``model`` on encoded
    ``pairs`` (the prompt with each completion, packed into one forward pass), with gradient
    when grad is enabled."""

    prompts = [p for p, _, _ in pairs] * 2
    comps = [c for _, c, _ in pairs] + [r for _, _, r in pairs]
    batch = pack_sequences(prompts, comps, pad_id).to(device)
    seq = sequence_logprobs(token_logprobs(model, batch), batch.completion_mask)
    return seq[:len(pairs)], seq[len(pairs):]


"""CollabLLM suites: an assistant collaborates with a simulated user who holds a hidden problem.

The rows come from the Hugging Face datasets ``collabllm/collabllm-multiturn-{math-hard, medium,
bigcodebench}`` (and their ``-large`` variants, the ones used in the CollabLLM paper), or from
local parquet / json / jsonl files in the same schema (``data_files=``).

Schema (one row per recorded conversation prefix)
    ======================== ========= ==========================================================
    column                   required  meaning
    ======================== ========= ==========================================================
    ``prompt``               yes       ``[{"role", "content"}, ...]``: the conversation so far,
                                       ending with a user turn (system messages allowed).
    ``single_turn_prompt``   yes       The full problem the user wants solved; hidden from the
                                       assistant (the simulated user's goal).
    ``single_turn_completion`` yes     Reference answer of that problem (used by rewards only).
    ``completion``           no        The recorded assistant reply to ``prompt``.
    ``conv_id``, ``turn_id`` no        Conversation id and position of this prefix.
    ``score``                no        Multiturn-aware reward of ``completion`` in the data.
    ``single_turn_metadata`` no        Task extras for rewards (level, tests, entry point...).
    ``sessions``             no        Recorded conversations sampled after ``completion``, in
                                       one of the layouts below.
    ``rewards``              no        Per-metric scores of the sessions (kept for rewards).
    ``task_desc``            no        Short task description for the user simulator; default
                                       per dataset (see :data:`TASK_DESCRIPTIONS`).
    ======================== ========= ==========================================================

    ``sessions`` layouts (all three load from parquet, json, jsonl and the hub):

    * **list** (``collabllm-multiturn-{math-hard, medium, bigcodebench}``): a list of message
      lists. A session may hold the whole conversation or only the continuation.
    * **struct of lists**: a struct keyed ``"0"``, ``"1"``, ... whose values are message lists.
    * **struct of sessions** (the paper's ``-large`` sets): a struct keyed ``"0"``, ``"1"``,
      ``"2"``... whose values are structs ``{average_score, forward_chat, <judge details>}``:
      ``forward_chat`` is the future sampled *after* the candidate ``completion`` (it starts
      with the user's next turn), ``average_score`` the mean of the session's judge scores, and
      the judge details are structs such as ``interactivity: {score, thought}`` (older math-hard
      rows also ``accuracy: {score, thought, reason}``).

    In the struct layouts, keys or fields that a row lacks are ``None`` (parquet/arrow and
    ``datasets`` give every row the union of the keys of all rows); a session that is ``None``
    (or whose every field is ``None``) is absent. A message list may also come as
    ``{"role": [...], "content": [...]}`` (``datasets``' ``Sequence`` of a struct).

    :meth:`CollabLLMTask.get_item` returns the row as a dict with ``sessions`` normalised to a
    list of message lists (``forward_chat`` for the ``-large`` layout), ``session_details``
    (one dict per session, in the same order: its struct key ``"key"``, ``average_score`` and
    the judge details, ``None`` fill-ins left out; an empty list for the list layouts, whose
    scores are in ``rewards``) and ``task_desc`` filled in.

Players
    ``"assistant"`` (trainable) and ``"user"`` (a simulated user; its default policy is
    :class:`SessionReplayUser`, which replays the recorded user turns). Turn order alternates
    ``("assistant",)``, ``("user",)``.

Start modes (``mode=`` at make, or ``reset(options={"mode": ...})``)
    * ``"train"``: the episode starts from the row's ``prompt`` prefix. Its messages are authored
      by ``"user"`` / ``"assistant"`` but are data: never trainable, marked
      ``meta={"from_data": True}``. The assistant is on turn, answering the last user turn.
    * ``"eval"``: from scratch; the user opens the chat (the user is on turn first).

System prompt
    By default the assistant's first message is :data:`DEFAULT_SYSTEM_PROMPT`, a collaborative
    prompt (our wording of the intent of the prompt the verl recipe prepends to every RL row:
    understand the user's goal, ask about what is unclear instead of guessing, suggest next
    steps, stay concise, adapt to the user, be honest about uncertainty). It goes to the
    assistant only: the user simulator has its own instructions. It replaces the system
    messages of the row's ``prompt``. ``system_prompt="..."`` puts another text in its place;
    ``system_prompt=None`` adds none and keeps the row's own system messages.

    ``prompts="collabllm"`` puts the reference's own system prompt in its place, read at
    ``make`` from the installed collabllm package (its ``prompts/system_prompt.txt``; install it
    with ``pip install --no-deps collabllm``); ``prompts=PATH`` reads it from a verl checkout
    (the ``SYSTEM_PROMPT`` of ``recipe/collabllm/process_dataset.py``). No reference text is
    stored in collab_env (:mod:`collab_env.agents.reference_prompts`). ``prompts`` and a
    ``system_prompt`` of one's own exclude each other. ``env.unwrapped.task.prompt_source``
    names the set in use (``collab_env (own wording)`` by default), and with a reference set
    the reset info carries it as ``"prompts"``. The user simulator and the judges take their
    own ``prompts=`` (:class:`~collab_env.agents.users.LLMUserSimulator`,
    :meth:`LLMJudge.preset <collab_env.agents.judges.LLMJudge.preset>`).

Observations
    The conversation as each player sees it. Only the user sees its hidden goal: a system message
    (``audience=("user",)``) whose ``meta`` holds ``single_turn_prompt``, ``task_desc``,
    ``termination_signal``, ``mode`` and ``user_turns`` (the recorded user turns to replay in
    this mode). The assistant's ``system_prompt`` (or, with ``system_prompt=None``, the system
    messages of the row's ``prompt``) is visible to the assistant only. The reference answer
    (``single_turn_completion``, ``completion``, ground truth) is in no observation; it stays in
    the task item for the rewards.

Actions
    Message text (any ``str``).

Rewards
    The environment itself returns **0.0 on every step** and reports no reward components:
    CollabLLM rewards (accuracy, interactivity, token amount, BLEU, pass rate and the
    multiturn-aware reward built from them) come from the reward wrappers configured by
    ``EnvSpec.reward``. The final step's info carries a ``"reward_note"`` saying so.

Episode end
    * terminated, reason ``"user_terminated"``: a user message contains the termination signal
      (``"[[TERMINATE CHAT]]"`` by default);
    * truncated, reason ``"max_assistant_turns"``: the assistant has written
      ``max_assistant_turns`` messages in this episode (the prefix does not count);
    * truncated, reason ``"max_user_turns"``: the user has written ``max_user_turns`` messages and
      the assistant has answered the last one (as in verl's agent loop, budgets are checked after
      an assistant turn, so a truncated episode ends on an assistant reply);
    * truncated by the env's own ``max_steps`` (default ``2 * max_assistant_turns``) or
      ``max_total_chars``.

Loading
    Datasets load eagerly at ``make`` so problems surface at once. With ``data_files`` the builder
    follows the extension (``.json`` / ``.jsonl`` -> ``"json"``, ``.parquet`` -> ``"parquet"``).
    Without it the rows come from the hub: with ``HF_HUB_OFFLINE`` / ``HF_DATASETS_OFFLINE`` set,
    only the local cache is used; otherwise the hub endpoint is probed first (3 s TCP connect)
    and an unreachable hub raises :class:`~collab_env.errors.DatasetUnavailableError` at once,
    saying what to do instead. A missing required column raises
    :class:`~collab_env.errors.DataSchemaError` naming the column and the file; a malformed
    ``prompt`` is reported when its row is first drawn (the first row is checked at make).

Version history
    * ``collabllm-bigcodebench(-large)-v2``: ``pass_rate`` runs the rows' ``unittest.TestCase``
      suites (one sandboxed process per test method, passed methods over methods; a suite
      with no method is an error) through :func:`collab_env.sandbox.harness.run_tests`. Under
      v1 it executed the class definition only and every program scored 1.0; the v1 ids are
      legacy and now score like v2. The card states the same-process residual risk.
    * v1: the assistant gets :data:`DEFAULT_SYSTEM_PROMPT` by default (``system_prompt=None``
      restores v0's prompts); the ``-large`` ``sessions`` layout loads (``session_details`` in
      the item); on ``collabllm-medium(-large)`` the spec's ``bleu_score`` is the recipe's
      character BLEU (it was word-level BLEU, now ``bleu_word``), scored on the document an LLM
      extracts when a judge is given.
    * v0: first version.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np

from collab_env.env import CollabEnv, EpisodeState, Outcome, Start, Task, env_message
from collab_env.errors import ConfigError, DataSchemaError, PolicyError
from collab_env.policy import ScriptedPolicy
from collab_env.tasks._common import build_config, build_env, split_env_kwargs
from collab_env.tasks.cards import docstring_cards
from collab_env.tasks.collabllm_load import check_data_files, data_file_list, load_collabllm_dataset
from collab_env.tasks.collabllm_rows import (
    REQUIRED_COLUMNS,
    RL_LAYOUT,
    default_task_desc,
    is_rl_layout,
    normalize_messages,
    normalize_sessions,
    schema_row_from_rl,
)
from collab_env.types import Conversation, Message

# The env cards: data in collab_env.tasks.cards (the registry's), text here for help() and pydoc.
__doc__ = (__doc__ or "") + docstring_cards(*(f"collabllm-{ds}{large}-v1"
                                               for ds in ("math-hard", "medium", "bigcodebench")
                                               for large in ("", "-large")),
                                             "collabllm-bigcodebench-v2", "collabllm-bigcodebench-large-v2")

__all__ = [
    "CollabLLMConfig",
    "CollabLLMTask",
    "SessionReplayUser",
    "make_env",
    "DEFAULT_TERMINATION_SIGNAL",
    "DEFAULT_SYSTEM_PROMPT",
]

DEFAULT_TERMINATION_SIGNAL = "[[TERMINATE CHAT]]"

#: The assistant's default system prompt on the ``collabllm-*`` envs: our own wording of what
#: the CollabLLM recipe asks of the assistant in the prompt it puts before every RL row.
DEFAULT_SYSTEM_PROMPT = (
    "You are a collaborative assistant. Your aim is to help the user reach their goal over the "
    "whole conversation, not only to reply to their latest message.\n\n"
    "Work out what the user actually wants and keep track of what they have already told you. "
    "When a request is vague or misses something you need, ask about it instead of guessing: "
    "ask specific questions and, when it helps, offer a few concrete options to choose from.\n\n"
    "Take the initiative: point out next steps, alternatives or problems the user may not have "
    "thought of.\n\n"
    "Respect the user's time: be concise, do not repeat yourself, and keep what they have to "
    "read or type short.\n\n"
    "Match the user's tone and level of expertise. Be accurate, and when you are not sure of "
    "something, say so and suggest how it could be checked."
)

_MODES = ("train", "eval")
_GOAL_KIND = "collabllm_goal"
_REWARD_NOTE = (
    "collabllm envs return reward 0.0 on every step; CollabLLM rewards (accuracy, interactivity, "
    "token amount, BLEU, pass rate, multiturn-aware reward) come from the reward wrappers "
    "configured by EnvSpec.reward."
)


# ---------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------
@dataclass
class CollabLLMConfig:
    """Configuration of a CollabLLM task (the ``make`` keywords besides the env's own)."""

    dataset: str = "collabllm/collabllm-multiturn-math-hard"
    """Hub dataset id (or a local dataset directory); with ``data_files`` it only names the
    dataset family (for the default ``task_desc``)."""

    data_files: str | list[str] | dict[str, Any] | None = None
    """Local parquet/json/jsonl file(s) in the documented schema: a path, a list of paths or a
    ``{split: path(s)}`` dict. Globs are allowed."""

    split: str = "train"
    """Split to read."""

    mode: Literal["train", "eval"] = "train"
    """``"train"``: start from the row's prompt prefix, assistant on turn. ``"eval"``: start
    from scratch, the user opens. ``reset(options={"mode": ...})`` overrides it per episode."""

    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT
    """System prompt of the assistant (replaces the system messages of the row's prompt).
    Default: :data:`DEFAULT_SYSTEM_PROMPT`; ``None``: none added, the row's own kept."""

    prompts: Any = None
    """Whose assistant system prompt: ``None`` / ``"collab_env"`` (our wording,
    :attr:`system_prompt`), ``"collabllm"`` (the installed collabllm package's
    ``system_prompt.txt``, read at make) or a path to a verl checkout (its
    ``recipe/collabllm/process_dataset.py`` ``SYSTEM_PROMPT``). Excludes a ``system_prompt``
    of one's own."""

    termination_signal: str = DEFAULT_TERMINATION_SIGNAL
    """A user message containing this text ends the episode (``"user_terminated"``)."""

    max_assistant_turns: int | None = 10
    """Assistant messages per episode before truncation (``None``: no limit). The verl
    recipe's 3 is the window of *future* rollouts in the reward, not an episode budget."""

    max_user_turns: int | None = 10
    """User messages per episode after which the episode ends once the assistant answered
    (``None``: no limit). Prefix turns do not count."""

    task_desc: str | None = None
    """Task description shown to the user; overrides the row's ``task_desc`` and the default."""

    def __post_init__(self) -> None:
        if not isinstance(self.dataset, str) or not self.dataset.strip():
            raise ConfigError(f"dataset must be a non-empty str, got {self.dataset!r}.")
        self.data_files = check_data_files(self.data_files)
        if not isinstance(self.split, str) or not self.split:
            raise ConfigError(f"split must be a non-empty str, got {self.split!r}.")
        if self.mode not in _MODES:
            raise ConfigError(f"mode must be one of {_MODES}, got {self.mode!r}.")
        if self.system_prompt is not None and not isinstance(self.system_prompt, str):
            raise ConfigError(f"system_prompt must be a str or None, got {type(self.system_prompt).__name__}.")
        if not isinstance(self.termination_signal, str) or not self.termination_signal:
            raise ConfigError(
                f"termination_signal must be a non-empty str, got {self.termination_signal!r}."
            )
        for name in ("max_assistant_turns", "max_user_turns"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1):
                raise ConfigError(f"{name} must be an int >= 1 or None, got {v!r}.")
        if self.task_desc is not None and not isinstance(self.task_desc, str):
            raise ConfigError(f"task_desc must be a str or None, got {type(self.task_desc).__name__}.")
        if self.prompts is not None and self.prompts != "collab_env":  # lazy: read only when asked
            from collab_env.agents.reference_prompts import check_prompts_value

            check_prompts_value(self.prompts, "collabllm make_env")
            if self.system_prompt != DEFAULT_SYSTEM_PROMPT:
                raise ConfigError(
                    f"prompts={self.prompts!r} gives the assistant the reference's system prompt; "
                    "system_prompt= gives it another one. Pass one of the two."
                )


def _continuation(session: list[dict[str, str]], prefix: list[dict[str, str]]) -> list[dict[str, str]]:
    """The part of a recorded session that follows ``prefix`` (sessions may hold either the
    whole conversation or only what came after the prefix). System messages are ignored."""
    chat = [m for m in session if m["role"] != "system"]
    pre = [m for m in prefix if m["role"] != "system"]
    if len(chat) >= len(pre) and all(
        a["role"] == b["role"] and a["content"] == b["content"] for a, b in zip(chat, pre)
    ):
        return chat[len(pre):]
    return chat


# ---------------------------------------------------------------------------------------------
# The task
# ---------------------------------------------------------------------------------------------
class CollabLLMTask(Task):
    """One CollabLLM dataset as a task; see the module docstring for the whole contract.

    Args:
        config: The validated configuration; the rows load here (eagerly).
    """

    players = ("assistant", "user")
    user_players = ("user",)
    turn_order = (("assistant",), ("user",))
    option_keys: ClassVar[frozenset[str]] = frozenset({"mode"})
    #: Which prompt set the env uses: ``collab_env (own wording)`` or the reference set's
    #: :meth:`~collab_env.agents.reference_prompts.PromptSet.describe`.
    prompt_source: str = "collab_env (own wording)"
    #: The reference prompt set in use (``None``: our own wording).
    prompt_set: Any = None
    #: The reference's assistant system prompt, read at make (with :attr:`prompt_set` only).
    reference_system_prompt: str | None = None

    def __init__(self, config: CollabLLMConfig) -> None:
        self.config = config
        self._source = ", ".join(data_file_list(config.data_files)) if config.data_files else config.dataset
        if config.prompts is not None and config.prompts != "collab_env":
            from collab_env.agents.reference_prompts import describe_prompts, resolve_prompts

            prompt_set = resolve_prompts(config.prompts, "collabllm make_env")
            assert prompt_set is not None  # config.prompts names a reference set, not our own wording
            self.prompt_set = prompt_set
            self.reference_system_prompt = prompt_set.template(
                "assistant_system", fields=(), who="collabllm make_env").text
            self.prompt_source = describe_prompts(prompt_set)
        self._rows = load_collabllm_dataset(config.dataset, config.data_files, config.split)
        self._default_desc = default_task_desc(config.dataset)
        # Enough env steps for the assistant's budget to end the episode first.
        self.default_max_steps = 2 * (config.max_assistant_turns or 20)
        self.get_item(0)  # fail fast on a malformed first row

    # -- items ---------------------------------------------------------------------------
    def num_items(self) -> int:
        return len(self._rows)

    def get_item(self, index: int) -> dict[str, Any]:
        """Row ``index`` as a dict: ``prompt`` and ``sessions`` as plain message lists,
        ``task_desc`` filled in. Raises DataSchemaError for a malformed row."""
        return self._item(dict(self._rows[int(index)]), f"collabllm: {self._source}, row {index}")

    def item_from_row(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """A caller's row (``reset(options={"item": row})``) as an item, checked like the
        dataset's own: a row of the schema, or an RL row as ``collab-env data`` and the verl
        recipe write it (what verl hands an agent loop)."""
        where = "collabllm: options['item']"
        row = dict(row)
        if is_rl_layout(list(row)):
            row = schema_row_from_rl(row, where=where)
        missing = [c for c in REQUIRED_COLUMNS if c not in row]
        if missing:
            raise DataSchemaError(f"{where} lacks {missing}: give a row of the CollabLLM schema (columns "
                                  f"{list(REQUIRED_COLUMNS)}) or an RL row (columns {list(RL_LAYOUT)}).")
        return self._item(row, where)

    def _item(self, row: dict[str, Any], where: str) -> dict[str, Any]:
        if row.get("conv_id") is not None:
            where += f" (conv_id {row['conv_id']})"
        prompt = normalize_messages(row["prompt"], what="prompt", where=where)
        chat = [m for m in prompt if m["role"] != "system"]
        if not chat or chat[-1]["role"] != "user":
            raise DataSchemaError(f"{where}: prompt must end with a user turn (the one the assistant answers).")
        for name in ("single_turn_prompt", "single_turn_completion"):
            if not isinstance(row[name], str):
                raise DataSchemaError(f"{where}: {name} must be text, got {type(row[name]).__name__}.")
        row["prompt"] = prompt
        row["sessions"], row["session_details"] = normalize_sessions(row.get("sessions"), where=where)
        row["task_desc"] = self.config.task_desc or row.get("task_desc") or self._default_desc
        return row

    # -- episode ---------------------------------------------------------------------------
    def start(self, state: EpisodeState, options: Mapping[str, Any]) -> Start:
        cfg = self.config
        mode = options.get("mode", cfg.mode)
        if mode not in _MODES:
            raise ConfigError(f"reset option 'mode' must be one of {_MODES}, got {mode!r}.")
        state.data["mode"] = mode
        item = state.item
        prefix = item["prompt"]
        future: Any = next((s for s in item["sessions"] if s), [])
        future_user = [m["content"] for m in _continuation(future, prefix) if m["role"] == "user"]
        prefix_user = [m["content"] for m in prefix if m["role"] == "user"]
        # Train: the prefix was already said, the user continues with the recorded future.
        # Eval: the user says everything, from its first recorded turn.
        user_turns = future_user if mode == "train" else prefix_user + future_user

        messages: list[Message] = []
        system = self.reference_system_prompt if self.prompt_set is not None else cfg.system_prompt
        if system is not None:
            messages.append(env_message(system, role="system", audience=("assistant",)))
        messages.append(self._goal_message(item, mode, user_turns))
        for m in prefix:
            if m["role"] == "system":
                if system is None:  # the row's own assistant system prompt
                    messages.append(env_message(m["content"], role="system", audience=("assistant",),
                                                meta={"from_data": True}))
            elif mode == "train":
                messages.append(Message(role=m["role"], content=m["content"], author=m["role"],
                                        trainable=False, meta={"from_data": True}))
        on_turn = ("assistant",) if mode == "train" else ("user",)
        info = {"mode": mode, "conv_id": _jsonable(item.get("conv_id"))}
        if self.prompt_set is not None:
            info["prompts"] = self.prompt_source
        return Start(messages=messages, on_turn=on_turn, info=info)

    def _goal_message(self, item: Mapping[str, Any], mode: str, user_turns: list[str]) -> Message:
        signal = self.config.termination_signal
        text = (
            f"You are a user asking an AI assistant for help with {item['task_desc']}. "
            "This is the problem you want solved (the assistant cannot see it):\n\n"
            f"{item['single_turn_prompt']}\n\n"
            f"When you are satisfied or want to stop, reply with {signal}."
        )
        meta = {
            "kind": _GOAL_KIND,
            "single_turn_prompt": item["single_turn_prompt"],
            "task_desc": item["task_desc"],
            "termination_signal": signal,
            "mode": mode,
            "user_turns": list(user_turns),
        }
        return env_message(text, role="system", audience=("user",), meta=meta)

    def step(self, state: EpisodeState, moves: Mapping[str, str], final: bool) -> Outcome:
        cfg = self.config
        end = {"reward_note": _REWARD_NOTE}
        if "user" in moves and cfg.termination_signal in moves["user"]:
            return Outcome(terminated=True, reason="user_terminated", info=end)
        if "assistant" in moves:
            if cfg.max_assistant_turns is not None and state.moves["assistant"] >= cfg.max_assistant_turns:
                return Outcome(truncated=True, reason="max_assistant_turns", info=end)
            if cfg.max_user_turns is not None and state.moves["user"] >= cfg.max_user_turns:
                return Outcome(truncated=True, reason="max_user_turns", info=end)
        return Outcome(info=end if final else {})


def _jsonable(v: Any) -> Any:
    return v.item() if isinstance(v, np.generic) else v


# ---------------------------------------------------------------------------------------------
# Default user: replay the recorded user turns
# ---------------------------------------------------------------------------------------------
class SessionReplayUser(ScriptedPolicy):
    """Deterministic user that replays the recorded user turns of the row.

    It reads everything from its own observation: the hidden goal message's ``meta`` holds the
    turns to replay for the episode's start mode (train: the recorded continuation after the
    prompt prefix; eval: the prefix's user turns, then the continuation). The n-th message the
    user writes in the episode is the n-th recorded turn; once they run out it sends the
    termination signal. In eval mode with nothing recorded, it opens with the
    ``single_turn_prompt``. Messages replayed from the dataset prefix (``meta["from_data"]``) do
    not count as the user's own moves.
    """

    name = "session-replay"
    #: Its turns do not depend on the assistant's replies: the multiturn-aware reward refuses it
    #: as a silent default (collab_env.rewards.mr.check_explicit_user); ``user="replay"`` asks for it.
    ignores_candidate = True

    def respond(self, observation: Conversation, rng: np.random.Generator) -> str:
        goal = next(
            (m for m in observation if m.role == "system" and m.meta.get("kind") == _GOAL_KIND), None
        )
        if goal is None:
            raise PolicyError(
                "SessionReplayUser found no CollabLLM goal message in its observation; it only "
                "drives the 'user' player of the collabllm-* environments."
            )
        me = observation.viewer or "user"
        sent = sum(1 for m in observation if m.author == me and m.role != "system" and not m.meta.get("from_data"))
        turns = list(goal.meta.get("user_turns") or [])
        if not turns and goal.meta.get("mode") == "eval":
            turns = [goal.meta["single_turn_prompt"]]
        if sent < len(turns):
            return turns[sent]
        return goal.meta["termination_signal"]


# ---------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------
def make_env(**kwargs: Any) -> CollabEnv:
    """Build a CollabLLM environment (the entry point of the ``collabllm-*`` ids).

    Args:
        dataset: Hub id, e.g. ``"collabllm/collabllm-multiturn-math-hard"`` (set by the spec).
        data_files: Local parquet/json/jsonl file(s) in the documented schema (works offline).
        split: Split to read (default ``"train"``).
        mode: ``"train"`` (start from the prompt prefix) or ``"eval"`` (the user opens).
        system_prompt: The assistant's system prompt (default :data:`DEFAULT_SYSTEM_PROMPT`;
            ``None``: none added, the row's own system messages kept).
        prompts: ``"collabllm"`` or a verl checkout path: the reference's own system prompt,
            read at make (default ``None``: ours; see "System prompt" above).
        termination_signal: Text that ends the chat when the user sends it.
        max_assistant_turns: Assistant messages per episode (default 10; ``None``: no limit).
        max_user_turns: User messages per episode (default 10; ``None``: no limit).
        task_desc: Task description shown to the user (default: the row's, else per dataset).
        render_mode: ``"ansi"`` or ``"human"``.
        max_steps: Env steps before truncation (default ``2 * max_assistant_turns``).
        max_message_chars: Longest message kept (longer actions are cut).
        max_total_chars: Truncate once all players together wrote this many characters.

    Raises:
        ConfigError: Unknown keyword (the message lists the valid ones) or invalid value.
        DatasetUnavailableError: The rows cannot be loaded (offline without ``data_files``...).
        DataSchemaError: The rows do not follow the schema.
    """
    env_kw, task_kw = split_env_kwargs(dict(kwargs))
    config = build_config(CollabLLMConfig, task_kw, where="collabllm make_env")
    return build_env(CollabLLMTask(config), env_kw)

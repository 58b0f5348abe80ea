"""team-facts: one simulated user, a team of cooperating agents, one conversation.

The user wants one number (the cost of a party order, the seats booked for a trip, the water a
garden needs) that is a sum of products of facts only the user knows: for every object a count
and a unit value, ``answer = sum(count * unit)``. The opening request states a few facts and
withholds the rest. The agents are on turn together; each may ask the user **one question per
round** (about one fact), and the user answers each agent **privately**. Only the captain
(``agent_0``) may give the final answer, ``\\boxed{N}``, checked exactly; so a team that splits the
questions and passes what it learns to the captain through team messages (which the user never
sees) beats one whose members all ask everything, which also pays for every duplicate question
and runs out of rounds.

Players
    ``agent_0`` (the captain) ... ``agent_{n-1}`` (trained) and ``user`` (simulated; default
    policy :class:`TeamFactsUser`). Spec default policies of the agents are
    :class:`CoordinatedTeam` (the scripted teammate of a single-agent view).
Turn order
    The opening request is in the transcript (written by the user); then all agents at once; then
    the user, if at least one agent asked a question that round, else all agents again; ...
Observations
    Agent ``a`` sees: its system prompt (the protocol, its name, the team, the captain; meta
    ``{"team": [...], "captain": "agent_0", "me": a}``), the opening request, its own messages,
    its teammates' messages as env messages ``"<b> asked the user: ..."`` / ``"<b> to the team:
    ..."`` (audience: the other agents) and the user's answers to it (``"The user (to you): ..."``,
    audience ``(a,)``). The user sees its hidden goal (every fact; structured in ``meta["hidden"]``),
    the opening, the agents' questions relayed as ``"<a> asks: ..."`` (audience ``("user",)``,
    meta ``{"team_question": {"agent", "status", "fact"}}``) and its own replies. The user never
    sees team messages; no agent sees another agent's private answer unless a teammate passes it
    on. The answer reaches nobody.
Actions
    Message text. For an agent, lines starting with ``TEAM:`` go to its teammates only; all the
    other text of the message, if any, is its question to the user (one question per message).
    A captain's message that contains ``\\boxed{...}`` is the final answer (not a question).
    The user's reply is split on ``@agent_k:`` markers and each part delivered to that agent only;
    text before the first marker goes to every agent that asked in the round.
Question accounting (exact, no judge)
    A question *names* the fact (object, kind) when one of its clauses that asks (v1:
    :func:`collab_env.tasks.questions.request_clauses`, the opening as the user's words; v0: any
    clause, split on ``? . ! ;`` and line breaks) mentions the object (singular or plural, whole
    word) and a keyword of the kind (unit keywords are checked first). Agents are taken in player
    order. The question's target
    is the first named fact, in problem order, that the team has not obtained yet (stated in the
    opening, or asked for earlier in the episode, or earlier in this round); the target becomes
    obtained (status ``"new"``). A question that names facts but only obtained ones is a
    ``"duplicate"``; one that names none is ``"useless"``.
Rewards
    Per agent round, every player gets ``accuracy - duplicate_cost * D - useless_cost * U``:
    ``accuracy`` is 1.0 when the captain's boxed number equals the answer that round (else 0.0),
    ``D`` and ``U`` count that round's duplicate and useless questions (questions of the
    answering round count too). User rounds give 0. The episode return is therefore
    ``accuracy - duplicate_cost * D_total - useless_cost * U_total``. Components (per player):
    ``accuracy``, ``question_cost`` (the team's, <= 0) and, for agents, ``own_question_cost``.
    With the defaults (both costs 0.1) the return lies in ``[-0.1 * n * ceil(max_steps / 2), 1]``
    (every agent asks a useless question in every asking round and nobody answers; with
    different costs the bound uses the larger one and is exact when ``useless_cost >=
    duplicate_cost``). ``team-facts-easy``: ``[-0.6, 1]``; ``team-facts-hard``: ``[-0.9, 1]``.
Joint, per-agent and difference rewards
    ``JointReward(env, team_round_reward, mode=...)`` (:class:`~collab_env.rewards.joint.JointReward`;
    ``team_round_reward_per_agent`` for ``"per_agent"``) scores each agent round by a reward
    function of the round's messages and the item only (it cannot see earlier rounds):
    :func:`team_round_reward` is ``accuracy - duplicate_cost * D - useless_cost * U`` with
    ``D`` counted within the round (against the facts stated in the opening), and
    :func:`team_round_reward_per_agent` gives agent ``i`` ``accuracy - its own charge``. Modes:
    ``"shared"`` (the joint reward; range ``[-c * n * R, 1]``), ``"per_agent"`` (``[-c * R, 1]``)
    and ``"difference"`` (``J - J(with agent i silent)``: the captain's is in ``[-c * R, 1]``, a
    teammate's in ``[-c * R, 0]``; so ``[-c * R, 1]``), with ``c = 0.1`` and ``R = ceil(max_steps /
    2)`` asking rounds. A repeated question in a later round is not charged there (it only costs a
    round of the budget). The user is not scored and keeps the env's reward.
Episode end
    Terminated: the captain answered (``"answered"``). Truncated: ``max_steps``.
Arguments
    See :class:`TeamFactsConfig`: ``num_agents``, ``num_objects``, ``num_stated``,
    ``duplicate_cost``, ``useless_cost``, value ranges, ``scenarios``, ``split``, ``num_items``.
Card
    Each id's card is its registry entry (``collab-env info team-facts-easy``); the reference
    teams' numbers come from ``benchmarks/bench_team_references.py``.
Version history
    v2 (issue 43): a question names a fact only when it is a question by its syntax
    (``question_rule="syntax"``, :mod:`collab_env.tasks.questions`): v1's rule took any clause
    whose *first word* was a question word or an auxiliary for a question, so statements that
    start with one ("Which means the total is the number of pizzas times ...", "Would multiply
    ...") and article-padded word lists named withheld facts and were answered as new
    questions. The reference teams ask the same questions and score the same. v1 stays
    registered (superseded) and keeps failing the exploit audit.
    v1 (issue 23): a question names a fact only when it asks for it (``question_rule=
    "question"``, :mod:`collab_env.tasks.questions`: an interrogative clause or an explicit "tell
    me", the object and the fact's keyword in the agent's own words, not copied from the
    opening, not a keyword dump); a statement, a guess, the opening copied back or a keyword
    list is a useless question. The reference teams ask the same questions and score the same.
    v0 (legacy; ``question_rule="keyword"``): initial release (scenarios party, trip, garden; one
    question per agent per round; private answers; duplicate and useless questions cost 0.1
    each). Any clause naming an object and a keyword counted as a question about it.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from collab_env.env import CollabEnv, EpisodeState, Outcome, Start, Task, env_message
from collab_env.errors import ConfigError
from collab_env.policy import ScriptedPolicy
from collab_env.registry import EnvCard
from collab_env.tasks._common import build_config, split_env_kwargs
from collab_env.tasks.cards import cards_section
from collab_env.tasks.exploit_quotes import EXPLOIT_QUOTES
from collab_env.tasks.hidden_facts import extract_boxed
from collab_env.tasks.questions import OPENER, SYNTAX, request_clauses
from collab_env.types import Conversation, Message

__all__ = [
    "TeamFactsConfig",
    "TeamFactsTask",
    "TeamFactsUser",
    "CoordinatedTeam",
    "NaiveTeam",
    "RandomTeam",
    "AnswerAtOnceTeam",
    "make_env",
    "generate_item",
    "named_facts",
    "split_message",
    "account_questions",
    "team_round_reward",
    "team_round_reward_per_agent",
    "CAPTAIN",
    "USER",
]

#: The captain: the only agent whose boxed answer counts.
CAPTAIN = "agent_0"
#: How a question names a fact: ``"syntax"`` (v2), ``"question"`` (v1, the superseded opener
#: rule) or ``"keyword"`` (legacy v0).
QUESTION_RULES = ("syntax", "question", "keyword")
#: The simulated user's player id.
USER = "user"

_TEAM_LINE = re.compile(r"^\s*team\s*:\s?(.*)$", re.IGNORECASE)
_MARKER = re.compile(r"@(agent_\d+)\s*:", re.IGNORECASE)


# ---------------------------------------------------------------------------------------------
# Scenarios: the vocabulary a problem is generated from
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Kind:
    keywords: tuple[str, ...]  # with the object in one clause: a question about this fact
    say: str  # the sentence stating the fact: {n}, {one}, {many}
    parse: str  # regex (with {one}/{many}) reading the number back out of the sentence
    ask: str  # the reference teams' question


@dataclass(frozen=True)
class _Scenario:
    name: str
    objects: tuple[tuple[str, str], ...]
    intro: str  # {objects}
    question: str
    count: _Kind
    unit: _Kind


_COUNT_WORDS = ("how many", "number of", "count", "quantity")

_SCENARIOS: tuple[_Scenario, ...] = (
    _Scenario(
        name="party",
        objects=(("pizza", "pizzas"), ("cake", "cakes"), ("pie", "pies"), ("salad", "salads"),
                 ("sandwich", "sandwiches"), ("lantern", "lanterns"), ("balloon", "balloons")),
        intro="Our club is throwing a party and I'm ordering {objects}.",
        question="What will the whole order cost, in dollars?",
        count=_Kind(_COUNT_WORDS, "We are ordering {n} {many}.", r"ordering (\d+) {many}\b",
                    "How many {many} are we ordering?"),
        unit=_Kind(("price", "cost", "how much", "dollar"), "One {one} costs {n} dollars.",
                   r"One {one} costs (\d+) dollars", "How much does one {one} cost?"),
    ),
    _Scenario(
        name="trip",
        objects=(("bus", "buses"), ("van", "vans"), ("car", "cars"), ("boat", "boats"),
                 ("minibus", "minibuses"), ("coach", "coaches")),
        intro="I'm booking {objects} for our school trip.",
        question="How many seats will we have in total?",
        count=_Kind(_COUNT_WORDS, "We booked {n} {many}.", r"booked (\d+) {many}\b",
                    "How many {many} did we book?"),
        unit=_Kind(("seat", "capacity", "hold", "fit", "passenger"), "Each {one} has {n} seats.",
                   r"Each {one} has (\d+) seats", "How many seats does each {one} have?"),
    ),
    _Scenario(
        name="garden",
        objects=(("rose", "roses"), ("tulip", "tulips"), ("fern", "ferns"), ("lily", "lilies"),
                 ("daisy", "daisies"), ("orchid", "orchids")),
        intro="I'm watering the rows of {objects} in the community garden.",
        question="How many liters of water do they need per day in total?",
        count=_Kind(_COUNT_WORDS + ("rows",), "We planted {n} rows of {many}.",
                    r"planted (\d+) rows of {many}\b", "How many rows of {many} did we plant?"),
        unit=_Kind(("water", "liter", "litre"), "Each row of {many} needs {n} liters of water.",
                   r"row of {many} needs (\d+) liters", "How much water does each row of {many} need?"),
    ),
)
_SCENARIO_BY_NAME = {s.name: s for s in _SCENARIOS}
_KINDS = ("count", "unit")


def _kind(sc: _Scenario, kind: str) -> _Kind:
    return sc.count if kind == "count" else sc.unit


def _join(words: Sequence[str]) -> str:
    words = list(words)
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


# ---------------------------------------------------------------------------------------------
# Config and items
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TeamFactsConfig:
    """Knobs of the team-facts suite.

    Args:
        num_agents: Agents in the team (``agent_0`` is the captain), 2..6.
        num_objects: Objects in a problem (each has a count and a unit value: 2 facts), 1..4.
        num_stated: Facts stated in the opening; the other ``2 * num_objects - num_stated`` are
            hidden.
        max_count: Counts are drawn from ``[2, max_count]``.
        max_unit: Unit values are drawn from ``[2, max_unit]``.
        scenarios: Scenario names to draw from (``party``, ``trip``, ``garden``).
        split: ``"train"`` or ``"test"``: disjoint item streams from the same generator.
        num_items: Make the suite finite (items ``0..num_items-1``); ``None`` for unlimited.
        duplicate_cost: Charged to the team for every duplicate question.
        useless_cost: Charged to the team for every question that names no fact.
        question_rule: When does a question name a fact: ``"syntax"`` (v2: only a clause that
            is a question by its syntax, :mod:`collab_env.tasks.questions` ``rule="syntax"``;
            the object and keyword may reuse the opening's words), ``"question"`` (v1,
            superseded: a clause whose first word asks, :mod:`collab_env.tasks.questions`,
            naming the object and a keyword of the kind
            in the agent's own words; a statement, a guess, the opening copied back or a keyword
            dump names nothing and is a useless question) or ``"keyword"`` (legacy v0: any
            clause naming the object and a keyword).
    """

    num_agents: int = 2
    num_objects: int = 2
    num_stated: int = 1
    max_count: int = 9
    max_unit: int = 12
    scenarios: tuple[str, ...] = ("party", "trip", "garden")
    split: str = "train"
    num_items: int | None = None
    duplicate_cost: float = 0.1
    useless_cost: float = 0.1
    question_rule: str = "question"

    def __post_init__(self) -> None:
        for name, lo, hi in (("num_agents", 2, 6), ("num_objects", 1, 4)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                raise ConfigError(f"{name} must be an int in {lo}..{hi}, got {v!r}.")
        if not 0 <= self.num_stated < 2 * self.num_objects:
            raise ConfigError(
                f"num_stated must be in 0..{2 * self.num_objects - 1} (at least one fact hidden), "
                f"got {self.num_stated}."
            )
        if self.max_count < 2 or self.max_unit < 2:
            raise ConfigError("max_count and max_unit must be >= 2.")
        object.__setattr__(self, "scenarios", tuple(self.scenarios))
        if not self.scenarios:
            raise ConfigError("scenarios must name at least one scenario.")
        for s in self.scenarios:
            if s not in _SCENARIO_BY_NAME:
                raise ConfigError(f"unknown scenario {s!r}; choose from {sorted(_SCENARIO_BY_NAME)}.")
        if self.split not in ("train", "test"):
            raise ConfigError(f"split must be 'train' or 'test', got {self.split!r}.")
        if self.num_items is not None and self.num_items < 1:
            raise ConfigError(f"num_items must be >= 1 or None, got {self.num_items}.")
        if self.question_rule not in QUESTION_RULES:
            raise ConfigError(f"question_rule must be one of {QUESTION_RULES}, got {self.question_rule!r}.")
        for name in ("duplicate_cost", "useless_cost"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ConfigError(f"{name} must be a finite number >= 0, got {v!r}.")

    @property
    def agents(self) -> tuple[str, ...]:
        """The agent ids, captain first."""
        return tuple(f"agent_{i}" for i in range(self.num_agents))


_SPLIT_STREAM = {"train": 0x7EA1, "test": 0x7EA2}


def generate_item(config: TeamFactsConfig, index: int) -> dict[str, Any]:
    """The problem at ``index``: a pure function of the config and the index.

    Facts are in problem order (for each object: its count, then its unit value); each has
    ``object``, ``plural``, ``kind``, ``value``, ``sentence`` and ``stated``.
    """
    rng = np.random.default_rng([_SPLIT_STREAM[config.split], int(index)])
    sc = _SCENARIO_BY_NAME[config.scenarios[int(rng.integers(len(config.scenarios)))]]
    picks = sorted(int(i) for i in rng.choice(len(sc.objects), size=config.num_objects, replace=False))
    facts: list[dict[str, Any]] = []
    for i in picks:
        one, many = sc.objects[i]
        for kind, hi in (("count", config.max_count), ("unit", config.max_unit)):
            value = int(rng.integers(2, hi + 1))
            facts.append({"object": one, "plural": many, "kind": kind, "value": value,
                          "sentence": _kind(sc, kind).say.format(n=value, one=one, many=many)})
    stated = {int(i) for i in rng.choice(len(facts), size=config.num_stated, replace=False)}
    for i, f in enumerate(facts):
        f["stated"] = i in stated
    names = _join([sc.objects[i][1] for i in picks])
    opening = " ".join([sc.intro.format(objects=names)] + [f["sentence"] for f in facts if f["stated"]]
                       + [sc.question])
    answer = sum(facts[2 * k]["value"] * facts[2 * k + 1]["value"] for k in range(len(picks)))
    return {
        "index": int(index),
        "scenario": sc.name,
        "objects": [sc.objects[i][0] for i in picks],
        "plurals": [sc.objects[i][1] for i in picks],
        "facts": facts,
        "opening": opening,
        "answer": answer,
        "duplicate_cost": float(config.duplicate_cost),
        "useless_cost": float(config.useless_cost),
        "question_rule": config.question_rule,
    }


# ---------------------------------------------------------------------------------------------
# The rules, as public functions (the task, the reward functions and the reference teams use them)
# ---------------------------------------------------------------------------------------------
def _mentions(clause: str, word: str) -> bool:
    return re.search(r"\b" + re.escape(word.lower()) + r"\b", clause) is not None


def named_facts(question: str, scenario: str, objects: Sequence[tuple[str, str]], *,
                rule: str = "syntax", quoted: Sequence[str] = ()) -> list[tuple[str, str]]:
    """The facts ``(object, kind)`` a question names, in problem order (see the module docstring).

    Args:
        question: The question text.
        scenario: The scenario name.
        objects: ``(singular, plural)`` of the problem's objects, in problem order.
        rule: ``"syntax"`` (v2): only clauses that are questions by their syntax
            (:func:`collab_env.tasks.questions.request_clauses`, ``rule="syntax"``), named in
            the question's scope (the user's words may be reused); ``"question"`` (v1): only
            clauses that ask
            (:func:`collab_env.tasks.questions.request_clauses`, with ``quoted`` as the user's
            words) count, and the object and the keyword must be the agent's own words;
            ``"keyword"`` (legacy v0): every clause.
        quoted: The user's texts (the opening): words copied from them name nothing.

    A pure function of its arguments, kept for the last 4,096 distinct ones: an episode's
    messages recur across seeds and policies, and parsing their clauses is most of a step's work.
    """
    return list(_named_facts(question, scenario, tuple((one, many) for one, many in objects), rule,
                             tuple(quoted)))


@functools.lru_cache(maxsize=4096)
def _named_facts(question: str, scenario: str, objects: tuple[tuple[str, str], ...], rule: str,
                 quoted: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    sc = _SCENARIO_BY_NAME[scenario]
    named: set[tuple[str, str]] = set()
    if rule in ("question", "syntax"):
        for c in request_clauses(question, quoted=quoted, rule=SYNTAX if rule == "syntax" else OPENER):
            for one, many in objects:
                if not (c.names(one) or c.names(many)):
                    continue
                if c.names_any(sc.unit.keywords):
                    named.add((one, "unit"))
                elif c.names_any(sc.count.keywords):
                    named.add((one, "count"))
        return tuple((one, kind) for one, _ in objects for kind in _KINDS if (one, kind) in named)
    clauses = [c.strip().lower() for c in re.split(r"[?.!;\n]+", question) if c.strip()]
    for clause in clauses:
        for one, many in objects:
            if not (_mentions(clause, one) or _mentions(clause, many)):
                continue
            if any(k in clause for k in sc.unit.keywords):
                named.add((one, "unit"))
            elif any(k in clause for k in sc.count.keywords):
                named.add((one, "count"))
    return tuple((one, kind) for one, _ in objects for kind in _KINDS if (one, kind) in named)


def split_message(text: str) -> tuple[str, str]:
    """``(question, team_note)`` of an agent's message: ``TEAM:`` lines (prefix removed) form
    the note; the other lines, stripped, the question (``""`` when there is none)."""
    question: list[str] = []
    team: list[str] = []
    for line in text.splitlines():
        m = _TEAM_LINE.match(line)
        (team if m else question).append(m.group(1).strip() if m else line)
    return "\n".join(question).strip(), "\n".join(t for t in team if t)


def account_questions(
    item: Mapping[str, Any], questions: Mapping[str, str], obtained: set[int], agents: Sequence[str]
) -> dict[str, dict[str, Any]]:
    """Classify one round's questions (see the module docstring) and update ``obtained``.

    Args:
        item: The task item.
        questions: Agent -> its question text (agents without a question left out).
        obtained: Indices of the facts the team has obtained; updated in place.
        agents: The agents in player order.

    Returns:
        Agent -> ``{"status": "new" | "duplicate" | "useless", "fact": index or None}``; for a
        duplicate, ``fact`` is the first fact the question names.
    """
    objects = list(zip(item["objects"], item["plurals"]))
    index = {(f["object"], f["kind"]): i for i, f in enumerate(item["facts"])}
    out: dict[str, dict[str, Any]] = {}
    for a in agents:
        if not questions.get(a):
            continue
        named = [index[k] for k in named_facts(questions[a], item["scenario"], objects,
                                               rule=item.get("question_rule", "question"),
                                               quoted=(item["opening"],))]
        fresh = [i for i in named if i not in obtained]
        if fresh:
            obtained.add(fresh[0])
            out[a] = {"status": "new", "fact": fresh[0]}
        elif named:
            out[a] = {"status": "duplicate", "fact": named[0]}
        else:
            out[a] = {"status": "useless", "fact": None}
    return out


def _charge(status: str, duplicate_cost: float, useless_cost: float) -> float:
    return {"new": 0.0, "duplicate": duplicate_cost, "useless": useless_cost}[status]


# ---------------------------------------------------------------------------------------------
# The task
# ---------------------------------------------------------------------------------------------
class TeamFactsTask(Task):
    """The team-facts rules; see the module docstring."""

    user_players = (USER,)
    default_max_steps = 6

    def __init__(self, config: TeamFactsConfig) -> None:
        self.config = config
        self.agents = config.agents
        self.players = (*self.agents, USER)
        self.turn_order = (self.agents, (USER,))

    def num_items(self) -> int | None:
        return self.config.num_items

    def get_item(self, index: int) -> Mapping[str, Any]:
        return generate_item(self.config, index)

    def audience(self, player: str) -> tuple[str, ...] | None:
        # Every raw message is its author's own; the env re-addresses its parts (see step).
        return (player,)

    def _agent_prompt(self, a: str) -> str:
        n, team = len(self.agents), ", ".join(self.agents)
        rules = (
            f"You are {a}, one of {n} agents ({team}) who help a user together; {CAPTAIN} is the "
            "captain. The user needs a number, and the facts it depends on are known only to the "
            "user. Every round all agents write at the same time. Whatever you write reaches the "
            "user as your question, except lines that start with 'TEAM:', which only your "
            "teammates see. Ask at most one question per round, about one fact; the user answers "
            "each agent privately. Asking for a fact your team has already asked for, or a "
            "question about no fact, costs the team, and rounds are limited. "
        )
        if a == CAPTAIN:
            return rules + ("You give the final answer: when you know every fact, write the number "
                            "in \\boxed{}, e.g. \\boxed{42}; that ends the chat.")
        return rules + (f"Only {CAPTAIN} can give the final answer: pass on what the user tells "
                        "you in TEAM: lines.")

    def start(self, state: EpisodeState, options: Mapping[str, Any]) -> Start:
        item = state.item
        messages = [
            env_message(self._agent_prompt(a), role="system", audience=(a,),
                        meta={"team": list(self.agents), "captain": CAPTAIN, "me": a})
            for a in self.agents
        ]
        facts = "\n".join(f"- {f['sentence']}" for f in item["facts"])
        goal = (
            "You are a user chatting with a team of AI agents. You want this answered: "
            f"{item['opening']}\nYou know these facts:\n{facts}\nEach round you receive the agents' "
            "questions. Answer every agent's question with the one fact it asks about, starting "
            "each answer on a new line with @<agent>: (for example '@agent_0: ...'). Reveal only "
            "what is asked."
        )
        hidden = {"scenario": item["scenario"], "facts": [dict(f) for f in item["facts"]],
                  "objects": list(item["objects"])}
        messages.append(env_message(goal, role="system", audience=(USER,), meta={"hidden": hidden}))
        messages.append(Message(role="user", content=item["opening"], author=USER, trainable=False))
        state.data["obtained"] = sorted(i for i, f in enumerate(item["facts"]) if f["stated"])
        state.data["askers"] = []
        return Start(messages=messages, on_turn=self.agents)

    def step(self, state: EpisodeState, moves: Mapping[str, str], final: bool) -> Outcome:
        if USER in moves:
            return self._deliver(state, moves[USER])
        cfg, item = self.config, state.item
        accuracy = None
        if CAPTAIN in moves:
            guess = extract_boxed(moves[CAPTAIN])
            if guess is not None:
                accuracy = float(guess == item["answer"])
        parts = {a: split_message(moves.get(a, "")) for a in self.agents}
        questions = {a: q for a, (q, _) in parts.items() if q and not (a == CAPTAIN and accuracy is not None)}
        obtained = set(state.data["obtained"])
        verdicts = account_questions(item, questions, obtained, self.agents)
        state.data["obtained"] = sorted(obtained)
        own = {a: -_charge(v["status"], cfg.duplicate_cost, cfg.useless_cost) for a, v in verdicts.items()}
        team_cost = sum(own.values())
        acc = accuracy if accuracy is not None else 0.0
        r = acc + team_cost
        messages = []
        for a in self.agents:
            question, note = parts[a]
            lines = []
            if a in questions:
                lines.append(f"{a} asked the user: {question}")
            if note:
                lines.append(f"{a} to the team: {note}")
            others = tuple(b for b in self.agents if b != a)
            if lines:
                messages.append(env_message("\n".join(lines), audience=others))
        done = accuracy is not None
        if not done:
            for a in self.agents:
                if a in verdicts:
                    messages.append(env_message(f"{a} asks: {questions[a]}", audience=(USER,),
                                                meta={"team_question": {"agent": a, **verdicts[a]}}))
        state.data["askers"] = [a for a in self.agents if a in verdicts]
        components = {p: {"accuracy": acc, "question_cost": team_cost} for p in self.players}
        for a in self.agents:
            components[a]["own_question_cost"] = own.get(a, 0.0)
        info = {"questions": {a: v["status"] for a, v in verdicts.items()}}
        return Outcome(
            messages=messages,
            rewards=dict.fromkeys(self.players, r),
            components=components,
            terminated=done,
            reason="answered" if done else None,
            next_on_turn=None if done else ((USER,) if verdicts else self.agents),
            info=info,
        )

    def _deliver(self, state: EpisodeState, reply: str) -> Outcome:
        """Split the user's reply on ``@agent_k:`` markers and deliver each part privately."""
        parts: dict[str, list[str]] = {}
        marks = [m for m in _MARKER.finditer(reply) if m.group(1).lower() in self.agents]
        head = reply[: marks[0].start()] if marks else reply
        if head.strip():
            for a in state.data["askers"]:
                parts.setdefault(a, []).append(head.strip())
        for k, m in enumerate(marks):
            end = marks[k + 1].start() if k + 1 < len(marks) else len(reply)
            text = reply[m.end():end].strip()
            if text:
                parts.setdefault(m.group(1).lower(), []).append(text)
        messages = [env_message("The user (to you): " + " ".join(parts[a]), audience=(a,))
                    for a in self.agents if a in parts]
        return Outcome(messages=messages, next_on_turn=self.agents)


def make_env(**kwargs: Any) -> CollabEnv:
    """Entry point of the ``team-facts*`` ids: :class:`TeamFactsConfig` keywords plus
    ``max_steps``, ``max_message_chars``, ``max_total_chars``, ``render_mode``."""
    env_kw, task_kw = split_env_kwargs(dict(kwargs))
    config = build_config(TeamFactsConfig, task_kw, where="team-facts")
    return CollabEnv(TeamFactsTask(config), **env_kw)


# ---------------------------------------------------------------------------------------------
# Joint rewards (CoMLRL-style reward functions for JointReward; module level so envs pickle)
# ---------------------------------------------------------------------------------------------
def _round_verdicts(completions: Sequence[Sequence[str]], item: Mapping[str, Any]):
    agents = tuple(f"agent_{i}" for i in range(len(completions)))
    texts = {a: (c[0] if c else "") for a, c in zip(agents, completions)}
    guess = extract_boxed(texts[CAPTAIN])
    accuracy = 0.0 if guess is None else float(guess == item["answer"])
    questions = {}
    for a, t in texts.items():
        q, _ = split_message(t)
        if q and not (a == CAPTAIN and guess is not None):
            questions[a] = q
    obtained = {i for i, f in enumerate(item["facts"]) if f["stated"]}
    return agents, accuracy, account_questions(item, questions, obtained, agents)


def _costs(item: Mapping[str, Any]) -> tuple[float, float]:
    return float(item["duplicate_cost"]), float(item["useless_cost"])


def team_round_reward(*completions: Sequence[str], batch_items: Sequence[Mapping[str, Any]]) -> list[float]:
    """Joint reward of one agent round (a CoMLRL ``reward_func``: one completion list per agent,
    captain first): ``accuracy - duplicate_cost * D - useless_cost * U`` with the round's
    questions classified against the facts stated in the opening only, and the costs the item
    carries (its config's ``duplicate_cost`` / ``useless_cost``)."""
    item = batch_items[0]
    dup, useless = _costs(item)
    _, accuracy, verdicts = _round_verdicts(completions, item)
    return [accuracy - sum(_charge(v["status"], dup, useless) for v in verdicts.values())]


def team_round_reward_per_agent(*completions: Sequence[str],
                                batch_items: Sequence[Mapping[str, Any]]) -> list[list[float]]:
    """Per-agent reward of one agent round: agent ``i`` gets the round's ``accuracy`` minus the
    charge of its own question (a ``JointReward(mode="per_agent")`` reward function)."""
    item = batch_items[0]
    dup, useless = _costs(item)
    agents, accuracy, verdicts = _round_verdicts(completions, item)
    return [[accuracy - (_charge(verdicts[a]["status"], dup, useless) if a in verdicts else 0.0)
             for a in agents]]


# ---------------------------------------------------------------------------------------------
# Policies: the scripted user and the reference teams
# ---------------------------------------------------------------------------------------------
def _meta_of(observation: Conversation, key: str, who: str) -> Mapping[str, Any]:
    for m in observation:
        if m.role == "system" and key in m.meta:
            return m.meta
    raise ConfigError(
        f"{who} needs an observation of a team-facts env (its system message with meta "
        f"{key!r} was not found); use it only in team-facts envs."
    )


class TeamFactsUser(ScriptedPolicy):
    """The scripted user of team-facts (deterministic).

    It answers every question relayed to it since its last reply, one line per agent
    (``@agent_k: <sentence>``): the sentence of the fact the env classified the question as
    asking for (for a duplicate, the first fact it names, said again); for a useless question,
    ``"Sorry, I don't know what you mean."``.
    """

    name = "team-facts-user"

    def respond(self, observation: Conversation, rng: np.random.Generator) -> str:
        facts = _meta_of(observation, "hidden", "TeamFactsUser")["hidden"]["facts"]
        pending: list[Any] = []
        for m in observation:
            if m.author == USER:
                pending = []
            elif "team_question" in m.meta:
                pending.append(m.meta["team_question"])
        lines = []
        for q in pending:
            said = facts[q["fact"]]["sentence"] if q["fact"] is not None else "Sorry, I don't know what you mean."
            lines.append(f"@{q['agent']}: {said}")
        return "\n".join(lines) if lines else "I'm waiting for your questions."


@dataclass
class _Knowledge:
    me: str
    team: list[str]
    scenario: _Scenario | None
    objects: list[tuple[str, str]]
    known: dict[tuple[str, str], int]  # what I know (opening, my answers, teammates' notes)
    told_me: dict[tuple[str, str], str]  # facts the user told me -> their sentences
    said: str  # everything I wrote
    asked: set[tuple[str, str]]  # facts my questions named

    @property
    def facts(self) -> list[tuple[str, str]]:
        return [(one, kind) for one, _ in self.objects for kind in _KINDS]


def _parse_values(text: str, sc: _Scenario,
                  objects: Sequence[tuple[str, str]]) -> dict[tuple[str, str], tuple[int, str]]:
    out = {}
    for one, many in objects:
        for kind in _KINDS:
            k = _kind(sc, kind)
            m = re.search(k.parse.format(one=re.escape(one), many=re.escape(many)), text)
            if m:
                out[(one, kind)] = (int(m.group(1)), k.say.format(n=m.group(1), one=one, many=many))
    return out


_WHO = re.compile(r"You are (agent_\d+), one of \d+ agents \(([^)]*)\)")


def read_knowledge(observation: Conversation, *, use_team: bool = True) -> _Knowledge:
    """What an agent knows from its own observation only (never hidden data): the scenario, the
    objects, the values stated in the opening, told to it by the user and (``use_team``) passed
    on by teammates; what it asked and wrote.

    Works on an agent's view and on the plain ``[{"role", "content"}]`` chat of it
    (``Conversation.from_chat``: what an API-served model receives): its name and team come
    from the system message's meta, or else from the system prompt's text; its own messages are
    the ``"assistant"`` ones.
    """
    meta = next((m.meta for m in observation if m.role == "system" and "team" in m.meta), None)
    if meta is not None:
        me, team = meta["me"], list(meta["team"])
    else:
        who = _WHO.search(observation.system_prompt or "")
        if who is None:
            raise ConfigError(
                "the team-facts reference teams need an agent's observation of a team-facts env "
                "(its system prompt naming the agent and its team was not found)."
            )
        me, team = who.group(1), [t.strip() for t in who.group(2).split(",")]
    chat = [m for m in observation if m.role != "system"]
    opening = next((m.content for m in chat if m.role == "user"), "")
    sc = next((s for s in _SCENARIOS if s.question in opening), None)
    if sc is None:
        return _Knowledge(me, team, None, [], {}, {}, "", set())
    objects = [(one, many) for one, many in sc.objects if re.search(r"\b" + many + r"\b", opening)]
    known = {k: v for k, (v, _) in _parse_values(opening, sc, objects).items()}
    told_me: dict[tuple[str, str], str] = {}
    said, asked = [], set()
    start = next((i for i, m in enumerate(chat) if m.role == "user"), len(chat)) + 1
    for m in chat[start:]:
        if m.role == "assistant":
            said.append(m.content)
            q, _ = split_message(m.content)
            asked.update(named_facts(q, sc.name, objects))
        elif m.content.startswith("The user (to you):"):
            for k, (v, s) in _parse_values(m.content, sc, objects).items():
                known[k], told_me[k] = v, s
        elif use_team:
            for k, (v, _) in _parse_values(m.content, sc, objects).items():
                known[k] = v
    return _Knowledge(me, team, sc, objects, known, told_me, "\n".join(said), asked)


def _ask(kn: _Knowledge, fact: tuple[str, str]) -> str:
    one = fact[0]
    many = dict(kn.objects)[one]
    return _kind(kn.scenario, fact[1]).ask.format(one=one, many=many)  # type: ignore[arg-type]


def _total(kn: _Knowledge) -> int:
    return sum(kn.known.get((one, "count"), 1) * kn.known.get((one, "unit"), 1) for one, _ in kn.objects)


class CoordinatedTeam(ScriptedPolicy):
    """Reference team (every agent runs this policy): split the hidden facts, pass them on.

    The facts the opening does not state are dealt round-robin in problem order (``k``-th hidden
    fact to ``agent_{k mod n}``); each agent asks its own facts, one per round, and every
    teammate passes each fact the user told it to the captain in a ``TEAM:`` line (the user's
    sentence, verbatim). The captain answers as soon as it knows every fact. No duplicate and no
    useless question; ``2 * ceil(h / n)`` rounds of asking plus the relays.
    """

    name = "team-coordinated"

    def respond(self, observation: Conversation, rng: np.random.Generator) -> str:
        kn = read_knowledge(observation)
        if kn.scenario is None:
            return "TEAM: I can't tell what the user needs."
        if kn.me == CAPTAIN and all(f in kn.known for f in kn.facts):
            return f"Thanks, team. The total is \\boxed{{{_total(kn)}}}."
        opening = next((m.content for m in observation if m.role == "user"), "")
        stated = _parse_values(opening, kn.scenario, kn.objects)
        hidden = [f for f in kn.facts if f not in stated]
        mine = [f for k, f in enumerate(hidden) if kn.team[k % len(kn.team)] == kn.me]
        todo = [f for f in mine if f not in kn.asked and f not in kn.known]
        lines = [_ask(kn, todo[0])] if todo else []
        if kn.me != CAPTAIN:
            lines += [f"TEAM: {s}" for s in kn.told_me.values() if s not in kn.said]
        return "\n".join(lines) if lines else "TEAM: Waiting for the others."


class NaiveTeam(ScriptedPolicy):
    """Reference team with no coordination: every agent asks, one per round, the first fact it
    does not know itself (ignoring its teammates), and never passes anything on; the captain
    answers when it has asked everything. Every teammate's question duplicates the captain's."""

    name = "team-naive"

    def respond(self, observation: Conversation, rng: np.random.Generator) -> str:
        kn = read_knowledge(observation, use_team=False)
        if kn.scenario is None:
            return "What do you need?"
        missing = [f for f in kn.facts if f not in kn.known]
        if kn.me == CAPTAIN and not missing:
            return f"The total is \\boxed{{{_total(kn)}}}."
        return _ask(kn, missing[0]) if missing else "TEAM: I know everything I need."


class AnswerAtOnceTeam(ScriptedPolicy):
    """Reference team that does not collaborate (the exploit audit's naive baseline): the captain
    answers at once from what the opening states, taking 1 for every missing quantity; the other
    agents say nothing to the user ("TEAM: Nothing to add."). No question, no cost."""

    name = "team-answer-at-once"

    def respond(self, observation: Conversation, rng: np.random.Generator) -> str:
        kn = read_knowledge(observation)
        if kn.scenario is None or kn.me != CAPTAIN:
            return "TEAM: Nothing to add."
        return f"The total is \\boxed{{{_total(kn)}}}."


class RandomTeam(ScriptedPolicy):
    """Reference team of random moves: each round an agent picks uniformly among asking about a
    random fact of the problem (stated or not), passing on what it knows, and (the captain
    only) answering from what it knows, taking 1 for every missing quantity."""

    name = "team-random"

    def respond(self, observation: Conversation, rng: np.random.Generator) -> str:
        kn = read_knowledge(observation)
        if kn.scenario is None:
            return "Hello?"
        choices = ["ask", "relay"] + (["answer"] if kn.me == CAPTAIN else [])
        pick = choices[int(rng.integers(len(choices)))]
        if pick == "answer":
            return f"My guess is \\boxed{{{_total(kn)}}}."
        if pick == "ask":
            return _ask(kn, kn.facts[int(rng.integers(len(kn.facts)))])
        notes = [_kind(kn.scenario, k).say.format(n=v, one=o, many=dict(kn.objects)[o])
                 for (o, k), v in kn.known.items()]
        return "\n".join(f"TEAM: {s}" for s in notes) or "TEAM: Nothing yet."


# ---------------------------------------------------------------------------------------------
# Levels, policy names and cards (registered by collab_env.tasks.register_builtin)
# ---------------------------------------------------------------------------------------------
#: The reference policies' and the scripted user's short names.
TEAM_POLICIES: dict[str, str] = {
    "team-facts-user": "collab_env.tasks.team:TeamFactsUser",
    "team-coordinated": "collab_env.tasks.team:CoordinatedTeam",
    "team-naive": "collab_env.tasks.team:NaiveTeam",
    "team-random": "collab_env.tasks.team:RandomTeam",
    "team-answer-at-once": "collab_env.tasks.team:AnswerAtOnceTeam",
}

#: The registered levels: id -> make keywords, the default reward's range, the card's
#: ``tests`` sentence, a description.
_TEAM_LEVELS: dict[str, dict[str, Any]] = {
    "team-facts-easy": dict(
        kwargs={"num_agents": 2, "num_objects": 2, "num_stated": 1, "max_steps": 6},
        reward_range=(-0.6, 1.0),
        tests=("Cooperation between agents serving one user: two agents split three withheld "
               "facts without duplicate questions and pass the private answers to the captain "
               "through team messages the user does not see, within 6 steps (one spare)."),
        description=(
            "Team suite: a user and two agents on turn together. Two objects, three of the four "
            "facts withheld; one question per agent per round, answered privately; only the "
            "captain answers (\\boxed{N}, exact); duplicate and useless questions cost 0.1; "
            "6 steps."
        ),
    ),
    "team-facts-hard": dict(
        kwargs={"num_agents": 3, "num_objects": 3, "num_stated": 0, "max_steps": 6},
        reward_range=(-0.9, 1.0),
        tests=("Cooperation between agents serving one user, hard: three agents split six "
               "withheld facts and relay them to the captain, in exactly the 6 steps a perfect "
               "split with relays needs."),
        description=(
            "Team suite, hard: three agents, three objects, all six facts withheld, 6 steps (the "
            "fewest a perfectly split team with relays needs)."
        ),
    ),
}

#: v1 (issue 23): a question names a fact only when it asks for it; v0 (legacy) keeps the keyword
#: rule (``question_rule="keyword"``).
TEAM_FACTS_LEVELS: dict[str, dict[str, Any]] = {
    **{f"{name}-v0": {**level, "kwargs": {**level["kwargs"], "question_rule": "keyword"},
                      "tests": "Legacy (v0, keyword rule: use v1). " + level["tests"],
                      "description": level["description"] + " Legacy v0: any clause naming an object "
                                     "and a keyword counts as a question."}
       for name, level in _TEAM_LEVELS.items()},
    **{f"{name}-v1": {**level,
                      "tests": "Superseded (opener rule: a statement that starts with a question word "
                               "or an auxiliary, or an article-padded word list, names a withheld fact "
                               "and is answered; use v2). " + level["tests"]
                               + " A question counts only when it asks."}
       for name, level in _TEAM_LEVELS.items()},
    **{f"{name}-v2": {**level, "kwargs": {**level["kwargs"], "question_rule": "syntax"},
                      "tests": level["tests"] + " A question counts only when it is one by its syntax."}
       for name, level in _TEAM_LEVELS.items()},
}

#: Measured reference teams (benchmarks/results/team_references.json: 200 episodes, seeds 0-199):
#: policy -> (mean return, success rate).
_BASELINES: dict[str, dict[str, tuple[str, str]]] = {
    "team-facts-easy-v0": {
        "team-coordinated": ("1.000", "1.000"),
        "team-naive": ("-0.300", "0.000"),
        "team-random": ("-0.083", "0.000"),
    },
    "team-facts-hard-v0": {
        "team-coordinated": ("1.000", "1.000"),
        "team-naive": ("-0.600", "0.000"),
        "team-random": ("-0.071", "0.000"),
    },
    "team-facts-easy-v1": {
        "team-coordinated": ("1.000", "1.000"),
        "team-naive": ("-0.300", "0.000"),
        "team-random": ("-0.081", "0.000"),
    },
    "team-facts-hard-v1": {
        "team-coordinated": ("1.000", "1.000"),
        "team-naive": ("-0.600", "0.000"),
        "team-random": ("-0.071", "0.000"),
    },
    "team-facts-easy-v2": {
        "team-coordinated": ("1.000", "1.000"),
        "team-naive": ("-0.300", "0.000"),
        "team-random": ("-0.083", "0.000"),
    },
    "team-facts-hard-v2": {
        "team-coordinated": ("1.000", "1.000"),
        "team-naive": ("-0.600", "0.000"),
        "team-random": ("-0.071", "0.000"),
    },
}


def team_facts_card(env_id: str) -> EnvCard:
    """The :class:`~collab_env.registry.EnvCard` of one team-facts level."""
    level = TEAM_FACTS_LEVELS[env_id]
    n = level["kwargs"]["num_agents"]
    steps = level["kwargs"]["max_steps"]
    rounds = math.ceil(steps / 2)
    agents = [f"agent_{i}" for i in range(n)]
    lo_joint, lo_agent = -0.1 * n * rounds, -0.1 * rounds
    players = {a: ("trainable; the captain: the only agent whose \\boxed{N} answer counts" if a == CAPTAIN
                   else "trainable; asks the user and passes what it learns to the captain in TEAM: lines")
               for a in agents}
    legacy = env_id.endswith("-v0")
    opener = env_id.endswith("-v1")
    players[USER] = ("simulated (default TeamFactsUser, scripted): holds every fact and answers each "
                     "agent's question privately, one fact per question" + (
                         "; legacy keyword rule: any clause naming an object and a keyword counts as "
                         "a question, statements and keyword lists included (use v2)" if legacy else
                         "; superseded opener rule: a clause that starts with a question word, an "
                         "auxiliary or a request counts as a question, so a statement such as 'Which "
                         "means the total is the number of pizzas times ...' names a withheld fact and "
                         "is answered (use v2)" if opener else
                         "; a question counts only when it is one by its syntax (collab_env.tasks."
                         "questions, rule 'syntax': a wh-question with subject-auxiliary inversion, a "
                         "yes/no question, a request or an elliptical ?-question whose scope names the "
                         "object and the fact's keyword; the opening's words may be reused); a "
                         "statement, a relative or subordinate clause, a computation, a guess, the "
                         "opening copied back or a word list is a useless question (charged, answered "
                         "'Sorry, I don't know what you mean', never confirmed)"))
    sees = {a: ("its system prompt (protocol, team, captain), the opening request, its own messages, "
                "its teammates' questions and TEAM: notes, and the user's answers to it only; "
                "never the user's hidden facts, other agents' private answers or the answer")
            for a in agents}
    sees[USER] = ("its hidden goal (every fact), the opening request, each agent's question (the "
                  "message without its TEAM: lines) and its own replies; never team messages")
    baselines = {f"{p} x{n}": f"mean return {r}, success {s} (200 ep, seeds 0-199)"
                 for p, (r, s) in _BASELINES[env_id].items()}
    return EnvCard(
        tests=level["tests"],
        players=players,
        sees=sees,
        reward=(f"default: per agent round every player gets accuracy (1 when the captain's boxed "
                f"number equals the answer) - 0.1 x duplicate questions - 0.1 x useless questions "
                f"of that round (a guessed value is no answer: it is a useless question, charged; only "
                f"the captain's box is scored); user rounds 0; return = accuracy - 0.1 x (D + U) over the episode, "
                f"lowest when all {n} agents ask a useless question in each of the "
                f"{rounds} asking rounds. joint-shared / joint-per_agent / joint-difference: "
                f"JointReward(env, team_round_reward[_per_agent], mode) scores each agent round "
                f"alone (duplicates within the round only): shared = the round's team value; "
                f"per_agent = accuracy - the agent's own charge; difference = J - J(agent "
                f"silent), in [-0.1, 1] per round for the captain and [-0.1, 0] for a teammate. "
                f"mr and conversation are not defined for this env (no metric scores a team "
                f"transcript): the spec's weight question_cost is no registered metric, so "
                f"make(..., reward='mr' or 'conversation') raises ConfigError."),
        reward_range={"default": level["reward_range"], "joint-shared": (lo_joint, 1.0),
                      "joint-per_agent": (lo_agent, 1.0), "joint-difference": (lo_agent, 1.0)},
        limits=(f"max_steps {steps}: agent rounds, and a user round after every round with a "
                f"question; ends when the captain boxes an answer (terminated, 'answered') or at "
                f"max_steps (truncated)"),
        data=("generated from the seed by collab_env.tasks.team (scenarios party, trip, garden); "
              "unlimited items, offline, train/test streams disjoint"),
        licence="Apache-2.0 (generated by this package)",
        baselines=baselines,
        audit={"naive": dict.fromkeys(agents, "team-answer-at-once")},
        exploits=EXPLOIT_QUOTES.get(env_id, ""),
    )


__doc__ = (__doc__ or "") + cards_section({i: team_facts_card(i) for i in TEAM_FACTS_LEVELS}, "collab_env.tasks.team")

"""hidden-facts: the built-in collaboration suite, where asking is the only way to the answer.

The user wants one number (a total cost, a total weight, the sugar for a bake sale) but the
opening request withholds the quantities only the user knows. The user reveals a fact only when
the assistant asks a question for it (v1; a statement, a guess or a keyword list earns nothing);
the assistant answers with ``\\boxed{N}``, checked exactly. Items are
generated from a seed (unlimited, no download), so everything runs offline.

Players
    ``assistant`` (trained) and ``user`` (simulated; default policy :class:`HiddenFactsUser`).
Turn order
    The opening request is already in the transcript (written by the user); then assistant,
    user, assistant, ...
Observations
    The assistant sees its system prompt (the answer protocol) and the chat. The user also sees
    its hidden goal: the full problem and every fact, in a system message only it can see (with
    the structured facts in ``meta["hidden"]`` for scripted users). The answer reaches nobody.
Actions
    Message text.
Rewards
    When the assistant's message contains ``\\boxed{...}`` the episode terminates and both
    players get ``1.0`` if the boxed number equals the answer, else ``0.0``
    (component ``accuracy``), minus ``cost_per_turn`` for every assistant turn after the first.
    A message without a box that guesses a withheld value (v1, ``guess_is_wrong``) ends the
    episode as a wrong answer: accuracy 0, minus the same turn cost. Every other step gives 0.
Episode end
    Terminated: the assistant answered (``"answered"``), guessed a withheld value
    (``"guessed"``, v1) or the user sent the termination signal (``"user_terminated"``,
    reward 0). Truncated: ``max_steps`` (default 12: six assistant turns).
Arguments
    See :class:`HiddenFactsConfig`: ``num_objects``, ``vagueness`` (share of needed facts
    withheld), ``vague_objects`` (the opening does not even name the objects),
    ``num_distractors`` (irrelevant numbers in the opening), value ranges, ``split``,
    ``withhold`` (which kinds of fact may be withheld), ``unit_value`` (a fixed unit value),
    ``distractors_avoid_answer``, ``sensible_numbers`` (v2: the text reads as sense).
Levels
    ``hidden-facts-easy``, ``hidden-facts``, ``hidden-facts-hard`` (more objects, more withheld,
    unnamed objects), each at v0, v1, v2 and v3, and ``hidden-facts-copy`` (issue 26, v1 and v2;
    its text already reads as sense): the withheld fact *is* the answer (one object at 1 per unit,
    its count withheld, two distractor numbers that are never the answer), so a small model that
    cannot multiply succeeds exactly when it asks for the count and copies it into the box;
    answering at once is right only by a lucky guess (1 in 29).
    ``hidden-facts-choose`` (issue 45, v0; the syntax rule, text that reads as sense): the model
    must choose what to ask, with no arithmetic. One object; either its count is withheld (its
    unit value stated as 1) or its unit value is (its count stated as 1, "I need 1 apple."),
    drawn per item (``stated_one``), the withheld value from 2..30, two distractors that are
    never the answer. The answer is the one number the user reveals, but the question that gets
    it differs per item: "how many X?" is right on about half the items. Its splits
    (``split="train"``, ``"validation"``, ``"test"``; ``split_scenarios``) draw from disjoint
    scenarios (:data:`SPLIT_SCENARIOS`): train shopping/baking/shipping (dollars, grams,
    kilograms), validation knitting (meters of yarn), test gardening/printing (liters of water,
    sheets of paper), so no object, unit or phrasing of the test split occurs in training.
Metrics
    :func:`collaboration_stats` reports questions asked and facts obtained; the facts are the
    env's own record of what the user revealed (:func:`revealed_facts`, kept in the episode's
    state and reported as ``Episode.info["task"]["revealed"]``), in whatever words the user used.
Version history
    v3 (issue 43; ``hidden-facts``, ``-easy``, ``-hard``; ``hidden-facts-copy-v2``): v2's items
    (v1's for -copy) with the syntax rule (``user_rule="syntax"``,
    :mod:`collab_env.tasks.questions`): a fact is revealed only to a clause that is a question
    by its syntax. v1/v2's rule took any clause whose *first word* was a question word or an
    auxiliary for a request, so statements that start with one ("Which means the total is the
    number of apples times ...", "Would multiply ...", "When I have the number of apples ...",
    "Is simply ...") and article-padded word lists ("What of the the apples the number ...?")
    got a withheld fact in 42-45 of 45 episodes and, followed by the boxed total, scored 1.000
    (collab_env.exploits.policies.SlotStatement, PaddedList). It also refused some real questions
    that reuse the user's words ("How many boxes of books and vases do you have?"); v3 answers
    them. v1/v2 stay registered (superseded) for old results and keep failing the exploit audit.
    v2 (issue 27; ``hidden-facts``, ``-easy``, ``-hard``): the v1 user and rules with
    ``sensible_numbers=True``, a change of text only. v0/v1 items said a unit value of 1 in the
    plural ("Each apple costs 1 dollars.") and drew clock-time distractors from 2..59 ("The
    courier comes at 41 o'clock.", in about 20% of the items of hidden-facts, 40% of -hard); v2
    says "1 dollar" / "1 gram" / "1 kilogram" and draws clock hours from 2..12. Every item has
    the same scenario, objects, quantities, withheld facts, occasion, distractor sentences and
    answer as at v1 (the same draws); only the words of a stated 1 and the distractors' numbers
    differ. The task and its answers follow the same rules. v0/v1 items are unchanged (locked
    by hashes and by the leaderboard's recorded episodes).
    v1 (issue 23): the user reveals a fact only to a question for it
    (:mod:`collab_env.tasks.questions`: an interrogative clause or an explicit "tell me", in the
    assistant's own words, not a keyword dump, naming the object and the attribute, at most two
    objects per question; a question naming an object the user does not hold reveals nothing);
    a statement, a guess, the opening copied back or a keyword dump earns nothing; a message
    that guesses a withheld value ends the episode as a wrong answer (``"guessed"``, accuracy 0;
    :func:`guessed_facts`). The reference :class:`AskThenAnswer` asks the same questions and
    still scores 1.
    v0 (legacy; ``user_rule="keyword"``, ``guess_is_wrong=False``): initial release. The user
    revealed a fact to any clause naming its object and an attribute keyword, so a statement
    ("you would multiply the number of pancakes by the sugar per batch") or a keyword list got
    it; the only real-model learning result on v0 learned exactly that. Kept registered for
    old results.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from collab_env.env import CollabEnv, EpisodeState, Outcome, Start, Task, env_message
from collab_env.errors import ConfigError
from collab_env.policy import ScriptedPolicy
from collab_env.tasks import questions
from collab_env.tasks._common import build_config, split_env_kwargs
from collab_env.tasks.cards import docstring_cards
from collab_env.types import Conversation, Message

# The env cards: data in collab_env.tasks.cards (the registry's), text here for help() and pydoc.
__doc__ = (__doc__ or "") + docstring_cards(
    "hidden-facts-choose-v0",
    "hidden-facts-v3", "hidden-facts-easy-v3", "hidden-facts-hard-v3", "hidden-facts-copy-v2",
    "hidden-facts-v2", "hidden-facts-easy-v2", "hidden-facts-hard-v2",
    "hidden-facts-v1", "hidden-facts-easy-v1", "hidden-facts-hard-v1", "hidden-facts-copy-v1",
    "hidden-facts-v0", "hidden-facts-easy-v0", "hidden-facts-hard-v0",
)

__all__ = [
    "USER_RULES",
    "states_fact",
    "said_of",
    "sentences_of",
    "MAX_OBJECTS_PER_QUESTION",
    "guessed_facts",
    "HiddenFactsConfig",
    "HiddenFactsTask",
    "HiddenFactsUser",
    "AskThenAnswer",
    "AnswerAtOnce",
    "make_env",
    "extract_boxed",
    "visible_facts",
    "revealed_facts",
    "reworded",
    "ASK_PHRASINGS",
    "SPLIT_SCENARIOS",
    "collaboration_stats",
    "clause_rule",
    "TERMINATION_SIGNAL",
]

TERMINATION_SIGNAL = "[[TERMINATE CHAT]]"

#: The scripted user's reveal rules: ``"syntax"`` (v3; hidden-facts-copy v2), ``"question"``
#: (v1/v2: the first-word rule of issue 23, gameable by statements that start with a question
#: word) and ``"keyword"`` (legacy, v0).
USER_RULES = ("syntax", "question", "keyword")


def clause_rule(user_rule: str) -> str:
    """The :mod:`collab_env.tasks.questions` rule a user rule judges clauses by."""
    return questions.SYNTAX if user_rule == "syntax" else questions.OPENER

ASSISTANT_PROMPT = (
    "You are a helpful assistant. The user needs a number computed. Some information you need "
    "may be missing from their request: ask the user about anything you need to know. When you "
    "are sure, give the final number in \\boxed{}, for example \\boxed{42}."
)


# ---------------------------------------------------------------------------------------------
# Scenarios: the vocabulary a problem is generated from
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Attr:
    label: str  # what the fact is about, for the hidden goal text
    keywords: tuple[str, ...]  # words that, with the object, make a question about this fact
    say: str  # sentence stating the fact: {n}/{v}, {one}, {many}
    parse: str  # regex (with {one}/{many}) that reads the number back out of that sentence
    # (plural unit, singular unit) said of the value 1 (with unit_value or sensible_numbers)
    singular: tuple[str, str] = ("", "")
    # the sentence of a count of 1 ({one}: "I need 1 apple."), said only by a ``stated_one`` level
    say_one: str = ""


@dataclass(frozen=True)
class _Scenario:
    name: str
    objects: tuple[tuple[str, str], ...]  # (singular, plural)
    intro: str  # with {objects} and {occasion}
    vague: str  # the intro when objects are not named
    question: str
    count: _Attr
    unit: _Attr
    list_keywords: tuple[str, ...]  # asking which objects are involved
    list_say: str  # "It's {objects}."
    occasions: tuple[str, ...]
    distractors: tuple[str, ...]  # sentences with {d}: irrelevant numbers


_SCENARIOS: tuple[_Scenario, ...] = (
    _Scenario(
        name="shopping",
        objects=(("apple", "apples"), ("pear", "pears"), ("notebook", "notebooks"), ("candle", "candles"),
                 ("lemon", "lemons"), ("balloon", "balloons"), ("towel", "towels"), ("mug", "mugs")),
        intro="I'm buying {objects} for {occasion}.",
        vague="I'm buying a few things for {occasion}.",
        question="How much will it all cost, in dollars?",
        count=_Attr("how many {many} I need", ("how many", "number of", "quantity", "count"),
                    "I need {n} {many}.", r"I need (\d+) {many}\b", say_one="I need 1 {one}."),
        unit=_Attr("the price of one {one}", ("price", "cost", "how much", "each", "per"),
                   "Each {one} costs {v} dollars.", r"Each {one} costs (\d+) dollars?\b",
                   (" dollars.", " dollar.")),
        list_keywords=("what items", "which items", "what are you buying", "what things", "which things",
                       "what do you need to buy", "what exactly"),
        list_say="I'm buying {objects}.",
        occasions=("a birthday party", "the office", "a picnic", "my new flat", "a school fair"),
        distractors=("The shop is {d} minutes from my house.", "The party starts at {d} o'clock.",
                     "I already have {d} paper bags.", "My friend bought {d} cookies yesterday."),
    ),
    _Scenario(
        name="baking",
        objects=(("cookie", "cookies"), ("brownie", "brownies"), ("muffin", "muffins"), ("scone", "scones"),
                 ("pancake", "pancakes"), ("waffle", "waffles"), ("cupcake", "cupcakes")),
        intro="I'm baking {objects} for {occasion}.",
        vague="I'm baking a few different treats for {occasion}.",
        question="How many grams of sugar do I need in total?",
        count=_Attr("how many batches of {many} I make", ("how many", "batches", "number of", "batch count"),
                    "I'm making {n} batches of {many}.", r"making (\d+) batches of {many}\b",
                    say_one="I'm making 1 batch of {many}."),
        unit=_Attr("the sugar in one batch of {many}", ("sugar", "grams", "per batch", "each batch", "how much"),
                   "Each batch of {many} needs {v} grams of sugar.", r"batch of {many} needs (\d+) grams?\b",
                   (" grams of", " gram of")),
        list_keywords=("what are you baking", "which treats", "what treats", "what kind", "which kinds",
                       "what exactly", "which items"),
        list_say="I'm baking {objects}.",
        occasions=("a bake sale", "my sister's wedding", "the school fair", "a team breakfast"),
        distractors=("The oven runs at {d} degrees.", "The sale opens at {d} o'clock.",
                     "I have {d} baking trays.", "Last year we sold {d} pies."),
    ),
    _Scenario(
        name="shipping",
        objects=(("book", "books"), ("plate", "plates"), ("lamp", "lamps"), ("jar", "jars"),
                 ("shoe", "shoes"), ("toy", "toys"), ("vase", "vases")),
        intro="I'm shipping boxes of {objects} to {occasion}.",
        vague="I'm shipping some boxes to {occasion}.",
        question="What is the total weight, in kilograms?",
        count=_Attr("how many boxes of {many} I ship", ("how many", "number of", "boxes", "count"),
                    "I have {n} boxes of {many}.", r"I have (\d+) boxes of {many}\b",
                    say_one="I have 1 box of {many}."),
        unit=_Attr("the weight of one box of {many}", ("weigh", "weight", "heavy", "kg", "kilogram", "how much"),
                   "Each box of {many} weighs {v} kilograms.", r"box of {many} weighs (\d+) kilograms?\b",
                   (" kilograms.", " kilogram.")),
        list_keywords=("what is in", "what's in", "what are you shipping", "which items", "what items",
                       "what exactly", "contents"),
        list_say="The boxes hold {objects}.",
        occasions=("my cousin in Lyon", "a customer in Osaka", "our new office", "my grandmother"),
        distractors=("The courier comes at {d} o'clock.", "The tape roll is {d} meters long.",
                     "I shipped {d} parcels last month.", "The post office is {d} blocks away."),
    ),
)
_SCENARIO_BY_NAME = {s.name: s for s in _SCENARIOS}

#: Scenarios of the held-out splits of ``hidden-facts-choose`` (issue 45): their objects, units,
#: openings, attribute words and questions occur in no train scenario. The three scenarios above
#: stay the only vocabulary of the older levels (their users' notion of a foreign object).
_HELD_OUT_SCENARIOS: tuple[_Scenario, ...] = (
    _Scenario(
        name="knitting",
        objects=(("scarf", "scarves"), ("hat", "hats"), ("sweater", "sweaters"), ("blanket", "blankets"),
                 ("mitten", "mittens"), ("shawl", "shawls"), ("cardigan", "cardigans")),
        intro="I'm knitting {objects} for {occasion}.",
        vague="I'm knitting a few things for {occasion}.",
        question="How many meters of yarn do I need altogether?",
        count=_Attr("how many {many} I knit", ("how many", "number of"),
                    "I'm knitting {n} {many}.", r"knitting (\d+) {many}\b", say_one="I'm knitting 1 {one}."),
        unit=_Attr("the yarn one {one} takes", ("yarn", "meters", "metres", "how much", "each", "per"),
                   "Each {one} takes {v} meters of yarn.", r"Each {one} takes (\d+) meters? of yarn\b",
                   (" meters of", " meter of")),
        list_keywords=("what are you knitting", "which pieces", "what pieces", "what exactly", "which items"),
        list_say="I'm knitting {objects}.",
        occasions=("the winter market", "my nephews", "a charity drive", "the family reunion"),
        distractors=("My needles are {d} centimeters long.", "The market opens at {d} o'clock.",
                     "I own {d} knitting patterns.", "I bought {d} buttons last week."),
    ),
    _Scenario(
        name="gardening",
        objects=(("tulip", "tulips"), ("rose", "roses"), ("fern", "ferns"), ("orchid", "orchids"),
                 ("daisy", "daisies"), ("lily", "lilies"), ("cactus", "cacti")),
        intro="I'm watering rows of {objects} in {occasion}.",
        vague="I'm watering some rows of plants in {occasion}.",
        question="How many liters of water does that take in total?",
        count=_Attr("how many rows of {many} there are", ("how many", "rows", "number of"),
                    "There are {n} rows of {many}.", r"There are (\d+) rows of {many}\b",
                    say_one="There is 1 row of {many}."),
        unit=_Attr("the water one row of {many} needs", ("water", "liters", "litres", "how much", "each row",
                                                          "per row"),
                   "Each row of {many} needs {v} liters of water.", r"row of {many} needs (\d+) liters? of water\b",
                   (" liters of", " liter of")),
        list_keywords=("what are you watering", "which plants", "what plants", "what exactly", "what grows"),
        list_say="The rows are {objects}.",
        occasions=("the community garden", "my backyard", "the school greenhouse", "the park"),
        distractors=("The hose is {d} meters long.", "The garden opens at {d} o'clock.",
                     "I planted {d} trees last spring.", "The shed is {d} steps from the gate."),
    ),
    _Scenario(
        name="printing",
        objects=(("flyer", "flyers"), ("poster", "posters"), ("menu", "menus"), ("ticket", "tickets"),
                 ("brochure", "brochures"), ("booklet", "booklets"), ("leaflet", "leaflets")),
        intro="I'm printing copies of the {objects} for {occasion}.",
        vague="I'm printing a few documents for {occasion}.",
        question="How many sheets of paper will the printing use overall?",
        count=_Attr("how many copies of the {many} I print", ("how many", "copies", "number of"),
                    "I'm printing {n} copies of the {many}.", r"printing (\d+) copies of the {many}\b",
                    say_one="I'm printing 1 copy of the {many}."),
        unit=_Attr("the sheets one copy of the {many} uses", ("sheets", "paper", "pages", "how much", "each copy",
                                                              "per copy"),
                   "Each copy of the {many} uses {v} sheets of paper.",
                   r"copy of the {many} uses (\d+) sheets? of paper\b", (" sheets of", " sheet of")),
        list_keywords=("what are you printing", "which documents", "what documents", "what exactly", "which items"),
        list_say="I'm printing the {objects}.",
        occasions=("the town festival", "our open day", "a concert", "the library sale"),
        distractors=("The printer prints {d} pages a minute.", "The festival starts at {d} o'clock.",
                     "The shop is open {d} hours a week.", "The copy shop is {d} minutes away."),
    ),
)
_SCENARIO_BY_NAME.update({s.name: s for s in _HELD_OUT_SCENARIOS})
#: The scenarios of each split of a ``split_scenarios`` level (hidden-facts-choose): disjoint
#: scenarios, hence disjoint objects, units and phrasings.
SPLIT_SCENARIOS: dict[str, tuple[str, ...]] = {
    "train": ("shopping", "baking", "shipping"),
    "validation": ("knitting",),
    "test": ("gardening", "printing"),
}


def _join(words: Sequence[str]) -> str:
    words = list(words)
    if len(words) <= 1:
        return "".join(words)
    return ", ".join(words[:-1]) + " and " + words[-1]


_BOXED = re.compile(r"\\boxed\s*\{([^{}]*)\}")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def extract_boxed(text: str) -> float | None:
    """The number in the last ``\\boxed{...}`` of ``text`` (``$``, commas and units ignored),
    or ``None`` when there is no box or it holds no number."""
    boxes = _BOXED.findall(text)
    if not boxes:
        return None
    m = _NUMBER.search(boxes[-1].replace(",", ""))
    return float(m.group()) if m else None


# ---------------------------------------------------------------------------------------------
# Config and item generation
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class HiddenFactsConfig:
    """Difficulty knobs of the suite.

    Args:
        num_objects: Objects in a problem (each has a count and a unit value: 2 facts).
        vagueness: Share of the needed facts withheld from the opening (0: all stated, 1: none).
        vague_objects: The opening does not name the objects; the user says them when asked.
        num_distractors: Irrelevant numeric sentences in the opening.
        max_count: Counts are drawn from ``[2, max_count]``.
        max_unit: Unit values are drawn from ``[1, max_unit]``.
        scenarios: Scenario names to draw from (``shopping``, ``baking``, ``shipping``).
        split: ``"train"``, ``"validation"`` or ``"test"``: disjoint item streams from the same
            generator (with ``split_scenarios``, disjoint scenarios too).
        num_items: Make the suite finite (items ``0..num_items-1``); ``None`` for unlimited.
        cost_per_turn: Subtracted from the reward for every assistant turn after the first.
        assistant_system_prompt: The assistant's system prompt (``None`` for none).
        termination_signal: Text with which the user ends the chat.
        user_rule: How the scripted user decides what was asked for: ``"syntax"`` (v3: only a
            clause that is a question by its syntax, :mod:`collab_env.tasks.questions`'s
            syntax rule), ``"question"`` (v1/v2: a clause whose first word is interrogative,
            the superseded opener rule) or ``"keyword"`` (legacy v0: any clause naming the
            object and an attribute keyword).
            The env writes it into the user's hidden goal; :class:`HiddenFactsUser` follows it.
        guess_is_wrong: A message that states a value for a quantity the user never gave
            (:func:`guessed_facts`) ends the episode as a wrong answer (``"guessed"``,
            accuracy 0). Only with ``user_rule="syntax"`` or ``"question"``.
        withhold: The kinds of fact that may be withheld (``"count"``, ``"unit"``); the
            ``ceil(vagueness * facts)`` withheld facts are drawn among those of these kinds.
        unit_value: Every unit value is this number (stated in the singular: "Each apple
            costs 1 dollar."); ``None`` draws it from ``[1, max_unit]``. With ``unit_value=1``
            and only counts withheld, the answer is the withheld count itself
            (``hidden-facts-copy``).
        distractors_avoid_answer: Distractor numbers never equal the answer (nor a told value),
            so copying a number from the opening cannot be right by coincidence.
        sensible_numbers: The text reads as sense (issue 27; the v2 ids): a unit value of 1 is
            said in the singular at every level ("Each apple costs 1 dollar.", "needs 1 gram of
            sugar"; without it only a ``unit_value`` level does so), and a clock-time distractor
            is an hour of the clock, drawn from 2..12 (without it from 2..59: "The courier comes
            at 41 o'clock."). Counts are drawn from ``[2, max_count]``, so no count sentence says
            1. The draws of the problem (objects, counts, unit values, which facts are withheld,
            which distractors) are those of the same config without it, so the answers and the
            rules are unchanged; only the words of a stated 1 and the clock hours differ. Off by
            default: the items of the released v0/v1 ids are locked (their hashes, the
            leaderboard's recorded episodes), so the fix is a new version, not an edit.
        stated_one: One object, one fact withheld, the other stated as 1 (issue 45,
            ``hidden-facts-choose``): which fact is withheld (among ``withhold``) is drawn per
            item, and its value from ``[2, max_count]`` (a count) or ``[2, max_unit]`` (a unit
            value), so the answer is the one withheld number but the question that gets it
            differs per item. Needs ``num_objects=1``, ``vagueness=0.5``, no ``unit_value``.
        split_scenarios: The split also picks the scenarios (:data:`SPLIT_SCENARIOS`: train
            shopping/baking/shipping, validation knitting, test gardening/printing), so the
            splits share no scenario, object, unit or phrasing; ``scenarios`` must then be left
            at its default. Questions naming an object of any scenario are understood (a train
            object named on a test item is a foreign object).
    """

    num_objects: int = 2
    vagueness: float = 1.0
    vague_objects: bool = False
    num_distractors: int = 1
    max_count: int = 9
    max_unit: int = 12
    scenarios: tuple[str, ...] = ("shopping", "baking", "shipping")  # = _DEFAULT_SCENARIOS
    split: str = "train"
    num_items: int | None = None
    cost_per_turn: float = 0.0
    assistant_system_prompt: str | None = ASSISTANT_PROMPT
    termination_signal: str = TERMINATION_SIGNAL
    user_rule: str = "question"
    guess_is_wrong: bool = True
    withhold: tuple[str, ...] = ("count", "unit")
    unit_value: int | None = None
    distractors_avoid_answer: bool = False
    sensible_numbers: bool = False
    stated_one: bool = False
    split_scenarios: bool = False

    def __post_init__(self) -> None:
        if not 1 <= self.num_objects <= 4:
            raise ConfigError(f"num_objects must be in 1..4, got {self.num_objects}.")
        if not 0.0 <= self.vagueness <= 1.0:
            raise ConfigError(f"vagueness must be in [0, 1], got {self.vagueness}.")
        if not 0 <= self.num_distractors <= 4:
            raise ConfigError(f"num_distractors must be in 0..4, got {self.num_distractors}.")
        if self.max_count < 2 or self.max_unit < 1:
            raise ConfigError("max_count must be >= 2 and max_unit >= 1.")
        object.__setattr__(self, "scenarios", tuple(self.scenarios))
        for s in self.scenarios:
            if s not in _SCENARIO_BY_NAME:
                raise ConfigError(f"unknown scenario {s!r}; choose from {sorted(_SCENARIO_BY_NAME)}.")
        if not self.scenarios:
            raise ConfigError("scenarios must name at least one scenario.")
        if self.split not in _SPLIT_STREAM:
            raise ConfigError(f"split must be one of {tuple(_SPLIT_STREAM)}, got {self.split!r}.")
        if self.split_scenarios:
            if self.scenarios != _DEFAULT_SCENARIOS and self.scenarios not in SPLIT_SCENARIOS.values():
                raise ConfigError("with split_scenarios=True the split picks the scenarios "
                                  f"({SPLIT_SCENARIOS}); leave scenarios at its default.")
            object.__setattr__(self, "scenarios", SPLIT_SCENARIOS[self.split])
        if self.stated_one and (self.num_objects != 1 or abs(self.vagueness - 0.5) > 1e-9
                                or self.unit_value is not None):
            raise ConfigError("stated_one needs num_objects=1, vagueness=0.5 and unit_value=None (one "
                              f"fact withheld, the other stated as 1); got num_objects={self.num_objects}, "
                              f"vagueness={self.vagueness}, unit_value={self.unit_value!r}.")
        if self.num_items is not None and self.num_items < 1:
            raise ConfigError(f"num_items must be >= 1 or None, got {self.num_items}.")
        if self.cost_per_turn < 0:
            raise ConfigError(f"cost_per_turn must be >= 0, got {self.cost_per_turn}.")
        if not self.termination_signal:
            raise ConfigError("termination_signal must be a non-empty string.")
        if self.user_rule not in USER_RULES:
            raise ConfigError(f"user_rule must be one of {USER_RULES}, got {self.user_rule!r}.")
        object.__setattr__(self, "withhold", tuple(self.withhold))
        if not self.withhold or any(k not in ("count", "unit") for k in self.withhold) \
                or len(set(self.withhold)) != len(self.withhold):
            raise ConfigError(f"withhold must name 'count' and/or 'unit' once each, got {self.withhold!r}.")
        n_hidden = math.ceil(self.vagueness * 2 * self.num_objects - 1e-9)
        if n_hidden > len(self.withhold) * self.num_objects:
            raise ConfigError(
                f"vagueness {self.vagueness} withholds {n_hidden} of {2 * self.num_objects} facts, but "
                f"withhold={self.withhold!r} allows only {len(self.withhold) * self.num_objects}; lower "
                "vagueness or allow both kinds.")
        if self.unit_value is not None and (isinstance(self.unit_value, bool)
                                            or not isinstance(self.unit_value, int) or self.unit_value < 1):
            raise ConfigError(f"unit_value must be an int >= 1 or None, got {self.unit_value!r}.")
        if self.guess_is_wrong and self.user_rule == "keyword":
            raise ConfigError("guess_is_wrong needs user_rule='question' (the legacy keyword user "
                              "has no notion of a guess); pass guess_is_wrong=False.")


_SPLIT_STREAM = {"train": 0x7A11, "validation": 0x7A1D, "test": 0x7E57}
_DEFAULT_SCENARIOS = ("shopping", "baking", "shipping")


def _distractor_top(sentence: str) -> int:
    """The exclusive upper bound of a distractor's number: a clock time is an hour of the clock
    (2..12, never "41 o'clock"), any other number is drawn from 2..59."""
    return 13 if "o'clock" in sentence else 60


def generate_item(config: HiddenFactsConfig, index: int) -> dict[str, Any]:
    """The problem at ``index``: a pure function of the config and the index."""
    rng = np.random.default_rng([_SPLIT_STREAM[config.split], int(index)])
    sc = _SCENARIO_BY_NAME[config.scenarios[int(rng.integers(len(config.scenarios)))]]
    picks = rng.choice(len(sc.objects), size=config.num_objects, replace=False)
    objects = [sc.objects[int(i)] for i in sorted(picks)]
    facts: list[dict[str, Any]] = []
    chosen = None  # stated_one: the kind withheld
    for one, many in objects:
        n = int(rng.integers(2, config.max_count + 1))
        v = int(rng.integers(1, config.max_unit + 1))
        if config.unit_value is not None:
            v = config.unit_value
        if config.stated_one:  # one fact withheld, drawn from 2..max, the other stated as 1
            chosen = config.withhold[int(rng.integers(len(config.withhold)))]
            n, v = (int(rng.integers(2, config.max_count + 1)), 1) if chosen == "count" else \
                (1, int(rng.integers(2, config.max_unit + 1)))
        for kind, attr, value in (("count", sc.count, n), ("unit", sc.unit, v)):
            sentence = attr.say.format(n=value, v=value, one=one, many=many)
            if kind == "unit" and value == 1 and (config.unit_value is not None or config.sensible_numbers
                                                  or config.stated_one):
                sentence = sentence.replace(*attr.singular)  # "costs 1 dollar", not "1 dollars"
            if kind == "count" and value == 1:  # only a stated_one level states a count of 1
                sentence = attr.say_one.format(one=one, many=many)
            facts.append({
                "object": one,
                "plural": many,
                "kind": kind,
                "value": value,
                "label": attr.label.format(one=one, many=many),
                "sentence": sentence,
            })
    answer = sum(facts[2 * i]["value"] * facts[2 * i + 1]["value"] for i in range(len(objects)))
    n_hidden = math.ceil(config.vagueness * len(facts) - 1e-9)
    if chosen is not None:
        hidden = {0 if chosen == "count" else 1}
    elif set(config.withhold) == {"count", "unit"}:
        hidden = set(int(i) for i in rng.choice(len(facts), size=n_hidden, replace=False))
    else:  # draw among the facts of the kinds that may be withheld
        eligible = [i for i, f in enumerate(facts) if f["kind"] in config.withhold]
        hidden = set(eligible[int(i)] for i in rng.choice(len(eligible), size=n_hidden, replace=False))
    for i, f in enumerate(facts):
        f["hidden"] = i in hidden
    occasion = sc.occasions[int(rng.integers(len(sc.occasions)))]
    names = _join([many for _, many in objects])
    opening = [sc.vague.format(occasion=occasion) if config.vague_objects else
               sc.intro.format(objects=names, occasion=occasion)]
    opening += [f["sentence"] for f in facts if not f["hidden"]]
    dpick = rng.choice(len(sc.distractors), size=config.num_distractors, replace=False)
    if config.distractors_avoid_answer:
        # No distractor number equals the answer or a told value, none repeats, and a clock time
        # is an hour of the clock (2..12, never "41 o'clock").
        taken = {answer} | {f["value"] for f in facts}
        numbers = []
        for i in dpick:
            pool = [d for d in range(2, _distractor_top(sc.distractors[int(i)]))
                    if d not in taken and d not in numbers]
            numbers.append(int(pool[int(rng.integers(len(pool)))]))
    elif config.sensible_numbers:  # one draw per distractor, as below, with the clock rule
        numbers = [int(rng.integers(2, _distractor_top(sc.distractors[int(i)]))) for i in dpick]
    else:  # the released levels' draws (locked): a clock time may be "41 o'clock"
        numbers = [int(rng.integers(2, 60)) for _ in dpick]
    distractors = [sc.distractors[int(i)].format(d=d) for i, d in zip(dpick, numbers, strict=True)]
    opening += distractors
    opening.append(sc.question)
    full = [sc.intro.format(objects=names, occasion=occasion)] + [f["sentence"] for f in facts]
    return {
        "index": int(index),
        "scenario": sc.name,
        "objects": [one for one, _ in objects],
        "plurals": [many for _, many in objects],
        "objects_named": not config.vague_objects,
        "facts": facts,
        "distractors": distractors,
        "opening": " ".join(opening),
        "question": sc.question,
        "single_turn_prompt": " ".join(full + [sc.question]),
        "answer": answer,
    }


# ---------------------------------------------------------------------------------------------
# The task
# ---------------------------------------------------------------------------------------------
class HiddenFactsTask(Task):
    """The hidden-facts rules; see the module docstring."""

    players = ("assistant", "user")
    user_players = ("user",)
    turn_order = (("assistant",), ("user",))
    default_max_steps = 12

    def __init__(self, config: HiddenFactsConfig) -> None:
        self.config = config

    def num_items(self) -> int | None:
        return self.config.num_items

    def get_item(self, index: int) -> Mapping[str, Any]:
        return generate_item(self.config, index)

    def start(self, state: EpisodeState, options: Mapping[str, Any]) -> Start:
        item, cfg = state.item, self.config
        messages = []
        if cfg.assistant_system_prompt:
            messages.append(env_message(cfg.assistant_system_prompt, role="system", audience=("assistant",)))
        sc = _SCENARIO_BY_NAME[item["scenario"]]
        facts = "\n".join(f"- {f['sentence']}" for f in item["facts"])
        goal = (
            "You are a user chatting with an AI assistant. You want this answered: "
            f"{item['single_turn_prompt']}\n"
            f"Your first message only said: {item['opening']!r}. You know these facts:\n{facts}\n"
            "Reveal a fact only when the assistant asks about it. When the assistant gives a final "
            f"answer, or you want to stop, end your message with {cfg.termination_signal}."
        )
        hidden = {
            "scenario": item["scenario"],
            "facts": [{k: f[k] for k in ("object", "plural", "kind", "value", "sentence")} for f in item["facts"]],
            "objects": item["objects"],
            "plurals": item["plurals"],
            "objects_named": item["objects_named"],
            "list_sentence": sc.list_say.format(objects=_join(item["plurals"])),
            "distractors": item["distractors"],
            "termination_signal": cfg.termination_signal,
            "user_rule": cfg.user_rule,
            **({"all_scenarios": True} if cfg.split_scenarios else {}),
        }
        messages.append(env_message(goal, role="system", audience=("user",), meta={"hidden": hidden}))
        # The opening request is the user's line, written from the item (not by a policy).
        messages.append(Message(role="user", content=item["opening"], author="user", trainable=False))
        return Start(messages=messages, on_turn=("assistant",))

    def step(self, state: EpisodeState, moves: Mapping[str, str], final: bool) -> Outcome:
        cfg = self.config
        if "user" in moves:  # what the user revealed, kept in the state (episode_info reports it)
            told = state.data.setdefault("revealed", [])
            for key in revealed_facts(state.item, moves["user"]):
                if list(key) not in told:
                    told.append(list(key))
        if "assistant" in moves:
            guess = extract_boxed(moves["assistant"])
            if guess is not None:
                correct = float(guess == state.item["answer"])
                penalty = cfg.cost_per_turn * (state.moves["assistant"] - 1)
                r = correct - penalty
                comp = {"accuracy": correct, "turn_cost": -penalty}
                return Outcome(
                    rewards={"assistant": r, "user": r},
                    components={"assistant": comp, "user": comp},
                    terminated=True,
                    reason="answered",
                )
            if cfg.guess_is_wrong and guessed_facts(state.item, moves["assistant"], _user_texts(state.messages),
                                                    rule=clause_rule(cfg.user_rule)):
                penalty = cfg.cost_per_turn * (state.moves["assistant"] - 1)
                comp = {"accuracy": 0.0, "turn_cost": -penalty}
                return Outcome(
                    rewards={"assistant": -penalty, "user": -penalty},
                    components={"assistant": comp, "user": comp},
                    terminated=True,
                    reason="guessed",
                )
        if "user" in moves and cfg.termination_signal in moves["user"]:
            comp = {"accuracy": 0.0, "turn_cost": 0.0}
            return Outcome(components={"assistant": comp, "user": comp}, terminated=True,
                           reason="user_terminated")
        if final:
            comp = {"accuracy": 0.0, "turn_cost": 0.0}
            return Outcome(components={"assistant": comp, "user": comp})
        return Outcome()


    def episode_info(self, state: EpisodeState) -> dict[str, Any]:
        """``revealed``: the withheld facts the user's replies stated, as ``[object, kind]`` pairs in
        the order told (:func:`revealed_facts`), and ``withheld``: how many the opening withheld."""
        return {"revealed": [list(k) for k in state.data.get("revealed", [])],
                "withheld": sum(1 for f in state.item["facts"] if f["hidden"])}


def make_env(**kwargs: Any) -> CollabEnv:
    """Entry point of the ``hidden-facts*`` ids: :class:`HiddenFactsConfig` keywords plus
    ``max_steps``, ``max_message_chars``, ``max_total_chars``, ``render_mode``."""
    env_kw, task_kw = split_env_kwargs(dict(kwargs))
    config = build_config(HiddenFactsConfig, task_kw, where="hidden-facts")
    return CollabEnv(HiddenFactsTask(config), **env_kw)


# ---------------------------------------------------------------------------------------------
# Policies: the scripted user and two reference assistants
# ---------------------------------------------------------------------------------------------
def _hidden_of(observation: Conversation) -> Mapping[str, Any]:
    for m in observation:
        if m.role == "system" and "hidden" in m.meta:
            return m.meta["hidden"]
    raise ConfigError(
        "HiddenFactsUser needs the user's observation of a hidden-facts env (its hidden system "
        "message was not found); use it only as the 'user' player of hidden-facts."
    )


def _clauses(text: str) -> list[str]:
    return [c.strip().lower() for c in re.split(r"[?.!;\n]+", text) if c.strip()]


def _mentions(clause: str, word: str) -> bool:
    return re.search(r"\b" + re.escape(word.lower()) + r"\b", clause) is not None


def _user_texts(messages: Sequence[Message]) -> list[str]:
    """What the user has said (its opening and replies): the words that are not the assistant's
    own, and the values that count as told."""
    return [m.content for m in messages if m.author == "user" and m.role != "system"]


#: A question may target the quantities of at most this many objects (both attributes each).
MAX_OBJECTS_PER_QUESTION = 2


def _vocabulary(hidden: Mapping[str, Any]) -> tuple[_Scenario, ...]:
    """The scenarios whose objects the user recognises: every scenario on a ``split_scenarios``
    level (a train object named on a test item is foreign), the three train scenarios on the
    older levels (their users' behaviour is locked)."""
    return _SCENARIOS + _HELD_OUT_SCENARIOS if hidden.get("all_scenarios") else _SCENARIOS


def _objects_named(clause: questions.Clause, scenarios: Sequence[_Scenario] = _SCENARIOS) -> set[str]:
    """The singular forms of the objects (of ``scenarios``) a clause names in its own words."""
    out = set()
    for sc in scenarios:
        for one, many in sc.objects:
            if clause.names(one) or clause.names(many):
                out.add(one)
    return out


def _told_numbers(user_texts: Sequence[str]) -> set[int]:
    told = set()
    for t in user_texts:
        told |= questions.numbers_in(t)
    # A product of told values (a line of the sum) is arithmetic, no guess.
    return told | {a * b for a in told for b in told}


def _withheld(facts: Sequence[Mapping[str, Any]], user_texts: Sequence[str]) -> list[Mapping[str, Any]]:
    said = " ".join(user_texts)
    return [f for f in facts if f["sentence"] not in said]


def guessed_facts(item: Mapping[str, Any], text: str, user_texts: Sequence[str],
                  rule: str = questions.OPENER) -> list[tuple[str, str]]:
    """The withheld quantities an assistant message states a value for (a guess).

    A clause that does not ask (:attr:`collab_env.tasks.questions.Clause.asks` is false) guesses
    the quantity ``(object, kind)`` when the quantity is withheld (its sentence is in no user
    message), the clause names the object in its own words and holds a number (digits or two..
    twenty; never 1) that the user has not said (nor a product of two told values), and either
    that number stands within three words before the object's name ("let's say 4 apples": the
    count) or the clause names a keyword of the quantity ("I assume
    apples cost $3": the unit value). A boxed answer is the task's business, not a guess.

    Args:
        item: A hidden-facts item (``facts``, ``scenario``).
        text: The assistant's message.
        user_texts: The user's messages so far (the opening included).
        rule: The :mod:`collab_env.tasks.questions` rule that decides which clauses ask
            (``"opener"`` at v1/v2, ``"syntax"`` at v3).
    """
    if _BOXED.search(text):
        return []
    sc = _SCENARIO_BY_NAME[item["scenario"]]
    told = _told_numbers(user_texts)
    withheld = {(f["object"], f["kind"]): f for f in _withheld(item["facts"], user_texts)}
    out: list[tuple[str, str]] = []
    for c in questions.parse(text, quoted=user_texts, rule=rule):
        if c.asks:
            continue
        nums = [(i, questions.numbers_in(w)) for i, w in enumerate(c.words) if c.own[i]]
        untold = [(i, n) for i, ns in nums for n in ns if n not in told]
        if not untold:
            continue
        for f in item["facts"]:
            key = (f["object"], f["kind"])
            if key not in withheld or key in out:
                continue
            names = [i for i, w in enumerate(c.words)
                     if c.own[i] and w in (f["object"], f["plural"])]
            if not names:
                continue
            attr = sc.count if f["kind"] == "count" else sc.unit
            near = any(0 < j - i <= 3 for i, _ in untold for j in names)
            if (f["kind"] == "count" and near) or (f["kind"] == "unit" and c.names_any(attr.keywords)
                                                   and not near):
                out.append(key)
    return out


_SENTENCE_BREAK = re.compile(r"(?<=[.!?;])\s+|\n+")


def sentences_of(text: str) -> list[str]:
    """The sentences of a message (split after ``.``, ``!``, ``?``, ``;`` and at line breaks)."""
    return [c for c in _SENTENCE_BREAK.split(text) if c.strip()]


def said_of(fact: Mapping[str, Any], text: str, *, single: bool = False) -> set[int]:
    """The numbers a message says of ``fact``'s object: those of its sentences that name the
    object (singular or plural), or of every sentence when the item has one object
    (``single``). Numbers: digits, or a word two..twenty
    (:func:`collab_env.tasks.questions.numbers_in`; a value of 1 only as the digit)."""
    out: set[int] = set()
    for c in sentences_of(text):
        words = questions.words_of(c)
        if single or fact["object"] in words or fact["plural"] in words:
            out |= questions.numbers_in(c, digit_one=True)
    return out


def states_fact(fact: Mapping[str, Any], text: str, *, single: bool = False,
                distractors: Sequence[str] = ()) -> bool:
    """Whether a user message states ``fact`` (``object``, ``plural``, ``value``, ``sentence``),
    whatever its words: it holds the fact's sentence, or a sentence of it says the value of the
    fact's object (:func:`said_of`); the item's ``distractors`` (sentences whose numbers answer
    nothing) are left out first."""
    for d in distractors:
        text = text.replace(d, " ")
    return fact["sentence"] in text or int(fact["value"]) in said_of(fact, text, single=single)


def revealed_facts(item: Mapping[str, Any], text: str) -> list[tuple[str, str]]:
    """The withheld quantities a user message states, whatever its words (the env's record of
    what the user revealed, :meth:`HiddenFactsTask.episode_info`; issue 45): each withheld fact
    ``(object, kind)`` for which :func:`states_fact` holds, the item's distractors left out and an
    item of one object needing no name. So a user that rewords its replies ("As for the price of
    one apple: 3.", "Three of them, I think") reveals as much as the scripted one, and a number
    that answers nothing (a distractor) reveals nothing. The user-fidelity card
    (:mod:`collab_env.eval.check_user`) reads what a simulator stated by the same rule.
    """
    single = len(item.get("objects", ())) == 1
    distractors = item.get("distractors", ())
    return [(f["object"], f["kind"]) for f in item["facts"]
            if f.get("hidden") and states_fact(f, text, single=single, distractors=distractors)]


class HiddenFactsUser(ScriptedPolicy):
    """The scripted user of hidden-facts (deterministic under a seed).

    It reads its hidden facts, and the env's reveal rule (``user_rule``), from its own
    observation.

    Rule ``"syntax"`` (v3; hidden-facts-copy v2). Only clauses that are questions by their
    syntax count (:mod:`collab_env.tasks.questions`, ``rule="syntax"``: a wh-question with
    subject-auxiliary inversion, a yes/no question, a request, an elliptical ``?``-question;
    never a statement, a relative or subordinate clause or a word list), and only the words of
    the question's scope name anything; the user's own words reused in a real question count.
    The rest is as for ``"question"``.

    Rule ``"question"`` (v1/v2, superseded). Only clauses that *ask* count
    (:mod:`collab_env.tasks.questions`, ``rule="opener"``: a clause whose first word is
    interrogative or an explicit request, in the assistant's own words, not a keyword dump). A
    fact is revealed when one asking clause names its object (singular or plural) and a keyword
    of its attribute; a clause naming more than :data:`MAX_OBJECTS_PER_QUESTION` objects asks for
    none. The objects are named in reply to an asking clause with a list keyword ("which items
    ...?"). A message whose asking clauses name an object the user does not hold is a guess at
    the objects: the user says so and reveals nothing. A guess at a withheld value
    (:func:`guessed_facts`) is never confirmed ("I haven't told you that"); with
    ``guess_is_wrong`` the env has already ended the episode as a wrong answer.

    Rule ``"keyword"`` (legacy, v0 ids): a fact is revealed whenever one clause mentions its
    object and an attribute keyword, whatever the clause says.

    Either way: once the assistant gives a boxed answer, or after ``patience`` replies that
    revealed nothing, it ends the chat with the termination signal. Otherwise it nudges the
    assistant, sometimes (``chattiness``) adding a distractor.

    Args:
        patience: Unhelpful assistant turns tolerated before the user gives up.
        chattiness: Probability of adding an irrelevant sentence to a reply.
        paraphrase: State a fact in other words than the item's sentence (:func:`reworded`:
            "As for the price of one apple: 3."), the rules unchanged: a user whose replies a
            policy or a metric cannot match by the sentence (issue 45's paraphrasing user).
    """

    name = "hidden-facts-user"

    def __init__(self, patience: int = 3, chattiness: float = 0.0, paraphrase: bool = False) -> None:
        if patience < 1:
            raise ConfigError(f"patience must be >= 1, got {patience}.")
        if not 0.0 <= chattiness <= 1.0:
            raise ConfigError(f"chattiness must be in [0, 1], got {chattiness}.")
        self.patience = patience
        self.chattiness = chattiness
        self.paraphrase = bool(paraphrase)

    def respond(self, observation: Conversation, rng: np.random.Generator) -> str:
        hidden = _hidden_of(observation)
        signal = hidden["termination_signal"]
        said = " ".join(m.content for m in observation if m.author == "user")
        last = observation.last(role="user")  # in the user's view, the assistant speaks as "user"
        asked = last.content if last is not None and last.author != "user" else ""
        if _BOXED.search(asked):
            return f"Thanks, that's what I needed. {signal}"
        if hidden.get("user_rule", "question") == "keyword":
            reply = self._keyword_reveal(hidden, asked, said)
        else:
            reply = self._question_reveal(hidden, asked, _user_texts(list(observation)),
                                          clause_rule(hidden.get("user_rule", "question")))
        if reply and not reply[0].startswith(_UNHELPFUL):
            if self.paraphrase:
                by_sentence = {f["sentence"]: f for f in hidden["facts"]}
                reply = [reworded(hidden["scenario"], by_sentence[r]) if r in by_sentence else r for r in reply]
            if self.chattiness and rng.random() < self.chattiness and hidden["distractors"]:
                reply.append(hidden["distractors"][int(rng.integers(len(hidden["distractors"])))])
            return " ".join(reply)
        # Count earlier nudges from the transcript itself: the user keeps no state of its own.
        unhelpful = sum(1 for m in observation if m.author == "user" and m.content.startswith(_UNHELPFUL))
        if unhelpful + 1 >= self.patience:
            return f"I don't think we're getting anywhere. {signal}"
        if reply:  # a guess or a foreign object: said so, and it counts as unhelpful
            return " ".join(reply)
        return _NUDGES[int(rng.integers(len(_NUDGES)))] + " Can you work it out for me?"

    @staticmethod
    def _keyword_reveal(hidden: Mapping[str, Any], asked: str, said: str) -> list[str]:
        reply = []
        clauses = _clauses(asked)
        names_known = hidden["objects_named"] or hidden["list_sentence"] in said
        if not names_known and any(any(k in c for k in _list_keywords(hidden)) for c in clauses):
            reply.append(hidden["list_sentence"])
        for f in hidden["facts"]:
            if f["sentence"] in said:
                continue
            if any(
                (_mentions(c, f["object"]) or _mentions(c, f["plural"]))
                and any(k in c for k in _attr_keywords(hidden["scenario"], f["kind"]))
                for c in clauses
            ):
                reply.append(f["sentence"])
        return reply

    @staticmethod
    def _question_reveal(hidden: Mapping[str, Any], asked: str, user_texts: Sequence[str],
                         rule: str) -> list[str]:
        said = " ".join(user_texts)
        asking = questions.request_clauses(asked, quoted=user_texts, rule=rule)
        mine = set(hidden["objects"])
        vocabulary = _vocabulary(hidden)
        foreign = sorted({o for c in asking for o in _objects_named(c, vocabulary)} - mine)
        if foreign:
            many = {one: m for sc in vocabulary for one, m in sc.objects}
            return [_NOT_MINE.format(objects=_join([many[o] for o in foreign]))]
        reply = []
        names_known = hidden["objects_named"] or hidden["list_sentence"] in said
        if not names_known and any(c.names_any(_list_keywords(hidden)) for c in asking):
            reply.append(hidden["list_sentence"])
        targets = set()
        for c in asking:
            objs = _objects_named(c, vocabulary)
            if len(objs) > MAX_OBJECTS_PER_QUESTION:
                continue
            for one in objs:
                for kind in ("count", "unit"):
                    if c.names_any(_attr_keywords(hidden["scenario"], kind)):
                        targets.add((one, kind))
        for f in hidden["facts"]:
            if not _said(hidden, f, said) and (f["object"], f["kind"]) in targets:
                reply.append(f["sentence"])
        if not reply:
            item = {"scenario": hidden["scenario"], "facts": hidden["facts"]}
            if guessed_facts(item, asked, user_texts, rule=rule):
                return [_NOT_TOLD]
        return reply


def reworded(scenario: str, fact: Mapping[str, Any]) -> str:
    """A fact in other words than its sentence (what :class:`HiddenFactsUser` says with
    ``paraphrase=True``): ``"As for <the fact's label>: <value>."``."""
    sc = _SCENARIO_BY_NAME[scenario]
    attr = sc.count if fact["kind"] == "count" else sc.unit
    return f"As for {attr.label.format(one=fact['object'], many=fact['plural'])}: {fact['value']}."


def _said(hidden: Mapping[str, Any], fact: Mapping[str, Any], said: str) -> bool:
    """Whether the user has stated ``fact`` (its sentence, or its reworded form)."""
    return fact["sentence"] in said or reworded(hidden["scenario"], fact) in said


_NOT_TOLD = "Hmm, I haven't told you that, and I won't confirm a guess."
_NOT_MINE = "Hmm, there are no {objects} in this."
_NUDGES = (
    "Hmm, I'm not sure what you mean.",
    "I just want the number, please.",
    "Sorry, I don't follow.",
)
# Replies that revealed nothing (they count against ``patience``).
_UNHELPFUL = _NUDGES + ("Hmm, I haven't told you that", "Hmm, there are no ")


def _attr_keywords(scenario: str, kind: str) -> tuple[str, ...]:
    sc = _SCENARIO_BY_NAME[scenario]
    return (sc.count if kind == "count" else sc.unit).keywords


def _list_keywords(hidden: Mapping[str, Any]) -> tuple[str, ...]:
    return _SCENARIO_BY_NAME[hidden["scenario"]].list_keywords


class _ReadsFacts(ScriptedPolicy):
    """Shared parsing for the reference assistants: which scenario, which objects, which values
    are already known, read from the visible chat only (never from hidden data)."""

    def _state(self, observation: Conversation):
        chat = " ".join(m.content for m in observation if m.role != "system" and m.author == "user")
        for sc in _SCENARIOS + _HELD_OUT_SCENARIOS:
            if sc.question in chat:
                break
        else:
            return None, [], {}, chat
        objs = [(one, many) for one, many in sc.objects if re.search(r"\b" + many + r"\b", chat)]
        known = {}
        for one, many in objs:
            for kind, attr in (("count", sc.count), ("unit", sc.unit)):
                m = re.search(attr.parse.format(one=re.escape(one), many=re.escape(many)), chat)
                if m:
                    known[(one, kind)] = int(m.group(1))
                elif attr.say_one and attr.say_one.format(one=one, many=many) in chat:
                    known[(one, kind)] = 1
        return sc, objs, known, chat


class AskThenAnswer(_ReadsFacts):
    """Reference assistant: asks for every missing quantity, then answers exactly.

    It first asks which objects are involved if the opening does not name them, then asks about
    every unknown count and unit value in one message, then computes the total and boxes it.

    Args:
        varied: Word each question, and the sentence before it, in one of several phrasings
            (:data:`ASK_PHRASINGS`, drawn with the reply's seed), as SFT data should (issue 45);
            by default always the first one.
    """

    name = "ask-then-answer"
    varied = False

    def __init__(self, varied: bool = False) -> None:
        self.varied = bool(varied)

    def respond(self, observation: Conversation, rng: np.random.Generator) -> str:
        sc, objs, known, _ = self._state(observation)
        if sc is None:
            return "Could you tell me exactly what you need me to compute?"
        if not objs:
            return "Happy to help. Which items exactly are involved?"

        def pick(options: Sequence[str]) -> str:
            return options[int(rng.integers(len(options)))] if self.varied else options[0]

        questions = []
        for one, many in objs:
            for kind in ("count", "unit"):
                if (one, kind) not in known:
                    questions.append(pick(ASK_PHRASINGS[sc.name][kind]).format(one=one, many=many))
        if questions:
            return pick(_PREFACES) + " " + " ".join(questions)
        total = sum(known[(one, "count")] * known[(one, "unit")] for one, _ in objs)
        return f"Thanks! The total is \\boxed{{{total}}}."


#: The reference questions, per scenario and kind, in several phrasings (the first is the one
#: :class:`AskThenAnswer` asks by default, and :func:`visible_facts` names); every one is a
#: question the scripted user answers (tests/tasks/test_hidden_facts_choose.py).
ASK_PHRASINGS: dict[str, dict[str, tuple[str, ...]]] = {
    "shopping": {"count": ("How many {many} do you need?", "How many {many} are you buying?",
                           "Could you tell me how many {many} you need?"),
                 "unit": ("What is the price of one {one}?", "How much does one {one} cost?",
                          "Could you tell me the price of each {one}?")},
    "baking": {"count": ("How many batches of {many} are you making?", "How many batches of {many} will you bake?",
                         "Can you tell me the number of batches of {many}?"),
               "unit": ("How many grams of sugar does each batch of {many} need?",
                        "How much sugar goes into one batch of {many}?",
                        "Could you tell me the grams of sugar per batch of {many}?")},
    "shipping": {"count": ("How many boxes of {many} do you have?", "How many boxes of {many} are you shipping?",
                           "Could you tell me the number of boxes of {many}?"),
                 "unit": ("How much does each box of {many} weigh?", "What is the weight of one box of {many}?",
                          "How heavy is a box of {many}?")},
    "knitting": {"count": ("How many {many} are you knitting?", "Could you tell me how many {many} you will knit?",
                           "What number of {many} do you plan to knit?"),
                 "unit": ("How many meters of yarn does each {one} take?", "How much yarn goes into one {one}?",
                          "Could you tell me the meters of yarn per {one}?")},
    "gardening": {"count": ("How many rows of {many} are there?", "How many rows of {many} do you water?",
                            "Could you tell me the number of rows of {many}?"),
                  "unit": ("How many liters of water does each row of {many} need?",
                           "How much water does one row of {many} take?",
                           "Could you tell me the liters of water per row of {many}?")},
    "printing": {"count": ("How many copies of the {many} are you printing?",
                           "How many copies of the {many} do you need?",
                           "Could you tell me the number of copies of the {many}?"),
                 "unit": ("How many sheets of paper does each copy of the {many} use?",
                          "How much paper does one copy of the {many} take?",
                          "Could you tell me the sheets of paper per copy of the {many}?")},
}
_ASK = {name: {kind: p[0] for kind, p in kinds.items()} for name, kinds in ASK_PHRASINGS.items()}
_PREFACES = ("Before I compute the total, I need a few details.", "I can work that out once I know a bit more.",
             "Let me check one thing first.")


def visible_facts(observation: Conversation) -> dict[str, Any] | None:
    """What the assistant has been told so far, read from its visible chat only (never from
    hidden data), as the reference assistants read it.

    Returns:
        ``None`` when the chat holds no hidden-facts question; else a dict with ``scenario``,
        ``objects`` (the plurals named so far), ``known`` (``(object, kind) -> value``),
        ``missing`` (``(object, kind, question)`` for every quantity of a named object not told
        yet, in problem order; the question is the one :class:`AskThenAnswer` asks) and
        ``total`` (the answer from what is known, taking 1 for every missing quantity, as
        :class:`AnswerAtOnce` does).
    """
    sc, objs, known, _ = _ReadsFacts()._state(observation)
    if sc is None:
        return None
    missing = [(one, kind, _ASK[sc.name][kind].format(one=one, many=many))
               for one, many in objs for kind in ("count", "unit") if (one, kind) not in known]
    total = sum(known.get((one, "count"), 1) * known.get((one, "unit"), 1) for one, _ in objs)
    return {"scenario": sc.name, "objects": [many for _, many in objs], "known": dict(known),
            "missing": missing, "total": total}


class AnswerAtOnce(_ReadsFacts):
    """Reference assistant that never asks: it answers from the opening alone, taking 1 for
    every quantity it was not told (the passive-responder baseline)."""

    name = "answer-at-once"

    def respond(self, observation: Conversation, rng: np.random.Generator) -> str:
        sc, objs, known, _ = self._state(observation)
        total = sum(known.get((one, "count"), 1) * known.get((one, "unit"), 1) for one, _ in objs)
        return f"The total is \\boxed{{{total}}}."


def collaboration_stats(conversation: Conversation, item: Mapping[str, Any],
                        rule: str = questions.OPENER,
                        revealed: Sequence[Sequence[str]] | None = None) -> dict[str, float]:
    """What an episode shows of collaboration, read from its transcript (a report, not a reward).

    Returns:
        ``questions``: assistant messages that ask (at least one request clause in the
        assistant's own words, :func:`collab_env.tasks.questions.request_clauses`, the rule the
        scripted user follows) and give no boxed answer; a ``?`` alone, the opening pasted
        back or a keyword dump is no question.
        ``facts``: the share of the facts the opening withheld that the user revealed: the
        env's record (``revealed``: ``Episode.info["task"]["revealed"]``,
        :meth:`HiddenFactsTask.episode_info`) when given, else the same rule
        (:func:`revealed_facts`) applied to the user's replies; in any words, so a paraphrasing
        user's facts count (0.0 for an item that withholds none).
        ``answered``: 1.0 when an assistant message holds a boxed number, else 0.0.

    ``rule``: the :mod:`collab_env.tasks.questions` rule that counts a question (``"opener"``,
    the v1/v2 user's, by default; ``"syntax"`` for v3).
    """
    user_texts: list[str] = []
    asked = answered = 0
    told: set[tuple[str, str]] = set()
    for m in conversation:
        if m.role == "system":
            continue
        if m.author == "user":
            user_texts.append(m.content)
            if len(user_texts) > 1 and revealed is None:
                told.update(revealed_facts(item, m.content))
        elif m.role == "assistant" or m.author == "assistant":
            if extract_boxed(m.content) is not None:
                answered = 1
            elif questions.request_clauses(m.content, quoted=user_texts, rule=rule):
                asked += 1
    if revealed is not None:
        told = {(str(o), str(k)) for o, k in revealed}
    hidden = [(f["object"], f["kind"]) for f in item.get("facts", ()) if f.get("hidden")]
    facts = sum(1 for h in hidden if h in told) / len(hidden) if hidden else 0.0
    return {"questions": float(asked), "facts": float(facts), "answered": float(answered)}

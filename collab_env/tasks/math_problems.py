"""Procedural maths word problems for ``math-chat``: pure, seedable, checked by rule.

Each problem is a short story of fact sentences followed by one question sentence, with an
integer answer computed from the same numbers, e.g.::

    Maya buys 4 notebooks. Each notebook costs 3 dollars. She also buys a pen for 2 dollars.
    She pays with a 20-dollar bill. How much change does Maya get?      (answer: 6)

:func:`math_problem` is a pure function of ``(seed, index)``: it draws only from
``random.Random(...).random()``, the one stream Python guarantees to stay the same across
versions, so a problem never changes with the interpreter or with numpy. The answer is an
integer, unique, and the sentences state every number it needs (the question names none).

Why not ``reasoning-gym`` (0.1.25, on the package index, checked on this project's machines):
its generators (``basic_arithmetic``, ``chain_sum``, ``gsm_symbolic``...) are seedable and run
offline, but the package pulls eleven dependencies (one, ``pycosat``, is a C extension that only
ships as source and needs a compiler at install; ``cellpylib`` brings matplotlib), 45 MB in all,
and ``import reasoning_gym`` imports every one of its generators (2.5 s, matplotlib included).
Its ``gsm_symbolic`` scorer also gives 0.01 to any wrong number, where this suite checks exactly.
A stdlib generator keeps ``math-chat`` in the core install, fast and exact.

Kinds (:data:`KINDS`): ``"shopping"`` (change from a bill), ``"rate"`` (work at a rate over two
periods), ``"sharing"`` (equal shares after keeping some), ``"ages"`` (an age in some years),
``"harvest"`` (good produce after spoilage).

Text versions (``sensible_numbers``; the ids are in :mod:`collab_env.tasks.chats`)
    * ``sensible_numbers=True`` (``math-chat-v1``, issue 27): a number 1 takes the singular: "a
      pen for 1 dollar", "bakes 1 tray of cookies", "keeps 1 cookie", "1 of the lemons is
      spoiled". The draws, the numbers, the sentence order and the answer are those of the same
      ``(seed, index)`` without it; only those words change (in about 2.4% of the problems).
    * ``sensible_numbers=False`` (``math-chat-v0``, locked: its leaderboard tracks replay these
      items): "a pen for 1 dollars", "bakes 1 trays", "keeps 1 cookies", "1 of the lemons are
      spoiled".
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from collab_env.errors import ConfigError

__all__ = ["KINDS", "MathProblem", "math_problem"]

_T = TypeVar("_T")

_NAMES = ("Maya", "Omar", "Lena", "Tom", "Aisha", "Ken", "Sofia", "Ravi", "Nora", "Ben", "Ines", "Yuki")
_PRONOUN = {"Maya": "She", "Lena": "She", "Aisha": "She", "Sofia": "She", "Nora": "She", "Ines": "She",
            "Yuki": "She", "Omar": "He", "Tom": "He", "Ken": "He", "Ravi": "He", "Ben": "He"}


@dataclass(frozen=True)
class MathProblem:
    """One generated word problem.

    Args:
        problem_id: ``"math-chat/<seed>/<index>"``.
        kind: One of :data:`KINDS`.
        facts: The fact sentences, in story order.
        question: The question sentence (it names no number).
        answer: The integer answer.
    """

    problem_id: str
    kind: str
    facts: tuple[str, ...]
    question: str
    answer: int

    @property
    def sentences(self) -> tuple[str, ...]:
        """Every sentence in reading order: the facts, then the question."""
        return (*self.facts, self.question)

    @property
    def text(self) -> str:
        """The whole problem as one paragraph (sentences joined by single spaces)."""
        return " ".join(self.sentences)


class _Draw:
    """Integers and choices drawn from ``random.Random.random()`` only (stable across Pythons)."""

    def __init__(self, seed: int, index: int) -> None:
        self._rng = random.Random(f"math-chat:{seed}:{index}")

    def int(self, lo: int, hi: int) -> int:
        """Uniform integer in ``[lo, hi]``."""
        return lo + min(int(self._rng.random() * (hi - lo + 1)), hi - lo)

    def choice(self, options: tuple[_T, ...]) -> _T:
        return options[self.int(0, len(options) - 1)]


def _counted(n: int, one: str, many: str, sense: bool) -> str:
    """``"<n> <noun>"``: the singular for 1 when ``sense`` (``sensible_numbers``), else always the
    plural (the locked v0 text)."""
    return f"{n} {one if sense and n == 1 else many}"


def _shopping(d: _Draw, name: str, he: str, sense: bool) -> tuple[list[str], str, int]:
    item, items = d.choice((("notebook", "notebooks"), ("apple", "apples"), ("ticket", "tickets")))
    n, price, extra = d.int(2, 9), d.int(2, 12), d.int(1, 9)
    cost = n * price + extra
    bill = next(b for b in (10, 20, 50, 100, 200) if b >= cost)
    facts = [f"{name} buys {n} {items}.", f"Each {item} costs {price} dollars.",
             f"{he} also buys a pen for {_counted(extra, 'dollar', 'dollars', sense)}.",
             f"{he} pays with a {bill}-dollar bill."]
    return facts, f"How much change does {name} get?", bill - cost


def _rate(d: _Draw, name: str, he: str, sense: bool) -> tuple[list[str], str, int]:
    thing = d.choice(("pages", "bricks", "scarves"))
    r, m, k = d.int(2, 15), d.int(10, 40), d.int(5, 20)
    facts = [f"{name} makes {r} {thing} every hour.", f"On Monday {he.lower()} works for {m} hours.",
             f"On Tuesday {he.lower()} works {k} hours longer than on Monday."]
    return facts, f"How many {thing} does {name} make on the two days together?", r * (m + m + k)


def _sharing(d: _Draw, name: str, he: str, sense: bool) -> tuple[list[str], str, int]:
    friends, share, keep, per_tray = d.int(2, 8), d.int(2, 12), d.int(1, 10), d.int(4, 12)
    # trays * per_tray = keep + friends * share, with a whole number of trays: adjust what is kept
    total = friends * share + keep
    trays = -(-total // per_tray)
    keep += trays * per_tray - total
    facts = [f"{name} bakes {_counted(trays, 'tray', 'trays', sense)} of cookies.",
             f"Each tray holds {per_tray} cookies.", f"{he} keeps {_counted(keep, 'cookie', 'cookies', sense)}.",
             f"{he} shares the rest equally among {friends} friends."]
    return facts, "How many cookies does each friend get?", share


def _ages(d: _Draw, name: str, he: str, sense: bool) -> tuple[list[str], str, int]:
    age, older, times, years = d.int(4, 15), d.int(2, 9), d.int(2, 4), d.int(2, 12)
    sister = age + older
    facts = [f"{name} is {age} years old.", f"{name}'s sister is {older} years older than {name}.",
             f"Their grandmother is {times} times as old as {name}'s sister."]
    return facts, f"How old will their grandmother be in {years} years?", sister * times + years


def _harvest(d: _Draw, name: str, he: str, sense: bool) -> tuple[list[str], str, int]:
    fruit = d.choice(("tomatoes", "peppers", "lemons"))
    rows, plants, each = d.int(2, 9), d.int(3, 12), d.int(2, 8)
    bad = d.int(1, rows * plants * each - 1)
    facts = [f"{name}'s garden has {rows} rows of plants.", f"Each row has {plants} plants.",
             f"Each plant gives {each} {fruit}.",
             f"{bad} of the {fruit} {'is' if sense and bad == 1 else 'are'} spoiled."]
    return facts, f"How many good {fruit} does {name} have?", rows * plants * each - bad


_MAKERS: dict[str, Callable[[_Draw, str, str, bool], tuple[list[str], str, int]]] = {
    "shopping": _shopping, "rate": _rate, "sharing": _sharing, "ages": _ages, "harvest": _harvest,
}
#: The kinds of word problem, in the order :func:`math_problem` cycles through them.
KINDS: tuple[str, ...] = tuple(_MAKERS)


def math_problem(seed: int, index: int, kinds: tuple[str, ...] = KINDS, *,
                 sensible_numbers: bool = False) -> MathProblem:
    """Problem ``index`` of the set ``seed``: a pure function of its arguments.

    The kind is ``kinds[index % len(kinds)]``; the person and the numbers are drawn from
    ``random.Random("math-chat:<seed>:<index>")``. ``sensible_numbers`` says a number 1 in the
    singular (``math-chat-v1``; see the module docstring); it changes no draw, number or answer.

    Raises:
        ConfigError: A negative seed or index, or an empty or unknown kind.
    """
    for what, v in (("seed", seed), ("index", index)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ConfigError(f"math_problem: {what} must be an int >= 0, got {v!r}.")
    if not kinds or any(k not in _MAKERS for k in kinds):
        raise ConfigError(f"math_problem: kinds must be a non-empty subset of {KINDS}, got {kinds!r}.")
    kind = kinds[index % len(kinds)]
    d = _Draw(seed, index)
    name = d.choice(_NAMES)
    facts, question, answer = _MAKERS[kind](d, name, _PRONOUN[name], bool(sensible_numbers))
    return MathProblem(problem_id=f"math-chat/{seed}/{index}", kind=kind, facts=tuple(facts),
                       question=question, answer=int(answer))

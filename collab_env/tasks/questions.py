"""When does a message *ask* for something? The one rule every rule-based user follows.

A scripted user reveals what it holds only to an interrogative request for it (DESIGN.md,
"Integrity"): a question about that quantity or an explicit "tell me ...". A statement ("you would
multiply the number of apples by the price per apple"), a guess ("let's say 4 apples"), the
user's own words copied back, and a keyword dump earn nothing. This module decides it, the same
way for ``HiddenFactsUser``, ``TeamFactsUser`` and the chat users:

1. **Clauses.** The message is split at ``. ? ! ; :`` and line breaks; a clause remembers whether
   it ended in ``?``. Words are lower-cased ``[a-z0-9']`` runs (``$3`` is ``3``).
2. **Own words.** A word is *copied* when it lies inside a run of :data:`COPY_RUN` (4) or more
   consecutive words that also occurs in one of the ``quoted`` texts (the user's own messages).
   A target (an object, an attribute keyword) only counts in the assistant's own words, so the
   task's opening pasted back, with or without a ``?``, targets nothing.
3. **Interrogative.** A clause is a request when, after up to three leading fillers (``ok``,
   ``so``, ``and``, ``also``, ``please``, ``great``, ...), it starts with an interrogative word
   (:data:`INTERROGATIVES`: what, how, which, when, where, who, why, ...) or an auxiliary
   (:data:`AUXILIARIES`: could, can, would, do, does, is, are, ...); or starts with an imperative
   request verb (:data:`REQUEST_VERBS`: tell, give, share, provide, list, ...); or contains an
   explicit request phrase (:data:`REQUEST_PHRASES`: "tell me", "let me know", "i need to know",
   ...), and then only the words from the phrase on ask ("I multiply the pears by the price,
   tell me" asks for nothing); or ends in ``?`` and is elliptical: at most
   :data:`MAX_ELLIPTICAL` words and none of :data:`STATEMENT_WORDS` ("and the price of a
   pear?"). A statement with a ``?`` or a tag appended ("you would multiply the number of pears
   by the price per pear?", "..., right?") is a statement. A ``?`` alone, or a clause with no
   words, is not a request.
4. **Keyword dump.** A request clause is a dump, and asks nothing, when fewer than
   :data:`MIN_FUNCTION_SHARE` (40%) of its words are function words (:data:`FUNCTION_WORDS`:
   articles, pronouns, prepositions, auxiliaries, question words), i.e. it is a list of
   keywords rather than a sentence; or when two question words follow each other with no "and"
   or "or" between them ("how many how much apples pears"). Callers add their own caps
   (``HiddenFactsUser``: at most two objects per question).
5. **Dump message.** A message more than half of whose clauses are dumps asks nothing at all (a
   spray of "<object> how many?" pairs among keyword lists).
6. **Questionnaire spray.** A message with more than :data:`MAX_REQUESTS` (8) asking clauses asks
   nothing: a real turn asks a handful of questions (the hidden-facts reference asks at most 6),
   an enumeration of every object-keyword pair asks them all.

:func:`parse` returns the clauses with these facts; :meth:`Clause.names` tells whether a phrase
occurs in the clause's own words. Nothing here knows a task: the users bring their vocabulary.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = [
    "Clause",
    "parse",
    "request_clauses",
    "is_dump",
    "words_of",
    "numbers_in",
    "INTERROGATIVES",
    "AUXILIARIES",
    "REQUEST_VERBS",
    "REQUEST_PHRASES",
    "FUNCTION_WORDS",
    "FILLERS",
    "COPY_RUN",
    "MAX_REQUESTS",
    "MAX_ELLIPTICAL",
    "STATEMENT_WORDS",
    "MIN_FUNCTION_SHARE",
]

INTERROGATIVES = frozenset(
    "what what's whats how how's which when where who who's whom whose why".split()
)
AUXILIARIES = frozenset(
    "could can would will do does did is are was were should may might shall have has had "
    "isn't aren't don't doesn't didn't won't wouldn't couldn't can't".split()
)
REQUEST_VERBS = frozenset("tell give share provide list send specify state clarify confirm describe".split())
REQUEST_PHRASES = (
    "tell me", "let me know", "i need to know", "i'd like to know", "i would like to know",
    "i want to know", "i'll need to know", "i will need to know", "i'd need to know",
    "i would need to know", "please share", "please give", "please provide", "please tell",
    "please list", "please send", "please specify", "please confirm", "i need you to tell",
    "can you share", "could you share",
)
FILLERS = frozenset(
    "ok okay so and also great thanks perfect sure alright right well now then next first "
    "finally lastly but please hi hello hey".split()
)
#: Multi-word openers skipped like fillers ("thank you, what is ...").
FILLER_PHRASES = (("thank", "you"), ("got", "it"), ("one", "more", "question"), ("quick", "question"))
FUNCTION_WORDS = frozenset(
    """a an the of for to in on at by with from about into per each every one any some all both
    and or but so if than then that this these those there here it its it's is are was were be
    been being am do does did done have has had having can could would will should may might
    shall must i me my mine we us our you your yours he she they them their his her what what's
    whats how how's which when where who whom whose why much many more most please tell let know
    need want like give share provide much also just exactly total altogether s d ll re ve""".split()
)
COPY_RUN = 4
MAX_REQUESTS = 8
#: Longest clause that asks by its ``?`` alone (an elliptical "and the weight of a crate?").
MAX_ELLIPTICAL = 7
#: Words that make a ``?``-ended clause a statement with a question mark, not an elliptical
#: question: subjects and finite verbs of a claim ("you would multiply ...?", "so it is ...?").
STATEMENT_WORDS = frozenset(
    """i you we they he she it this that there is are was were be would will should must
    multiply multiplied times plus add adding added minus divide divided equals equal makes
    gives total assume assuming suppose guess say right correct""".split()
)
MIN_FUNCTION_SHARE = 0.4

_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")
_NUMBER_WORDS = {
    "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9,
    "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13, "fourteen": 14, "fifteen": 15,
    "sixteen": 16, "seventeen": 17, "eighteen": 18, "nineteen": 19, "twenty": 20,
}


def words_of(text: str) -> list[str]:
    """The lower-cased words of ``text`` (``[a-z0-9]`` runs, with an apostrophe suffix kept)."""
    return _WORD.findall(text.lower().replace("\u2019", "'"))


def _number(word: str) -> int | None:
    if word.isdigit():
        return int(word)
    return _NUMBER_WORDS.get(word)


def numbers_in(text: str) -> set[int]:
    """Every whole number written in ``text``, as digits or as a word two..twenty (``one`` and
    ``1`` are left out: "the price of one apple" states no value)."""
    out = {n for n in (_number(w) for w in words_of(text.replace(",", ""))) if n is not None}
    return out - {1}


def _word_matches(pattern: str, word: str) -> bool:
    # A keyword's plural or verb form counts ("price" ~ "prices", "weigh" ~ "weighs"/"weight").
    if word == pattern or word in (pattern + "s", pattern + "es"):
        return True
    return len(pattern) >= 5 and word.startswith(pattern)


@dataclass(frozen=True)
class Clause:
    """One clause of a message.

    Attributes:
        text: The clause as written (stripped).
        words: Its lower-cased words.
        own: Per word, ``True`` when the word is the writer's own (not inside a run of
            :data:`COPY_RUN` words copied from a quoted text).
        question_mark: The clause ended in ``?``.
        interrogative: It is phrased as a question or an explicit request (rule 3).
        dump: It is a keyword list, not a sentence (rule 4).
    """

    text: str
    words: tuple[str, ...]
    own: tuple[bool, ...]
    question_mark: bool
    interrogative: bool
    dump: bool

    @property
    def asks(self) -> bool:
        """A request that is not a keyword dump: the only clause a user answers."""
        return self.interrogative and not self.dump

    def names(self, phrase: str) -> bool:
        """``phrase`` (one or more words) occurs in the clause's own words."""
        p = words_of(phrase)
        if not p:
            return False
        n = len(p)
        for i in range(len(self.words) - n + 1):
            if all(self.own[i + j] and _word_matches(p[j], self.words[i + j]) for j in range(n)):
                return True
        return False

    def names_any(self, phrases: Iterable[str]) -> bool:
        return any(self.names(p) for p in phrases)

    def own_text(self) -> str:
        """The clause's own words, joined by spaces (copied runs left out)."""
        return " ".join(w for w, o in zip(self.words, self.own) if o)


def _ngrams(words: Sequence[str], n: int) -> set[tuple[str, ...]]:
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


def _own_mask(words: Sequence[str], quoted_grams: set[tuple[str, ...]]) -> tuple[bool, ...]:
    own = [True] * len(words)
    n = COPY_RUN
    for i in range(len(words) - n + 1):
        if tuple(words[i:i + n]) in quoted_grams:
            for j in range(i, i + n):
                own[j] = False
    return tuple(own)


_REQUEST_RE = re.compile(r"\b(?:" + "|".join(re.escape(p) for p in REQUEST_PHRASES) + r")\b")


def _interrogative(words: Sequence[str], question_mark: bool) -> int | None:
    """Where the clause's request starts (rule 3), or ``None`` when it asks nothing.

    A request phrase inside the clause ("to total it, I need to know the price of a pear")
    starts the request there: only the words from the phrase on ask, so "I multiply the pears
    by the price, tell me" asks for nothing. A clause that only ends in ``?`` asks when it is
    elliptical (:data:`MAX_ELLIPTICAL` words at most, with no subject word of a statement:
    "and the price of a pear?"); a statement with a ``?`` appended ("you would multiply the
    number of pears by the price per pear?", "..., right?") is still a statement.
    """
    if not words:
        return None
    i = skipped = 0
    while skipped < 3 and i < len(words) - 1:
        phrase = next((p for p in FILLER_PHRASES if tuple(words[i:i + len(p)]) == p), None)
        if phrase is not None:
            i += len(phrase)
        elif words[i] in FILLERS:
            i += 1
        else:
            break
        skipped += 1
    if i < len(words):
        first = words[i]
        if first in INTERROGATIVES or first in AUXILIARIES or first in REQUEST_VERBS:
            return 0
    # The leftmost request phrase (one alternation: its leftmost match is the earliest phrase).
    text = " ".join(words)
    m = _REQUEST_RE.search(text)
    if m:
        return text[:m.start()].count(" ")
    rest = words[i:]
    if question_mark and rest and len(rest) <= MAX_ELLIPTICAL and not STATEMENT_WORDS & set(rest):
        return 0
    return None


def _dump(words: Sequence[str]) -> bool:
    if not words:
        return True
    function = sum(1 for w in words if w in FUNCTION_WORDS)
    if function < MIN_FUNCTION_SHARE * len(words):
        return True
    # Question words strung together ("how many how much apples pears"): two interrogatives
    # with no "and"/"or" between them are a list, not a question.
    wh = [i for i, w in enumerate(words) if w in INTERROGATIVES]
    return any(not {"and", "or"} & set(words[a + 1:b]) for a, b in zip(wh, wh[1:]))


_SPLIT = re.compile(r"([.?!;:\n]+)")


def parse(text: str, quoted: Iterable[str] = ()) -> list[Clause]:
    """The clauses of ``text``, each with the facts of rules 1-4.

    Args:
        text: The message (an assistant's turn).
        quoted: Texts whose words are not the writer's own (the user's messages): runs of
            :data:`COPY_RUN` words copied from them are marked in :attr:`Clause.own`.
    """
    grams: set[tuple[str, ...]] = set()
    for q in quoted:
        grams |= _ngrams(words_of(q), COPY_RUN)
    parts = _SPLIT.split(text)
    out = []
    for k in range(0, len(parts), 2):
        body = parts[k].strip()
        sep = parts[k + 1] if k + 1 < len(parts) else ""
        words = tuple(words_of(body))
        if not words:
            continue
        qm = "?" in sep
        own = _own_mask(words, grams)
        start = _interrogative(words, qm)
        if start:  # a request phrase inside the clause: only what follows it asks
            words, own = words[start:], own[start:]
        out.append(Clause(
            text=body,
            words=words,
            own=own,
            question_mark=qm,
            interrogative=start is not None,
            dump=_dump(words),
        ))
    return out


def is_dump(clauses: Sequence[Clause]) -> bool:
    """A message is a keyword dump when more than half of its clauses are (rule 5)."""
    return sum(c.dump for c in clauses) * 2 > len(clauses)


def request_clauses(text: str, quoted: Iterable[str] = ()) -> list[Clause]:
    """The clauses of ``text`` that ask (:attr:`Clause.asks`: interrogative and no dump); none
    when the message as a whole is a dump (:func:`is_dump`) or asks more than
    :data:`MAX_REQUESTS` questions (rule 6)."""
    clauses = parse(text, quoted)
    if is_dump(clauses):
        return []
    asking = [c for c in clauses if c.asks]
    return asking if len(asking) <= MAX_REQUESTS else []

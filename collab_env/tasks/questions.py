"""When does a message *ask* for something? The one rule every rule-based user follows.

Two rules live here. :data:`SYNTAX` (``rule="syntax"``, issue 43, the default and the rule of
every current env version) judges a clause by its **syntax**; :data:`OPENER` (``rule="opener"``,
issue 23) judged it by its first word and is kept, unchanged, for the superseded versions that
were published with it (hidden-facts v1/v2, hidden-facts-copy-v1, team-facts v1). It is
gameable: a statement that *starts* with a question word or an auxiliary ("Which means the
total is the number of apples times ...", "Would multiply ...", "When I have the number of
apples ...") or an article-padded word list behind "What" counted as a request.

The syntax rule (:func:`parse` with ``rule="syntax"``)
    1. **Clauses** are split at ``. ? ! ; :`` and line breaks; inside a clause, commas are kept
       as tokens. A question may start at the clause's start or after a comma ("To total it,
       could you tell me ...?"); what comes before it is not part of the question.
    2. **Heads.** After up to three fillers (``ok``, ``so``, ``and``, ``please``...), a clause
       asks when it parses as one of:

       * a **wh-question** with subject-auxiliary inversion: a wh-phrase (``what``, ``which``
         + an optional noun phrase, ``how`` + ``many``/``much`` + an optional noun phrase,
         ``who``, ``when``, ``where``, ``why``), a finite auxiliary (``is``, ``are``, ``does``,
         ``can``, ``would``...) and a **subject** (a pronoun, or a noun phrase opened by a
         determiner or a number): "How many boxes of books and vases do you have?", "What is
         the price of one apple?", "what's the price of a pear";
       * a **wh-subject question** ending in ``?``: a wh-phrase and a finite auxiliary with no
         subject after it, and no second finite verb ("Which items are involved?"; "What is
         needed is the count." is a statement), or a wh-phrase with its noun and a lexical verb
         and no auxiliary ("How much sugar goes into each batch?");
       * a **yes/no question**: a finite auxiliary and a subject ("Could you tell me ...",
         "Do you need ...", "Is there ...");
       * a **request**: an imperative request verb (``tell``, ``give``, ``share``, ``list``...)
         followed by ``me``/``us``, a noun phrase or a wh-word, or an explicit request phrase
         ("let me know", "I need to know", "I'd like to know") followed by the same;
       * an **elliptical question** ending in ``?``: a noun phrase and nothing else, after
         ``and``/``or``/``what about``/``how about``, or a full one (an article, a head and an
         attachment: "the price of a pear?"), or ``how many``/``how much`` + a noun phrase
         ("And the price of a pear?", "How many batches of muffins?"), at most
         :data:`MAX_ELLIPTICAL` words; "their price?" is a keyword pair.

       A noun phrase is an optional determiner or number, one to three content words, and
       attachments (``of``/``per``/``for``/``in`` + noun phrase, ``and``/``or``/``,`` + noun
       phrase). So "Would multiply ...", "Should be ...", "Is simply ..." (an auxiliary with no
       subject), "When I have ..." and "Which means ..." (no auxiliary after the wh-phrase)
       and "What of the the ..." (no noun phrase, no auxiliary) ask nothing.
    3. **Scope.** The question's words run from its head to the end of the clause, cut at the
       first subordinator after the head structure (``if``, ``because``, ``so``, ``which``,
       ``that``, ``when``...: a relative or subordinate clause is not the question) and at the
       first comma after it unless what follows is a noun or prepositional phrase (a list
       going on: "the number of apples, pears and lemons"). Only the scope can name a slot
       (:meth:`Clause.names`), and the words copied from the user count: a real question that
       reuses the user's words is a question. A scope copied whole from the user's texts
       asks nothing (the opening's own question pasted back).
    4. **Not a question after all.** A scope that holds an arithmetic word (``times``,
       ``multiply``, ``plus``, ``equals``, ``sum``...: a computation described, not a fact
       asked for), a malformed article (a determiner followed by a determiner, a preposition,
       an auxiliary or the end: "the the", "of the each"), or is a keyword dump (rule 4 below)
       asks nothing.
    5. Rules 5 and 6 below (a message of dumps, a questionnaire spray) apply, with a fragment of
       at most three words that is no question ("old how many") counted as a dump, and a clause
       of interjections only ("Great.", "Thanks!") counted as nothing.

The opener rule (``rule="opener"``, legacy)

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

import functools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = [
    "RULES",
    "SYNTAX",
    "OPENER",
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

#: The syntax rule (issue 43): the default, and the rule of every current env version.
SYNTAX = "syntax"
#: The first-word rule of issue 23, kept for the superseded versions published with it.
OPENER = "opener"
#: The rules :func:`parse` knows.
RULES = (SYNTAX, OPENER)

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


def numbers_in(text: str, *, digit_one: bool = False) -> set[int]:
    """Every whole number written in ``text``, as digits or as a word two..twenty (``one`` and
    ``1`` are left out: "the price of one apple" states no value; ``digit_one``: the digit
    ``1`` counts, the word ``one`` still does not)."""
    words = words_of(text.replace(",", ""))
    out = {n for n in (_number(w) for w in words) if n is not None} - {1}
    return out | {1} if digit_one and "1" in words else out


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
    #: Which rule judged it (:data:`RULES`).
    rule: str = OPENER
    #: The syntax rule's form of the question (``"wh"``, ``"wh-subject"``, ``"yes-no"``,
    #: ``"request"``, ``"elliptical"``), ``""`` when it asks nothing; the opener rule's is
    #: ``"opener"`` for a request.
    form: str = ""
    #: Syntax rule: why a clause whose head parsed asks nothing after all (``"arithmetic"``,
    #: ``"malformed"``, ``"copied"``), else ``""``.
    rejected: str = ""

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
        # The syntax rule judges the question's form, so the user's own words reused in a real
        # question count; the opener rule counts only the writer's own words.
        mine = self.own if self.rule == OPENER else (True,) * len(self.words)
        for i in range(len(self.words) - n + 1):
            if all(mine[i + j] and _word_matches(p[j], self.words[i + j]) for j in range(n)):
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


def parse(text: str, quoted: Iterable[str] = (), rule: str = SYNTAX) -> list[Clause]:
    """The clauses of ``text``, each with the facts of its rule.

    Args:
        text: The message (an assistant's turn).
        quoted: Texts whose words are not the writer's own (the user's messages): runs of
            :data:`COPY_RUN` words copied from them are marked in :attr:`Clause.own`.
        rule: :data:`SYNTAX` (default) or :data:`OPENER` (legacy; see the module docstring).

    Raises:
        ValueError: An unknown ``rule``.
    """
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}.")
    return list(_parse(text, tuple(quoted), rule))


@functools.lru_cache(maxsize=4096)  # the replies of the episodes in flight, their futures included
def _parse(text: str, quoted: tuple[str, ...], rule: str) -> tuple[Clause, ...]:
    """:func:`parse`, kept per (text, quoted, rule): a function of them alone, asked again for
    the same reply by every future of the multiturn-aware reward and by each rule that reads
    the conversation (half the time of a scripted-user episode under MR, measured on
    math-chat-v1's audit)."""
    grams: set[tuple[str, ...]] = set()
    for q in quoted:
        grams |= _ngrams(words_of(q), COPY_RUN)
    parts = _SPLIT.split(text)
    out = []
    for k in range(0, len(parts), 2):
        body = parts[k].strip()
        sep = parts[k + 1] if k + 1 < len(parts) else ""
        qm = "?" in sep
        if rule == SYNTAX:
            out += _syntax_clauses(body, qm, grams)
            continue
        words = tuple(words_of(body))
        if not words:
            continue
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
            rule=OPENER,
            form="opener" if start is not None else "",
        ))
    return tuple(out)


# ---------------------------------------------------------------------------------------------
# The syntax rule: a small parser of English questions (heads, noun phrases, scope)
# ---------------------------------------------------------------------------------------------
#: Finite auxiliaries and copulas: what inverts with the subject in a question.
FINITE_AUX = frozenset(
    """is are was were am do does did can could will would should shall may might must has have
    had isn't aren't wasn't weren't don't doesn't didn't can't couldn't won't wouldn't
    shouldn't hasn't haven't mustn't""".split()
)
#: Wh-words with a contracted copula ("what's"): the wh-phrase and the auxiliary in one word.
WH_CONTRACTED = frozenset("what's whats how's who's where's when's which's".split())
#: Wh-words that head a question.
WH_WORDS = frozenset("what which how who whom whose when where why".split())
#: Words after "how" that make a wh-phrase ("how many", "how much", "how heavy").
HOW_WORDS = frozenset("many much long heavy big often old far large tall expensive".split())
#: Subject pronouns (a subject by themselves).
PRONOUNS = frozenset("i you we they he she it there someone anyone everyone this that these those".split())
#: Determiners: open a noun phrase.
DETERMINERS = frozenset(
    "the a an each every one your my our their his her its this that these those any some all both no".split()
)
#: Determiners that may also stand alone at a clause's end ("how much do they cost each?").
_PRONOUN_DETS = frozenset("each one all both this that these those some any".split())
#: Words that attach a noun phrase to a noun phrase.
NP_LINKS = frozenset("of per for in on at from with and or ,".split())
_PREPOSITIONS = frozenset("of per for in on at from with to by about into over under".split())
#: Words that end a question's scope: a relative or subordinate clause begins.
SUBORDINATORS = frozenset(
    "if because since so which who whom whose that when where while although though unless given "
    "assuming whereas once".split()
)
#: Words of a computation: a clause holding one describes arithmetic, it does not ask for a fact.
ARITHMETIC = frozenset(
    """times multiply multiplied multiplying multiplies plus add added adding adds minus subtract
    subtracted subtracting divide divided dividing divides equals equal equaled equalling equaling
    sum summed summing product""".split()
)
#: Imperative request verbs.
_REQUEST_HEADS = frozenset("tell give share provide list send specify state clarify confirm describe".split())
#: Request phrases that head a clause like an imperative.
_REQUEST_OPENERS = tuple(tuple(p.split()) for p in (
    "let me know", "let us know", "i need to know", "i'd like to know", "i would like to know",
    "i want to know", "i'll need to know", "i will need to know", "i'd need to know",
    "i would need to know", "i need you to tell me", "i'd like you to tell me",
))
_ELLIPSIS_OPENERS = (("what", "about"), ("how", "about"), ("and", "what", "about"), ("and",), ("or",),
                     ("also",), ("plus",))
#: Words that are never the content word of a noun phrase.
_CLOSED = (FINITE_AUX | WH_WORDS | WH_CONTRACTED | PRONOUNS | DETERMINERS | _PREPOSITIONS | SUBORDINATORS
           | ARITHMETIC | frozenset("and or but nor not me us him them be been being , please "
                                    "let to".split()))
#: Most content words in a row inside one noun phrase ("price per box" has one each side).
_MAX_NOUNS = 3
_TOKEN = re.compile(r"[a-z0-9]+(?:'[a-z]+)?|,")


def _content(w: str) -> bool:
    return w not in _CLOSED


def _numeric(w: str) -> bool:
    return w.isdigit() or w in _NUMBER_WORDS


def _np(t: Sequence[str], j: int, *, det: bool = True) -> int:
    """The end of the noun phrase starting at ``t[j]`` (``j`` when there is none): an optional
    determiner or number (``det``), one to :data:`_MAX_NOUNS` content words, then attachments
    (``of``/``per``/``and``/``,``... + noun phrase)."""
    n, k = len(t), j
    if det and k < n and (t[k] in DETERMINERS or _numeric(t[k])):
        k += 1
    m = k
    while m < n and m - k < _MAX_NOUNS and _content(t[m]) and not _numeric(t[m]):
        m += 1
    if m == k:
        return j
    while m < n and t[m] in NP_LINKS:
        e = _np(t, m + 1)
        if e == m + 1:
            break
        m = e
    return m


def _subject(t: Sequence[str], j: int) -> int:
    """The end of the subject starting at ``t[j]`` (``j`` when there is none): a pronoun, or a
    noun phrase that opens with a determiner or a number."""
    if j < len(t) and t[j] in PRONOUNS and not (j + 1 < len(t) and _content(t[j + 1])
                                                  and t[j] in DETERMINERS):
        return j + 1
    if j < len(t) and (t[j] in DETERMINERS or _numeric(t[j])):
        return _np(t, j)
    return j


def _skip_fillers(t: Sequence[str], i: int) -> int:
    skipped = 0
    while skipped < 3 and i < len(t) - 1:  # a filler is skipped only when words follow it
        phrase = next((p for p in FILLER_PHRASES if tuple(t[i:i + len(p)]) == p and i + len(p) < len(t)), None)
        if phrase is not None:
            i += len(phrase)
        elif t[i] in FILLERS and t[i] != "please":
            i += 1
        else:
            break
        skipped += 1
    return i


def _wh_phrase(t: Sequence[str], i: int) -> int:
    """The end of the wh-phrase at ``t[i]`` (``i`` when it is not one)."""
    n, w = len(t), t[i]
    if w not in WH_WORDS:
        return i
    j = i + 1
    if w == "how":
        if j < n and t[j] in HOW_WORDS:
            j += 1
            if t[j - 1] in ("many", "much"):
                if j < n and t[j] == "of":  # "how many of the apples"
                    e = _np(t, j + 1)
                    return e if e > j + 1 else j
                return _np(t, j, det=False)
        return j
    if w in ("what", "which", "whose"):
        if j < n and t[j] == "of" and w == "which":
            e = _np(t, j + 1)
            return e if e > j + 1 else i
        return _np(t, j, det=False)
    return j


def _head(t: Sequence[str], i: int, qm: bool) -> tuple[str, int]:
    """The question form that starts at ``t[i]`` and the end of its head structure, or
    ``("", i)`` when the words from ``i`` on are no question."""
    n = len(t)
    if i >= n:
        return "", i
    i0, i = i, _skip_fillers(t, i)
    if i >= n:
        return "", i0
    joined = any(w in ("and", "or", "also", "plus") for w in t[i0:i])  # "and the vases?"
    w = t[i]
    if w == "please" and i + 1 < n:
        i, w = i + 1, t[i + 1]
    if w in WH_CONTRACTED:  # "what's the price ...": the auxiliary is in the word
        e = _subject(t, i + 1)
        return ("wh", e) if e > i + 1 else ("", i)
    j = _wh_phrase(t, i)
    if j > i:
        if j < n and t[j] in FINITE_AUX:
            e = _subject(t, j + 1)
            if e > j + 1:
                return "wh", e
            rest = t[j + 1:]
            if qm and not (FINITE_AUX & set(rest)):  # "which items are involved?"
                return "wh-subject", j + 1
            return "", i
        # "how many batches of muffins?": a wh-phrase alone, elliptical
        if qm and t[i] == "how" and j == n and j > i + 2 and n - i <= MAX_ELLIPTICAL:
            return "elliptical", j
        # "how much sugar goes into each batch?": a wh-phrase with its noun, then a lexical verb
        # (the phrase's last content word) and no auxiliary: a wh-subject question
        nouns = [w for w in t[i + 1:j] if _content(w) and w not in HOW_WORDS]
        if qm and t[i] in ("how", "what", "which", "whose") and len(nouns) >= 2 \
                and not FINITE_AUX & set(t[j:]):
            return "wh-subject", j
        return "", i
    if w in FINITE_AUX:
        e = _subject(t, i + 1)
        return ("yes-no", e) if e > i + 1 else ("", i)
    for opener in _REQUEST_OPENERS:
        if tuple(t[i:i + len(opener)]) == opener:
            return _request_object(t, i + len(opener))
    if w in _REQUEST_HEADS:
        k = i + 1
        if k < n and t[k] in ("me", "us"):
            k += 1
        return _request_object(t, k)
    if qm and n - i <= MAX_ELLIPTICAL + 1:
        for opener in _ELLIPSIS_OPENERS:
            if tuple(t[i:i + len(opener)]) == opener:
                k = i + len(opener)
                break
        else:
            k = i
        e = _np(t, k)
        # a noun phrase alone asks only behind "and"/"what about"..., or when it is a full one
        # (an article and a head, "the price of a pear?"): "their price?", "old price?" are
        # keyword pairs
        full = k < n and t[k] in ("the", "a", "an", "each", "every") and any(w in NP_LINKS for w in t[k:e])
        if e > k and e == n and (k > i or joined or full):
            return "elliptical", e
        # "and coaches, how many?": a topic noun phrase, then "how many"/"how much" alone
        if e > k and e + 3 == n and t[e] == "," and t[e + 1] == "how" and t[e + 2] in ("many", "much"):
            return "elliptical", n
    return "", i


def _request_object(t: Sequence[str], k: int) -> tuple[str, int]:
    """A request head's object: a noun phrase, a wh-word or "if"/"whether"."""
    if k < len(t) and (t[k] in WH_WORDS or t[k] in WH_CONTRACTED or t[k] in ("if", "whether")):
        return "request", k + 1
    e = _np(t, k)
    return ("request", e) if e > k else ("", k)


def _scope_end(t: Sequence[str], e: int) -> int:
    """Where the question whose head structure ends at ``e`` stops (rule 3 of the syntax rule)."""
    n, k = len(t), e
    while k < n:
        w = t[k]
        if w in SUBORDINATORS and not (w == "that" and k + 1 < n and _content(t[k + 1])):
            return k
        if w == ",":
            j = k + 1
            if j < n and t[j] in ("and", "or"):
                j += 1
            if j < n and t[j] in _PREPOSITIONS:
                j += 1
            end = _np(t, j)
            if end == j or (end < n and t[end] != ","):
                return k
            k = end
            continue
        k += 1
    return n


def _malformed(t: Sequence[str]) -> bool:
    """A determiner followed by a determiner, a preposition, an auxiliary, a comma or the end."""
    for k, w in enumerate(t):
        if w not in DETERMINERS:
            continue
        nxt = t[k + 1] if k + 1 < len(t) else None
        if nxt is None:
            if w not in _PRONOUN_DETS:
                return True
        elif (nxt in DETERMINERS and not (w == "all" and nxt == "the")) or nxt in _PREPOSITIONS \
                or nxt in FINITE_AUX or nxt == ",":
            if w not in _PRONOUN_DETS:
                return True
    return False


def _syntax_clauses(body: str, qm: bool, grams: set[tuple[str, ...]]) -> list[Clause]:
    """The question clauses of one sentence (rule 1-4 of the syntax rule), or the sentence as one
    clause that asks nothing."""
    t = _TOKEN.findall(body.lower().replace("\u2019", "'"))
    words_all = [w for w in t if w != ","]
    if not words_all:
        return []
    starts = [0] + [k + 1 for k, w in enumerate(t) if w == "," and k + 1 < len(t)]
    out: list[Clause] = []
    k_done = 0
    for s in starts:
        if s < k_done:
            continue
        form, e = _head(t, s, qm)
        if not form:
            continue
        end = _scope_end(t, e)
        scope = [w for w in t[s:end] if w != ","]
        own = _own_mask(scope, grams)
        rejected = ("arithmetic" if ARITHMETIC & set(scope) else
                    "malformed" if _malformed([w for w in t[s:end]]) else
                    "copied" if not any(own) else "")
        out.append(Clause(text=body, words=tuple(scope), own=own, question_mark=qm,
                          interrogative=not rejected, dump=_dump(scope), rule=SYNTAX, form=form,
                          rejected=rejected))
        k_done = end
    if not out:
        words = tuple(words_all)
        if all(w in FILLERS or w in ("thank", "thanks", "you", "it", "got", "yes", "no") for w in words):
            return []  # "Great.", "Thanks!": an interjection, neither a question nor a dump
        # a fragment of at most three words ("old how many", "their price") is a keyword pair
        out.append(Clause(text=body, words=words, own=_own_mask(words, grams), question_mark=qm,
                          interrogative=False, dump=_dump(words) or len(words) <= 3, rule=SYNTAX))
    return out


def is_dump(clauses: Sequence[Clause]) -> bool:
    """A message is a keyword dump when more than half of its clauses are (rule 5)."""
    return sum(c.dump for c in clauses) * 2 > len(clauses)


def request_clauses(text: str, quoted: Iterable[str] = (), rule: str = SYNTAX) -> list[Clause]:
    """The clauses of ``text`` that ask (:attr:`Clause.asks`: interrogative and no dump) under
    ``rule`` (:data:`SYNTAX` by default, :data:`OPENER` for the legacy versions); none when the
    message as a whole is a dump (:func:`is_dump`) or asks more than :data:`MAX_REQUESTS`
    questions (rule 6)."""
    clauses = parse(text, quoted, rule)
    if is_dump(clauses):
        return []
    asking = [c for c in clauses if c.asks]
    return asking if len(asking) <= MAX_REQUESTS else []

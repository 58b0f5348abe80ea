"""The syntax rule of collab_env.tasks.questions, clause by clause (issue 43).

Each statement form the hostile set used against the rule-based users, each word-list shape and
each real question is parsed here; the users' own tests play them in episodes
(tests/exploits/test_whole_episode.py, tests/tasks/test_hidden_facts.py, test_team.py,
test_chats.py).
"""

from __future__ import annotations

import pytest

from collab_env.tasks import questions as q
from collab_env.tasks.chats import SentenceRevealUser
from collab_env.tasks.team import named_facts

#: Statements that start with a question word or an auxiliary, computations, subordinate
#: clauses and padded word lists: under the opener rule each was a request; none asks now.
STATEMENTS = [
    "Which means the total is the number of apples times the price of an apple.",
    "Which means the total is the number of apples times the price per apple",
    "Would multiply the number of apples by the price of each apple.",
    "Should be the number of apples times the price per apple.",
    "When I have the number of apples and the price of each apple I can total it.",
    "Is simply the number of apples times the price of each apple.",
    "What is needed is the number of apples and the price of each apple.",
    "What is needed is the number of apples?",
    "How I total it is the number of apples times the price of each apple.",
    "So the total is the number of apples times the price of each apple.",
    "You would multiply the number of apples by the price of each apple?",
    "Is the total the number of apples times the price of each apple?",
    "Could you multiply the number of apples by the price of each apple?",
    "The total is the number of apples times the price of an apple, right?",
    "I multiply the number of apples by the price of an apple, tell me.",
    "Where the number of apples and the price of each apple give the total.",
    "Whose total is the number of apples times the price.",
    "Why the number of apples matters is the price of each apple.",
]
WORD_LISTS = [
    "What of the the apples the number the count of the each?",
    "Which the apples the the price of the each the?",
    "How many the the apples the number of the?",
    "apples pears price cost how many number?",
    "How many how much apples pears?",
    "What the number the price the apples?",
    "?",
]
#: Real questions, several of which reuse the user's own words.
QUESTIONS = [
    "How many boxes of books and vases do you have?",
    "What is the price of one apple?",
    "what's the price of a pear",
    "Which items exactly are involved?",
    "How much does each box of vases weigh?",
    "How many batches of cookies are you making?",
    "How many grams of sugar does each batch of cookies need?",
    "Could you tell me how many boxes of vases there are?",
    "OK, and how many apples?",
    "And the price of a pear?",
    "To total it, I need to know the price of a pear.",
    "Let me know the number of boxes of vases.",
    "Please share the sugar per batch of muffins.",
    "Tell me the weight of each box of lamps.",
    "What does a box of lamps weigh?",
    "How many seats does each bus have?",
    "I'd like to know the price of a pear",
    "Great, how many apples do you need?",
    "Do you know how many apples you need?",
    "How many apples do you need, so that I can total it?",
    "How much sugar goes into each batch of cookies?",
]


@pytest.mark.parametrize("text", STATEMENTS + WORD_LISTS)
def test_statements_and_word_lists_ask_nothing(text):
    assert q.request_clauses(text) == [], [(c.form, c.rejected, c.words) for c in q.parse(text)]


@pytest.mark.parametrize("text", QUESTIONS)
def test_real_questions_ask(text):
    asking = q.request_clauses(text)
    assert asking and all(c.form in ("wh", "wh-subject", "yes-no", "request", "elliptical") for c in asking)


def test_the_opener_rule_is_kept_for_the_old_versions_and_had_the_hole():
    # The superseded rule keeps its behaviour: the statements that start with a question word or
    # an auxiliary ask under it (the hole the old versions keep), and it refused a real question.
    opener = [t for t in STATEMENTS[:7] if q.request_clauses(t, rule=q.OPENER)]
    assert len(opener) == 7
    assert q.request_clauses("What of the the apples the number the count of the each?", rule=q.OPENER)
    opening = "I'm shipping boxes of books and vases to my cousin in Lyon."
    real = "How many boxes of books and vases do you have?"
    assert not any(c.names("books") for c in q.request_clauses(real, quoted=[opening], rule=q.OPENER))
    assert all(c.names("books") and c.names("vases") for c in q.request_clauses(real, quoted=[opening]))


def test_scope_excludes_the_subordinate_clause_and_the_statement_before_the_question():
    (c,) = q.request_clauses("How many apples do you need, which means the price of a pear is known?")
    assert c.names("apples") and not c.names("pear")
    (c,) = q.request_clauses("The price per pear is 3 dollars, so how many apples do you need?")
    assert c.names("apples") and not c.names("pear")
    (c,) = q.request_clauses("Could you tell me the number of apples, pears and lemons?")
    assert c.names("apples") and c.names("pears") and c.names("lemons")


def test_why_a_head_that_parsed_asks_nothing_is_reported():
    (c,) = q.parse("Would you multiply the number of apples by the price of one apple?")
    assert c.form == "yes-no" and c.rejected == "arithmetic" and not c.asks
    (c,) = q.parse("Do you need the the apples?")
    assert c.rejected == "malformed" and not c.asks
    opening = "How much will it all cost, in dollars?"
    (c,) = q.parse(opening, quoted=[opening])
    assert c.rejected == "copied" and not c.asks


def test_one_question_per_withheld_fact_in_one_turn_is_answered():
    text = ("How many apples do you need? What is the price of one apple? How many pears do you need? "
            "How much does one pear cost? How many lemons do you need? What is the price of a lemon?")
    assert len(q.request_clauses(text)) == 6
    spray = " ".join(f"How many {w} do you need?" for w in "apples pears lemons mugs towels candles notebooks "
                                                                  "balloons cookies".split())
    assert q.request_clauses(spray) == []  # a questionnaire spray of more than MAX_REQUESTS asks nothing


def test_unknown_rule_is_an_error():
    with pytest.raises(ValueError, match="rule must be one of"):
        q.parse("How many?", rule="first-word")


@pytest.mark.parametrize("text", STATEMENTS + WORD_LISTS)
def test_every_rule_based_user_ignores_the_statement_forms(text):
    # team-facts names no fact, the chat user hears no question
    objs = [("apple", "apples"), ("pear", "pears")]
    team_text = text.replace("apple", "pizza").replace("price", "cost")
    assert named_facts(team_text, "party", [("pizza", "pizzas"), ("cake", "cakes")], rule="syntax") == []
    assert named_facts(text, "party", objs, rule="syntax") == []
    assert not SentenceRevealUser().asks(text, ["I need help with a problem."])


@pytest.mark.parametrize("text", QUESTIONS[:8])
def test_every_rule_based_user_hears_the_real_questions(text):
    assert SentenceRevealUser().asks(text, ["I need help with a problem."])


def test_a_message_of_fillers_alone_parses_under_every_rule():
    """A message that is nothing but fillers ("Thank you", "ok, got it?") never crashes the
    parser, and a thank-you asks nothing (it crashed: the env raised on an assistant's
    "Thank you" under the syntax rule, and the episode failed); nor does any two-word message of
    the words the parser's rules look at (openers, heads, wh-words, auxiliaries: "and?", "what
    about?")."""
    import itertools

    fillers = sorted(q.FILLERS | {w for p in q.FILLER_PHRASES for w in p})
    for n in (1, 2, 3):
        for combo in itertools.product(fillers, repeat=n):
            for text in (" ".join(combo), " ".join(combo) + "?", ", ".join(combo) + "."):
                for rule in q.RULES:
                    assert isinstance(q.parse(text, rule=rule), list), (text, rule)
    assert not any(c.interrogative for t in ("Thank you", "Thank you!", "ok, got it.") for c in q.parse(t))
    vocab = {*fillers, *q.WH_WORDS, *q.FINITE_AUX, *q.HOW_WORDS, *q._REQUEST_HEADS, "of", "the", "me", ","}
    vocab |= {w for o in (*q._ELLIPSIS_OPENERS, *q._REQUEST_OPENERS) for w in o}
    for combo in itertools.product(sorted(vocab), repeat=2):
        for text in (" ".join(combo), " ".join(combo) + "?"):
            for rule in q.RULES:
                q.parse(text, rule=rule)


def test_an_assistant_that_says_thank_you_plays_a_whole_episode():
    from collab_env.eval import evaluate
    from collab_env.policy import FixedTextPolicy

    res = evaluate("hidden-facts-choose", {"assistant": FixedTextPolicy("Thank you")}, num_episodes=2, progress=False)
    assert not res.failures and len(res.episodes) == 2

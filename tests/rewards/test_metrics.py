"""Metric registry and built-in metrics, with hand-computed values and fake judge backends."""

from __future__ import annotations

import asyncio
import math

import pytest

from collab_env.agents.judges import LLMJudge
from collab_env.errors import ConfigError, JudgeError, SandboxError, TaskFunctionError
from collab_env.rewards import metrics as M
from collab_env.rewards.metrics import (
    MetricResult,
    char_bleu,
    get_metric,
    list_metrics,
    register_metric,
)
from collab_env.types import Completion, Conversation, Message


class FakeJudgeLLM:
    """Replies from a list, in order; records every prompt."""

    def __init__(self, replies):
        self.replies = list(replies)
        self.prompts: list[str] = []

    async def act(self, observations, **sampling):
        out = []
        for o in observations:
            self.prompts.append("\n".join(m.content for m in o))
            out.append(Completion(text=self.replies.pop(0), finish_reason="stop",
                                  usage={"completion_tokens": 5}))
        return out


def run(coro):
    return asyncio.run(coro)


def score(name, conv, item, **kw):
    return run(get_metric(name)(conv, item, **kw))


def conv(*turns, hidden=True):
    """Conversation: a system message, a hidden goal, then alternating user/assistant turns."""
    msgs = [Message("system", "You are helpful.")]
    if hidden:
        msgs.append(Message("user", "secret goal words here", audience=("user",)))
    for i, t in enumerate(turns):
        role = "user" if i % 2 == 0 else "assistant"
        msgs.append(Message(role, t, author=role))
    return Conversation(tuple(msgs))


ITEM = {"single_turn_prompt": "What is 1 divided by 2?", "single_turn_completion": "So \\boxed{0.5}."}


# ---------------------------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------------------------
def test_builtins_are_registered():
    assert {"accuracy_rule", "accuracy", "interactivity", "token_amount", "bleu_score", "bleu_word",
            "bleu_char", "pass_rate"} <= set(list_metrics())
    assert get_metric("accuracy").needs == ("judge",)


def test_unknown_metric_name_suggests_the_closest():
    with pytest.raises(ConfigError, match="Did you mean 'accuracy'"):
        get_metric("acuracy")


def test_register_custom_metric_and_duplicate_refused():
    async def always_one(conversation, item, *, start=0, **ctx):
        return MetricResult(1, {"x": 1})

    m = register_metric("test_always_one", always_one, overwrite=True)
    res = score("test_always_one", conv("hi"), {})
    assert res.value == 1.0 and isinstance(res.value, float) and m.name == "test_always_one"
    with pytest.raises(ConfigError, match="already registered"):
        register_metric("test_always_one", always_one)
    with pytest.raises(ConfigError, match="unknown needs"):
        register_metric("test_bad_needs", always_one, needs=("gpu",))


def test_metric_returning_a_bare_float_or_nan_is_an_error():
    register_metric("test_float", lambda c, i, start=0, **k: 0.5, overwrite=True)
    register_metric("test_nan", lambda c, i, start=0, **k: MetricResult(math.nan), overwrite=True)
    with pytest.raises(TaskFunctionError, match="not a MetricResult"):
        score("test_float", conv("hi"), {})
    with pytest.raises(TaskFunctionError, match="non-finite"):
        score("test_nan", conv("hi"), {})


def test_exception_in_a_metric_propagates():
    def boom(c, i, start=0, **k):
        raise RuntimeError("boom")

    register_metric("test_boom", boom, overwrite=True)
    with pytest.raises(RuntimeError, match="boom"):
        score("test_boom", conv("hi"), {})


def test_bad_start_is_refused():
    with pytest.raises(ConfigError, match="start"):
        score("token_amount", conv("hi"), {}, start=99)


# ---------------------------------------------------------------------------------------------
# accuracy_rule
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("answer", "expected", "match"), [
    ("\\boxed{1/2}", 1.0, "numeric"),          # 1/2 vs 0.5
    ("\\boxed{\\frac{1}{2}}", 1.0, "numeric"),  # nested braces
    ("\\boxed{\\dfrac{2}{4}}", 1.0, "numeric"),
    ("\\boxed{0.5}", 1.0, "exact"),
    ("\\boxed{$0.5$.}", 1.0, "exact"),
    ("\\boxed{1/3}", 0.0, "numeric"),
    ("\\boxed{0.25}", 0.0, "numeric"),
])
def test_accuracy_rule_against_decimal_reference(answer, expected, match):
    res = score("accuracy_rule", conv("What is 1/2?", f"The answer is {answer}"), ITEM)
    assert res.value == expected and res.detail["match"] == match
    assert res.detail["reference"] == "0.5"


def test_accuracy_rule_symbolic_and_unparseable():
    item = {"answer": "\\frac{\\sqrt{2}}{2}"}
    assert score("accuracy_rule", conv("q", "\\boxed{\\sqrt{2}/2}"), item).value == 1.0
    assert score("accuracy_rule", conv("q", "\\boxed{1/\\sqrt{2}}"), item).value == 1.0
    assert score("accuracy_rule", conv("q", "\\boxed{\\sqrt{3}/2}"), item).value == 0.0
    bad = score("accuracy_rule", conv("q", "\\boxed{x = = }"), item)
    assert bad.value == 0.0 and "parse_error" in bad.detail


def test_accuracy_rule_uses_last_box_of_last_assistant_message_that_has_one():
    c = conv("q", "First \\boxed{0.3} then \\boxed{1/2}", "thanks", "You're welcome!")
    res = score("accuracy_rule", c, ITEM)
    assert res.value == 1.0 and res.detail["answer"] == "1/2"
    # A box the user wrote does not count.
    c2 = conv("Is it \\boxed{0.5}?", "I am not sure.")
    res2 = score("accuracy_rule", c2, ITEM)
    assert res2.value == 0.0 and res2.detail["reason"] == "no boxed answer"


def test_accuracy_rule_needs_a_reference():
    with pytest.raises(ConfigError, match="reference"):
        score("accuracy_rule", conv("q", "\\boxed{1}"), {"prompt": "q"})


# ---------------------------------------------------------------------------------------------
# Judge metrics
# ---------------------------------------------------------------------------------------------
def test_accuracy_judge_true_false_and_prompt_content():
    backend = FakeJudgeLLM(['{"reason": "matches", "score": true}', '{"reason": "no", "score": false}'])
    judge = LLMJudge.preset("accuracy", backend)
    c = conv("What is 1/2?", "It is one half.")
    yes = score("accuracy", c, ITEM, judge=judge)
    no = score("accuracy", c, ITEM, judge={"accuracy": judge})
    assert (yes.value, no.value) == (1.0, 0.0)
    assert yes.detail["reason"] == "matches" and yes.usage["judge_calls"] == 1
    assert "\\boxed{0.5}" in backend.prompts[0] and "It is one half." in backend.prompts[0]
    assert "secret goal" not in backend.prompts[0]  # hidden messages stay hidden


def test_accuracy_judge_from_backend():
    backend = FakeJudgeLLM(['{"reason": "ok", "score": "yes"}'])
    assert score("accuracy", conv("q", "a"), ITEM, judge_backend=backend).value == 1.0


def test_judge_error_propagates_never_zero():
    backend = FakeJudgeLLM(["no json here"] * 3)
    with pytest.raises(JudgeError):
        score("accuracy", conv("q", "a"), ITEM, judge=LLMJudge.preset("accuracy", backend))
    with pytest.raises(ConfigError, match="needs an LLM judge"):
        score("accuracy", conv("q", "a"), ITEM)


def test_interactivity_rubrics():
    backend = FakeJudgeLLM(['{"reason": "r", "understanding": 1, "clarification": 0.7, "suggestions": 0.3}',
                            '{"reason": "r", "score": 0.5}'])
    verl = score("interactivity", conv("q", "a"), ITEM, judge_backend=backend)
    assert verl.value == pytest.approx(2.0 / 3.0) and verl.detail["clarification"] == 0.7
    paper = score("interactivity", conv("q", "a"), ITEM, judge_backend=backend, rubric="paper")
    assert paper.value == 0.5 and paper.detail["rubric"] == "paper"
    with pytest.raises(ConfigError, match="rubric"):
        score("interactivity", conv("q", "a"), ITEM, judge_backend=backend, rubric="nope")


# ---------------------------------------------------------------------------------------------
# token_amount
# ---------------------------------------------------------------------------------------------
# Indices: 0 system, 1 hidden goal, 2 user (4 words), 3 assistant (4), 4 user (2), 5 assistant (3).
TOKENS_CONV = conv("Solve two plus two", "Do you mean 2+2?", "yes exactly", "It is \\boxed{4}")


@pytest.mark.parametrize(("scope", "start", "expected"), [
    ("future", 4, 5.0), ("future", 0, 13.0), ("future", 6, 0.0), ("assistant", 4, 7.0), ("all", 4, 13.0),
])
def test_token_amount_scopes(scope, start, expected):
    res = score("token_amount", TOKENS_CONV, {}, start=start, scope=scope)
    assert res.value == expected and res.detail["unit"] == "words"


def test_token_amount_default_scope_is_future_and_tokenizer():
    class CharTokenizer:
        def encode(self, text, add_special_tokens=True):
            return [ord(c) for c in text] + ([0] if add_special_tokens else [])

    assert score("token_amount", TOKENS_CONV, {}, start=4).value == 5.0
    res = score("token_amount", TOKENS_CONV, {}, start=4, tokenizer=CharTokenizer())
    assert res.value == len("yes exactly") + len("It is \\boxed{4}") == 26
    with pytest.raises(ConfigError, match="scope"):
        score("token_amount", TOKENS_CONV, {}, scope="user")


# ---------------------------------------------------------------------------------------------
# BLEU
# ---------------------------------------------------------------------------------------------
def test_char_bleu_hand_computed():
    """The recipe's BLEU (nltk sentence_bleu on strings: character n-grams, n = 1..4, uniform
    weights, no smoothing). Expected values from the n-gram counts, worked out below."""
    # 1) reference "the cat sat" (11 chars), hypothesis "the cat" (7 chars): every character
    #    n-gram of the hypothesis occurs in the reference, so p1 = 7/7, p2 = 6/6, p3 = 5/5,
    #    p4 = 4/4. Shorter than the reference: BP = exp(1 - 11/7) = exp(-4/7).
    assert char_bleu("the cat sat", "the cat") == pytest.approx(math.exp(-4 / 7), rel=1e-12)
    # 2) reference "the cat", hypothesis "the hat" (7 chars each, BP = exp(0) = 1).
    #    1-grams: t2 h2 e1 ' '1 a1 vs the reference's t2 h1 e1 ' '1 c1 a1 -> clipped 2+1+1+1+1 = 6/7.
    #    2-grams: th he "e " " h" ha at; the reference has th he "e " at -> 4/6.
    #    3-grams: the "he " "e h" " ha" hat; the reference has the "he " -> 2/5.
    #    4-grams: "the " "he h" "e ha" " hat"; the reference has "the " -> 1/4.
    #    BLEU = (6/7 * 4/6 * 2/5 * 1/4) ** (1/4) = (2/35) ** (1/4) = 0.48892...
    assert char_bleu("the cat", "the hat") == pytest.approx((2 / 35) ** 0.25, rel=1e-12)
    # 3) reference "stop", hypothesis "pots": all four letters match (p1 = 4/4), but no 2-, 3- or
    #    4-gram does (0/3, 0/2, 0/1). nltk keeps going with the smallest positive float m for each
    #    zero precision: BLEU = BP * (1 * m * m * m) ** (1/4) = m ** (3/4), about 1e-231, not 0.
    m = 2.2250738585072014e-308  # sys.float_info.min
    assert char_bleu("stop", "pots") == pytest.approx(m ** 0.75, rel=1e-12)
    assert 0 < char_bleu("stop", "pots") < 1e-200
    # No unigram match at all, or an empty hypothesis: exactly 0 (nltk returns 0 early).
    assert char_bleu("abcd", "xyz") == 0.0
    assert char_bleu("abc", "") == 0.0
    # A hypothesis shorter than n has p_n = 0/1 (nltk's max(1, count) denominator): "ab" vs "ab"
    # gives p1 = p2 = 1, p3 = p4 = m -> m ** (1/2).
    assert char_bleu("ab", "ab") == pytest.approx(m ** 0.5, rel=1e-12)
    assert char_bleu("hello world", "hello world") == 1.0


def test_bleu_score_is_the_recipes_char_bleu_and_bleu_word_is_sacrebleu():
    item = {"single_turn_completion": "the cat"}
    res = score("bleu_score", conv("q", "the hat"), item)
    assert res.value == pytest.approx((2 / 35) ** 0.25, rel=1e-12) and res.detail["unit"] == "char"
    assert res.detail["source"] == "last_assistant_message"
    # The old name of the character BLEU is an alias with the same value.
    assert score("bleu_char", conv("q", "the hat"), item).value == res.value
    # Word level: "a b c d" vs "a b c d e": every word n-gram matches, BP = exp(1 - 5/4).
    words = {"single_turn_completion": "a b c d e"}
    res = score("bleu_word", conv("q", "a b c d"), words)
    assert res.value == pytest.approx(math.exp(1 - 5 / 4), rel=1e-9) and res.detail["unit"] == "word"
    assert score("bleu_word", conv("q", "a b c d e"), words).value == pytest.approx(1.0)
    # The two are different metrics: on "the hat" vs "the cat" sacrebleu's smoothed word BLEU is
    # not the character BLEU above.
    assert abs(score("bleu_word", conv("q", "the hat"), item).value - (2 / 35) ** 0.25) > 1e-3
    # The last assistant message is scored.
    assert score("bleu_score", conv("q", "nope", "x", "abcabc"), {"answer": "abcab"}).value == \
        pytest.approx((1 / 3) ** 0.25, rel=1e-12)


def test_bleu_with_extractor():
    backend = FakeJudgeLLM(['{"answer": "abcde"}'])
    extractor = LLMJudge.preset("extract_answer", backend)
    res = score("bleu_score", conv("q", "Sure! Here it is: abcde. Anything else?"), {"answer": "abcde", "problem": "q"},
                extractor=extractor)
    assert res.value == 1.0 and res.detail["source"] == "extractor" and res.usage["judge_calls"] == 1


def test_bleu_with_document_extractor_reads_the_chat_and_wins_over_the_answer_extractor():
    doc = FakeJudgeLLM(['{"document": "the cat sat"}'])
    answer = FakeJudgeLLM([])  # never called
    c = conv("write it", "Draft: the cat", "add sat", "Done, the cat sat. Anything else?")
    res = score("bleu_score", c, {"answer": "the cat sat"}, document_extractor=M.document_extractor(doc),
                extractor=LLMJudge.preset("extract_answer", answer))
    assert res.value == 1.0 and res.detail["source"] == "document_extractor"
    assert not answer.prompts and len(doc.prompts) == 1
    # The extraction prompt holds the conversation (the assistant's drafts), not the hidden goal.
    assert "Draft: the cat" in doc.prompts[0] and "add sat" in doc.prompts[0]
    assert "secret goal words" not in doc.prompts[0]
    # Without an extractor the last message is scored: "Done, the cat sat. Anything else?".
    assert score("bleu_score", c, {"answer": "the cat sat"}).value < 0.5


# ---------------------------------------------------------------------------------------------
# pass_rate
# ---------------------------------------------------------------------------------------------
CODE_ITEM = {"single_turn_prompt": "write add", "single_turn_metadata": {"test": "assert add(2, 3) == 5\nassert add(-1, 1) == 0"}}


def test_pass_rate_passed_and_failed():
    good = conv("write add", "Here:\n```python\ndef add(a, b):\n    return a + b\n```\nDone.", "thanks", "ok")
    bad = conv("write add", "```\ndef add(a, b):\n    return a - b\n```")
    res = score("pass_rate", good, CODE_ITEM)
    assert res.value == 1.0 and res.detail["status"] == "passed"
    res = score("pass_rate", bad, {"tests": CODE_ITEM["single_turn_metadata"]["test"]})
    assert res.value == 0.0 and res.detail["status"] == "failed"
    res = score("pass_rate", conv("write add", "no code"), CODE_ITEM)
    assert res.value == 0.0 and res.detail["status"] == "no_code"


def test_pass_rate_sandbox_error_propagates(monkeypatch):
    from collab_env.sandbox import harness

    async def broken(*a, **k):
        raise SandboxError("cannot start")

    monkeypatch.setattr(harness, "arun_tests", broken)
    with pytest.raises(SandboxError):
        score("pass_rate", conv("q", "```python\nx = 1\n```"), CODE_ITEM)
    with pytest.raises(ConfigError, match="tests"):
        score("pass_rate", conv("q", "```python\nx = 1\n```"), {})


# ---------------------------------------------------------------------------------------------
# extract -> metric
# ---------------------------------------------------------------------------------------------
def test_extract_then_accuracy_rule():
    backend = FakeJudgeLLM(['{"answer": "\\\\frac{1}{2}"}', '{"answer": "NONE"}'])
    c = conv("What is 1/2?", "Well, one half, i.e. 1 over 2.")
    assert score("accuracy_rule", c, ITEM).value == 0.0  # no box: the rule alone fails
    res = run(M.extract_then("accuracy_rule")(c, ITEM, extractor_backend=backend))
    assert res.value == 1.0 and res.detail["extracted"] == "\\frac{1}{2}" and res.usage["judge_calls"] == 1
    none = score("extract->accuracy_rule", c, ITEM, extractor=LLMJudge.preset("extract_answer", backend))
    assert none.value == 0.0
    with pytest.raises(ConfigError, match="extractor"):
        score("extract->accuracy_rule", c, ITEM)
    with pytest.raises(ConfigError, match="unknown metric"):
        get_metric("extract->nope")


def test_extract_then_pass_rate_with_explicit_extractor():
    backend = FakeJudgeLLM(['{"answer": "def add(a, b):\\n    return a + b"}'])
    metric = M.extract_then("pass_rate", LLMJudge.preset("extract_answer", backend))
    assert run(metric(conv("q", "some prose"), CODE_ITEM)).value == 1.0


@pytest.mark.parametrize("answer", ["__import__('os').getcwd()", "exit()", "9^{9^{9}}", "2^{99999}"])
def test_accuracy_rule_never_evaluates_unsafe_answers(answer):
    res = score("accuracy_rule", conv("q", f"\\boxed{{{answer}}}"), {"answer": "1"})
    assert res.value == 0.0 and "not compared symbolically" in res.detail["parse_error"]

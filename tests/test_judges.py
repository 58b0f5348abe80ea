"""LLMJudge against fake backends: typed parsing, retries, never a default score."""

from __future__ import annotations

import asyncio

import pytest

from collab_env.agents.judges import (
    ACCURACY_PROMPT,
    INTERACTIVITY_PAPER_PROMPT,
    INTERACTIVITY_PROMPT,
    JUDGE_PRESETS,
    ExtractThenScore,
    JudgeError,
    LLMJudge,
    extract_json_object,
    parse_score,
    render_transcript,
)
from collab_env.errors import CollabEnvError, ConfigError
from collab_env.types import Completion, Conversation, Message


class FakeJudgeLLM:
    """Replies from a list (in order) or a function of the prompt text; records every call."""

    def __init__(self, replies, name="fake-judge-llm"):
        self.replies = replies if callable(replies) else list(replies)
        self.calls: list[tuple[list[Conversation], dict]] = []
        self.name = name

    async def act(self, observations, **sampling):
        self.calls.append((list(observations), dict(sampling)))
        out = []
        for o in observations:
            text = self.replies("\n".join(m.content for m in o)) if callable(self.replies) else self.replies.pop(0)
            out.append(Completion(text=text, finish_reason="stop", usage={"model_calls": 1, "completion_tokens": 5}))
        return out


def run(coro):
    return asyncio.run(coro)


def simple_judge(backend, **kw):
    kw.setdefault("prompt_template", 'Rate this: {text}\nReply {{"score": <0..1>, "reason": "..."}}')
    return LLMJudge(backend, **kw)


# ---------------------------------------------------------------------------------------------
# Typed parsing
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("value", "score_type", "expected"), [
    (0.7, float, 0.7),
    ("0.7", float, 0.7),
    (1, float, 1.0),
    (3, int, 3),
    (3.0, int, 3),
    ("3", int, 3),
    (True, bool, True),
    ("yes", bool, True),
    ("Incorrect", bool, False),
    (0, bool, False),
    ("PASS", "choice", "pass"),
    ("  Good answer ", "text", "Good answer"),
])
def test_parse_score_accepts(value, score_type, expected):
    got = parse_score(value, score_type, choices=["pass", "fail"], score_range=(0, 5))
    assert got == expected and type(got) is type(expected)


@pytest.mark.parametrize(("value", "score_type"), [
    (True, float),  # a boolean is not a number
    ("high", float),
    (float("nan"), float),
    (7, float),  # out of range: refused, not clipped
    (-0.1, float),
    (2.5, int),
    ("maybe", bool),
    (0.5, bool),
    ("partial", "choice"),
    ("", "text"),
    (None, "text"),
])
def test_parse_score_refuses(value, score_type):
    with pytest.raises(ValueError):
        parse_score(value, score_type, choices=["pass", "fail"], score_range=(0, 5))


def test_extract_json_object_variants():
    assert extract_json_object('Verdict:\n```json\n{"score": 0.5, "reason": "ok",}\n```') == {"score": 0.5, "reason": "ok"}
    assert extract_json_object("{'Score': True}") == {"score": True}
    assert extract_json_object("no json here") is None
    assert extract_json_object("{broken") is None


# ---------------------------------------------------------------------------------------------
# Scoring
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("reply", "expected"), [
    ('{"reason": "fine", "score": 0.8}', 0.8),
    ('```json\n{"score": "0.25", "reason": "meh"}\n```', 0.25),
    ("After careful thought, {'score': 1, 'reason': 'perfect',} is my verdict.", 1.0),
    ("Score: 0.6\nThe answer is mostly right.", 0.6),  # no JSON: `key: value` line
    ('{"SCORE": 0}', 0.0),
])
def test_judge_reads_float_scores(reply, expected):
    backend = FakeJudgeLLM([reply])
    r = run(simple_judge(backend).score(text="hello"))
    assert r.score == expected and isinstance(r.score, float) and r.faults == 0 and r.raw == reply
    assert backend.calls[0][1] == {"temperature": 0, "max_new_tokens": 512}
    assert "Rate this: hello" in backend.calls[0][0][0][-1].content


def test_reason_and_usage():
    r = run(simple_judge(FakeJudgeLLM(['{"score": 0.5, "reason": "half right"}'])).score(text="x"))
    assert r.reason == "half right"
    assert r.usage == {"judge_calls": 1, "retries": 0, "model_calls": 1, "completion_tokens": 5}


def test_retry_after_unreadable_then_success():
    backend = FakeJudgeLLM(["I think it's pretty good!", '{"score": 1.7}', '{"score": 0.9, "reason": "ok"}'])
    r = run(simple_judge(backend).score(text="x"))
    assert r.score == 0.9 and r.faults == 2 and r.usage["retries"] == 2 and r.usage["model_calls"] == 3
    # Retries carry the bad reply and a correction, so the request differs from the first one.
    retry = backend.calls[1][0][0]
    assert retry[-2].content == "I think it's pretty good!" and "could not be read" in retry[-1].content
    assert all(kw["temperature"] == 0 for _, kw in backend.calls)


def test_never_a_default_score():
    backend = FakeJudgeLLM(lambda p: "I refuse to give a number.")
    with pytest.raises(JudgeError, match="no readable score") as err:
        run(simple_judge(backend, max_retries=2).score(text="x"))
    assert isinstance(err.value, CollabEnvError)
    assert len(backend.calls) == 3


def test_backend_errors_retried_then_judge_error():
    class Flaky:
        name = "flaky"

        def __init__(self):
            self.n = 0

        async def act(self, observations, **kw):
            self.n += 1
            if self.n == 1:
                raise TimeoutError("api timeout")
            return [Completion(text='{"score": 0.4}') for _ in observations]

    r = run(simple_judge(Flaky()).score(text="x"))
    assert r.score == 0.4 and r.faults == 1

    class Down:
        name = "down"

        async def act(self, observations, **kw):
            raise ConnectionError("down")

    with pytest.raises(JudgeError, match="down"):
        run(simple_judge(Down(), max_retries=1).score(text="x"))


def test_bool_int_choice_text_types():
    assert run(simple_judge(FakeJudgeLLM(['{"score": "yes"}']), score_type=bool, score_range=None).score(text="x")).score is True
    assert run(simple_judge(FakeJudgeLLM(['{"score": 4}']), score_type=int, score_range=(1, 5)).score(text="x")).score == 4
    r = run(simple_judge(FakeJudgeLLM(['{"score": 4.5}', '{"score": "4"}']), score_type=int,
                         score_range=(1, 5)).score(text="x"))
    assert r.score == 4 and r.faults == 1
    j = simple_judge(FakeJudgeLLM(['{"score": "B"}']), score_type="choice", choices=["a", "b", "c"], score_range=None)
    assert run(j.score(text="x")).score == "b"


def test_score_many_is_one_batched_call():
    backend = FakeJudgeLLM(lambda p: '{"score": %s}' % ("0.1" if "first" in p else "0.9"))
    rs = run(simple_judge(backend).score_many([{"text": "first"}, {"text": "second"}, {"text": "third"}]))
    assert [r.score for r in rs] == [0.1, 0.9, 0.9] and len(backend.calls) == 1 and len(backend.calls[0][0]) == 3


def test_score_many_retries_only_failures_and_raises_on_a_hole():
    backend = FakeJudgeLLM(lambda p: "nope" if "bad" in p else '{"score": 0.5}')
    with pytest.raises(JudgeError, match="1 of 2"):
        run(simple_judge(backend, max_retries=1).score_many([{"text": "good"}, {"text": "bad"}]))
    assert [len(obs) for obs, _ in backend.calls] == [2, 1]


def test_fields_are_checked_and_conversations_rendered():
    judge = LLMJudge(FakeJudgeLLM(['{"score": 0.5}']), prompt_template=INTERACTIVITY_PAPER_PROMPT)
    with pytest.raises(ConfigError, match="missing"):
        run(judge.score())
    with pytest.raises(ConfigError, match="unknown"):
        run(judge.score(conversation="x", extra=1))
    conv = Conversation((
        Message(role="system", content="SECRET SYSTEM"),
        Message(role="system", content="HIDDEN GOAL", audience=("user",)),
        Message(role="user", content="Help me", author="user"),
        Message(role="assistant", content="With what?", author="assistant"),
    ))
    prompt = judge.build_prompt(conversation=conv)[-1].content
    assert "**User**: Help me" in prompt and "**Assistant**: With what?" in prompt
    assert "SECRET" not in prompt and "HIDDEN GOAL" not in prompt
    assert render_transcript(Conversation()) == "(no messages yet)"


def test_bad_configuration():
    b = FakeJudgeLLM([])
    with pytest.raises(ConfigError, match="score_type"):
        LLMJudge(b, prompt_template="{x}", score_type=str)
    with pytest.raises(ConfigError, match="choices"):
        LLMJudge(b, prompt_template="{x}", score_type="choice")
    with pytest.raises(ConfigError, match="literal braces"):
        LLMJudge(b, prompt_template='reply {"score": 1}')
    with pytest.raises(ConfigError, match="unknown judge preset"):
        LLMJudge.preset("acuracy", b)


# ---------------------------------------------------------------------------------------------
# Shipped rubrics
# ---------------------------------------------------------------------------------------------
def test_presets_build_and_name_their_fields():
    b = FakeJudgeLLM([])
    assert LLMJudge.preset("accuracy", b).fields == ["problem", "conversation", "reference"]
    assert LLMJudge.preset("interactivity", b).fields == ["conversation"]
    assert LLMJudge.preset("interactivity_paper", b).fields == ["conversation"]
    assert set(JUDGE_PRESETS) >= {"accuracy", "interactivity", "interactivity_paper", "extract_answer", "answer_match"}
    for t in (ACCURACY_PROMPT, INTERACTIVITY_PROMPT, INTERACTIVITY_PAPER_PROMPT):
        assert '"reason"' in t.format(problem="p", conversation="c", reference="r")


def test_interactivity_is_the_mean_of_three_anchored_parts():
    reply = '{"reason": "asked well", "understanding": 1, "clarification": 0.7, "suggestions": 0.3}'
    r = run(LLMJudge.preset("interactivity", FakeJudgeLLM([reply])).score(conversation="..."))
    assert r.score == pytest.approx(2 / 3)
    assert r.components == {"understanding": 1.0, "clarification": 0.7, "suggestions": 0.3}
    # A missing part is unreadable, not a zero.
    backend = FakeJudgeLLM(lambda p: '{"understanding": 1, "clarification": 1}')
    with pytest.raises(JudgeError, match="suggestions"):
        run(LLMJudge.preset("interactivity", backend, max_retries=0).score(conversation="..."))


def test_accuracy_binary():
    r = run(LLMJudge.preset("accuracy", FakeJudgeLLM(['{"reason": "same", "score": true}']))
            .score(problem="p", conversation="c", reference="25"))
    assert r.score is True


def test_extract_then_score():
    def reply(prompt):
        if "Copy out the assistant's final answer" in prompt:
            return '{"answer": "25"}'
        same = "<answer>\n25\n</answer>" in prompt and "<reference>\n25\n</reference>" in prompt
        return '{"score": %s}' % ("true" if same else "false")

    backend = FakeJudgeLLM(reply)
    ets = ExtractThenScore(LLMJudge.preset("extract_answer", backend), LLMJudge.preset("answer_match", backend))
    assert ets.fields == ["problem", "conversation", "reference"]
    rs = run(ets.score_many([dict(problem="p", conversation="c", reference="25"),
                             dict(problem="p", conversation="c", reference="26")]))
    assert [r.score for r in rs] == [True, False]
    assert rs[0].meta["answer"] == "25" and rs[0].usage["model_calls"] == 2
    assert len(backend.calls) == 2  # one batch per step


# ---------------------------------------------------------------------------------------------
# Prefilled replies (small local models)
# ---------------------------------------------------------------------------------------------
class PrefillJudgeLLM(FakeJudgeLLM):
    supports_prefill = True


def test_prefill_is_written_for_backends_that_continue_it_and_parsed_with_the_reply():
    backend = PrefillJudgeLLM([" 0.25}"])
    judge = simple_judge(backend, response_prefix='{"score":')
    res = run(judge.score(text="x"))
    assert res.score == 0.25 and res.raw == '{"score": 0.25}'
    sent = backend.calls[0][0][0]
    assert sent[-1].role == "assistant" and sent[-1].content == '{"score":' and sent[-1].meta["prefill"]


def test_prefill_is_not_sent_to_backends_without_support():
    backend = FakeJudgeLLM(['{"score": 0.5}'])
    judge = simple_judge(backend, response_prefix='{"score":')
    assert judge.prefill is None
    assert run(judge.score(text="x")).score == 0.5
    assert backend.calls[0][0][0][-1].role == "user"


def test_preset_prefill_uses_the_first_score_field():
    judge = LLMJudge.preset("interactivity", PrefillJudgeLLM([' 1, "clarification": 0.7, "suggestions": 0.3}']),
                            prefill=True)
    res = run(judge.score(conversation=Conversation.from_chat([{"role": "user", "content": "hi"}])))
    assert res.score == pytest.approx((1 + 0.7 + 0.3) / 3)
    with pytest.raises(ConfigError, match="response_prefix"):
        simple_judge(FakeJudgeLLM([]), response_prefix="")


def test_the_format_template_is_not_a_verdict():
    judge = simple_judge(FakeJudgeLLM(['{"score": true or false}', '{"score": 0.5}']), score_type=bool,
                         score_range=None, max_retries=0)
    with pytest.raises(CollabEnvError, match="no readable score"):
        run(judge.score(text="x"))
    assert simple_judge(FakeJudgeLLM(["Score: 0.8\nbecause"])).parse("Score: 0.8\nbecause")[0] == 0.8

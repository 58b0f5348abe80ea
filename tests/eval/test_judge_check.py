"""collab_env.eval.judge_check (issue 45): a judge is scored on rule-labelled conversations and
refused below the bar."""

from __future__ import annotations

import math

import pytest

from collab_env.agents.judges import LLMJudge
from collab_env.errors import ConfigError, JudgeError, JudgeValidityError
from collab_env.eval import judge_check
from collab_env.eval.judge_check import auc, calibration, check_judge, judged_conversations, validity_table
from collab_env.testing import judge_conversations as testing_convs
from collab_env.testing.judge_conversations import ReferenceReadingJudge
from collab_env.testing.judge_injection import FenceReadingJudge


@pytest.fixture(scope="module")
def convs():
    return judged_conversations(12)


def test_auc_and_calibration_by_hand():
    assert auc([0.9, 0.8, 0.1], [True, True, False]) == 1.0
    assert auc([0.1, 0.9], [True, False]) == 0.0
    assert auc([0.5, 0.5], [True, False]) == 0.5
    assert math.isnan(auc([0.3], [True]))
    cal = calibration([1.0, 1.0, 0.0, 0.0], [True, False, False, False])
    # bin [0.9, 1]: p 1.0, share 0.5 (gap 0.5, weight 1/2); bin [0, 0.1]: p 0, share 0 (gap 0)
    assert cal["ece"] == pytest.approx(0.25) and cal["brier"] == pytest.approx(0.25)
    assert [b["n"] for b in cal["bins"]] == [2, 2]


def test_the_labels_are_the_envs_rule(convs):
    assert [c.kind for c in convs[:4]] == list(judge_check.KINDS)
    assert {c.kind for c in convs if c.correct} == {"ask-correct", "direct-correct"}
    assert {c.kind for c in convs if not c.correct} == {"ask-wrong", "direct-wrong"}
    # the library holds them: the testing layer keeps only its judge double (one import path)
    assert not hasattr(testing_convs, "judged_conversations") and not hasattr(testing_convs, "AskThenMiscount")


def test_a_judge_that_reads_the_answer_passes(convs):
    v = check_judge(LLMJudge.preset("accuracy", ReferenceReadingJudge()), convs)
    assert v.passed and v.auc == 1.0 and v.agreement == 1.0 and v.ece == 0.0 and v.errors == 0
    assert v.items == 12 and v.correct == 6 and v.reason == ""
    v.require()  # no error
    assert "passes" in validity_table([v])


def test_a_judge_that_cannot_tell_is_refused(convs):
    v = check_judge(LLMJudge.preset("accuracy", FenceReadingJudge()), convs)
    assert not v.passed and v.auc == 0.5 and v.probability == "p_true"
    assert "AUC 0.50 < 0.8" in v.reason
    with pytest.raises(JudgeValidityError, match="interactivity column refused: judge .* fails the validity check"):
        v.require("interactivity column")
    assert issubclass(JudgeValidityError, JudgeError)
    # the bar is stated in the result and is what decides: at AUC >= 0.5, ECE <= 1 the double clears it
    low = check_judge(LLMJudge.preset("accuracy", FenceReadingJudge()), convs, min_auc=0.5, max_ece=1.0)
    assert low.passed and (low.min_auc, low.max_ece) == (0.5, 1.0)


def test_bad_arguments_are_one_line_errors(convs):
    with pytest.raises(ConfigError, match="min_auc"):
        check_judge(LLMJudge.preset("accuracy", ReferenceReadingJudge()), convs, min_auc=0.2)
    with pytest.raises(ConfigError, match="score_many"):
        check_judge(object(), convs)
    with pytest.raises(ConfigError, match="correct and wrong"):
        check_judge(LLMJudge.preset("accuracy", ReferenceReadingJudge()), [c for c in convs if c.correct])

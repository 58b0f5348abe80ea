"""The collapse monitor: completion statistics, the thresholds, the CollapseWarning raised from
the shared training log (flush_log), and the statistics a real learner step logs."""

import math
import warnings
from types import SimpleNamespace

import pytest

from collab_env.adapters.common.collapse import (
    DEFAULT_THRESHOLDS,
    CollapseThresholds,
    CollapseWarning,
    check_collapse,
    collapse_reasons,
    completion_stats,
)
from collab_env.adapters.common.logging import MetricsLogger
from collab_env.adapters.common.loop import RunState, flush_log
from collab_env.errors import ConfigError

EOS, PAD = 2, 0


def test_completion_stats_by_hand():
    # prompt A: [5, 6, EOS], [EOS], [5, 6, EOS] (a repeat), [7]; prompt B: [5, 6, EOS] (not a
    # repeat: another prompt), [PAD, EOS] (empty).
    comps = [[5, 6, EOS], [EOS], [5, 6, EOS], [7], [5, 6, EOS], [PAD, EOS]]
    groups = ["A", "A", "A", "A", "B", "B"]
    s = completion_stats(comps, groups, special_ids=(EOS, PAD))
    # visible lengths 2, 0, 2, 1, 2, 0 -> 7 / 6
    assert s["collapse/completion_length"] == pytest.approx(7 / 6, abs=1e-12)
    assert s["collapse/empty_share"] == pytest.approx(2 / 6, abs=1e-12)
    assert s["collapse/duplicate_share"] == pytest.approx(1 / 6, abs=1e-12)
    # one group: the B copy of [5, 6] repeats too, and the second empty repeats the first
    s1 = completion_stats(comps, None, special_ids=(EOS, PAD))
    assert s1["collapse/duplicate_share"] == pytest.approx(3 / 6, abs=1e-12)
    assert completion_stats([], None) == {}
    with pytest.raises(ConfigError):
        completion_stats([[1]], ["a", "b"])


def test_thresholds_validate_and_reasons_name_what_crossed():
    with pytest.raises(ConfigError):
        CollapseThresholds(min_length=-1)
    with pytest.raises(ConfigError):
        CollapseThresholds(max_empty_share=1.5)
    t = CollapseThresholds(min_length=8, max_empty_share=0.25, max_duplicate_share=0.5)
    line = {"collapse/completion_length": 1.0, "collapse/empty_share": 0.5, "collapse/duplicate_share": 0.75}
    reasons = collapse_reasons(line, t)
    assert len(reasons) == 3 and "length" in reasons[0] and "empty" in reasons[1] and "duplicate" in reasons[2]
    # at the thresholds exactly: not crossed
    assert collapse_reasons({"collapse/completion_length": 8.0, "collapse/empty_share": 0.25,
                             "collapse/duplicate_share": 0.5}, t) == []
    # NaN / missing statistics are not judged; a learner's plain completion_length is read
    assert collapse_reasons({"collapse/completion_length": math.nan}, t) == []
    assert collapse_reasons({"completion_length": 3.0}, t) == ["mean completion length 3.00 tokens < 8"]
    assert check_collapse({"loss": 1.0}) == {}


class _FakeLearner:
    def __init__(self, tmp_path, thresholds=None):
        self.state = RunState(env_step=40, items_done=10)
        self.logger = MetricsLogger(tmp_path)
        if thresholds is not None:
            self.collapse_thresholds = thresholds


def _collapsing_window():
    # Two steps whose completions are the EOS token alone (the 1-token collapse), 4 per prompt.
    return [completion_stats([[EOS]] * 4, [(1, 2)] * 4, special_ids=(EOS,)) for _ in range(2)]


def test_flush_log_warns_on_collapsing_completions(tmp_path):
    learner = _FakeLearner(tmp_path)
    learner.state.pending = [{**s, "loss": 0.1} for s in _collapsing_window()]
    with pytest.warns(CollapseWarning, match=r"collapsing at env_step 40: mean completion length 0\.00"):
        record = flush_log(learner)
    assert record["collapse/flagged"] == 1.0
    assert record["collapse/empty_share"] == 1.0 and record["collapse/duplicate_share"] == 0.75
    assert learner.logger.records[-1]["collapse/flagged"] == 1.0   # logged, not only warned


def test_flush_log_does_not_warn_on_a_healthy_window(tmp_path):
    learner = _FakeLearner(tmp_path, CollapseThresholds(min_length=8))
    comps = [[10 + i, 20 + i, 30, 31, 32, 33, 34, 35, 36, EOS] for i in range(4)]   # 9 visible, distinct
    learner.state.pending = [completion_stats(comps, [(1,)] * 4, special_ids=(EOS,))]
    with warnings.catch_warnings():
        warnings.simplefilter("error", CollapseWarning)
        record = flush_log(learner)
    assert record["collapse/flagged"] == 0.0
    assert record["collapse/completion_length"] == 9.0


def test_learner_thresholds_are_used(tmp_path):
    learner = _FakeLearner(tmp_path, CollapseThresholds(min_length=10))
    learner.state.pending = [{"completion_length": 9.0}]
    with pytest.warns(CollapseWarning, match="9.00 tokens < 10"):
        assert flush_log(learner)["collapse/flagged"] == 1.0
    assert DEFAULT_THRESHOLDS.min_length == 2.0


def test_a_real_learner_step_logs_the_statistics_and_flags_by_its_thresholds(tiny_dir, tmp_path):
    """MAGRPO on the tiny model logs the collapse statistics through the shared update and log;
    with a length threshold no 4-token completion can reach, the step is flagged."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from collab_env.adapters.magrpo import MAGRPOConfig, MAGRPOTrainer
    from collab_env.tasks.cooperative import formatters, length_ratio_rows
    from collab_env.testing.tiny_model import load_tiny_chat_model

    model, tok = load_tiny_chat_model(tiny_dir)
    args = MAGRPOConfig(num_agents=1, num_generations=4, max_new_tokens=4, eval_interval=0, logging_steps=1,
                        learning_rate=1e-3, output_dir=str(tmp_path / "out"), plot=False)
    trainer = MAGRPOTrainer(agent_model=model, tokenizer=tok, num_agents=1, formatters=[formatters[0]],
                            reward_func=lambda completions, **_: [0.0] * len(completions),
                            train_dataset=length_ratio_rows("train")[:1], args=args)
    trainer.collapse_thresholds = CollapseThresholds(min_length=1000)
    with pytest.warns(CollapseWarning, match="< 1000"):
        out = trainer.train()
    assert out["collapse/flagged"] == 1.0
    assert 0.0 <= out["collapse/completion_length"] <= 4.0        # at most max_new_tokens visible
    assert out["collapse/completion_length"] <= out["completion_length"]  # special tokens not counted
    for key in ("collapse/empty_share", "collapse/duplicate_share"):
        assert out[key] in {0.0, 0.25, 0.5, 0.75, 1.0}             # shares of 4 completions


def test_policy_stats_from_samples_drop_special_tokens():
    from collab_env.adapters.common.tree_learner import sample_collapse_stats

    pm = SimpleNamespace(tokenizer=SimpleNamespace(all_special_ids=[EOS]), pad_id=PAD)
    samples = [([1, 2], (EOS,), 0.0, 0), ([1, 2], (PAD, EOS), 0.0, 0), ([1, 2], (5, EOS), 0.0, 0),
               ([3], (EOS,), 0.0, 0)]
    s = sample_collapse_stats(pm, samples)
    assert s == {"collapse/completion_length": 0.25, "collapse/empty_share": 0.75,
                 "collapse/duplicate_share": 0.25}
    with pytest.warns(CollapseWarning):
        check_collapse(s)

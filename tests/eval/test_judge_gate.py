"""Issue 45, part 6: the eval reports a judged column only from a judge that passed its validity
check; the verdict is kept per judge identity; a failing judge's raw values stay in the file,
marked invalid; ``--no-judge-check`` skips the check and says so."""

from __future__ import annotations

import json

import pytest

from collab_env.eval import evaluate, judge_check

PASSES = "collab_env.testing.judge_conversations:ReferenceReadingJudge"
#: Never reads the conversation (it obeys score claims, and there are none): cannot tell right
#: from wrong, AUC 0.5.
CANNOT_TELL = "collab_env.testing.judge_injection:FenceReadingJudge"
REFUSAL = "judge failed validity check (AUC 0.500 < 0.8; calibration error 0.500 > 0.25)"


@pytest.fixture(autouse=True)
def kept_verdicts(tmp_path, monkeypatch):
    """Kept verdicts in a folder of the test's own (the user cache stays untouched)."""
    folder = tmp_path / "judge-verdicts"
    monkeypatch.setattr(judge_check, "CACHE_DIR", folder)
    return folder


def run(judge, out, **kw):
    return evaluate("hidden-facts", {"assistant": "ask-then-answer"}, num_episodes=4, out=out, progress=False,
                    env_kwargs={"reward": "conversation", "reward_kwargs": {"judge": judge}}, **kw)


def test_a_judge_that_cannot_tell_has_its_judged_columns_refused(tmp_path):
    res = run(CANNOT_TELL, tmp_path / "bad.jsonl")
    table = res.summary_table()
    check = res.judge_check
    assert check.status == "invalid" and check.columns == ("accuracy", "conversation")
    assert check.validity.auc == 0.5 and not check.validity.passed
    # the return (the judged reward's total) and the judged components: the refusal, no number
    row = table.splitlines()[3]
    assert REFUSAL in row and row.count("refused") == 3  # the return: its text; std, sem, success: refused
    comps = next(x for x in table.splitlines() if x.startswith("assistant reward components"))
    assert comps.endswith(f"; accuracy, conversation: {REFUSAL}")
    assert "env 1.000" in comps  # the env's own rule-based accuracy is not judged: still a number
    assert "judged columns (accuracy, conversation) refused" in table
    # the raw per-episode values stay in the file, each line marked invalid with the verdict
    recs = [json.loads(x) for x in (tmp_path / "bad.jsonl").read_text().splitlines()]
    assert len(recs) == 4
    for r in recs:
        assert "accuracy" in r["components"]["assistant"] and "conversation" in r["components"]["assistant"]
        assert r["judge_check"]["values"] == "invalid" and r["judge_check"]["validity"]["auc"] == 0.5
        assert r["judge_check"]["columns"] == ["accuracy", "conversation"] and not r["judge_check"]["skipped"]


def test_a_judge_that_passes_shows_its_numbers(tmp_path):
    res = run(PASSES, tmp_path / "good.jsonl")
    table = res.summary_table()
    assert res.judge_check.status == "valid" and res.judge_check.validity.auc == 1.0
    assert "refused" not in table and "judge failed" not in table
    assert "accuracy 1.000, conversation 1.000" in table and "passed the validity check (AUC 1.000 >= 0.8" in table
    assert table.splitlines()[3].split()[3] == "1.000"  # the return column
    rec = json.loads((tmp_path / "good.jsonl").read_text().splitlines()[0])
    assert rec["judge_check"]["values"] == "valid"


def test_the_verdict_is_kept_per_judge_identity(tmp_path, kept_verdicts, monkeypatch):
    calls = []
    real = judge_check.check_judge
    monkeypatch.setattr(judge_check, "check_judge", lambda judge, **kw: calls.append(judge) or real(judge, **kw))
    first = run(PASSES, tmp_path / "a.jsonl").judge_check
    again = run(PASSES, tmp_path / "b.jsonl").judge_check
    assert len(calls) == 1 and not first.kept and again.kept  # checked once, then read back
    assert again.identity == first.identity and again.validity == first.validity
    assert len(list(kept_verdicts.glob("*.json"))) == 1
    # another judge is checked again; so is the same backend with other judge settings
    other = run(CANNOT_TELL, tmp_path / "c.jsonl").judge_check
    assert len(calls) == 2 and not other.kept and other.status == "invalid"
    changed = evaluate("hidden-facts", {"assistant": "ask-then-answer"}, num_episodes=1, progress=False,
                       env_kwargs={"reward": "conversation",
                                   "reward_kwargs": {"judge": PASSES, "judge_kwargs": {"max_new_tokens": 64}}})
    assert len(calls) == 3 and not changed.judge_check.kept
    assert changed.judge_check.identity["settings"]["max_new_tokens"] == 64
    assert len(list(kept_verdicts.glob("*.json"))) == 3
    # a damaged kept verdict only costs a new check
    for f in kept_verdicts.glob("*.json"):
        f.write_text("{not json")
    assert not run(PASSES, tmp_path / "d.jsonl").judge_check.kept and len(calls) == 4


def test_skipping_the_check_reports_unchecked_values_and_records_the_skip(tmp_path, kept_verdicts):
    res = run(CANNOT_TELL, tmp_path / "skip.jsonl", judge_check=False)
    table = res.summary_table()
    assert res.judge_check.skipped and res.judge_check.status == "unchecked"
    assert "refused" not in table and "UNCHECKED: the judge validity check was skipped" in table
    assert not kept_verdicts.exists()  # nothing was judged
    rec = json.loads((tmp_path / "skip.jsonl").read_text().splitlines()[0])
    assert rec["judge_check"]["skipped"] is True and rec["judge_check"]["values"] == "unchecked"
    assert rec["judge_check"]["validity"] is None


def test_a_rule_scored_reward_has_no_judge_check(tmp_path):
    res = evaluate("hidden-facts", {"assistant": "ask-then-answer"}, num_episodes=2, progress=False,
                   env_kwargs={"reward": "conversation",
                               "reward_kwargs": {"weights": {"accuracy_rule": 1.0, "token_amount": -1e-4}}})
    assert res.judge_check is None and "validity" not in res.summary_table()
    assert judge_check.judged_metrics({"accuracy_rule": 1, "interactivity": 1, "accuracy": 0,
                                       "extract->accuracy_rule": 1, "token_amount": -1}) == [
        "interactivity", "extract->accuracy_rule"]


def test_the_cli_refuses_a_failing_judge_and_shows_a_passing_one(tmp_path, capsys):
    from collab_env.cli import main

    common = ["eval", "hidden-facts", "--episodes", "3", "--no-progress", "--policy", "assistant=ask-then-answer",
              "--reward", "conversation"]
    assert main([*common, "--judge", CANNOT_TELL, "--out", str(tmp_path / "bad.jsonl")]) == 0
    out = capsys.readouterr().out
    assert REFUSAL in out and "refused" in out
    assert main([*common, "--judge", CANNOT_TELL, "--no-judge-check", "--out", str(tmp_path / "skip.jsonl")]) == 0
    out = capsys.readouterr().out
    assert "judge failed" not in out and "UNCHECKED" in out
    assert json.loads((tmp_path / "skip.jsonl").read_text().splitlines()[0])["judge_check"]["skipped"] is True
    assert main([*common, "--judge", PASSES]) == 0
    out = capsys.readouterr().out
    assert "judge failed" not in out and "passed the validity check" in out

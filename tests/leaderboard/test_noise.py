"""Rows that carry their own noise (issue 24): the flip rate and the minimum detectable difference
of :func:`collab_env.leaderboard.stats.noise_statistics`, checked against hand computations, and
paired comparisons of real seeded entries shown as "not distinguishable" when the interval
includes 0."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest

from collab_env.leaderboard.stats import MDD_Z, noise_statistics

REPO = Path(__file__).resolve().parents[2]
SEEDED = REPO / "benchmarks" / "leaderboard"


def _records(outcomes: dict[int, list[int]]) -> list[dict]:
    """Episode records whose assistant return is 1 (success) or 0, per task and trial."""
    out, eid = [], 0
    for task, trials in outcomes.items():
        for ok in trials:
            out.append({"episode_id": eid, "index": task, "seed": eid, "returns": {"assistant": float(ok)}, "turns": []})
            eid += 1
    return out


def test_flip_rate_counts_the_tasks_whose_verdict_differs_across_trials():
    recs = _records({0: [1, 1, 1, 1], 1: [0, 0, 0, 0], 2: [1, 0, 1, 1], 3: [0, 0, 0, 1]})
    st = noise_statistics(recs, submitted=["assistant"], threshold=1.0)
    assert st["trials"] == 4 and st["flip_tasks"] == 4 and st["flip_rate"] == 0.5
    # One trial per task: no flip rate (not 0: nothing could flip).
    st = noise_statistics(_records({0: [1], 1: [0]}), submitted=["assistant"], threshold=1.0)
    assert st["flip_rate"] is None and st["flip_tasks"] == 0 and st["trials"] == 1


def test_mdd_is_the_two_sample_formula_over_tasks_with_its_floor():
    outcomes = {0: [1, 1], 1: [0, 0], 2: [1, 0], 3: [0, 0], 4: [1, 1]}
    st = noise_statistics(_records(outcomes), submitted=["assistant"], threshold=1.0)
    rates = [1.0, 0.0, 0.5, 0.0, 1.0]
    mean = sum(rates) / 5
    var = sum((r - mean) ** 2 for r in rates) / 4  # over tasks, ddof 1: above the floor here
    assert st["mdd"] == pytest.approx(MDD_Z * math.sqrt(2 * var / 5), rel=1e-12)
    assert MDD_Z == pytest.approx(2.8016, abs=1e-4)  # z_0.975 + z_0.8
    # Every task succeeds on every trial: the task variance is 0, so the Agresti-Coull floor
    # (S + 2) / (N + 4) at 2 trials per task gives the MDD, never 0 from 25 tasks.
    st = noise_statistics(_records({t: [1, 1] for t in range(25)}), submitted=["assistant"], threshold=1.0)
    p = 52 / 54
    assert st["mdd"] == pytest.approx(MDD_Z * math.sqrt(2 * (p * (1 - p) / 2) / 25), rel=1e-12) and st["mdd"] > 0
    # More tasks, smaller MDD (same per-task noise).
    big = noise_statistics(_records({t: [t % 2, t % 2] for t in range(100)}), submitted=["assistant"], threshold=1.0)
    small = noise_statistics(_records({t: [t % 2, t % 2] for t in range(10)}), submitted=["assistant"], threshold=1.0)
    assert big["mdd"] < small["mdd"]
    assert noise_statistics(_records({0: [1, 0]}), submitted=["assistant"], threshold=1.0)["mdd"] is None


def test_real_entries_whose_interval_includes_zero_are_not_distinguishable(tmp_path):
    """On hidden-facts-easy@v2, the seeded answer-at-once reference (success 0.04: one of 25 items
    it can answer without asking) and the embedded model (0.0) differ by an interval that includes
    0: the board and the page say "not distinguishable"; ask-then-answer against answer-at-once is
    distinguishable. Every row carries trials, flip rate, MDD and the user simulator's identity."""
    from collab_env.leaderboard import board_data
    from collab_env.leaderboard.page import render_page

    for name in ("ask-then-answer", "answer-at-once", "embedded"):
        shutil.copytree(SEEDED / "hidden-facts-easy" / "v2" / name, tmp_path / name)
    data = board_data(tmp_path, num_boot=500)
    assert all(e["verified"] for e in data["entries"])
    comps = {(c["a"].split("/")[1], c["b"].split("/")[1]): c for c in data["comparisons"]}
    assert set(comps) == {("ask-then-answer", "answer-at-once"), ("answer-at-once", "embedded")}
    close = comps[("answer-at-once", "embedded")]
    assert close["lo"] <= 0.0 <= close["hi"] and close["diff"] == pytest.approx(0.04)
    assert close["distinguishable"] is False
    far = comps[("ask-then-answer", "answer-at-once")]
    assert far["lo"] > 0 and far["distinguishable"] is True
    for e in data["entries"]:
        assert e["trials"] == 4 and e["flip_tasks"] == 25 and e["flip_rate"] is not None and e["mdd"] > 0
        assert e["simulator"] == {"user": "user: hidden-facts-user (scripted, collab_env "
                                          f"{__import__('collab_env').__version__})", "judge": None}
    text = render_page(data)
    assert text.count("not distinguishable (interval includes 0)") == 1
    assert "answer-at-once higher" not in text and "ask-then-answer higher" in text


def test_every_seeded_row_carries_its_noise_and_simulator():
    """The seeded board (unverified here: the numbers do not depend on it): every entry has at
    least 2 trials per task, a flip rate, an MDD and the pinned identity of its track's players,
    the embedded model named by the SHA-256 of its weights where it plays the user."""
    from collab_env.leaderboard import board_data

    data = board_data(SEEDED, verify=False, num_boot=50)
    assert len(data["entries"]) >= 30
    for e in data["entries"]:
        assert not e["failed"], e["id"]
        assert e["trials"] >= 2 and e["flip_rate"] is not None and e["mdd"] is not None and e["mdd"] > 0, e["id"]
        assert e["simulator"]["user"], e["id"]
    real = {e["track"] for e in data["entries"] if not e["model"].startswith("scripted reference")}
    assert len(real) >= 8, sorted(real)  # issue 24: at least 8 tracks carry a real-model entry


def test_a_standard_entry_needs_four_trials_per_task(tmp_path):
    """Every current track plays >= 4 trials per task; on a track with fewer, ``run`` makes the
    entry custom and ``verify`` refuses one marked standard (a hostile submitter flips the kind
    and rewrites the digests)."""
    import dataclasses
    import json

    from collab_env.leaderboard import run_submission
    from collab_env.leaderboard.submission import submission_files
    from collab_env.leaderboard.tracks import MIN_STANDARD_TRIALS, builtin_tracks, get_track, track_status
    from collab_env.leaderboard.verify import verify_submission

    tracks = builtin_tracks()
    few = [tid for tid, t in tracks.items() if track_status(t, tracks) == "current" and t.trials < MIN_STANDARD_TRIALS]
    assert few == [] and MIN_STANDARD_TRIALS == 4
    two = dataclasses.replace(get_track("hidden-facts-easy@v2"), trials=2, k=2)
    folder = run_submission(two, {"assistant": "ask-then-answer"}, out=tmp_path / "e", name="e", progress=False).parent
    sub = json.loads((folder / "submission.json").read_text())
    assert sub["kind"] == "custom" and any("2 trials per task" in r for r in sub["custom_reasons"])
    sub.update(kind="standard", custom_reasons=[])
    sub["files"] = submission_files(folder)
    (folder / "submission.json").write_text(json.dumps(sub))
    v = verify_submission(folder, track=two)
    assert not v.ok and any("a standard entry needs a track with at least 4" in p for p in v.problems), v.problems

"""The one progress display (collab_env/_progress.py): a bar on a terminal; with ``lines=True``,
plain lines when stderr is redirected, so a long run in a log or CI job is never silent: a
heartbeat thread prints a line at least every interval while nothing finishes (the interval is
``$COLLAB_ENV_PROGRESS_INTERVAL``, 60 s by default; these tests set it to a fraction of a second).
Runs say what runs (env and row), what a resume kept and where the outputs went."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from collab_env import _progress
from collab_env._progress import INTERVAL_ENV, LineProgress, progress_bar, progress_interval
from collab_env.errors import ConfigError
from collab_env.eval import compare
from collab_env.registry import latest_spec

REPO = Path(__file__).resolve().parents[1]
#: the id "hidden-facts" plays (its latest version), as the progress labels name it
HF = latest_spec("hidden-facts").id


def test_lines_every_tenth_and_at_the_end():
    out = io.StringIO()
    p = LineProgress(25, "eval x", file=out)
    for i in range(25):
        if i == 20:
            p.set_postfix(failed=1)
        p.update(1)
    p.close()
    lines = out.getvalue().splitlines()
    counts = [line.split(": ")[1].split(" ")[0] for line in lines]
    assert counts == [f"{n}/25" for n in (2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 25)]
    assert lines[-1].startswith("eval x: 25/25 ep (100%, failed 1) ")
    assert lines[0].startswith("eval x: 2/25 ep (8%) ") and lines[0].endswith(" s")


def test_a_resumed_or_unknown_total_and_no_repeat_on_close(monkeypatch):
    out = io.StringIO()
    p = LineProgress(10, "run", initial=5, file=out)
    p.update(1)
    p.close()
    p.close()
    assert out.getvalue().splitlines()[0].startswith("run: 6/10 ep (60%)") and len(out.getvalue().splitlines()) == 1
    out = io.StringIO()
    now = [0.0]
    monkeypatch.setattr(_progress.time, "monotonic", lambda: now[0])
    p = LineProgress(None, "stream", file=out, interval=3600.0)  # the heartbeat sleeps through this test
    now[0] = 10.0
    p.update(1)  # 10 s: nothing yet
    now[0] = 3601.0
    p.update(1)  # past the interval: a line
    p.close()    # that count was just printed: no second line
    assert out.getvalue().splitlines() == ["stream: 2 ep 60.0 min"]


def test_which_display(monkeypatch):
    monkeypatch.setattr(_progress.sys.stderr, "isatty", lambda: False, raising=False)
    assert progress_bar(10, "x") is None                       # default: a terminal only
    assert isinstance(progress_bar(10, "x", lines=True), LineProgress)
    assert progress_bar(10, "x", lines=True, show=False) is None
    bar = progress_bar(10, "x", show=True)                     # forced on: a tqdm bar
    assert not isinstance(bar, LineProgress) and hasattr(bar, "refresh")
    bar.close()


# -- the heartbeat -------------------------------------------------------------------------------


def test_the_heartbeat_prints_while_nothing_finishes_and_stops_at_close():
    out = io.StringIO()
    p = LineProgress(4, "slow", file=out, interval=0.2)
    time.sleep(0.75)  # no update at all: the thread alone prints
    beats = out.getvalue().splitlines()
    assert len(beats) >= 2 and all(b.startswith("slow: 0/4 ep (0%) ") for b in beats), beats
    p.update(1)
    p.close()
    after = len(out.getvalue().splitlines())
    time.sleep(0.5)
    assert len(out.getvalue().splitlines()) == after  # closed: silent


def test_the_interval_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(INTERVAL_ENV, raising=False)
    assert progress_interval() == 60.0
    monkeypatch.setenv(INTERVAL_ENV, "0.5")
    assert progress_interval() == 0.5 and LineProgress(None, "x", file=io.StringIO()).interval == 0.5
    for bad in ("0", "-1", "soon", "inf"):
        monkeypatch.setenv(INTERVAL_ENV, bad)
        with pytest.raises(ConfigError, match=INTERVAL_ENV):
            progress_interval()


# -- what a run says: labels, resume, closing line -------------------------------------------------


def _eval(out: Path, episodes: int, *extra: str, delay: str = "0") -> subprocess.CompletedProcess:
    """``collab-env eval`` in a child process with stdout and stderr redirected to pipes (no
    terminal), the assistant blocking the event loop ``delay`` seconds before each reply (as a
    local model's generate call does), the heartbeat at 0.3 s."""
    import os

    env = {**os.environ, "PYTHONPATH": str(REPO), "COLLAB_TEST_DELAY": delay, INTERVAL_ENV: "0.3"}
    cmd = [sys.executable, "-m", "collab_env.cli", "eval", "hidden-facts", "--policy",
           "assistant=tests._eval_helpers:BlockingAskThenAnswer", "--episodes", str(episodes), "--concurrency", "1",
           "--out", str(out), *extra]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def test_a_redirected_eval_beats_while_an_episode_runs_then_resumes_and_says_where(tmp_path):
    out = tmp_path / "r.jsonl"
    label = f"eval {HF} assistant=ask-then-answer"
    # One episode, two replies of 1 s each that block the event loop: the first episode ends after
    # about 2 s, and the heartbeat (0.3 s) prints the 0/1 count several times before it.
    res = _eval(out, 1, delay="1")
    assert res.returncode == 0, res.stderr
    lines = res.stderr.splitlines()
    beats = [ln for ln in lines if ln.startswith(f"{label}: 0/1 ep (0%) ")]
    assert len(beats) >= 3, res.stderr
    assert lines[-1] == f"{label}: finished, 1/1 episodes; episode records in {out}"
    # Resumed with more episodes: it says what it kept, runs the rest, says where they are.
    res = _eval(out, 3, "--resume")
    assert res.returncode == 0, res.stderr
    lines = res.stderr.splitlines()
    assert lines[0] == f"{label}: resumed: kept 1 of 3 episodes from {out}"
    assert lines[-1] == f"{label}: finished, 3/3 episodes; episode records in {out}"
    assert sorted(json.loads(x)["episode_id"] for x in out.read_text().splitlines()) == [0, 1, 2]


def test_each_row_of_a_comparison_is_labelled_with_its_own_name(capsys):
    compare("hidden-facts", {"ask": {"assistant": "ask-then-answer"}, "once": {"assistant": "answer-at-once"}},
            num_episodes=2)
    err = capsys.readouterr().err.splitlines()
    for row in ("ask", "once"):
        assert f"eval {HF} {row}: 2/2 ep (100%) " in "\n".join(err)
        closing = f"eval {HF} {row}: finished, 2/2 episodes; results in memory only (no out= / --out file)"
        assert closing in err

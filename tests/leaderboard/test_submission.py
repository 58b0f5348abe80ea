"""Submissions: run -> verify -> build round trip, verification rejecting tampered submissions,
a paired comparison of the references, and a killed run resuming."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from collab_env.cli import main
from collab_env.leaderboard import board_data, validate_board_data
from collab_env.leaderboard.stats import paired_comparison
from collab_env.leaderboard.submission import load_submission
from collab_env.leaderboard.verify import verify_submission

REPO = Path(__file__).resolve().parents[2]


def _records(folder):
    return [json.loads(line) for line in (Path(folder) / "trajectories.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def board(tmp_path_factory):
    """Two tracks played by scripted references through the CLI: hidden-facts-easy (both
    references, all 100 episodes) and length-ratio (32 episodes)."""
    root = tmp_path_factory.mktemp("board")
    for ref in ("ask-then-answer", "answer-at-once"):
        assert main(["leaderboard", "run", "hidden-facts-easy@v1", "--policy", f"assistant={ref}",
                     "--out", str(root / "hfe" / ref), "--no-progress"]) == 0
    assert main(["leaderboard", "run", "length-ratio", "--policy", "agent_0=length-ratio-partner",
                 "--policy", "agent_1=length-ratio-partner", "--name", "partners",
                 "--out", str(root / "lr" / "partners"), "--no-progress"]) == 0
    return root


def test_run_writes_a_standard_submission(board):
    sub = load_submission(board / "hfe" / "ask-then-answer")
    assert sub["track"] == "hidden-facts-easy@v1" and sub["kind"] == "standard" and sub["custom_reasons"] == []
    assert sub["episodes"] == {"requested": 100, "full": 100, "recorded": 100, "failed": []}
    assert sub["track_hash"] == sub["track_hash"] and len(sub["code_version"]) > 0
    recs = _records(board / "hfe" / "ask-then-answer")
    # Episode k: seed 1000 + k on task k % 25 (the track's mapping through the eval runner).
    assert sorted((r["episode_id"], r["seed"], r["index"]) for r in recs) == \
        [(k, 1000 + k, k % 25) for k in range(100)]
    assert sub["cache"] is None  # the rule-based user makes no model call


def test_round_trip_run_verify_build(board, tmp_path, capsys):
    for folder in (board / "hfe" / "ask-then-answer", board / "lr" / "partners"):
        assert main(["leaderboard", "verify", str(folder)]) == 0
        assert "verified" in capsys.readouterr().out
    data = board_data(board, num_boot=200)
    validate_board_data(data)
    ids = {e["id"]: e for e in data["entries"]}
    # an entry's id is its track and its folder's path (here outside the track's folder
    # hidden-facts-easy/, so from the board's root)
    assert set(ids) == {"hidden-facts-easy@v1/hfe/ask-then-answer", "hidden-facts-easy@v1/hfe/answer-at-once",
                        "length-ratio@v1/lr/partners"}
    assert all(e["verified"] and e["kind"] == "standard" for e in ids.values())
    ask = ids["hidden-facts-easy@v1/hfe/ask-then-answer"]
    assert ask["metrics"]["success"]["mean"] == 1.0 and ask["pass_k"]["4"]["mean"] == 1.0
    assert ask["episodes"] == 100 and ask["seeds"] == 4 and ask["metrics"]["reward"]["n"] == 100
    assert ids["length-ratio@v1/lr/partners"]["metrics"]["reward"]["n"] == 32
    out = tmp_path / "board.html"
    assert main(["leaderboard", "build", str(board), "--out", str(out)]) == 0
    html = out.read_text(encoding="utf-8")
    for entry_id in ids:
        assert entry_id in html
    assert "3 entries (3 verified)" in capsys.readouterr().out


def test_paired_comparison_separates_the_references(board):
    """ask-then-answer beats answer-at-once on hidden-facts-easy, with the interval above 0."""
    a, b = _records(board / "hfe" / "ask-then-answer"), _records(board / "hfe" / "answer-at-once")
    c = paired_comparison(a, b, submitted=["assistant"], threshold=1.0, metric="reward", seed=0, num_boot=1000)
    ra = sum(r["returns"]["assistant"] for r in a) / 100
    rb = sum(r["returns"]["assistant"] for r in b) / 100
    assert ra == 1.0 and rb < 0.2
    # Every task has 4 trials, so the mean of task means is the plain mean difference.
    assert c["diff"] == pytest.approx(ra - rb, abs=1e-12)
    assert (c["n"], c["tasks"]) == (100, 25)
    assert 0.0 < c["lo"] <= c["diff"] <= c["hi"]
    data = board_data(board, verify=False, num_boot=200)
    [comp] = [x for x in data["comparisons"] if x["track"] == "hidden-facts-easy@v1"]
    assert (comp["a"], comp["b"]) == ("hidden-facts-easy@v1/hfe/ask-then-answer",
                                      "hidden-facts-easy@v1/hfe/answer-at-once")
    assert comp["lo"] > 0


def test_paired_comparison_separates_the_references_on_hidden_facts_in_the_seeded_board():
    """On hidden-facts@v1 (every item withholds a fact the answer needs) the committed seeded
    entries differ in every one of the 100 paired episodes: ask-then-answer succeeds, answering
    at once never does; the verified submission files are what is compared."""
    seeded = Path(__file__).resolve().parents[2] / "benchmarks" / "leaderboard" / "hidden-facts"
    a, b = _records(seeded / "ask-then-answer"), _records(seeded / "answer-at-once")
    for metric in ("success", "reward"):
        c = paired_comparison(a, b, submitted=["assistant"], threshold=1.0, metric=metric, seed=0, num_boot=1000)
        assert (c["n"], c["tasks"]) == (100, 25)
        # every pair differs by exactly 1, so every bootstrap resample does too
        assert c["diff"] == c["lo"] == c["hi"] == 1.0, c


def _copy(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_verify_rejects_a_changed_score(board, tmp_path):
    folder = _copy(board / "hfe" / "ask-then-answer", tmp_path / "sub")
    lines = (folder / "trajectories.jsonl").read_bytes().split(b"\n")
    rec = json.loads(lines[7])
    k = rec["episode_id"]
    # One byte: the assistant's return 1.0 becomes 0.0.
    old = b'"returns": {"assistant": 1.0'
    assert lines[7].count(old) == 1
    lines[7] = lines[7].replace(old, b'"returns": {"assistant": 0.0')
    (folder / "trajectories.jsonl").write_bytes(b"\n".join(lines))
    v = verify_submission(folder)
    assert not v.ok
    assert any(p.startswith(f"episode {k} ") and "returns" in p and "re-scored" in p for p in v.problems), v.problems
    assert main(["leaderboard", "verify", str(folder)]) == 1


def test_verify_rejects_a_changed_track_version(board, tmp_path, capsys):
    folder = _copy(board / "hfe" / "ask-then-answer", tmp_path / "sub")
    sub = json.loads((folder / "submission.json").read_text())
    sub["track_version"] = 2
    (folder / "submission.json").write_text(json.dumps(sub))
    v = verify_submission(folder)
    assert not v.ok and "version 2" in v.problems[0] and "changed track" in v.problems[0]
    # A track whose content changed under the same id (here: another seed) is refused too.
    folder2 = _copy(board / "hfe" / "ask-then-answer", tmp_path / "sub2")
    from collab_env.leaderboard.tracks import Track, get_track

    t = get_track("hidden-facts-easy@v1")
    moved = Track.from_dict({**t.to_dict(), "seed": 2000})
    v2 = verify_submission(folder2, track=moved)
    assert not v2.ok and "changed track" in v2.problems[0]
    assert main(["leaderboard", "verify", str(folder)]) == 1
    assert "REJECTED" in capsys.readouterr().out


@pytest.mark.slow
def test_verify_rejects_a_changed_cached_call(tmp_path, honest_llm_user_entry, capsys):
    """The LLM-user track (embedded SmolLM2 plays the user): its calls are recorded; verify
    replays them without the model; one byte changed in a recorded reply is caught in the
    episode that used it. The entry is the honest one the forgery tests copy (3 episodes of 2
    steps, played once per run); no episode is regenerated here, so what catches the change is
    the replay of the recorded calls alone."""
    import sqlite3

    from tests.leaderboard.forgery import copy_entry, forgery_track

    track = forgery_track()
    folder = copy_entry(honest_llm_user_entry, tmp_path / "llm")
    sub = load_submission(folder)
    assert sub["kind"] == "custom" and sub["cache"]["responses"] > 0
    capsys.readouterr()
    assert verify_submission(folder, track=track, regenerate=0).ok
    # stderr is not a terminal here: the re-play says what it plays, a line per tenth (issue 42)
    lines = capsys.readouterr().err.splitlines()
    assert f"verify {track.id}/llm: replay: 3/3 ep (100%)" in "\n".join(lines), lines
    users = {}
    for r in _records(folder):
        for t in r["turns"]:
            if t["player"] == "user" and t["completion"]:
                users.setdefault(t["text"], r["episode_id"])
    con = sqlite3.connect(folder / "calls.sqlite")
    rows = con.execute("SELECT key, completion FROM responses").fetchall()
    target = next(((key, comp) for key, comp in rows if json.loads(comp)["text"].strip() in users), None)
    assert target is not None, "no recorded reply became a user message"
    key, comp = target
    d = json.loads(comp)
    text = d["text"].strip()
    d["text"] = d["text"].replace(text, ("X" if text[0] != "X" else "Y") + text[1:], 1)  # one character
    con.execute("UPDATE responses SET completion = ? WHERE key = ?", (json.dumps(d), key))
    con.commit()
    con.close()
    v = verify_submission(folder, track=track, regenerate=0)
    assert not v.ok and v.regenerated == []
    k = users[text]
    # The changed reply either reads back as another user message, or (when a later prompt
    # contains it) makes that prompt miss the recorded calls: both name the episode.
    assert any(p.startswith(f"episode {k} ") and ("user's message" in p or "not among the recorded calls" in p)
               for p in v.problems), v.problems
    assert any("calls.sqlite" in p and "recorded call was changed" in p for p in v.problems)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_killed_run_resumes_without_lost_or_duplicated_episodes(tmp_path, sig):
    out = tmp_path / "sub"
    cmd = [sys.executable, "-m", "collab_env.cli", "leaderboard", "run", "hidden-facts-easy@v1",
           "--policy", "assistant=tests.leaderboard.slow_policy:SlowAskThenAnswer", "--out", str(out),
           "--concurrency", "2", "--no-progress"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def default_sigint():  # a launcher that ignores SIGINT would pass SIG_IGN on to the child
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=default_sigint)
    traj = out / "trajectories.jsonl"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if traj.exists() and traj.read_bytes().count(b"\n") >= 10:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be interrupted"
    proc.send_signal(sig)
    proc.communicate(timeout=120)
    done_before = traj.read_bytes().count(b"\n")
    assert 10 <= done_before < 100
    assert not (out / "submission.json").exists()  # an interrupted run is not a submission
    # The same command again resumes.
    res = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    ids = [r["episode_id"] for r in _records(out)]
    assert sorted(ids) == list(range(100))  # none lost, none twice
    sub = load_submission(out)
    assert sub["episodes"]["recorded"] == 100 and sub["kind"] == "standard"
    assert verify_submission(out).ok


def test_build_keeps_verdicts_and_replays_only_changed_entries(board, tmp_path, monkeypatch):
    import shutil

    import collab_env.leaderboard.verify as verify_module
    from collab_env.leaderboard.board import stamps_file

    root = tmp_path / "b"
    shutil.copytree(board / "hfe", root / "hfe")
    stamps_file(root).unlink(missing_ok=True)
    first = board_data(root, num_boot=50)
    stamps = json.loads(stamps_file(root).read_text())
    assert sorted(stamps) == ["hfe/answer-at-once", "hfe/ask-then-answer"] and all(s["ok"] for s in stamps.values())

    replayed = []
    real = verify_module.verify_submission

    def counting(folder, **kw):
        replayed.append(Path(folder).name)
        return real(folder, **kw)

    monkeypatch.setattr(verify_module, "verify_submission", counting)
    again = board_data(root, num_boot=50)
    assert replayed == [] and [e["verified"] for e in again["entries"]] == [e["verified"] for e in first["entries"]]
    # one byte of one entry changes: only that entry is re-played, and it is rejected
    traj = root / "hfe" / "ask-then-answer" / "trajectories.jsonl"
    traj.write_bytes(traj.read_bytes().replace(b'"returns": {"assistant": 1.0', b'"returns": {"assistant": 0.0', 1))
    third = board_data(root, num_boot=50)
    assert replayed == ["ask-then-answer"]
    assert {e["name"]: e["verified"] for e in third["entries"]} == {"ask-then-answer": False, "answer-at-once": True}
    # --reverify re-plays everything
    replayed.clear()
    board_data(root, num_boot=50, reverify=True)
    assert sorted(replayed) == ["answer-at-once", "ask-then-answer"]


def test_code_version_is_the_commit_and_says_dirty_for_changed_code(tmp_path):
    from collab_env.leaderboard.submission import code_version

    def git(*args):
        return subprocess.run(["git", "-C", str(tmp_path), *args], capture_output=True, text=True,
                              check=True).stdout.strip()

    git("init", "-q")
    (tmp_path / "collab_env").mkdir()
    (tmp_path / "collab_env" / "x.py").write_text("A = 1\n")
    (tmp_path / "README.md").write_text("r\n")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c")
    sha = git("rev-parse", "HEAD")
    assert code_version(tmp_path) == sha
    (tmp_path / "README.md").write_text("changed docs\n")  # not code
    (tmp_path / "collab_env" / "new.py").write_text("")  # untracked
    assert code_version(tmp_path) == sha
    (tmp_path / "collab_env" / "x.py").write_text("A = 2\n")
    assert code_version(tmp_path) == sha + "+dirty"


def _corrupt_board(board, tmp_path):
    """A copy of the board with one good entry and one bad entry of each kind."""
    import shutil

    root = tmp_path / "bad-board"
    good = board / "hfe" / "ask-then-answer"
    shutil.copytree(good, root / "good")

    def bad(name, edit_line=None, edit_sub=None):
        d = root / name
        shutil.copytree(good, d)
        if edit_line is not None:
            lines = (d / "trajectories.jsonl").read_text().splitlines()
            rec = json.loads(lines[0])
            edit_line(rec)
            lines[0] = json.dumps(rec)
            (d / "trajectories.jsonl").write_text("\n".join(lines) + "\n")
        if edit_sub is not None:
            sub = json.loads((d / "submission.json").read_text())
            edit_sub(sub)
            (d / "submission.json").write_text(json.dumps(sub))
        return d

    bad("string-id", lambda r: r.update(episode_id="0"))
    bad("nan-return", lambda r: r["returns"].update(assistant=float("nan")))
    d = bad("symlinked")
    real = tmp_path / "elsewhere.jsonl"
    (d / "trajectories.jsonl").rename(real)
    (d / "trajectories.jsonl").symlink_to(real)
    bad("nan-sampling", edit_sub=lambda s: s.update(sampling={"assistant": {"temperature": float("nan")}}))
    bad("unknown-track", edit_sub=lambda s: s.update(track="no-such-track@v9"))
    (bad("not-json") / "submission.json").write_text("{ not json")
    return root


def test_one_bad_entry_never_breaks_the_build(board, tmp_path, capsys):
    root = _corrupt_board(board, tmp_path)
    out = tmp_path / "page.html"
    assert main(["leaderboard", "build", str(root), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    html = out.read_text(encoding="utf-8")
    data = board_data(root, num_boot=100)
    validate_board_data(data)
    by_name = {Path(e["path"]).name: e for e in data["entries"]}
    assert by_name["good"]["verified"] and not by_name["good"]["failed"]
    for name in ("string-id", "nan-return", "symlinked", "nan-sampling"):
        e = by_name[name]
        assert not e["verified"], name
        assert e["problems"], name
        assert f"hidden-facts-easy@v1/{name}" in html
    assert by_name["string-id"]["failed"] and by_name["nan-sampling"]["failed"]
    assert {r["path"] for r in data["rejected"]} == {"unknown-track", "not-json"}
    assert "Rejected folders" in html and "not-json" in html and "failed: " in html
    # A progress line per folder on stderr and a summary; the row count on stdout.
    err = captured.err
    assert err.count("] ") >= 7 and "[1/7]" in err and "folder(s) rejected" in err
    assert "REJECTED" in err and "FAILED" in err
    assert "folder(s) rejected" in captured.out and "7 entries" not in captured.out


def test_a_kept_verdict_never_covers_a_file_replaced_by_a_link(board, tmp_path):
    import shutil

    root = tmp_path / "b"
    shutil.copytree(board / "hfe" / "ask-then-answer", root / "e")
    assert board_data(root, num_boot=50)["entries"][0]["verified"]  # stamp written
    traj = root / "e" / "trajectories.jsonl"
    same = tmp_path / "same.jsonl"
    shutil.copy(traj, same)
    traj.unlink()
    traj.symlink_to(same)  # identical bytes behind a link
    (e,) = board_data(root, num_boot=50)["entries"]
    assert not e["verified"] and "symbolic link" in e["problems"][0]


def test_run_prints_the_entry_row(tmp_path, capsys):
    assert main(["leaderboard", "run", "length-ratio", "--policy", "agent_0=length-ratio-partner",
                 "--policy", "agent_1=length-ratio-partner", "--out", str(tmp_path / "e"), "--no-progress"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("row: "))
    assert "length-ratio@v1/e" in row and "reward 1.000 [1.000, 1.000] (n=32)" in row and "pass^" in row


def test_a_standard_entry_must_cover_the_track_not_what_it_says_it_covers(board, tmp_path):
    import shutil

    d = tmp_path / "half"
    shutil.copytree(board / "hfe" / "ask-then-answer", d)
    sub = json.loads((d / "submission.json").read_text())
    sub["episodes"].update(requested=50, full=50)
    (d / "submission.json").write_text(json.dumps(sub))
    v = verify_submission(d)
    assert not v.ok
    assert any("plays the track's 100 episodes" in p and "requested 50, full 50" in p for p in v.problems)


def test_entries_replayed_in_parallel_give_the_board_of_one_after_another(board, tmp_path):
    """``workers`` re-plays several entries at once (threads); the board is the same, entry by
    entry and in folder order, as with one worker."""
    import shutil

    root = tmp_path / "b"
    shutil.copytree(board / "hfe", root / "hfe")
    lines: list[str] = []
    one = board_data(root, num_boot=50, reverify=True, workers=1)
    two = board_data(root, num_boot=50, reverify=True, workers=2, progress=lines.append)
    for d in (one, two):
        d.pop("generated")
    assert one == two and [e["id"] for e in two["entries"]] == sorted(e["id"] for e in two["entries"])
    assert sum("verified (re-played)" in x for x in lines) == 2 and lines[-1].startswith("2 entries: 2 verified")

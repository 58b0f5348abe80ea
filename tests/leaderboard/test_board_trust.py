"""A board in which every trusted file is signed or regenerated (issue 43, "Leaderboard"): each
case below was tried as a hostile submitter would, and got through before this change.

* a hand-written ``.verified.json`` in the board folder (its key needs no secret) made an entry
  that ``verify`` rejects show as verified; a kept-verdicts file that git tracks, or that sits
  inside the board, is refused;
* a folder of the same name that sorts earlier took the entry id of a signed entry;
* a submission's ``track`` was opened as a path (its key names then showed in the reason);
* an 80 MB ``name`` was carried to the page and a 200k-deep ``submission.json`` was a traceback;
* a trajectory's text of any length was embedded in the page.

The regeneration cases (one forged user reply, unseen by the replay of the recorded calls, caught
by the default ``verify``; the page saying how many episodes were regenerated) are in
``test_a_forged_reply_is_caught_by_the_default_verify`` and
``test_the_page_says_how_many_episodes_were_regenerated``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from collab_env.cli import main
from collab_env.errors import ConfigError
from collab_env.leaderboard import board_data
from collab_env.leaderboard.board import board_trajectory, verification_key
from collab_env.leaderboard.submission import load_submission, submission_files
from collab_env.leaderboard.tracks import get_track
from collab_env.leaderboard.verify import verify_submission

REPO = Path(__file__).resolve().parents[2]
SEEDED = REPO / "benchmarks" / "leaderboard"
PARTNER = SEEDED / "length-ratio" / "length-ratio-partner"  # 32 scripted episodes: re-played in ~1 s


def _tamper_a_return(folder: Path) -> None:
    """What a hostile submitter does: a better return in one record, every digest rewritten."""
    lines = (folder / "trajectories.jsonl").read_text().splitlines()
    rec = json.loads(lines[0])
    rec["returns"] = {p: v + 0.5 for p, v in rec["returns"].items()}
    lines[0] = json.dumps(rec)
    (folder / "trajectories.jsonl").write_text("\n".join(lines) + "\n")
    _rewrite(folder)


def _rewrite(folder: Path, **fields) -> None:
    sub = json.loads((folder / "submission.json").read_text())
    sub.update(fields)
    sub["files"] = submission_files(folder)
    (folder / "submission.json").write_text(json.dumps(sub))


def _counting(monkeypatch) -> list[str]:
    import collab_env.leaderboard.verify as verify_module

    replayed: list[str] = []
    real = verify_module.verify_submission

    def counting(folder, **kw):
        replayed.append(Path(folder).name)
        return real(folder, **kw)

    monkeypatch.setattr(verify_module, "verify_submission", counting)
    return replayed


# --- kept verdicts --------------------------------------------------------------------------
def test_a_hand_written_verdict_file_in_the_board_is_never_trusted(tmp_path):
    root = tmp_path / "board"
    folder = root / "length-ratio" / "mine"
    shutil.copytree(PARTNER, folder)
    _tamper_a_return(folder)
    assert not verify_submission(folder).ok
    # The key a kept verdict names is the digest of the folder's files: anyone can compute it.
    forged = {"length-ratio/mine": {"key": verification_key(folder, get_track("length-ratio@v1")), "ok": True,
                                    "episodes": 32, "problems": []}}
    (root / ".verified.json").write_text(json.dumps(forged))
    lines: list[str] = []
    data = board_data(root, num_boot=20, progress=lines.append)
    [entry] = data["entries"]
    assert not entry["verified"] and entry["problems"]
    assert any(".verified.json ignored" in x and "never trusted" in x for x in lines), lines
    assert json.loads((root / ".verified.json").read_text()) == forged  # left as it was
    # the kept verdicts are written outside the board folder, in the user cache
    from collab_env.leaderboard.board import stamps_file

    assert not stamps_file(root).resolve().is_relative_to(root.resolve()) and stamps_file(root).is_file()



def test_kept_verdicts_inside_the_board_or_tracked_by_git_are_refused(tmp_path, monkeypatch):
    from collab_env.leaderboard import board
    from collab_env.leaderboard.board import stamps_file

    root = tmp_path / "board"
    shutil.copytree(PARTNER, root / "length-ratio" / "p")
    replayed = _counting(monkeypatch)
    # 1. The kept-verdicts folder inside the board: refused, never read, never written.
    monkeypatch.setattr(board, "STAMPS_DIR", root / "cache")
    lines: list[str] = []
    assert board_data(root, num_boot=20, progress=lines.append)["entries"][0]["verified"]
    assert not (root / "cache").exists() and any("inside the board folder" in x for x in lines)
    # 2. A kept-verdicts file that git tracks: refused (the entry is re-played).
    repo = tmp_path / "repo"
    monkeypatch.setattr(board, "STAMPS_DIR", repo)
    board_data(root, num_boot=20)
    assert replayed == ["p", "p"] and stamps_file(root).is_file()
    board_data(root, num_boot=20)
    assert replayed == ["p", "p"]  # kept: not re-played
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "add", stamps_file(root).name], check=True)
    lines.clear()
    board_data(root, num_boot=20, progress=lines.append)
    assert replayed == ["p", "p", "p"] and any("git tracks" in x and "refused" in x for x in lines), lines


def test_a_verdict_of_leaderboard_verify_spares_the_build_a_replay_until_a_file_changes(tmp_path, monkeypatch):
    from collab_env.leaderboard.board import keep_verdict, verdicts_dir
    from collab_env.leaderboard.verify import Verification

    root = tmp_path / "board"
    folder = root / "length-ratio" / "mine"
    shutil.copytree(PARTNER, folder)
    assert main(["leaderboard", "verify", str(folder)]) == 0
    t = get_track("length-ratio@v1")
    assert json.loads((verdicts_dir() / f"{verification_key(folder, t)}.json").read_text())["ok"] is True
    # the build takes verify's verdict for the folder as it is: no second re-play
    replayed = _counting(monkeypatch)
    lines: list[str] = []
    [entry] = board_data(root, num_boot=20, progress=lines.append)["entries"]
    assert entry["verified"] and replayed == []
    assert any("verified (kept verdict of leaderboard verify)" in x for x in lines), lines
    # an edited file changes the digest: the next build re-plays the entry and rejects it ...
    _tamper_a_return(folder)
    [entry] = board_data(root, num_boot=20, progress=lines.append)["entries"]
    assert replayed == ["mine"] and not entry["verified"] and entry["problems"]
    # ... and verify keeps no failed verdict, nor one weaker than a build's re-play
    assert main(["leaderboard", "verify", str(folder)]) == 1
    assert not (verdicts_dir() / f"{verification_key(folder, t)}.json").exists()
    weak = Verification(folder, t.id, episodes=4, needs_regeneration=True, regenerated=[0, 1])
    assert keep_verdict(weak, "k") is None and keep_verdict(Verification(folder, t.id, episodes=4), "k") is not None
    # --reverify ignores it
    shutil.rmtree(folder)
    shutil.copytree(PARTNER, folder)
    replayed.clear()
    board_data(root, num_boot=20, reverify=True)
    assert replayed == ["mine"]


# --- entry ids ------------------------------------------------------------------------------
@pytest.fixture
def signed_v1_entry(tmp_path, monkeypatch):
    """The seeded hidden-facts-easy@v1 ask-then-answer entry in its track's folder, with a signed
    verdict (key pinned for the test)."""
    pytest.importorskip("cryptography")
    from collab_env.leaderboard import signing

    key = tmp_path / "keys" / "board.key"
    monkeypatch.setattr(signing, "TRUSTED_KEYS", {"test-key": signing.generate_key(key)})
    root = tmp_path / "board"
    shutil.copytree(SEEDED / "hidden-facts-easy" / "ask-then-answer", root / "hidden-facts-easy" / "ask-then-answer")
    stamp = {"key": verification_key(root / "hidden-facts-easy" / "ask-then-answer", get_track("hidden-facts-easy@v1")),
             "ok": True, "episodes": 100, "problems": []}
    signed = signing.sign_verdicts({"hidden-facts-easy/ask-then-answer": stamp}, key)
    (root / signing.SIGNED_FILE).write_text(json.dumps(signed))
    return root


def test_a_same_named_folder_that_sorts_earlier_does_not_take_the_signed_entry(signed_v1_entry):
    """Before: ``a/ask-then-answer`` (sorting first) became ``hidden-facts-easy@v1/ask-then-answer``
    and the signed, verified entry was rejected as "a second entry"."""
    root = signed_v1_entry
    shutil.copytree(SEEDED / "hidden-facts-easy" / "answer-at-once", root / "a" / "ask-then-answer")
    data = board_data(root, num_boot=20)
    ids = {e["id"]: e for e in data["entries"]}
    assert set(ids) == {"hidden-facts-easy@v1/ask-then-answer", "hidden-facts-easy@v1/a/ask-then-answer"}
    signed = ids["hidden-facts-easy@v1/ask-then-answer"]
    assert signed["verified"] and signed["metrics"]["success"]["mean"] == 1.0  # the signed files, not the others
    assert data["rejected"] == []


def test_a_folder_claiming_a_signed_entrys_id_is_rejected_with_the_reason(signed_v1_entry, tmp_path):
    root = signed_v1_entry
    # hidden-facts-easy/v1/ask-then-answer is also hidden-facts-easy@v1/ask-then-answer
    shutil.copytree(SEEDED / "hidden-facts-easy" / "answer-at-once",
                    root / "hidden-facts-easy" / "v1" / "ask-then-answer")
    data = board_data(root, num_boot=20)
    [entry] = data["entries"]
    assert entry["id"] == "hidden-facts-easy@v1/ask-then-answer" and entry["verified"]
    assert entry["metrics"]["success"]["mean"] == 1.0
    [rej] = data["rejected"]
    assert rej["path"] == "hidden-facts-easy/v1/ask-then-answer"
    assert "claimed by hidden-facts-easy/ask-then-answer too" in rej["reason"] and "signed entry" in rej["reason"]
    # Without a signature, neither claimant takes the id: both are rejected, whatever their order.
    (root / "verdicts.signed.json").unlink()
    data = board_data(root, num_boot=20, verify=False)
    assert data["entries"] == [] and len(data["rejected"]) == 2
    assert all("no signed verdict settles" in r["reason"] for r in data["rejected"])


# --- the track field ------------------------------------------------------------------------
def test_a_submissions_track_is_an_id_never_a_path(tmp_path, capsys):
    """Before: ``"track": "/some/file.json"`` made the builder open that file, and its key
    names appeared in the rejection reason."""
    secret = tmp_path / "private" / "settings.json"
    secret.parent.mkdir()
    secret.write_text(json.dumps({"SECRET_FIELD_NAME": 1}))
    root = tmp_path / "board"
    for name, track in (("by-path", str(secret)), ("relative", "../private/settings.json"), ("unknown", "nope@v1")):
        shutil.copytree(PARTNER, root / name)
        _rewrite(root / name, track=track)
    data = board_data(root, num_boot=20)
    reasons = {r["path"]: r["reason"] for r in data["rejected"]}
    assert set(reasons) == {"by-path", "relative", "unknown"} and data["entries"] == []
    assert "never a path" in reasons["by-path"] and "never a path" in reasons["relative"]
    assert "no leaderboard track 'nope@v1'" in reasons["unknown"]
    assert not any("SECRET_FIELD_NAME" in r for r in reasons.values())
    assert main(["leaderboard", "verify", str(root / "by-path")]) == 2
    err = capsys.readouterr().err
    assert "never a path" in err and "SECRET_FIELD_NAME" not in err and len(err.strip().splitlines()) == 1


# --- sizes and depth of what reaches the page -----------------------------------------------
@pytest.mark.parametrize("field, value, says", [
    ("name", "x" * 300, "name is 300 characters, over the limit of 200"),
    ("name", "x" * (2 << 20), "refused unread"),                      # the 80 MB name, at 2 MB
    ("model", ["not", "text"], "model must be a string"),
    ("custom_reasons", ["r"] * 100, "custom_reasons must be a list of at most 32"),
    ("sampling", {"agent_0": {"temperature": [[1]]}}, "must be a number, a boolean or a text"),
    ("policies", {"agent_0": "y" * 5000}, "over the limit of 1000"),
])
def test_a_field_over_its_limit_is_refused_before_the_page(tmp_path, capsys, field, value, says):
    root = tmp_path / "board"
    shutil.copytree(PARTNER, root / "e")
    _rewrite(root / "e", **{field: value})
    with pytest.raises(ConfigError, match=says):
        load_submission(root / "e")
    data = board_data(root, num_boot=20)
    assert data["entries"] == [] and says in data["rejected"][0]["reason"]
    assert main(["leaderboard", "verify", str(root / "e")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0]


def test_a_200k_deep_submission_json_is_one_line(tmp_path, capsys):
    """Before: a raw RecursionError traceback from ``leaderboard verify``."""
    folder = tmp_path / "e"
    shutil.copytree(PARTNER, folder)
    (folder / "submission.json").write_text('{"format": 1, "x": ' + "[" * 200_000 + "]" * 200_000 + "}")
    assert main(["leaderboard", "verify", str(folder)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nested 200001 deep, over the limit of 64" in err[0]
    data = board_data(tmp_path, num_boot=20)
    assert data["entries"] == [] and "over the limit of 64" in data["rejected"][0]["reason"]


def test_a_trajectory_text_reaches_the_page_cut_to_its_limit():
    MAX_TEXT_CHARS = 8000  # collab_env.leaderboard.board.MAX_TEXT_CHARS
    long = "w" * 100_000
    record = {"episode_id": 0, "index": "i" * 1000, "seed": 1, "returns": {"assistant": 0.0}, "end_reason": "e" * 999,
              "conversation": {"messages": [{"role": "assistant", "author": "assistant", "content": long},
                                            {"role": "user", "author": "user", "audience": ["user"], "content": long,
                                             "meta": {"hidden": {"facts": ["f" * 100_000]}}}]},
              "turns": [{"player": "assistant", "text": long, "reward": 0.0}]}
    traj = board_trajectory(record, ["assistant"], 1.0)
    text = traj["turns"][0]["text"]
    assert len(text) < MAX_TEXT_CHARS + 100 and text.endswith("[... 92000 more characters not shown]")
    assert traj["turns"][0]["reward"] == 0.0  # still paired with its move
    assert len(json.dumps(traj["hidden_goal"])) < 3 * MAX_TEXT_CHARS
    assert len(traj["task"]) < 200 and len(traj["end_reason"]) < 300


# --- regeneration ---------------------------------------------------------------------------
def test_the_default_regeneration_catches_one_forged_episode_with_the_stated_probability():
    """m of N episodes drawn at random include a given one with probability m / N."""
    from collab_env.leaderboard.verify import CATCH_PROBABILITY, regeneration_count

    assert CATCH_PROBABILITY >= 0.95
    for n in range(1, 2001):
        m = regeneration_count(n)
        assert m <= n and m / n >= CATCH_PROBABILITY, n
    assert (regeneration_count(20), regeneration_count(40), regeneration_count(100)) == (19, 38, 95)


@pytest.mark.slow
@pytest.mark.timeout(2400)  # two passes of the embedded user (~16 min each on 2 cores under load; the
# first is the shared honest entry's, played by whichever of this and the tamper test asks first)
def test_a_forged_reply_is_caught_by_the_default_verify(tmp_path, honest_llm_user_entry):
    """The LLM-user track (the embedded model plays the user): the submitter forges the user's
    last reply of episode 0 in calls.sqlite and in the trajectory and rewrites the digests.
    Replaying the recorded calls verifies it (no later call depends on that reply); regenerating
    the episode with the track's own model names the episode and the message. Before,
    ``verify`` regenerated 2 episodes: with this draw (seed 0: episodes 1 and 2) the forgery
    passed. Now the default draw covers at least 95% of the episodes (here all 3), and
    ``verify`` finds the track in the board's own ``tracks/`` folder. (This was two tests, the
    other in test_tamper.py with ``full=True``: the same forgery caught on the same path.)"""
    import random

    from tests.leaderboard.forgery import copy_entry, forge_last_user_reply, forgery_track

    assert sorted(random.Random(0).sample([0, 1, 2], 2)) == [1, 2]  # the old default's draw with seed 0
    track = forgery_track()
    root = tmp_path / "board"
    (root / "tracks").mkdir(parents=True)
    (root / "tracks" / f"{track.id}.json").write_text(json.dumps(track.to_dict()))
    folder = copy_entry(honest_llm_user_entry, root / "llm-user-forgery" / "v1" / "e")
    recs = [json.loads(x) for x in (folder / "trajectories.jsonl").read_text().splitlines()]
    r = next(r for r in recs if r["episode_id"] == 0)
    forge_last_user_reply(folder, r, "I have 3 boxes. Each box weighs 4 kilograms.")
    (folder / "trajectories.jsonl").write_text("".join(json.dumps(x) + "\n" for x in recs))
    sub = json.loads((folder / "submission.json").read_text())
    sub["files"] = submission_files(folder)
    sub["cache"]["sha256"] = sub["files"]["cache"]["sha256"]
    (folder / "submission.json").write_text(json.dumps(sub))
    # No later call depends on the last reply, so the replay of the recorded calls cannot see it:
    # the hole that regeneration closes.
    replayed = verify_submission(folder, regenerate=0)
    assert replayed.ok and replayed.regenerated == [], replayed.problems[:3]
    v = verify_submission(folder, sample_seed=0)  # the track from the tracks/ folder beside it
    assert not v.ok and v.regenerated == [0, 1, 2] and "probability 1.00" in v.regeneration
    assert any(p.startswith("episode 0 ") and "regenerated with the track's own pinned models" in p
               and ("user's message" in p or "conversation message" in p) for p in v.problems), v.problems
    # the honest episodes 1 and 2, regenerated too, match: the forged one alone is named
    assert all(p.startswith("episode 0 ") for p in v.problems), v.problems
    # The page's count of regenerated episodes: test_the_page_says_how_many_episodes_were_regenerated.


def test_the_page_says_how_many_episodes_were_regenerated(tmp_path, monkeypatch):
    """A kept verdict (the builder's own, outside the board) of an entry on a track whose user is
    a local model: the row says how many of its episodes were regenerated and the catch
    probability; a board built with ``full=True`` (what ``sign`` does) does not take a verdict
    that regenerated fewer than all of them, and re-plays the entry."""
    from collab_env.leaderboard.board import stamps_file
    from collab_env.leaderboard.page import build_page

    d = {**get_track("length-ratio@v1").to_dict(), "name": "lr-with-a-user",
         "players": {"user": {"simulator": "llm-user", "backend": "embedded"}}}
    root = tmp_path / "board"
    (root / "tracks").mkdir(parents=True)
    (root / "tracks" / "lr-with-a-user@v1.json").write_text(json.dumps(d))
    folder = root / "lr-with-a-user" / "v1" / "e"
    shutil.copytree(PARTNER, folder)
    _rewrite(folder, track="lr-with-a-user@v1")
    t = get_track("lr-with-a-user@v1", root / "tracks")
    stamp = {"key": verification_key(folder, t), "ok": True, "episodes": 32, "problems": [], "regenerated": 31}
    stamps_file(root).parent.mkdir(parents=True, exist_ok=True)
    stamps_file(root).write_text(json.dumps({"lr-with-a-user/v1/e": stamp}))
    replayed = _counting(monkeypatch)
    data = board_data(root, num_boot=20)
    [entry] = data["entries"]
    assert replayed == [] and entry["verified"] and entry["regenerated"] == 31
    html = build_page(data, tmp_path / "page.html").read_text(encoding="utf-8")
    assert "31 of 32 episodes regenerated (one forged episode caught with p = 0.97)" in html
    assert "probability at least 0.95" in html
    data = board_data(root, num_boot=20, full=True)
    assert replayed == ["e"] and not data["entries"][0]["verified"]

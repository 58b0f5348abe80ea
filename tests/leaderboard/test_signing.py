"""Signed verdicts (collab_env/leaderboard/signing.py): a fresh clone builds the seeded board
from the maintainers' signed verdicts without re-playing it, and neither an edited file nor an
edited, re-used or self-signed verdict gets an entry past verification."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("cryptography")

from collab_env.cli import main  # noqa: E402
from collab_env.errors import ConfigError  # noqa: E402
from collab_env.leaderboard import board_data  # noqa: E402
from collab_env.leaderboard import signing  # noqa: E402
from collab_env.leaderboard.board import stamps_file, verification_key  # noqa: E402
from collab_env.leaderboard.submission import submission_files  # noqa: E402
from collab_env.leaderboard.tracks import get_track  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
SEEDED = REPO / "benchmarks" / "leaderboard"
ENTRIES = ("ask-then-answer", "answer-at-once", "embedded")


@pytest.fixture
def signed_board(tmp_path, monkeypatch):
    """Three seeded entries of hidden-facts-easy@v2, signed with a key pinned for the test."""
    key = tmp_path / "keys" / "board.key"
    pub = signing.generate_key(key)
    monkeypatch.setattr(signing, "TRUSTED_KEYS", {"test-key": pub})
    root = tmp_path / "board"
    for name in ENTRIES:
        shutil.copytree(SEEDED / "hidden-facts-easy" / "v2" / name, root / "hfe" / name)
    assert main(["leaderboard", "sign", str(root), "--key", str(key)]) == 0
    stamps_file(root).unlink()  # as on a fresh clone: only the committed, signed verdicts
    return root, key


def _counting(monkeypatch):
    import collab_env.leaderboard.verify as verify_module

    replayed = []
    real = verify_module.verify_submission

    def counting(folder, **kw):
        replayed.append(Path(folder).name)
        return real(folder, **kw)

    monkeypatch.setattr(verify_module, "verify_submission", counting)
    return replayed


def test_a_fresh_clone_uses_the_signed_verdicts(signed_board, monkeypatch):
    root, _ = signed_board
    data = json.loads((root / signing.SIGNED_FILE).read_text())
    assert data["key_id"] == "test-key" and sorted(data["verdicts"]) == [f"hfe/{n}" for n in sorted(ENTRIES)]
    replayed, lines = _counting(monkeypatch), []
    board = board_data(root, num_boot=50, progress=lines.append)
    assert replayed == [] and all(e["verified"] for e in board["entries"])
    assert sum("verified (signed verdict)" in x for x in lines) == 3


def test_an_edited_file_is_replayed_whatever_the_signed_verdict_says(signed_board, monkeypatch):
    """A hostile submitter edits a reward, rewrites the digests, and leaves the signed verdict:
    the folder's key changes, so the entry is re-played and rejected; the others keep theirs."""
    root, _ = signed_board
    folder = root / "hfe" / "embedded"
    traj = folder / "trajectories.jsonl"
    traj.write_bytes(traj.read_bytes().replace(b'"returns": {"assistant": 0.0', b'"returns": {"assistant": 1.0', 1))
    sub = json.loads((folder / "submission.json").read_text())
    sub["files"] = submission_files(folder)
    (folder / "submission.json").write_text(json.dumps(sub))
    replayed = _counting(monkeypatch)
    board = board_data(root, num_boot=50)
    assert replayed == ["embedded"]
    assert {e["name"]: e["verified"] for e in board["entries"]} == {
        "ask-then-answer": True, "answer-at-once": True, "embedded": False}


def test_a_forged_or_self_signed_verdict_is_ignored(signed_board, tmp_path, monkeypatch):
    root, _ = signed_board
    folder = root / "hfe" / "embedded"
    traj = folder / "trajectories.jsonl"
    traj.write_bytes(traj.read_bytes().replace(b'"returns": {"assistant": 0.0', b'"returns": {"assistant": 1.0', 1))
    sub = json.loads((folder / "submission.json").read_text())
    sub["files"] = submission_files(folder)
    (folder / "submission.json").write_text(json.dumps(sub))
    path = root / signing.SIGNED_FILE
    data = json.loads(path.read_text())
    # 1. The old signature on the new key (the verdict copied onto the edited folder).
    data["verdicts"]["hfe/embedded"]["key"] = verification_key(folder, get_track("hidden-facts-easy@v2"))
    path.write_text(json.dumps(data))
    replayed, lines = _counting(monkeypatch), []
    board = board_data(root, num_boot=50, progress=lines.append)
    assert replayed == ["embedded"] and any("bad signature ignored: hfe/embedded" in x for x in lines)
    assert {e["name"]: e["verified"] for e in board["entries"]}["embedded"] is False
    # 2. A verdict signed with the submitter's own key: not pinned, so the whole file is ignored.
    stamps_file(root).unlink()
    own = tmp_path / "own.key"
    own_pub = signing.generate_key(own)
    with pytest.raises(ConfigError, match="not among TRUSTED_KEYS"):
        signing.sign_verdicts({}, own)
    monkeypatch.setattr(signing, "TRUSTED_KEYS", {**signing.TRUSTED_KEYS, "own": own_pub})
    forged = signing.sign_verdicts({"hfe/embedded": {"key": data["verdicts"]["hfe/embedded"]["key"], "ok": True,
                                                     "episodes": 100, "problems": []}}, own, key_id="own")
    monkeypatch.setattr(signing, "TRUSTED_KEYS", {k: v for k, v in signing.TRUSTED_KEYS.items() if k != "own"})
    path.write_text(json.dumps(forged))
    replayed.clear()
    lines.clear()
    board = board_data(root, num_boot=50, progress=lines.append)
    assert sorted(replayed) == sorted(ENTRIES) and any("not a pinned key" in x for x in lines)
    assert {e["name"]: e["verified"] for e in board["entries"]}["embedded"] is False
    # 3. --reverify ignores the signed verdicts altogether.
    replayed.clear()
    board_data(root, num_boot=50, reverify=True)
    assert sorted(replayed) == sorted(ENTRIES)


def test_the_seeded_board_is_signed_with_the_pinned_key():
    """benchmarks/leaderboard/verdicts.signed.json covers every seeded entry as its files are now
    (else a fresh clone re-plays it: re-sign with ``collab-env leaderboard sign``), every signature
    verifies against the pinned key, and every verdict is a pass."""
    from collab_env.leaderboard.submission import load_submission

    good, notes = signing.signed_verdicts(SEEDED)
    assert notes == []
    for folder in sorted(p.parent for p in SEEDED.rglob("submission.json")):
        rel = folder.relative_to(SEEDED).as_posix()
        t = get_track(load_submission(folder)["track"])
        assert rel in good, f"{rel} has no signed verdict"
        assert good[rel]["key"] == verification_key(folder, t), f"{rel} changed since it was signed"
        assert good[rel]["ok"], rel

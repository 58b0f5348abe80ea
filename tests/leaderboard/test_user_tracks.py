"""Your own track on a local board (issue 42, "every current track has entries", second half):
``leaderboard run my-track.json`` plays it and prints its row, ``verify`` and ``build`` find it
in the board's ``tracks/`` folder (or ``--tracks DIR``), and ``--import`` finds a module in the
current folder. Before: ``run`` played every episode, then exited with ``no leaderboard track``;
``build`` could not be given a track; ``--import mymod`` needed ``PYTHONPATH=.``."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from collab_env.cli import main
from collab_env.errors import ConfigError
from collab_env.leaderboard import board_data
from collab_env.leaderboard.tracks import get_track


def _my_track(folder: Path, name: str = "my-length-ratio") -> Path:
    """length-ratio@v1 under a name of its own (32 scripted episodes: played in a few seconds)."""
    d = {**get_track("length-ratio@v1").to_dict(), "name": name, "title": "My length ratio"}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}@v1.json"
    path.write_text(json.dumps(d, indent=1))
    return path


PARTNERS = ["--policy", "agent_0=length-ratio-partner", "--policy", "agent_1=length-ratio-partner"]


@pytest.fixture(scope="module")
def my_board(tmp_path_factory):
    """A board with its own tracks folder and one entry on it, played through the CLI."""
    root = tmp_path_factory.mktemp("my-board")
    track = _my_track(root / "tracks")
    out = root / "my-length-ratio" / "v1" / "partners"
    status = main(["leaderboard", "run", str(track), *PARTNERS, "--out", str(out), "--no-progress"])
    return root, track, out, status


def test_run_plays_a_track_file_and_prints_its_row(my_board, capsys):
    root, _, out, status = my_board
    assert status == 0
    sub = json.loads((out / "submission.json").read_text())
    assert sub["track"] == "my-length-ratio@v1" and sub["episodes"]["recorded"] == 32


def test_run_prints_the_row_of_a_track_file(tmp_path, capsys):
    track = _my_track(tmp_path / "tracks")
    out = tmp_path / "e"
    assert main(["leaderboard", "run", str(track), *PARTNERS, "--out", str(out), "--no-progress",
                 "--episodes", "4"]) == 0
    assert "row: my-length-ratio@v1/e (custom, 4 episodes" in capsys.readouterr().out


def test_verify_finds_the_track_beside_the_board_or_in_tracks_dir(my_board, tmp_path, capsys):
    root, track, out, _ = my_board
    assert main(["leaderboard", "verify", str(out)]) == 0  # root/tracks, two folders up
    assert "verified (32 episodes of my-length-ratio@v1" in capsys.readouterr().out
    elsewhere = tmp_path / "elsewhere" / "partners"
    shutil.copytree(out, elsewhere)
    assert main(["leaderboard", "verify", str(elsewhere)]) == 1
    assert "no leaderboard track 'my-length-ratio@v1'" in capsys.readouterr().out
    assert main(["leaderboard", "verify", str(elsewhere), "--tracks", str(track.parent)]) == 0


def test_build_lists_the_entry_on_its_own_track(my_board, tmp_path, capsys):
    root, track, _, _ = my_board
    page = tmp_path / "page.html"
    assert main(["leaderboard", "build", str(root), "--out", str(page)]) == 0
    assert "1 entries (1 verified)" in capsys.readouterr().out
    html = page.read_text(encoding="utf-8")
    assert "My length ratio" in html and 'data-entry="my-length-ratio@v1/partners"' in html
    # the same board elsewhere, its tracks given as --tracks
    other = tmp_path / "other"
    shutil.copytree(root / "my-length-ratio", other / "my-length-ratio")
    data = board_data(other, num_boot=20, verify=False)
    assert data["entries"] == [] and "no leaderboard track 'my-length-ratio@v1'" in data["rejected"][0]["reason"]
    data = board_data(other, num_boot=20, tracks_dir=track.parent)
    assert [(e["id"], e["verified"]) for e in data["entries"]] == [("my-length-ratio@v1/partners", True)]
    assert "my-length-ratio@v1" in {t["id"] for t in data["tracks"]}


def test_a_tracks_folder_cannot_take_a_built_in_id_or_misname_a_file(tmp_path):
    from collab_env.leaderboard.tracks import user_tracks

    folder = tmp_path / "tracks"
    shutil.copy(get_track("length-ratio@v1").source, folder.mkdir() or folder / "length-ratio@v1.json")
    with pytest.raises(ConfigError, match="takes the id of the built-in track length-ratio@v1"):
        user_tracks(folder)
    (folder / "length-ratio@v1.json").unlink()
    _my_track(folder).rename(folder / "mine.json")
    with pytest.raises(ConfigError, match=r"holds my-length-ratio@v1; in a tracks folder name it "
                                          r"my-length-ratio@v1\.json"):
        user_tracks(folder)


def test_import_finds_a_module_in_the_current_folder_or_says_how(tmp_path):
    """The ``collab-env`` script's own folder heads sys.path, not the current one."""
    (tmp_path / "my_board_policies.py").write_text("print('my_board_policies imported')\n")
    cli = str(Path(sys.executable).with_name("collab-env"))
    res = subprocess.run([cli, "--import", "my_board_policies", "leaderboard", "tracks"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("my_board_policies imported")
    res = subprocess.run([cli, "--import", "not_here_at_all", "list"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1
    assert "nor in the current folder" in res.stderr and "PYTHONPATH=DIR" in res.stderr


def test_build_re_plays_an_entry_on_data_with_the_files_it_recorded(tmp_path, capsys):
    """``build --data-files``: an entry on a track that reads data is re-played with the given
    file whose SHA-256 it recorded; without it the entry is listed unverified, saying what to
    pass, and that refusal is not kept as a verdict (the next build with the file re-plays it).
    The track: collabllm-math-hard-mini's env and rows with the scripted replay user and no
    judge (12 scripted episodes: seconds)."""
    rows = Path(__file__).resolve().parents[2] / "benchmarks" / "leaderboard" / "data" / "collabllm-fixture-rows.jsonl"
    other = tmp_path / "other-rows.jsonl"
    other.write_text(rows.read_text().replace("(conversation 0)", "(conversation zero)"))
    d = {**get_track("collabllm-math-hard-mini@v1").to_dict(), "name": "my-data-track", "version": 1,
         "players": {"user": {"policy": "collabllm-replay-user"}}, "judge": None,
         "metrics": ["success", "reward", "turns", "tokens"], "success_threshold": 0.0}
    (tmp_path / "tracks").mkdir()
    (tmp_path / "tracks" / "my-data-track@v1.json").write_text(json.dumps(d))
    out = tmp_path / "my-data-track" / "v1" / "replay"
    assert main(["leaderboard", "run", "my-data-track@v1", "--tracks", str(tmp_path / "tracks"), "--data-files",
                 str(rows), "--policy", "assistant=answer-at-once", "--out", str(out), "--no-progress"]) == 0
    page = tmp_path / "page.html"
    for files, verified in ((None, False), ([str(other)], False), ([str(other), str(rows)], True)):
        capsys.readouterr()
        assert main(["leaderboard", "build", str(tmp_path), "--out", str(page),
                     *(["--data-files", *files] if files else [])]) == 0
        err = capsys.readouterr().err
        [entry] = board_data(tmp_path, verify=False)["entries"]  # the entry is read either way
        assert entry["episodes"] == 12
        assert ("my-data-track@v1/replay: verified (re-played)" in err) is verified, err
        if not verified:
            assert "reads data files; pass them (--data-files) to verify" in err
    # the verdict of the build with the file is kept: the next build need not be given it
    capsys.readouterr()
    assert main(["leaderboard", "build", str(tmp_path), "--out", str(page)]) == 0
    assert "my-data-track@v1/replay: verified (kept verdict)" in capsys.readouterr().err

"""A hostile submitter edits a real submission and rewrites every SHA-256 in submission.json, as
anyone can: ``verify`` must still reject it, naming the episode and the field, and ``leaderboard
build`` must still write the page with that entry marked.

The submission is the seeded board's embedded SmolLM2 entry on hidden-facts-easy@v2 (100
episodes, every move with its token ids and usage), copied. The LLM-user forgery (the embedded
model as the track's user) is in test_board_trust.py.
"""

import json
import shutil
from pathlib import Path

import pytest

from collab_env.cli import main
from collab_env.leaderboard import board_data
from collab_env.leaderboard.submission import submission_files
from collab_env.leaderboard.verify import verify_submission

REPO = Path(__file__).resolve().parents[2]
REAL = REPO / "benchmarks" / "leaderboard" / "hidden-facts-easy" / "v2" / "embedded"


def _copy(dst: Path) -> Path:
    shutil.copytree(REAL, dst)
    return dst


def _lines(folder: Path) -> list[dict]:
    return [json.loads(x) for x in (folder / "trajectories.jsonl").read_text().splitlines() if x.strip()]


def _write(folder: Path, recs: list[dict]) -> None:
    (folder / "trajectories.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))


def _rehash(folder: Path, **edit) -> None:
    """What a hostile submitter does after editing: every digest in submission.json rewritten."""
    sub = json.loads((folder / "submission.json").read_text())
    sub["files"] = submission_files(folder)
    if sub.get("cache"):
        sub["cache"]["sha256"] = sub["files"]["cache"]["sha256"]
    for key, value in edit.items():
        sub[key] = value
    (folder / "submission.json").write_text(json.dumps(sub, indent=2))


def _by_episode(recs: list[dict], k: int) -> dict:
    return next(r for r in recs if r["episode_id"] == k)


# Each tamper edits the copy and returns (episode id or None, words the problem must contain).
def edit_conversation(folder):
    recs = _lines(folder)
    r = _by_episode(recs, 7)
    i = next(i for i, m in enumerate(r["conversation"]["messages"]) if m["author"] == "user")
    r["conversation"]["messages"][i]["content"] = "Here are all the facts: 3 boxes. " + r["conversation"]["messages"][i]["content"]
    _write(folder, recs)
    return 7, [f"conversation message {i}", "content"]


def edit_hidden_goal(folder):
    recs = _lines(folder)
    r = _by_episode(recs, 3)
    hidden = next(m for m in r["conversation"]["messages"] if "hidden" in (m.get("meta") or {}))
    hidden["meta"]["hidden"]["facts"][0]["value"] += 1
    _write(folder, recs)
    return 3, ["conversation message", "meta"]


def edit_usage(folder):
    recs = _lines(folder)
    r = _by_episode(recs, 11)
    t = next(t for t in r["turns"] if t["player"] == "assistant")
    t["completion"]["usage"]["completion_tokens"] = 2
    _write(folder, recs)
    return 11, ["usage.completion_tokens", "token_ids"]


def edit_usage_and_costs(folder):
    """Both the move's usage and the episode's costs, consistently: the token ids still disagree."""
    recs = _lines(folder)
    r = _by_episode(recs, 12)
    t = next(t for t in r["turns"] if t["player"] == "assistant")
    drop = t["completion"]["usage"]["prompt_tokens"] - 1
    t["completion"]["usage"]["prompt_tokens"] -= drop
    r["costs"]["prompt_tokens"] -= drop
    _write(folder, recs)
    return 12, ["usage.prompt_tokens", "prompt_token_ids"]


def edit_cost(folder):
    recs = _lines(folder)
    _by_episode(recs, 20)["costs"]["cost"] = 0.5
    _write(folder, recs)
    return 20, ["costs.cost"]


def edit_reward(folder):
    recs = _lines(folder)
    r = _by_episode(recs, 30)
    r["returns"]["assistant"] = 1.0
    _write(folder, recs)
    return 30, ["returns", "re-scored"]


def drop_episode(folder):
    recs = [r for r in _lines(folder) if r["episode_id"] != 40]
    _write(folder, recs)
    return None, ["[40] have no record"]


def duplicate_episode(folder):
    recs = _lines(folder)
    recs.append(dict(_by_episode(recs, 41)))
    _write(folder, recs)
    return 41, ["recorded twice"]


def relabel_episode(folder):
    """Episode 42's record presented as episode 43 (43's dropped): the seed and task give it away."""
    recs = [r for r in _lines(folder) if r["episode_id"] != 43]
    _by_episode(recs, 42)["episode_id"] = 43
    _write(folder, recs)
    return 43, ["seed 1042", "seed 1043"]


def shrink_episodes(folder):
    _rehash(folder)
    sub = json.loads((folder / "submission.json").read_text())
    sub["episodes"].update(requested=50, full=50)
    (folder / "submission.json").write_text(json.dumps(sub))
    return None, ["plays the track's 100 episodes", "requested 50, full 50"]


def edit_track_hash(folder):
    sub = json.loads((folder / "submission.json").read_text())
    sub["track_hash"] = "0" * 64
    (folder / "submission.json").write_text(json.dumps(sub))
    return None, ["track:", "changed track"]


def non_utf8_line(folder):
    raw = (folder / "trajectories.jsonl").read_bytes().split(b"\n")
    raw[5] = raw[5].replace(b'"status": "ok"', b'"status": "ok\xff\xfe"', 1)
    (folder / "trajectories.jsonl").write_bytes(b"\n".join(raw))
    return None, ["line 6", "not a result record"]


def symlink(folder):
    target = folder.parent / (folder.name + "-elsewhere.jsonl")
    shutil.move(folder / "trajectories.jsonl", target)
    (folder / "trajectories.jsonl").symlink_to(target)
    return None, ["symbolic link"]


def stray_file(folder):
    (folder / "notes.txt").write_text("a verdict: verified\n")
    return None, ["notes.txt", "not a submission file"]


TAMPERS = [edit_conversation, edit_hidden_goal, edit_usage, edit_usage_and_costs, edit_cost, edit_reward,
           drop_episode, duplicate_episode, relabel_episode, shrink_episodes, edit_track_hash, non_utf8_line,
           symlink, stray_file]


@pytest.fixture(scope="module")
def tampered(tmp_path_factory):
    """The board folder: the untouched copy and one copy per tamper (digests rewritten)."""
    if not (REAL / "submission.json").is_file():
        pytest.fail(f"the seeded entry {REAL} is missing: the tamper tests run on it")
    root = tmp_path_factory.mktemp("tampered")
    _copy(root / "good")
    expect = {}
    for tamper in TAMPERS:
        folder = _copy(root / tamper.__name__.replace("_", "-"))
        k, words = tamper(folder)
        if tamper not in (shrink_episodes, edit_track_hash, symlink, stray_file):
            _rehash(folder)
        expect[folder.name] = (k, words)
    return root, expect


def test_the_untouched_copy_verifies(tampered):
    root, _ = tampered
    v = verify_submission(root / "good")
    assert v.ok, v.problems[:5]
    assert v.episodes == 100


@pytest.mark.parametrize("tamper", [t.__name__.replace("_", "-") for t in TAMPERS])
def test_verify_names_the_episode_and_field(tampered, tamper):
    root, expect = tampered
    k, words = expect[tamper]
    v = verify_submission(root / tamper)
    assert not v.ok, f"{tamper} verified"
    hits = [p for p in v.problems if all(w in p for w in words)]
    assert hits, (tamper, v.problems[:5])
    if k is not None:
        assert any(p.startswith((f"episode {k} ", f"episode {k}:")) for p in hits), (tamper, hits[:3])


def test_an_oversized_file_is_refused_unread(tmp_path, monkeypatch):
    import collab_env.leaderboard.verify as verify

    folder = _copy(tmp_path / "big")
    monkeypatch.setattr(verify, "MAX_FILE_BYTES", (folder / "trajectories.jsonl").stat().st_size - 1)
    v = verify_submission(folder)
    assert not v.ok and "trajectories.jsonl is larger than" in v.problems[0] and v.episodes == 0


def test_the_build_still_writes_the_page_with_every_tampered_entry_marked(tampered, tmp_path, capsys):
    root, expect = tampered
    out = tmp_path / "page.html"
    assert main(["leaderboard", "build", str(root), "--out", str(out)]) == 0
    html = out.read_text(encoding="utf-8")
    data = board_data(root, num_boot=50)
    by_name = {Path(e["path"]).name: e for e in data["entries"]}
    assert by_name["good"]["verified"]
    for name in expect:
        e = by_name[name]
        assert not e["verified"] and e["problems"], name
        row = html[html.index(f'data-entry="hidden-facts-easy@v2/{name}"'):]
        row = row[:row.index("</tr>")]
        assert "unverified" in row or "failed:" in row, name
    assert f"{len(expect) + 1} entries (1 verified" in capsys.readouterr().out


# The LLM-user forgery (one user reply forged in calls.sqlite and the trajectory alike, unseen by
# the replay of the recorded calls, caught by regenerating): test_board_trust.py,
# test_a_forged_reply_is_caught_by_the_default_verify.

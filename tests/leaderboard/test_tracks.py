"""Tracks as data: every track's content is locked by its hash; versions; errors."""

import json

import pytest

from collab_env.errors import ConfigError, UnknownEnvError
from collab_env.leaderboard.tracks import (
    LOCK_FILE,
    TRACKS_DIR,
    Track,
    builtin_tracks,
    get_track,
    load_track_file,
    locked_hashes,
    track_status,
)


def test_every_track_matches_its_locked_hash():
    """Changing a fixed field of a published track without a new version fails here: add a new
    file <name>@v<N+1>.json (and its hash to LOCK.json) instead."""
    locked = locked_hashes()
    tracks = builtin_tracks()
    for tid, t in tracks.items():
        assert tid in locked, f"{tid} is not in {LOCK_FILE}: add its hash {t.content_hash()}"
        assert t.content_hash() == locked[tid], (
            f"{tid}: its fixed fields changed ({t.source}); published tracks are immutable. Put the change "
            f"in {t.name}@v{t.version + 1}.json and lock that version's hash.")
    # Old versions stay listed: every locked id still has its file.
    assert set(locked) <= set(tracks), f"locked tracks without a file: {set(locked) - set(tracks)}"


def test_hash_covers_every_fixed_field_but_not_the_title():
    t = get_track("hidden-facts-easy@v1")
    d = t.to_dict()
    for key, new in [("seed", 7), ("trials", 5), ("k", 2), ("env_kwargs", {"split": "test", "num_items": 24}),
                     ("players", {"user": {"policy": "ask-then-answer"}}), ("success_threshold", 0.5),
                     ("env_id", "hidden-facts-v0"), ("metrics", ["reward"])]:
        changed = Track.from_dict({**d, key: new})
        assert changed.content_hash() != t.content_hash(), key
    assert Track.from_dict({**d, "title": "Another title"}).content_hash() == t.content_hash()


def test_builtin_tracks_and_status(tmp_path):
    tracks = builtin_tracks()
    for name in ("hidden-facts", "hidden-facts-easy", "hidden-facts-hard", "length-ratio",
                 "collabllm-medium", "collabllm-math-hard", "collabllm-bigcodebench"):
        assert f"{name}@v1" in tracks
    # v3: hidden-facts-v2 (issue 27), v2's user and items (hidden-facts-v1: the user answers
    # questions only) in text that reads as sense; nothing else changed
    t = tracks["hidden-facts@v3"]
    assert (t.episodes, t.k, t.submitted) == (100, 4, ("assistant",)) and t.env_id == "hidden-facts-v2"
    assert {k: v for k, v in t.fixed().items() if k != "env_id"} == \
        {k: v for k, v in tracks["hidden-facts@v2"].fixed().items() if k != "env_id"}
    # v4: hidden-facts-v3, the syntax question rule (issue 43), supersedes it
    assert track_status(t) == "legacy" and track_status(tracks["hidden-facts@v4"]) == "current"
    assert track_status(tracks["hidden-facts@v1"]) == track_status(tracks["hidden-facts@v2"]) == "legacy"
    newer = Track.from_dict({**t.to_dict(), "version": 5, "seed": 5})
    both = {t.id: t, newer.id: newer}
    assert track_status(t, both) == "legacy" and track_status(newer, both) == "current"
    assert get_track("hidden-facts").id == "hidden-facts@v4"  # a name means its current version
    p = tmp_path / "mine.json"
    p.write_text(json.dumps(newer.to_dict()))
    assert load_track_file(p) == newer
    assert get_track(str(p)) == newer


def test_track_errors():
    d = get_track("hidden-facts@v1").to_dict()
    with pytest.raises(UnknownEnvError, match="hidden-facts-easy"):
        get_track("hidden-facts-eazy")
    with pytest.raises(ConfigError, match="unknown keys"):
        Track.from_dict({**d, "temperature": 1})
    with pytest.raises(ConfigError, match="k=5 needs at least k trials"):
        Track.from_dict({**d, "k": 5})
    with pytest.raises(ConfigError, match="versioned id"):
        Track.from_dict({**d, "env_id": "hidden-facts"})
    with pytest.raises(ConfigError, match="both submitted and fixed"):
        Track.from_dict({**d, "players": {"assistant": {"policy": "ask-then-answer"}}})
    with pytest.raises(ConfigError, match="unknown metrics"):
        Track.from_dict({**d, "metrics": ["elo"]})


def test_track_files_are_named_after_their_id():
    for p in TRACKS_DIR.glob("*@v*.json"):
        assert load_track_file(p).id == p.stem

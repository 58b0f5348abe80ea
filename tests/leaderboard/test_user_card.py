"""The board shows each LLM-user track's simulator card (collab_env.leaderboard.board.user_card)."""

from __future__ import annotations

import json

from collab_env.leaderboard import board
from collab_env.leaderboard.tracks import builtin_tracks
from collab_env.policy import policy_spec


def _track(tid):
    return builtin_tracks()[tid]


def test_a_card_is_shown_for_the_simulator_with_the_same_spec_only(tmp_path, monkeypatch):
    t = _track("hidden-facts-easy-llm-user@v4")
    how = t.players["user"]
    same = policy_spec({"kind": "llm-user", "backend": how["backend"], "options": dict(how["options"]),
                        "sampling": dict(how["sampling"])}).to_dict()
    other = {**same, "sampling": {**same["sampling"], "max_new_tokens": 128}}
    cards = tmp_path / "user_cards.json"
    cards.write_text(json.dumps({"cards": [
        {"spec": other, "summary": "check-user flagged: broke_role", "source": "elsewhere.json"},
        {"spec": same, "summary": "check-user pass (3 ep/probe)", "source": "card.json"}]}))
    monkeypatch.setattr(board, "USER_CARDS_FILE", cards)
    assert board.user_card(t) == "user: check-user pass (3 ep/probe) (card.json)"
    row = board.track_row(t)
    assert row["user_card"] == board.user_card(t)
    cards.write_text(json.dumps({"cards": [{"spec": other, "summary": "x", "source": "y"}]}))
    assert "no fidelity card measured" in board.user_card(t)


def test_tracks_without_an_llm_user_have_no_card():
    assert board.user_card(_track("hidden-facts-easy@v4")) is None


def test_the_page_shows_the_card_beside_the_simulator():
    from collab_env.leaderboard.page import _track_section

    class _B:
        entries = {"t@v1": []}

    row = {"id": "t@v1", "env_id": "e-v0", "version": 1, "status": "current", "title": "T", "description": "",
           "user": "llm-user", "judge": None, "seeds": 1, "episodes": 1, "k": 1,
           "user_card": "user: check-user pass (card.json)"}
    html = _track_section(_B(), 0, row)  # type: ignore[arg-type]
    assert "user simulator card" in html and "check-user pass (card.json)" in html

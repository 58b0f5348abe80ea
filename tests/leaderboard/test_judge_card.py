"""Issue 45, part 6: the board shows each LLM-judged track's validity card beside the judge's
identity (collab_env.leaderboard.board.judge_card), and its judged metrics are numbers only when
the judge passed the check."""

from __future__ import annotations

import copy
import json
from html import escape

from collab_env.leaderboard import board
from collab_env.leaderboard.page import render_page
from collab_env.leaderboard.tracks import builtin_tracks
from tests.leaderboard.test_page import _ci, fixture_board

MATH = "collabllm-math-hard@v2"  # judge: embedded, judge_prefill; metrics include accuracy, interactivity
FAILS = "judge failed validity check (AUC 0.398 < 0.8; calibration error 0.271 > 0.25)"


def _card(spec, passed, auc=0.3975, ece=0.2706):
    return {"spec": spec, "passed": passed, "auc": auc, "ece": ece, "items": 40, "min_auc": 0.8, "max_ece": 0.25,
            "summary": f"validity check {'passes' if passed else 'fails'}", "source": "card.json"}


def test_the_shipped_card_says_the_embedded_judge_fails():
    t = builtin_tracks()[MATH]
    card = board.judge_card(t)
    assert card["passed"] is False and card["refusal"] == FAILS
    assert "benchmarks/results/judge_validity.json" in card["text"] and "AUC 0.398" in card["text"]
    # the judged metrics of the track: the judged components, and the reward and success they make
    assert card["judged"] == ["success", "reward", "accuracy", "interactivity"]
    assert board.track_row(t)["judge_card"] == card
    assert board.judge_card(builtin_tracks()["hidden-facts-easy@v4"]) is None  # no judge, no card


def test_the_card_is_the_one_of_the_tracks_judge_spec(tmp_path, monkeypatch):
    t = builtin_tracks()[MATH]
    cards = tmp_path / "judge_cards.json"
    same = {"backend": "embedded", "options": {"judge_prefill": True}}
    cards.write_text(json.dumps({"cards": [_card({"backend": "embedded", "options": {"judge_prefill": False}}, True),
                                           _card(same, True, auc=0.95, ece=0.05)]}))
    monkeypatch.setattr(board, "JUDGE_CARDS_FILE", cards)
    card = board.judge_card(t)
    assert card["passed"] is True and card["refusal"] == "" and card["text"] == "validity check passes (card.json)"
    cards.write_text(json.dumps({"cards": [_card({"backend": "litellm:openai/x"}, True)]}))
    card = board.judge_card(t)
    assert card["passed"] is None and "no validity check measured" in card["text"]
    assert card["refusal"] == "judge not checked for validity"


def _judged_board(card):
    data = fixture_board()
    mc = next(t for t in data["tracks"] if t["id"] == "math-chat@v1")
    mc["metrics"] = ["success", "accuracy", "turns"]
    mc["judge_card"] = card
    for e in data["entries"]:
        if e["track"] == "math-chat@v1":
            e["metrics"]["accuracy"] = _ci(0.625, 0.5, 0.75, n=40)
            e["metrics"]["turns"] = _ci(3.25, 3.0, 3.5, n=40)
    data["comparisons"].append({"track": "math-chat@v1", "a": "mc-embedded", "b": "mc-scripted",
                                "metric": "accuracy", "diff": -0.7, "lo": -0.8, "hi": -0.6, "n": 40,
                                "distinguishable": True})
    return data


def _section(html, track_id):
    start = html.index(f'<section class="track status-current" id="track-1" data-track="{track_id}"')
    return html[start:html.index("</section>", start)]


def _overview(html, track_id):
    start = html.index(f'<tr data-track="{track_id}">')
    return html[start:html.index("</tr>", start)]


def test_the_page_refuses_the_judged_numbers_of_a_failing_judge():
    card = {"text": "validity check fails (AUC 0.398) (benchmarks/results/judge_validity.json)", "passed": False,
            "judged": ["success", "accuracy"], "refusal": FAILS}
    page = render_page(_judged_board(card))
    html = _section(page, "math-chat@v1")
    assert "judge validity" in html and "validity check fails (AUC 0.398)" in html
    over = _overview(page, "math-chat@v1")  # the overview shows the first metric: success, judged
    assert escape(FAILS) in over and "0.900" not in over
    assert html.count(escape(FAILS)) >= 2 * 2 + 1  # success and accuracy of both entries, and the plots' note
    assert "0.625" not in html and "0.900" not in html  # accuracy and success: no numbers
    assert "3.250" in html  # turns is not judged: still a number
    # each refused cell is a word, the reason its title: a track judging many columns stays narrow
    assert html.count(f'<td class="num refused" data-value="" title="{escape(FAILS)}">refused</td>') == 2 * 2 + 2 * 2
    assert "Paired comparisons" not in html  # its one comparison is of a judged metric
    assert "No plots" in html


def test_the_page_shows_the_judged_numbers_of_a_passing_judge():
    card = {"text": "validity check passes (card.json)", "passed": True, "judged": ["success", "accuracy"],
            "refusal": ""}
    page = render_page(_judged_board(card))
    html = _section(page, "math-chat@v1")
    assert "validity check passes" in html and "judge failed" not in html and "0.900" in _overview(page, "math-chat@v1")
    assert "0.625" in html and "0.900" in html and "Paired comparisons" in html and "No plots" not in html
    # a board without cards (older data) renders as before
    plain = fixture_board()
    assert render_page(copy.deepcopy(plain)) == render_page(plain)

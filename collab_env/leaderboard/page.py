"""The leaderboard page: one static HTML file built from board data.

:func:`build_page` turns the dict of :func:`collab_env.leaderboard.board_data` (its shape is
documented in :mod:`collab_env.leaderboard.schema`) into a single HTML file that needs no server,
no network and no JavaScript framework:

* **Everything is rendered here, in Python.** The tables, the plots (inline SVG) and the
  trajectory viewers (``<details>`` elements) are plain HTML, so the page reads the same with
  JavaScript turned off, printed, or in a text browser.
* **Filters are CSS.** The "standard / custom / legacy" check boxes hide rows, plot marks and
  viewers through ``:has()`` selectors: no script needed.
* **Sorting is a small vanilla script** (:data:`~collab_env.leaderboard.page_assets.PAGE_JS`): it
  turns each sortable column header into a button that reorders the rows by the cell's
  ``data-value``. Without JavaScript the rows
  stay in the server's order (best first by the track's first metric).
* **The data is embedded** as JSON in ``<script type="application/json" id="board-data">``, so
  the page is its own archive; the script offers it as a download.
* **Every text is escaped.** Trajectories are untrusted model output; names, tasks and goals come
  from submissions. Nothing from the data reaches the page except through :func:`html.escape`
  (or, for the embedded JSON, with ``<``, ``>`` and ``&`` written as ``\\u`` escapes, so no
  ``</script>`` can end the block).

The page opens with an **overview** (a row per current track with entries, a column per model,
the scripted references in one column of their own; each cell the entry's first metric with its
interval and a verified mark, linked to the track's section) and **how to submit** (the three
commands). Each track's table fits a 1400 px window without sideways scrolling.

Numbers follow the statistics of :mod:`collab_env.leaderboard`: each metric is shown as
``mean [lo, hi]`` (the bootstrap 95% interval over tasks) with its ``n`` under it; pass^1..k in
one cell, with the entry's seeds and episodes; the row's **noise** (trials per task, flip rate,
minimum detectable difference); cost per episode (USD, or tokens for a model with no price; one
unit per plot axis); and the **pinned user simulator and judge** the row was verified against,
with their fault rates. Scripted references are badged as such on their rows.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from collab_env.errors import ConfigError
from collab_env.leaderboard.page_assets import PAGE_CSS, PAGE_JS
from collab_env.leaderboard.schema import validate_board_data

__all__ = ["build_page", "render_page", "is_reference", "PALETTE"]

#: Colours of the entries in a track's plots and legend (Okabe-Ito: distinguishable with the
#: common colour-vision deficiencies); the i-th entry of a track's table gets ``PALETTE[i % 8]``.
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000",
           "#F0E442")

_DASH = "\u2014"  # shown where a number is absent (not recorded, not applicable)

# ---------------------------------------------------------------------------------------------
# Public entry points
# ---------------------------------------------------------------------------------------------


def build_page(data: Mapping[str, Any], out: Path | str) -> Path:
    """Write the leaderboard page for ``data`` and return its path.

    Args:
        data: board data, the plain-JSON dict of :func:`collab_env.leaderboard.board_data`
            (``generated``, ``code_version``, ``tracks``, ``entries``, ``comparisons``).
        out: the HTML file to write; an existing directory means ``out / "index.html"``.
            Parent directories are created.

    Returns:
        The path written.

    Raises:
        ConfigError: ``data`` does not have the board's shape
            (:func:`~collab_env.leaderboard.schema.validate_board_data`: a missing field, a
            number that is not finite, a track or entry that is not in it) or lacks what the
            page relies on (a track's first metric, a comparison within one track); the
            message starts with the place, e.g. ``entries[2].metrics.success.lo``.
    """
    path = Path(out)
    if path.is_dir():
        path = path / "index.html"
    text = render_page(data)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)  # a reader never sees half a page
    return path


def render_page(data: Mapping[str, Any]) -> str:
    """The page of :func:`build_page` as a string (the same bytes for the same data: the page
    shows the data's own ``generated`` time, never the time of rendering)."""
    board = _Board(data)
    parts = [
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
        "<title>collab_env leaderboard</title>\n<style>\n", PAGE_CSS, "</style>\n</head>\n<body>\n",
        _header(board),
        _overview(board),
        _how_to_submit(data),
    ]
    for index, track in enumerate(board.tracks):
        parts.append(_track_section(board, index, track))
    rejected = data.get("rejected") or []
    if rejected:
        items = "".join(f"<li><code>{_e(r['path'])}</code>: {_e(r['reason'])}</li>\n" for r in rejected)
        parts.append(f'<section id="rejected">\n<h2>Rejected folders</h2>\n<p>These folders hold a '
                     f"submission.json the build could not list as an entry.</p>\n<ul>\n{items}</ul>\n</section>\n")
    parts.append(_footer(board))
    parts.append('<script type="application/json" id="board-data">')
    parts.append(_embedded_json(data))
    parts.append("</script>\n<script>\n")
    parts.append(PAGE_JS)
    parts.append("</script>\n</body>\n</html>\n")
    return "".join(parts)


# ---------------------------------------------------------------------------------------------
# Reading and checking the data: the shape is schema.py's; the page adds what it relies on
# ---------------------------------------------------------------------------------------------


def _fail(where: str, problem: str) -> ConfigError:
    return ConfigError(f"{where}: {problem}. The page needs it to draw the board; fix the "
                       "submission or the board data it was built from.")


class _Board:
    """The data, checked and indexed for rendering: tracks (current first, those with entries
    before those without), each track's entries in table order (best first by the track's
    first metric), each track's comparisons.

    The shape, the types, finite numbers and the cross-references are checked by
    :func:`~collab_env.leaderboard.schema.validate_board_data`; here only what the page itself
    relies on: a track has a first metric and k >= 1, a comparison's two entries are on its own
    track, a pass^k interval has lo <= hi.
    """

    def __init__(self, data: Mapping[str, Any]):
        validate_board_data(data)
        self.generated = data["generated"]
        self.code_version = data["code_version"]
        by_id: dict[str, Mapping[str, Any]] = {}
        for i, track in enumerate(data["tracks"]):
            if not track["metrics"]:
                raise _fail(f"tracks[{i}].metrics", "is empty (the table sorts by the first)")
            if track["k"] < 1:
                raise _fail(f"tracks[{i}].k", f"is {track['k']}, not >= 1")
            by_id[track["id"]] = track
        self.entries: dict[str, list[Mapping[str, Any]]] = {t: [] for t in by_id}
        self.entry_index: dict[str, int] = {}  # entry id -> position in the data
        for i, entry in enumerate(data["entries"]):
            for k, ci in entry["pass_k"].items():
                if not ci["lo"] <= ci["hi"]:
                    raise _fail(f"entries[{i}].pass_k.{k}",
                                f"interval [{ci['lo']}, {ci['hi']}] has lo > hi")
            self.entry_index[entry["id"]] = i
            self.entries[entry["track"]].append(entry)
        for track_id, rows in self.entries.items():
            first = by_id[track_id]["metrics"][0]
            rows.sort(key=lambda e: (-e["metrics"][first]["mean"] if first in e["metrics"]
                                     else math.inf, e["name"], e["id"]))
        self.entry_by_id = {e["id"]: e for e in data["entries"]}
        # Current tracks with entries first, then current ones without, then legacy ones; in
        # the data's order within each group (sorted is stable).
        self.tracks = sorted(by_id.values(), key=lambda t: (t["status"] == "legacy",
                                                             not self.entries[t["id"]]))

        self.comparisons: dict[str, list[Mapping[str, Any]]] = {t: [] for t in by_id}
        for i, comp in enumerate(data["comparisons"]):
            if comp["track"] not in by_id:
                raise _fail(f"comparisons[{i}].track", f"{comp['track']!r} is not among the "
                                                       f"tracks {sorted(by_id)}")
            for side in ("a", "b"):
                if self.entry_by_id[comp[side]]["track"] != comp["track"]:
                    raise _fail(f"comparisons[{i}].{side}", f"{comp[side]!r} is an entry of "
                                f"another track than {comp['track']!r}")
            if not comp["lo"] <= comp["hi"]:
                raise _fail(f"comparisons[{i}]", f"interval [{comp['lo']}, {comp['hi']}] has "
                                                 "lo > hi")
            self.comparisons[comp["track"]].append(comp)


# ---------------------------------------------------------------------------------------------
# Text and number formatting (every string from the data goes through _e)
# ---------------------------------------------------------------------------------------------


def _e(value: Any) -> str:
    """Escaped text for HTML content and quoted attributes."""
    return html.escape(str(value), quote=True)


def _interval(ci: Mapping[str, float]) -> str:
    return f"{ci['mean']:.3f} [{ci['lo']:.3f}, {ci['hi']:.3f}]"


def _percent(rate: float) -> str:
    return f"{100 * rate:.1f}%"


def _cost(value: float | None, unit: str | None = "usd") -> str:
    """A cost per episode in its unit: USD (``$0.0021``) or, for a model with no price (the
    embedded one), tokens (``981 tokens``); never tokens printed as dollars."""
    if value is None:
        return "not recorded"
    if unit == "tokens":
        return f"{value:.4g} tokens"
    if value == 0:
        return "$0"
    return f"${value:.3g}" if value >= 0.001 else f"${value:.2e}"


def _unit(entry: Mapping[str, Any]) -> str:
    return str(entry.get("cost_unit") or "usd")


def _count(value: Any) -> str:
    return f"{value:g}" if isinstance(value, (int, float)) else str(value)


def _ids(prefix: str, index: int) -> str:
    # Element ids come from positions, never from the data: no escaping question, no collision.
    return f"{prefix}-{index}"


def _kind_class(entry: Mapping[str, Any]) -> str:
    return f"kind-{entry['kind']}"


# ---------------------------------------------------------------------------------------------
# Page parts
# ---------------------------------------------------------------------------------------------


def _header(board: _Board) -> str:
    n_entries = sum(len(rows) for rows in board.entries.values())
    nav = "".join(
        f'<li class="status-{_e(t["status"])}"><a href="#{_ids("track", i)}">{_e(t["title"])}</a>'
        f'{" <span class=badge>legacy</span>" if t["status"] == "legacy" else ""}</li>'
        for i, t in enumerate(board.tracks))
    return f"""<header>
<h1>collab_env leaderboard</h1>
<p class="meta">Generated {_e(board.generated)} from code {_e(board.code_version)} &middot;
{len(board.tracks)} tracks &middot; {n_entries} entries</p>
<details class="help"><summary>How to read this page</summary>
<p>Every score is <b>mean [lo, hi]</b>: the mean over the track's tasks and the bootstrap 95%
confidence interval over tasks, with <b>n</b> (tasks or episodes behind it) beside it.
<b>pass^k</b> is the chance that all of k tries at a task succeed, C(successes, k) / C(trials, k)
averaged over tasks. <b>Simulator faults</b> and <b>judge faults</b> are the shares of calls to
the simulated user and to the judge that failed (counted, never scored as zero).
<b>Verified</b> entries were re-scored from their recorded calls by
<code>collab-env leaderboard verify</code>. <b>Standard</b> entries use the track's prompts
unmodified; <b>custom</b> ones change the agent's scaffolding. <b>Legacy</b> tracks are older
versions kept for the record. A paired comparison says <b>not distinguishable</b> when its
interval includes 0. <b>Noise</b>: trials per task; the <b>flip rate</b>, the share of tasks whose
verdict differs across the entry's trials; and the <b>MDD</b>, the minimum detectable difference:
the gap in success rate that a comparison with an entry of the same noise detects (level 0.05,
power 0.8). Each row names the user simulator and judge it was verified against (model, weights
digest, sampling); entries are only compared on the same ones.</p>
<p>Click a column header to sort by it (again to reverse). The tables, plots and trajectories
need no JavaScript.</p>
</details>
<fieldset class="filters"><legend>Show</legend>
<label><input type="checkbox" id="show-standard" checked> standard entries</label>
<label><input type="checkbox" id="show-custom" checked> custom entries</label>
<label><input type="checkbox" id="show-legacy" checked> legacy tracks</label>
</fieldset>
<nav><ol>{nav}</ol></nav>
</header>
<main>
"""


def _overview(board: _Board) -> str:
    """Model x track: each current track with entries is a row, each model a column (the
    scripted references share one), each cell the entries' first metric with its interval and
    verdict, linked to the track's section. Tracks are never ranked against each other."""
    shown = [(i, t) for i, t in enumerate(board.tracks)
             if t["status"] == "current" and board.entries[str(t["id"])]]
    if not shown:
        return ""
    refs = "scripted references"
    models: list[str] = []
    for _, t in shown:
        for e in board.entries[str(t["id"])]:
            m = refs if is_reference(e) else str(e["model"])
            if m not in models:
                models.append(m)
    models.sort(key=lambda m: m != refs)  # the references first: the range each track spans
    head = "".join(f'<th scope="col">{_e(m)}</th>' for m in models)
    rows = []
    for i, t in shown:
        metric = str(t["metrics"][0])
        refused = _refused(t)
        cells = []
        for m in models:
            items = []
            for e in board.entries[str(t["id"])]:
                if (refs if is_reference(e) else str(e["model"])) != m:
                    continue
                ci = e["metrics"].get(metric)
                value = (f"{ci['mean']:.3f} <small>[{ci['lo']:.3f}, {ci['hi']:.3f}]</small>" if ci
                         else _DASH)
                if metric in refused:
                    value = f'<small class="refused">{_e(refused[metric])}</small>'
                mark = ('<span class="ok" title="verified">&#10003;</span>' if e["verified"] and not e.get("failed")
                        else '<span class="warn" title="not verified">&#10007;</span>')
                # the entry's name above its value: a column per model stays narrow enough that
                # the overview needs no sideways scroll as models are added
                items.append(f'<div class="{_kind_class(e)}"><a href="#{_ids("track", i)}">{_e(e["name"])}</a> <br>'
                             f'{value} {mark}</div>')
            cells.append(f'<td>{"".join(items) or _DASH}</td>')
        rows.append(f'<tr data-track="{_e(t["id"])}"><th scope="row"><a href="#{_ids("track", i)}">'
                    f'{_e(t["title"])}</a><br><small>{_e(t["id"])} &middot; {_e(metric)}</small></th>'
                    + "".join(cells) + "</tr>\n")
    return (f'<section id="overview">\n<h2>Overview</h2>\n<p>Each current track\'s first metric '
            f"(mean [95% CI over tasks]) for every entry, by model; &#10003; verified by re-play. "
            f"<b>Scripted references</b> are hand-written programs, not models: they show the range a "
            f"track spans (the best a policy that asks can do, what answering at once gets). Tracks "
            f"measure different things and are never ranked against each other.</p>\n"
            f'<div class="scroll"><table class="overview"><thead><tr><th scope="col">track</th>{head}'
            f"</tr></thead>\n<tbody>\n{''.join(rows)}</tbody></table></div>\n</section>\n")


def _how_to_submit(data: Mapping[str, Any]) -> str:
    p = (data.get("verification") or {}).get("catch_probability")
    regen = (f"On a track with an LLM user or judge, enough episodes of each entry, drawn at random by the "
             f"verifier, are regenerated with the track's pinned models, every call compared, that one forged "
             f"simulator or judge reply is caught with probability at least {float(p):.2f}; signed verdicts "
             "regenerate every episode. Each row says how many were regenerated; the rest are re-played from "
             "the recorded calls." if isinstance(p, (int, float)) else "")
    return f"""<section id="submit">
<h2>How to submit</h2>
<ol class="commands">
<li>Play the track's episodes with your policy (every seat the track submits):
<pre>collab-env leaderboard run hidden-facts-easy@v2 --policy assistant=hf:PATH/TO/MODEL \\
    --name "my model" --model "what it is" --out benchmarks/leaderboard/hidden-facts-easy/v2/my-model</pre></li>
<li>Check it as the board will (re-plays every episode and compares every shown field):
<pre>collab-env leaderboard verify benchmarks/leaderboard/hidden-facts-easy/v2/my-model</pre></li>
<li>Build the page, then open a pull request with the folder:
<pre>collab-env leaderboard build benchmarks/leaderboard --out page.html</pre></li>
</ol>
<p>A <b>standard</b> entry plays every episode the track fixes (tasks &times; trials) with the
track's prompts. {regen} Each row carries its noise: trials per task, the flip rate (tasks whose
verdict differs across trials) and the minimum detectable difference of its success rate.</p>
</section>
"""


def _footer(board: _Board) -> str:
    return ("</main>\n<footer><p>All data of this page is embedded in it as JSON "
            "(<code>script#board-data</code>). "
            '<a id="download-data" download="board.json" hidden>Download it</a></p></footer>\n')


def _track_section(board: _Board, index: int, track: Mapping[str, Any]) -> str:
    entries = board.entries[str(track["id"])]
    status = str(track["status"])
    judge = track.get("judge")
    facts = [
        ("env", track["env_id"]), ("version", track["version"]),
        ("user simulator", track["user"]), ("judge", judge if judge is not None else "none"),
        ("seeds", track["seeds"]), ("episodes", track["episodes"]), ("k", track["k"]),
    ]
    if track.get("user_card"):
        facts.insert(3, ("user simulator card", track["user_card"]))
    card = track.get("judge_card")
    if card:
        facts.insert(facts.index(("judge", judge)) + 1, ("judge validity", card["text"]))
    facts_html = "".join(f"<div><dt>{_e(name)}</dt><dd>{_e(value)}</dd></div>"
                         for name, value in facts)
    badge = ' <span class="badge">legacy</span>' if status == "legacy" else ""
    parts = [
        f'<section class="track status-{_e(status)}" id="{_ids("track", index)}" '
        f'data-track="{_e(track["id"])}">\n'
        f'<h2>{_e(track["title"])}{badge} <small>{_e(track["id"])}</small></h2>\n',
        f'<p class="description">{_e(track.get("description", ""))}</p>\n',
        f'<dl class="facts">{facts_html}</dl>\n',
    ]
    if not entries:
        parts.append('<p class="empty">No entries yet.</p>\n</section>\n')
        return "".join(parts)
    parts.append(_table(board, index, track, entries))
    refused = _refused(track)
    plotted = _plot_metric(track)
    if plotted in refused or "success" in refused:
        why = refused.get(plotted) or refused["success"]
        parts.append(f'<p class="empty">No plots: they show {_e(plotted)} and pass^k, which this track\'s judge '
                     f'decides: {_e(why)}.</p>\n')
    else:
        parts.append(_plots(track, entries))
    comparisons = [c for c in board.comparisons[str(track["id"])] if str(c["metric"]) not in refused]
    if comparisons:
        parts.append(_comparisons(board, track, comparisons))
    parts.append(_trajectories(board, index, entries))
    parts.append("</section>\n")
    return "".join(parts)


def _regenerated(entry: Mapping[str, Any]) -> str:
    """How many of a verified entry's episodes had their simulator and judge calls regenerated
    (only on tracks with an LLM user or judge: ``regenerated`` is in the entry)."""
    if "regenerated" not in entry:
        return ""
    n, total = entry.get("regenerated"), entry.get("episodes")
    if not isinstance(n, int):
        return (' <span class="warn" title="the verdict does not record its regeneration">'
                "(regeneration not recorded)</span>")
    share = f" (one forged episode caught with p = {n / total:.2f})" if isinstance(total, int) and total else ""
    return f' &middot; <span class="regen">{_e(n)} of {_e(total)} episodes regenerated{_e(share)}</span>'


def _pass_ks(track: Mapping[str, Any]) -> list[str]:
    return [str(k) for k in range(1, int(track["k"]) + 1)]


def _verdict(entry: Mapping[str, Any]) -> str:
    problems = [str(x) for x in entry.get("problems") or []]
    if entry.get("failed"):
        return (f'<span class="warn" title="{_e("; ".join(problems))}">failed: '
                f'{_e(problems[-1][:160] if problems else "unreadable")}</span>')
    if entry["verified"]:
        return '<span class="ok" title="verified">verified</span>' + _regenerated(entry)
    return (f'<span class="warn" title="{_e("; ".join(problems) or "not verified")}">unverified'
            f'{": " + _e(problems[0][:160]) if problems else ""}</span>' + _regenerated(entry))


def is_reference(entry: Mapping[str, Any]) -> bool:
    """A scripted reference (its ``model`` says so): a baseline that shows the range a track
    spans, not a model."""
    return str(entry.get("model", "")).lower().startswith("scripted reference")


def _ci_cell(ci: Mapping[str, Any] | None, note: str) -> str:
    if ci is None:
        return f'<td class="num" data-value="">{_DASH}</td>'
    return (f'<td class="num" data-value="{float(ci["mean"])!r}"><b>{ci["mean"]:.3f}</b> '
            f'<small class="ci">[{ci["lo"]:.3f}, {ci["hi"]:.3f}]</small>'
            f'<small class="n">{_e(note)}</small></td>')


def _noise_cell(entry: Mapping[str, Any]) -> str:
    flip, mdd = entry.get("flip_rate"), entry.get("mdd")
    flip_text = (f"flip {_percent(float(flip))} of {_count(entry.get('flip_tasks', 0))} tasks"
                 if flip is not None else "flip: one trial per task")
    mdd_text = f"MDD {float(mdd):.3f}" if mdd is not None else f"MDD {_DASH}"
    return (f'<td class="num noise" data-value="{"" if mdd is None else repr(float(mdd))}">'
            f'{_e(_count(entry.get("trials", entry["seeds"])))} trials<small class="n">{_e(flip_text)}</small>'
            f'<small class="n">{_e(mdd_text)}</small></td>')


def _simulator_cell(entry: Mapping[str, Any]) -> str:
    ident = entry.get("simulator") or {}
    user, judge = ident.get("user"), ident.get("judge")
    faults = (f"faults: user {_percent(float(entry['simulator_fault_rate']))}, judge "
              f"{_percent(float(entry['judge_fault_rate']))} of {_count(entry['episodes'])} ep")
    lines = [f'<span class="ident">{_e(user) if user else _DASH}</span>']
    if judge:
        lines.append(f'<span class="ident">judge: {_e(judge)}</span>')
    lines.append(f'<small class="n">{_e(faults)}</small>')
    return f'<td class="sim">{"".join(lines)}</td>'


def _refused(track: Mapping[str, Any]) -> dict[str, str]:
    """The track's judged metrics whose judge did not pass its validity check (the board's
    ``judge_card``), each with what the page prints instead of its numbers."""
    card = track.get("judge_card")
    if not card or card.get("passed") is True:
        return {}
    return {str(m): str(card.get("refusal") or "judge failed validity check") for m in card.get("judged", ())}


def _refused_cell(text: str) -> str:
    """A judged column's cell without its number: "refused", the reason as its title (the section's
    judge-validity line states it in full; a track that judges many columns would otherwise be as
    wide as the reason is long, times the columns)."""
    return f'<td class="num refused" data-value="" title="{_e(text)}">refused</td>'


def _table(board: _Board, index: int, track: Mapping[str, Any],
           entries: Sequence[Mapping[str, Any]]) -> str:
    metrics = [str(m) for m in track["metrics"]]
    refused = _refused(track)
    ks = _pass_ks(track)
    # (label, sort type); "num" columns sort best-first on the first click.
    heads = [("#", "num", ""), ("entry", "text", "")]
    heads += [(m, "num", "mean [95% CI]") for m in metrics]
    heads += [(f"pass^1..{ks[-1]}", "num", f"sorts by pass^{ks[-1]}"),
              ("noise", "num", "trials, flip rate, MDD"), ("cost / episode", "num", ""),
              ("user simulator / judge", "", "pinned identity, faults")]
    head_html = "".join(
        f'<th scope="col"{f" data-type={t}" if t else ""}>{_e(label)}'
        f'{f"<br><small>{_e(sub)}</small>" if sub else ""}</th>'
        for label, t, sub in heads)
    rows = []
    for rank, entry in enumerate(entries, start=1):
        cells = [f'<td data-value="{rank}">{rank}</td>']
        n_traj = len(entry.get("trajectories", []))
        entry_index = board.entry_index[str(entry["id"])]
        link = (f' &middot; <a href="#{_ids("traj", entry_index)}">{n_traj} trajectories</a>' if n_traj else "")
        ref = ' <span class="badge ref">scripted reference</span>' if is_reference(entry) else ""
        cells.append(
            f'<td class="entry" data-value="{_e(str(entry["name"]).lower())}"><span class="name">'
            f'{_e(entry["name"])}</span>{ref}<br><span class="model">{_e(entry["model"])}</span><br>'
            f'<small>{_e(entry["id"])} &middot; <span class="kind">{_e(entry["kind"])}</span> &middot; '
            f'{_verdict(entry)}{link}</small></td>')
        for metric in metrics:
            ci = entry["metrics"].get(metric)
            cells.append(_refused_cell(refused[metric]) if metric in refused
                         else _ci_cell(ci, f"n={_count(ci['n'])}" if ci else ""))
        if "success" in refused:  # pass^k, the flip rate and the MDD count judged successes
            cells += [_refused_cell(refused["success"])] * 2
        else:
            top = entry["pass_k"].get(ks[-1])
            lines = "".join(
                f'<span class="pk">^{k} {entry["pass_k"][k]["mean"]:.3f} '
                f'<small>[{entry["pass_k"][k]["lo"]:.2f}, {entry["pass_k"][k]["hi"]:.2f}]</small></span>'
                if k in entry["pass_k"] else f'<span class="pk">^{k} {_DASH}</span>' for k in ks)
            cells.append(f'<td class="num passk" data-value="{"" if top is None else repr(float(top["mean"]))}">'
                         f'{lines}<small class="n">{_e(_count(entry["seeds"]))} seeds, '
                         f'{_e(_count(entry["episodes"]))} ep</small></td>')
            cells.append(_noise_cell(entry))
        cost, unit = entry["cost_per_episode"], _unit(entry)
        cost_key = "" if cost is None else repr(float(cost))
        cells.append(f'<td class="num" data-value="{cost_key}" data-unit="{_e(unit)}">'
                     f'{_e(_cost(cost, unit))}</td>')
        cells.append(_simulator_cell(entry))
        rows.append(f'<tr class="{_kind_class(entry)}" data-entry="{_e(entry["id"])}">'
                    + "".join(cells) + "</tr>\n")
    return (f'<div class="scroll"><table class="board sortable" id="{_ids("table", index)}">\n'
            f"<caption>Entries of {_e(track['title'])}, best first by "
            f"{_e(metrics[0])}</caption>\n<thead><tr>{head_html}</tr></thead>\n"
            f"<tbody>\n{''.join(rows)}</tbody></table></div>\n")


# ---------------------------------------------------------------------------------------------
# Plots: inline SVG
# ---------------------------------------------------------------------------------------------

_W, _H = 440, 300
_LEFT, _RIGHT, _TOP, _BOTTOM = 56, 16, 16, 44
_INSET = 8


def _nice_axis(lo: float, hi: float, count: int = 5) -> tuple[float, float, list[float]]:
    """An axis range covering [lo, hi] and its ticks, at steps of 1, 2, 2.5 or 5 x 10^m."""
    if not hi > lo:
        pad = abs(lo) * 0.1 or 0.5
        lo, hi = lo - pad, hi + pad
    raw = (hi - lo) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw * (1 - 1e-9))
    start = math.floor(lo / step + 1e-9) * step
    end = math.ceil(hi / step - 1e-9) * step
    ticks = [start + i * step for i in range(int(round((end - start) / step)) + 1)]
    return start, end, ticks


def _tick_label(value: float) -> str:
    return format(round(value, 10), "g")


def _axes(x_range: tuple[float, float, list[float]], y_range: tuple[float, float, list[float]],
          x_label: str, y_label: str, x_tick=_tick_label) -> tuple[str, Any, Any]:
    x0, x1, xticks = x_range
    y0, y1, yticks = y_range

    # The data area sits _INSET px inside the frame, so marks at the ends of a range (a cost
    # of 0, a success of 1) are not drawn on the frame itself.
    def sx(x: float) -> float:
        return _LEFT + _INSET + (x - x0) / (x1 - x0) * (_W - _LEFT - _RIGHT - 2 * _INSET)

    def sy(y: float) -> float:
        return _H - _BOTTOM - _INSET - (y - y0) / (y1 - y0) * (_H - _TOP - _BOTTOM - 2 * _INSET)

    out = [f'<rect class="frame" x="{_LEFT}" y="{_TOP}" width="{_W - _LEFT - _RIGHT}" '
           f'height="{_H - _TOP - _BOTTOM}"/>']
    for t in xticks:
        out.append(f'<line class="grid" x1="{sx(t):.1f}" x2="{sx(t):.1f}" y1="{_TOP}" '
                   f'y2="{_H - _BOTTOM}"/><text class="tick" x="{sx(t):.1f}" '
                   f'y="{_H - _BOTTOM + 14}" text-anchor="middle">{_e(x_tick(t))}</text>')
    for t in yticks:
        out.append(f'<line class="grid" x1="{_LEFT}" x2="{_W - _RIGHT}" y1="{sy(t):.1f}" '
                   f'y2="{sy(t):.1f}"/><text class="tick" x="{_LEFT - 6}" y="{sy(t) + 4:.1f}" '
                   f'text-anchor="end">{_e(_tick_label(t))}</text>')
    out.append(f'<text class="label" x="{(_LEFT + _W - _RIGHT) / 2:.1f}" y="{_H - 8}" '
               f'text-anchor="middle">{_e(x_label)}</text>')
    out.append(f'<text class="label" transform="translate(14 {(_TOP + _H - _BOTTOM) / 2:.1f}) '
               f'rotate(-90)" text-anchor="middle">{_e(y_label)}</text>')
    return "".join(out), sx, sy


def _marker(entry: Mapping[str, Any], x: float, y: float, colour: str, title: str) -> str:
    # Standard entries: filled circles; custom entries: hollow squares.
    if entry["kind"] == "custom":
        shape = (f'<rect x="{x - 4.5:.1f}" y="{y - 4.5:.1f}" width="9" height="9" fill="white" '
                 f'stroke="{colour}" stroke-width="2"/>')
    else:
        shape = f'<circle cx="{x:.1f}" cy="{y:.1f}" r="5" fill="{colour}"/>'
    return f"{shape}<title>{_e(title)}</title>"


def _plot_metric(track: Mapping[str, Any]) -> str:
    metrics = [str(m) for m in track["metrics"]]
    return "reward" if "reward" in metrics else metrics[0]


def _plots(track: Mapping[str, Any], entries: Sequence[Mapping[str, Any]]) -> str:
    colours = {str(e["id"]): PALETTE[i % len(PALETTE)] for i, e in enumerate(entries)}
    legend = "".join(
        f'<li class="{_kind_class(e)}"><span class="swatch {_kind_class(e)}" '
        f'style="--c: {colours[str(e["id"])]}"></span>{_e(e["name"])}</li>' for e in entries)
    return (f'<div class="plots">\n{_cost_plot(track, entries, colours)}\n'
            f'{_pass_k_plot(track, entries, colours)}\n</div>\n'
            f'<ul class="legend">{legend}</ul>\n')


def _cost_plot(track: Mapping[str, Any], entries: Sequence[Mapping[str, Any]],
               colours: Mapping[str, str]) -> str:
    metric = _plot_metric(track)
    costed = [e for e in entries if e["cost_per_episode"] is not None and metric in e["metrics"]]
    # One axis, one unit: USD when any entry has a price, else tokens. An entry costed in the
    # other unit is listed under the plot, not drawn on an axis that means something else.
    unit = "usd" if any(_unit(e) == "usd" for e in costed) else "tokens"
    points = [e for e in costed if _unit(e) == unit]
    missing = [e for e in entries if e not in costed]
    other = [e for e in costed if e not in points]
    title = f"{metric} versus cost per episode"
    note = ""
    for group, why in ((missing, f"no cost or no {metric}"), (other, "cost in tokens, axis in USD")):
        if group:
            note += (f"<p class=\"note\">Not plotted ({_e(why)}): "
                     + ", ".join(f'<span class="{_kind_class(e)}">{_e(e["name"])}</span>'
                                 for e in group) + "</p>")
    if not points:
        return (f'<figure class="plot cost-plot"><figcaption>{_e(title)}</figcaption>'
                f'<p class="note">No entry of this track records a cost.</p>{note}</figure>')
    costs = [float(e["cost_per_episode"]) for e in points]
    lows = [e["metrics"][metric]["lo"] for e in points]
    highs = [e["metrics"][metric]["hi"] for e in points]
    x_range = _nice_axis(0.0, max(costs) * 1.05 if max(costs) > 0 else 1.0)
    y_range = _nice_axis(min(lows), max(highs))
    axes, sx, sy = _axes(x_range, y_range, f"cost per episode ({'USD' if unit == 'usd' else 'tokens'})",
                         f"{metric} (mean, 95% CI)")
    marks = []
    for e in points:
        ci = e["metrics"][metric]
        x, colour = sx(float(e["cost_per_episode"])), colours[str(e["id"])]
        text = (f"{e['name']}: {metric} {_interval(ci)}, cost {_cost(e['cost_per_episode'], unit)} "
                "per episode")
        marks.append(
            f'<g class="mark {_kind_class(e)}" data-entry="{_e(e["id"])}">'
            f'<line class="bar" x1="{x:.1f}" x2="{x:.1f}" y1="{sy(ci["lo"]):.1f}" '
            f'y2="{sy(ci["hi"]):.1f}" stroke="{colour}"/>'
            f'{_marker(e, x, sy(ci["mean"]), colour, text)}</g>')
    return (f'<figure class="plot cost-plot"><figcaption>{_e(title)}</figcaption>'
            f'<svg viewBox="0 0 {_W} {_H}" role="img" aria-label="{_e(title)}">{axes}'
            f'{"".join(marks)}</svg>{note}</figure>')


def _pass_k_plot(track: Mapping[str, Any], entries: Sequence[Mapping[str, Any]],
                 colours: Mapping[str, str]) -> str:
    ks = [int(k) for k in _pass_ks(track)]
    title = f"pass^k for k = 1..{ks[-1]}"
    x_range = (0.5, ks[-1] + 0.5, [float(k) for k in ks])
    y_range = _nice_axis(0.0, 1.0)
    axes, sx, sy = _axes(x_range, y_range, "k (tries that must all succeed)",
                         "pass^k (mean, 95% CI)", x_tick=lambda t: str(int(t)))
    # Spread the entries a little along x so that their interval bars do not hide each other.
    width = min(0.3, 0.08 * len(entries))
    marks = []
    for i, e in enumerate(entries):
        offset = 0.0 if len(entries) == 1 else -width / 2 + width * i / (len(entries) - 1)
        colour = colours[str(e["id"])]
        points = [(k, k + offset, e["pass_k"][str(k)]) for k in ks if str(k) in e["pass_k"]]
        if not points:
            continue
        path = " ".join(f"{sx(x):.1f},{sy(ci['mean']):.1f}" for _, x, ci in points)
        dash = ' stroke-dasharray="4 3"' if e["kind"] == "custom" else ""
        group = [f'<g class="mark {_kind_class(e)}" data-entry="{_e(e["id"])}">'
                 f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="1.5"'
                 f"{dash}/>"]
        for k, x, ci in points:
            group.append(f'<line class="bar" x1="{sx(x):.1f}" x2="{sx(x):.1f}" '
                         f'y1="{sy(ci["lo"]):.1f}" y2="{sy(ci["hi"]):.1f}" stroke="{colour}"/>')
            group.append(_marker(e, sx(x), sy(ci["mean"]), colour,
                                 f"{e['name']}: pass^{k} {_interval(ci)}"))
        group.append("</g>")
        marks.append("".join(group))
    return (f'<figure class="plot pass-k-plot"><figcaption>{_e(title)}</figcaption>'
            f'<svg viewBox="0 0 {_W} {_H}" role="img" aria-label="{_e(title)}">{axes}'
            f'{"".join(marks)}</svg></figure>')


# ---------------------------------------------------------------------------------------------
# Comparisons and trajectories
# ---------------------------------------------------------------------------------------------


def _comparisons(board: _Board, track: Mapping[str, Any],
                 comparisons: Sequence[Mapping[str, Any]]) -> str:
    rows = []
    for comp in comparisons:
        a, b = board.entry_by_id[str(comp["a"])], board.entry_by_id[str(comp["b"])]
        lo, hi = float(comp["lo"]), float(comp["hi"])
        if lo > 0:
            verdict, css = f"{a['name']} higher", "ok"
        elif hi < 0:
            verdict, css = f"{b['name']} higher", "ok"
        else:
            verdict, css = "not distinguishable (interval includes 0)", "muted"
        classes = " ".join(sorted({_kind_class(a), _kind_class(b)}))
        rows.append(
            f'<tr class="{classes}"><td>{_e(a["name"])}</td><td>{_e(b["name"])}</td>'
            f'<td>{_e(comp["metric"])}</td><td class="num" data-value="{float(comp["diff"])!r}">'
            f'{float(comp["diff"]):+.3f} [{lo:+.3f}, {hi:+.3f}]</td>'
            f'<td class="num" data-value="{float(comp["n"])!r}">{_e(_count(comp["n"]))}</td>'
            f'<td class="{css}">{_e(verdict)}</td></tr>\n')
    return ('<h3>Paired comparisons</h3>\n<div class="scroll"><table class="comparisons sortable">'
            "<caption>A minus B on the same tasks and seeds, with its bootstrap 95% interval"
            "</caption><thead><tr><th scope=\"col\" data-type=\"text\">A</th>"
            "<th scope=\"col\" data-type=\"text\">B</th><th scope=\"col\" data-type=\"text\">"
            "metric</th><th scope=\"col\" data-type=\"num\">A &minus; B [95% CI]</th>"
            "<th scope=\"col\" data-type=\"num\">n</th><th scope=\"col\">verdict</th></tr></thead>"
            f"<tbody>\n{''.join(rows)}</tbody></table></div>\n")


def _trajectories(board: _Board, index: int, entries: Sequence[Mapping[str, Any]]) -> str:
    blocks = []
    for entry in entries:
        trajectories = entry.get("trajectories") or []
        if not trajectories:
            continue
        items = "".join(_trajectory(traj) for traj in trajectories)
        blocks.append(
            f'<details class="entry-trajectories {_kind_class(entry)}" '
            f'id="{_ids("traj", board.entry_index[str(entry["id"])])}" '
            f'data-entry="{_e(entry["id"])}">'
            f"<summary>{_e(entry['name'])} &middot; {len(trajectories)} trajectories"
            f"</summary>\n{items}</details>\n")
    if not blocks:
        return ""
    return "<h3>Trajectories</h3>\n" + "".join(blocks)


def _trajectory(traj: Mapping[str, Any]) -> str:
    success = bool(traj["success"])
    players: dict[str, int] = {}
    turns = []
    for number, turn in enumerate(traj["turns"], start=1):
        player = str(turn["player"])
        slot = players.setdefault(player, len(players))
        reward = turn.get("reward")
        components = turn.get("components") or {}
        scores = "".join(f"<span>{_e(name)} {float(value):.3f}</span>"
                         for name, value in components.items())
        reward_html = (f'<span class="reward">reward {float(reward):.3f}</span>'
                       if reward is not None else '<span class="reward muted">no reward</span>')
        turns.append(
            f'<li class="turn player-{slot % 4}"><div class="who">{number}. {_e(player)}</div>'
            f'<div class="text">{_e(turn["text"])}</div>'
            f'<div class="scores">{reward_html}{scores}</div></li>\n')
    goal = json.dumps(traj.get("hidden_goal"), indent=2, ensure_ascii=False, sort_keys=True)
    summary = (f"episode {_e(traj['episode'])} &middot; task {_e(traj['task'])} &middot; "
               f"seed {_e(traj['seed'])} &middot; reward {float(traj['reward']):.3f} &middot; "
               + ('<span class="ok">success</span>' if success
                  else '<span class="warn">failure</span>'))
    return (f'<details class="trajectory" data-episode="{_e(traj["episode"])}">'
            f"<summary>{summary}</summary>\n<div class=\"trajectory-body\">"
            f'<ol class="turns">\n{"".join(turns)}</ol>'
            f'<aside class="goal"><h4>Hidden goal</h4><p class="muted">Known to the simulated '
            f"user and the scorer, not to the agent.</p><pre>{_e(goal)}</pre></aside>"
            "</div></details>\n")


def _embedded_json(data: Mapping[str, Any]) -> str:
    text = json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    # Inside <script> only "</script" (and "<!--") could end the block: write < > & as \u
    # escapes, which JSON.parse reads back as the same characters. U+2028/9 are valid JSON.
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")

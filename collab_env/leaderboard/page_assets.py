"""The leaderboard page's whole style sheet (:data:`PAGE_CSS`) and script (:data:`PAGE_JS`),
inlined by :func:`collab_env.leaderboard.page.render_page` (the page needs no other file)."""

from __future__ import annotations

__all__ = ["PAGE_CSS", "PAGE_JS"]

# ---------------------------------------------------------------------------------------------
# Assets: the page's whole style sheet and script
# ---------------------------------------------------------------------------------------------

PAGE_CSS = """\
:root { --fg: #1b1f24; --muted: #5c6670; --line: #d8dde3; --bg-alt: #f5f7f9;
        --ok: #0a7a3d; --warn: #a34b00; font-family: system-ui, -apple-system, "Segoe UI",
        "DejaVu Sans", sans-serif; color: var(--fg); }
body { margin: 0 auto; max-width: 1800px; padding: 0 1.5rem 3rem; line-height: 1.4; }
h1 { margin: 1.2rem 0 0.2rem; }
h2 { margin-top: 2.5rem; border-bottom: 2px solid var(--line); padding-bottom: 0.2rem; }
h2 small, .meta, .muted, .note, caption, small { color: var(--muted); font-weight: normal; }
caption { text-align: left; padding: 0.3rem 0; font-size: 0.9rem; }
.badge { font-size: 0.75rem; background: #eee3c4; border-radius: 3px; padding: 0.05rem 0.35rem;
         vertical-align: middle; }
nav ol { display: flex; flex-wrap: wrap; gap: 0.3rem 1.5rem; padding: 0; list-style: none; }
.filters { display: inline-flex; gap: 1rem; border: 1px solid var(--line); border-radius: 4px; }
.help { max-width: 60rem; margin: 0.5rem 0; }
.facts { display: flex; flex-wrap: wrap; gap: 0.2rem 1.5rem; margin: 0.5rem 0; }
.facts div { display: flex; gap: 0.4rem; } .facts dt { color: var(--muted); } .facts dd { margin: 0; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; font-size: 0.85rem; }
th, td { border-bottom: 1px solid var(--line); padding: 0.3rem 0.35rem; vertical-align: top;
         text-align: left; }
th { background: var(--bg-alt); font-weight: 600; }
th button { font: inherit; background: none; border: 0; padding: 0; cursor: pointer;
            text-align: left; color: inherit; }
th[aria-sort=ascending] button::after { content: " \\25B2"; }
th[aria-sort=descending] button::after { content: " \\25BC"; }
td.num { text-align: right; white-space: nowrap; font-variant-numeric: tabular-nums; }
td.num small.n, td.num small.ci, td.sim .ident, td.sim small.n, td.passk .pk { display: block; }
td.num small.n { font-size: 0.75rem; }
td.num.refused { color: var(--muted); }
td.passk .pk small { font-size: 0.72rem; }
td.sim { max-width: 17rem; font-size: 0.75rem; overflow-wrap: anywhere; }
table.board, table.overview { width: 100%; }
table.overview td div { white-space: nowrap; } table.overview td, table.overview th { font-size: 0.8rem; }
.badge.ref { background: #e3e8ef; }
.commands pre { background: var(--bg-alt); padding: 0.4rem 0.6rem; overflow-x: auto; }
#submit, #overview { max-width: 100%; }
tbody tr:nth-child(even) { background: var(--bg-alt); }
.name { font-weight: 600; }
td.entry { min-width: 11rem; max-width: 19rem; overflow-wrap: anywhere; }
.ok { color: var(--ok); } .warn { color: var(--warn); }
.plots { display: flex; flex-wrap: wrap; gap: 1.5rem; margin-top: 1rem; }
.plot { margin: 0; width: 440px; max-width: 100%; }
.plot figcaption { font-weight: 600; font-size: 0.9rem; }
.plot svg { width: 100%; height: auto; font-size: 11px; }
.plot .frame { fill: none; stroke: var(--line); }
.plot .grid { stroke: #eceff2; } .plot .tick { fill: var(--muted); }
.plot .label { fill: var(--fg); } .plot .bar { stroke-width: 1.5; }
.legend { list-style: none; display: flex; flex-wrap: wrap; gap: 0.3rem 1.2rem; padding: 0; }
.swatch { display: inline-block; width: 0.8rem; height: 0.8rem; border-radius: 50%;
          background: var(--c); margin-right: 0.35rem; vertical-align: -0.1rem; }
.swatch.kind-custom { border-radius: 0; background: white; border: 2px solid var(--c);
                      width: 0.6rem; height: 0.6rem; }
details.entry-trajectories { border: 1px solid var(--line); border-radius: 4px;
                             margin: 0.4rem 0; padding: 0.3rem 0.6rem; }
details.entry-trajectories > summary { font-weight: 600; cursor: pointer; }
details.trajectory { margin: 0.4rem 0 0.4rem 1rem; }
details.trajectory > summary { cursor: pointer; }
.trajectory-body { display: grid; grid-template-columns: minmax(0, 3fr) minmax(0, 2fr);
                   gap: 1rem; margin: 0.5rem 0; }
.turns { margin: 0; padding: 0; list-style: none; }
.turn { border-left: 4px solid #9aa5b1; background: var(--bg-alt); margin: 0 0 0.5rem;
        padding: 0.4rem 0.6rem; }
.turn.player-0 { border-color: #0072B2; } .turn.player-1 { border-color: #D55E00; }
.turn.player-2 { border-color: #009E73; } .turn.player-3 { border-color: #CC79A7; }
.turn .who { font-weight: 600; font-size: 0.85rem; }
.turn .text { white-space: pre-wrap; overflow-wrap: anywhere; font-family: ui-monospace,
              "DejaVu Sans Mono", monospace; font-size: 0.85rem; margin: 0.2rem 0; }
.turn .scores { display: flex; flex-wrap: wrap; gap: 0.8rem; font-size: 0.8rem;
                color: var(--muted); }
.turn .reward { color: var(--fg); font-weight: 600; }
.goal { border: 1px dashed var(--warn); background: #fff8ef; padding: 0.4rem 0.8rem;
        align-self: start; }
.goal h4 { margin: 0.2rem 0; } .goal pre { white-space: pre-wrap; overflow-wrap: anywhere; }
footer { margin-top: 3rem; color: var(--muted); font-size: 0.85rem; }
/* The filters: plain CSS, so they work without JavaScript. */
body:has(#show-standard:not(:checked)) .kind-standard,
body:has(#show-custom:not(:checked)) .kind-custom,
body:has(#show-legacy:not(:checked)) .status-legacy { display: none; }
@media (max-width: 800px) { .trajectory-body { grid-template-columns: 1fr; } }
"""

PAGE_JS = """\
// Sorting for the tables (the page reads fully without this script).
(function () {
  "use strict";

  // A cell's sort key: its data-value; numbers compare as numbers, empty values go last.
  function key(row, column, type) {
    var raw = row.cells[column].getAttribute("data-value");
    if (raw === null || raw === "") return null;
    return type === "num" ? parseFloat(raw) : raw;
  }

  function sortBy(table, column, type, th) {
    // First click: numbers best (largest) first, text A to Z; each further click reverses.
    var current = th.getAttribute("aria-sort");
    var descending = current ? current === "ascending" : type === "num";
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = key(a, column, type), y = key(b, column, type);
      if (x === null || y === null) return (x === null) - (y === null);
      var order = x < y ? -1 : x > y ? 1 : 0;
      return descending ? -order : order;
    });
    rows.forEach(function (row) { body.appendChild(row); });
    Array.prototype.forEach.call(th.parentNode.cells, function (cell) {
      cell.removeAttribute("aria-sort");
    });
    th.setAttribute("aria-sort", descending ? "descending" : "ascending");
  }

  document.querySelectorAll("table.sortable").forEach(function (table) {
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th, column) {
      var type = th.getAttribute("data-type");
      if (!type) return;
      var button = document.createElement("button");
      button.type = "button";
      while (th.firstChild) button.appendChild(th.firstChild);
      th.appendChild(button);
      button.addEventListener("click", function () { sortBy(table, column, type, th); });
    });
  });

  // Following a link to an entry's trajectories opens them.
  function openTarget() {
    var target = location.hash && document.getElementById(location.hash.slice(1));
    if (target && target.tagName === "DETAILS") target.open = true;
  }
  window.addEventListener("hashchange", openTarget);
  openTarget();

  // Offer the embedded board data as a file.
  var data = document.getElementById("board-data");
  var link = document.getElementById("download-data");
  if (data && link) {
    link.href = URL.createObjectURL(new Blob([data.textContent], {type: "application/json"}));
    link.hidden = false;
  }
})();
"""

"""The leaderboard: fixed tracks, verifiable submissions, statistics with intervals, the page.

::

    collab-env leaderboard tracks                          the tracks (current and legacy)
    collab-env leaderboard run TRACK --policy P=SPEC --out DIR   play a track, write a submission
    collab-env leaderboard verify DIR                      re-play it offline, accept or reject
    collab-env leaderboard build DIR [--out FILE]          the static HTML page of a board folder

* :mod:`~collab_env.leaderboard.tracks`: tracks as data (JSON files, versioned, hashed);
* :mod:`~collab_env.leaderboard.submission`: :func:`run_submission` (through the eval runner);
* :mod:`~collab_env.leaderboard.verify`: :func:`verify_submission`;
* :mod:`~collab_env.leaderboard.stats`: success, pass^k, bootstrap intervals over tasks,
  paired comparisons;
* :mod:`~collab_env.leaderboard.board`: :func:`board_data`, the page's input;
  :mod:`~collab_env.leaderboard.schema`: :func:`validate_board_data`;
* :mod:`~collab_env.leaderboard.page`: ``build_page(data, out)``, the HTML page.

``import collab_env`` does not import this package; importing it loads no model.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "board_data",
    "validate_board_data",
    "run_submission",
    "verify_submission",
    "get_track",
    "builtin_tracks",
    "Track",
]

_LAZY = {
    "board_data": "collab_env.leaderboard.board",
    "validate_board_data": "collab_env.leaderboard.schema",
    "run_submission": "collab_env.leaderboard.submission",
    "verify_submission": "collab_env.leaderboard.verify",
    "get_track": "collab_env.leaderboard.tracks",
    "builtin_tracks": "collab_env.leaderboard.tracks",
    "Track": "collab_env.leaderboard.tracks",
}


def __getattr__(name: str) -> Any:
    # Lazy: `collab_env.leaderboard.page` (or `tracks`) must not pull in the eval runner.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'collab_env.leaderboard' has no attribute {name!r}")

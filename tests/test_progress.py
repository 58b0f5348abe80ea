"""The one progress display (collab_env/_progress.py): a bar on a terminal; with ``lines=True``,
plain lines when stderr is redirected, so a long run in a log or CI job is never silent."""

from __future__ import annotations

import io

from collab_env import _progress
from collab_env._progress import LineProgress, progress_bar


def test_lines_every_tenth_and_at_the_end():
    out = io.StringIO()
    p = LineProgress(25, "eval x", file=out)
    for i in range(25):
        if i == 20:
            p.set_postfix(failed=1)
        p.update(1)
    p.close()
    lines = out.getvalue().splitlines()
    counts = [line.split(": ")[1].split(" ")[0] for line in lines]
    assert counts == [f"{n}/25" for n in (2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 25)]
    assert lines[-1].startswith("eval x: 25/25 ep (100%, failed 1) ")
    assert lines[0].startswith("eval x: 2/25 ep (8%) ") and lines[0].endswith(" min")


def test_a_resumed_or_unknown_total_and_no_repeat_on_close(monkeypatch):
    out = io.StringIO()
    p = LineProgress(10, "run", initial=5, file=out)
    p.update(1)
    p.close()
    p.close()
    assert out.getvalue().splitlines()[0].startswith("run: 6/10 ep (60%)") and len(out.getvalue().splitlines()) == 1
    out = io.StringIO()
    clock = iter([0.0, 10.0, 61.0, 61.0, 61.0])
    monkeypatch.setattr(_progress.time, "monotonic", lambda: next(clock))
    p = LineProgress(None, "stream", file=out)
    p.update(1)  # 10 s: nothing yet
    p.update(1)  # 61 s: a line (LINE_INTERVAL_S passed)
    p.close()    # that count was just printed: no second line
    assert [line.split(" min")[0] for line in out.getvalue().splitlines()] == ["stream: 2 ep 1.0"]


def test_which_display(monkeypatch):
    monkeypatch.setattr(_progress.sys.stderr, "isatty", lambda: False, raising=False)
    assert progress_bar(10, "x") is None                       # default: a terminal only
    assert isinstance(progress_bar(10, "x", lines=True), LineProgress)
    assert progress_bar(10, "x", lines=True, show=False) is None
    bar = progress_bar(10, "x", show=True)                     # forced on: a tqdm bar
    assert not isinstance(bar, LineProgress) and hasattr(bar, "refresh")
    bar.close()

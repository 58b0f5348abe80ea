"""Every seeded board entry re-plays under the code as it is now.

A signed verdict is keyed by the entry's files, its track and collab_env's version, not by the
code that scores it, and ``sign`` re-signs the verdicts it has kept. So a change to a scripted
user or a scorer that changes what an old entry's episodes earn went unnoticed: the question
rule's change moved ``chat-question-user`` (pinned by ``math-chat-scripted-user@v2``) from the
opener rule to the syntax rule, and that track's two embedded entries stopped re-playing while
their verdicts stayed signed as passes. This test re-plays each entry (recorded LLM calls from
its own cache, no regeneration: the pinned models' determinism is
``tests/leaderboard/test_submission.py``'s business), so such a change fails here, in the change
that makes it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from collab_env.leaderboard.submission import load_submission
from collab_env.leaderboard.verify import verify_submission

SEEDED = Path(__file__).resolve().parents[2] / "benchmarks" / "leaderboard"
DATA = sorted(str(p) for p in (SEEDED / "data").iterdir())
#: The canonical references of the full HumanEval tracks (656 episodes each, a minute of sandbox
#: runs between them): re-played by ``collab-env leaderboard sign --reverify``; what they score is
#: checked on every canonical solution by tests/rewards/test_code_integrity.py, and the same
#: scorers re-play here in the -mini twins' entries.
TOO_LONG = {"humaneval/v2/humaneval-canonical", "coop-humaneval/v2/humaneval-canonical"}
FOLDERS = sorted(p.parent.relative_to(SEEDED).as_posix() for p in SEEDED.rglob("submission.json"))


def test_the_seeded_entries_are_found():
    assert len(FOLDERS) >= 90 and TOO_LONG <= set(FOLDERS)


@pytest.mark.parametrize("rel", [f for f in FOLDERS if f not in TOO_LONG])
def test_the_seeded_entry_replays_under_the_current_code(rel):
    folder = SEEDED / rel
    data = DATA if load_submission(folder)["track_content"].get("data") else None
    v = verify_submission(folder, data_files=data, regenerate=0)
    assert v.ok, f"{rel}: " + "; ".join(map(str, v.problems[:3]))

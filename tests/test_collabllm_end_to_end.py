"""Issue 25: the CollabLLM path end to end, tiny form (examples/collabllm_end_to_end.py).

Fixture rows -> ``collab-env data`` (the recipe's command line) -> SFT steps -> MR-GRPO steps
(embedded user and judge) -> ``leaderboard run`` of the collabllm track on the held-out RL split
-> ``leaderboard verify`` -> ``leaderboard build`` of a board holding that entry (given the held-out
file). It shows the stages join; it makes no learning claim.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "collabllm_end_to_end.py"


@pytest.mark.slow
@pytest.mark.timeout(1600)  # its subprocess's own bound (1500 s), not the suite's 600 s: a loaded machine needs it
def test_the_tiny_form_runs_every_stage_and_the_entry_verifies(tmp_path):
    from collab_env.agents.embedded import MODEL_FOLDER, embedded_model_dir

    work = tmp_path / "e2e"
    # The run's user cache (kept verdicts and stamps of verify/build) is the test's own, not the
    # user's; the converted embedded model is linked into it, not converted again.
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / MODEL_FOLDER).symlink_to(embedded_model_dir(), target_is_directory=True)
    run = subprocess.run([sys.executable, str(SCRIPT), "--work", str(work)], capture_output=True, text=True,
                         timeout=1500, env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
                                            "TRANSFORMERS_OFFLINE": "1", "COLLAB_ENV_CACHE": str(cache)})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    stages = [line.split("]")[0][1:] for line in run.stdout.splitlines() if line.startswith("[")]
    assert [s for s in stages if s not in ("note", "transformers")] == [
        "rows", "data", "sft", "grpo", "board", "verify", "build", "done"]
    summary = json.loads((work / "summary.json").read_text())
    assert summary["form"] == "tiny" and set(summary["stages"]) == {"rows", "data", "sft", "grpo", "board", "verify",
                                                                    "build"}
    assert "rl_validation 2 rows" in summary["stages"]["data"]["result"]
    assert "2 steps" in summary["stages"]["sft"]["result"] and "2 steps" in summary["stages"]["grpo"]["result"]
    # the board entry was played on the held-out split with the GRPO model, and verifies
    submitted = json.loads((work / "entry" / "submission.json").read_text())
    assert submitted["track"].startswith("collabllm-math-hard@") and submitted["episodes"]["recorded"] == 1
    assert submitted["policies"]["assistant"].endswith(str(work / "grpo" / "checkpoint" / "model_0"))
    assert "rl_validation.parquet" in json.dumps(submitted["data_files"])
    # run and verify from the command line on one local file (taken as the track's split)
    assert f"row: {submitted['track']}/entry (custom, 1 episodes" in run.stdout
    assert f"verified (1 episodes of {submitted['track']} re-played" in run.stdout
    # build: the entry is a verified row of the page ...
    assert "1 entries (1 verified) on " in run.stdout, run.stdout[-2000:]
    # ... by the verdict `verify` kept for these very files (build does not re-play it again)
    kept = f"{submitted['track']}/entry: verified (kept verdict of leaderboard verify)"
    assert kept in run.stderr, run.stderr[-2000:]
    assert list((cache / "leaderboard").rglob("*.json")), "verify kept its verdict in the run's own cache"
    page = (work / "board.html").read_text()
    board = json.loads(page.split('<script type="application/json" id="board-data">', 1)[1].split("</script>", 1)[0])
    [row] = board["entries"]
    assert row["id"] == f"{submitted['track']}/entry" and row["name"] == "collabllm-e2e" and row["verified"]
    assert row["kind"] == "custom" and row["episodes"] == 1
    # the SFT stage trained on the recipe's rows (column prompt) and GRPO started from its model
    assert (work / "sft" / "checkpoint" / "model_0" / "config.json").is_file()
    assert (work / "grpo" / "checkpoint" / "model_0" / "config.json").is_file()

"""Issue 42, "what it must show": the README's CollabLLM section, run as written.

The section's bash block runs verbatim in a fresh folder, under ``bash`` with this venv's
``collab-env`` and ``python`` first on ``PATH`` and ``PORT`` set to a free port (the block reads
``${PORT:-8011}``). Nothing in the block is rewritten. One thing is added from outside: the first
``collab-env eval`` is killed with SIGKILL once it has written its first episode (a ``collab-env``
on ``PATH`` before the real one starts the real command and kills it; every other call is the real
command itself), so the block's ``--resume`` line has an interrupted run to finish. Checked: the
data step's files, the results with the multiturn-aware reward's components, the resumed run
holding each episode once, and the one-line notes and errors.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEADING = "## CollabLLM from the command line"

#: A ``collab-env`` that runs the real one, except the first ``eval`` without ``--resume``: that one
#: is started, then killed with SIGKILL as soon as its result file holds a finished episode.
KILLER = """\
import os, subprocess, sys, time
from pathlib import Path

args = sys.argv[1:]
real = [sys.executable, "-m", "collab_env.cli", *args]
flag = Path(os.environ["KILL_FLAG"])
if args[:1] == ["eval"] and "--resume" not in args and not flag.exists():
    out = Path(args[args.index("--out") + 1])
    proc = subprocess.Popen(real)
    while proc.poll() is None:
        if out.is_file() and out.read_text().count("\\n") >= 1:
            proc.send_signal(9)
            proc.wait()
            flag.write_text(str(out.read_text().count("\\n")))
            sys.exit(137)
        time.sleep(0.02)
    flag.write_text("finished before the kill")
    sys.exit(proc.returncode)
os.execv(sys.executable, real)
"""


def section_block() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index(HEADING)
    end = text.find("\n## ", start + len(HEADING))
    blocks = re.findall(r"^```bash\n(.*?)^```", text[start:end], re.S | re.M)
    assert len(blocks) == 1, "the CollabLLM section has one bash block"
    return blocks[0]


@pytest.mark.timeout(300)
def test_the_readme_collabllm_section_runs_as_written(tmp_path):
    from collab_env.testing.openai_server import free_port

    block = section_block()
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "collab-env").write_text(f"#!{sys.executable}\n" + KILLER)
    (shim / "collab-env").chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "PORT": str(free_port()), "KILL_FLAG": str(tmp_path / "killed"),
           "PATH": f"{shim}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "LITELLM_LOCAL_MODEL_COST_MAP": "True",
           # the judge check's kept verdict in the test's own cache (no embedded model runs here)
           "COLLAB_ENV_CACHE": str(tmp_path / "cache")}
    t0 = time.perf_counter()
    # Its own session: the server the block starts with & is in its process group, stopped below.
    # Output to files: the server keeps the block's stdout open after bash exits.
    with open(tmp_path / "out.txt", "w") as fo, open(tmp_path / "err.txt", "w") as fe:
        proc = subprocess.Popen(["bash", "-c", block], cwd=work, env=env, stdout=fo, stderr=fe,
                                start_new_session=True)
        try:
            proc.wait(timeout=240)
        finally:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    wall = time.perf_counter() - t0
    out, err = (tmp_path / "out.txt").read_text(), (tmp_path / "err.txt").read_text()
    print(f"README CollabLLM section: {wall:.1f} s")
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    # collab-env data wrote the recipe's RL files
    assert (work / "data" / "rl_train.parquet").is_file() and (work / "data" / "rl_validation.parquet").is_file()
    # the first eval was killed mid-run, after its first episode and before its second
    assert (tmp_path / "killed").read_text() == "1"
    # the resumed run finished the other one; each episode is in the file once
    records = [json.loads(x) for x in (work / "runs" / "collabllm.jsonl").read_text().splitlines()]
    assert sorted(r["episode_id"] for r in records) == [0, 1]
    for r in records:
        comps = r["components"]["assistant"]
        assert set(comps) >= {"accuracy", "interactivity", "token_amount", "mr"} and comps["mr"] != 0
        run = r["run"]
        assert run["env_kwargs"]["reward"] == "mr"
        assert run["policies"]["user"].startswith("llm-user:litellm:openai/my-model")
        assert "127.0.0.1" in run["env_kwargs"]["reward_kwargs"]["judge"]
        # the stand-in's judge gives one canned verdict to everything: its check fails, so every line
        # keeps the raw judged values marked invalid
        assert r["judge_check"]["values"] == "invalid"
    # the resumed run printed the table with the components, the judged ones refused (the stand-in
    # judge fails its validity check: the first run checked it, the resumed one read the kept
    # verdict), and said nothing of a zero reward
    assert "; accuracy, interactivity, mr: judge failed validity check (AUC 0.500 < 0.8" in out
    assert "judged columns (accuracy, interactivity, mr) refused" in out and "kept verdict" in out
    assert "2 episode records in runs/collabllm.jsonl" in out
    assert "own reward is 0" not in out
    assert len(list((tmp_path / "cache" / "judge_validity").glob("*.json"))) == 1

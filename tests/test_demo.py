import json
from pathlib import Path

import pytest

from collab_env.demo import (
    ADAPTER,
    BASE,
    MODEL_ENV,
    PROACTIVE,
    TABLE,
    TRAIN_COMMAND,
    TRAINED,
    collaboration_rows,
    default_adapter,
    format_rows,
    main,
)
from collab_env.eval import compare

ROOT = Path(__file__).resolve().parents[1]


def test_demo_prints_the_table_and_writes_results(tmp_path, capsys):
    assert main(["--episodes", "6", "--model-episodes", "0", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for env_id in ("hidden-facts-easy-v3", "hidden-facts-v3", "hidden-facts-hard-v3", "hidden-facts-copy-v2"):
        assert env_id in out
    assert "ask-then-answer" in out and "answer-at-once" in out
    files = sorted(f for f in tmp_path.rglob("*.jsonl") if not f.name.endswith(".failures.jsonl"))
    assert len(files) == 8
    lines = [json.loads(x) for x in files[0].read_text().splitlines()]
    assert len(lines) == 6


def test_progress_lines_when_stderr_is_not_a_terminal(tmp_path, capsys):
    # pytest's captured stderr is no terminal: the demo's step display prints plain lines there
    # (what `make demo > out.txt 2>&1` shows), one per finished step.
    assert main(["--episodes", "2", "--model-episodes", "0", "--out", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    err = captured.err
    steps = [line for line in err.splitlines() if line.startswith("demo: ")]
    assert [s.split()[1] for s in steps] == ["1/4", "2/4", "3/4", "4/4"], err
    assert "baselines on hidden-facts-copy" in steps[-1]
    # the last line says where the outputs went: 4 envs x 2 baselines, one file each
    run_dir = next(tmp_path.iterdir())
    last = captured.out.strip().splitlines()[-1]
    assert last.startswith("demo finished in ") and last.endswith(f"; 8 episode files (one JSONL per env and row) "
                                                                  f"in {run_dir}/")


def test_collaboration_rows_read_the_transcripts_with_intervals():
    kw = {"split": "test", "max_steps": 4}
    res = compare(MODEL_ENV, {"ask": {"assistant": "ask-then-answer"}, "once": {"assistant": "answer-at-once"}},
                  num_episodes=6, progress=False, env_kwargs=kw)
    rows = collaboration_rows(res)
    ask, once = rows["ask"], rows["once"]
    # The reference asks one question (the count), the user tells it, it boxes it: success 6/6.
    assert ask["success"]["mean"] == 1.0 and ask["questions"]["mean"] == 1.0 and ask["facts"]["mean"] == 1.0
    # Answering at once boxes 1 x 1 on a level whose count is 2..30: never right, never asks.
    assert once["success"]["mean"] == 0.0 and once["questions"]["mean"] == 0.0 and once["facts"]["mean"] == 0.0
    # Wilson's interval for 6/6 and 0/6 (hand values: 0.6097, 0.3903), a proper interval, not a point.
    assert ask["success"]["lo"] == pytest.approx(0.6097, abs=1e-4) and ask["success"]["hi"] == pytest.approx(1.0)
    assert once["success"]["hi"] == pytest.approx(0.3903, abs=1e-4)
    table = format_rows(rows)
    assert "1.00 [0.61, 1.00]" in table and "0.00 [0.00, 0.39]" in table


def test_the_adapter_path_and_the_command_that_makes_it():
    # The committed adapter of a source checkout is found from the module's own location; the
    # command the demo prints when it is missing is the benchmark whose default output prefix
    # (benchmarks/results/collabllm_table_cpu) puts the adapter at <prefix>_adapter.
    assert default_adapter().parts[-3:] == ("benchmarks", "results", "collabllm_table_cpu_adapter")
    bench = ROOT / TRAIN_COMMAND.split()[-1]
    text = bench.read_text()
    assert 'RESULTS / "collabllm_table_cpu"' in text and 'f"{out}_adapter"' in text
    assert ADAPTER == Path("benchmarks/results/collabllm_table_cpu_adapter")
    assert (ROOT / TABLE).with_suffix(".json").name == "collabllm_table_cpu.json"


@pytest.mark.skipif(not (ROOT / ADAPTER / "adapter_config.json").is_file(),
                    reason="no committed adapter (python benchmarks/bench_collabllm_table.py makes it)")
def test_model_rows_before_and_after_with_the_committed_adapter(tmp_path, capsys):
    """Loads the committed adapter (no training): two short held-out episodes per row."""
    pytest.importorskip("peft")
    assert main(["--episodes", "1", "--model-episodes", "2", "--max-new-tokens", "8",
                 "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for label in (BASE, PROACTIVE, TRAINED):
        assert label in out
    assert "success (95% CI)" in out and "questions/episode (95% CI)" in out and "loaded from" in out
    last = out.strip().splitlines()[-3:]
    assert last[0].startswith("Shown: ") and last[1].endswith(TABLE)
    # the closing line: where the episode files went (4 envs x 2 baselines + 3 model rows)
    assert last[2].startswith("demo finished in ") and " 11 episode files " in last[2]
    assert last[2].endswith(f" in {next(tmp_path.iterdir())}/")

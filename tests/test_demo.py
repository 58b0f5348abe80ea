import json
from pathlib import Path

import pytest

from collab_env.demo import (
    ADAPTER,
    BASE,
    CONTROL_ROW,
    DPO_ROW,
    MODEL_ENV,
    MR_ROW,
    PROACTIVE,
    TABLE,
    TRAIN_COMMAND,
    TRAINED,
    collaboration_rows,
    default_adapter,
    format_rows,
    main,
    table_headline,
)
from collab_env.eval import compare
from collab_env.eval.stats import paired_difference

ROOT = Path(__file__).resolve().parents[1]


def test_demo_prints_the_table_and_writes_results(tmp_path, capsys):
    assert main(["--episodes", "6", "--model-episodes", "0", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for env_id in ("hidden-facts-easy-v3", "hidden-facts-v3", "hidden-facts-hard-v3", "hidden-facts-choose-v0"):
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
    assert "baselines on hidden-facts-choose" in steps[-1]
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
    # The reference asks one question (for the withheld count or unit value), the user tells it, it
    # boxes it: success 6/6.
    assert ask["success"]["mean"] == 1.0 and ask["questions"]["mean"] == 1.0 and ask["facts"]["mean"] == 1.0
    # Answering at once boxes 1 x 1 on a level whose withheld number is 2..30: never right, never asks.
    assert once["success"]["mean"] == 0.0 and once["questions"]["mean"] == 0.0 and once["facts"]["mean"] == 0.0
    # Wilson's interval for 6/6 and 0/6 (hand values: 0.6097, 0.3903), a proper interval, not a point.
    assert ask["success"]["lo"] == pytest.approx(0.6097, abs=1e-4) and ask["success"]["hi"] == pytest.approx(1.0)
    assert once["success"]["hi"] == pytest.approx(0.3903, abs=1e-4)
    table = format_rows(rows)
    assert "1.00 [0.61, 1.00]" in table and "0.00 [0.00, 0.39]" in table


def test_the_adapter_path_and_the_command_that_makes_it():
    # The committed adapter of a source checkout is found from the module's own location; the
    # command the demo prints when it is missing is the benchmark whose default output prefix
    # (benchmarks/results/collabllm_table_cpu) puts the adapter at <prefix>_choose_adapter (named by
    # the level it trains on, hidden-facts-choose).
    assert default_adapter().parts[-3:] == ("benchmarks", "results", "collabllm_table_cpu_choose_adapter")
    bench = ROOT / TRAIN_COMMAND.split()[-1]
    text = bench.read_text()
    assert 'RESULTS / "collabllm_table_cpu"' in text
    assert '''f"{out}_{ENV_ID.removeprefix('hidden-facts-')}_adapter"''' in text
    assert 'ENV_ID = "hidden-facts-choose"' in text and MODEL_ENV == "hidden-facts-choose"
    assert ADAPTER == Path("benchmarks/results/collabllm_table_cpu_choose_adapter")
    assert (ROOT / TABLE).with_suffix(".json").name == "collabllm_table_cpu.json"
    # the row names the headline reads are the benchmark's
    for name in (MR_ROW, CONTROL_ROW, DPO_ROW):
        assert f'"{name}"' in text


def _table(rows: dict, diffs: dict) -> dict:
    """A results file in the benchmark's shape: rows' success (mean, lo, hi) and success differences."""
    def stat(m: float, lo: float, hi: float, seeds: bool) -> dict:
        return {"mean": m, "lo": lo, "hi": hi, **({"n_seeds": 5} if seeds else {"n": 32})}
    return {"eval": {"split": "test"}, "sft_teacher": "the scripted reference", "complete": True,
            "rows": [{"row": name, "seeds": [] if name in (BASE, PROACTIVE) else [0, 1, 2, 3, 4],
                      "success": stat(*v, seeds=name not in (BASE, PROACTIVE))} for name, v in rows.items()],
            "comparisons": {k: {"success": {"seeds": stat(*v, seeds=True), "cells": 160, "differ": 7}}
                            for k, v in diffs.items()}}


def test_the_headline_reads_the_tables_strongest_comparison_and_says_a_null_plainly(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(_table(
        {BASE: (0.0, 0.0, 0.11), PROACTIVE: (0.03, 0.01, 0.16), "SFT": (0.70, 0.66, 0.75),
         CONTROL_ROW: (0.75, 0.74, 0.76), MR_ROW: (0.76, 0.60, 0.90)},
        {f"{MR_ROW} minus {CONTROL_ROW}": (0.01, -0.03, 0.05), f"{MR_ROW} minus {DPO_ROW}": (0.20, 0.05, 0.35)})))
    lines = table_headline(path)
    assert "5 training seeds" in lines[0] and lines[0].endswith("The SFT teacher: the scripted reference.")
    # the trained row with the highest lower bound (the control, not MR's higher mean), against the
    # untrained row with the higher upper bound
    assert lines[1].startswith(f"Its strongest comparison: {CONTROL_ROW} succeeds on 0.75 of the test items (95%: "
                               "[0.74, 0.76] t over the 5 seed means)")
    assert lines[1].endswith("vs 0.03 [0.01, 0.16] for Proactive Base (Wilson over items).")
    assert lines[2].startswith("GRPO on MR minus the SFT control trained as long: success +0.01 (paired by seed and "
                               "item: [-0.03, +0.05] t over 5 seeds")
    assert lines[2].endswith("): no difference shown.")
    assert lines[3].endswith("): better.") and len(lines) == 4
    assert "the rows differ in 7 of 160 cells" in lines[2]
    # with the bootstrap, the row is picked by the bootstrap's lower bound; the comparison quotes
    # the cells in which the rows differ as the results file counts them (paired_difference)
    d = json.loads(path.read_text())
    for r in d["rows"]:
        r["success"]["bootstrap"] = {"mean": r["success"]["mean"], "lo": 0.5 if r["row"] == "SFT" else 0.2,
                                     "hi": 0.9}
    d["comparisons"][f"{MR_ROW} minus {CONTROL_ROW}"]["success"].update(
        paired_difference({0: {i: 1.0 for i in range(4)}}, {0: {i: float(i > 0) for i in range(4)}}, num_boot=10),
        seeds=d["comparisons"][f"{MR_ROW} minus {CONTROL_ROW}"]["success"]["seeds"])
    path.write_text(json.dumps(d))
    lines = table_headline(path)
    assert lines[1].startswith("Its strongest comparison: SFT succeeds on 0.70")
    assert "[0.50, 0.90] seeds x items" in lines[1]
    assert "the rows differ in 1 of 4 cells" in lines[2]
    assert table_headline(tmp_path / "missing.json") == [
        f"The full table is not here ({tmp_path / 'missing.json'}): {TRAIN_COMMAND} makes it."]


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
    last = out.strip().splitlines()
    here = next(i for i, line in enumerate(last) if line.startswith("Here: the adapter of training seed 0 succeeds"))
    assert last[here + 1].startswith(f"The full table ({TABLE}: 7 rows, 5 training seeds")
    assert "The SFT teacher: " in last[here + 1] and last[here + 2].startswith("Its strongest comparison: ")
    assert last[here + 3].startswith("GRPO on MR minus the SFT control")
    # the closing line: where the episode files went (4 envs x 2 baselines + 3 model rows)
    assert last[-1].startswith("demo finished in ") and " 11 episode files " in last[-1]
    assert last[-1].endswith(f" in {next(tmp_path.iterdir())}/")


def test_the_readmes_table_is_the_results_file():
    """README's CollabLLM table quotes benchmarks/results/collabllm_table_cpu.json: every row's
    success with its t interval over seeds (Wilson for the untrained rows), its seeds x items
    bootstrap and its sampled success, to the digit."""
    result = json.loads((ROOT / TABLE).with_suffix(".json").read_text())
    readme = (ROOT / "README.md").read_text()
    short = {"SFT control (as long as SFT + RL)": "SFT control"}
    for r in result["rows"]:
        s = r["success"]
        cell = f"{s['mean']:.3f} [{s['lo']:.3f}, {s['hi']:.3f}]"
        boot = "-" if "bootstrap" not in s else f"[{s['bootstrap']['lo']:.3f}, {s['bootstrap']['hi']:.3f}]"
        line = next((x for x in readme.splitlines() if x.startswith(f"  | {short.get(r['row'], r['row'])} | ")), None)
        assert line is not None, r["row"]
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        sampled = f"{r['success_sampled']['mean']:.3f}"
        assert cells[1].startswith(cell) and cells[2] == boot and cells[3] == sampled, line
    mr_vs_control = result["comparisons"][f"{MR_ROW} minus {CONTROL_ROW}"]["success"]["seeds"]
    assert f"{mr_vs_control['mean']:+.3f} [{mr_vs_control['lo']:+.3f}, {mr_vs_control['hi']:+.3f}]" in readme

"""``benchmarks/gpu/run.sh --device cpu --tiny``: every section of the GPU readiness run works on
a CPU with the tiny model (the GPU run itself needs a GPU machine), and the benchmarks' shared
machine-load check (``benchmarks/_machine.py``)."""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import _machine  # noqa: E402


def test_gpu_script_runs_every_section_on_cpu_with_the_tiny_model(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    t0 = time.monotonic()
    proc = subprocess.run(["bash", str(ROOT / "benchmarks/gpu/run.sh"), "--device", "cpu", "--tiny",
                           "--out", str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    wall = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = json.loads((tmp_path / "run.json").read_text())
    sec = record["sections"]
    assert list(sec) == ["bf16_gradient_checkpointing", "multi_agent_one_device", "hf_generation",
                         "vllm_generation", "grpo_vs_trl", "mr_cost", "learning"]
    for name, s in sec.items():
        if name == "vllm_generation":
            try:
                import vllm  # noqa: F401
            except ImportError:
                assert s["status"].startswith("skipped: vLLM is not installed"), s
                continue
        assert s["status"] == "ok", (name, s)
    bf16 = sec["bf16_gradient_checkpointing"]
    assert bf16["dtype"] == "bfloat16" and bf16["gradient_checkpointing"] is True
    assert bf16["s_per_step"] > 0 and bf16["tokens_per_s"] > 0
    assert sec["multi_agent_one_device"]["models"] == 2 and sec["multi_agent_one_device"]["device"] == "cpu"
    gen = sec["hf_generation"]
    assert 0 < gen["generated_tokens"] <= gen["rows"] * 8  # --tiny: at most 8 new tokens a row
    vs = sec["grpo_vs_trl"]
    assert vs["ours_tokens_per_s"] > 0
    mr = sec["mr_cost"]
    # the 3 futures advance together: their requests share model calls (more requests than calls)
    assert mr["requests_3"] > mr["model_calls_3"] and mr["requests_3"] >= 3 * mr["model_calls_3"] // 2
    assert sec["learning"]["logged_steps"] == sec["learning"]["items"] == 4
    table = (tmp_path / "run.md").read_text()
    for name in sec:
        assert f"| {name} |" in table
    assert "tiny random" in record["model"]
    # budget of the CPU check: a minute on a quiet 2-core machine; generous here for a shared one
    assert wall < 240, wall


def _fake_load(busy: float) -> _machine.MachineLoad:
    return _machine.MachineLoad(cores=2, load_average=(2.5, 1.0, 0.5), other_busy_cores=busy, interval_s=1.0,
                                busiest=((123, "python", busy),))


def _args(allow: bool) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    _machine.add_load_arguments(parser)
    return parser.parse_args(["--allow-loaded"] if allow else [])


def test_load_check_refuses_a_loaded_machine_unless_allowed(monkeypatch, capsys):
    monkeypatch.setattr(_machine, "sample_load", lambda interval: _fake_load(1.5))
    with pytest.raises(SystemExit) as exc:
        _machine.check(_args(False))
    assert exc.value.code == 3
    err = capsys.readouterr().err
    assert "THE MACHINE IS LOADED" in err and "far more than 2x" in err and "--allow-loaded" in err
    result = _machine.check(_args(True))
    assert result.loaded and result.allowed
    record = result.to_dict()
    assert record["before"]["other_busy_cores"] == 1.5 and "far more than 2x" in record["note"]


def test_load_check_lets_a_quiet_machine_start(monkeypatch, capsys):
    monkeypatch.setattr(_machine, "sample_load", lambda interval: _fake_load(0.1))
    result = _machine.check(_args(False))  # threshold 0.5 cores
    assert not result.loaded and result.to_dict()["note"] is None
    assert "LOADED" not in capsys.readouterr().err


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="reads Linux's /proc")
def test_load_meter_sees_a_busy_process_that_is_not_its_own():
    # A busy loop in a process that is not this one's descendant (double fork: the shell exits,
    # the loop is reparented): the meter must attribute CPU to it, and none to this process.
    pidfile = Path(os.environ.get("TMPDIR", "/tmp")) / f"busy-{os.getpid()}.pid"
    subprocess.run(["sh", "-c", f"{sys.executable} -c 'import time\nt=time.time()\nwhile time.time()-t<4: pass' "
                    f"& echo $! > {pidfile}"], check=True)
    busy_pid = int(pidfile.read_text())
    try:
        meter = _machine.LoadMeter().start()
        time.sleep(1.5)
        load = meter.stop(top=50)
    finally:
        pidfile.unlink()
    assert load.known and load.cores >= 1 and load.interval_s >= 1.5
    shares = {pid: cores for pid, _, cores in load.busiest}
    assert shares.get(busy_pid, 0.0) > 0.0, load  # it ran (however loaded the machine is)
    assert os.getpid() not in shares
    assert load.other_busy_cores >= shares[busy_pid] - 0.05  # the machine total includes it


def test_load_meter_counts_a_live_child_as_this_runs_own(monkeypatch):
    # An engine's worker process (vLLM's EngineCore) is this run's child and still alive when the
    # meter stops: its CPU is not in os.times() (not reaped), yet it is not another process's.
    me, child, other = os.getpid(), 4242, 777
    ticks = iter([{me: ("python", 0), child: ("EngineCore", 100), other: ("stress", 0)},
                  {me: ("python", 0), child: ("EngineCore", 100 + 300), other: ("stress", 100)}])
    busy = iter([1000, 1000 + 600])  # the machine: 6 s of CPU over the 2 s stretch (100 ticks/s)
    own = iter([10.0, 12.0])  # this process: 2 s; the child: 3 s; the other process: 1 s
    clock = iter([0.0, 2.0])
    monkeypatch.setattr(_machine, "_CLK_TCK", 100)
    monkeypatch.setattr(_machine, "_process_ticks", lambda: next(ticks))
    monkeypatch.setattr(_machine, "_machine_busy_ticks", lambda: next(busy))
    monkeypatch.setattr(_machine, "_own_seconds", lambda: next(own))
    monkeypatch.setattr(_machine, "_own_family", lambda: {me, child})
    monkeypatch.setattr(_machine.time, "monotonic", lambda: next(clock))
    load = _machine.LoadMeter().start().stop()
    assert load.other_busy_cores == pytest.approx(0.5)  # (6 - 2 - 3) s over 2 s: the other one only
    assert [(p, round(c, 3)) for p, _, c in load.busiest] == [(other, 0.5)]


def test_bench_mr_summary_reads_a_results_file_and_bounds_the_median(tmp_path, capsys):
    import bench_mr

    ratios = [1.28, 1.14, 1.41, 1.71, 1.33, 1.29, 1.38, 1.26, 1.25, 1.42]
    rows = [{"1": {"seconds": 6.0}, "3": {"seconds": 6.0 * r}, "ratio": r} for r in ratios]
    path = tmp_path / "mr.json"
    path.write_text(json.dumps({"rollouts": 3, "repeats": rows}))
    out = bench_mr.summarize(str(path))
    assert out["pairs"] == 10 and out["ratio_median"] == pytest.approx(1.31)  # (1.29 + 1.33) / 2
    lo, hi = out["ratio_ci95"]
    assert min(ratios) <= lo <= out["ratio_median"] <= hi <= max(ratios) and lo < hi
    assert bench_mr.median_ci(ratios) == (lo, hi)  # seeded: the same file, the same interval
    assert out["3_futures_median_s"] == pytest.approx(6.0 * 1.31)
    assert '"ratio_median"' in capsys.readouterr().out


@pytest.mark.slow
def test_the_table_form_runs_end_to_end_on_cpu_with_the_tiny_model(tmp_path):
    """``run.sh --table`` (CollabLLM's Table 1 in miniature at GPU scale) on the CPU with the tiny
    test model: every row of the table, named as the results file promises, with intervals."""
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1",
           "COLLAB_ENV_OUTPUT": str(tmp_path / "work")}
    out = tmp_path / "table"
    proc = subprocess.run(
        ["bash", str(ROOT / "benchmarks/gpu/run.sh"), "--table", "--device", "cpu", "--model", "tiny",
         "--seeds", "1", "--sft-items", "4", "--sft-steps", "1", "--control-steps", "3", "--grpo-items", "1",
         "--generations", "2", "--eval-episodes", "2", "--max-new-tokens", "8", "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.with_suffix(".json").read_text())
    assert [r["row"] for r in result["rows"]] == ["Base", "Proactive Base", "SFT", "SFT control (as long as SFT + RL)",
                                                  "SFT + online DPO (MR)", "SFT + GRPO (MR)", "SFT + GRPO (window 0)"]
    for r in result["rows"]:
        for m in ("success", "questions", "facts", "tokens"):
            if r["row"] in ("Base", "Proactive Base"):  # one evaluation: the interval over its 2 episodes
                assert set(r[m]) >= {"mean", "lo", "hi", "n"} and r[m]["n"] == 2
            else:  # trained rows: over training seeds (1 here), with the seeds x items bootstrap beside it
                assert set(r[m]) >= {"mean", "lo", "hi", "n_seeds", "bootstrap"} and r[m]["n_seeds"] == 1
                assert r[m]["bootstrap"]["n_items"] == 2
    assert result["complete"] and result["settings"]["device"] == "cpu"
    # the SFT control really trains longer (3 optimiser steps against SFT's 1)
    assert len(result["training"]["seed 0 SFT loss"]) == 1
    assert len(result["training"]["seed 0 SFT control loss"]) == 3
    assert (tmp_path / "table_choose_adapter" / "adapter_config.json").is_file()
    md = out.with_suffix(".md").read_text()
    assert "Beside the paper's Table 1" in md and "| cells that differ |" in md
    assert not Path(f"{out}_state.json").exists()  # a whole run leaves no resume state behind
    # the report is a function of the results file alone: --report-only writes the same one again
    out.with_suffix(".md").unlink()
    bench = ROOT / "benchmarks/bench_collabllm_table.py"
    again = subprocess.run([sys.executable, str(bench), "--report-only", "--out", str(out)], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert out.with_suffix(".md").read_text() == md
    missing = subprocess.run([sys.executable, str(bench), "--report-only", "--out", str(tmp_path / "none")],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert missing.returncode != 0 and "needs a finished run's results" in missing.stderr


def test_a_stopped_table_run_resumes_its_finished_stages_and_refuses_other_settings(tmp_path):
    """The table's run state (``--resume``): stages finished before a stop are kept with their
    episodes and times; a resume with other settings is refused in one line."""
    import bench_collabllm_table as bench

    def state(**over):
        a = bench.main_parser().parse_args(["--out", str(tmp_path / "t"), "--seeds", "2", *sum(
            ([f"--{k.replace('_', '-')}", str(v)] for k, v in over.items()), [])])
        eps = {name: [] for name in bench.ROWS}
        flags = {name: [] for name in bench.ROWS[2:]}
        return bench.RunState(tmp_path / "t_state.json", a, "cmd", tmp_path, eps, flags, {},
                              dict.fromkeys(bench.ROWS, 0.0))

    first = state()
    first.episodes[bench.BASE].append({"success": 1.0})
    first.timings[bench.BASE] = 12.0
    first.finish(bench.BASE)
    first.flags[bench.SFT].append(0)
    first.finish(bench.SFT, 0)
    again = state()
    again.load()
    assert again.done(bench.BASE) and again.done(bench.SFT, 0)
    assert not again.done(bench.SFT, 1) and not again.done(bench.PROACTIVE)
    assert again.episodes[bench.BASE] == [{"success": 1.0}] and again.timings[bench.BASE] == 12.0
    assert again.flags[bench.SFT] == [0]
    assert [s["stages_kept"] for s in again.sittings] == [0, 2]
    with pytest.raises(SystemExit, match=r"--resume with other settings than the stopped run \(\{'seeds': \(2, 3\)\}"):
        state(seeds=3).load()
    (tmp_path / "t_state.json").unlink()
    with pytest.raises(SystemExit, match="found no run state"):
        state().load()


@pytest.mark.slow
def test_a_settings_sweep_runs_only_the_rows_and_modes_it_names(tmp_path):
    """``--rows mr --eval-modes greedy`` (a validation sweep of the RL row's settings): SFT runs
    because the RL row starts from it, nothing else does, and the modes not run are reported as
    not measured rather than as zeros."""
    import bench_collabllm_table as bench

    out = tmp_path / "sweep"
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    old = os.environ.get("COLLAB_ENV_OUTPUT")
    os.environ["COLLAB_ENV_OUTPUT"] = str(tmp_path / "work")
    try:
        assert bench.main(["--eval-split", "validation", "--model", "tiny", "--rows", "mr", "--eval-modes", "greedy",
                           "--seeds", "1", "--sft-items", "4", "--sft-steps", "1", "--grpo-items", "1",
                           "--generations", "2", "--eval-episodes", "2", "--max-new-tokens", "8",
                           "--out", str(out)]) == 0
    finally:
        if old is None:
            del os.environ["COLLAB_ENV_OUTPUT"]
        else:
            os.environ["COLLAB_ENV_OUTPUT"] = old
    result = json.loads(out.with_suffix(".json").read_text())
    assert [r["row"] for r in result["rows"]] == [bench.SFT, bench.MR] == result["rows_run"]
    assert result["complete"]
    for r in result["rows"]:
        assert r["success"]["n_seeds"] == 1
        assert r["success_paraphrase"]["method"] == "not measured" and math.isnan(r["success_sampled"]["mean"])
    assert "Beside the paper's Table 1" not in out.with_suffix(".md").read_text()  # no Proactive Base to compare
    with pytest.raises(SystemExit, match="unknown row 'ppo'"):
        bench.main(["--rows", "ppo", "--out", str(tmp_path / "x")])
    with pytest.raises(SystemExit, match="give greedy"):
        bench.main(["--eval-modes", "sampled", "--out", str(tmp_path / "y")])

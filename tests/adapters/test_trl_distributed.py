"""TRL's GRPOTrainer through collab_env.adapters.trl across processes (issue 44): 2 ranks under
torchrun (DDP over gloo) and 2 workers of a Ray Train TorchTrainer, each running
examples/trl_distributed.py on length-ratio with the tiny model. The ranks must end with the same
parameters, different from the start (a real update), with TRL's checkpoint (one RNG state per
rank) and, on Ray, Ray's own Checkpoint."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")
torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "trl_distributed.py"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
       "OMP_NUM_THREADS": "1", "TRL_EXPERIMENTAL_SILENCE": "1", "RAY_DEDUP_LOGS": "0",
       "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}


def _initial_hash(tiny_dir: Path) -> str:
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        from trl_distributed import param_hash
    finally:
        sys.path.remove(str(SCRIPT.parent))
    from collab_env.testing.tiny_model import load_tiny_chat_model

    return param_hash(load_tiny_chat_model(tiny_dir)[0])


def _check(out: Path, before: str, run: subprocess.CompletedProcess) -> None:
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    hashes = [(out / f"param_hash.rank{r}.txt").read_text().strip() for r in (0, 1)]
    assert hashes[0] == hashes[1], "the ranks ended with different parameters"
    assert hashes[0] != before, "two optimizer steps left the parameters unchanged"
    ckpt = out / "checkpoint-2"
    assert (ckpt / "model.safetensors").is_file() and (ckpt / "optimizer.pt").is_file()
    assert {p.name for p in ckpt.glob("rng_state_*.pth")} == {"rng_state_0.pth", "rng_state_1.pth"}
    assert "[rank 0 of 2] 2 steps" in run.stdout + run.stderr and "[rank 1 of 2] 2 steps" in run.stdout + run.stderr


@pytest.mark.slow
def test_trl_trains_on_two_ranks_under_torchrun(tiny_dir, tmp_path):
    out = tmp_path / "out"
    torchrun = Path(sys.executable).with_name("torchrun")
    run = subprocess.run([str(torchrun), "--standalone", "--nproc_per_node", "2", str(SCRIPT),
                          "--model", str(tiny_dir), "--out", str(out)],
                         capture_output=True, text=True, timeout=600, env=ENV)
    _check(out, _initial_hash(tiny_dir), run)


def _ray_run(tiny_dir: Path, out: Path, *env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--model", str(tiny_dir), "--out", str(out),
                           "--ray-workers", "2", *env], capture_output=True, text=True, timeout=600, env=ENV)


def _check_ray(out: Path, run: subprocess.CompletedProcess) -> None:
    assert "Ray's checkpoint Checkpoint(" in run.stdout
    ray_ckpts = list((out / "ray").rglob("checkpoint_*/model.safetensors"))
    assert len(ray_ckpts) == 1


@pytest.mark.slow
def test_trl_trains_on_two_ray_train_workers(tiny_dir, tmp_path):
    pytest.importorskip("ray.train.torch")
    out = tmp_path / "out"
    run = _ray_run(tiny_dir, out)
    _check(out, _initial_hash(tiny_dir), run)
    _check_ray(out, run)


@pytest.mark.slow
def test_trl_trains_on_two_ray_train_workers_against_a_served_env(tiny_dir, tmp_path):
    """Ray Train's two workers play their episodes on one served multi-turn env (letter-requests,
    collab-env serve in its own process, its user seat driven by the env's scripted user): the
    workers end with the same parameters, both checkpoints exist, no session is left open."""
    pytest.importorskip("ray.train.torch")
    pytest.importorskip("openenv")
    from collab_env.testing.served import open_sessions, served

    out = tmp_path / "out"
    with served("letter-requests") as url:
        run = _ray_run(tiny_dir, out, "--env", url)
        _check(out, _initial_hash(tiny_dir), run)
        _check_ray(out, run)
        assert open_sessions(url, settle=30.0) == 0


@pytest.mark.slow
def test_trl_trains_on_two_ranks_under_torchrun_against_a_served_env(tiny_dir, tmp_path):
    """The same script with --env URL: both ranks play their episodes on one served length-ratio
    (collab-env serve in its own process), and the server is left with no session."""
    pytest.importorskip("openenv")
    from collab_env.testing.served import open_sessions, served

    out = tmp_path / "out"
    with served("length-ratio", "--seat", "agent_0") as url:  # torchrun, as the module (any venv has it)
        run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(SCRIPT),
                              "--model", str(tiny_dir), "--out", str(out), "--env", url],
                             capture_output=True, text=True, timeout=600, env=ENV)
        _check(out, _initial_hash(tiny_dir), run)
        assert open_sessions(url, settle=30.0) == 0

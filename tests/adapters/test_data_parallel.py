"""Our learners data-parallel over torch.distributed (issue 44, part 2): under torchrun with 2
ranks (gloo), a policy update on a global batch split between the ranks is the update one process
makes on the whole batch, and MAGRPO trains on 2 ranks in lockstep (tests/adapters/ddp_magrpo.py
is the worker)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

WORKER = Path(__file__).with_name("ddp_magrpo.py")
ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
       "OMP_NUM_THREADS": "1",
       "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}


def _run(args: list[str], ranks: int) -> None:
    launcher = [str(Path(sys.executable).with_name("torchrun")), "--standalone", f"--nproc_per_node={ranks}"] \
        if ranks > 1 else [sys.executable]
    run = subprocess.run(launcher + [str(WORKER), *args], capture_output=True, text=True, timeout=600, env=ENV)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]


LOSS_TYPES = ["grpo", "dapo", "dr_grpo"]


@pytest.mark.slow
def test_two_ranks_make_the_update_of_one_rank_on_the_same_global_batch(tiny_dir, tmp_path):
    """8 fixed samples in micro-batches of 2: one process takes all of them, 2 ranks 4 each, for
    each aggregation whose divisors do not depend on the micro-batches. The loss divisors are the
    whole batch's and the gradients are summed, so the gradients agree to float rounding;
    AdamW's first step divides each gradient by its own magnitude, which turns that rounding into
    at most ~1e-4 of the 1e-2 step on near-zero gradients."""
    one, two = tmp_path / "one", tmp_path / "two"
    _run(["update", str(tiny_dir), str(one), *LOSS_TYPES], 1)
    _run(["update", str(tiny_dir), str(two), *LOSS_TYPES], 2)
    for loss_type in LOSS_TYPES:
        single = torch.load(one / f"{loss_type}.rank0.pt")
        r0, r1 = torch.load(two / f"{loss_type}.rank0.pt"), torch.load(two / f"{loss_type}.rank1.pt")
        assert torch.equal(r0["params"], r1["params"]) and torch.equal(r0["grads"], r1["grads"]), loss_type
        scale = single["grads"].abs().max().item()
        assert scale > 1e-3, f"{loss_type}: the batch gave no gradient"
        assert torch.allclose(r0["grads"], single["grads"], rtol=1e-5, atol=1e-6 * scale), loss_type
        assert torch.allclose(r0["params"], single["params"], atol=2e-4), loss_type


@pytest.mark.slow
def test_magrpo_trains_on_two_ranks_in_lockstep(tiny_dir, tmp_path):
    out = tmp_path / "out"
    _run(["train", str(tiny_dir), str(out)], 2)
    (before0, after0), (before1, after1) = ((out / f"hash.rank{r}.txt").read_text().split() for r in (0, 1))
    assert before0 == before1 and after0 == after1, "the ranks drifted apart"
    assert after0 != before0, "training left the parameters unchanged"
    assert (out / "metrics.jsonl").is_file() and (out / "rank1" / "metrics.jsonl").is_file()
    assert (out / "checkpoint-4" / "trainer_state.json").is_file()

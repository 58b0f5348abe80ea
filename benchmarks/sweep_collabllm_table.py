"""The CollabLLM table's settings sweep on the **validation** split (issue 45): every choice of
settings the table's test run uses is made here, on knitting items that neither training nor the
test split has.

Each named setting is one run of :mod:`bench_collabllm_table` with ``--eval-split validation``,
one training seed, greedy evaluation only (``--eval-modes greedy``) and only the rows it tunes
(``--rows``); its files are ``benchmarks/results/collabllm_table_sweep/<name>.{json,md,png}``, and
``summary.md`` beside them lists every finished setting, its command, success and questions.
A setting whose results file is complete is not run again::

    python benchmarks/sweep_collabllm_table.py sft32 sft48        # named settings, in order
    python benchmarks/sweep_collabllm_table.py --list             # what there is
    python benchmarks/sweep_collabllm_table.py --summary          # rewrite summary.md only
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
OUT = ROOT / "benchmarks" / "results" / "collabllm_table_sweep"
COMMON = ["--eval-split", "validation", "--seeds", "1", "--eval-modes", "greedy"]

#: name: (what it decides, the table script's options beyond COMMON)
SETTINGS: dict[str, tuple[str, list[str]]] = {
    "sft32": ("SFT length: 32 steps on 64 conversations", ["--rows", "sft", "--sft-steps", "32"]),
    "sft48x128": ("SFT length: 48 steps on 128 conversations", ["--rows", "sft", "--sft-steps", "48",
                                                               "--sft-items", "128"]),
    "sft64x128": ("SFT length: 64 steps on 128 conversations", ["--rows", "sft", "--sft-steps", "64",
                                                               "--sft-items", "128"]),
}


def rl_setting(name: str, sft: str, lr: str, rows: str = "dpo,mr,imm", extra: tuple[str, ...] = ()) -> None:
    """RL rows (``rows``) at learning rate ``lr`` from the SFT of setting ``sft``."""
    sft_opts = [x for x in SETTINGS[sft][1] if x not in ("--rows", "sft")]
    SETTINGS[name] = (f"{rows} at learning rate {lr} from {sft}" + (f", {' '.join(extra)}" if extra else ""),
                      ["--rows", rows, *sft_opts, "--grpo-lr", lr, "--dpo-lr", lr, *extra])


for _sft in ("sft32", "sft48x128", "sft64x128"):
    for _lr in ("1e-4", "5e-4"):
        rl_setting(f"rl_{_sft}_lr{_lr}", _sft, _lr)
    # online DPO whose pairs differ by more than the token penalty (a pair per solved-vs-not)
    rl_setting(f"dpo_{_sft}_lr1e-4_gap0.5", _sft, "1e-4", rows="dpo", extra=("--dpo-min-gap", "0.5"))


#: What the sweep chose for the table's test run, and by which rule (stated before the test run).
CHOICE = """\
**Chosen for the test run** (`python benchmarks/bench_collabllm_table.py --sft-steps 32 --grpo-lr 1e-4 --dpo-lr 5e-4`, since then the defaults):

* SFT: 32 steps on 64 conversations (sft32: 0.625; 48 steps on 128 conversations: 0.125; the
  first validation run's 8 steps: 0.000 and 24 steps: 0.250). The SFT control then trains
  32 + 16 = 48 steps.
* Each learner's learning rate is the one of {1e-4, 5e-4} with the higher validation success:
  online DPO 5e-4 (0.875 against 0.500), GRPO on MR 1e-4 (0.594 against 0.375). GRPO at window 0
  takes MR-GRPO's learning rate, so that the ablation changes the window alone (at 5e-4 it
  falls to 0.062, its replies running into the token cap).
* Online DPO keeps the recipe's pairing (min gap 0: any unequal MR makes a pair); the min-gap
  setting was not run.
* Every choice rests on one training seed and 32 validation episodes (a success's standard
  error is about 0.09 there): a coarse choice, made before any test-split number was seen.
"""


def summary() -> Path:
    lines = ["# The CollabLLM table's settings sweep (validation split: knitting items)", "",
             "Every run: `python benchmarks/bench_collabllm_table.py " + " ".join(COMMON) + " <options>`; one "
             "training seed, 32 greedy episodes per row. These numbers choose settings; they are not the table's.", "",
             "| setting | what it decides | options | row | success | questions / episode | facts | collapse flags "
             "| wall (min) |", "|---|---|---|---|---|---|---|---|---|"]
    for name, (what, opts) in SETTINGS.items():
        path = OUT / f"{name}.json"
        if not path.exists():
            continue
        res = json.loads(path.read_text())
        for r in res["rows"]:
            lines.append(f"| {name}{'' if res['complete'] else ' (unfinished)'} | {what} | `{' '.join(opts)}` | "
                         f"{r['row']} | {r['success']['mean']:.3f} | {r['questions']['mean']:.2f} | "
                         f"{r['facts']['mean']:.2f} | {r['collapse_flags']} | {res['wall_seconds'] / 60:.1f} |")
    path = OUT / "summary.md"
    path.write_text("\n".join(lines) + "\n\n" + CHOICE)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("names", nargs="*")
    p.add_argument("--list", action="store_true")
    p.add_argument("--summary", action="store_true")
    a = p.parse_args(argv)
    if a.list:
        for name, (what, opts) in SETTINGS.items():
            print(f"{name:24s} {what}: {' '.join(opts)}")
        return 0
    unknown = [n for n in a.names if n not in SETTINGS]
    if unknown:
        raise SystemExit(f"error: unknown setting(s) {unknown}: see --list")
    import bench_collabllm_table as bench

    OUT.mkdir(parents=True, exist_ok=True)
    for name in a.names:
        out = OUT / name
        done = out.with_suffix(".json")
        if done.exists() and json.loads(done.read_text())["complete"] and not Path(f"{out}_state.json").exists():
            print(f"{name}: finished before, kept", flush=True)
            continue
        # each setting its own work folder: its SFT adapter is its own
        os.environ["COLLAB_ENV_OUTPUT"] = str(Path(os.environ.get("COLLAB_ENV_SWEEP_WORK", "/tmp/collabllm_sweep"))
                                              / name)
        resume = ["--resume"] if Path(f"{out}_state.json").exists() else []
        print(f"== {name}: {SETTINGS[name][0]}", flush=True)
        bench.main([*COMMON, *SETTINGS[name][1], "--out", str(out), *resume])
        summary()
    print(f"summary: {summary()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

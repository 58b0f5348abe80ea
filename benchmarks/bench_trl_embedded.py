"""The README's "Train with TRL" block, run longer: the training reward of the embedded model per step.

The block is read from ``README.md`` and run as written except for four keywords of its
``GRPOConfig(...)`` call, changed in the parsed code (not by text substitution): ``max_steps``
(``--steps``), ``seed`` (one run per ``--seeds`` entry), ``output_dir`` (a temporary folder) and
``save_strategy="no"`` (no checkpoint, and the block's ``save_model()`` line is left out), so the
curve is the README's setup and nothing else: SmolLM2-135M-Instruct from
``collab_env.agents.embedded_model_dir()``, ``length-ratio`` with ``agent_0`` trained against the
scripted partner, 4 generations per prompt, 48 tokens, learning rate 3e-5, TRL's defaults otherwise
(temperature 1, ``beta=0``, its GRPO loss and reward scaling).

Recorded per step (``trainer.state.log_history``): the mean training reward of the step's 4 sampled
episodes (``reward``), its spread within the group (``reward_std``), ``grad_norm`` and the mean
completion length. The summary compares the first and the last ``--window`` steps of each seed.

    OMP_NUM_THREADS=1 python benchmarks/bench_trl_embedded.py        # 3 seeds x 15 steps

(One torch thread: on a 2-core machine shared with other work, two threads per process wait on
each other at every parallel barrier; see ``benchmarks/_machine.py``.)

Writes ``--out``.json (every step of every seed, the summary) and ``--out``.md (the table).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HEADING = "Train with TRL"


def readme_block() -> str:
    """The README's first Python block under :data:`HEADING`."""
    from tests.test_readme import python_blocks

    for block_id, _, code in python_blocks((ROOT / "README.md").read_text()):
        if block_id == HEADING:
            return code
    raise SystemExit(f"README.md has no Python block under '## {HEADING}'")


def with_config(code: str, **changes: object) -> str:
    """``code`` with the keywords ``changes`` set in its ``GRPOConfig(...)`` call (parsed, not
    substituted), and without the ``trainer.save_model()`` line (the curve needs no model)."""
    tree = ast.parse(code)
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "GRPOConfig"]
    if len(calls) != 1:
        raise SystemExit(f"expected one GRPOConfig(...) call in the README block, found {len(calls)}")
    call = calls[0]
    call.keywords = [k for k in call.keywords if k.arg not in changes]
    call.keywords += [ast.keyword(arg=k, value=ast.Constant(v)) for k, v in changes.items()]
    tree.body = [s for s in tree.body if "save_model" not in ast.unparse(s)]
    return ast.unparse(tree)


def run_seed(code: str, seed: int, steps: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-trl-embedded-") as tmp:
        scope: dict = {"__name__": "__bench__"}
        cwd = os.getcwd()
        os.chdir(tmp)
        t0 = time.perf_counter()
        try:
            exec(compile(with_config(code, max_steps=steps, seed=seed, output_dir=str(Path(tmp) / "out"),
                                     save_strategy="no"),
                         "README.md (Train with TRL)", "exec"), scope)
        finally:
            os.chdir(cwd)
        seconds = time.perf_counter() - t0
    rows = [r for r in scope["trainer"].state.log_history if "reward" in r]
    return {"seed": seed, "seconds": round(seconds, 1), "steps": [
        {"step": i + 1, "reward": r["reward"], "reward_std": r["reward_std"], "grad_norm": r["grad_norm"],
         "completion_length": r["completions/mean_length"]} for i, r in enumerate(rows)]}


def spread(values: list[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0}


def table(result: dict) -> str:
    runs, w = result["runs"], result["config"]["window"]
    lines = [
        "# TRL GRPO on the embedded model (the README's block, run longer)",
        "",
        f"`{result['command']}` ({result['date']}; {result['machine']}; {result['total_seconds']:.0f} s in all).",
        "",
        "The README's \"Train with TRL\" block with only `max_steps`, `seed`, `output_dir` and `save_strategy` "
        "changed: "
        "SmolLM2-135M-Instruct (`collab_env.agents.embedded_model_dir()`) trains `agent_0` of `length-ratio` "
        "against the scripted partner, 4 sampled episodes per step. Training reward per step (mean of the "
        "step's 4 episodes, in [0, 1]); grad_norm > 0 and reward_std > 0 on every step unless said below.",
        "",
        "| step | " + " | ".join(f"seed {r['seed']}" for r in runs) + " | mean |",
        "|---:|" + "---:|" * (len(runs) + 1),
    ]
    for i in range(len(runs[0]["steps"])):
        vals = [r["steps"][i]["reward"] for r in runs]
        lines.append(f"| {i + 1} | " + " | ".join(f"{v:.3f}" for v in vals) + f" | {statistics.fmean(vals):.3f} |")
    s = result["summary"]
    lines += [
        "",
        f"First {w} steps: mean reward {s['first']['mean']:.3f} (sd over seeds {s['first']['std']:.3f}); "
        f"last {w} steps: {s['last']['mean']:.3f} ({s['last']['std']:.3f}); gain {s['gain']['mean']:+.3f} "
        f"(sd {s['gain']['std']:.3f}), positive on {s['seeds_improved']} of {len(runs)} seeds. Mean completion "
        f"length {s['length_first']:.1f} -> {s['length_last']:.1f} tokens.",
        f"Steps with grad_norm 0: {s['zero_grad_steps']}; steps whose group had reward_std 0: {s['zero_std_steps']}.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--window", type=int, default=5, help="steps averaged at the start and at the end")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "trl_embedded_length_ratio"))
    args = p.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    import torch

    code = readme_block()
    t_all = time.perf_counter()
    runs: list[dict] = []
    for seed in seeds:  # the files are rewritten after every seed: a stopped run keeps the seeds done
        runs.append(run_seed(code, seed, args.steps))
        r = [x["reward"] for x in runs[-1]["steps"]]
        print(f"seed {seed}: reward {r[0]:.3f} -> {r[-1]:.3f} ({runs[-1]['seconds']:.0f} s)", flush=True)
        result = summarise(runs, args, argv, code, torch.__version__, time.perf_counter() - t_all)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out + ".json").write_text(json.dumps(result, indent=1) + "\n")
        Path(args.out + ".md").write_text(table(result))
    print(table(result))
    return 0


def summarise(runs: list[dict], args: argparse.Namespace, argv: list[str] | None, code: str, torch_version: str,
              seconds: float) -> dict:
    """The results file's content for the seeds in ``runs``."""
    w = args.window
    first = [statistics.fmean(x["reward"] for x in r["steps"][:w]) for r in runs]
    last = [statistics.fmean(x["reward"] for x in r["steps"][-w:]) for r in runs]
    gains = [b - a for a, b in zip(first, last, strict=True)]
    summary = {
        "first": spread(first), "last": spread(last), "gain": spread(gains),
        "seeds_improved": sum(g > 0 for g in gains),
        "length_first": statistics.fmean(x["completion_length"] for r in runs for x in r["steps"][:w]),
        "length_last": statistics.fmean(x["completion_length"] for r in runs for x in r["steps"][-w:]),
        "zero_grad_steps": sum(x["grad_norm"] == 0 for r in runs for x in r["steps"]),
        "zero_std_steps": sum(x["reward_std"] == 0 for r in runs for x in r["steps"]),
    }
    return {
        "command": ("OMP_NUM_THREADS=1 " if os.environ.get("OMP_NUM_THREADS") == "1" else "")
                   + "python benchmarks/bench_trl_embedded.py"
                   + (" " + " ".join(argv if argv is not None else sys.argv[1:])).rstrip(),
        "machine": f"{platform.machine()} CPU, {os.cpu_count()} cores (shared), torch {torch_version}",
        "date": date.today().isoformat(),
        "config": {"steps": args.steps, "seeds": [r["seed"] for r in runs], "window": w, "readme_block": code},
        "summary": summary, "runs": runs, "total_seconds": round(seconds, 1),
    }


if __name__ == "__main__":
    raise SystemExit(main())

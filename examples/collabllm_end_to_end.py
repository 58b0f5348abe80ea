"""The CollabLLM path end to end, in one command: rows -> data -> SFT -> MR-GRPO -> board -> verify -> build.

1. **rows**: CollabLLM-schema rows. Tiny form: the ``collab_env.testing`` fixture rows, written
   as a local copy of a hub dataset. Full form: ``--dataset`` (a hub id or a local folder).
2. **data**: ``collab-env data`` with the verl recipe's command line, ``--dataset_type sft`` and
   ``rl`` (the recipe's rows, train and a disjoint validation split).
3. **sft**: a few steps of :class:`~collab_env.adapters.sft.SFTTrainer` on ``sft_train.parquet``
   (``messages_key="prompt"``, the recipe's column).
4. **grpo**: a few steps of :class:`~collab_env.adapters.magrpo.MAGRPOTrainer` (GRPO: one agent)
   on the collabllm env built on ``rl_train.parquet``, rewarded by the multiturn-aware reward
   (``--user`` simulates the futures, ``--judge`` scores them), starting from the SFT model.
5. **board**: ``collab-env leaderboard run`` of the collabllm track with the GRPO model as the
   assistant, on ``rl_validation.parquet`` (held out: never trained on), then
   ``collab-env leaderboard verify`` of that submission.
6. **build**: ``collab-env leaderboard build`` of a board holding that entry: the static page,
   ``<work>/board.html``. The entry's verdict is the one ``verify`` kept for its files (had a
   file changed since, build would re-play it on the held-out file it is given).

It shows the path works; it makes no learning claim (a few steps of a tiny or small model).
Each stage prints one line (``[stage] ... (N s)``) and the run writes ``summary.json`` in
``--work``. The tiny form (the default: a random tiny chat model trained, the embedded
SmolLM2-135M as user and judge, on CPU) is what ``make test`` runs. The full form::

    python examples/collabllm_end_to_end.py --model Qwen/Qwen2.5-0.5B-Instruct \\
        --user litellm:openai/gpt-4o-mini --judge litellm:openai/gpt-4o-mini \\
        --dataset collabllm/collabllm-multiturn-math-hard --work /tmp/collabllm-e2e

(``benchmarks/gpu/run.sh collabllm-e2e ...`` runs it on a GPU machine.)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

TRACK = "collabllm-math-hard"
DATASET = "math-hard"


def _stage(name: str, summary: dict[str, Any], start: float, line: str) -> None:
    took = time.perf_counter() - start
    summary["stages"][name] = {"seconds": round(took, 1), "result": line}
    print(f"[{name}] {line} ({took:.1f} s)", flush=True)


def _cli(argv: list[str]) -> None:
    from collab_env.cli import main

    print(f"$ collab-env {' '.join(argv)}", flush=True)
    rc = main(argv)
    if rc != 0:
        raise SystemExit(f"collab-env {argv[0]} {argv[1] if len(argv) > 1 else ''} failed with exit status {rc}")


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every stage in order; returns the summary (also written to ``<work>/summary.json``)."""
    import datasets

    work = Path(args.work).expanduser().resolve()
    work.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"form": "tiny" if args.tiny else "full", "model": args.model, "user": args.user,
                               "judge": args.judge, "stages": {}}

    # 1. rows
    t = time.perf_counter()
    if args.dataset is None:
        from collab_env.testing.collabllm_fixtures import write_collabllm_hub_dir

        dataset = str(write_collabllm_hub_dir(work / "hub" / f"collabllm-multiturn-{DATASET}", n=args.rows))
    else:
        dataset = args.dataset
    _stage("rows", summary, t, f"dataset {dataset}")

    # 2. data: the recipe's command line
    t = time.perf_counter()
    data = work / "data"
    for kind in ("sft", "rl"):
        _cli(["data", "--dataset", dataset, "--local_dir", str(data), "--dataset_type", kind])
    sizes = {f.stem: len(datasets.load_dataset("parquet", data_files=str(f))["train"])
             for f in sorted(data.glob("*.parquet"))}
    _stage("data", summary, t, ", ".join(f"{k} {v} rows" for k, v in sizes.items()))

    # 3. SFT
    t = time.perf_counter()
    from collab_env.adapters.sft import SFTConfig, SFTTrainer

    model = args.model
    if model == "tiny":
        from collab_env.testing.tiny_model import build_tiny_chat_model

        model = str(build_tiny_chat_model(work / "tiny-model"))
    sft_rows = datasets.load_dataset("parquet", data_files=str(data / "sft_train.parquet"))["train"]
    sft = SFTTrainer(model=model, train_dataset=sft_rows,
                     args=SFTConfig(messages_key="prompt", max_steps=args.sft_steps, learning_rate=1e-5,
                                    max_length=args.max_length, output_dir=str(work / "sft"), plot=False,
                                    device=args.device))
    sft.train()
    sft_model = Path(sft.save_checkpoint(work / "sft" / "checkpoint")) / "model_0"
    losses = [r["loss"] for r in _metrics(work / "sft") if "loss" in r]
    _stage("sft", summary, t, f"{len(losses)} steps, loss {_fmt(losses)} -> {sft_model}")

    # 4. MR-GRPO
    t = time.perf_counter()
    from collab_env.adapters.magrpo import MAGRPOConfig, MAGRPOTrainer

    env_kwargs = {
        "data_files": str(data / "rl_train.parquet"), "system_prompt": None,  # the rows' own system prompt
        "reward": "mr",
        "reward_kwargs": {"user": args.user, "judge": args.judge,
                          "weights": {"accuracy": 1.0, "interactivity": 1.0, "token_amount": -1e-4},
                          "num_rollouts": args.rollouts, "max_user_turns": 1, "max_assistant_turns": 2,
                          "sampling": {"user": {"max_new_tokens": args.max_new_tokens}}},
    }
    grpo = MAGRPOTrainer(agent_model=str(sft_model), env=TRACK, env_kwargs=env_kwargs,
                         args=MAGRPOConfig(num_agents=1, num_generations=2, num_turns=1, max_steps=args.grpo_steps,
                                           max_new_tokens=args.max_new_tokens, learning_rate=1e-5,
                                           output_dir=str(work / "grpo"), plot=False, eval_interval=0,
                                           device=args.device))
    grpo.train()
    grpo_model = Path(grpo.save_checkpoint(work / "grpo" / "checkpoint")) / "model_0"
    rewards = [r[k] for r in _metrics(work / "grpo") for k in r if k.endswith("reward_mean")]
    _stage("grpo", summary, t, f"{args.grpo_steps} steps, mean MR {_fmt(rewards)} -> {grpo_model}")

    # 5. the board: run the track on the held-out split, then verify
    t = time.perf_counter()
    held_out = str(data / "rl_validation.parquet")
    entry = work / "entry"
    _cli(["leaderboard", "run", TRACK, "--data-files", held_out, "--policy", f"assistant=hf:{grpo_model}",
          "--sampling", f"assistant.max_new_tokens={args.max_new_tokens}", "--episodes", str(args.episodes),
          "--out", str(entry), "--name", "collabllm-e2e", "--model", str(args.model), "--no-progress"])
    submitted = json.loads((entry / "submission.json").read_text())
    eps = submitted["episodes"]
    _stage("board", summary, t, f"{submitted['track']}: {eps['recorded']} of {eps['full']} episodes recorded, "
                                f"{len(eps['failed'])} failed")
    if "embedded" in (args.user, args.judge):
        print("[note] the embedded 135M model as user or judge shows that the path runs; its verdicts are not "
              "a measure of the assistant (it accepts almost anything)", flush=True)
    t = time.perf_counter()
    _cli(["leaderboard", "verify", str(entry), "--data-files", held_out])
    _stage("verify", summary, t, "verified")
    t = time.perf_counter()
    page = work / "board.html"
    _cli(["leaderboard", "build", str(entry), "--data-files", held_out, "--out", str(page)])
    _stage("build", summary, t, f"page {page}")
    summary["seconds"] = round(sum(s["seconds"] for s in summary["stages"].values()), 1)
    (work / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"[done] {summary['seconds']} s; summary: {work / 'summary.json'}", flush=True)
    return summary


def _metrics(folder: Path) -> list[dict[str, Any]]:
    path = folder / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def _fmt(values: list[float]) -> str:
    return " -> ".join(f"{v:.3g}" for v in values) if values else "(none logged)"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="collabllm_end_to_end", description=__doc__.split("\n")[0])
    p.add_argument("--work", default="collabllm-e2e", help="folder for every stage's output (default: ./collabllm-e2e)")
    p.add_argument("--model", default="tiny", help="the model trained: 'tiny' (a random tiny chat model), a folder or hub id")
    p.add_argument("--user", default="embedded", help="the futures' user simulator (default: the embedded model)")
    p.add_argument("--judge", default="embedded", help="the metric judge (default: the embedded model)")
    p.add_argument("--dataset", default=None, help="CollabLLM rows (hub id or folder); default: the fixture rows")
    p.add_argument("--rows", type=int, default=12, help="fixture rows (tiny form)")
    p.add_argument("--sft-steps", type=int, default=2)
    p.add_argument("--grpo-steps", type=int, default=2)
    p.add_argument("--rollouts", type=int, default=1, help="futures per reply (the recipe: 3)")
    p.add_argument("--episodes", type=int, default=1, help="episodes of the board run (a custom entry)")
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--max-length", type=int, default=1024, help="SFT: longest tokenised conversation (the tiny model: 1024)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    args.tiny = args.model == "tiny" and args.dataset is None
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

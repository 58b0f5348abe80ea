"""One GRPO step of collab_env's learner vs TRL's GRPOTrainer: same model, batch and lengths.

Both trainers get the same model folder, ``--prompts`` prompts with ``--generations`` samples
each, completions of at most ``--max-new-tokens`` tokens, temperature 1, no KL term, one
optimisation pass, no gradient checkpointing, on CPU in float32, in the same process. Each does
``--steps`` training steps (default 4) after a warm-up step. Generation lengths are random (the
two trainers sample different completions), so the comparison is in **generated tokens per second
of training step**: each trainer's mean completion length times the ``prompts x generations``
completions of a step, over its seconds per step. A shared machine drifts, so the pair is run
``--rounds`` times (default 3) with fresh trainers, the order alternating (ours first, then TRL
first...), round ``r`` seeding both trainers with ``r`` (so each round samples other
completions); the script prints each round's tokens/s and ratio ours / TRL (above 1: ours is faster)
and the median ratio over the rounds, with its min and max.

``--sizes 2x4,4x8`` runs the comparison at several batch sizes (prompts x generations) in one
call; ``--out FILE.json`` writes every round, the per-size summaries, the exact command and the
machine's load before and during the run (:mod:`benchmarks._machine`). The script refuses to start
on a loaded machine (other processes keeping cores busy: two processes that each use every core
slow each other far more than 2x) unless ``--allow-loaded``.

    python benchmarks/bench_grpo_vs_trl.py                 # embedded SmolLM2-135M
    python benchmarks/bench_grpo_vs_trl.py --model tiny    # a tiny random Qwen2 (plumbing only)
    python benchmarks/bench_grpo_vs_trl.py --sizes 2x4,4x8 --out benchmarks/results/grpo_vs_trl_embedded.json

Needs ``trl``: collab_env's ``trl`` extra (the TRL adapter's; ``make test`` installs it). Here it
is only the yardstick.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _machine import LoadMeter, add_load_arguments, check  # noqa: E402

PROMPTS = [
    "Describe a lighthouse that keeps time.",
    "Invent a sport played on a frozen lake.",
    "Write a letter from a retired volcano.",
    "Explain how a library for smells works.",
    "Describe a train that travels between dreams.",
    "Invent a festival celebrated only by cats.",
    "Describe a garden with four seasons.",
    "Explain how bees would run an election.",
]


def reward_len(completions, **kwargs):
    """Shorter is better (any cheap deterministic reward will do for timing)."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [-len(t) / 100.0 for t in texts]


def ours(model_dir, tokenizer, args, out):
    from collab_env.adapters.magrpo import MAGRPOConfig, MAGRPOTrainer

    rows = [{"prompt": p} for p in PROMPTS[: args.prompts]] * (args.steps + 1)
    cfg = MAGRPOConfig(num_agents=1, num_generations=args.generations, max_new_tokens=args.max_new_tokens,
                       per_device_train_batch_size=args.prompts, eval_interval=0, learning_rate=1e-6,
                       train_micro_batch_size=args.prompts * args.generations,
                       gradient_checkpointing=args.gradient_checkpointing,
                       device=args.device, dtype=args.dtype, output_dir=str(out / "ours"), plot=False,
                       max_steps=args.prompts, logging_steps=1, seed=args.seed)
    trainer = MAGRPOTrainer(agent_model=str(model_dir), tokenizer=tokenizer, num_agents=1,
                            formatters=[lambda item: item["prompt"]],
                            reward_func=lambda completions: [-len(completions[0]) / 100.0],
                            train_dataset=rows, args=cfg)
    trainer.logger.verbose = False
    trainer.train()  # warm-up step
    steps = []  # (seconds, mean completion length) per step
    for _ in range(args.steps):
        trainer.args.max_steps += args.prompts
        start = time.perf_counter()
        length = trainer.train()["completion_length"]
        steps.append((time.perf_counter() - start, length))
    return steps


def trl_step(model_dir, tokenizer, args, out):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    data = Dataset.from_list([{"prompt": [{"role": "user", "content": p}]} for p in PROMPTS[: args.prompts]]
                             * (args.steps + 1))
    batch = args.prompts * args.generations
    cfg = GRPOConfig(output_dir=str(out / "trl"), num_generations=args.generations,
                     max_completion_length=args.max_new_tokens, per_device_train_batch_size=batch,
                     gradient_accumulation_steps=1, steps_per_generation=1, num_iterations=1, beta=0.0,
                     learning_rate=1e-6, max_steps=args.steps + 1, use_cpu=args.device == "cpu",
                     bf16=args.dtype == "bfloat16", gradient_checkpointing=args.gradient_checkpointing,
                     report_to="none", logging_steps=1, save_strategy="no", temperature=1.0, top_p=1.0,
                     disable_tqdm=True, dataloader_num_workers=0, seed=args.seed, shuffle_dataset=False)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype="float32")  # bf16: autocast (TRL's way)
    trainer = GRPOTrainer(model=model, reward_funcs=reward_len, args=cfg, train_dataset=data,
                          processing_class=tokenizer)
    times = []

    from transformers import TrainerCallback

    class Clock(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.t = time.perf_counter()

        def on_step_end(self, *a, **k):
            times.append(time.perf_counter() - self.t)

    trainer.add_callback(Clock())
    trainer.train()
    lengths = [h["completions/mean_length"] for h in trainer.state.log_history if "completions/mean_length" in h]
    if len(lengths) != len(times):
        raise RuntimeError(f"TRL logged {len(lengths)} completion lengths for {len(times)} steps (logging_steps=1)")
    return list(zip(times, lengths, strict=True))[1:]  # the first step is the warm-up


def load_model(name: str, tmp: Path):
    """``(model folder, tokenizer)`` of ``--model``: ``"embedded"``, ``"tiny"`` or a folder."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if name == "tiny":
        from collab_env.testing.tiny_model import build_tiny_chat_model

        model_dir = build_tiny_chat_model(tmp / "tiny")
        return model_dir, PreTrainedTokenizerFast.from_pretrained(str(model_dir))
    if name == "embedded":
        from collab_env.agents.embedded import embedded_model_dir

        model_dir = embedded_model_dir()
    else:
        model_dir = Path(name)
    return model_dir, AutoTokenizer.from_pretrained(str(model_dir))


def compare(model_dir, tokenizer, args, prompts: int, generations: int, tmp: Path, log=print) -> dict:
    """``args.rounds`` paired rounds at one batch size; returns its rounds and summary."""
    args = argparse.Namespace(**{**vars(args), "prompts": prompts, "generations": generations})
    n = prompts * generations  # completions per step
    runners = {"ours": ours, "trl": trl_step}
    log(f"-- batch {prompts} prompts x {generations} generations = {n} completions per step")
    # A shared machine drifts: each round runs both (fresh trainers), the order alternating, and
    # the verdict is the median of the rounds' paired ratios.
    pooled: dict[str, list[tuple[float, float]]] = {name: [] for name in runners}
    rounds = []
    for r in range(args.rounds):
        order = list(runners) if r % 2 == 0 else list(reversed(runners))
        rate, sec = {}, {}
        # Each round seeds both trainers with its index: with one seed for every round, our
        # per-row seeded sampler would draw the same completions each round, and their lengths
        # (which tokens/s counts) would be one draw rather than an average.
        seeded = argparse.Namespace(**{**vars(args), "seed": r})
        for name in order:
            steps = runners[name](model_dir, tokenizer, seeded, tmp / f"{prompts}x{generations}-round{r}")
            pooled[name] += steps
            sec[name] = sum(s for s, _ in steps)
            rate[name] = sum(length * n for _, length in steps) / sec[name]
        rounds.append({"order": order, "tokens_per_s": rate,
                       "s_per_step": {k: v / args.steps for k, v in sec.items()},
                       "ratio": rate["ours"] / rate["trl"]})
        log(f"round {r + 1} ({' then '.join(order)}): ours {rate['ours']:.1f} tokens/s, "
            f"trl {rate['trl']:.1f} tokens/s, ratio {rounds[-1]['ratio']:.2f}x")
    summary = {}
    for name, steps in pooled.items():
        seconds = sum(s for s, _ in steps) / len(steps)
        length = sum(x for _, x in steps) / len(steps)
        summary[name] = {"s_per_step": seconds, "mean_completion_tokens": length,
                         "tokens_per_s": length * n / seconds, "steps": len(steps)}
        log(f"{name:<4}: {seconds:.2f} s/step, mean completion {length:.1f} tokens; tokens/s "
            f"{length * n / seconds:.1f} over {len(steps)} steps")
    ratios = [r["ratio"] for r in rounds]
    log(f"tokens/s ours/trl at {prompts}x{generations}: median {statistics.median(ratios):.2f}x over "
        f"{args.rounds} rounds (min {min(ratios):.2f}x, max {max(ratios):.2f}x)")
    return {"prompts": prompts, "generations": generations, "completions_per_step": n, "rounds": rounds,
            "summary": summary, "ratio_median": statistics.median(ratios), "ratio_min": min(ratios),
            "ratio_max": max(ratios)}


def parse_sizes(text: str) -> list[tuple[int, int]]:
    """``"2x4,4x8"`` -> ``[(2, 4), (4, 8)]`` (prompts x generations)."""
    out = []
    for part in text.split(","):
        try:
            a, b = part.lower().split("x")
            out.append((int(a), int(b)))
        except ValueError:
            raise SystemExit(f"--sizes: {part!r} is not PROMPTSxGENERATIONS (e.g. 2x4,4x8)") from None
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="embedded", help="'embedded', 'tiny' or a model folder")
    p.add_argument("--prompts", type=int, default=2)
    p.add_argument("--generations", type=int, default=4)
    p.add_argument("--sizes", default=None,
                   help="batch sizes to compare, PROMPTSxGENERATIONS separated by commas (e.g. 2x4,4x8); "
                        "default: --prompts x --generations")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3,
                   help="pairs of runs (fresh trainers each), in alternating order: ours first, then TRL first...")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                   help="ours: the model's dtype; TRL: bf16 autocast over float32 weights")
    p.add_argument("--gradient-checkpointing", action="store_true")
    p.add_argument("--out", default=None, help="write the results here as JSON")
    add_load_arguments(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    sizes = parse_sizes(args.sizes) if args.sizes else [(args.prompts, args.generations)]
    load = check(args)  # refuses to start on a loaded machine unless --allow-loaded

    import torch

    try:
        import trl
    except ImportError:
        print("this benchmark compares with TRL: pip install trl (not a dependency of collab_env)")
        return 2
    torch.manual_seed(0)
    tmp = Path(tempfile.mkdtemp(prefix="bench-grpo-"))
    model_dir, tokenizer = load_model(args.model, tmp)
    print(f"model={args.model} sizes={','.join(f'{a}x{b}' for a, b in sizes)} max_new_tokens={args.max_new_tokens} "
          f"steps={args.steps} rounds={args.rounds} device={args.device} dtype={args.dtype} "
          f"threads={torch.get_num_threads()}")
    meter = LoadMeter().start()
    results = [compare(model_dir, tokenizer, args, a, b, tmp) for a, b in sizes]
    during = meter.stop()
    print(f"machine during the run: {during.describe()}")
    if args.out:
        import transformers

        given = argv if argv is not None else sys.argv[1:]
        record = {
            "command": "python benchmarks/bench_grpo_vs_trl.py " + shlex.join(given),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "model": args.model, "device": args.device,
            "dtype": args.dtype, "max_new_tokens": args.max_new_tokens, "steps": args.steps,
            "rounds": args.rounds,
            "threads": torch.get_num_threads(), "platform": platform.platform(),
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__},
            "load_before": load.to_dict(), "load_during": during.to_dict(), "sizes": results,
        }
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

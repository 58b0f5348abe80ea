"""One GRPO step of collab_env's learner vs TRL's GRPOTrainer: same model, batch and lengths.

Both trainers get the same model folder, ``--prompts`` prompts with ``--generations`` samples
each, completions of at most ``--max-new-tokens`` tokens, temperature 1, no KL term, one
optimisation pass, no gradient checkpointing, on CPU in float32, in the same process. Each does
``--steps`` training steps (default 4) after a warm-up step. Generation lengths are random (the
two trainers sample different completions), so the comparison is in **generated tokens per second
of training step**: each trainer's mean completion length times the ``prompts x generations``
completions of a step, over its seconds per step. A shared machine drifts, so the pair is run
``--rounds`` times (default 3) with fresh trainers, the order alternating (ours first, then TRL
first...); the script prints each round's tokens/s and ratio ours / TRL (above 1: ours is faster)
and the median ratio over the rounds, with its min and max.

    python benchmarks/bench_grpo_vs_trl.py                 # embedded SmolLM2-135M
    python benchmarks/bench_grpo_vs_trl.py --model tiny    # a tiny random Qwen2 (plumbing only)

Needs ``trl`` (``pip install trl``; it adds only accelerate and psutil). trl is not a dependency
of collab_env: it is only this benchmark's yardstick.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

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
                       train_micro_batch_size=args.prompts * args.generations, gradient_checkpointing=False,
                       device="cpu", dtype="float32", output_dir=str(out / "ours"), plot=False,
                       max_steps=args.prompts, logging_steps=1)
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
                     learning_rate=1e-6, max_steps=args.steps + 1, use_cpu=True, bf16=False,
                     gradient_checkpointing=False, report_to="none", logging_steps=1, save_strategy="no",
                     temperature=1.0, top_p=1.0, disable_tqdm=True, dataloader_num_workers=0, seed=0,
                     shuffle_dataset=False)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype="float32")
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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="embedded", help="'embedded', 'tiny' or a model folder")
    p.add_argument("--prompts", type=int, default=2)
    p.add_argument("--generations", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3,
                   help="pairs of runs (fresh trainers each), in alternating order: ours first, then TRL first...")
    args = p.parse_args()

    import torch
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    torch.manual_seed(0)
    tmp = Path(tempfile.mkdtemp(prefix="bench-grpo-"))
    if args.model == "tiny":
        from collab_env.testing.tiny_model import build_tiny_chat_model

        model_dir = build_tiny_chat_model(tmp / "tiny")
        tokenizer = PreTrainedTokenizerFast.from_pretrained(str(model_dir))
    else:
        if args.model == "embedded":
            from collab_env.agents.embedded import embedded_model_dir

            model_dir = embedded_model_dir()
        else:
            model_dir = Path(args.model)
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    try:
        import trl  # noqa: F401
    except ImportError:
        print("this benchmark compares with TRL: pip install trl (not a dependency of collab_env)")
        return 2
    n = args.prompts * args.generations  # completions per step
    runners = {"ours": ours, "trl ": trl_step}
    print(f"model={args.model} prompts={args.prompts} generations={args.generations} "
          f"max_new_tokens={args.max_new_tokens} steps={args.steps} rounds={args.rounds} "
          f"threads={torch.get_num_threads()}")
    # A shared machine drifts: each round runs both (fresh trainers), the order alternating, and
    # the verdict is the median of the rounds' paired ratios.
    pooled: dict[str, list[tuple[float, float]]] = {name: [] for name in runners}
    round_ratios = []
    for r in range(args.rounds):
        order = list(runners) if r % 2 == 0 else list(reversed(runners))
        rate = {}
        for name in order:
            steps = runners[name](model_dir, tokenizer, args, tmp / f"round{r}")
            pooled[name] += steps
            rate[name] = sum(length * n for _, length in steps) / sum(sec for sec, _ in steps)
        round_ratios.append(rate["ours"] / rate["trl "])
        print(f"round {r + 1} ({' then '.join(x.strip() for x in order)}): ours {rate['ours']:.1f} tokens/s, "
              f"trl {rate['trl ']:.1f} tokens/s, ratio {round_ratios[-1]:.2f}x")
    for name, steps in pooled.items():
        seconds = sum(s for s, _ in steps) / len(steps)
        length = sum(x for _, x in steps) / len(steps)
        print(f"{name}: {seconds:.2f} s/step, mean completion {length:.1f} tokens; tokens/s "
              f"{length * n / seconds:.1f} over {len(steps)} steps")
    print(f"tokens/s ours/trl: median {statistics.median(round_ratios):.2f}x over {args.rounds} rounds "
          f"(min {min(round_ratios):.2f}x, max {max(round_ratios):.2f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

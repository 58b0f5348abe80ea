"""CollabLLM's Table 1 in miniature, on CPU: does training on the multiturn-aware reward (MR)
make a real small model ask, then answer? With the ablation that makes the claim (window 0).

The level: ``hidden-facts-copy`` (issue 26). The withheld fact *is* the answer (one object whose
unit value, 1, is stated; its count withheld; two distractor numbers in the opening), so the
embedded SmolLM2-135M-Instruct, which cannot multiply, succeeds exactly when it asks for the
count and copies it into ``\\boxed{}``. Answering at once is right only by a lucky guess.
The user is the suite's scripted user (question-only: a statement, a guess or a keyword dump
reveals nothing; a message that guesses the count ends the episode as a wrong answer).

The recipe's shape, per seed (LoRA r=16 on the attention projections of the embedded model;
one adapter is trained through every stage, so the product is one small adapter folder):

1. **SFT** on multi-turn collaborative conversations: the scripted reference
   (:class:`~collab_env.tasks.hidden_facts.AskThenAnswer`) played against the scripted user
   through the episode driver (:func:`collab_env.eval.evaluate`) on *train* items, every
   assistant turn trained on (:class:`~collab_env.adapters.sft.SFTTrainer`): one epoch (8 steps
   of 8 conversations). ``--sft-long-steps N`` adds a row trained N steps without RL (the
   control for "would more SFT do what RL does?"; off by default, not in the committed table).
2. **GRPO** (:class:`~collab_env.adapters.magrpo.MAGRPOTrainer`, one agent) from the SFT
   adapter, on train items, on **both assistant turns** (``--turns 2``: a tree of 3 replies per
   node), each turn rewarded by its own MR (discount 0), with plain group-mean advantages
   (``--normalize-advantages`` divides by the std; the two stopped runs in
   ``benchmarks/results/collabllm_table_cpu_stdnorm_seed0.md`` and ``..._turn1.md`` show why
   neither std normalisation nor training the first turn alone is the default here). The
   futures are played by the learner itself (the driver's policy) and the scripted user. Metrics: the accuracy rule
   (the exact boxed answer anywhere in the future) and the recipe's token penalty
   (``token_amount``, -1e-3 per word), aggregated by the ``"collabllm"`` rule. Two windows:

   * **immediate reward** (``max_user_turns=0``, CollabLLM's w = 0): the reply is scored as it
     stands: a question earns nothing, only a lucky boxed guess does;
   * **MR** (window 2: reply, user, assistant): a question the user answers earns the future's
     correct answer.

Evaluation: whole greedy episodes of **held-out test items** (``split="test"``; episode ``k``
plays seed ``EVAL_SEED + k``, the same items for every row) with two assistant turns, against
the scripted user, greedy, then the same episodes sampled at temperature 1 (``success_sampled``:
greedy success saturates once the preferred reply is right; sampled success shows how much of
the model's probability is on the right behaviour). Per row: ``success`` (exact boxed answer),
``questions`` (assistant turns
that ask, by the scripted user's own rule, and give no answer), ``facts`` (share of the
withheld facts the user revealed), ``tokens`` (assistant tokens per episode, the model's
tokenizer) and the collapse monitor's flags during training (``collapse/flagged`` log lines at
the library's default thresholds: mean reply under 2 visible tokens, over half of the replies
empty, or over 75% duplicated). 95% intervals:
Wilson's for 0/1 metrics, else mean +- 1.96 SE, over every seed's episodes pooled (Base and
Proactive Base are greedy and untrained: evaluated once). The MR-vs-immediate comparison is
the paired difference on the same held-out episodes (same item, same seed).

Outputs: ``benchmarks/results/collabllm_table_cpu.{json,md,png}``, transcripts before/after on
the same held-out item (``collabllm_table_cpu_transcripts.md``), and the seed-0 SFT + GRPO (MR)
adapter (``collabllm_table_cpu_adapter/``, what ``make demo`` loads)::

    python benchmarks/bench_collabllm_table.py                    # the full table (3 seeds)
    python benchmarks/bench_collabllm_table.py --seeds 1 --sft-items 16 --sft-steps 4 \\
        --grpo-items 2 --eval-episodes 4 --out /tmp/pilot        # a smoke run
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import shlex
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from collab_env.eval.stats import interval, t_interval  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
ENV_ID = "hidden-facts-copy"
#: Held-out test episode k resets with seed EVAL_SEED + k: the same items for every row.
EVAL_SEED = 10_000
#: Train items for SFT are drawn from seeds SFT_SEED + 1000 * seed + k, GRPO's from the trainer's
#: own item stream: both in the train split, disjoint from the test split by construction.
SFT_SEED = 50_000
METRICS = ("success", "questions", "facts", "tokens", "success_sampled")
#: Each metric's type, which picks its interval (collab_env.eval.stats.interval).
KIND = {"success": "binary", "questions": "count", "facts": "continuous", "tokens": "count",
        "success_sampled": "binary"}
#: The paper's Table 1 (Llama-3.1-8B, Online DPO vs Proactive Base), relative change in percent:
#: (interactivity, task metric, tokens) per dataset.
PAPER_TABLE1 = {"MediumDocEdit": (48, 5, -8), "BigCodeBench": (54, 18, -13), "MATH-Chat": (30, 32, -18)}


#: Architectures of the random-init stand-ins (``--model random:NAME``) for a GPU throughput run
#: where no weights can be brought: Qwen2.5-0.5B/1.5B-Instruct's published configs (the vocabulary
#: is the tokenizer's).
STAND_INS = {
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, tie_word_embeddings=True),
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, tie_word_embeddings=True),
}


def resolve_model(a: argparse.Namespace, work: Path) -> str:
    """``a.model`` as a folder or ``"embedded"``; ``random:NAME`` builds a randomly initialised
    model of a :data:`STAND_INS` architecture (its success is 0: a throughput stand-in, and the
    report says so) with ``--tokenizer`` (else the embedded model's), and ``tiny`` the tiny test
    model of :mod:`collab_env.testing` (the CPU check of this script)."""
    if a.model == "tiny":
        from collab_env.testing.tiny_model import build_tiny_chat_model

        return str(build_tiny_chat_model(work / "tiny"))
    if not a.model.startswith("random:"):
        return a.model
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    name = a.model.split(":", 1)[1]
    if name not in STAND_INS:
        raise SystemExit(f"unknown stand-in {name!r}: choose from {sorted(STAND_INS)}")
    if a.tokenizer:
        tok = AutoTokenizer.from_pretrained(a.tokenizer)
    else:
        from collab_env.agents.embedded import embedded_model_dir

        tok = AutoTokenizer.from_pretrained(str(embedded_model_dir()))
    folder = work / f"random-{name}"
    config = Qwen2Config(vocab_size=len(tok), max_position_embeddings=4096, rope_theta=1e6,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
                         **STAND_INS[name])
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


# ---------------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------------
def summarise(episodes: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Each metric as ``{"mean", "lo", "hi", "n", "method"}`` (by its type, ``KIND``)."""
    return {k: interval([float(e[k]) for e in episodes], KIND[k]) for k in METRICS}


def paired(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """``a - b`` per metric on the episodes both played (same held-out item, same training seed):
    mean and Student's t interval of the per-episode differences."""
    by_key = {(e["train_seed"], e["seed"]): e for e in b}
    pairs = [(e, by_key[(e["train_seed"], e["seed"])]) for e in a if (e["train_seed"], e["seed"]) in by_key]
    return {k: t_interval([float(x[k]) - float(y[k]) for x, y in pairs]) for k in METRICS}


def evaluate_policy(policy: Any, tokenizer: Any, a: argparse.Namespace, desc: str, train_seed: int | None
                    ) -> list[dict[str, Any]]:
    """Whole episodes of the test split against the scripted user, all at once (their calls
    merged into batched ``generate`` calls): greedy (every metric), then the same episodes
    sampled at temperature 1 (``success_sampled``: how robust the behaviour is, where greedy
    decoding is at the ceiling)."""
    import collab_env
    from collab_env.eval import evaluate
    from collab_env.tasks.hidden_facts import collaboration_stats

    t0 = time.perf_counter()
    print(f"  evaluating {desc}: {a.eval_episodes} held-out episodes, greedy and sampled...", flush=True)
    runs = {}
    for mode, temperature in (("greedy", 0.0), ("sampled", 1.0)):
        res = evaluate(ENV_ID, {"assistant": policy}, num_episodes=a.eval_episodes, seed=EVAL_SEED,
                       env_kwargs={"split": "test", "max_steps": a.eval_max_steps}, concurrency=a.eval_episodes,
                       progress=True,
                       sampling={"assistant": {"temperature": temperature, "max_new_tokens": a.max_new_tokens}})
        if res.failures:
            raise RuntimeError(f"{len(res.failures)} evaluation episodes failed ({mode}): {res.failures[0]}")
        runs[mode] = res.episodes
    task = collab_env.make(ENV_ID, split="test").unwrapped.task
    out = []
    for k in sorted(runs["greedy"]):
        ep, sampled = runs["greedy"][k], runs["sampled"][k]
        assert sampled.index == ep.index  # the same held-out item
        stats = collaboration_stats(ep.conversation, task.get_item(ep.index))
        texts = [t.text for t in ep.turns if t.player == "assistant"]
        out.append({
            "index": ep.index, "seed": ep.seed, "train_seed": train_seed,
            "success": float(ep.components.get("assistant", {}).get("accuracy", 0.0) >= 1.0),
            "success_sampled": float(sampled.components.get("assistant", {}).get("accuracy", 0.0) >= 1.0),
            "questions": stats["questions"], "facts": stats["facts"],
            "tokens": float(sum(len(tokenizer.encode(t, add_special_tokens=False)) for t in texts)),
            "end_reason": ep.end_reason,
            "transcript": [{"role": m.role, "text": m.content} for m in ep.conversation if m.role != "system"],
            "transcript_sampled": [{"role": m.role, "text": m.content} for m in sampled.conversation
                                   if m.role != "system"],
        })
    s = summarise(out)
    print(f"    {desc}: success {fmt(s['success'])}, questions {fmt(s['questions'])}, sampled success "
          f"{fmt(s['success_sampled'])} ({time.perf_counter() - t0:.0f} s)", flush=True)
    return out


# ---------------------------------------------------------------------------------------------
# Training stages
# ---------------------------------------------------------------------------------------------
def sft_conversations(n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` collaborative conversations on train items: the scripted reference (ask for what is
    missing, then answer) against the scripted user, played through the episode driver; the
    assistant's own view of each (its system prompt, the user's turns, its turns)."""
    from collab_env.eval import evaluate

    res = evaluate(ENV_ID, {"assistant": "ask-then-answer"}, num_episodes=n, seed=SFT_SEED + 1000 * seed,
                   env_kwargs={"split": "train"}, progress=False)
    rows = []
    for k in sorted(res.episodes):
        ep = res.episodes[k]
        if ep.components.get("assistant", {}).get("accuracy", 0.0) < 1.0:
            raise RuntimeError(f"the scripted reference failed train episode {k}: {ep.end_reason}")
        rows.append({"messages": ep.conversation.view("assistant").to_chat()})
    return rows


def lora_fields(a: argparse.Namespace) -> dict[str, Any]:
    return {"lora_r": a.lora_r, "lora_alpha": 2.0 * a.lora_r, "lora_target_modules": tuple(a.lora_modules.split(","))}


def run_sft(seed: int, a: argparse.Namespace, work: Path, steps: int | None = None):
    from collab_env.adapters.sft import SFTConfig, SFTTrainer

    rows = sft_conversations(a.sft_items, seed)
    steps = a.sft_steps if steps is None else steps
    # max_steps stops training, num_train_epochs bounds it too: enough epochs for the steps asked
    epochs = math.ceil(steps * a.sft_batch / len(rows))
    config = SFTConfig(learning_rate=a.sft_lr, max_steps=steps, num_train_epochs=epochs, per_device_train_batch_size=a.sft_batch,
                       seed=seed, logging_steps=1, eval_interval=0, plot=False, max_length=512,
                       output_dir=str(work / f"seed_{seed}" / f"sft_{steps}"), device=a.device, dtype=a.dtype,
                       **lora_fields(a))
    trainer = SFTTrainer(model=a.model, train_dataset=rows, args=config, tokenizer=a.tokenizer)
    trainer.train()
    losses = [r["loss"] for r in trainer.logger.records if "loss" in r]
    if len(losses) != steps:
        raise RuntimeError(f"SFT ran {len(losses)} optimiser steps, not the {steps} asked")
    return trainer, losses


def run_grpo(seed: int, window: int, a: argparse.Namespace, sft_state: dict[str, Any], work: Path):
    """GRPO from the SFT adapter (``sft_state``: its LoRA weights) with the MR of ``window``."""
    import peft
    import torch

    import collab_env
    from collab_env.adapters.common.collapse import CollapseThresholds
    from collab_env.adapters.common.models import load_model_and_tokenizer, resolve_device, resolve_dtype
    from collab_env.adapters.magrpo import MAGRPOConfig, MAGRPOTrainer
    from collab_env.rewards.mr import MultiturnAwareReward

    device = resolve_device(a.device)
    base, tok = load_model_and_tokenizer(a.model, a.tokenizer, device, resolve_dtype(a.dtype, device))
    lf = lora_fields(a)
    with torch.random.fork_rng(devices=[]):
        model = peft.get_peft_model(base, peft.LoraConfig(
            r=lf["lora_r"], lora_alpha=lf["lora_alpha"], target_modules=list(lf["lora_target_modules"]),
            task_type="CAUSAL_LM"))
    peft.set_peft_model_state_dict(model, sft_state)
    env = MultiturnAwareReward(
        collab_env.make(ENV_ID, split="train"),
        # the learner's model plays the futures' assistant (the driver's policy); the user keeps
        # the spec's scripted HiddenFactsUser
        weights={"accuracy_rule": 1.0, "token_amount": -1e-3},
        aggregation="collabllm",
        num_rollouts=a.rollouts if window > 0 else 1,
        max_user_turns=window,  # 0: the immediate reward (the reply scored as it stands)
        max_assistant_turns=max(window, 1),
    )
    config = MAGRPOConfig(
        # Every assistant turn of the tree is trained on its own reward (discount 0: a turn's
        # credit is its MR, as the recipe trains one sample per turn with that turn's MR).
        num_agents=1, num_turns=a.turns, discount=0.0, num_generations=a.generations, max_new_tokens=a.max_new_tokens,
        max_steps=a.grpo_items, per_device_train_batch_size=1, learning_rate=a.grpo_lr, temperature=a.temperature,
        normalize_advantages=a.normalize_advantages, max_grad_norm=1.0, seed=seed, eval_interval=0, logging_steps=1,
        output_dir=str(work / f"seed_{seed}" / f"grpo_w{window}"), plot=False, device=a.device, dtype=a.dtype, **lf)
    trainer = MAGRPOTrainer(agent_model=model, tokenizer=tok, env=env, args=config)
    # The library's default thresholds (mean reply under 2 visible tokens, over half empty, over
    # 75% duplicated): a concise question ("How many candles do you need?") is no collapse.
    trainer.collapse_thresholds = CollapseThresholds()
    trainer.train()
    return trainer


def collapse_flags(records: list[dict[str, Any]]) -> int:
    return sum(1 for r in records if r.get("collapse/flagged"))


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------
def fmt(s: dict[str, float], digits: int = 3) -> str:
    return f"{s['mean']:.{digits}f} [{s['lo']:.{digits}f}, {s['hi']:.{digits}f}]"


def transcript_md(title: str, ep: dict[str, Any]) -> str:
    lines = [f"### {title} (held-out item, episode seed {ep['seed']}: success {int(ep['success'])}, "
             f"{int(ep['questions'])} question(s), end: {ep['end_reason']})", ""]
    for m in ep["transcript"]:
        lines.append(f"**{m['role']}**: {m['text'].strip() or '(empty)'}  ")
    return "\n".join(lines) + "\n"


def plot(path: Path, rows: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2))
    names = [r["row"] for r in rows]
    for ax, metric, title in zip(axes, ("success", "questions", "tokens"),
                                 ("success (held-out)", "questions asked per episode", "assistant tokens per episode"),
                                 strict=True):
        m = [r[metric]["mean"] for r in rows]
        err = [[max(0.0, r[metric]["mean"] - r[metric]["lo"]) for r in rows],  # >= 0 (float rounding at 0/n, n/n)
               [max(0.0, r[metric]["hi"] - r[metric]["mean"]) for r in rows]]
        ax.bar(range(len(rows)), m, yerr=err, capsize=4, color=["#999", "#bbb", "#7aa", "#c96", "#47a", "#a7c"][:len(rows)])
        ax.set_xticks(range(len(rows)), names, rotation=25, ha="right", fontsize=8)
        ax.set_title(title + " (95% CI)")
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def relative(row: dict[str, Any], ref: dict[str, Any], metric: str) -> str:
    r, b = row[metric]["mean"], ref[metric]["mean"]
    if b == 0:  # no relative change from 0: the absolute one
        return f"{r - b:+.2f} (absolute; base 0)" if r != 0 else "0%"
    return f"{100.0 * (r - b) / abs(b):+.0f}%"


def main_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="embedded",
                   help="'embedded' (SmolLM2-135M-Instruct), or a model folder (the GPU form: a 0.5B-1.5B instruct model)")
    p.add_argument("--tokenizer", default=None, help="tokenizer folder (default: the model's)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda", "auto"))
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"),
                   help="auto: float32 on the CPU, bfloat16 on a GPU")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--sft-items", type=int, default=64, help="scripted collaborative conversations for SFT")
    p.add_argument("--sft-steps", type=int, default=8,
                   help="SFT optimiser steps before RL (8 = one epoch of the 64 conversations at batch 8)")
    p.add_argument("--sft-long-steps", type=int, default=0,
                   help="steps of the extra 'SFT, trained longer' row (0: no such row)")
    p.add_argument("--sft-batch", type=int, default=8)
    p.add_argument("--sft-lr", type=float, default=1e-3)
    p.add_argument("--grpo-items", type=int, default=16, help="GRPO training items (one update each)")
    p.add_argument("--grpo-lr", type=float, default=5e-4)
    p.add_argument("--generations", type=int, default=3, help="GRPO group size (per node of the tree)")
    p.add_argument("--turns", type=int, default=2,
                   help="assistant turns trained per item (the tree's depth: 2 = the question and the answer; "
                        "with 1, only the first reply is trained and the untrained answer turn drifts: see "
                        "benchmarks/results/collabllm_table_cpu_turn1.md)")
    p.add_argument("--rollouts", type=int, default=1, help="MR futures per reply (window > 0)")
    p.add_argument("--window", type=int, default=2, help="the MR row's window (user turns of a future)")
    p.add_argument("--normalize-advantages", action=argparse.BooleanOptionalAction, default=False,
                   help="divide group advantages by their std (GRPO's rule). Off by default (Dr. GRPO's "
                        "rule): with it, a group whose replies all succeed is ranked by the token penalty "
                        "alone, scaled up to unit size, and the first run here learned to shorten the "
                        "answer turn until its box broke (benchmarks/results/collabllm_table_cpu_stdnorm_seed0.md)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--max-new-tokens", type=int, default=40)
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument("--lora-modules", default="q_proj,k_proj,v_proj,o_proj")
    p.add_argument("--eval-episodes", type=int, default=32, help="held-out episodes per evaluation")
    p.add_argument("--eval-max-steps", type=int, default=4, help="env steps per evaluation episode (two assistant turns)")
    p.add_argument("--out", default=str(RESULTS / "collabllm_table_cpu"),
                   help="output prefix: <out>.json/.md/.png, <out>_transcripts.md, <out>_adapter/")
    return p


def main(argv: list[str] | None = None) -> int:
    a = main_parser().parse_args(argv)
    import peft

    from collab_env.agents.embedded import EmbeddedPolicy
    from collab_env.agents.proactive import Proactive

    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(os.environ.get("COLLAB_ENV_OUTPUT", "collab_env_output")) / "collabllm_table"
    command = "python benchmarks/bench_collabllm_table.py " + " ".join(
        shlex.quote(x) for x in (argv if argv is not None else sys.argv[1:]))
    t0 = time.perf_counter()
    stand_in = a.model if a.model.startswith("random:") else None
    a.model = resolve_model(a, work)
    timings: dict[str, float] = {}
    episodes: dict[str, list[dict[str, Any]]] = {}
    flags: dict[str, list[int]] = {}
    train_log: dict[str, Any] = {}

    # Base and Proactive Base: greedy and untrained, the same for every seed: evaluated once.
    ts = time.perf_counter()
    if a.model == "embedded":
        base = EmbeddedPolicy(max_batch_size=64, temperature=0.0, max_new_tokens=a.max_new_tokens)
    else:
        from collab_env.agents.hf import HFPolicy

        base = HFPolicy(a.model, a.tokenizer, device=a.device, dtype=a.dtype, max_batch_size=64, temperature=0.0,
                        max_new_tokens=a.max_new_tokens)
    tok = base.tokenizer
    episodes["Base"] = evaluate_policy(base, tok, a, "Base", None)
    timings["Base"] = time.perf_counter() - ts
    ts = time.perf_counter()
    episodes["Proactive Base"] = evaluate_policy(Proactive(base), tok, a, "Proactive Base", None)
    timings["Proactive Base"] = time.perf_counter() - ts
    mr_row = "SFT + GRPO (MR)"  # window a.window
    imm_row = "SFT + GRPO (immediate)"  # window 0
    long_row = f"SFT, trained longer ({a.sft_long_steps} steps)"
    for name in ("SFT", *((long_row,) if a.sft_long_steps else ()), imm_row, mr_row):
        episodes[name], flags[name], timings[name] = [], [], 0.0
    adapter_dir = Path(f"{out}_adapter")

    def write() -> list[dict[str, Any]]:
        rows = []
        for name, eps in episodes.items():
            if not eps:
                continue
            s = summarise(eps)
            window = a.window if name == mr_row else 0 if name == imm_row else None
            rows.append({"row": name, "window": window, **{k: s[k] for k in METRICS},
                         "collapse_flags": sum(flags[name]) if name in flags else None,
                         "collapse_flags_per_seed": flags.get(name),
                         "seeds": sorted({e["train_seed"] for e in eps if e["train_seed"] is not None}),
                         "per_seed": {str(sd): summarise([e for e in eps if e["train_seed"] == sd])
                                      for sd in sorted({e["train_seed"] for e in eps if e["train_seed"] is not None})},
                         "seconds": timings.get(name)})
        ref = next(r for r in rows if r["row"] == "Proactive Base")
        comparisons = {}
        if episodes[mr_row] and episodes[imm_row]:
            comparisons["MR minus immediate (paired, same items and seeds)"] = paired(episodes[mr_row], episodes[imm_row])
        for other in ("Base", "Proactive Base"):
            if episodes[mr_row]:
                r = next(x for x in rows if x["row"] == mr_row)
                o = next(x for x in rows if x["row"] == other)
                comparisons[f"{mr_row} vs {other}: intervals apart"] = {
                    k: bool(r[k]["lo"] > o[k]["hi"] or r[k]["hi"] < o[k]["lo"]) for k in ("success", "questions")}
        wall = time.perf_counter() - t0
        result = {
            "benchmark": "collabllm_table_cpu", "command": command, "env": ENV_ID, "model": a.model,
            "model_label": ("SmolLM2-135M-Instruct (embedded)" if a.model == "embedded" else Path(a.model).name)
                           + f", {a.device}",
            "complete": len(flags["SFT"]) == a.seeds and len(flags[mr_row]) == a.seeds,
            "settings": vars(a), "eval": {"split": "test", "episodes": a.eval_episodes, "seed": EVAL_SEED,
                                          "decoding": "greedy", "max_steps": a.eval_max_steps},
            "rows": rows, "comparisons": comparisons, "relative_to_proactive_base": {
                r["row"]: {m: relative(r, ref, m) for m in ("questions", "success", "tokens")} for r in rows},
            "paper_table1_online_dpo_vs_proactive_base_percent": {
                d: {"interactivity": v[0], "task": v[1], "tokens": v[2]} for d, v in PAPER_TABLE1.items()},
            "training": train_log, "wall_seconds": wall,
            "stand_in": (f"{stand_in}: randomly initialised weights; the numbers measure throughput, not "
                         "learning") if stand_in else None,
            "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "torch_threads": _torch_threads()},
            "adapter": str(adapter_dir.relative_to(ROOT)) if adapter_dir.is_relative_to(ROOT) else str(adapter_dir),
        }
        Path(f"{out}.json").write_text(json.dumps(result, indent=1) + "\n")
        plot(Path(f"{out}.png"), rows)
        Path(f"{out}.md").write_text(markdown(result, rows, a))
        tr = ["# Transcripts: the same held-out item before and after training\n"]
        for k in range(min(2, len(episodes["Base"]))):
            tr.append(transcript_md("Base", episodes["Base"][k]))
            tr.append(transcript_md("Proactive Base", episodes["Proactive Base"][k]))
            for name in ("SFT", long_row, imm_row, mr_row):
                if episodes.get(name):
                    tr.append(transcript_md(f"{name} (training seed 0)", episodes[name][k]))
        Path(f"{out}_transcripts.md").write_text("\n".join(tr))
        return rows

    for seed in range(a.seeds):
        ts = time.perf_counter()
        print(f"seed {seed}: SFT on {a.sft_items} scripted conversations, {a.sft_steps} steps...", flush=True)
        sft, losses = run_sft(seed, a, work)
        timings["SFT"] += time.perf_counter() - ts
        train_log[f"seed {seed} SFT loss"] = [round(x, 4) for x in losses]
        sft_state = {k: v.detach().clone() for k, v in peft.get_peft_model_state_dict(sft.pm.model).items()}
        ts = time.perf_counter()
        episodes["SFT"] += evaluate_policy(sft.pm.generator, tok, a, f"SFT (seed {seed})", seed)
        timings["SFT"] += time.perf_counter() - ts
        flags["SFT"].append(collapse_flags(sft.logger.records))
        del sft
        if a.sft_long_steps:
            ts = time.perf_counter()
            print(f"seed {seed}: SFT, {a.sft_long_steps} steps (the longer-trained row)...", flush=True)
            sft, losses = run_sft(seed, a, work, a.sft_long_steps)
            train_log[f"seed {seed} SFT ({a.sft_long_steps} steps) loss"] = [round(x, 4) for x in losses]
            episodes[long_row] += evaluate_policy(sft.pm.generator, tok, a, f"{long_row} (seed {seed})", seed)
            flags[long_row].append(collapse_flags(sft.logger.records))
            timings[long_row] += time.perf_counter() - ts
            del sft
        for window, name in ((0, imm_row), (a.window, mr_row)):
            ts = time.perf_counter()
            print(f"seed {seed}: GRPO, window {window}, {a.grpo_items} items x {a.generations} replies...", flush=True)
            trainer = run_grpo(seed, window, a, copy.deepcopy(sft_state), work)
            recs = list(trainer.logger.records)
            for turn in range(1, a.turns + 1):
                train_log[f"seed {seed} {name} turn {turn} reward"] = [
                    round(r[f"turn_{turn}/reward_mean"], 4) for r in recs if f"turn_{turn}/reward_mean" in r]
            flags[name].append(collapse_flags(recs))
            pm = trainer.models[0]
            episodes[name] += evaluate_policy(pm.generator, tok, a, f"{name} (seed {seed})", seed)
            timings[name] += time.perf_counter() - ts
            if seed == 0 and window == a.window:
                pm.model.save_pretrained(adapter_dir)
                (adapter_dir / "collab_env_adapter.json").write_text(json.dumps(
                    {"base": a.model, "env": ENV_ID, "seed": seed, "row": name, "command": command,
                     "settings": vars(a)}, indent=1) + "\n")
            del trainer, pm
        write()
        print(f"seed {seed} done ({(time.perf_counter() - t0) / 60:.1f} min so far)", flush=True)
    rows = write()
    for r in rows:
        print(f"{r['row']:32s} success {fmt(r['success'])}  questions {fmt(r['questions'])}  "
              f"tokens {fmt(r['tokens'], 1)}  flags {r['collapse_flags']}")
    print(f"wall time {(time.perf_counter() - t0) / 60:.1f} min; results in {out}.json/.md/.png")
    return 0


def markdown(result: dict[str, Any], rows: list[dict[str, Any]], a: argparse.Namespace) -> str:
    ref = next(r for r in rows if r["row"] == "Proactive Base")
    md = [f"# CollabLLM's Table 1 in miniature: {result['model_label']} on hidden-facts-copy", "",
          *([f"**{result['stand_in']}**", ""] if result.get("stand_in") else []),
          f"Command: `{result['command']}`  ",
          f"Wall time: {result['wall_seconds'] / 60:.1f} min ({os.cpu_count()} CPUs, device {a.device}); "
          f"{a.eval_episodes} held-out test episodes per evaluation (greedy, two assistant turns, the scripted "
          f"question-only user); trained rows pool {a.seeds} training seed(s). 95% intervals: Wilson for 0/1 "
          "metrics, else mean ± 1.96 SE. Collapse flags: training log lines the collapse monitor flagged.", "",
          "| row | success | questions / episode | facts obtained | tokens / episode | success, sampled (T=1) "
          "| collapse flags | time (s) |",
          "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['row']} | {fmt(r['success'])} | {fmt(r['questions'], 2)} | {fmt(r['facts'], 2)} | "
                  f"{fmt(r['tokens'], 1)} | {fmt(r['success_sampled'])} | "
                  f"{'-' if r['collapse_flags'] is None else r['collapse_flags']} | "
                  f"{r['seconds']:.0f} |")
    md += ["", "## Beside the paper's Table 1 (relative change against Proactive Base, same sign convention)", "",
           "The paper: Llama-3.1-8B, Online DPO on MR vs Proactive Base. Here: SmolLM2-135M, each row vs "
           "Proactive Base. Interactivity is the paper's judged score; here, questions asked per episode.", "",
           "| | interactivity / questions | task metric / success | tokens |", "|---|---|---|---|"]
    for d, (i, t, k) in PAPER_TABLE1.items():
        md.append(f"| paper, {d} | {i:+d}% | {t:+d}% | {k:+d}% |")
    for r in rows:
        if r is ref:
            continue
        md.append(f"| here, {r['row']} | {relative(r, ref, 'questions')} | {relative(r, ref, 'success')} | "
                  f"{relative(r, ref, 'tokens')} |")
    md += ["", "## Comparisons", ""]
    for name, comp in result["comparisons"].items():
        if all(isinstance(v, bool) for v in comp.values()):
            md.append(f"* {name}: " + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in comp.items()))
        else:
            md.append(f"* {name}: " + ", ".join(f"{k} {fmt(v)}" for k, v in comp.items()))
    md += ["", "Per seed (trained rows):", ""]
    for r in rows:
        for sd, s in r["per_seed"].items():
            md.append(f"* {r['row']}, seed {sd}: success {fmt(s['success'])}, questions {fmt(s['questions'], 2)}")
    return "\n".join(md) + "\n"


def _torch_threads() -> int | None:
    try:
        import torch

        return torch.get_num_threads()
    except ImportError:
        return None


if __name__ == "__main__":
    raise SystemExit(main())

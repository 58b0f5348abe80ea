#!/usr/bin/env bash
# GPU readiness in one command (see benchmarks/gpu/run.py): bf16 + gradient checkpointing,
# several agents' models on one device, HF and vLLM generation (vLLM with weight sync, when
# installed), bench_grpo_vs_trl, the MR cost (3 futures vs 1), a short learning run; writes
# run.json and run.md into --out (default benchmarks/gpu/results/).
#
#   benchmarks/gpu/run.sh                          # on a GPU machine (<= 8 minutes)
#   benchmarks/gpu/run.sh --device cpu --tiny      # the CPU check that `make test` runs
#
# The CollabLLM path end to end (examples/collabllm_end_to_end.py: data, SFT, MR-GRPO, board run,
# verify), full form, online (hub dataset, API user and judge):
#   benchmarks/gpu/run.sh collabllm-e2e --model Qwen/Qwen2.5-0.5B-Instruct --user litellm:openai/gpt-4o-mini \
#       --judge litellm:openai/gpt-4o-mini --dataset collabllm/collabllm-multiturn-math-hard --device cuda
#
# CollabLLM's Table 1 in miniature at GPU scale (benchmarks/bench_collabllm_table.py; a random
# Qwen2.5-0.5B stand-in unless --model names a 0.5B-1.5B instruct model folder):
#   benchmarks/gpu/run.sh --table --model /models/Qwen2.5-0.5B-Instruct
#
# The fidelity card of an LLM user simulator on a real model (collab_env.eval.check_user: probes on
# hidden-facts-v3, docs/check_user.md), the model an instruct folder loaded by the HF backend on the GPU;
# writes benchmarks/gpu/results/check_user_gpu.{json,md} (exit 1 when a measure is flagged):
#   benchmarks/gpu/run.sh check-user --model /models/Qwen2.5-1.5B-Instruct [--episodes 10]
#
# Python: $PYTHON, else the repository's .venv, else python3 (a GPU machine here has torch and
# transformers preinstalled). The SmolLM2 tokenizer for the random stand-in model: pass
# --tokenizer DIR (export it where the embedded model is installed with --export-tokenizer DIR).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
if [ -z "${PYTHON:-}" ]; then
  if [ -x "$root/.venv/bin/python" ]; then PYTHON="$root/.venv/bin/python"; else PYTHON=python3; fi
fi
if [ "${1:-}" = "--table" ]; then
  # CollabLLM's Table 1 in miniature (benchmarks/bench_collabllm_table.py) at GPU scale: a 0.5B-1.5B
  # instruct model folder (--model DIR), else a random-init Qwen2.5-0.5B stand-in (throughput only,
  # said in the output). Later flags override these defaults.
  shift
  export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 LITELLM_LOCAL_MODEL_COST_MAP=True
  export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
  exec "$PYTHON" "$root/benchmarks/bench_collabllm_table.py" --device cuda --model random:qwen2.5-0.5b \
    --eval-episodes 96 --grpo-items 48 --generations 8 --max-new-tokens 64 \
    --out "$root/benchmarks/gpu/results/collabllm_table_gpu" "$@"
fi
if [ "${1:-}" = "collabllm-e2e" ]; then
  shift
  export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
  exec "$PYTHON" "$root/examples/collabllm_end_to_end.py" "$@"
fi
if [ "${1:-}" = "check-user" ]; then
  shift
  if [ "${1:-}" != "--model" ] || [ -z "${2:-}" ]; then
    echo "usage: benchmarks/gpu/run.sh check-user --model MODEL_DIR [collab-env check-user options]" >&2; exit 2
  fi
  model="$2"; shift 2
  export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 LITELLM_LOCAL_MODEL_COST_MAP=True
  export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
  out="$root/benchmarks/gpu/results"
  mkdir -p "$out"
  # The simulator as a policy config file (the spec grammar's file form): the LLM user, JSON replies,
  # greedy, on the HF backend on the GPU. json.dumps quotes the folder whatever its characters.
  "$PYTHON" -c 'import json, sys; json.dump({"kind": "llm-user", "backend": "hf:" + sys.argv[1],
    "backend_options": {"device": "cuda"}, "options": {"reply_format": "json", "max_retries": 2},
    "sampling": {"temperature": 0.0, "max_new_tokens": 256}}, open(sys.argv[2], "w"), indent=2)' \
    "$model" "$out/check_user_gpu_spec.json"
  exec "$PYTHON" -m collab_env.cli check-user "$out/check_user_gpu_spec.json" --episodes 10 --no-progress \
    --out "$out/check_user_gpu.json" "$@"
fi
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 LITELLM_LOCAL_MODEL_COST_MAP=True
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
exec "$PYTHON" "$root/benchmarks/gpu/run.py" "$@"

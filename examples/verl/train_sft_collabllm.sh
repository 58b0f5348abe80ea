#!/usr/bin/env bash
# The CollabLLM recipe's optional SFT stage (verl's recipe/collabllm/train_sft_collabllm.sh
# settings) on verl 0.9.1's SFT trainer (verl.trainer.sft_trainer; the recipe's
# fsdp_sft_trainer is gone). Needs GPUs and verl 0.9.1 (see `make test-verl` for its pins).
#   NPROC=8 MODEL=Qwen/Qwen2.5-7B-Instruct bash examples/verl/train_sft_collabllm.sh [hydra overrides]
# The data step is the recipe's own command line (`collab-env data --dataset_type sft`: the whole
# conversation in the `prompt` column, which data.messages_key names); it runs once, when $DATA
# has no sft_train.parquet. Train RL from the result with MODEL=<checkpoint> train_collabllm.sh.
# `bash examples/verl/train_sft_collabllm.sh --cfg job` prints verl's resolved config and exits.
set -euo pipefail
DATASET="${DATASET:-math-hard-large}"
MODEL="${MODEL:-Qwen/Qwen2.5-7B-Instruct}"
DATA="${DATA:-$HOME/data/collabllm-$DATASET}"
NPROC="${NPROC:-8}"

if [ ! -f "$DATA/sft_train.parquet" ]; then
    collab-env data --dataset "collabllm/collabllm-multiturn-$DATASET" --local_dir "$DATA" --dataset_type sft
fi

if [ "${1:-}" = "--cfg" ]; then LAUNCH=(python3); else LAUNCH=(torchrun --nnodes=1 --nproc_per_node="$NPROC"); fi
"${LAUNCH[@]}" -m verl.trainer.sft_trainer \
    data.train_files="$DATA/sft_train.parquet" \
    data.val_files="$DATA/sft_validation.parquet" \
    data.messages_key=prompt \
    data.train_batch_size=64 \
    data.micro_batch_size_per_gpu=2 \
    data.max_length=8196 \
    optim.lr=1e-6 \
    model.path="$MODEL" \
    model.use_remove_padding=True \
    engine.ulysses_sequence_parallel_size=1 \
    trainer.project_name=collabllm-sft \
    trainer.experiment_name="multiturn-sft-collabllm-$DATASET" \
    trainer.logger='["console"]' \
    trainer.total_epochs=3 \
    "$@"

#!/usr/bin/env bash
# The CollabLLM recipe (verl's recipe/collabllm/train_rl_collabllm.sh settings) on verl 0.9.1 with
# collab_env's agent loop in place of the deleted verl/interactions. Needs GPUs (vLLM), verl 0.9.1
# with transformers<5.11, cachetools, fastapi and uvicorn (see `make test-verl`), and an API key
# for the user simulator and judge of examples/verl/agent_loop.yaml.
#   ENV_ID=collabllm-math-hard MODEL=Qwen/Qwen2.5-7B-Instruct bash examples/verl/train_collabllm.sh
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ENV_ID="${ENV_ID:-collabllm-math-hard}"
MODEL="${MODEL:-Qwen/Qwen2.5-7B-Instruct}"
DATA="${DATA:-$HOME/data/collab_env-$ENV_ID}"
ITEMS="${ITEMS:-512}"

python - "$ENV_ID" "$DATA" "$ITEMS" <<'PY'
import sys
from collab_env.adapters.verl import dataset_rows, write_dataset
env_id, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
write_dataset(f"{out}/rl_train.parquet", dataset_rows(env_id, range(n), seed=0))
write_dataset(f"{out}/rl_validation.parquet", dataset_rows(env_id, range(min(n, 64)), seed=10_000))
PY

python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    algorithm.use_kl_in_reward=False \
    data.train_files="$DATA/rl_train.parquet" \
    data.val_files="$DATA/rl_validation.parquet" \
    data.train_batch_size=16 \
    data.max_prompt_length=8196 \
    data.max_response_length=2048 \
    data.filter_overlong_prompts=True \
    data.truncation=error \
    actor_rollout_ref.model.path="$MODEL" \
    actor_rollout_ref.model.use_remove_padding=True \
    actor_rollout_ref.model.enable_gradient_checkpointing=True \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=8 \
    actor_rollout_ref.actor.use_dynamic_bsz=True \
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=24000 \
    actor_rollout_ref.actor.use_kl_loss=True \
    actor_rollout_ref.actor.kl_loss_coef=0.001 \
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.actor.fsdp_config.param_offload=True \
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=True \
    actor_rollout_ref.ref.fsdp_config.param_offload=True \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.mode=async \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.7 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.rollout.temperature=1.0 \
    actor_rollout_ref.rollout.calculate_log_probs=True \
    actor_rollout_ref.rollout.agent.agent_loop_config_path="$HERE/agent_loop.yaml" \
    reward.custom_reward_function.path="$(python -c 'import collab_env.adapters.verl.reward as r; print(r.__file__)')" \
    reward.custom_reward_function.name=compute_score \
    trainer.critic_warmup=0 \
    trainer.val_before_train=False \
    trainer.logger='["console"]' \
    trainer.project_name=collab_env-verl \
    trainer.experiment_name="collabllm-$ENV_ID" \
    trainer.nnodes=1 \
    trainer.n_gpus_per_node=8 \
    trainer.save_freq=100 \
    trainer.test_freq=10 \
    trainer.total_epochs=20 \
    "$@"

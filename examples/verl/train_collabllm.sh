#!/usr/bin/env bash
# The CollabLLM recipe's RL run (verl's recipe/collabllm/train_rl_collabllm.sh settings) on verl 0.9.1
# with collab_env's agent loop in place of the deleted verl/interactions. Needs GPUs (vLLM), verl
# 0.9.1 with transformers<5.11, cachetools, fastapi and uvicorn (see `make test-verl`), and an API
# key for the user simulator and judge of examples/verl/agent_loop.yaml.
#   MODEL=Qwen/Qwen2.5-7B-Instruct bash examples/verl/train_collabllm.sh [hydra overrides]
# The data step is the recipe's own command line (`collab-env data`, the rows of its
# process_dataset.py); it runs once, when $DATA has no rl_train.parquet. DATASET picks the set
# (math-hard-large, the recipe's; medium-large, bigcodebench-large...; set ENV_ID to match).
# `bash examples/verl/train_collabllm.sh --cfg job` prints verl's resolved config and exits.
#
# Every value below is the recipe's as merged into verl (commit 25d78fa, 2025-09-25; the seed's
# "last updated 2025-09-22"): collab_env.adapters.verl_recipe.RECIPE_VALUES states them once with
# the file each comes from, and tests/adapters/test_verl_recipe_values.py resolves this script and
# agent_loop.yaml and fails on any difference. Lines marked "recipe:" name the recipe file mirrored.
# Not reproduced: the recipe's wait of max(2**i, 60) s after a rate-limit error (simulator and
# judge); collab_env's litellm backend retries 429s itself, inside each attempt, with its own backoff.
#
# PROMPTS: where the data step reads the recipe's system prompt (recipe: process_dataset.py's
# SYSTEM_PROMPT, put on every RL row). A verl-recipe checkout (git clone
# https://github.com/verl-project/verl-recipe), a verl checkout, or the recipe folder; 'collabllm'
# reads the collabllm package's system_prompt.txt (pip install --no-deps collabllm); 'collab_env'
# writes our own wording instead (not the recipe's).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
DATASET="${DATASET:-math-hard-large}"
ENV_ID="${ENV_ID:-collabllm-$DATASET}"
MODEL="${MODEL:-Qwen/Qwen2.5-7B-Instruct}"
DATA="${DATA:-$HOME/data/collabllm-$DATASET}"
NGPUS="${NGPUS:-8}"
PROMPTS="${PROMPTS:?set PROMPTS to the CollabLLM recipe (a verl-recipe or verl checkout) for its system prompt, or PROMPTS=collab_env for our own wording (see the comment at the top)}"

if [ ! -f "$DATA/rl_train.parquet" ]; then
    # recipe: process_dataset.py (its rows, its SYSTEM_PROMPT with --prompts)
    collab-env data --dataset "collabllm/collabllm-multiturn-$DATASET" --local_dir "$DATA" --dataset_type rl \
        --prompts "$PROMPTS"
fi

# recipe: train_rl_collabllm.sh (every override below but the paths, the model's and the agent loop's)
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
    +reward_model.reward_kwargs.metric_weights.accuracy=1 \
    +reward_model.reward_kwargs.metric_weights.interactivity=1 \
    +reward_model.reward_kwargs.metric_weights.token_amount=-0.0001 \
    +reward_model.reward_kwargs.llm_judge_kwargs.model=gpt-4o-mini \
    +reward_model.reward_kwargs.llm_judge_kwargs.max_tokens=2048 \
    +reward_model.reward_kwargs.llm_judge_kwargs.temperature=0 \
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
    actor_rollout_ref.rollout.free_cache_engine=True \
    actor_rollout_ref.rollout.calculate_log_probs=True \
    actor_rollout_ref.rollout.multi_turn.max_user_turns=2 \
    actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3 \
    actor_rollout_ref.rollout.multi_turn.num_repeat_rollouts=3 \
    actor_rollout_ref.rollout.agent.agent_loop_config_path="$HERE/agent_loop.yaml" \
    actor_rollout_ref.rollout.agent.default_agent_loop=collabllm_agent \
    reward.custom_reward_function.path="$(python3 -c 'import collab_env.adapters.verl.reward as r; print(r.__file__)')" \
    reward.custom_reward_function.name=compute_score \
    trainer.critic_warmup=0 \
    trainer.val_before_train=False \
    trainer.logger='["console","wandb"]' \
    trainer.project_name=collab_env-verl \
    trainer.experiment_name="collabllm-$DATASET" \
    trainer.nnodes=1 \
    trainer.n_gpus_per_node="$NGPUS" \
    trainer.save_freq=100 \
    trainer.test_freq=10 \
    trainer.total_epochs=20 \
    "$@"

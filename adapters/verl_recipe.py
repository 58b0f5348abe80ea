"""The CollabLLM recipe's settings, stated once, and its verl knobs as collab_env reward keywords.

Importing this module needs no verl: the recipe table and the knob mapping are plain data and
functions, read by the verl agent loop (:mod:`collab_env.adapters.verl.loop`) and by the test
that holds ``examples/verl/`` to the recipe (``tests/adapters/test_verl_recipe_values.py``).

The recipe (:data:`RECIPE_SOURCE`)
    The version the project's seed describes ("last updated 2025-09-22"), as merged into verl in
    ``recipe/collabllm/`` and ``verl/interactions/collabllm_interation.py`` by commit 25d78fa
    (2025-09-25, PR #3574). :data:`RECIPE_VALUES` holds each setting a user of the recipe runs
    with, keyed by its name in the recipe's own config (verl's Hydra keys; ``interaction.*`` for
    the simulator's ``collabllm_interaction_config.yaml``; ``reward_function.*`` for the
    defaults of ``reward_function.py``; ``data.system_prompt`` for the rows
    ``process_dataset.py`` writes), with the recipe file it is read from.

Retries are counted as the recipe counts them: ``num_retries`` is the number of *attempts*
(``for i in range(num_retries)``); collab_env's ``max_retries`` counts the attempts after the
first, so the recipe's ``num_retries: N`` is ``max_retries: N - 1``.

What is not reproduced: after a rate-limit error the recipe's simulator and metric loops sleep
``max(2**i, 60)`` seconds (at least a minute) and try again within their attempt budget;
collab_env's litellm backend retries rate limits itself, inside each attempt, with its own backoff
(``backoff_base``/``backoff_max``, 0.5 s doubling to 8 s, with jitter, or the server's
``Retry-After``), so waits and the number of requests after a 429 differ.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from collab_env.errors import ConfigError

__all__ = ["RECIPE_SOURCE", "RECIPE_VALUES", "MULTI_TURN_KEYS", "MULTI_TURN_REFUSED", "JUDGE_KEYS",
           "recipe_overrides", "with_overrides", "plain", "config_section"]

#: Where :data:`RECIPE_VALUES` were read (checked 2026-12-06 on github.com/volcengine/verl).
RECIPE_SOURCE: Mapping[str, str] = {
    "repository": "https://github.com/volcengine/verl",
    "commit": "25d78fa91 ([recipe] feat: CollabLLM integration for multiturn training, #3574)",
    "date": "2025-09-25 (the recipe's README: last updated 2025-09-22)",
    "folder": "recipe/collabllm",
}

_SH = "recipe/collabllm/train_rl_collabllm.sh"
_INTERACTION = "recipe/collabllm/config/collabllm_interaction_config.yaml"
_REWARD_FN = "recipe/collabllm/reward_function.py"

#: The recipe's settings: key -> (value, the recipe file that sets it). Values as the recipe
#: states them (Hydra's reading of the launch script's overrides).
RECIPE_VALUES: Mapping[str, tuple[Any, str]] = {
    # the launch script's overrides
    "algorithm.adv_estimator": ("grpo", _SH),
    "algorithm.use_kl_in_reward": (False, _SH),
    "data.train_batch_size": (16, _SH),
    "data.max_prompt_length": (8196, _SH),
    "data.max_response_length": (2048, _SH),
    "data.filter_overlong_prompts": (True, _SH),
    "data.truncation": ("error", _SH),
    "reward_model.reward_kwargs.metric_weights.accuracy": (1, _SH),
    "reward_model.reward_kwargs.metric_weights.interactivity": (1, _SH),
    "reward_model.reward_kwargs.metric_weights.token_amount": (-0.0001, _SH),
    "reward_model.reward_kwargs.llm_judge_kwargs.model": ("gpt-4o-mini", _SH),
    "reward_model.reward_kwargs.llm_judge_kwargs.max_tokens": (2048, _SH),
    "reward_model.reward_kwargs.llm_judge_kwargs.temperature": (0, _SH),
    "actor_rollout_ref.model.path": ("Qwen/Qwen2.5-7B-Instruct", _SH),
    "actor_rollout_ref.model.use_remove_padding": (True, _SH),
    "actor_rollout_ref.model.enable_gradient_checkpointing": (True, _SH),
    "actor_rollout_ref.actor.fsdp_config.param_offload": (True, _SH),
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload": (True, _SH),
    "actor_rollout_ref.ref.fsdp_config.param_offload": (True, _SH),
    "actor_rollout_ref.rollout.gpu_memory_utilization": (0.7, _SH),
    "actor_rollout_ref.rollout.tensor_model_parallel_size": (1, _SH),
    "actor_rollout_ref.rollout.free_cache_engine": (True, _SH),
    "actor_rollout_ref.actor.optim.lr": (1e-6, _SH),
    "actor_rollout_ref.actor.ppo_mini_batch_size": (8, _SH),
    "actor_rollout_ref.actor.use_dynamic_bsz": (True, _SH),
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": (24000, _SH),
    "actor_rollout_ref.actor.use_kl_loss": (True, _SH),
    "actor_rollout_ref.actor.kl_loss_coef": (0.001, _SH),
    "actor_rollout_ref.actor.kl_loss_type": ("low_var_kl", _SH),
    "actor_rollout_ref.actor.entropy_coeff": (0, _SH),
    "actor_rollout_ref.rollout.name": ("vllm", _SH),
    "actor_rollout_ref.rollout.mode": ("async", _SH),
    "actor_rollout_ref.rollout.n": (8, _SH),
    "actor_rollout_ref.rollout.temperature": (1.0, _SH),
    "actor_rollout_ref.rollout.multi_turn.max_user_turns": (2, _SH),
    "actor_rollout_ref.rollout.multi_turn.max_assistant_turns": (3, _SH),
    "actor_rollout_ref.rollout.multi_turn.num_repeat_rollouts": (3, _SH),
    "trainer.critic_warmup": (0, _SH),
    "trainer.logger": (["console", "wandb"], _SH),
    "trainer.nnodes": (1, _SH),
    "trainer.n_gpus_per_node": (8, _SH),
    "trainer.val_before_train": (False, _SH),
    "trainer.save_freq": (100, _SH),
    "trainer.test_freq": (10, _SH),
    "trainer.total_epochs": (20, _SH),
    # the user simulator's config
    "interaction.user_model": ("gpt-4o-mini", _INTERACTION),
    "interaction.num_retries": (3, _INTERACTION),
    "interaction.max_tokens": (512, _INTERACTION),
    "interaction.temperature": (1.0, _INTERACTION),
    # the metric loop's default attempts
    "reward_function.num_retries": (6, _REWARD_FN),
    # the RL rows' system prompt
    "data.system_prompt": ("process_dataset.py SYSTEM_PROMPT", "recipe/collabllm/process_dataset.py"),
}

#: ``actor_rollout_ref.rollout.multi_turn`` keys -> the multiturn-aware reward's keywords.
MULTI_TURN_KEYS: Mapping[str, str] = {"max_user_turns": "max_user_turns",
                                      "max_assistant_turns": "max_assistant_turns",
                                      "num_repeat_rollouts": "num_rollouts"}
#: ``multi_turn`` keys that mean verl plays the user or tools itself: refused when set.
MULTI_TURN_REFUSED = ("interaction_config_path", "tool_config_path", "function_tool_path")
#: ``llm_judge_kwargs`` keys -> ``LLMJudge`` settings (``model`` becomes ``judge=``;
#: ``num_retries``, the recipe's attempts, becomes ``max_retries = num_retries - 1``;
#: ``temperature`` must be 0, the only temperature ``LLMJudge`` samples at, and is dropped).
JUDGE_KEYS: Mapping[str, str] = {"max_tokens": "max_new_tokens", "num_retries": "max_retries",
                                 "temperature": "temperature"}


def plain(value: Any) -> Any:
    """OmegaConf containers (what Hydra passes from the YAML) as plain dicts and lists."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf
    except ImportError:  # pragma: no cover - verl always brings omegaconf
        return value
    if isinstance(value, DictConfig | ListConfig):
        return OmegaConf.to_container(value, resolve=True)
    return value


def config_section(config: Any, *path: str) -> dict[str, Any]:
    """``config.<path>`` as a plain dict (``{}`` when a part is missing)."""
    node = config
    for key in path:
        if node is None:
            return {}
        node = node.get(key) if hasattr(node, "get") else getattr(node, key, None)
    node = plain(node)
    return dict(node) if isinstance(node, Mapping) else {}


def recipe_overrides(trainer_config: Any) -> dict[str, Any]:
    """The CollabLLM recipe's knobs in verl's config, as multiturn-aware reward keywords.

    Reads ``actor_rollout_ref.rollout.multi_turn`` (:data:`MULTI_TURN_KEYS`; ``None`` values
    are verl's "unset") and ``reward_model.reward_kwargs`` (``metric_weights``,
    ``llm_judge_kwargs``; see :data:`JUDGE_KEYS`).

    Raises:
        ConfigError: A knob that has no meaning here is set.
    """
    out: dict[str, Any] = {}
    multi_turn = config_section(trainer_config, "actor_rollout_ref", "rollout", "multi_turn")
    for key in MULTI_TURN_REFUSED:
        if multi_turn.get(key):
            raise ConfigError(f"actor_rollout_ref.rollout.multi_turn.{key} is set: with the collab_env agent loop "
                              "the env plays the user simulator (env_kwargs.reward_kwargs.user in the agent loop "
                              f"YAML) and has no verl tools; remove {key}.")
    for key, name in MULTI_TURN_KEYS.items():
        if multi_turn.get(key) is not None:
            out[name] = int(multi_turn[key])
    reward_kwargs = config_section(trainer_config, "reward_model", "reward_kwargs")
    unknown = sorted(set(reward_kwargs) - {"metric_weights", "llm_judge_kwargs"})
    if unknown:
        raise ConfigError(f"reward_model.reward_kwargs.{unknown[0]} has no meaning for the collab_env agent loop "
                          "(it reads metric_weights and llm_judge_kwargs); set the reward in the agent loop YAML's "
                          "env_kwargs.reward_kwargs instead.")
    if reward_kwargs.get("metric_weights"):
        out["weights"] = {str(k): float(v) for k, v in dict(reward_kwargs["metric_weights"]).items()}
    judge = dict(reward_kwargs.get("llm_judge_kwargs") or {})
    if judge:
        bad = sorted(set(judge) - {"model", *JUDGE_KEYS})
        if bad:
            raise ConfigError(f"reward_model.reward_kwargs.llm_judge_kwargs.{bad[0]} has no meaning here (known: "
                              f"{['model', *JUDGE_KEYS]}); set other judge settings in env_kwargs.reward_kwargs."
                              "judge_kwargs of the agent loop YAML.")
        if "model" in judge:
            model = str(judge.pop("model"))
            out["judge"] = model if ":" in model.split("/")[0] else f"litellm:{model}"
        if "num_retries" in judge:
            n = judge["num_retries"]
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ConfigError(f"reward_model.reward_kwargs.llm_judge_kwargs.num_retries is the recipe's number of "
                                  f"attempts, an int >= 1; got {n!r}.")
            judge["num_retries"] = n - 1
        if "temperature" in judge:
            if float(judge.pop("temperature")) != 0.0:
                raise ConfigError("reward_model.reward_kwargs.llm_judge_kwargs.temperature: collab_env's judges "
                                  "sample at temperature 0 only (the recipe's value); remove it or set 0.")
        if judge:
            out["judge_kwargs"] = {JUDGE_KEYS[k]: v for k, v in judge.items()}
    return out


def with_overrides(env_kwargs: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``env_kwargs`` with the recipe's knobs (:func:`recipe_overrides`) merged into
    ``reward_kwargs``; the knobs win, key by key inside ``judge_kwargs``."""
    out = dict(env_kwargs)
    if not overrides:
        return out
    if out.get("reward") != "mr":
        raise ConfigError(f"verl's config sets the CollabLLM recipe's reward knobs ({sorted(overrides)}) but the env "
                          "has no multiturn-aware reward; add reward: mr to the agent loop YAML's env_kwargs or "
                          "remove those settings.")
    reward_kwargs = dict(out.get("reward_kwargs") or {})
    judge_kwargs = {**dict(reward_kwargs.get("judge_kwargs") or {}), **dict(overrides.get("judge_kwargs") or {})}
    reward_kwargs.update({k: v for k, v in overrides.items() if k != "judge_kwargs"})
    if judge_kwargs:
        reward_kwargs["judge_kwargs"] = judge_kwargs
    out["reward_kwargs"] = reward_kwargs
    return out

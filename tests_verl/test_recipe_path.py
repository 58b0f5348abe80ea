"""The CollabLLM recipe's path on verl 0.9.1: ``collab-env data`` rows -> examples/verl -> the loop.

* ``examples/verl/train_collabllm.sh`` and ``train_sft_collabllm.sh`` run the recipe's data command
  (``collab-env data``) on a local copy of the hub dataset and hand verl the files it wrote; verl's
  resolved config (``--cfg job``) has the recipe's settings.
* The loop built from ``examples/verl/agent_loop.yaml`` with that config reads the recipe's knobs
  (``multi_turn.*``, ``reward_model.reward_kwargs.*``), refuses the ones with no meaning here, and
  plays the rows of ``rl_train.parquet`` as they are (no second row builder), one env per worker.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import datasets
import hydra
import pytest
import yaml
from omegaconf import OmegaConf
from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap

from collab_env.adapters.verl.loop import ENV_POOL, RECIPE_AGENT_NAME, CollabEnvAgentLoop
from collab_env.adapters.verl_recipe import recipe_overrides
from collab_env.errors import ConfigError
from collab_env.tasks.collabllm import DEFAULT_SYSTEM_PROMPT
from collab_env.testing.collabllm_fixtures import write_collabllm_hub_dir

from .test_agent_loop import GREEDY

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "verl"


def _script(name: str, home: Path, *args: str) -> subprocess.CompletedProcess:
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "HOME": str(home), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "MODEL": "tiny-model", "HYDRA_FULL_ERROR": "1", "PROMPTS": "collab_env"}
    return subprocess.run(["bash", str(EXAMPLES / name), *args], cwd=home, env=env, capture_output=True,
                          text=True, timeout=600)


def _printed_config(stdout: str) -> dict:
    """Hydra's ``--cfg job`` YAML, after the data step's lines."""
    return yaml.safe_load("\n".join(line for line in stdout.splitlines() if not line.startswith("wrote ")))


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """A HOME whose working folder holds a local copy of collabllm/collabllm-multiturn-math-hard-large."""
    home = tmp_path_factory.mktemp("home")
    write_collabllm_hub_dir(home / "collabllm" / "collabllm-multiturn-math-hard-large", n=12)
    return home


@pytest.fixture(scope="module")
def rl_config(home):
    """verl's resolved config of the example's RL run, and the files its data step wrote."""
    run = _script("train_collabllm.sh", home, "--cfg", "job")
    assert run.returncode == 0, run.stderr[-3000:]
    data = home / "data" / "collabllm-math-hard-large"
    assert "recipe rules" in run.stdout  # the data step is collab-env data with the recipe's rules
    config = OmegaConf.create(_printed_config(run.stdout))
    return config, data


def test_rl_example_hands_verl_the_recipe_files_and_settings(rl_config):
    config, data = rl_config
    assert config.data.train_files == str(data / "rl_train.parquet")
    assert config.data.val_files == str(data / "rl_validation.parquet")  # held out, disjoint
    train = datasets.load_dataset("parquet", data_files=config.data.train_files)["train"]
    val = datasets.load_dataset("parquet", data_files=config.data.val_files)["train"]
    assert set(train["agent_name"]) == {RECIPE_AGENT_NAME}
    assert not {r["extra_info"]["index"] for r in train} & {r["extra_info"]["index"] for r in val}
    rollout = config.actor_rollout_ref.rollout
    assert (rollout.n, rollout.temperature, rollout.multi_turn.max_user_turns, rollout.multi_turn.max_assistant_turns,
            rollout.multi_turn.num_repeat_rollouts) == (8, 1.0, 2, 3, 3)
    assert rollout.agent.agent_loop_config_path == str(EXAMPLES / "agent_loop.yaml")
    assert (config.data.max_response_length, config.data.train_batch_size, config.algorithm.adv_estimator) == (
        2048, 16, "grpo")
    assert dict(config.reward_model.reward_kwargs.metric_weights) == {
        "accuracy": 1, "interactivity": 1, "token_amount": -0.0001}


def test_sft_example_reads_the_prompt_column(home):
    run = _script("train_sft_collabllm.sh", home, "--cfg", "job")
    assert run.returncode == 0, run.stderr[-3000:]
    config = _printed_config(run.stdout)
    data = home / "data" / "collabllm-math-hard-large"
    assert config["data"]["train_files"] == str(data / "sft_train.parquet")
    assert config["data"]["messages_key"] == "prompt"
    rows = datasets.load_dataset("parquet", data_files=str(data / "sft_train.parquet"))["train"]
    assert rows.column_names == ["prompt"] and rows[0]["prompt"][0]["content"] == DEFAULT_SYSTEM_PROMPT


def _loop_from_example(config, server, tok, **env_overrides):
    """The loop as verl's AgentLoopWorker builds it from examples/verl/agent_loop.yaml."""
    [entry] = OmegaConf.load(EXAMPLES / "agent_loop.yaml")
    entry = OmegaConf.to_container(entry)
    entry["env_kwargs"] = {**entry["env_kwargs"], **env_overrides}
    return hydra.utils.instantiate(config=OmegaConf.create(entry), trainer_config=DictConfigWrap(config),
                                   server_manager=server, tokenizer=tok, processor=None, hf_model_type=None,
                                   dataset_cls=None, data_config=DictConfigWrap(config.data),
                                   tools=ToolListWrap([]))


def test_loop_reads_the_recipe_knobs(rl_config, server, tiny):
    config, data = rl_config
    assert recipe_overrides(config) == {
        "max_user_turns": 2, "max_assistant_turns": 3, "num_rollouts": 3,
        "weights": {"accuracy": 1.0, "interactivity": 1.0, "token_amount": -0.0001},
        "judge": "litellm:gpt-4o-mini", "judge_kwargs": {"max_new_tokens": 2048}}
    loop = _loop_from_example(config, server, tiny[1])
    row = datasets.load_dataset("parquet", data_files=config.data.train_files)["train"][0]
    cfg = loop.settings({**row, "raw_prompt": row["prompt"]})
    kw = cfg["env_kwargs"]["reward_kwargs"]
    assert kw["judge"] == "litellm:gpt-4o-mini"
    assert kw["judge_kwargs"] == {"max_new_tokens": 2048, "max_retries": 5}
    assert (kw["future_token_budget"], kw["on_fault"], kw["aggregation"], kw["num_rollouts"]) == (2048, "zero", "verl", 3)
    assert cfg["env_kwargs"]["data_files"] == [config.data.train_files] and cfg["env_kwargs"]["system_prompt"] is None
    assert cfg["item"]["extra_info"]["interaction_kwargs"] == row["extra_info"]["interaction_kwargs"]
    assert cfg["max_player_turns"] == 1 and cfg["env_id"] == "collabllm-math-hard-large"


@pytest.mark.parametrize("key,value,match", [
    ("actor_rollout_ref.rollout.multi_turn.interaction_config_path", "x.yaml", "interaction_config_path"),
    ("actor_rollout_ref.rollout.multi_turn.tool_config_path", "t.yaml", "tool_config_path"),
    ("reward_model.reward_kwargs.reward_scale", 2.0, "reward_scale"),
    ("reward_model.reward_kwargs.llm_judge_kwargs.top_p", 0.5, "top_p"),
])
def test_knobs_with_no_meaning_here_are_refused(rl_config, key, value, match):
    config = OmegaConf.create(OmegaConf.to_container(rl_config[0]))
    OmegaConf.update(config, key, value, force_add=True)
    with pytest.raises(ConfigError, match=match):
        recipe_overrides(config)


def test_recipe_knobs_on_an_env_without_mr_are_refused(rl_config, server, tiny):
    loop = _loop_from_example(rl_config[0], server, tiny[1], reward=None)
    row = datasets.load_dataset("parquet", data_files=rl_config[0].data.train_files)["train"][0]
    with pytest.raises(ConfigError, match="no multiturn-aware reward"):
        loop.settings({**row, "raw_prompt": row["prompt"]})


def test_loop_plays_the_rows_as_written_one_env_per_worker(rl_config, server, tiny):
    """Two samples of rl_train.parquet: each plays its own row (its system prompt and its last user
    turn are what the server is sent; its hidden goal is not), on one env made once."""
    config, data = rl_config
    offline = {"reward_kwargs": {"user": "replay", "aggregation": "collabllm",
                                 "weights": {"accuracy_rule": 1.0, "token_amount": -1e-3}, "num_rollouts": 1}}
    plain = OmegaConf.create(OmegaConf.to_container(config))
    plain.reward_model.reward_kwargs = {}  # the API judge's knobs: not offline
    loop = _loop_from_example(plain, server, tiny[1], **offline)
    loop.loop_config["sampling"] = {"assistant": {"max_new_tokens": 8}}
    rows = datasets.load_dataset("parquet", data_files=config.data.train_files)["train"]
    made = ENV_POOL.made
    tok = tiny[1]
    for row in (rows[0], rows[1]):
        out = asyncio.run(loop.run(dict(GREEDY), **{**row, "raw_prompt": row["prompt"]}))
        prompt = tok.decode(out.prompt_ids)
        assert row["prompt"][0]["content"] in prompt and row["prompt"][-1]["content"] in prompt
        assert row["extra_info"]["interaction_kwargs"]["single_turn_prompt"] not in prompt
        info = out.extra_fields["collab_env"]
        assert info["player_turns"] == 1 and info["index"] is None
        assert out.reward_score == pytest.approx(info["reward"])
    assert ENV_POOL.made == made + 1  # the second sample reused the first one's env


def test_a_reused_env_plays_each_samples_own_policy(server, tiny):
    """An env reused by the pool: the next sample's futures run on its own rollout policy (its own
    sampling), not the first sample's (the driver hands the reward each sample's policy table)."""
    from collab_env.adapters.verl import dataset_rows

    from .test_agent_loop import MR, MAX_NEW, make_loop, run_row

    [row] = dataset_rows("hidden-facts", [1], seed=2, env_kwargs=MR)
    row["collab_env"] = {**row["collab_env"], "max_player_turns": 1}
    loop = make_loop(server, tiny[1], sampling={"assistant": {"max_new_tokens": MAX_NEW}})
    first = run_row(loop, row)
    before = len(server.calls)
    again = run_row(loop, row)
    assert len(server.calls) - before == before  # the second sample's futures ran on its own policy
    assert again.reward_score == first.reward_score  # same seeds, same episode, reused env
    sampled = asyncio.run(loop.run({**GREEDY, "temperature": 1.0, "seed": 7}, **{**row, "raw_prompt": row["prompt"]}))
    assert all(c["sampling_params"]["temperature"] == 1.0 for c in server.calls[2 * before:])
    assert sampled.extra_fields["collab_env"]["player_turns"] == 1

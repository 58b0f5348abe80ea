"""``examples/verl/`` is the CollabLLM recipe the seed describes: 0 differences from the table.

The example's config is resolved as verl and the agent loop resolve it: the launch script's
Hydra overrides (``train_collabllm.sh``) merged into the agent loop YAML's reward keywords by
:func:`~collab_env.adapters.verl_recipe.recipe_overrides` / ``with_overrides`` (the launch
script wins), then read back in the recipe's own terms and compared, key by key, with
:data:`~collab_env.adapters.verl_recipe.RECIPE_VALUES`. The data step is run as the script
writes it, on a local copy of the hub dataset and a stand-in recipe tree (our own text).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from collab_env.adapters.verl_recipe import RECIPE_VALUES, recipe_overrides, with_overrides
from collab_env.errors import ConfigError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "verl"
SCRIPT = EXAMPLES / "train_collabllm.sh"
LOOP_YAML = EXAMPLES / "agent_loop.yaml"
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def _value(text: str) -> Any:
    """A Hydra override value: YAML's reading, with ``1e-6`` a float as Hydra reads it."""
    v = yaml.safe_load(text) if text else ""
    if isinstance(v, str) and _NUMBER.fullmatch(v):
        return float(v)
    return v


def launch_overrides(script: str) -> dict[str, Any]:
    """``key -> value`` of the ``verl.trainer.main_ppo`` command's overrides (``+`` dropped), the
    script's variables at their defaults (``VAR="${VAR:-default}"``)."""
    defaults = dict(re.findall(r'^(\w+)="\$\{\1:-([^}]*)\}"$', script, re.M))
    joined = re.sub(r"\\\n", " ", script)
    [line] = [ln for ln in joined.splitlines() if "verl.trainer.main_ppo" in ln and not ln.lstrip().startswith("#")]
    out = {}
    for token in shlex.split(line, comments=True):
        key, eq, value = token.partition("=")
        if eq and re.fullmatch(r"\+?[A-Za-z_][\w.]*", key):
            value = re.sub(r"\$\{?(\w+)\}?", lambda m: defaults.get(m[1], m[0]), value)
            out[key.lstrip("+")] = _value(value)
    return out


def nested(flat: dict[str, Any]) -> dict[str, Any]:
    root: dict[str, Any] = {}
    for key, value in flat.items():
        node = root
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return root


def _model(spec: str) -> str:
    return spec.removeprefix("litellm:")


def resolved_in_recipe_terms(script: str, loop_yaml: str) -> dict[str, Any]:
    """The example's effective settings, named as the recipe names them."""
    flat = launch_overrides(script)
    [entry] = yaml.safe_load(loop_yaml)
    env_kwargs = with_overrides(entry["env_kwargs"], recipe_overrides(nested(flat)))
    rk = env_kwargs["reward_kwargs"]
    judge, user = rk["judge_kwargs"], rk["user_kwargs"]
    view = {k: v for k, v in flat.items() if k in RECIPE_VALUES}  # what reaches verl itself
    jk = "reward_model.reward_kwargs.llm_judge_kwargs."
    view.update({
        jk + "model": _model(rk["judge"]),
        jk + "max_tokens": judge["max_new_tokens"],
        # LLMJudge samples at temperature 0 only; recipe_overrides refuses any other value
        jk + "temperature": judge.get("temperature", 0),
        **{f"reward_model.reward_kwargs.metric_weights.{m}": w for m, w in rk["weights"].items()},
        "actor_rollout_ref.rollout.multi_turn.max_user_turns": rk["max_user_turns"],
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns": rk["max_assistant_turns"],
        "actor_rollout_ref.rollout.multi_turn.num_repeat_rollouts": rk["num_rollouts"],
        "interaction.user_model": _model(rk["user"]),
        "interaction.num_retries": user["max_retries"] + 1,
        "interaction.max_tokens": user["sampling"]["max_new_tokens"],
        "interaction.temperature": user["sampling"]["temperature"],
        "reward_function.num_retries": judge["max_retries"] + 1,
    })
    if re.search(r'collab-env data [^\n]*(\\\n[^\n]*)*--prompts "\$PROMPTS"', script) and \
            re.search(r'PROMPTS="\$\{PROMPTS:\?', script):
        view["data.system_prompt"] = "process_dataset.py SYSTEM_PROMPT"
    return view


def differences(view: dict[str, Any]) -> list[str]:
    out = []
    for key, (want, source) in RECIPE_VALUES.items():
        got = view.get(key, "(not set)")
        if got != want or isinstance(got, bool) != isinstance(want, bool):
            out.append(f"{key}: example {got!r}, recipe {want!r} ({source})")
    return out


def test_the_example_resolves_to_the_recipe_with_no_difference():
    view = resolved_in_recipe_terms(SCRIPT.read_text(), LOOP_YAML.read_text())
    assert differences(view) == []


@pytest.mark.parametrize("edit,key", [
    # the launch script's judge budget beats the YAML's: a 1024 there is a difference
    (lambda s, y: (s.replace("llm_judge_kwargs.max_tokens=2048", "llm_judge_kwargs.max_tokens=1024"), y),
     "llm_judge_kwargs.max_tokens"),
    (lambda s, y: (s, y.replace("max_retries: 2,", "max_retries: 5,")), "interaction.num_retries"),
    (lambda s, y: (s, y.replace("{max_new_tokens: 2048, max_retries: 5}", "{max_new_tokens: 2048, max_retries: 6}")),
     "reward_function.num_retries"),
    (lambda s, y: (s.replace('["console","wandb"]', '["console"]'), y), "trainer.logger"),
    (lambda s, y: (s.replace('--prompts "$PROMPTS"', ""), y), "data.system_prompt"),
    (lambda s, y: (s.replace("multi_turn.num_repeat_rollouts=3", "multi_turn.num_repeat_rollouts=4"), y),
     "num_repeat_rollouts"),
])
def test_any_difference_is_caught(edit, key):
    script, loop = edit(SCRIPT.read_text(), LOOP_YAML.read_text())
    assert (script, loop) != (SCRIPT.read_text(), LOOP_YAML.read_text()), "the edit must change the example"
    found = differences(resolved_in_recipe_terms(script, loop))
    assert len(found) == 1 and key in found[0], found


def test_the_launch_script_beats_the_yaml():
    [entry] = yaml.safe_load(LOOP_YAML.read_text())
    base = entry["env_kwargs"]
    over = recipe_overrides(nested({"reward_model.reward_kwargs.llm_judge_kwargs.max_tokens": 7,
                                    "reward_model.reward_kwargs.llm_judge_kwargs.num_retries": 2}))
    judge = with_overrides(base, over)["reward_kwargs"]["judge_kwargs"]
    assert judge == {**base["reward_kwargs"]["judge_kwargs"], "max_new_tokens": 7, "max_retries": 1}
    with pytest.raises(ConfigError, match="num_retries is the recipe's number of attempts"):
        recipe_overrides(nested({"reward_model.reward_kwargs.llm_judge_kwargs.num_retries": 0}))
    with pytest.raises(ConfigError, match="temperature 0 only"):
        recipe_overrides(nested({"reward_model.reward_kwargs.llm_judge_kwargs.temperature": 0.7}))


def _data_step(script: str) -> str:
    """The script's data step (the body of its ``if [ ! -f ... ]`` block)."""
    m = re.search(r"^if \[ ! -f \"\$DATA/rl_train.parquet\" \]; then\n(.*?)^fi$", script, re.S | re.M)
    assert m, "the example's data step moved: update this test"
    return m.group(1)


def test_the_data_step_writes_the_recipe_system_prompt(tmp_path):
    import datasets

    from collab_env.testing.collabllm_fixtures import write_collabllm_hub_dir

    write_collabllm_hub_dir(tmp_path / "collabllm" / "collabllm-multiturn-math-hard-large", n=6)
    recipe = tmp_path / "verl-recipe" / "collabllm"  # the verl-recipe layout, our own text
    recipe.mkdir(parents=True)
    (recipe / "process_dataset.py").write_text('raise SystemExit\nSYSTEM_PROMPT = "OUR-STANDIN-RECIPE-SYSTEM"\n')
    env = {**os.environ, "DATASET": "math-hard-large", "DATA": str(tmp_path / "data"),
           "PROMPTS": str(tmp_path / "verl-recipe"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    run = subprocess.run(["bash", "-euo", "pipefail", "-c", _data_step(SCRIPT.read_text())], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = datasets.load_dataset("parquet", data_files=str(tmp_path / "data" / "rl_train.parquet"))["train"]
    assert {r["prompt"][0]["content"] for r in rows} == {"OUR-STANDIN-RECIPE-SYSTEM"}


def test_the_script_refuses_to_run_without_prompts(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PROMPTS"}
    run = subprocess.run(["bash", str(SCRIPT)], cwd=tmp_path, env={**env, "HOME": str(tmp_path)},
                         capture_output=True, text=True, timeout=60)
    assert run.returncode != 0 and "set PROMPTS to the CollabLLM recipe" in run.stderr
    assert not (tmp_path / "data").exists()

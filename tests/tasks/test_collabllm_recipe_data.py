"""``collab-env data`` is the verl recipe's ``process_dataset.py``: its command line, its rows.

The recipe's command line (its docstring's two commands, with only the program name changed) runs
on a local copy of a ``-large`` hub dataset whose rows exercise every rule the recipe has:
prompt-only dedup (a reply repeated for the chosen and rejected rows of the ``-large`` sets, and
another task that opens with the same words), the ``completion`` fallback of ``ground_truth``,
several turns of one conversation, score ties. The outputs are compared with the recipe's rules,
written out independently below (:func:`_recipe_rl` and :func:`_recipe_sft`, from the recipe's
documented behaviour), row by row and split by split.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import datasets
import pytest

import collab_env
from collab_env.tasks.collabllm import DEFAULT_SYSTEM_PROMPT
from collab_env.tasks.collabllm_load import load_collabllm_dataset
from collab_env.tasks.collabllm_modes import RECIPE_RL_COLUMNS, RECIPE_SFT_COLUMNS, RECIPE_TASK_DESC
from collab_env.testing.collabllm_fixtures import collabllm_fixture_rows, write_collabllm_hub_dir

DATASET = "math-hard-large"
# The recipe's docstring, with only the program name changed (python recipe/collabllm/process_dataset.py
# -> collab-env data).
RECIPE_COMMANDS = """
DATASET={dataset}

collab-env data \\
  --dataset collabllm/collabllm-multiturn-$DATASET  \\
  --local_dir $HOME/data/collabllm-$DATASET \\
  --dataset_type sft


collab-env data \\
  --dataset collabllm/collabllm-multiturn-$DATASET  \\
  --local_dir $HOME/data/collabllm-$DATASET \\
  --dataset_type rl
"""


def _rows() -> list[dict]:
    """Fixture rows of the -large layout plus the cases each recipe rule decides."""
    rows = collabllm_fixture_rows(8, layout="large")
    again = copy.deepcopy(rows[0])  # the same prefix again, another recorded reply: the -large repeat
    again.update(completion="ANOTHER-REPLY-0", score=0.9)
    other_task = copy.deepcopy(rows[2])  # another hidden goal behind the same opening words
    other_task.update(single_turn_prompt="HIDDEN-GOAL-OTHER: multiply 6 by 7.", conv_id=102)
    earlier = copy.deepcopy(rows[1])  # an earlier turn of conversation 1
    earlier.update(prompt=rows[1]["prompt"][:1], turn_id=1, score=1.0, completion="EARLIER-REPLY-1")
    tie = copy.deepcopy(rows[3])  # same conversation, turn and score: the first row wins
    tie.update(completion="TIED-REPLY-3")
    rows[4]["single_turn_completion"] = ""  # ground_truth falls back to the recorded completion
    return rows + [again, other_task, earlier, tie]


def _plain(value):
    """Rows as read from parquet, without the None fill-ins of struct columns."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _recipe_rl(source: datasets.Dataset, system_prompt: str) -> list[dict]:
    """The recipe's RL rules: task_desc on every row, system prompt first, ground_truth's
    fallbacks, extra_info = every other field, dedup on the prompt alone (first kept)."""
    out, seen = [], set()
    for row in source.to_list():
        row = {**row, "task_desc": RECIPE_TASK_DESC}
        truth = row.get("ground_truth") or row.get("single_turn_completion") or row.get("completion") or ""
        prompt = [{"role": "system", "content": system_prompt}] + row["prompt"]
        extra = {k: v for k, v in row.items() if k not in ("prompt", "ground_truth", "extra_info")}
        kwargs = {"name": "collabllm", "single_turn_prompt": extra.pop("single_turn_prompt"),
                  "task_desc": extra.pop("task_desc")}
        key = json.dumps(prompt, sort_keys=True, ensure_ascii=False)
        if key in seen:
            continue
        seen.add(key)
        out.append({"prompt": prompt, "ground_truth": truth, "raw_prompt": prompt,
                    "extra_info": {**extra, "prompt": prompt, "interaction_kwargs": kwargs},
                    "reward_model": {"style": "rule", "ground_truth": truth}, "data_source": "collabllm",
                    "agent_name": "collabllm_agent"})
    return out


def _recipe_sft(source: datasets.Dataset, system_prompt: str) -> list[dict]:
    """The recipe's SFT rules: rows sorted by conv_id up, turn_id down, score down (stable), the
    first of each conversation, its prompt with the system prompt first and the completion last."""
    rows = sorted(source.to_list(), key=lambda r: (r["conv_id"], -r["turn_id"], -r["score"]))
    out, seen = [], set()
    for row in rows:
        if row["conv_id"] in seen:
            continue
        seen.add(row["conv_id"])
        out.append({"prompt": [{"role": "system", "content": system_prompt}] + row["prompt"]
                    + [{"role": "assistant", "content": row["completion"]}]})
    return out


def _split(rows: list[dict]) -> dict[str, list[dict]]:
    """The recipe's split of ``rows``: train_test_split(test_size=0.1, seed=42, shuffle=True)."""
    order = datasets.Dataset.from_dict({"i": list(range(len(rows)))}).train_test_split(
        test_size=0.1, seed=42, shuffle=True)
    return {"train": [rows[i] for i in order["train"]["i"]], "validation": [rows[i] for i in order["test"]["i"]]}


@pytest.fixture(scope="module")
def recipe_run(tmp_path_factory):
    """The recipe's two commands, run in a shell, on a local copy of the hub dataset."""
    home = tmp_path_factory.mktemp("home")
    hub = write_collabllm_hub_dir(home / "collabllm" / f"collabllm-multiturn-{DATASET}", rows=_rows())
    program = Path(sys.executable).parent / "collab-env"
    env = {**os.environ, "HOME": str(home), "PATH": f"{program.parent}{os.pathsep}{os.environ['PATH']}"}
    run = subprocess.run(["bash", "-c", "set -e\n" + RECIPE_COMMANDS.format(dataset=DATASET)], cwd=home, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    # a cache of its own: the shared HF cache can hold a stale build of a reused tmp path
    source = datasets.load_dataset(str(hub), cache_dir=str(home / "hf-datasets"))["train"]  # every split: here one
    return home / "data" / f"collabllm-{DATASET}", source, run


def _written(folder: Path, mode: str) -> dict[str, list[dict]]:
    return {name: [_plain(r) for r in datasets.load_dataset(
        "parquet", data_files=str(folder / f"{mode}_{name}.parquet"), cache_dir=str(folder / "hf-datasets"),
    )["train"].to_list()]
            for name in ("train", "validation")}


def test_recipe_command_line_writes_the_recipe_files(recipe_run):
    folder, _, run = recipe_run
    for mode in ("rl", "sft"):
        for name in ("train", "validation"):
            assert (folder / f"{mode}_{name}.parquet").is_file()
    assert "rl_train.parquet" in run.stdout and "recipe rules" in run.stdout
    # the row whose reference answer is empty is reported, not silently scored against a reply
    assert "1 row(s) have no single_turn_completion" in run.stderr


def test_rl_rows_follow_the_recipe_rules(recipe_run):
    folder, source, _ = recipe_run
    written = _written(folder, "rl")
    expected = _split(_recipe_rl(source, DEFAULT_SYSTEM_PROMPT))
    assert len(expected["train"]) + len(expected["validation"]) == len(source) - 3  # dedup drops the repeat, the tie and the other task
    for name in ("train", "validation"):
        got = written[name]
        assert [tuple(r) for r in got] == [RECIPE_RL_COLUMNS] * len(got)
        assert len(got) == len(expected[name])
        for mine, theirs in zip(got, expected[name]):
            for column in ("prompt", "ground_truth", "raw_prompt", "reward_model", "data_source", "agent_name"):
                assert mine[column] == _plain(theirs[column]), column
            extra, want = mine["extra_info"], _plain(theirs["extra_info"])
            # extra_info: every field of the recipe's, equal (sessions normalised to message
            # lists, the -large judge details beside them), plus the source row number
            for key in set(want) - {"sessions"}:
                assert extra[key] == want[key], key
            assert set(extra) - set(want) <= {"index", "session_details"}
            assert len(extra["sessions"]) == len(want["sessions"])
            # the hidden goal and the reference answer are never in what the policy is shown
            assert extra["interaction_kwargs"]["single_turn_prompt"] not in json.dumps(mine["prompt"])
    truths = {r["extra_info"]["conv_id"]: r["ground_truth"] for part in written.values() for r in part}
    assert truths[4] == "RECORDED-COMPLETION-4: which sum do you mean?"  # the completion fallback
    assert 102 not in truths  # another task behind the same prompt: dropped, as the recipe does


def test_sft_rows_follow_the_recipe_rules(recipe_run):
    folder, source, _ = recipe_run
    written = _written(folder, "sft")
    expected = _split(_recipe_sft(source, DEFAULT_SYSTEM_PROMPT))
    assert written == {k: [_plain(r) for r in v] for k, v in expected.items()}
    assert all(tuple(r) == RECIPE_SFT_COLUMNS for part in written.values() for r in part)
    finals = {json.dumps(r["prompt"][1]): r["prompt"][-1]["content"] for part in written.values() for r in part}
    assert "ANOTHER-REPLY-0" in finals.values()  # conversation 0: the higher score of the same turn
    assert "TIED-REPLY-3" not in finals.values()  # a tie: the first row
    assert "EARLIER-REPLY-1" not in finals.values()  # conversation 1: its latest turn


def test_recipe_options_that_have_no_meaning_here_are_refused(tmp_path, capsys):
    from collab_env.tasks.collabllm_data import main

    hub = write_collabllm_hub_dir(tmp_path / "hub", n=4)
    assert main(["--dataset", str(hub), "--local_dir", str(tmp_path / "o"), "--hdfs_dir", "/hdfs/x"]) == 1
    assert "--hdfs_dir" in capsys.readouterr().err and not (tmp_path / "o").exists()
    assert main(["--dataset", str(hub), "--local_dir", str(tmp_path / "o"), "--dataset_type", "sft",
                 "--min_score", "0.5"]) == 1
    assert "rules='recipe'" in capsys.readouterr().err
    assert main(["--dataset", str(hub), "--local_dir", str(tmp_path / "o"), "--dataset_type", "dpo",
                 "--rules", "recipe"]) == 1
    assert "no mode 'dpo'" in capsys.readouterr().err
    # --num_proc is the recipe's, and is used (the files are read by two workers)
    assert main(["--dataset", str(hub), "--local_dir", str(tmp_path / "o"), "--num_proc", "2"]) == 0


def test_rl_files_read_back_into_the_env(recipe_run):
    """The held-out RL split is what an env plays: the row's system prompt, its hidden goal."""
    folder, _, _ = recipe_run
    rows = load_collabllm_dataset("collabllm-math-hard", str(folder / "rl_validation.parquet"))
    written = _written(folder, "rl")["validation"]
    assert len(rows) == len(written)
    assert rows[0]["single_turn_prompt"] == written[0]["extra_info"]["interaction_kwargs"]["single_turn_prompt"]
    assert rows[0]["single_turn_completion"] == written[0]["reward_model"]["ground_truth"]
    env = collab_env.make("collabllm-math-hard", data_files=str(folder / "rl_validation.parquet"), system_prompt=None)
    obs, _ = env.reset(seed=0, options={"index": 0})
    seen = obs["assistant"]
    assert seen[0].role == "system" and seen[0].content == DEFAULT_SYSTEM_PROMPT
    goal = [m for m in obs["user"] if m.meta.get("kind")]
    assert any(m.meta.get("single_turn_prompt") == rows[0]["single_turn_prompt"] for m in goal)
    assert rows[0]["single_turn_prompt"] not in "".join(m.content for m in seen)
    env.close()


def test_env_plays_a_row_it_is_given(recipe_run):
    """reset(options={"item": row}) plays an RL row as verl hands it over, checked like the
    dataset's own rows; a generated task refuses the option."""
    folder, _, _ = recipe_run
    row = _written(folder, "rl")["train"][0]
    env = collab_env.make("collabllm-math-hard", data_files=str(folder / "rl_validation.parquet"), system_prompt=None)
    obs, _ = env.reset(seed=0, options={"item": row})
    assert env.unwrapped.episode.index is None
    assert env.unwrapped.episode.item["single_turn_completion"] == row["reward_model"]["ground_truth"]
    assert [m.content for m in obs["assistant"] if m.role != "system"] == [
        m["content"] for m in row["prompt"] if m["role"] != "system"]
    broken = {**row, "extra_info": {k: v for k, v in row["extra_info"].items() if k != "interaction_kwargs"}}
    with pytest.raises(collab_env.errors.DataSchemaError, match="interaction_kwargs"):
        env.reset(options={"item": broken})
    with pytest.raises(collab_env.errors.ConfigError, match="not both"):
        env.reset(options={"item": row, "index": 0})
    env.close()
    other = collab_env.make("hidden-facts")
    with pytest.raises(collab_env.errors.ConfigError, match="plays only its own items"):
        other.reset(options={"item": {"a": 1}})
    other.close()


def test_verl_example_env_has_the_recipe_settings(tmp_path):
    """examples/verl/agent_loop.yaml builds (no API call is made): the recipe's window, budget,
    fault rule, simulator and judge lengths and retries, on the env the loop plays rows with."""
    import yaml

    from collab_env.testing.collabllm_fixtures import write_collabllm_fixture

    [entry] = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / "verl" / "agent_loop.yaml").read_text())
    assert entry["name"] == "collabllm_agent" and entry["env_id"] == "collabllm-math-hard-large"
    assert entry["max_player_turns"] == 1 and entry["sampling"]["assistant"]["max_new_tokens"] == 2048
    data = write_collabllm_fixture(tmp_path, "list", "jsonl", n=4)
    env = collab_env.make(entry["env_id"], data_files=str(data), system_prompt=None, **entry["env_kwargs"])
    sc = env.scorer
    assert (sc.num_rollouts, sc.max_user_turns, sc.max_assistant_turns, sc.future_token_budget) == (3, 2, 3, 2048)
    assert (env.scorer.metric_set.on_fault, env.scorer.metric_set.aggregation) == ("zero", "verl")
    assert env.scorer.metric_set.weights == {"accuracy": 1.0, "interactivity": 1.0, "token_amount": -0.0001}
    user = env.scorer.named["user"]
    assert user.max_retries == 2 and dict(user.sampling) == {"max_new_tokens": 512, "temperature": 1.0}
    judges = env.scorer.metric_set.ctx["judge"]
    assert {(j.max_new_tokens, j.max_retries) for j in judges.values()} == {(2048, 5)}
    env.close()
    with pytest.raises(collab_env.errors.ConfigError, match="user_kwargs"):
        collab_env.make("collabllm-math-hard", data_files=str(data), reward="mr",
                        reward_kwargs={"user": "replay", "user_kwargs": {"max_retries": 1},
                                       "weights": {"accuracy_rule": 1.0}})


def test_a_rewritten_local_folder_is_read_afresh(tmp_path):
    """datasets caches a local dataset folder by its name and card: two folders of the same name
    (or one rewritten) must not read each other's rows."""
    a = write_collabllm_hub_dir(tmp_path / "a" / "collabllm-multiturn-math-hard", n=4)
    b = write_collabllm_hub_dir(tmp_path / "b" / "collabllm-multiturn-math-hard", n=7)
    assert len(load_collabllm_dataset(str(a), None, None)) == 4
    assert len(load_collabllm_dataset(str(b), None, None)) == 7
    write_collabllm_hub_dir(a, n=6)
    assert len(load_collabllm_dataset(str(a), None, None)) == 6


def test_every_split_is_read_as_the_recipe_does_and_a_test_split_is_warned_about(tmp_path, capsys):
    """The recipe merges every split; with a test split (which the collabllm tracks play) that
    leaks it into training, so it says so; --split train (and collab_env rules) keep it out."""
    import warnings

    from collab_env.tasks.collabllm_data import main

    folder = tmp_path / "ds"
    folder.mkdir()
    rows = collabllm_fixture_rows(6)
    for name, part in (("train", rows[:4]), ("test", rows[4:])):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    with pytest.warns(UserWarning, match="test split go into the training files"):
        assert main(["--dataset", str(folder), "--local_dir", str(tmp_path / "o1"), "--validation_size", "1"]) == 0
    assert "rl_train.parquet (5 rows" in capsys.readouterr().out
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert main(["--dataset", str(folder), "--local_dir", str(tmp_path / "o2"), "--validation_size", "1",
                     "--split", "train"]) == 0
        assert "rl_train.parquet (3 rows" in capsys.readouterr().out
        assert main(["--dataset", str(folder), "--local_dir", str(tmp_path / "o3"), "--validation_size", "1",
                     "--rules", "collab_env"]) == 0
        assert "rl_train.parquet (3 rows" in capsys.readouterr().out

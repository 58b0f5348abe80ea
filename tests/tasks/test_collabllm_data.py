"""RL / SFT / DPO datasets built from CollabLLM rows (collab_env.tasks.collabllm_data), offline."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import datasets
import pytest

from collab_env.errors import ConfigError, DataSchemaError
from collab_env.tasks.collabllm_data import main, process_collabllm_dataset, train_validation_split
from collab_env.tasks.collabllm_modes import (
    DPO_COLUMNS,
    RECIPE_RL_COLUMNS,
    RECIPE_SFT_COLUMNS,
    RL_COLUMNS,
    SFT_COLUMNS,
    build_dpo_dataset,
    build_rl_dataset,
    build_sft_dataset,
)
from collab_env.testing.collabllm_fixtures import collabllm_fixture_rows, write_collabllm_fixture

SECRETS = ("HIDDEN-GOAL", "REFERENCE-ANSWER")
SYSTEM = "You are a collaborative assistant."


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(k, "1")


def _secret_free(value) -> bool:
    text = json.dumps(value)
    return not any(s in text for s in SECRETS)


def _reply(row: dict, completion: str, score: float, **kw) -> dict:
    """Another recorded reply to the same prefix as ``row`` (same conv_id and prompt)."""
    return {**row, "completion": completion, "score": score, **kw}


def _scored_rows() -> list[dict]:
    """Fixture rows plus extra replies with known scores.

    conv 0: one prefix (turn 1) with replies scored 0.0 (fixture), 0.9, 0.4.
    conv 1: prefix at turn 3 with replies 0.25 (fixture), 0.5, 0.5 (a tie, later row);
            its earlier turn (turn 1) with a reply scored 0.95.
    """
    r0, r1 = collabllm_fixture_rows(2)
    early1 = {**r0, "conv_id": 1, "prompt": r1["prompt"][:1], "turn_id": 1,
              "completion": "EARLY-1", "score": 0.95,
              "single_turn_prompt": r1["single_turn_prompt"],
              "single_turn_completion": r1["single_turn_completion"]}
    return [
        r0, _reply(r0, "BEST-0", 0.9), _reply(r0, "MID-0", 0.4),
        early1, r1, _reply(r1, "TIE-FIRST-1", 0.5), _reply(r1, "TIE-SECOND-1", 0.5),
    ]


# ---------------------------------------------------------------------------------------------
# RL
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["list", "struct"])
@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_rl_columns_and_hidden_goal_only_in_extra_info(tmp_path, layout, fmt):
    path = write_collabllm_fixture(tmp_path, layout, fmt, n=6)
    splits = process_collabllm_dataset("collabllm/collabllm-multiturn-math-hard", "rl",
                                       data_files=str(path), validation_size=0)
    ds = splits["train"]
    assert tuple(ds.column_names) == RL_COLUMNS
    assert len(ds) == 6 and len(splits["validation"]) == 0
    rows = {r["conv_id"]: r for r in collabllm_fixture_rows(6, layout=layout)}
    for out in ds:
        row = rows[out["extra_info"]["conv_id"]]
        assert out["prompt"] == row["prompt"]  # exactly the recorded prefix, nothing added
        assert out["prompt"][-1]["role"] == "user"
        assert _secret_free(out["prompt"]) and _secret_free(out["extra_info"]["prompt"])
        kwargs = out["extra_info"]["interaction_kwargs"]
        assert kwargs == {"name": "collabllm", "single_turn_prompt": row["single_turn_prompt"],
                          "task_desc": "solving math problems"}
        assert out["reward_model"] == {"style": "rule", "ground_truth": row["single_turn_completion"]}
        assert "single_turn_prompt" not in out["extra_info"]
        assert out["data_source"] == "collabllm" and out["agent_name"] == "collabllm_agent"
        assert out["ability"] == "math"
        assert out["index"] == out["extra_info"]["index"]
        assert out["extra_info"]["completion"] == row["completion"]


def test_rl_sessions_normalised_the_same_in_both_layouts():
    as_list = build_rl_dataset(collabllm_fixture_rows(4, layout="list"))
    as_struct = build_rl_dataset(collabllm_fixture_rows(4, layout="struct"))
    assert list(as_list["extra_info"]) == list(as_struct["extra_info"])
    assert len(as_list[1]["extra_info"]["sessions"]) == 3 and len(as_list[0]["extra_info"]["sessions"]) == 2


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_rl_rows_from_the_large_layout_keep_forward_chats_and_judge_details(tmp_path, fmt):
    path = write_collabllm_fixture(tmp_path / f"large.{fmt}", "large", fmt, n=4)
    splits = process_collabllm_dataset("collabllm/collabllm-multiturn-math-hard-large", "rl", data_files=str(path),
                                       validation_size=0, output_dir=tmp_path / "out")
    rows = {r["index"]: r for r in splits["train"]}
    for i, row in enumerate(collabllm_fixture_rows(4, layout="large")):
        extra = rows[i]["extra_info"]
        keys = sorted(row["sessions"])
        assert extra["sessions"] == [row["sessions"][k]["forward_chat"] for k in keys]
        details = extra["session_details"]  # arrow gives every row the union of the fields
        assert [d["key"] for d in details] == keys
        assert [d["interactivity"]["thought"] for d in details] == [f"JUDGE-THOUGHT-{i}-{k}" for k in keys]
        assert (details[0]["accuracy"] is not None) == (i % 2 == 0)
        assert not any(s in json.dumps(rows[i]["prompt"]) for s in SECRETS + ("JUDGE-THOUGHT",))
    assert os.path.exists(tmp_path / "out" / "rl_train.parquet")


def test_rl_system_prompt_replaces_row_system_and_task_desc_precedence():
    rows = collabllm_fixture_rows(2, task_desc="row task")
    rows[0]["prompt"] = [{"role": "system", "content": "ROW-SYSTEM"}] + rows[0]["prompt"]
    ds = build_rl_dataset(rows, system_prompt=SYSTEM)
    assert ds[0]["prompt"][0] == {"role": "system", "content": SYSTEM}
    assert "ROW-SYSTEM" not in json.dumps(list(ds["prompt"]))
    assert ds[0]["prompt"][1:] == rows[0]["prompt"][1:]
    assert ds[0]["extra_info"]["interaction_kwargs"]["task_desc"] == "row task"
    ds = build_rl_dataset(rows, task_desc="given", ability="x")
    assert ds[0]["prompt"][0]["content"] == "ROW-SYSTEM"  # kept without system_prompt=
    assert {r["interaction_kwargs"]["task_desc"] for r in list(ds["extra_info"])} == {"given"}
    assert set(list(ds["ability"])) == {"x"}
    plain = build_rl_dataset(collabllm_fixture_rows(1))
    assert plain[0]["extra_info"]["interaction_kwargs"]["task_desc"] == "general ask-for-assistance task"


def test_rl_dedup_keeps_same_prompt_with_another_goal():
    r0 = collabllm_fixture_rows(1)[0]
    other_goal = {**r0, "conv_id": 7, "single_turn_prompt": "HIDDEN-GOAL-7: another task"}
    rows = [r0, _reply(r0, "x", 0.5), other_goal]
    ds = build_rl_dataset(rows)
    assert list(ds["index"]) == [0, 2]
    assert len(build_rl_dataset(rows, dedup=False)) == 3


# ---------------------------------------------------------------------------------------------
# SFT
# ---------------------------------------------------------------------------------------------
def test_sft_latest_then_score_with_first_row_winning_ties():
    ds = build_sft_dataset(_scored_rows())
    assert tuple(ds.column_names) == SFT_COLUMNS
    by_conv = {r["conv_id"]: r for r in ds}
    assert by_conv[0]["messages"][-1] == {"role": "assistant", "content": "BEST-0"}
    assert by_conv[0]["score"] == 0.9
    # conv 1: the latest turn (3) wins over the higher-scored turn 1; of the two 0.5 replies,
    # the first in input order.
    assert by_conv[1]["messages"][-1]["content"] == "TIE-FIRST-1"
    assert (by_conv[1]["turn_id"], by_conv[1]["score"]) == (3, 0.5)
    assert by_conv[1]["messages"][:-1] == collabllm_fixture_rows(2)[1]["prompt"]


def test_sft_select_score():
    by_conv = {r["conv_id"]: r for r in build_sft_dataset(_scored_rows(), select="score")}
    assert by_conv[1]["messages"][-1]["content"] == "EARLY-1"
    assert (by_conv[1]["turn_id"], by_conv[1]["score"]) == (1, 0.95)


def test_sft_trainable_marks_and_no_secret_in_any_message():
    ds = build_sft_dataset(_scored_rows(), system_prompt=SYSTEM)
    for r in ds:
        msgs, marks = r["messages"], r["trainable"]
        assert len(msgs) == len(marks) and msgs[0] == {"role": "system", "content": SYSTEM}
        assert marks == [m["role"] == "assistant" for m in msgs]
        assert _secret_free(msgs)  # neither the context turns nor the targets hold the goal
    last_only = build_sft_dataset(_scored_rows(), train_on="completion")
    for r in last_only:
        assert r["trainable"] == [False] * (len(r["messages"]) - 1) + [True]


def test_sft_min_score_keeps_equality_and_drops_below():
    assert sorted(list(build_sft_dataset(_scored_rows(), min_score=0.5)["conv_id"])) == [0, 1]
    # conv 1's selected row scores 0.5: dropped, not replaced by its 0.95 row of turn 1.
    assert list(build_sft_dataset(_scored_rows(), min_score=0.51)["conv_id"]) == [0]


# ---------------------------------------------------------------------------------------------
# DPO
# ---------------------------------------------------------------------------------------------
def test_dpo_best_worst_pairs_and_columns():
    ds = build_dpo_dataset(_scored_rows())
    assert tuple(ds.column_names) == DPO_COLUMNS
    pairs = {(r["conv_id"], r["turn_id"]): r for r in ds}
    assert set(pairs) == {(0, 1), (1, 3)}  # conv 1 turn 1 has one reply: no pair
    p0 = pairs[(0, 1)]
    assert p0["chosen"] == [{"role": "assistant", "content": "BEST-0"}]
    assert p0["rejected"][0]["content"].startswith("RECORDED-COMPLETION-0")
    assert (p0["score_chosen"], p0["score_rejected"]) == (0.9, 0.0)
    assert pairs[(1, 3)]["chosen"][0]["content"] == "TIE-FIRST-1"
    for r in ds:
        assert _secret_free([r["prompt"], r["chosen"], r["rejected"]])
        assert r["prompt"][-1]["role"] == "user"


@pytest.mark.parametrize(("scores", "min_gap", "kept"), [
    ((0.75, 0.25), 0.5, True),          # gap == min_gap: kept
    ((0.75, 0.25), 0.5 + 1e-6, False),  # just above: dropped
    ((0.3, 0.1), 0.2, True),            # 0.3 - 0.1 is 0.19999999999999998 in floats: still equal
    ((0.5, 0.5), 0.0, False),           # equal scores never make a pair
    ((0.6, 0.2), 0.0, True),
])
@pytest.mark.parametrize("pairing", ["best_worst", "all"])
def test_dpo_min_gap_boundary(scores, min_gap, kept, pairing):
    r0 = collabllm_fixture_rows(1)[0]
    for ordered in (scores, scores[::-1]):
        rows = [_reply(r0, "A", ordered[0]), _reply(r0, "B", ordered[1])]
        assert len(build_dpo_dataset(rows, min_gap=min_gap, pairing=pairing)) == int(kept)


def test_dpo_never_pairs_different_conversations_or_prefixes():
    r0 = collabllm_fixture_rows(1)[0]
    other_conv = _reply(r0, "B", 0.0, conv_id=99)
    other_prefix = _reply(r0, "C", 0.0, prompt=r0["prompt"] + [
        {"role": "assistant", "content": "?"}, {"role": "user", "content": "more"}])
    assert len(build_dpo_dataset([_reply(r0, "A", 1.0), other_conv, other_prefix])) == 0
    same_text = [_reply(r0, "A", 1.0), _reply(r0, "A", 0.0)]
    assert len(build_dpo_dataset(same_text)) == 0


def test_dpo_all_pairs_and_text_format():
    r0 = collabllm_fixture_rows(1)[0]
    rows = [_reply(r0, "A", 0.9), _reply(r0, "B", 0.5), _reply(r0, "C", 0.1)]
    ds = build_dpo_dataset(rows, pairing="all", min_gap=0.4, response_format="text")
    assert [(r["chosen"], r["rejected"]) for r in ds] == [("A", "B"), ("A", "C"), ("B", "C")]
    assert len(build_dpo_dataset(rows, pairing="all", min_gap=0.5)) == 1


def test_dpo_system_prompt():
    ds = build_dpo_dataset(_scored_rows(), system_prompt=SYSTEM)
    assert all(r["prompt"][0] == {"role": "system", "content": SYSTEM} for r in ds)


# ---------------------------------------------------------------------------------------------
# Splits, files, CLI
# ---------------------------------------------------------------------------------------------
def test_split_is_deterministic_and_partitions():
    ds = datasets.Dataset.from_dict({"x": list(range(40))})
    a = train_validation_split(ds, 0.1, seed=3)
    b = train_validation_split(ds, 0.1, seed=3)
    c = train_validation_split(ds, 0.1, seed=4)
    assert a["train"].to_dict() == b["train"].to_dict() and a["validation"].to_dict() == b["validation"].to_dict()
    assert list(a["validation"]["x"]) != list(c["validation"]["x"])
    assert len(a["validation"]) == 4 and sorted(list(a["train"]["x"]) + list(a["validation"]["x"])) == list(range(40))
    assert len(train_validation_split(ds, 0.11)["validation"]) == 5  # fractions round up
    assert len(train_validation_split(ds, 7)["validation"]) == 7
    with pytest.raises(ConfigError, match="leaves none"):
        train_validation_split(ds, 40)
    with pytest.raises(ConfigError):
        train_validation_split(ds, -0.5)


def test_process_writes_parquet_that_reloads(tmp_path):
    path = write_collabllm_fixture(tmp_path, "struct", "parquet", n=10)
    out = tmp_path / "out"
    splits = process_collabllm_dataset("collabllm/collabllm-multiturn-medium", "rl", data_files=str(path),
                                       output_dir=out, validation_size=0.2, seed=1)
    again = process_collabllm_dataset("collabllm/collabllm-multiturn-medium", "rl", data_files=[str(path)],
                                      validation_size=0.2, seed=1)
    assert list(splits["validation"]["index"]) == list(again["validation"]["index"])
    loaded = datasets.load_dataset("parquet", data_files={
        "train": str(out / "rl_train.parquet"), "validation": str(out / "rl_validation.parquet")})
    assert len(loaded["train"]) == 8 and len(loaded["validation"]) == 2
    assert loaded["train"].to_list() == splits["train"].to_list()
    assert loaded["train"][0]["extra_info"]["interaction_kwargs"]["task_desc"].startswith("writing")


@pytest.mark.parametrize("mode,rules", [("rl", "recipe"), ("sft", "recipe"), ("rl", "collab_env"),
                                        ("sft", "collab_env"), ("dpo", None)])
def test_cli_writes_files_for_every_mode(tmp_path, mode, rules, capsys):
    src = tmp_path / "rows.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in _scored_rows() * 1), encoding="utf-8")
    out = tmp_path / "out"
    argv = ["--data_files", str(src), "--mode", mode, "--output_dir", str(out), "--validation_size", "1"]
    if mode == "dpo":
        argv += ["--min_gap", "0.1"]
    if rules == "collab_env":
        argv += ["--rules", rules]
    assert main(argv) == 0  # without --rules: the recipe's for rl and sft (dpo has only ours)
    assert f"{mode}_train.parquet" in capsys.readouterr().out
    columns = {("rl", "recipe"): RECIPE_RL_COLUMNS, ("sft", "recipe"): RECIPE_SFT_COLUMNS,
               ("rl", "collab_env"): RL_COLUMNS, ("sft", "collab_env"): SFT_COLUMNS, ("dpo", None): DPO_COLUMNS}
    train = datasets.load_dataset("parquet", data_files=str(out / f"{mode}_train.parquet"))["train"]
    val = datasets.load_dataset("parquet", data_files=str(out / f"{mode}_validation.parquet"))["train"]
    assert tuple(train.column_names) == columns[mode, rules] and len(val) == 1
    trained_on = {"rl": "prompt", "sft": "prompt" if rules == "recipe" else "messages", "dpo": "prompt"}[mode]
    assert _secret_free(list(train[trained_on]) + list(val[trained_on]))


def test_cli_errors_return_nonzero_with_message(tmp_path, capsys):
    path = write_collabllm_fixture(tmp_path, "list", "jsonl", n=4, drop=("single_turn_prompt",))
    assert main(["--data_files", str(path), "--output_dir", str(tmp_path / "o")]) == 1
    assert "single_turn_prompt" in capsys.readouterr().err
    good = write_collabllm_fixture(tmp_path / "good.jsonl", "list", "jsonl", n=4)
    assert main(["--data_files", str(good), "--mode", "rl", "--min_gap", "0.1",
                 "--output_dir", str(tmp_path / "o")]) == 1
    assert "min_gap" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_module_runs_as_script(tmp_path):
    path = write_collabllm_fixture(tmp_path, "list", "jsonl", n=4)
    proc = subprocess.run(
        [sys.executable, "-m", "collab_env.tasks.collabllm_data", "--data_files", str(path),
         "--mode", "sft", "--output_dir", str(tmp_path / "o")],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"},
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "o" / "sft_train.parquet").exists()


# ---------------------------------------------------------------------------------------------
# Malformed input
# ---------------------------------------------------------------------------------------------
def test_missing_columns_are_named():
    rows = collabllm_fixture_rows(2)
    del rows[1]["single_turn_prompt"]
    with pytest.raises(DataSchemaError, match=r"row 1 lacks column\(s\) \['single_turn_prompt'\]"):
        build_rl_dataset(rows)
    ds = datasets.Dataset.from_list([{k: v for k, v in r.items() if k != "score"}
                                     for r in collabllm_fixture_rows(2)])
    with pytest.raises(DataSchemaError, match=r"needs column\(s\) \['score'\]"):
        build_sft_dataset(ds)
    rl = build_rl_dataset(ds)  # RL does not need scores
    assert len(rl) == 2


@pytest.mark.parametrize(("change", "match"), [
    ({"prompt": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}, "end with a user turn"),
    ({"prompt": "just text"}, "list of"),
    ({"prompt": [{"role": "robot", "content": "q"}]}, "roles must be"),
    ({"score": None}, "score must be a number"),
    ({"score": float("nan")}, "score is nan"),
    ({"conv_id": None}, "conv_id is missing"),
    ({"completion": None}, "completion must be text"),
    ({"turn_id": "three"}, "turn_id must be an int"),
])
def test_malformed_rows(change, match):
    rows = collabllm_fixture_rows(2)
    rows[1].update(change)
    for build in (build_sft_dataset, build_dpo_dataset):
        with pytest.raises(DataSchemaError, match=match):
            build(rows)


def test_bad_arguments():
    rows = collabllm_fixture_rows(2)
    with pytest.raises(ConfigError, match="mode must be one of"):
        process_collabllm_dataset(rows, "ppo")
    with pytest.raises(ConfigError, match="Did you mean 'min_gap'"):
        process_collabllm_dataset(rows, "dpo", min_gapp=0.1)
    with pytest.raises(ConfigError, match="takes no option 'min_gap'"):
        process_collabllm_dataset(rows, "sft", min_gap=0.1)
    with pytest.raises(ConfigError, match="min_gap must be"):
        build_dpo_dataset(rows, min_gap=-0.1)
    with pytest.raises(ConfigError, match="select must be one of"):
        build_sft_dataset(rows, select="best")
    with pytest.raises(ConfigError, match="takes rows"):
        build_rl_dataset("rows.parquet")
    with pytest.raises(ConfigError, match="one split"):
        build_rl_dataset(datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}))
    with pytest.raises(ConfigError, match="not both"):
        process_collabllm_dataset(rows, "rl", data_files="x.jsonl")


def test_empty_result_is_an_error_in_process_but_not_in_builders():
    rows = collabllm_fixture_rows(2)  # one reply per prefix: no DPO pair
    empty = build_dpo_dataset(rows)
    assert len(empty) == 0 and tuple(empty.column_names) == DPO_COLUMNS
    with pytest.raises(DataSchemaError, match="lower min_gap"):
        process_collabllm_dataset(rows, "dpo")


def test_import_does_not_load_datasets():
    code = "import sys, collab_env.tasks.collabllm_data; sys.exit('datasets' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0

"""Nesting limits before any reader sees a row (issue 43, "bad input"): a deep row in a data file,
a result file, an ``--env-arg`` or ``--sampling`` value, or a row passed to
``reset(options={"item": ...})`` is one clear error naming the file (or argument), the row and
the limit, never a ``RecursionError`` or a crash inside a JSON reader. One check does it
everywhere: :func:`collab_env._json.check_depth`."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from collab_env.cli import main
from collab_env.errors import ConfigError, DataSchemaError

DEEP = 5000
MAX_DEPTH = 64  # collab_env._json.MAX_DEPTH (checked in the first test)


def deep_list(levels: int) -> str:
    return "[" * levels + "]" * levels


def rows_with_a_deep_one(levels: int) -> list[str]:
    """Two CollabLLM fixture rows as JSON lines; the second carries an extra field ``levels`` deep."""
    from collab_env.testing.collabllm_fixtures import collabllm_fixture_rows

    lines = [json.dumps(r) for r in collabllm_fixture_rows(2)]
    lines[1] = lines[1][:-1] + ', "extra": ' + deep_list(levels) + "}"
    return lines


# --- the one check ----------------------------------------------------------------------------
def test_the_check_counts_brackets_outside_strings_and_names_the_line():
    from collab_env import _json
    from collab_env._json import check_depth, depth_problem, loads

    assert _json.MAX_DEPTH == MAX_DEPTH
    assert depth_problem('{"a": [[[]]]}', limit=4) is None
    assert "4 deep, over the limit of 3" in depth_problem('{"a": [[[]]]}', limit=3)
    assert depth_problem('{"a": "[[[[[[[[ \\" [[[["}', limit=1) is None  # brackets in a string
    text = '{"a": 1}\n' + deep_list(100) + "\n"
    assert depth_problem(text, lines=True).startswith("line 2: lists and objects nested 100 deep")
    # a line that closes more than it opens does not hide the next line's depth
    assert depth_problem("]]]]]]]\n" + deep_list(70), lines=True).startswith("line 2:")
    assert depth_problem(deep_list(MAX_DEPTH)) is None and depth_problem(deep_list(MAX_DEPTH + 1))
    # a Python value: walked without recursion; one that holds itself is too deep
    loop: list = []
    loop.append(loop)
    assert "more than 64 deep" in depth_problem(loop)
    assert depth_problem({"x": [{"y": (1, 2)}]}) is None
    with pytest.raises(ConfigError, match=r"^a value, lists and objects nested 200000 deep, over the limit of 64"):
        check_depth(deep_list(200_000), "a value")
    with pytest.raises(ConfigError, match="doc is not JSON"):
        loads("{oops", "doc")


# --- data files -------------------------------------------------------------------------------
@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".jsonl.gz"])
def test_a_5k_deep_data_row_is_one_error_naming_the_file_row_and_limit(tmp_path, suffix):
    """Before: a bare RecursionError from inside ``datasets``' features code."""
    import collab_env

    path = tmp_path / f"rows{suffix}"
    text = "\n".join(rows_with_a_deep_one(DEEP)) + "\n"
    path.write_bytes(gzip.compress(text.encode()) if suffix.endswith(".gz") else text.encode())
    with pytest.raises(DataSchemaError) as err:
        collab_env.make("collabllm-math-hard", data_files=str(path))
    msg = str(err.value)
    assert str(path) in msg and "line 2" in msg and f"over the limit of {MAX_DEPTH}" in msg and "\n" not in msg


def test_a_deep_parquet_column_is_refused_from_its_schema(tmp_path):
    """A parquet file nests only as deep as its schema: the footer is read, not a row."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    import collab_env
    from collab_env.testing.collabllm_fixtures import collabllm_fixture_rows

    def write(t: pa.DataType) -> Path:
        table = pa.Table.from_pylist(collabllm_fixture_rows(2))
        table = table.append_column("extra", pa.array([None, None], type=t))
        pq.write_table(table, tmp_path / "rows.parquet")
        return tmp_path / "rows.parquet"

    t: pa.DataType = pa.int64()
    for _ in range(80):  # a struct is one parquet schema level: 80 fit under pyarrow's own 100
        t = pa.struct([("a", t)])
    with pytest.raises(DataSchemaError, match=r"rows.parquet, column 'extra' nests lists and structs 80 deep, over "
                                              r"the limit of 63"):
        collab_env.make("collabllm-math-hard", data_files=str(write(t)))
    for _ in range(40):  # lists take 3 levels each: pyarrow refuses the footer itself, said in one line
        t = pa.list_(t)
    with pytest.raises(DataSchemaError, match=r"rows.parquet is not a readable parquet file \(OSError: Parquet "
                                              r"schema too deeply nested"):
        collab_env.make("collabllm-math-hard", data_files=str(write(t)))


def test_a_100k_deep_jsonl_row_no_longer_crashes_the_process(tmp_path):
    """Before: the process died with SIGSEGV inside the JSON reader (exit -11). Now the command
    exits 2 with one line naming the file, the row and the limit."""
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(rows_with_a_deep_one(100_000)) + "\n")
    cli = Path(sys.executable).with_name("collab-env")
    res = subprocess.run([str(cli), "eval", "collabllm-math-hard", "--data-files", str(path), "--episodes", "1",
                          "--out", str(tmp_path / "out.jsonl")], capture_output=True, text=True, timeout=300)
    assert res.returncode == 2, (res.returncode, res.stderr[-2000:])
    errors = [x for x in res.stderr.splitlines() if x.startswith("collab-env: error:")]
    assert len(errors) == 1 and str(path) in errors[0] and "line 2" in errors[0] and "limit of 64" in errors[0]
    assert "Traceback" not in res.stderr


# --- result files -----------------------------------------------------------------------------
def test_a_deep_line_in_a_result_file_is_refused_by_line(tmp_path):
    from collab_env.eval import load_results

    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps({"episode_id": 0, "status": "ok", "run": {}}) + "\n"
                    + '{"episode_id": 1, "x": ' + deep_list(DEEP) + "}\n")
    with pytest.raises(ConfigError, match=r"results.jsonl, line 2 is not a result record \(lists and objects nested "
                                          r"5001 deep, over the limit of 64\)"):
        load_results(path)


def test_an_episode_line_too_deep_is_a_config_error():
    from collab_env.types import Episode

    with pytest.raises(ConfigError, match="over the limit of 64"):
        Episode.from_json('{"messages": ' + deep_list(DEEP) + "}")


# --- command-line values and reset options ---------------------------------------------------
@pytest.mark.parametrize("flag", ["--env-arg", "--sampling"])
def test_a_deep_command_line_value_is_one_line(flag, capsys):
    """Before: a raw RecursionError traceback from ``json.loads``."""
    key = "max_steps" if flag == "--env-arg" else "assistant.temperature"
    status = main(["eval", "hidden-facts-easy-v2", flag, f"{key}={deep_list(DEEP)}", "--episodes", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1
    assert err[0].startswith(f"collab-env: error: {flag} {key} value") and "over the limit of 64" in err[0]


def test_a_deep_row_given_to_reset_is_a_config_error(tmp_path):
    """Before: RecursionError from the task's row checks."""
    import collab_env
    from collab_env.testing.collabllm_fixtures import collabllm_fixture_rows, write_collabllm_fixture

    env = collab_env.make("collabllm-math-hard", data_files=str(write_collabllm_fixture(tmp_path / "ok.jsonl")))
    row = dict(collabllm_fixture_rows(1)[0])
    deep: list = []
    for _ in range(DEEP):
        deep = [deep]
    row["extra"] = deep
    with pytest.raises(ConfigError, match=r"reset\(options=\{'item': row\}\): the row, lists and mappings nested more "
                                          r"than 64 deep"):
        env.reset(options={"item": row})
    env.reset(options={"item": collabllm_fixture_rows(1)[0]})  # a normal row still plays

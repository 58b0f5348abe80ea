"""Bad input gets one clear error, and nothing is lost (issue 27).

Each test feeds a hostile input (a data file that is not UTF-8, a make keyword of the wrong type,
a sampling flag that is not a sampling parameter, a file that is not a result file given to
--resume, a resumed run that drops a cut line) and checks: the exception type or exit status, a
message naming the path or argument and saying what to do, no traceback or raw asyncio line,
and, for files, that a refused file is byte for byte as it was.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import collab_env
from collab_env.cli import main
from collab_env.errors import ConfigError, DataSchemaError
from collab_env.eval import evaluate
from collab_env.policy import SamplingParams
from collab_env.registry import list_envs, spec
from collab_env.tasks.collabllm_load import check_utf8
from collab_env.testing.collabllm_fixtures import write_collabllm_fixture
from collab_env.testing.versions import building

REPO = Path(__file__).resolve().parents[1]
HF = "hidden-facts"
ASK = ["--policy", "assistant=ask-then-answer"]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def cli(argv: list[str], capsys) -> tuple[int, str, str]:
    """``main(argv)`` in-process: (status, stdout, stderr)."""
    out = io.StringIO()
    rc = main(argv, stdin=io.StringIO(""), stdout=out)
    return rc, out.getvalue(), capsys.readouterr().err


def one_error_line(err: str) -> str:
    """The one line a refused command writes to stderr (no traceback, no asyncio line)."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("collab-env: error: ") and "Traceback" not in err and "asyncio" not in err
    return lines[0]


def subprocess_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "COLLAB_TEST_DELAY"}
    env["PYTHONPATH"] = str(REPO)
    for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        env[k] = "1"
    return env


# ---------------------------------------------------------------------------------------------
# 1. A CollabLLM data file that is not UTF-8
# ---------------------------------------------------------------------------------------------
@pytest.fixture()
def latin1_file(tmp_path):
    """A fixture file in the schema with one Latin-1 byte (0xe9, 'é') in a message of its last
    row; returns (path, offset of that byte, its line)."""
    def write(fmt: str) -> tuple[Path, int, int]:
        good = write_collabllm_fixture(tmp_path / f"good.{fmt}", "list", fmt, n=3)
        data = good.read_bytes()
        key = b'"content": "'
        at = data.rindex(key) + len(key)
        bad = tmp_path / f"bad.{fmt}"
        bad.write_bytes(data[:at] + b"caf\xe9 " + data[at:])
        return bad, at + 3, data[:at].count(b"\n") + 1
    return write


@pytest.mark.parametrize("fmt", ["jsonl", "json"])
def test_make_refuses_a_data_file_that_is_not_utf8_naming_file_offset_and_fix(latin1_file, fmt):
    bad, offset, line = latin1_file(fmt)
    before = sha256(bad)
    with pytest.raises(DataSchemaError) as info:
        collab_env.make("collabllm-math-hard", data_files=str(bad))
    msg = str(info.value)
    assert str(bad) in msg and f"offset {offset} (line {line})" in msg and "0xe9" in msg
    assert "not UTF-8" in msg and "Re-encode the file as UTF-8" in msg
    assert sha256(bad) == before


def test_data_command_refuses_a_file_that_is_not_utf8_in_one_line(latin1_file, tmp_path, capsys):
    bad, offset, _ = latin1_file("jsonl")
    before = sha256(bad)
    rc, _, err = cli(["data", "--data_files", str(bad), "--output_dir", str(tmp_path / "out")], capsys)
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert rc == 1 and len(lines) == 1 and "Traceback" not in err
    assert str(bad) in lines[0] and f"offset {offset}" in lines[0] and "Re-encode" in lines[0]
    assert sha256(bad) == before and not list((tmp_path / "out").glob("*.parquet"))


def test_utf8_check_counts_offsets_across_chunks_and_split_characters(tmp_path):
    # 'é' (2 bytes) straddles the 1 MiB read boundary; the bad byte comes later, on line 3.
    head = b"a" * ((1 << 20) - 1) + "é".encode() + b"\nok\n"
    path = tmp_path / "big.jsonl"
    path.write_bytes(head + b"xx\x80yy\n")
    with pytest.raises(DataSchemaError, match=rf"byte 0x80 at offset {len(head) + 2} \(line 3\)"):
        check_utf8(str(path))
    path.write_bytes(head)  # valid UTF-8 across the boundary: accepted
    check_utf8(str(path))
    cut = tmp_path / "cut.jsonl"  # a character cut off by the end of the file
    cut.write_bytes(b'{"a": "\xc3')
    with pytest.raises(DataSchemaError, match=r"byte 0xc3 at offset 7 \(line 1\)"):
        check_utf8(str(cut))


def test_utf8_check_reads_gzip_files_decompressed(tmp_path):
    path = tmp_path / "rows.jsonl.gz"
    path.write_bytes(gzip.compress(b'{"a": 1}\n{"b": "\xff"}\n'))
    with pytest.raises(DataSchemaError, match=r"rows\.jsonl\.gz is not UTF-8 text: byte 0xff at offset 16 \(line 2\)"):
        check_utf8(str(path))


def test_empty_data_file_non_json_line_and_folder_are_named(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    with pytest.raises(DataSchemaError, match=r"empty\.jsonl is empty: it holds no rows"):
        collab_env.make("collabllm-math-hard", data_files=str(empty))
    good = write_collabllm_fixture(tmp_path / "rows.jsonl", "list", "jsonl", n=2)
    broken = tmp_path / "broken.jsonl"
    broken.write_bytes(good.read_bytes() + b"not json {\n")
    with pytest.raises(DataSchemaError, match=r"broken\.jsonl, line 3 is not JSON .*Fix or remove that line"):
        collab_env.make("collabllm-math-hard", data_files=str(broken))
    folder = tmp_path / "folder.jsonl"
    folder.mkdir()
    with pytest.raises(ConfigError, match=r"folder\.jsonl is a folder; pass the files inside it"):
        collab_env.make("collabllm-math-hard", data_files=str(folder))


# ---------------------------------------------------------------------------------------------
# 2. make keywords of the wrong type
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("env_id, kwargs, expected", [
    (HF, {"num_objects": "2"}, r"num_objects must be an int, got str '2'\. Pass num_objects=2 \(unquoted\)"),
    (HF, {"num_objects": 2.5}, r"num_objects must be an int, got float 2\.5\. For example num_objects=2"),
    (HF, {"num_objects": True}, r"num_objects must be an int, got bool True"),
    (HF, {"max_steps": "x"}, r"max_steps must be an int or None, got str 'x'"),
    (HF, {"max_message_chars": "10"}, r"max_message_chars must be an int, got str '10'\. Pass max_message_chars=10"),
    (HF, {"cost_per_turn": "0.1"}, r"cost_per_turn must be a number, got str '0\.1'\. Pass cost_per_turn=0\.1"),
    (HF, {"vague_objects": "yes"}, r"vague_objects must be True or False, got str 'yes'"),
    (HF, {"scenarios": "shopping"}, r"scenarios must be a list of str, got str 'shopping'"),
    (HF, {"scenarios": ["shopping", 3]}, r"scenarios must be a list of str, got list \['shopping', 3\]"),
    ("length-ratio", {"num_turns": "3"}, r"length-ratio: num_turns must be an int, got str '3'"),
    ("math-chat", {"max_user_turns": "2"}, r"max_user_turns must be an int or None, got str '2'"),
])
def test_make_keyword_of_the_wrong_type_is_a_config_error_naming_it(env_id, kwargs, expected):
    with pytest.raises(ConfigError, match=expected):
        collab_env.make(env_id, **kwargs)


@pytest.mark.parametrize("env_id", [i for i in list_envs() if not spec(i).needs_data])
def test_every_env_refuses_a_budget_of_the_wrong_type(env_id):
    """The check is generic: every registered env (the base class) names the keyword."""
    with building(env_id), pytest.raises(ConfigError, match=r"max_steps must be an int or None, got str 'x'"):
        collab_env.make(env_id, max_steps="x")


def test_valid_keywords_of_nearby_types_still_work():
    env = collab_env.make(HF, num_objects=np.int64(2), scenarios=["shopping"], cost_per_turn=0,
                          max_steps=None, vagueness=np.float64(0.5))
    obs, _ = env.reset(seed=0)
    assert obs and env.unwrapped.task.config.scenarios == ("shopping",)
    assert SamplingParams.from_kwargs(temperature=0, seed=np.int64(3), stop="END").stop == ("END",)


def test_cli_env_arg_of_the_wrong_type_is_a_usage_error(tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    rc, _, err = cli(["eval", HF, *ASK, "--episodes", "1", "--no-progress", "--out", str(out),
                      "--env-arg", 'num_objects="2"'], capsys)
    line = one_error_line(err)
    assert rc == 2 and "num_objects must be an int, got str '2'" in line and "Pass num_objects=2" in line


def test_budget_and_index_out_of_range_say_the_valid_range():
    with pytest.raises(ConfigError, match=r"max_total_chars must be >= 1 or None \(no limit\), got -1"):
        collab_env.make(HF, max_total_chars=-1)
    env = collab_env.make(HF)
    with pytest.raises(ConfigError, match=r"options\['index'\]=-5 is out of range: the task has indices 0 and up"):
        env.reset(seed=0, options={"index": -5})


# ---------------------------------------------------------------------------------------------
# 3. --sampling values that are not sampling parameters
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("flag, expected", [
    ("assistant.temperature=banana", "temperature must be a number, got str 'banana'"),
    ("assistant.temperature=NaN", "temperature must be a finite number >= 0, got nan"),
    ("assistant.top_p=2", "top_p must be in (0, 1], got 2"),
    ("assistant.top_k=2.5", "top_k must be an int or None, got float 2.5"),
    ("assistant.temprature=0.5", "'temprature' is not a sampling parameter. Did you mean 'temperature'?"),
])
def test_eval_refuses_a_bad_sampling_flag_before_any_work(tmp_path, capsys, flag, expected):
    out = tmp_path / "r.jsonl"
    rc, stdout, err = cli(["eval", HF, *ASK, "--episodes", "2", "--no-progress", "--out", str(out),
                           "--sampling", flag], capsys)
    line = one_error_line(err)
    assert rc == 2 and f"--sampling {flag}: " in line and expected in line
    assert not out.exists() and stdout == ""  # refused before the result file or any episode


def test_leaderboard_run_refuses_a_bad_sampling_flag_before_any_work(tmp_path, capsys):
    folder = tmp_path / "entry"
    rc, _, err = cli(["leaderboard", "run", HF, *ASK, "--out", str(folder), "--episodes", "1",
                      "--no-progress", "--sampling", "assistant.temperature=banana"], capsys)
    line = one_error_line(err)
    assert rc == 2 and "--sampling assistant.temperature=banana: temperature must be a number" in line
    assert not folder.exists()


def test_a_valid_sampling_flag_still_runs(tmp_path, capsys):
    rc, stdout, err = cli(["eval", HF, *ASK, "--episodes", "1", "--no-progress",
                           "--sampling", "assistant.temperature=0", "--sampling", "assistant.stop=END"], capsys)
    assert rc == 0 and "1/1" in stdout, err


# ---------------------------------------------------------------------------------------------
# 4. --resume on a file that is not a result file: refused, not a byte changed
# ---------------------------------------------------------------------------------------------
FOREIGN = {
    "text": b"my notes\nmore notes\n",
    "text-without-newline": b"my notes",  # used to be cut to nothing, then refused
    "json-object": b'{"a": 1}\n',
    "json-without-newline": b"[1, 2, 3]",
    "binary": b"\xff\xfe\x00{\x00\"\x00",
    "records-then-junk": None,  # a real result file with a line of text appended
}


@pytest.mark.parametrize("kind", list(FOREIGN))
def test_resume_refuses_a_file_that_is_not_a_result_file_without_changing_it(tmp_path, capsys, kind):
    path = tmp_path / "results.jsonl"
    if FOREIGN[kind] is None:
        evaluate(HF, {"assistant": "ask-then-answer"}, num_episodes=2, out=path, progress=False)
        path.write_bytes(path.read_bytes() + b"a line I added by hand")
    else:
        path.write_bytes(FOREIGN[kind])
    before = sha256(path)
    rc, stdout, err = cli(["eval", HF, *ASK, "--episodes", "3", "--no-progress", "--out", str(path), "--resume"],
                          capsys)
    line = one_error_line(err)
    assert rc == 2 and str(path) in line and "Use another --out path" in line
    assert "left as it was" in line
    assert sha256(path) == before and stdout == ""
    assert not (tmp_path / "results.jsonl.failures.jsonl").exists()
    with pytest.raises(ConfigError, match="left as it was"):  # the API refuses the same way
        evaluate(HF, {"assistant": "ask-then-answer"}, num_episodes=3, out=path, resume=True, progress=False)
    assert sha256(path) == before


def test_resume_refuses_a_failures_sidecar_that_is_not_one(tmp_path, capsys):
    path = tmp_path / "results.jsonl"
    evaluate(HF, {"assistant": "ask-then-answer"}, num_episodes=2, out=path, progress=False)
    sidecar = tmp_path / "results.jsonl.failures.jsonl"
    sidecar.write_bytes(b"notes of mine")
    before = (sha256(path), sha256(sidecar))
    rc, _, err = cli(["eval", HF, *ASK, "--episodes", "3", "--no-progress", "--out", str(path), "--resume"], capsys)
    assert rc == 2 and str(sidecar) in one_error_line(err)
    assert (sha256(path), sha256(sidecar)) == before


def test_leaderboard_run_refuses_a_foreign_trajectories_file_and_keeps_the_folder(tmp_path, capsys):
    folder = tmp_path / "entry"
    rc, _, err = cli(["leaderboard", "run", HF, *ASK, "--out", str(folder), "--episodes", "2", "--no-progress"], capsys)
    assert rc == 0, err
    traj = folder / "trajectories.jsonl"
    traj.write_bytes(b"my notes")
    before = {p.name: sha256(p) for p in folder.iterdir()}
    assert "submission.json" in before
    rc, _, err = cli(["leaderboard", "run", HF, *ASK, "--out", str(folder), "--episodes", "2", "--no-progress"], capsys)
    assert rc == 2 and str(traj) in one_error_line(err)
    assert {p.name: sha256(p) for p in folder.iterdir()} == before


# ---------------------------------------------------------------------------------------------
# 5. Resuming a cut file: one clean warning line, no asyncio line, no hang
# ---------------------------------------------------------------------------------------------
def test_resume_of_a_cut_file_prints_one_clean_warning_line(tmp_path):
    out = tmp_path / "r.jsonl"
    cmd = [sys.executable, "-m", "collab_env.cli", "eval", HF, *ASK, "--episodes", "3", "--no-progress",
           "--out", str(out)]
    first = subprocess.run(cmd, cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    data = out.read_bytes()
    out.write_bytes(data[: len(data) - 40])  # the last record cut short, as by a kill
    res = subprocess.run(cmd + ["--resume"], cwd=REPO, env=subprocess_env(), capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith(f"collab-env: warning: {out}: dropped an incomplete last line")
    assert "asyncio" not in res.stderr and "Task exception" not in res.stderr and "Traceback" not in res.stderr
    assert sorted(json.loads(x)["episode_id"] for x in out.read_bytes().splitlines()) == [0, 1, 2]


def test_cli_restores_the_warning_display_after_it_returns(capsys):
    import warnings

    before = warnings.showwarning
    cli(["list"], capsys)
    assert warnings.showwarning is before


def test_sampling_params_coerce_is_the_one_object_or_mapping_conversion():
    params = SamplingParams(temperature=0.5)
    assert SamplingParams.coerce(params) is params
    assert SamplingParams.coerce({"temperature": 0.5}) == params
    with pytest.raises(ConfigError, match="unknown sampling parameter"):
        SamplingParams.coerce({"temprature": 0.5})
    with pytest.raises(ConfigError, match="SamplingParams or a mapping"):
        SamplingParams.coerce([("temperature", 0.5)])

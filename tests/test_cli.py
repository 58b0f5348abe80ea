"""The ``collab-env`` command: in-process through ``main(argv)``, and as a real process for the
console script, ``python -m collab_env.cli`` and interrupting an evaluation."""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import collab_env
from collab_env.cli import build_parser, main
from collab_env.registry import spec
from tests._eval_helpers import registered

REPO = Path(__file__).resolve().parents[1]
CHECKS = ("parallel_api", "parallel_seed", "determinism", "clone", "pickle", "robustness",
          "gymnasium_view")


def run(argv, stdin=""):
    """main(argv) with captured stdout; returns (status, stdout)."""
    out = io.StringIO()
    rc = main(argv, stdin=io.StringIO(stdin), stdout=out)
    return rc, out.getvalue()


def subprocess_env(**extra):
    env = {k: v for k, v in os.environ.items() if k != "COLLAB_TEST_DELAY"}
    env["PYTHONPATH"] = str(REPO)
    env.update(extra)
    return env


# ---------------------------------------------------------------------------------------------
# list / info
# ---------------------------------------------------------------------------------------------
def test_list_shows_ids_suites_players_and_descriptions():
    rc, out = run(["list"])
    assert rc == 0
    row = next(line for line in out.splitlines() if line.startswith("hidden-facts-v3 "))
    assert "builtin" in row and "assistant,user" in row and "Built-in collaboration" in row
    assert "collabllm-math-hard-v1" in out

    rc, out = run(["list", "--suite", "builtin"])
    assert rc == 0 and "hidden-facts-hard-v3" in out and "collabllm" not in out


def test_list_hides_superseded_versions_unless_all():
    rc, out = run(["list"])
    ids = [line.split()[0] for line in out.splitlines()[1:] if line and not line.startswith("(")]
    assert rc == 0 and "hidden-facts-v0" not in ids and "hidden-facts-v1" not in ids and "math-chat-v0" not in ids
    assert len(ids) == len({spec(i).name for i in ids}) == len({spec(i).name for i in collab_env.list_envs()})
    hidden = len(collab_env.list_envs()) - len(ids)
    assert out.rstrip().endswith(f"({hidden} superseded versions hidden; --all lists them)")

    rc, out = run(["list", "--all", "--suite", "builtin"])
    row = next(line for line in out.splitlines() if line.startswith("hidden-facts-v0 "))
    assert rc == 0 and "Superseded by hidden-facts-v3." in row and "hidden" not in out.splitlines()[-1]


def test_info_of_a_superseded_id_says_so_and_names_the_latest():
    rc, out = run(["info", "hidden-facts-v0"])
    head = " ".join(out[:out.index("\n\n")].split())
    assert rc == 0 and "SUPERSEDED: hidden-facts-v0 is superseded by hidden-facts-v3." in head
    assert "keyword" in head and "Use 'hidden-facts-v3'" in head
    rc, out = run(["info", "hidden-facts-v3"])
    assert rc == 0 and "SUPERSEDED" not in out


def test_list_unknown_suite_is_an_error(capsys):
    rc, _ = run(["list", "--suite", "bultin"])
    err = capsys.readouterr().err
    assert rc == 2 and "Did you mean 'builtin'" in err


def test_info_text_and_json():
    rc, out = run(["info", "hidden-facts-easy"])
    assert rc == 0
    assert out.splitlines()[0] == "hidden-facts-easy-v3"
    assert "trainable         assistant" in out
    assert "collab_env.tasks.hidden_facts:HiddenFactsUser" in out
    assert "num_objects=1" in out
    card = out[out.index("\ncard\n"):]  # the env card follows the spec
    assert "    mr: [0, 6]" in card and "    ask-then-answer: mean return 1.000" in card
    assert "  licence       Apache-2.0" in card

    rc, out = run(["info", "hidden-facts", "--json"])
    assert rc == 0 and json.loads(out) == spec("hidden-facts").to_dict()


def test_unknown_id_gives_the_registry_suggestion_without_traceback(capsys):
    rc, out = run(["info", "hiden-facts"])
    err = capsys.readouterr().err
    assert rc == 2 and out == ""
    assert "no environment 'hiden-facts'" in err and "Did you mean 'hidden-facts'" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_usage_errors_exit_2(capsys):
    assert run(["info"])[0] == 2
    assert run(["frobnicate"])[0] == 2
    rc, _ = run(["eval", "hidden-facts", "--policy", "assistant", "--episodes", "1"])
    assert rc == 2 and "--policy takes KEY=VALUE" in capsys.readouterr().err
    assert run(["--help"])[0] == 0


def _commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()):
    """Every command and sub-command (``leaderboard run``...) of ``parser``, read from the parser
    itself, so a new command is covered without editing the test."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*prefix, name)
                yield from _commands(sub, (*prefix, name))


COMMANDS = list(_commands(build_parser()))


def test_the_help_loop_sees_every_command():
    assert {c[0] for c in COMMANDS} == {"list", "info", "check", "check-user", "play", "eval", "data", "serve",
                                        "leaderboard", "model-dir"}
    assert {c[1] for c in COMMANDS if len(c) == 2} == {"tracks", "run", "verify", "sign", "build"}


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_command_help_shows_the_collab_env_usage(command, capsys):
    """``collab-env CMD --help`` (``data``'s own parser included) names the command as it is typed."""
    assert run([*command, "--help"])[0] == 0
    usage = capsys.readouterr().out
    assert usage.startswith(f"usage: collab-env {' '.join(command)} "), usage[:200]


def test_data_help_and_import_before_data(capsys):
    """``data`` reads its own arguments, after any ``--import`` (before the command)."""
    assert run(["--import", "json", "data", "--help"])[0] == 0
    assert capsys.readouterr().out.startswith("usage: collab-env data ")
    assert run(["--import=json", "data", "--help"])[0] == 0
    assert capsys.readouterr().out.startswith("usage: collab-env data ")
    rc, _ = run(["--import", "no_such_module_xyz", "data", "--help"])
    assert rc == 2 and "--import no_such_module_xyz" in capsys.readouterr().err
    res = subprocess.run([sys.executable, "-m", "collab_env.cli", "data", "--help"], capture_output=True, text=True,
                         timeout=60, cwd=REPO, env=subprocess_env())
    assert res.returncode == 0 and res.stdout.startswith("usage: collab-env data "), res.stderr


# ---------------------------------------------------------------------------------------------
# check
# ---------------------------------------------------------------------------------------------
def test_check_prints_each_check_and_passes():
    rc, out = run(["check", "hidden-facts", "--cycles", "5"])
    assert rc == 0, out
    for name in CHECKS:
        assert f"PASS  {name}" in out
    assert "all checks passed" in out


def test_check_of_a_broken_env_fails_with_status_1():
    with registered("test-noisy-v0", "tests._eval_helpers:make_noisy_guess_env") as env_id:
        rc, out = run(["check", env_id, "--cycles", "3"])
    assert rc == 1
    assert "FAIL  determinism" in out and "check(s) failed" in out


def test_check_with_a_bad_env_argument_is_a_usage_error(capsys):
    rc, _ = run(["check", "hidden-facts", "--env-arg", "num_objectz=2"])
    assert rc == 2 and "num_objects" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# eval
# ---------------------------------------------------------------------------------------------
def test_eval_writes_one_line_per_episode_and_prints_the_table(tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    argv = ["eval", "hidden-facts", "--policy", "assistant=ask-then-answer", "--episodes", "5",
            "--seed", "7", "--out", str(out), "--env-arg", "max_steps=8", "--no-progress"]
    rc, text = run(argv)
    assert rc == 0, capsys.readouterr().err
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    assert sorted(r["episode_id"] for r in recs) == list(range(5))
    assert {r["seed"] for r in recs} == set(range(7, 12))
    assert recs[0]["run"]["env_kwargs"] == {"max_steps": 8}
    assert "ask-then-answer" in text and "5/5" in text and "100.0%" in text

    rc, _ = run(argv)  # the same command again without --resume
    assert rc == 2 and "--resume" in capsys.readouterr().err
    other_seed = [("8" if a == "7" else a) for a in argv]
    rc, _ = run(other_seed + ["--resume"])
    assert rc == 2 and "different run" in capsys.readouterr().err
    rc, text = run(argv + ["--resume"])
    assert rc == 0 and "5/5" in text


def test_eval_with_failures_exits_1_and_says_to_resume(tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    rc, text = run(["eval", "hidden-facts", "--policy", "assistant=tests._eval_helpers:MustNotRun",
                    "--episodes", "3", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 1
    assert "3 episode(s) failed" in err and "--resume" in err and "must not be called" in err
    assert "0/3" in text


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_interrupted_eval_resumes_without_losing_or_repeating_episodes(tmp_path, sig):
    n = 40
    out = tmp_path / "r.jsonl"
    cmd = [sys.executable, "-m", "collab_env.cli", "eval", "hidden-facts",
           "--policy", "assistant=tests._eval_helpers:SlowAskThenAnswer",
           "--episodes", str(n), "--concurrency", "2", "--out", str(out), "--no-progress"]
    # The child gets Ctrl-C's default handling even when this test runs under a launcher that
    # ignores SIGINT (a background job of a non-interactive shell does): ignored dispositions
    # are inherited, and Python then installs no KeyboardInterrupt handler at all.
    proc = subprocess.Popen(cmd, cwd=REPO, env=subprocess_env(COLLAB_TEST_DELAY="0.1"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if out.exists() and out.read_bytes().count(b"\n") >= 4:
                break
            if proc.poll() is not None:
                pytest.fail(f"eval ended early: {proc.communicate()}")
            time.sleep(0.02)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    if sig == signal.SIGINT:
        assert proc.returncode == 130 and "--resume" in err and "Traceback" not in err
    else:
        assert proc.returncode == -signal.SIGKILL
    before = out.read_bytes()
    complete_before = before[: before.rfind(b"\n") + 1]
    ids_before = [json.loads(x)["episode_id"] for x in complete_before.splitlines()]
    assert 4 <= len(ids_before) < n, "the run must be interrupted midway"

    # Resume with the same policy (at full speed: the delay is not part of the run settings).
    res = subprocess.run(cmd + ["--resume"], cwd=REPO, env=subprocess_env(),
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    after = out.read_bytes()
    assert after.startswith(complete_before)  # nothing written before the kill was rewritten
    ids = [json.loads(x)["episode_id"] for x in after.splitlines()]
    assert len(ids) == n and sorted(ids) == list(range(n))  # none lost, none repeated
    assert f"{n}/{n}" in res.stdout


# ---------------------------------------------------------------------------------------------
# play
# ---------------------------------------------------------------------------------------------
def test_play_a_full_episode_from_piped_stdin():
    rc, out = run(["play", "hidden-facts", "--seed", "0"], stdin="\\boxed{0}\n.\n")
    assert rc == 0, out
    assert "you are 'assistant'" in out
    assert "[user]" in out and "How many grams of sugar" in out  # the user's opening
    assert "=== episode terminated: answered" in out
    assert "reward assistant: 0  (you)" in out


def test_play_multi_line_message_asking_then_answering():
    # Ask for the facts (two lines, one message), then answer with the right total.
    stdin = ("How many batches of brownies and waffles are you making?\n"
             "And how many grams of sugar does each batch need?\n.\n"
             "\\boxed{26}\n.\n")
    rc, out = run(["play", "hidden-facts", "--seed", "0"], stdin=stdin)
    assert rc == 0, out
    assert "I'm making 9 batches of brownies" in out
    assert "reward assistant: 1  (you)" in out


def test_play_quit_and_early_end_of_input(capsys):
    rc, out = run(["play", "hidden-facts", "--seed", "0"], stdin="/quit\n")
    assert rc == 0 and "left the game" in out and "episode" not in out.split("left the game")[1]
    rc, _ = run(["play", "hidden-facts", "--seed", "0"], stdin="")
    assert rc == 1 and "input ended" in capsys.readouterr().err


def test_play_as_the_user_against_a_baseline():
    rc, out = run(["play", "hidden-facts", "--seed", "0", "--player", "user",
                   "--policy", "assistant=answer-at-once"], stdin="thanks [[TERMINATE CHAT]]\n.\n")
    assert rc == 0, out
    assert "you are 'user'" in out and "[assistant]" in out and "\\boxed{" in out
    # The opening the env wrote in the user's name is shown to the person playing the user.
    assert "[user (you, written for you)]" in out
    assert "=== episode" in out


def test_play_rejects_a_policy_for_yourself(capsys):
    rc, _ = run(["play", "hidden-facts", "--policy", "assistant=ask-then-answer"])
    assert rc == 2 and "you play 'assistant'" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# As a process
# ---------------------------------------------------------------------------------------------
def test_console_script_and_module_entry_point():
    script = shutil.which("collab-env", path=str(Path(sys.executable).parent))
    assert script is not None, "the collab-env console script is not installed"
    res = subprocess.run([script, "play", "hidden-facts", "--seed", "0"], input="\\boxed{26}\n.\n",
                         capture_output=True, text=True, timeout=60, cwd=REPO, env=subprocess_env())
    assert res.returncode == 0, res.stderr
    assert "reward assistant: 1  (you)" in res.stdout

    res = subprocess.run([sys.executable, "-m", "collab_env.cli", "info", "hidden-fact"],
                         capture_output=True, text=True, timeout=60, cwd=REPO, env=subprocess_env())
    assert res.returncode == 2
    assert "Did you mean 'hidden-facts'" in res.stderr and "Traceback" not in res.stderr


def test_data_subcommand_writes_the_rl_dataset(tmp_path, capsys):
    from collab_env.testing.collabllm_fixtures import write_collabllm_fixture

    data = write_collabllm_fixture(tmp_path / "rows.jsonl", n=4)
    assert main(["data", "--data_files", str(data), "--mode", "rl", "--output_dir", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "rl_train.parquet").exists()
    assert main(["data", "--mode", "nonsense", "--data_files", str(data), "--output_dir", str(tmp_path)]) != 0


# ---------------------------------------------------------------------------------------------
# OS and I/O errors: one line with the path and a fix, exit status 3 (2 for a misused path)
# ---------------------------------------------------------------------------------------------
def one_line_error(capsys):
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


def test_eval_output_under_proc_fails_before_any_work(capsys):
    # The policy cannot even be imported: the output path is checked before it is loaded.
    rc, out = run(["eval", "hidden-facts", "--policy", "assistant=no_such_module:Nope", "--episodes", "2",
                   "--out", "/proc/x.jsonl", "--no-progress"])
    err = one_line_error(capsys)
    assert rc == 3 and out == ""
    assert "/proc/x.jsonl: no such file or folder" in err and "pseudo file systems" in err


def test_eval_output_paths(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    base = ["eval", "hidden-facts", "--policy", "assistant=tests._eval_helpers:MustNotRun", "--episodes", "1",
            "--no-progress"]
    rc, _ = run(base + ["--out", str(blocker / "sub" / "r.jsonl")])  # a parent is a regular file
    err = one_line_error(capsys)
    assert rc == 3 and f"{blocker / 'sub' / 'r.jsonl'}: a part of the path is a file, not a folder" in err
    for extra in ([], ["--resume"]):  # a folder given as the result file
        rc, _ = run(base + ["--out", str(tmp_path)] + extra)
        err = one_line_error(capsys)
        assert rc == 2 and f"--out {tmp_path} is a folder" in err and str(tmp_path / "results.jsonl") in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # nothing was written


def test_missing_or_misplaced_input_files(tmp_path, capsys):
    missing = tmp_path / "missing.jsonl"
    for argv in (["check", "collabllm-math-hard", "--data-files", str(missing)],
                 ["play", "collabllm-math-hard", "--data-files", str(missing)],
                 ["eval", "collabllm-math-hard", "--episodes", "1", "--data-files", str(missing)],
                 ["check", "collabllm-math-hard", "--data-files", "/proc/none.jsonl"]):
        rc, _ = run(argv)
        err = one_line_error(capsys)
        assert rc == 2 and ("missing.jsonl" in err or "/proc/none.jsonl" in err), (argv, err)
    rc = main(["data", "--data_files", str(missing), "--output_dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 1 and str(missing) in err and "Traceback" not in err


def test_data_output_dir_is_checked_before_the_rows_are_read(tmp_path, capsys):
    from collab_env.testing.collabllm_fixtures import write_collabllm_fixture

    data = write_collabllm_fixture(tmp_path / "rows.jsonl", n=4)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    rc = main(["data", "--data_files", str(data), "--output_dir", "/proc/collab-out"])
    assert rc == 3 and "/proc/collab-out: no such file or folder" in one_line_error(capsys)
    rc = main(["data", "--data_files", str(data), "--local_dir", str(blocker / "out")])
    assert rc == 3 and f"{blocker / 'out'}: a part of the path is a file" in one_line_error(capsys)
    rc = main(["data", "--data_files", str(data), "--output_dir", str(blocker)])
    assert rc == 2 and f"--output_dir {blocker} is a file" in one_line_error(capsys)
    # A missing input with an unwritable output: the output is reported first (checked first).
    rc = main(["data", "--data_files", str(tmp_path / "none.jsonl"), "--output_dir", "/proc/collab-out"])
    assert rc == 3 and "/proc/collab-out" in one_line_error(capsys)


class FullDisk(io.StringIO):
    """A stdout on a full disk."""

    def write(self, text):
        raise OSError(28, "No space left on device")


def test_list_info_check_on_a_full_stdout(capsys):
    for argv in (["list"], ["info", "hidden-facts"], ["check", "hidden-facts", "--cycles", "1"]):
        rc = main(argv, stdout=FullDisk())
        err = one_line_error(capsys)
        assert rc == 3 and "standard output: no space left on the device; free some space" in err, argv


def test_os_error_messages_name_the_path_and_a_fix():
    from collab_env.cli import os_error_message

    assert os_error_message(IsADirectoryError(21, "Is a directory", "/data")) == \
        "/data: is a folder, where a file is needed; give the path of a file inside it."
    assert os_error_message(PermissionError(13, "Permission denied", "/root/r.jsonl")) == \
        "/root/r.jsonl: permission denied; choose a path you may use, or change its permissions."
    assert os_error_message(OSError(30, "Read-only file system", "/mnt/ro/r.jsonl")) == \
        "/mnt/ro/r.jsonl: read-only file system; choose a path on a writable file system."
    assert os_error_message(OSError(5, "Input/output error", "/d/r.jsonl")) == \
        "/d/r.jsonl: input/output error (a disk or network file system fault); check the device, then run the command again."
    assert os_error_message(OSError(18, "Invalid cross-device link", "/a", None, "/b")) == \
        "/a -> /b: Invalid cross-device link; check the path and the disk, then run the command again."
    assert "check the server's address" in os_error_message(ConnectionResetError(104, "Connection reset by peer"))


def test_io_errors_as_a_process_have_no_traceback(tmp_path):
    res = subprocess.run([sys.executable, "-m", "collab_env.cli", "eval", "hidden-facts", "--policy",
                          "assistant=ask-then-answer", "--episodes", "1", "--out", "/proc/x.jsonl"],
                         capture_output=True, text=True, timeout=60, cwd=REPO, env=subprocess_env())
    assert res.returncode == 3 and "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines() == [
        "collab-env: error: /proc/x.jsonl: no such file or folder; check the path: an input must exist, an "
        "output must go in a folder that exists or can be created (pseudo file systems such as /proc and "
        "/sys take no new files)."]
    if Path("/dev/full").exists():
        with open("/dev/full", "w") as full:
            res = subprocess.run([sys.executable, "-m", "collab_env.cli", "list"], stdout=full,
                                 stderr=subprocess.PIPE, text=True, timeout=60, cwd=REPO, env=subprocess_env())
        assert res.returncode == 3 and "Traceback" not in res.stderr and "Exception ignored" not in res.stderr
        assert "standard output: no space left on the device" in res.stderr

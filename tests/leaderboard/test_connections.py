"""Issue 42, "policy specs that reach any endpoint", on the board: ``leaderboard run`` and ``play``
take ``--api-base ROLE=URL`` and ``--api-key-env ROLE=VAR`` as ``eval`` does (one parser,
:func:`collab_env.cli._common.parse_policies`), and a track file's user simulator or judge names
its server the same way (``api_base``, ``api_key_env``: the key's variable, never the key). The
server is the fake OpenAI server of :mod:`collab_env.testing`, on 127.0.0.1, that accepts one key
only, so a request that did not carry the key from the named variable fails the run."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from collab_env.cli import main
from collab_env.errors import ConfigError
from collab_env.leaderboard.tracks import Track, get_track
from collab_env.testing.openai_server import FakeOpenAIServer

KEY = "sk-board-test"


@pytest.fixture(scope="module")
def server():
    with FakeOpenAIServer(api_key=KEY) as srv:
        yield srv


def _cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    import contextlib

    with contextlib.redirect_stderr(err):
        rc = main(argv, stdin=io.StringIO(""), stdout=out)
    return rc, out.getvalue(), err.getvalue()


def test_run_connects_a_submitted_player_to_the_server_with_the_named_key(server, tmp_path, monkeypatch):
    monkeypatch.setenv("BOARD_TEST_KEY", KEY)
    server.reset()
    out = tmp_path / "api-entry"
    rc, text, err = _cli(["leaderboard", "run", "hidden-facts-easy@v4", "--policy", "assistant=litellm:openai/served",
                          "--api-base", f"assistant={server.url}", "--api-key-env", "assistant=BOARD_TEST_KEY",
                          "--episodes", "2", "--concurrency", "1", "--out", str(out), "--no-progress"])
    assert rc == 0, err
    sub = json.loads((out / "submission.json").read_text())
    assert sub["episodes"]["recorded"] == 2 and not sub["episodes"]["failed"]
    # every assistant turn went to the server, as the model named in the spec
    assert server.requests and {r["model"] for r in server.requests} == {"served"}
    # the record names the server and the key's variable, never the key
    assert sub["policies"]["assistant"] == (f'litellm:openai/served {{"api_base": "{server.url}", '
                                            '"api_key_env": "BOARD_TEST_KEY"}')
    assert KEY not in (out / "submission.json").read_text() + (out / "trajectories.jsonl").read_text()
    # the echo replies are what the entry recorded, and it verifies offline (no server needed)
    first = json.loads((out / "trajectories.jsonl").read_text().splitlines()[0])
    assert any(m["author"] == "assistant" and m["content"].startswith("echo: ")
               for m in first["conversation"]["messages"])
    rc, text, err = _cli(["leaderboard", "verify", str(out)])
    assert rc == 0 and "verified" in text, text + err


def test_without_the_key_variable_the_run_stops_before_any_request(server, tmp_path, monkeypatch):
    monkeypatch.delenv("BOARD_TEST_KEY", raising=False)
    server.reset()
    rc, _, err = _cli(["leaderboard", "run", "hidden-facts-easy@v4", "--policy", "assistant=litellm:openai/served",
                       "--api-base", f"assistant={server.url}", "--api-key-env", "assistant=BOARD_TEST_KEY",
                       "--episodes", "1", "--out", str(tmp_path / "e"), "--no-progress"])
    assert rc == 2 and "BOARD_TEST_KEY, which is not set: export BOARD_TEST_KEY=" in err
    assert "Traceback" not in err and not server.requests


@pytest.mark.parametrize(("argv", "match"), [
    (["--api-base", "user=http://127.0.0.1:9/v1"],
     r"--api-base user=\.\.\.: track hidden-facts-easy@v4 fixes the user, .* its track file names the server"),
    (["--api-key-env", "assistant=K"], r"--api-key-env assistant=\.\.\.: no --policy assistant=SPEC to connect"),
    (["--policy", "assistant=litellm:openai/x", "--api-base", "assistant=127.0.0.1:8000"],
     r"--policy assistant: api_base must be an http\(s\) URL"),
    (["--policy", "assistant=ask-then-answer", "--api-base", "assistant=http://127.0.0.1:9/v1"],
     r"'ask-then-answer' takes no api_base"),
])
def test_connection_flags_are_checked_before_any_episode(argv, match, tmp_path):
    rc, _, err = _cli(["leaderboard", "run", "hidden-facts-easy@v4", *argv, "--out", str(tmp_path / "e"),
                       "--no-progress"])
    errors = [ln for ln in err.splitlines() if ln.startswith("collab-env: error:")]
    assert rc == 2 and len(errors) == 1 and "Traceback" not in err, err
    import re

    assert re.search(match, errors[0]), errors[0]
    assert not (tmp_path / "e" / "trajectories.jsonl").exists()


def _llm_user_track(folder: Path, url: str, **user: object) -> Path:
    """hidden-facts-easy@v4 under a name of its own, its user the LLM simulator on the server."""
    d = {**get_track("hidden-facts-easy@v4").to_dict(), "name": "my-served-user", "version": 1, "kind": "api",
         "players": {"user": {"simulator": "llm-user", "backend": "litellm:openai/user-model",
                              "api_base": url, "api_key_env": "BOARD_USER_KEY", **user}}}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "my-served-user@v1.json"
    path.write_text(json.dumps(d, indent=1))
    return path


def test_a_track_files_user_simulator_reaches_its_server(server, tmp_path, monkeypatch):
    monkeypatch.setenv("BOARD_USER_KEY", KEY)
    server.reset()
    track = _llm_user_track(tmp_path / "tracks", server.url)
    out = tmp_path / "my-served-user" / "v1" / "ask"
    rc, text, err = _cli(["leaderboard", "run", str(track), "--policy", "assistant=ask-then-answer", "--episodes", "2",
                          "--concurrency", "1", "--out", str(out), "--no-progress"])
    assert rc == 0, err
    assert server.requests and {r["model"] for r in server.requests} == {"user-model"}
    sub = json.loads((out / "submission.json").read_text())
    assert sub["episodes"]["recorded"] == 2 and sub["cache"]["responses"] == len(server.requests) > 0
    # the calls are keyed by the model, so verification replays them without the server or the key
    monkeypatch.delenv("BOARD_USER_KEY")
    n = len(server.requests)
    rc, text, err = _cli(["leaderboard", "verify", str(out), "--regenerate", "0"])
    assert rc == 0 and "verified" in text, text + err
    assert len(server.requests) == n


@pytest.mark.parametrize(("role", "change", "match"), [
    ("user", {"api_key": KEY}, r"user has unknown key\(s\) \['api_key'\].*names the environment variable"),
    ("user", {"api_base": "127.0.0.1:8000"}, r"user: api_base must be an http\(s\) URL"),
    ("user", {"api_bse": "http://x/v1"}, r"unknown key\(s\) \['api_bse'\].*Did you mean 'api_base'"),
    ("judge", {"api_key_env": ""}, r"judge: api_key_env must be a non-empty string"),
])
def test_a_track_file_that_holds_a_key_or_a_bad_server_is_refused(role, change, match):
    d = get_track("collabllm-math-hard@v2").to_dict()
    how = d["players"]["user"] if role == "user" else d["judge"]
    how.update(change)
    with pytest.raises(ConfigError, match=match):
        Track.from_dict(d)


def test_play_connects_the_other_player_to_the_server(server, monkeypatch):
    monkeypatch.setenv("BOARD_USER_KEY", KEY)
    server.reset()
    out = io.StringIO()
    rc = main(["play", "hidden-facts-easy-v3", "--player", "assistant", "--seed", "0",
               "--policy", "user=llm-user:litellm:openai/user-model", "--api-base", f"user={server.url}",
               "--api-key-env", "user=BOARD_USER_KEY"],
              stdin=io.StringIO("What is the price?\n.\n\\boxed{0}\n.\n"), stdout=out)
    assert rc == 0, out.getvalue()
    assert server.requests and {r["model"] for r in server.requests} == {"user-model"}
    # the user's turn is the server's reply: the echo of the simulator's prompt, whose JSON example
    # the simulator reads as the reply
    assert "What is the price?" in server.requests[0]["messages"][-1]["content"]
    assert "[user]\n<the message you send to the assistant>" in out.getvalue()

"""Policy specs (issue 42): one grammar for every role, in the CLI, configs and Python, that
reaches any endpoint; an unknown or incomplete spec is a one-line ConfigError naming the fix."""

from __future__ import annotations

import json
import re

import pytest

from collab_env.cli import main
from collab_env.errors import ConfigError
from collab_env.policy import PolicySpec, policy_spec, resolve_policy

URL = "http://127.0.0.1:9/v1"  # nothing is sent: building a policy calls no server


def test_a_user_simulator_spec_reaches_its_endpoint():
    from collab_env.agents.litellm import LiteLLMPolicy
    from collab_env.agents.users import LLMUserSimulator

    user = resolve_policy("llm-user:litellm:openai/gpt-4o-mini", api_base=URL)
    assert isinstance(user, LLMUserSimulator) and isinstance(user.backend, LiteLLMPolicy)
    assert (user.backend.model, user.backend.api_base) == ("openai/gpt-4o-mini", URL)
    # the same as a PolicySpec, and as a config file's mapping with a model and sampling
    same = resolve_policy(policy_spec("llm-user:litellm:openai/gpt-4o-mini", api_base=URL))
    assert same.backend.api_base == URL
    mapped = resolve_policy({"kind": "llm-user", "backend": "litellm", "model": "openai/x", "api_base": URL,
                             "sampling": {"temperature": 0.3}, "options": {"max_retries": 5}})
    assert mapped.backend.model == "openai/x" and mapped.sampling == {"temperature": 0.3}
    assert mapped.max_retries == 5
    # without a kind, sampling and options go to the backend itself
    judge = resolve_policy({"backend": "litellm:openai/j", "api_base": URL, "sampling": {"temperature": 0},
                            "options": {"timeout": 7}})
    assert isinstance(judge, LiteLLMPolicy) and judge.default_sampling == {"temperature": 0}
    assert judge.timeout == 7 and judge.api_base == URL


def test_a_policy_config_file_in_json_and_yaml(tmp_path, monkeypatch):
    spec = {"kind": "llm-user", "backend": "litellm", "model": "openai/served", "api_base": URL,
            "api_key_env": "MY_SERVER_KEY"}
    (tmp_path / "user.json").write_text(json.dumps(spec))
    (tmp_path / "user.yaml").write_text("\n".join(f"{k}: {v}" for k, v in spec.items()) + "\n")
    with pytest.raises(ConfigError, match="MY_SERVER_KEY, which is not set: export MY_SERVER_KEY="):
        resolve_policy(str(tmp_path / "user.json"))
    monkeypatch.setenv("MY_SERVER_KEY", "sk-local")
    for name in ("user.json", "user.yaml"):
        user = resolve_policy(str(tmp_path / name))
        assert user.backend.api_base == URL and user.backend._api_key == "sk-local"
    # the file never holds the key, and the spec's text names only the variable
    assert "sk-local" not in str(PolicySpec.load(tmp_path / "user.json"))
    (tmp_path / "bad.json").write_text(json.dumps({**spec, "options": {"api_key": "sk-x"}}))
    with pytest.raises(ConfigError, match="does not hold an API key: name its environment variable"):
        resolve_policy(str(tmp_path / "bad.json"))


@pytest.mark.parametrize(("ref", "kwargs", "match"), [
    ("llm-user", {}, r"'llm-user' needs a backend: write 'llm-user:<backend spec>'"),
    ("llm-user:", {}, r"needs a backend"),
    ("proactive", {}, r"'proactive' needs a backend"),
    ("hf:./my-model", {"api_base": URL}, r"takes no api_base: connection settings go to API backends"),
    ("ask-then-answer", {"api_base": URL}, r"takes no api_base"),
    ("llm-user:litellm:openai/x", {"no_such_option": 1}, r"takes no argument 'no_such_option'"),
    ("llm-usr:litellm:openai/x", {}, r"'llm-usr' is neither a kind .* Did you mean 'llm-user'"),
    ({"backend": "litellm"}, {}, r"needs a model"),
    ({"kind": "llm-usr", "backend": "embedded"}, {}, r"unknown policy kind 'llm-usr'.*Did you mean 'llm-user'"),
    ({"backend": "litellm:openai/x", "modle": "y"}, {}, r"unknown key\(s\) \['modle'\]"),
    ({"backend": "litellm:openai/x", "api_base": "127.0.0.1:8000"}, {}, r"api_base must be an http\(s\) URL"),
    ("missing-file.json", {}, r"no policy config file 'missing-file.json'"),
])
def test_unknown_or_incomplete_specs_are_one_line_config_errors(ref, kwargs, match):
    with pytest.raises(ConfigError, match=match) as info:
        resolve_policy(ref, **kwargs)
    assert "\n" not in str(info.value)


def test_the_cli_no_longer_crashes_on_llm_user_and_says_the_fix(tmp_path, capsys):
    """The reported crash: --policy user=llm-user was a TypeError traceback (exit 1)."""
    from collab_env.testing.collabllm_fixtures import write_collabllm_fixture

    rows = write_collabllm_fixture(tmp_path / "rows.jsonl")
    out = tmp_path / "r.jsonl"
    rc = main(["eval", "collabllm-math-hard", "--data-files", str(rows), "--episodes", "1",
               "--policy", "assistant=answer-at-once", "--policy", "user=llm-user", "--out", str(out),
               "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    assert "'llm-user' needs a backend: write 'llm-user:<backend spec>'" in err
    assert not out.exists() or out.stat().st_size == 0


@pytest.mark.parametrize(("argv", "match"), [
    (["--api-base", f"user={URL}"], "--api-base user=...: no --policy user=SPEC to connect"),
    (["--api-base", f"judge={URL}"], "--api-base judge=...: no --judge SPEC to connect"),
    (["--judge", "litellm:openai/x"], "--judge and --reward-arg configure a reward option: add --reward mr"),
    (["--policy", "user=llm-user:litellm:openai/x", "--api-base", "user=localhost:8000"],
     "--policy user: api_base must be an http"),
    (["--reward", "mr", "--policy", "user=llm-user:litellm:openai/x", "--api-base", f"user={URL}"],
     r"the metrics \['accuracy', 'interactivity'\] need an LLM judge.*--judge SPEC"),
])
def test_cli_connection_and_reward_flags_are_checked_before_any_work(argv, match, tmp_path, capsys):
    from collab_env.testing.collabllm_fixtures import write_collabllm_fixture

    rows = write_collabllm_fixture(tmp_path / "rows.jsonl")
    rc = main(["eval", "collabllm-math-hard", "--data-files", str(rows), "--episodes", "1",
               "--policy", "assistant=answer-at-once", *argv, "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    errors = [ln for ln in err.splitlines() if ln.startswith("collab-env: error:")]
    assert len(errors) == 1 and re.search(match, errors[0]), err


def test_the_spec_text_is_stable_and_names_no_key():
    s = policy_spec("llm-user:litellm:openai/m", api_base=URL, api_key_env="K")
    assert str(s) == f'llm-user:litellm:openai/m {{"api_base": "{URL}", "api_key_env": "K"}}'
    assert PolicySpec.from_mapping(s.to_dict()) == s and hash(s) == hash(PolicySpec.from_mapping(s.to_dict()))
    assert PolicySpec.parse("proactive:hf:./m") == PolicySpec(backend="hf:./m", kind="proactive")

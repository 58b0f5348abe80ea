"""Issue 42: the CollabLLM path end to end against a real model server. ``vllm serve`` (the CPU
build) serves the embedded SmolLM2-135M-Instruct on 127.0.0.1 as ``smollm2``; the assistant, the
LLM user simulator and the judge reach it through litellm exactly as a user reaches an API
(``litellm:openai/smollm2`` plus the server's URL), from the command line, with the
multiturn-aware reward. The 135M judge rarely writes the rubric's JSON, so the run uses verl's
``on_fault="zero"`` (a judge that fails after its retries scores 0, and the fault is counted):
what is checked is that every role's requests reached the server and came back into the
results, and that the judge's validity check ran before any judged number, not the model's
quality."""

from __future__ import annotations

import json

import pytest

from tests_vllm.conftest import SERVED_NAME


@pytest.mark.timeout(1800)  # the server's start (minutes on a busy 2-core machine) included
def test_collabllm_eval_with_user_and_judge_behind_vllm_serve(server, tmp_path, capsys, monkeypatch):
    from collab_env.cli import main
    from collab_env.eval import judge_check
    from collab_env.testing.collabllm_fixtures import write_collabllm_fixture

    monkeypatch.setattr(judge_check, "CACHE_DIR", tmp_path / "judge_validity")  # not the user's cache

    url = server.base + "/v1"
    rows = write_collabllm_fixture(tmp_path / "rows.jsonl", n=1)
    # Each role as a policy config file: the endpoint, a patient timeout (a CPU server on a busy
    # machine answers in tens of seconds), and for the user the embedded model's plain-text format.
    model = {"backend": "litellm", "model": f"openai/{SERVED_NAME}", "api_base": url}
    specs = {
        "assistant": {**model, "sampling": {"temperature": 0.0, "max_new_tokens": 32},
                      "options": {"timeout": 600, "max_retries": 1}},
        "user": {**model, "kind": "llm-user", "options": {"reply_format": "plain", "max_retries": 1},
                 "sampling": {"temperature": 0.0, "max_new_tokens": 32},
                 "backend_options": {"timeout": 600, "max_retries": 1}},
        "judge": {**model, "options": {"timeout": 600, "max_retries": 1}},
    }
    for role, spec in specs.items():
        (tmp_path / f"{role}.json").write_text(json.dumps(spec))
    out = tmp_path / "mr.jsonl"
    argv = ["eval", "collabllm-math-hard", "--data-files", str(rows), "--episodes", "1", "--no-progress",
            "--policy", f"assistant={tmp_path / 'assistant.json'}", "--policy", f"user={tmp_path / 'user.json'}",
            "--env-arg", "max_assistant_turns=2",
            "--reward", "mr", "--judge", str(tmp_path / "judge.json"),
            "--reward-arg", "num_rollouts=3", "--reward-arg", "max_user_turns=1", "--reward-arg", "on_fault=zero",
            "--reward-arg", 'judge_kwargs={"max_new_tokens": 48, "max_retries": 0}', "--out", str(out)]
    assert main(argv) == 0, capsys.readouterr().err[-3000:]
    printed = capsys.readouterr().out
    [rec] = [json.loads(x) for x in out.read_text().splitlines()]
    assert set(rec["components"]["assistant"]) >= {"accuracy", "interactivity", "token_amount", "mr"}
    # the served judge was checked for validity before any judged number (issue 45): its judged
    # columns are numbers only if it passed; the values stay in the file either way
    check = rec["judge_check"]
    assert check["status"] in ("valid", "invalid") and check["validity"]["items"] == judge_check.CHECK_ITEMS
    assert {"accuracy", "interactivity", "mr"} <= set(check["columns"])
    assert "assistant reward components (mean per episode): " in printed
    assert ("judge failed validity check" in printed) == (check["status"] == "invalid"), printed[-2000:]
    print("judge check of the served 135M judge:", json.dumps(check["validity"], default=str)[:400])
    moves = rec["turns"]
    # every move came from the server
    assert {t["player"] for t in moves} == {"assistant", "user"}
    assert all(t["completion"]["meta"].get("model") == f"openai/{SERVED_NAME}" for t in moves
               if t["player"] == "assistant")
    # the first reply was scored by 3 futures whose user turns and judgements went to the server
    mr = rec["info"]["scores"][0]["mr"]
    print("MR of the first reply:", json.dumps({k: mr[k] for k in ("reward", "num_rollouts", "cost", "future_turns")}))
    assert mr["num_rollouts"] == 3 and mr["future_turns"] == [1, 1, 1]
    assert mr["cost"]["policy_calls"] >= 3 and mr["cost"].get("judge_calls", 0) + len(mr["faults"]) >= 3
    assert url in rec["run"]["policies"]["user"] and url in rec["run"]["env_kwargs"]["reward_kwargs"]["judge"]

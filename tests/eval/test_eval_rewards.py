"""Issue 42: a reward that needs a judge says so, and ``--reward mr --judge SPEC`` runs the
CollabLLM multiturn-aware reward from the command line (user simulator and judge behind an
OpenAI-compatible server on 127.0.0.1: the fake one of collab_env.testing)."""

from __future__ import annotations

import json

import pytest

import collab_env
from collab_env import compose
from collab_env.errors import ZeroRewardWarning

pytest.importorskip("litellm")


def test_make_says_once_which_reward_options_score_a_zero_reward_env(tmp_path, monkeypatch):
    from collab_env.testing.collabllm_fixtures import write_collabllm_fixture

    monkeypatch.setattr(compose, "_NOTED", set())
    rows = write_collabllm_fixture(tmp_path / "rows.jsonl")
    with pytest.warns(ZeroRewardWarning) as record:
        collab_env.make("collabllm-math-hard", data_files=str(rows))
        collab_env.make("collabllm-math-hard", data_files=str(rows))  # said once
    [w] = [w for w in record if w.category is ZeroRewardWarning]
    text = str(w.message)
    assert "own reward is 0 at every step by construction" in text
    assert "reward='conversation'" in text and "needs an LLM judge for accuracy, interactivity" in text
    assert "reward='mr'" in text and "a user simulator for the futures" in text and "--judge SPEC" in text
    # an env whose own reward scores it says nothing; nor does one built with a reward option
    assert compose.reward_options_note("hidden-facts") is None
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", ZeroRewardWarning)
        monkeypatch.setattr(compose, "_NOTED", set())
        collab_env.make("collabllm-math-hard", data_files=str(rows), reward="mr",
                        reward_kwargs={"judge": "litellm:openai/x", "user": "replay", "max_user_turns": 0})
    # collabllm-medium's BLEU needs no judge: the note does not ask for one
    assert "judge" not in compose.reward_options_note("collabllm-medium").split("reward='mr'")[0]


def test_eval_notes_the_zero_reward_and_runs_mr_with_a_judge_behind_a_server(tmp_path, capsys, monkeypatch):
    from collab_env.eval import judge_check

    monkeypatch.setattr(judge_check, "CACHE_DIR", tmp_path / "judge-verdicts")
    from collab_env.cli import main
    from collab_env.testing.collabllm_fixtures import write_collabllm_fixture
    from collab_env.testing.openai_server import COLLABLLM_REPLY, FakeOpenAIServer

    rows = write_collabllm_fixture(tmp_path / "rows.jsonl", n=1)
    with FakeOpenAIServer(reply=lambda body: COLLABLLM_REPLY) as srv:
        common = ["eval", "collabllm-math-hard", "--data-files", str(rows), "--episodes", "1", "--no-progress",
                  "--policy", "assistant=litellm:openai/served", "--api-base", f"assistant={srv.url}",
                  "--policy", "user=llm-user:litellm:openai/served", "--api-base", f"user={srv.url}",
                  "--env-arg", "max_assistant_turns=2"]
        assert main(common) == 0
        out = capsys.readouterr().out
        assert "note: collabllm-math-hard-v1's own reward is 0 at every step" in out
        assert "--reward mr --judge SPEC" in out
        before = len(srv.requests)
        assert main([*common, "--reward", "mr", "--judge", "litellm:openai/served", "--api-base", f"judge={srv.url}",
                     "--reward-arg", "num_rollouts=2", "--reward-arg", "max_user_turns=1",
                     "--out", str(tmp_path / "mr.jsonl")]) == 0
        out = capsys.readouterr().out
    assert "own reward is 0" not in out
    # the server's judge gives every conversation one canned verdict: it fails the validity check
    # the eval runs first (over the same HTTP), so the judged columns are refused, not printed
    refusal = "judge failed validity check (AUC 0.500 < 0.8; calibration error 0.500 > 0.25)"
    assert f"; accuracy, interactivity, mr: {refusal}" in out and "token_amount" in out
    assert "judged columns (accuracy, interactivity, mr) refused" in out
    [rec] = [json.loads(x) for x in (tmp_path / "mr.jsonl").read_text().splitlines()]
    assert rec["judge_check"]["values"] == "invalid"
    assert rec["judge_check"]["identity"]["backend"]["api_base"] == srv.url
    comps = rec["components"]["assistant"]  # the raw values stay in the file
    assert set(comps) >= {"accuracy", "interactivity", "token_amount", "mr", "env"}
    # the canned verdicts: accuracy true (1 x weight 1), interactivity mean(1, 0.7, 0.3), for the
    # first reply; the second spends the turn budget (max_assistant_turns=2): 0 without futures (verl)
    assert comps["accuracy"] == pytest.approx(1.0) and comps["interactivity"] == pytest.approx(2 / 3)
    assert comps["mr"] == pytest.approx(comps["accuracy"] + comps["interactivity"] + comps["token_amount"])
    assert rec["run"]["env_kwargs"]["reward_kwargs"]["judge"] == f'litellm:openai/served {{"api_base": "{srv.url}"}}'
    assert "llm-user:litellm:openai/served" in rec["run"]["policies"]["user"]
    # the futures' user and the judges asked the server: more requests than the episode itself makes
    kinds = [json.dumps(r["messages"]) for r in srv.requests[before:]]
    assert any("understanding" in k for k in kinds) and any("You are playing the part of a human user" in k
                                                             for k in kinds)

"""Evaluation runs: seeds and items per episode id, the result file, failures and resume."""

from __future__ import annotations

import json

import pytest

from collab_env.errors import ConfigError
from collab_env.eval import compare, evaluate, failures_path, load_results
from collab_env.types import Episode
from tests._eval_helpers import BoxedZero, FlakyAskThenAnswer, MustNotRun, registered

HF = "hidden-facts"


@pytest.fixture
def guess_env():
    with registered("test-guess-v0", "tests._eval_helpers:make_guess_env") as env_id:
        yield env_id


def lines_of(path):
    return path.read_bytes().splitlines(keepends=True)


def records(path):
    return [json.loads(x) for x in lines_of(path)]


# ---------------------------------------------------------------------------------------------
# Episodes, seeds, items, summary
# ---------------------------------------------------------------------------------------------
def test_episode_k_uses_seed_plus_k_and_item_k_mod_num_items(guess_env, tmp_path):
    out = tmp_path / "r.jsonl"
    res = evaluate(guess_env, {"assistant": BoxedZero()}, num_episodes=10, seed=100, out=out,
                   concurrency=3, progress=False)
    recs = records(out)
    assert sorted(r["episode_id"] for r in recs) == list(range(10))
    for r in recs:
        k = r["episode_id"]
        assert (r["seed"], r["index"], r["status"]) == (100 + k, k % 4, "ok")
        assert r["run"]["env_id"] == "test-guess-v0" and r["run"]["seed"] == 100
        assert r["run"]["policies"]["assistant"] == "tests._eval_helpers:BoxedZero"
    # \boxed{0} is right only on item 0: episodes 0, 4 and 8 of 10.
    st = res.summary.players["assistant"]
    assert st.mean_return == pytest.approx(0.3)
    assert st.success_rate == pytest.approx(0.3)
    assert st.std_return == pytest.approx((0.3 * 0.7) ** 0.5)
    assert res.summary.end_reasons == {"answered": 10}
    assert list(res.episodes) == list(range(10))
    assert all(isinstance(e, Episode) for e in res.episodes.values())


def test_records_round_trip_and_runs_are_reproducible(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    kw = dict(num_episodes=6, seed=3, progress=False)
    evaluate(HF, {"assistant": "ask-then-answer"}, out=a, concurrency=1, **kw)
    evaluate(HF, {"assistant": "ask-then-answer"}, out=b, concurrency=4, **kw)
    by_id = lambda p: {r["episode_id"]: r for r in load_results(p)}  # noqa: E731
    assert by_id(a) == by_id(b)  # completion order differs, content does not
    rec = by_id(a)[2]
    ep = Episode.from_dict(rec)
    assert ep.to_dict() == {k: v for k, v in rec.items() if k not in ("episode_id", "status", "run")}
    assert ep.returns["assistant"] == 1.0


def test_compare_baselines_side_by_side(tmp_path):
    cmp = compare(HF, {"ask": {"assistant": "ask-then-answer"},
                       "guess": {"assistant": "answer-at-once"}},
                  num_episodes=8, out_dir=tmp_path, progress=False)
    ask, guess = cmp.results["ask"], cmp.results["guess"]
    assert ask.summary.players["assistant"].mean_return == 1.0
    assert guess.summary.players["assistant"].mean_return < 1.0
    # Same seeds, so the same items: the opening user message of episode k is the same.
    for k in range(8):
        assert (ask.episodes[k].conversation.by("user")[0].content
                == guess.episodes[k].conversation.by("user")[0].content)
    table = cmp.summary_table()
    assert "hidden-facts-v3" in table
    rows = [line for line in table.splitlines() if line.startswith(("ask ", "guess "))]
    assert len(rows) == 2 and "8/8" in rows[0] and "1.000" in rows[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ask.jsonl", "guess.jsonl"]


# ---------------------------------------------------------------------------------------------
# Failures
# ---------------------------------------------------------------------------------------------
def test_policy_failures_are_counted_not_scored_and_resume_retries_them(tmp_path):
    out = tmp_path / "r.jsonl"
    res = evaluate(HF, {"assistant": FlakyAskThenAnswer(fail_seeds={2, 5})}, num_episodes=8,
                   out=out, progress=False)
    assert sorted(f.episode_id for f in res.failures) == [2, 5]
    assert "TimeoutError" in res.failures[0].error and "simulated timeout" in res.failures[0].error
    # A failure is not a zero reward: the mean is over the six finished episodes.
    assert res.summary.completed == 6 and res.summary.failed == 2
    assert res.summary.players["assistant"].mean_return == 1.0
    assert res.missing == [2, 5] and not res.complete
    assert sorted(r["episode_id"] for r in records(out)) == [0, 1, 3, 4, 6, 7]
    fails = records(failures_path(out))
    assert sorted(f["episode_id"] for f in fails) == [2, 5]
    assert all(f["status"] == "failed" and "simulated timeout" in f["error"] for f in fails)
    assert "6/8" in res.summary_table()

    before = lines_of(out)
    good = FlakyAskThenAnswer()  # same policy, the transient failure is gone
    res2 = evaluate(HF, {"assistant": good}, num_episodes=8, out=out, resume=True, progress=False)
    assert res2.failures == [] and res2.complete
    assert good.calls == 2 * 2  # two episodes, two assistant moves each: only 2 and 5 ran
    after = lines_of(out)
    assert after[: len(before)] == before
    assert sorted(json.loads(x)["episode_id"] for x in after) == list(range(8))
    assert res2.summary.players["assistant"].mean_return == 1.0


# ---------------------------------------------------------------------------------------------
# Resume
# ---------------------------------------------------------------------------------------------
def test_resume_of_a_finished_run_runs_nothing_and_can_extend_it(guess_env, tmp_path):
    out = tmp_path / "r.jsonl"
    evaluate(guess_env, {"assistant": BoxedZero()}, num_episodes=5, out=out, progress=False)
    before = out.read_bytes()
    res = evaluate(guess_env, {"assistant": BoxedZero()}, num_episodes=5, out=out, resume=True,
                   progress=False)
    assert out.read_bytes() == before and res.complete and len(res.episodes) == 5
    assert res.summary.players["assistant"].mean_return == pytest.approx(2 / 5)  # read back
    res = evaluate(guess_env, {"assistant": BoxedZero()}, num_episodes=9, out=out, resume=True,
                   progress=False)
    assert out.read_bytes().startswith(before)
    assert sorted(r["episode_id"] for r in records(out)) == list(range(9))
    assert res.summary.players["assistant"].mean_return == pytest.approx(3 / 9)


def test_resume_drops_a_line_cut_short_by_a_kill(tmp_path):
    out = tmp_path / "r.jsonl"
    evaluate(HF, {"assistant": "ask-then-answer"}, num_episodes=5, out=out, progress=False)
    full = lines_of(out)
    cut_id = json.loads(full[-1])["episode_id"]
    out.write_bytes(b"".join(full[:-1]) + full[-1][: len(full[-1]) // 2])  # killed mid-write
    with pytest.warns(UserWarning, match="incomplete last line"):
        res = evaluate(HF, {"assistant": "ask-then-answer"}, num_episodes=5, out=out,
                       resume=True, progress=False)
    after = lines_of(out)
    assert after[:4] == full[:4]
    assert json.loads(after[4])["episode_id"] == cut_id
    assert sorted(json.loads(x)["episode_id"] for x in after) == list(range(5))
    assert res.complete


def test_resume_refuses_a_file_of_another_run(tmp_path):
    out = tmp_path / "r.jsonl"
    evaluate(HF, {"assistant": "ask-then-answer"}, num_episodes=2, seed=0, out=out, progress=False)
    before = out.read_bytes()
    cases = [
        dict(policies={"assistant": "answer-at-once"}, match="policies"),
        dict(policies={"assistant": "ask-then-answer"}, seed=1, match="seed"),
        dict(policies={"assistant": "ask-then-answer"}, env="hidden-facts-easy", match="env_id"),
        dict(policies={"assistant": "ask-then-answer"}, env_kwargs={"max_steps": 5},
             match="env_kwargs"),
        dict(policies={"assistant": MustNotRun()}, match="policies"),
    ]
    for case in cases:
        with pytest.raises(ConfigError, match=f"different run.*{case['match']}"):
            evaluate(case.get("env", HF), case["policies"], num_episodes=4,
                     seed=case.get("seed", 0), env_kwargs=case.get("env_kwargs"), out=out,
                     resume=True, progress=False)
    assert out.read_bytes() == before


def test_existing_file_without_resume_is_refused(tmp_path):
    out = tmp_path / "r.jsonl"
    evaluate(HF, {"assistant": "ask-then-answer"}, num_episodes=2, out=out, progress=False)
    before = out.read_bytes()
    with pytest.raises(ConfigError, match="--resume"):
        evaluate(HF, {"assistant": "ask-then-answer"}, num_episodes=2, out=out, progress=False)
    assert out.read_bytes() == before
    # An empty file is not a previous run: it is used.
    empty = tmp_path / "empty.jsonl"
    empty.touch()
    evaluate(HF, {"assistant": "ask-then-answer"}, num_episodes=2, out=empty, progress=False)
    assert len(lines_of(empty)) == 2


def test_a_file_that_is_not_a_result_file_is_refused(tmp_path):
    out = tmp_path / "r.jsonl"
    out.write_text("hello\n")
    with pytest.raises(ConfigError, match="line 1"):
        evaluate(HF, {"assistant": "ask-then-answer"}, num_episodes=2, out=out, resume=True,
                 progress=False)


# ---------------------------------------------------------------------------------------------
# Argument errors
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "policies, kwargs, match",
    [
        ({}, {}, "'assistant'.*no default policy.*--policy assistant="),
        ({"assistnt": "ask-then-answer"}, {}, "unknown player 'assistnt'.*Did you mean 'assistant'"),
        ({"assistant": "ask-then-answr"}, {}, "Did you mean 'ask-then-answer'"),
        ({"assistant": "no_such_module:Policy"}, {}, "cannot load the policy"),
        ({"assistant": "ask-then-answer"}, {"num_episodes": 0}, "num_episodes"),
        ({"assistant": "ask-then-answer"}, {"resume": True}, "out="),
        ({"assistant": "ask-then-answer"}, {"env_kwargs": {"num_objectz": 2}}, "num_objects"),
    ],
)
def test_invalid_arguments_are_clear_errors(policies, kwargs, match):
    kwargs = {"num_episodes": 2, **kwargs}
    with pytest.raises(ConfigError, match=match):
        evaluate(HF, policies, progress=False, **kwargs)


# ---------------------------------------------------------------------------------------------
# A rejected API key stops the run; finished episodes are kept and resume continues
# ---------------------------------------------------------------------------------------------
def test_a_rejected_key_stops_the_evaluation_keeps_the_file_and_resume_finishes(tmp_path, monkeypatch):
    pytest.importorskip("litellm")
    from collab_env.agents.limiter import ConcurrencyLimiter
    from collab_env.agents.litellm import LiteLLMPolicy
    from collab_env.errors import FatalPolicyError
    from collab_env.testing.openai_server import FakeOpenAIServer

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    out = tmp_path / "api.jsonl"
    with FakeOpenAIServer(api_key="sk-the-right-key") as srv:
        def assistant(key):
            return LiteLLMPolicy("openai/fake-model", api_base=srv.url, api_key=key, name="api-assistant",
                                 limiter=ConcurrencyLimiter(4))

        kw = dict(env_kwargs={"max_steps": 4}, concurrency=4, out=out, progress=False)
        first = evaluate(HF, {"assistant": assistant("sk-the-right-key")}, num_episodes=3, **kw)
        assert first.complete and len(lines_of(out)) == 3
        before, n_ok = lines_of(out), len(srv.requests)

        with pytest.raises(FatalPolicyError) as info:
            evaluate(HF, {"assistant": assistant("sk-wrong-key-123")}, num_episodes=20, resume=True, **kw)
        msg = str(info.value)
        assert "Incorrect API key provided: sk-****-123" in msg  # the provider's own words
        assert f"3 finished episode(s) of 20 are kept in {out}" in msg
        assert "--resume" in msg and "OPENAI_API_KEY" in msg and "api_key=" in msg
        # One round of requests (the episodes in flight), not one per remaining episode (17).
        assert 1 <= len(srv.requests) - n_ok <= 4
        assert lines_of(out) == before and not failures_path(out).exists()

        done = evaluate(HF, {"assistant": assistant("sk-the-right-key")}, num_episodes=20, resume=True, **kw)
        assert done.complete and lines_of(out)[:3] == before and len(lines_of(out)) == 20


def test_success_is_judged_against_the_range_of_the_reward_option_in_use():
    import math

    from collab_env.eval.run import reward_range_of
    from collab_env.registry import spec

    s = spec("hidden-facts")
    assert reward_range_of(s, None) == tuple(s.reward_range) == (0.0, 1.0)
    # the card's range for each option (MR sums the judged metric over up to 6 replies)
    assert reward_range_of(s, "mr") == tuple(s.card.reward_range["mr"])
    assert reward_range_of(s, "conversation") == tuple(s.card.reward_range["conversation"])
    # an option the card does not bound: no success rate (a positive return need not mean success)
    assert reward_range_of(s, "my-own-reward") == (-math.inf, math.inf)
    # a negative lower bound (collabllm's MR has a token penalty): success is not reported either
    assert reward_range_of(spec("collabllm-math-hard"), "mr")[0] < 0

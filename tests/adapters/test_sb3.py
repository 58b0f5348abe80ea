"""stable-baselines3 adapter: both wrappers pass SB3's check_env, acts and features against
hand-computed values, the VecEnv equals N single envs for the same seeds and actions and
batches the shared policies' calls, faults end episodes, and a short PPO run learns."""

import sys

import numpy as np
import pytest
from gymnasium.utils.seeding import np_random

pytest.importorskip("stable_baselines3")

from stable_baselines3.common.env_checker import check_env  # noqa: E402

from collab_env.adapters.sb3 import (  # noqa: E402
    ChatFeatures,
    CollabVecEnv,
    DialogueAct,
    EmbeddingFeatures,
    HiddenFactsFeatures,
    MacroActionWrapper,
    RandomActPolicy,
    RerankWrapper,
    generic_acts,
)
from collab_env.errors import ConfigError, EnvStateError, MissingDependencyError  # noqa: E402
from collab_env.policy import CallablePolicy, ScriptedPolicy, observation_rng  # noqa: E402
from collab_env.rollout import BatchedPolicy  # noqa: E402
from collab_env.tasks.hidden_facts import HiddenFactsUser  # noqa: E402
from collab_env.types import FAULT, Completion  # noqa: E402

ENV = "hidden-facts-easy"
ASK_NEXT, ASK_ALL, ANSWER, CLARIFY, SUMMARISE = range(5)


def _item(wrapper):
    return wrapper.view.env.unwrapped.episode.item


def test_both_wrappers_pass_check_env():
    check_env(MacroActionWrapper(ENV), warn=True, skip_render_check=True)
    check_env(RerankWrapper(ENV, RandomActPolicy(), n=3), warn=True, skip_render_check=True)
    # on the two-object suite too, and with a frozen encoder's embedding appended
    enc = EmbeddingFeatures(HiddenFactsFeatures(), lambda text: [len(text) % 7 / 7 - 0.5, 2.0], dim=2)
    check_env(MacroActionWrapper("hidden-facts", features=enc), warn=True, skip_render_check=True)


def test_ask_then_answer_solves_and_features_follow_the_facts():
    env = MacroActionWrapper(ENV)
    assert env.action_space.n == 5 and env.observation_space.shape == (HiddenFactsFeatures.size,)
    obs, _ = env.reset(seed=3)
    item = _item(env)
    hidden = [f for f in item["facts"] if f["hidden"]]
    assert len(hidden) == 1  # easy: one object, one of its two quantities withheld
    # objects named, 1 of 8 known, 1 of 8 missing, not complete, the opening revealed 1
    np.testing.assert_array_equal(obs[7:], np.float32([1, 1 / 8, 1 / 8, 0, 1 / 8]))
    assert obs[0] == 0 and obs[1] == np.float32(1 / 6)  # no own turn yet; one user message
    obs, r, term, trunc, info = env.step(ASK_NEXT)
    assert (r, term, trunc, info["act"]) == (0.0, False, False, "ask_next")
    assert hidden[0]["sentence"] in info["other_moves"][0][1]  # the user told the missing fact
    np.testing.assert_array_equal(obs[7:], np.float32([1, 2 / 8, 0, 1, 1 / 8]))
    assert obs[0] == np.float32(1 / 6)
    obs, r, term, trunc, info = env.step(ANSWER)
    assert info["text"] == f"The total is \\boxed{{{item['answer']}}}."
    assert (r, term, trunc) == (1.0, True, False)
    assert info["reward_components"]["accuracy"] == 1.0
    with pytest.raises(EnvStateError):
        env.step(ANSWER)


def test_answering_blind_takes_one_for_the_unknown():
    env = MacroActionWrapper(ENV)
    env.reset(seed=3)
    facts = _item(env)["facts"]
    expected = np.prod([1 if f["hidden"] else f["value"] for f in facts])
    _, r, term, _, info = env.step(ANSWER)
    assert info["text"] == f"The total is \\boxed{{{expected}}}."
    assert term and r == float(expected == _item(env)["answer"])


def test_unhelpful_acts_run_out_the_users_patience():
    env = MacroActionWrapper(ENV)
    env.reset(seed=5)
    # HiddenFactsUser(patience=3): the third reply that reveals nothing ends the chat
    for k, act in enumerate((CLARIFY, SUMMARISE, CLARIFY)):
        _, r, term, trunc, info = env.step(act)
        assert r == 0.0 and term == (k == 2) and not trunc
    assert info["end_reason"] == "user_terminated"


def test_realiser_policy_gets_the_instruction_and_a_fault_ends_the_episode():
    seen = []

    def say(observation):
        seen.append(observation[-1])
        return f"[{observation[-1].content}]"

    env = MacroActionWrapper(ENV, generic_acts(), realiser=CallablePolicy(say))
    env.reset(seed=0)
    _, _, _, _, info = env.step(1)
    assert info["text"] == f"[{generic_acts()[1].instruction}]" and info["act"] == "answer"
    assert seen[0].role == "system" and seen[0].audience == ("assistant",)
    # the instruction is shown to the realiser only, never sent to the env
    assert all(m.content != generic_acts()[1].instruction for m in env.view.env.state())

    class GivesUp(ScriptedPolicy):
        async def act(self, observations, **sampling):
            return [Completion(text="", finish_reason=FAULT, meta={"fault": "timeout"})]

    env = MacroActionWrapper(ENV, realiser=GivesUp())
    env.reset(seed=0)
    _, r, term, trunc, info = env.step(ANSWER)
    assert (r, term, trunc) == (0.0, False, True)
    assert info["faults"] == {"assistant": "timeout"} and info["end_reason"] == "fault:assistant"
    assert env.faults == 1


def test_realiser_callable_and_errors():
    env = MacroActionWrapper(ENV, realiser=lambda act, obs: f"{act.name} \\boxed{{0}}")
    env.reset(seed=0)
    assert env.step(CLARIFY)[4]["text"] == "clarify \\boxed{0}"
    with pytest.raises(ConfigError, match="no template"):
        MacroActionWrapper(ENV, generic_acts())
    with pytest.raises(ConfigError, match="action must be"):
        MacroActionWrapper(ENV).step(7)
    with pytest.raises(ConfigError, match="instruction"):
        DialogueAct("x", "")
    with pytest.raises(ConfigError, match="pass an id"):
        MacroActionWrapper(MacroActionWrapper(ENV).view.env, split="test")


def test_rerank_offers_seeded_candidates_and_sends_the_chosen_one():
    env = RerankWrapper(ENV, RandomActPolicy(), n=4)
    obs, info = env.reset(seed=11)
    k = HiddenFactsFeatures.size
    assert obs.shape == (k + 4 * 5,)
    # candidate i is the policy's reply with seed s + i, s the first draw of the wrapper's
    # generator seeded by reset(seed=11): replay them by hand
    texts = info["candidates"]
    conv = env.view.env.observe("assistant")
    s = int(np_random(11)[0].integers(2**31 - 1))
    assert texts == [RandomActPolicy().respond(conv, observation_rng(conv, s + i)) for i in range(4)]
    assert len(set(texts)) > 1  # the seeds give different acts
    boxed = [float("\\boxed" in t) for t in texts]
    np.testing.assert_array_equal(obs[k + 1::5], np.float32(boxed))
    choice = int(np.argmax([("?" in t) for t in texts])) if any("?" in t for t in texts) else 0
    _, _, _, _, step_info = env.step(choice)
    assert step_info["text"] == texts[choice] and step_info["candidate"] == choice
    # same seed -> same candidates
    assert RerankWrapper(ENV, RandomActPolicy(), n=4).reset(seed=11)[1]["candidates"] == texts


def _play_single(make, seeds, actions):
    """Each env on its own, with the SB3 auto-reset convention."""
    out = []
    for i, seed in enumerate(seeds):
        env = make()
        obs, _ = env.reset(seed=seed)
        rows = [obs]
        for a in actions[:, i]:
            obs, r, term, trunc, info = env.step(int(a))
            if term or trunc:
                rows.append(("end", obs, r, info["text"]))
                obs, _ = env.reset()
            rows.append((obs, r, bool(term or trunc)))
        out.append(rows)
    return out


@pytest.mark.parametrize("kind", ["macro", "rerank"])
def test_vec_env_matches_single_envs(kind):
    n, steps, seed = 3, 9, 40
    if kind == "macro":
        venv = CollabVecEnv.from_id(ENV, n)
        make = lambda: MacroActionWrapper(ENV)  # noqa: E731
        actions = np.random.default_rng(0).integers(0, 5, size=(steps, n))
    else:
        venv = CollabVecEnv.from_id(ENV, n, wrapper=RerankWrapper, candidates_policy=RandomActPolicy(),
                                    num_candidates=3)
        make = lambda: RerankWrapper(ENV, RandomActPolicy(), n=3)  # noqa: E731
        actions = np.random.default_rng(0).integers(0, 3, size=(steps, n))
    venv.seed(seed)
    single = _play_single(make, [seed + i for i in range(n)], actions)
    obs = venv.reset()
    for i in range(n):
        np.testing.assert_array_equal(obs[i], single[i][0])
    pos = [1] * n
    ended = 0
    for t in range(steps):
        obs, rews, dones, infos = venv.step(actions[t])
        for i in range(n):
            row = single[i][pos[i]]
            if isinstance(row[0], str):  # "end": the finished episode's last observation, then the reset one
                _, term_obs, r, text = row
                np.testing.assert_array_equal(infos[i]["terminal_observation"], term_obs)
                assert infos[i]["text"] == text and rews[i] == r and dones[i]
                pos[i] += 1
                row = single[i][pos[i]]
                ended += 1
            else:
                assert "terminal_observation" not in infos[i]
            np.testing.assert_array_equal(obs[i], row[0])
            assert rews[i] == np.float32(row[1]) and dones[i] == row[2]
            pos[i] += 1
    assert ended >= 2  # the run crossed episode boundaries


class RowSeededUser(HiddenFactsUser):
    """The scripted user, answering a batch with one seed per row, counting its calls."""

    accepts_row_seeds = True
    batches_concurrent_calls = False  # scripted policies are not batched unless they ask

    def __init__(self):
        super().__init__()
        self.batch_sizes = []

    async def act(self, observations, **sampling):
        self.batch_sizes.append(len(observations))
        seeds = sampling.get("seeds") or [sampling.get("seed")] * len(observations)
        return [Completion(text=self.respond(o, observation_rng(o, s)), finish_reason="stop")
                for o, s in zip(observations, seeds, strict=True)]


def test_vec_env_batches_the_shared_policies():
    user = RowSeededUser()
    venv = CollabVecEnv.from_id(ENV, 4, policies={"user": user})
    shared = venv.envs[0].view.policies["user"]
    assert isinstance(shared, BatchedPolicy) and all(e.view.policies["user"] is shared for e in venv.envs)
    venv.seed(0)
    venv.reset()
    venv.step(np.full(4, ASK_NEXT))  # every env asks, so the user answers in all four at once
    assert user.batch_sizes == [4]
    # the rerank sampler: 4 envs x 3 candidates in one call per turn
    sampler = RowSeededSampler()
    venv = CollabVecEnv.from_id(ENV, 4, wrapper=RerankWrapper, candidates_policy=sampler, num_candidates=3)
    venv.seed(0)
    venv.reset()
    assert sampler.batch_sizes == [12]


class RowSeededSampler(RandomActPolicy):
    accepts_row_seeds = True
    batches_concurrent_calls = False  # scripted policies are not batched unless they ask

    def __init__(self):
        super().__init__()
        self.batch_sizes = []

    async def act(self, observations, **sampling):
        self.batch_sizes.append(len(observations))
        return [Completion(text=self.respond(o, observation_rng(o, s)), finish_reason="stop")
                for o, s in zip(observations, sampling["seeds"], strict=True)]


def test_chat_features_by_hand():
    from collab_env.types import Conversation, Message

    conv = Conversation((
        Message("system", "rules", author="env"),
        Message("user", "I have 3 cats and 12 dogs?", author="user"),
        Message("assistant", "ok", author="assistant"),
        Message("user", "And 5 birds.", author="user"),
    ))
    f = ChatFeatures(max_turns=4, max_chars=100, max_numbers=4)
    np.testing.assert_allclose(f(conv, "assistant"), [1 / 4, 2 / 4, 12 / 100, 2 / 100, 0, 3 / 4, 1 / 4], rtol=1e-6)


def test_missing_dependency_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "stable_baselines3", None)
    monkeypatch.delitem(sys.modules, "collab_env.adapters.sb3", raising=False)
    with pytest.raises(MissingDependencyError, match=r"collab_env\[sb3\]"):
        import collab_env.adapters.sb3  # noqa: F401


def test_short_ppo_run_beats_random_acts():
    from stable_baselines3 import PPO

    from collab_env.adapters.sb3 import success_rate

    def success(choose, n=40):
        return success_rate(MacroActionWrapper(ENV, split="test"), choose, n)

    venv = CollabVecEnv.from_id(ENV, 8)
    venv.seed(0)
    model = PPO("MlpPolicy", venv, n_steps=32, batch_size=64, seed=0, device="cpu")
    model.learn(1536)
    rng = np.random.default_rng(0)
    random_rate = success(lambda obs: int(rng.integers(5)))
    learned = success(lambda obs: int(model.predict(obs, deterministic=True)[0]))
    assert learned >= random_rate + 0.4, (learned, random_rate)


def test_readme_snippet_names_real_things():
    """The README section parses and uses real names (the learning claim is tested above)."""
    import ast
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    code = re.search(r"## Train with stable-baselines3\n\n.*?```python\n(.*?)```", readme, re.S).group(1)
    tree = ast.parse(code)
    names = [a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
             and node.module == "collab_env.adapters.sb3" for a in node.names]
    import collab_env.adapters.sb3 as sb3

    assert names and all(hasattr(sb3, n) for n in names)
    venv = CollabVecEnv.from_id("hidden-facts-easy", n=8, wrapper=MacroActionWrapper)
    assert venv.num_envs == 8 and venv.action_space.n == 5


def test_success_rate_counts_exactly_the_solved_episodes():
    from collab_env.adapters.sb3 import ChatFeatures, success_rate

    # Answering at once solves no hidden-facts episode (the quantities are hidden); asking for
    # everything until nothing is missing (HiddenFactsFeatures' "nothing missing" flag) and then
    # answering solves every one, with the scripted user. So the two rates are exactly 0 and 1.
    acts = [a.name for a in MacroActionWrapper(ENV).acts]
    ask_all, answer = acts.index("ask_all"), acts.index("answer")
    nothing_missing = ChatFeatures.size + 3

    def informed(obs):
        return answer if obs[nothing_missing] == 1.0 else ask_all

    assert success_rate(MacroActionWrapper(ENV, split="test"), lambda obs: answer, 5) == 0.0
    assert success_rate(MacroActionWrapper(ENV, split="test"), informed, 5) == 1.0
    with pytest.raises(ConfigError, match="no_such_component"):
        success_rate(MacroActionWrapper(ENV, split="test"), lambda obs: answer, 1, component="no_such_component")
    with pytest.raises(ConfigError, match="at least 1"):
        success_rate(MacroActionWrapper(ENV, split="test"), lambda obs: answer, 0)


# ---------------------------------------------------------------------------------------------
# team-facts (issue 13): a multi-agent id through the single-agent view of one agent; the other
# agents are the spec's scripted teammates (CoordinatedTeam), the user is the scripted user
# ---------------------------------------------------------------------------------------------
def _team_follow(obs):
    from collab_env.tasks.team import CoordinatedTeam

    return CoordinatedTeam().respond(obs, np.random.default_rng(0))


def _team_naive(obs):
    from collab_env.tasks.team import NaiveTeam

    return NaiveTeam().respond(obs, np.random.default_rng(0))


TEAM_ACTS = [
    DialogueAct("follow", "Ask your share of the facts and pass answers on.", _team_follow),
    DialogueAct("naive", "Ask the first fact you do not know yourself.", _team_naive),
    DialogueAct("wait", "Say nothing to the user.", lambda obs: "TEAM: waiting"),
]


@pytest.mark.parametrize("env_id, player", [("team-facts-easy", "agent_1"), ("team-facts-hard", "agent_2")])
def test_team_facts_wrappers_pass_check_env(env_id, player):
    check_env(MacroActionWrapper(env_id, acts=TEAM_ACTS, player=player), warn=True, skip_render_check=True)
    check_env(RerankWrapper(env_id, RandomActPolicy(), n=3, player=player), warn=True,
              skip_render_check=True)


def test_team_facts_acts_decide_the_team_outcome():
    def play(act):
        env = MacroActionWrapper("team-facts-easy", acts=TEAM_ACTS, player="agent_1")
        env.reset(seed=3)
        total, done = 0.0, False
        while not done:
            _, r, term, trunc, info = env.step(act)
            total, done = total + r, term or trunc
        return total

    assert play(0) == pytest.approx(1.0)  # the coordinated teammate: the captain answers exactly
    # never passing anything on: the captain (coordinated) never learns agent_1's facts, so the
    # team runs out of steps; agent_1 asks what the captain asks -> duplicates cost
    assert play(1) < 0.0
    assert play(2) == 0.0  # silent: no cost, and the captain cannot finish alone in 6 steps

"""JointReward (shared / per_agent / difference) and the reward processors."""

from __future__ import annotations

import math
import pickle
import warnings

import numpy as np
import pytest
from pettingzoo.test import parallel_api_test

from collab_env.errors import ConfigError, TaskFunctionError
from collab_env.rewards.joint import JointReward
from collab_env.rewards.processors import (
    Clip,
    Compose,
    RewardProcessors,
    RunningNormalizer,
    Scale,
    Shift,
)
from collab_env.tasks import from_dataset
from tests.toy_tasks import make_two_writers

ROWS = [{"prompt": "kites", "id": 0}, {"prompt": "tea", "id": 1}]


# -- module-level task functions (picklable) -------------------------------------------------
def fmt_a(item):
    return f"Briefly: {item['prompt']}"


def fmt_b(item):
    return f"In detail: {item['prompt']}"


def env_reward(a, b):
    return [7.0]


def weighted(a, b):
    # 10 * len(a) + len(b): hand-computable, and the two agents matter differently.
    return [float(10 * len(a[0]) + len(b[0]))]


def per_agent_lengths(a, b):
    return [(float(len(a[0])), float(len(b[0]) * 2))]


CALLS: list[dict] = []


def with_keywords(a, b, *, batch_items, prompts):
    CALLS.append({"a": a, "b": b, "batch_items": batch_items, "prompts": prompts})
    return [1.0]


def only_items(a, b, batch_items):
    CALLS.append({"batch_items": batch_items})
    return [1.0]


def with_kwargs(a, b, **kwargs):
    CALLS.append(dict(kwargs))
    return [1.0]


def plain(a, b):
    return [1.0]


def raises(a, b):
    raise KeyError("boom")


def two_values(a, b):
    return [1.0, 2.0]


def nan_reward(a, b):
    return [float("nan")]


def text_reward(a, b):
    return ["1.0"]


def three_per_agent(a, b):
    return [(1.0, 2.0, 3.0)]


def nan_per_agent(a, b):
    return [(1.0, float("inf"))]


def bad_processor(r):
    raise ValueError("no")


def make_base(num_turns=1, **kw):
    return from_dataset(ROWS, [fmt_a, fmt_b], env_reward, num_turns=num_turns, **kw)


def step_once(env, a="abc", b="de", index=0):
    env.reset(seed=0, options={"index": index})
    return env.step({"agent_0": a, "agent_1": b})


# -- modes -------------------------------------------------------------------------------------
def test_shared_mode_hand_computed():
    env = JointReward(make_base(), weighted)
    _, rewards, terms, _, infos = step_once(env)
    assert rewards == {"agent_0": 32.0, "agent_1": 32.0}
    assert terms == {"agent_0": True, "agent_1": True}
    comp = infos["agent_0"]["reward_components"]
    assert comp["env"] == 7.0 and comp["joint"] == 32.0 and comp["joint_processed"] == 32.0
    assert comp["reward_func"] == 7.0  # the env's own components are kept


def test_per_agent_mode_hand_computed():
    env = JointReward(make_base(), per_agent_lengths, mode="per_agent", name="len")
    _, rewards, _, _, infos = step_once(env)
    assert rewards == {"agent_0": 3.0, "agent_1": 4.0}
    assert infos["agent_1"]["reward_components"]["len"] == 4.0
    assert infos["agent_1"]["reward_components"]["env"] == 7.0


def test_difference_mode_hand_computed():
    env = JointReward(make_base(), weighted, mode="difference")
    _, rewards, _, _, infos = step_once(env)
    # r(joint) = 32; without agent_0: 0 + 2 = 2 -> 30; without agent_1: 30 + 0 = 30 -> 2.
    assert rewards == {"agent_0": 30.0, "agent_1": 2.0}
    c0 = infos["agent_0"]["reward_components"]
    assert c0["joint"] == 32.0 and c0["joint_counterfactual"] == 2.0 and c0["joint_difference"] == 30.0


def test_difference_with_default_action():
    env = JointReward(make_base(), weighted, mode="difference", default_action="x")
    _, rewards, _, _, _ = step_once(env)
    # without agent_0: 10*1 + 2 = 12 -> 20; without agent_1: 30 + 1 = 31 -> 1.
    assert rewards == {"agent_0": 20.0, "agent_1": 1.0}


def test_processor_applied_per_agent():
    env = JointReward(make_base(), weighted, mode="difference",
                      reward_processor=RewardProcessors.scale(factor=10.0))
    _, rewards, _, _, infos = step_once(env)
    assert rewards == {"agent_0": 300.0, "agent_1": 20.0}
    assert infos["agent_1"]["reward_components"]["joint_processed"] == 20.0
    assert infos["agent_1"]["reward_components"]["joint_difference"] == 2.0


def test_multi_turn_scores_every_turn():
    env = JointReward(make_base(num_turns=2), weighted)
    env.reset(seed=0, options={"index": 1})
    _, r1, t1, _, _ = env.step({"agent_0": "a", "agent_1": "bb"})
    assert r1 == {"agent_0": 12.0, "agent_1": 12.0} and not any(t1.values())
    _, r2, t2, _, _ = env.step({"agent_0": "aaa", "agent_1": ""})
    assert r2 == {"agent_0": 30.0, "agent_1": 30.0} and all(t2.values())
    assert env.agents == []


def test_turn_based_env_scores_trainable_players_only():
    env = JointReward(make_two_writers(), weighted, mode="difference")
    assert env.scored_agents == ("agent_0", "agent_1")
    env.reset(seed=0)
    _, rewards, _, _, infos = env.step({"agent_0": "abc", "agent_1": "de"})
    assert rewards["agent_0"] == 30.0 and rewards["agent_1"] == 2.0
    assert rewards["user"] == 0.0 and "joint" not in infos["user"]["reward_components"]
    assert infos["agent_0"]["reward_components"]["env"] == 3.0  # TwoWriters: own length
    assert infos["agent_0"]["reward_components"]["length"] == 3.0
    # A user step: no scored agent acted -> env rewards are kept.
    _, rewards, _, _, infos = env.step({"user": "more"})
    assert rewards == {"agent_0": 0.0, "agent_1": 0.0, "user": 0.0}
    assert "joint" not in infos["agent_0"]["reward_components"]


def test_explicit_agents_subset():
    def_env = make_two_writers()
    with pytest.raises(ConfigError):
        JointReward(def_env, weighted, agents=["agent_0", "nobody"])
    with pytest.raises(ConfigError):  # 1 agent, but the reward takes 2 lists
        JointReward(def_env, weighted, agents=["agent_0"])


# -- keyword passing ---------------------------------------------------------------------------
def test_keywords_passed_when_declared():
    CALLS.clear()
    env = JointReward(make_base(), with_keywords)
    step_once(env, index=1)
    assert CALLS == [{"a": ["abc"], "b": ["de"], "batch_items": [ROWS[1]],
                      "prompts": ["Briefly: tea", "In detail: tea"]}]


def test_only_declared_keywords_and_kwargs():
    CALLS.clear()
    step_once(JointReward(make_base(), only_items))
    assert CALLS == [{"batch_items": [ROWS[0]]}]
    CALLS.clear()
    step_once(JointReward(make_base(), with_kwargs))
    assert set(CALLS[0]) == {"batch_items", "prompts"}
    assert CALLS[0]["prompts"] == ["Briefly: kites", "In detail: kites"]


def test_keywords_in_counterfactual_calls():
    CALLS.clear()
    step_once(JointReward(make_base(), with_keywords, mode="difference"))
    assert len(CALLS) == 3
    assert [c["a"] for c in CALLS] == [["abc"], [""], ["abc"]]
    assert [c["b"] for c in CALLS] == [["de"], ["de"], [""]]
    assert all(c["batch_items"] == [ROWS[0]] for c in CALLS)


# -- errors ------------------------------------------------------------------------------------
@pytest.mark.parametrize("fn", [raises, two_values, nan_reward, text_reward])
@pytest.mark.parametrize("mode", ["shared", "difference"])
def test_reward_errors_propagate(fn, mode):
    env = JointReward(make_base(), fn, mode=mode)
    with pytest.raises(TaskFunctionError):
        step_once(env)


def test_raising_reward_keeps_cause():
    env = JointReward(make_base(), raises)
    with pytest.raises(TaskFunctionError, match="boom") as info:
        step_once(env)
    assert isinstance(info.value.__cause__, KeyError)


@pytest.mark.parametrize("fn", [plain, weighted, two_values, three_per_agent, nan_per_agent])
def test_per_agent_wrong_shape(fn):
    env = JointReward(make_base(), fn, mode="per_agent")
    with pytest.raises(TaskFunctionError):
        step_once(env)


def test_processor_errors_propagate():
    env = JointReward(make_base(), weighted, reward_processor=bad_processor)
    with pytest.raises(TaskFunctionError, match="reward_processor"):
        step_once(env)


def test_config_errors():
    base = make_base()
    with pytest.raises(ConfigError):
        JointReward(base, weighted, mode="sum")
    with pytest.raises(ConfigError):
        JointReward(base, "not callable")
    with pytest.raises(ConfigError):
        JointReward(base, weighted, reward_processor=3.0)
    with pytest.raises(ConfigError):
        JointReward(object(), weighted)
    with pytest.raises(ConfigError):
        JointReward(base, weighted, name="env")
    with pytest.raises(ConfigError):  # three lists expected, two given
        JointReward(base, lambda a, b, c: [0.0])


# -- API ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode,fn", [("shared", weighted), ("per_agent", per_agent_lengths),
                                     ("difference", weighted)])
def test_parallel_api(mode, fn):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        parallel_api_test(JointReward(make_base(num_turns=3), fn, mode=mode), num_cycles=50)


def test_delegation():
    base = make_base(render_mode="ansi")
    env = JointReward(base, weighted)
    assert not hasattr(env, "max_steps")  # no blanket __getattr__
    assert env.task is base.task
    assert env.unwrapped is base
    assert env.possible_agents == ["agent_0", "agent_1"]
    env.reset(seed=1, options={"index": 0})
    assert env.agents == ["agent_0", "agent_1"]
    assert env.observation_space("agent_0") == base.observation_space("agent_0")
    assert env.action_space("agent_1") is base.action_space("agent_1")
    assert env.state() == base.state()
    assert "kites" in env.render()
    env.close()


def test_clone_is_independent():
    norm = RunningNormalizer()
    env = JointReward(make_base(num_turns=2), weighted, reward_processor=norm)
    env.reset(seed=0, options={"index": 0})
    env.step({"agent_0": "a", "agent_1": "b"})
    twin = env.clone()
    _, r_twin, _, _, _ = twin.step({"agent_0": "aaaa", "agent_1": ""})
    assert norm.count == 2  # one step in the original: 2 agents processed
    assert twin.reward_processor.count == 4
    _, r_orig, _, _, _ = env.step({"agent_0": "aaaa", "agent_1": ""})
    assert r_orig == r_twin
    assert twin.unwrapped is not env.unwrapped


def test_wrapped_env_pickles():
    env = JointReward(make_base(), weighted, mode="difference",
                      reward_processor=RewardProcessors.scale(factor=2.0))
    step_once(env)
    env2 = pickle.loads(pickle.dumps(env))
    _, rewards, _, _, _ = step_once(env2)
    assert rewards == {"agent_0": 60.0, "agent_1": 4.0}


# -- processors ----------------------------------------------------------------------------------
def test_scale_shift_clip_compose():
    assert RewardProcessors.scale(factor=10.0)(0.25) == 2.5
    assert RewardProcessors.shift(offset=-1.0)(0.25) == -0.75
    clip = RewardProcessors.clip(low=-1.0, high=1.0)
    assert [clip(x) for x in (-3.0, 0.5, 2.0)] == [-1.0, 0.5, 1.0]
    assert RewardProcessors.clip(high=0.0)(5.0) == 0.0
    assert RewardProcessors.clip(low=0.0)(-5.0) == 0.0
    proc = RewardProcessors.compose(Scale(10.0), Shift(-2.0), Clip(-5.0, 5.0))
    assert proc(0.3) == pytest.approx(1.0)
    assert proc(0.9) == 5.0
    assert proc(-1.0) == -5.0
    assert RewardProcessors.identity()(1.5) == 1.5


def test_processors_pickle():
    procs = [Scale(2.0), Shift(1.0), Clip(0.0, 1.0), Compose(Scale(2.0), Clip(high=1.0)),
             RunningNormalizer(clip=3.0)]
    for p in procs:
        q = pickle.loads(pickle.dumps(p))
        assert type(q) is type(p)
        assert q(0.7) == p(0.7)


@pytest.mark.parametrize("make", [
    lambda: RewardProcessors.scale(factor="x"),
    lambda: RewardProcessors.scale(factor=math.inf),
    lambda: RewardProcessors.shift(offset=True),
    lambda: RewardProcessors.clip(),
    lambda: RewardProcessors.clip(low=1.0, high=0.0),
    lambda: RewardProcessors.compose(),
    lambda: RewardProcessors.compose(Scale(1.0), 3),
    lambda: RunningNormalizer(eps=0.0),
    lambda: RunningNormalizer(clip=-1.0),
])
def test_processor_config_errors(make):
    with pytest.raises(ConfigError):
        make()


SEQ = [0.5, 1.0, -2.0, 3.5, 0.0, 0.25, 10.0, -1.5]


def test_running_normalizer_matches_numpy():
    norm = RunningNormalizer(eps=1e-8)
    for k, r in enumerate(SEQ):
        out = norm(r)
        seen = np.array(SEQ[: k + 1])
        expected = (r - seen.mean()) / (seen.std() + 1e-8)
        assert out == pytest.approx(expected, rel=1e-9, abs=1e-9)
    assert norm.count == len(SEQ)
    assert norm.mean == pytest.approx(np.mean(SEQ))
    assert norm.var == pytest.approx(np.var(SEQ))
    assert norm.std == pytest.approx(np.std(SEQ))


def test_running_normalizer_clip_and_freeze():
    norm = RunningNormalizer(clip=1.0)
    outs = [norm(r) for r in SEQ]
    assert all(-1.0 <= o <= 1.0 for o in outs)
    assert outs[6] == 1.0  # 10.0 is far above the mean
    norm.freeze()
    before = norm.state_dict()
    norm(100.0)
    assert norm.state_dict() == before


def test_running_normalizer_state_round_trip():
    a = RunningNormalizer()
    for r in SEQ[:5]:
        a(r)
    state = a.state_dict()
    b = RunningNormalizer()
    b.load_state_dict(state)
    assert b.state_dict() == state
    assert [a(r) for r in SEQ[5:]] == [b(r) for r in SEQ[5:]]
    a.reset()
    assert a.state_dict() == {"count": 0, "mean": 0.0, "m2": 0.0}
    with pytest.raises(ConfigError):
        b.load_state_dict({"count": 1})
    with pytest.raises(ConfigError):
        b.load_state_dict({"count": -1, "mean": 0.0, "m2": 0.0})
    with pytest.raises(ConfigError):
        b.load_state_dict({"count": 1, "mean": 0.0, "m2": -1.0})

"""CoMLRL export: any registered env as CoMLRL's dataset, formatters, reward function and external
transition; CoMLRL's own MAGRPOTrainer trains on the exported length-ratio env (tiny model, CPU)."""

import math

import pytest

import collab_env
from collab_env.adapters.comlrl import export, render_prompt
from collab_env.errors import ConfigError
from collab_env.tasks.cooperative import brief_formatter, detailed_formatter, length_ratio_reward

PAIRS = [("Hi", "Hello"), ("Hello there", "x" * 40), ("", "anything"), ("abcd", "ab")]
# Hand-computed: ratios 2.5 (in [2, 3]), 40/11 (above), undefined (empty brief), 0.5 (below).
EXPECTED = [1.0, math.exp(-(40 / 11 - 3.0)), 0.0, math.exp(-(2.0 - 0.5))]


def _env_rewards(row, turns, env_kwargs=None):
    """collab_env's own rewards: the env reset with the row's seed and index, stepped turn by turn."""
    env = collab_env.make("length-ratio", **(env_kwargs or {}))
    env.reset(seed=row["env_seed"], options={"index": row["env_index"]})
    out = []
    for brief, detailed in turns:
        obs, rewards, *_ = env.step({"agent_0": brief, "agent_1": detailed})
        out.append(rewards["agent_0"])
    return out, env


def test_rows_and_formatters_are_the_envs_opening():
    ex = export("length-ratio")
    assert ex.num_agents == 2 and ex.agents == ("agent_0", "agent_1") and len(ex.rows) == 32
    env = collab_env.make("length-ratio")
    for row in ex.rows[:3]:
        item = env.task.get_item(row["env_index"])
        assert row["prompt"] == item["prompt"]
        # Without a tokenizer a lone prompt is its text: exactly the suite's CoMLRL formatters.
        assert ex.formatters[0](row) == brief_formatter(item)
        assert ex.formatters[1](row) == detailed_formatter(item)
        assert ex.formatters[1](row, external_prompts="next") == "next"
    ds = ex.dataset()
    assert ds[0] == ex.rows[0]


def test_exported_reward_equals_collab_envs_reward_for_the_same_items_and_completions():
    ex = export("length-ratio")
    env = collab_env.make("length-ratio")
    for row in ex.rows[:4]:
        got = ex.reward_func([b for b, _ in PAIRS], [d for _, d in PAIRS], batch_items=[row])
        item = env.task.get_item(row["env_index"])
        assert got == length_ratio_reward([b for b, _ in PAIRS], [d for _, d in PAIRS], batch_items=[item])
        assert got == [_env_rewards(row, [p])[0][0] for p in PAIRS]
        assert got == pytest.approx(EXPECTED, rel=1e-12)  # the same float operations on any CPU


def test_multi_turn_transition_and_rewards_follow_the_env():
    ex = export("length-ratio", num_turns=2)
    row = ex.rows[1]
    opening = ex.formatters[0](row)
    assert ex.reward_func(["Hi"], ["Hello"], batch_items=[row], prompts=[opening]) == [1.0]
    prompts = ex.external_transition(prompt=row["prompt"], agent_completions=["Hi", "Hello"], num_agents=2,
                                     prompt_history_per_agent=[[opening], [ex.formatters[1](row)]],
                                     response_history_per_agent=[["Hi"], ["Hello"]])
    rewards, env = _env_rewards(row, [("Hi", "Hello")], {"num_turns": 2})
    assert prompts == [render_prompt(env.observe(p).to_chat()) for p in ("agent_0", "agent_1")]
    assert "the detailed one was 2.50 times as long" in prompts[0]
    # Training passes the prompt the agents used; evaluation passes the opening prompt on every turn.
    assert ex.reward_func(["abcd"], ["ab"], batch_items=[row], prompts=[prompts[0]]) == \
        _env_rewards(row, [("Hi", "Hello"), ("abcd", "ab")], {"num_turns": 2})[0][1:]
    ex.external_transition(prompt=row["prompt"], agent_completions=["Hi", "Hello"], num_agents=2,
                           response_history_per_agent=[["Hi"], ["Hello"]])
    assert ex.reward_func(["Hello there"], ["x" * 40], batch_items=[row], prompts=[opening]) == [EXPECTED[1]]
    # That state was scored: the next call with the opening prompt starts a new tree (turn 1).
    assert ex.reward_func(["abcd"], ["ab"], batch_items=[row], prompts=[opening]) == [EXPECTED[3]]
    # The episode has two turns: a third turn scores 0.
    ex.external_transition(agent_completions=["abcd", "ab"], response_history_per_agent=[["Hi", "abcd"], ["Hello", "ab"]])
    assert ex.reward_func(["Hi"], ["Hello"], batch_items=[row]) == [0.0]


def test_a_transition_not_stepped_here_replays_the_history():
    ex, fresh = export("length-ratio", num_turns=2), export("length-ratio", num_turns=2)
    row = ex.rows[0]
    ex.reward_func(["Hi"], ["Hello"], batch_items=[row])
    fresh.reward_func(["other"], ["other"], batch_items=[row])  # a different branch was stepped there
    kw = dict(agent_completions=["Hi", "Hello"], response_history_per_agent=[["Hi"], ["Hello"]])
    assert fresh.external_transition(**kw) == ex.external_transition(**kw)


def test_hidden_facts_export_plays_the_user_through_the_driver():
    ex = export("hidden-facts", indices=[5], seed=3)
    assert ex.agents == ("assistant",) and ex.num_turns == 6
    row = ex.rows[0]
    view = collab_env.make("hidden-facts", view="assistant")
    obs, _ = view.reset(seed=3, options={"index": 5})
    assert ex.formatters[0](row) == render_prompt(obs.to_chat())
    item = view.env.episode.item
    ask, answer = "Could you tell me " + " and ".join(f["label"] for f in item["facts"]) + "?", f"\\boxed{{{item['answer']}}}"
    assert ex.reward_func([ask], batch_items=[row]) == [0.0]
    (prompt,) = ex.external_transition(agent_completions=[ask], response_history_per_agent=[[ask]])
    obs, r1, *_ = view.step(ask)
    assert prompt == render_prompt(obs.to_chat()) and r1 == 0.0
    assert all(f["sentence"] in prompt for f in item["facts"])  # the scripted user answered
    assert ex.reward_func([answer], batch_items=[row], prompts=[prompt]) == [1.0] == [view.step(answer)[1]]


def test_errors_are_clear():
    with pytest.raises(ConfigError, match="num_items"):
        export("hidden-facts")
    with pytest.raises(ConfigError, match="players"):
        export("length-ratio", players=["agent_9"])
    with pytest.raises(ConfigError, match="trained by CoMLRL"):
        export("hidden-facts", indices=[0], policies={"assistant": "x:Y"})
    ex = export("length-ratio")
    with pytest.raises(ConfigError, match="env_seed"):
        ex.reward_func(["a"], ["b"], batch_items=[{"prompt": "x"}])
    with pytest.raises(ConfigError, match="one completion list per agent"):
        ex.reward_func(["a"], batch_items=[ex.rows[0]])


def test_comlrl_magrpo_trainer_trains_on_the_exported_length_ratio(tiny_dir):
    """CoMLRL's own trainer (comlrl 1.4.3, CPU, local tiny model), two turns, one epoch of two rows.
    Every reward it receives is checked against collab_env's env replayed with the same moves."""
    torch = pytest.importorskip("torch")
    magrpo = pytest.importorskip("comlrl.trainers.reinforce.magrpo")
    from collab_env.testing.tiny_model import load_tiny_chat_model

    torch.manual_seed(0)
    tok = load_tiny_chat_model(tiny_dir)[1]
    agents = [load_tiny_chat_model(tiny_dir)[0] for _ in range(2)]
    ex = export("length-ratio", num_turns=2, tokenizer=tok, indices=[0, 1])
    events = []

    def reward_func(*completions, batch_items=None, prompts=None):
        out = ex.reward_func(*completions, batch_items=batch_items, prompts=prompts)
        events.append(("reward", batch_items[0], tuple(c[0] for c in completions), out))
        return out

    def external_transition(**kw):
        events.append(("transition", list(zip(*kw["response_history_per_agent"], strict=True))))
        return ex.external_transition(**kw)

    args = magrpo.MAGRPOConfig(num_train_epochs=1, num_agents=2, num_generations=2, max_new_tokens=6,
                               num_turns=2, early_termination_threshold=None, eval_interval=0,
                               rollout_buffer_size=1, logging_steps=1)
    trainer = magrpo.MAGRPOTrainer(agents=agents, tokenizer=tok, num_agents=2, train_dataset=ex.dataset(),
                                   eval_dataset=ex.dataset(), formatters=ex.formatters, reward_func=reward_func,
                                   external_transition=external_transition, args=args)
    before = [p.detach().clone() for a in agents for p in a.parameters()]
    trainer.train()
    after = [p.detach() for a in agents for p in a.parameters()]
    assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))
    # Per row (CoMLRL's tree, magrpo.py build_node): 2 turn-1 rewards, then per branch one
    # transition and 2 turn-2 rewards.
    kinds = [e[0] for e in events]
    assert kinds == ["reward", "reward", "transition", "reward", "reward", "transition", "reward", "reward"] * 2
    history = []
    for k, e in enumerate(events):
        if k % 8 == 0:
            history = []  # a new row's tree
        if e[0] == "transition":
            history = e[1]
            continue
        _, row, joint, out = e
        expected, _ = _env_rewards(row, [*history, joint], {"num_turns": 2})
        assert out == [expected[-1]]  # collab_env's own reward for the same moves
    # CoMLRL's evaluation (magrpo.py _evaluate_sample) passes the opening prompt on every turn.
    events.clear()
    metrics = trainer.evaluate(num_eval_samples=2)
    assert [e[0] for e in events] == ["reward", "transition", "reward"] * 2
    for k in (0, 3):
        (_, row, j1, out1), (_, hist), (_, _, j2, out2) = events[k:k + 3]
        assert hist == [j1]
        assert [out1[0], out2[0]] == _env_rewards(row, [j1, j2], {"num_turns": 2})[0]
    assert metrics["eval/turn_2/reward_mean"] == pytest.approx((events[2][3][0] + events[5][3][0]) / 2, abs=1e-12)

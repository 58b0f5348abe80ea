"""IAC and MAAC: TD/GAE targets and the clipped value loss checked by hand, masked actor loss,
a training step that moves actor and critic, what each critic reads, and the
``metrics_callback`` / ``evaluate()`` contract."""

import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from collab_env.adapters.actor_critic import (  # noqa: E402
    IACConfig,
    IACTrainer,
    MAACConfig,
    MAACTrainer,
)
from collab_env.adapters.common.critic_learner import RolloutSample, Transition  # noqa: E402
from collab_env.adapters.common.critics import (  # noqa: E402
    actor_loss,
    clipped_value_loss,
    gae,
    td_targets,
)
from collab_env.adapters.common.logging import read_jsonl  # noqa: E402
from collab_env.errors import ConfigError  # noqa: E402
from collab_env.tasks.cooperative import formatters, length_ratio_rows, reward_func  # noqa: E402


def _tiny(tiny_dir):
    from collab_env.testing.tiny_model import load_tiny_chat_model

    return load_tiny_chat_model(tiny_dir)


def _cfg(cls, tmp_path, **kw):
    base = dict(num_agents=2, max_new_tokens=4, eval_interval=0, eval_num_samples=1, logging_steps=1,
                learning_rate=1e-2, output_dir=str(tmp_path / "out"), plot=False)
    base.update(kw)
    return cls(**base)


def _trainer(cls, cfg_cls, tiny_dir, tmp_path, *, train=1, test=0, callback=None, **kw):
    model, tok = _tiny(tiny_dir)
    return cls(agent_model=model, tokenizer=tok, num_agents=2, formatters=formatters, reward_func=reward_func,
               train_dataset=length_ratio_rows("train")[:train],
               eval_dataset=length_ratio_rows("test")[:test] if test else None,
               args=_cfg(cfg_cls, tmp_path, **kw), metrics_callback=callback)


# -- the math, by hand ---------------------------------------------------------------------------

REWARDS, VALUES = [1.0, 0.0, 2.0], [0.5, 0.4, 0.3]


def test_td_targets_by_hand():
    # y_t = r_t + 0.9 * v_{t+1}, nothing after the last turn
    assert td_targets(REWARDS, VALUES, 0.9) == pytest.approx([1.0 + 0.9 * 0.4, 0.0 + 0.9 * 0.3, 2.0])
    assert td_targets(REWARDS, VALUES, 0.9, last_value=1.0) == pytest.approx([1.36, 0.27, 2.9])


def test_gae_by_hand_discount_0_9_lambda_0_95():
    # deltas: 1 + .9*.4 - .5 = .86 ; 0 + .9*.3 - .4 = -.13 ; 2 - .3 = 1.7 ; gamma*lambda = .855
    a2 = 1.7
    a1 = -0.13 + 0.855 * a2        # 1.3235
    a0 = 0.86 + 0.855 * a1         # 1.9915925
    adv, targets = gae(REWARDS, VALUES, 0.9, 0.95)
    assert adv == pytest.approx([1.9915925, 1.3235, 1.7])
    assert adv == pytest.approx([a0, a1, a2])
    assert targets == pytest.approx([a0 + 0.5, a1 + 0.4, a2 + 0.3])
    # lambda 0: the TD errors, whose targets are the TD targets
    adv0, targets0 = gae(REWARDS, VALUES, 0.9, 0.0)
    assert adv0 == pytest.approx([0.86, -0.13, 1.7])
    assert targets0 == pytest.approx(td_targets(REWARDS, VALUES, 0.9))
    # lambda 1: discounted return (2.62, 1.8, 2) minus the value
    adv1, targets1 = gae(REWARDS, VALUES, 0.9, 1.0)
    assert adv1 == pytest.approx([2.12, 1.4, 1.7]) and targets1 == pytest.approx([2.62, 1.8, 2.0])


def test_clipped_value_loss_by_hand():
    v = torch.tensor([1.0, 0.3, -0.5], requires_grad=True)
    old = torch.tensor([0.5, 0.2, 0.0])
    y = torch.tensor([0.0, 1.0, -1.0])
    loss, clipped = clipped_value_loss(v, old, y, 0.2)
    # 0: moved away from the target past the clip: the unclipped error (1.0) is the larger one
    # 1: inside the clip range: both terms equal 0.49
    # 2: moved towards the target past the clip: the clipped error (-0.2 vs -1)^2 = 0.64 wins
    assert float(loss.detach()) == pytest.approx(0.5 * (1.0 + 0.49 + 0.64))
    assert clipped.tolist() == [False, False, True]
    loss.backward()
    assert v.grad.tolist() == pytest.approx([1.0, -0.7, 0.0])   # no push past the clip
    plain, _ = clipped_value_loss(v.detach(), old, y, None)
    assert float(plain) == pytest.approx(0.5 * (1.0 + 0.49 + 0.25))


def test_actor_loss_by_hand_and_masked_tokens_get_no_gradient():
    logp = torch.tensor([[-1.0, -2.0, float("nan")], [-0.5, float("-inf"), 7.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    adv = torch.tensor([2.0, -1.0])
    loss = actor_loss(logp, adv, mask)
    assert float(loss) == pytest.approx(-(2.0 * -3.0 + -1.0 * -0.5) / 2)
    loss.backward()
    assert logp.grad.tolist() == [[-1.0, -1.0, 0.0], [0.5, 0.0, 0.0]]


def test_trainer_advantages_are_per_agent_trajectories(tiny_dir, tmp_path):
    """The trainer's bookkeeping: each agent's own rewards form its trajectory (GAE over it);
    in Q mode the advantage is Q - V and Q regresses on r + discount * V'."""
    trainer = _trainer(IACTrainer, IACConfig, tiny_dir, tmp_path, discount=0.9, gae_lambda=0.95)

    def tr(agent, turn, reward):
        return Transition(root=0, turn=turn, agent=agent, prompt_ids=[1], completion_ids=(2,), reward=reward,
                          critic_key=(0, turn, agent), critic_prefix=[1], critic_suffix=[2],
                          sample=RolloutSample(agent, "p", "c"))

    trs = [tr(a, t, r) for t in range(3) for a, r in ((0, REWARDS[t]), (1, 10.0 * REWARDS[t]))]
    v = [VALUES[t] if a == 0 else 0.0 for t in range(3) for a in (0, 1)]
    adv, v_tgt, q_tgt = trainer._advantages(trs, v, None)
    assert adv[0::2] == pytest.approx([1.9915925, 1.3235, 1.7]) and q_tgt is None
    assert v_tgt[0::2] == pytest.approx([2.4915925, 1.7235, 2.0])
    assert adv[1::2] == pytest.approx(gae([10.0, 0.0, 20.0], [0.0] * 3, 0.9, 0.95)[0])
    trainer.args.critic_type = "q"
    q = [0.7] * 6
    adv, _, q_tgt = trainer._advantages(trs, v, q)
    assert adv[0::2] == pytest.approx([0.2, 0.3, 0.4])
    assert q_tgt[0::2] == pytest.approx([1.36, 0.27, 2.0])


# -- config --------------------------------------------------------------------------------------


def test_config_validation():
    assert IACConfig().discount == 0.9 and MAACConfig().critic_placement == "separate"
    with pytest.raises(ConfigError, match="gae_lambda"):
        IACConfig(gae_lambda=1.5)
    with pytest.raises(ConfigError, match="no field 'critic_estimate'.*critic_type"):  # the former name: gone
        IACConfig(critic_estimate="q")
    with pytest.raises(ConfigError, match="critic_placement='separate'"):
        MAACConfig(critic_placement="head")
    with pytest.raises(ConfigError, match="critic_placement='head'"):  # the former meaning of critic_type
        IACConfig(critic_type="head")
    with pytest.raises(ConfigError, match="value_clip_range"):
        MAACConfig(value_clip_range=0.0)


# -- training ------------------------------------------------------------------------------------


def _params(module):
    return {n: p.detach().clone() for n, p in module.named_parameters()}


def _changed(module, before):
    return [n for n, p in module.named_parameters() if not torch.equal(p, before[n])]


@pytest.mark.parametrize("critic_placement", ["separate", "head"])
def test_iac_step_changes_actors_and_critics_multi_turn(tiny_dir, tmp_path, critic_placement):
    trainer = _trainer(IACTrainer, IACConfig, tiny_dir, tmp_path, num_turns=2, critic_placement=critic_placement,
                       critic_type="q" if critic_placement == "head" else "v")
    actors = [_params(pm.model) for pm in trainer.models]
    heads = [_params(c.head) for c in trainer.critics]
    backbones = [_params(c.backbone) for c in trainer.critics]
    assert len(trainer.critics) == 2 and trainer.critics[0].backbone is not trainer.critics[1].backbone
    out = trainer.train()
    for pm, before in zip(trainer.models, actors, strict=True):
        assert _changed(pm.model, before)
    for c, h, b in zip(trainer.critics, heads, backbones, strict=True):
        assert _changed(c.head, h) and _changed(c.backbone, b)
        assert (c.backbone is trainer.models[trainer.critics.index(c)].model) == (critic_placement == "head")
    assert trainer.state.env_step == 2  # one joint action per turn
    for key in ("turn_1/reward_mean", "turn_2/expected_return", "actor_loss", "critic_loss", "value_mean",
                "advantage_mean", "grad_norm", "critic_grad_norm"):
        assert key in out and math.isfinite(out[key]), key


def test_maac_step_changes_actors_and_the_central_critic(tiny_dir, tmp_path):
    trainer = _trainer(MAACTrainer, MAACConfig, tiny_dir, tmp_path, num_iterations=2, critic_type="q")
    assert len(trainer.critics) == 1 and trainer.critics[0].head.out_features == 2
    actors = [_params(pm.model) for pm in trainer.models]
    critic = _params(trainer.critics[0].backbone)
    out = trainer.train()
    assert all(_changed(pm.model, b) for pm, b in zip(trainer.models, actors, strict=True))
    assert _changed(trainer.critics[0].backbone, critic)
    assert {"critic_loss_last_iteration", "clip_fraction_last_iteration", "q_value_mean"} <= set(out)


# -- what the critics read -----------------------------------------------------------------------


def test_maac_critic_reads_every_agent_iac_critic_only_its_own(tiny_dir, tmp_path):
    brief, detailed = "in a brief response", "in a detailed response"
    maac = _trainer(MAACTrainer, MAACConfig, tiny_dir, tmp_path / "m", critic_type="q")
    transitions, levels = maac.collect([0])
    node = levels[0][0]
    state_text = node.env.state().render()
    assert brief in state_text and detailed in state_text
    texts = [maac.critic_text(t) for t in transitions]
    assert len(transitions) == 2 and texts[0] == texts[1]          # one global input per node
    assert texts[0].startswith(state_text)
    for t in transitions:                                          # the joint action follows it
        assert t.sample.completion in texts[0][len(state_text):]
    assert brief in texts[0] and detailed in texts[0]

    iac = _trainer(IACTrainer, IACConfig, tiny_dir, tmp_path / "i", critic_type="q")
    transitions, _ = iac.collect([0])
    own = {t.agent: iac.critic_text(t) for t in transitions}
    assert brief in own[0] and detailed not in own[0]
    assert detailed in own[1] and brief not in own[1]
    assert own[0].endswith(transitions[0].sample.completion) or transitions[0].completion_ids == ()


# -- metrics_callback and evaluate() -------------------------------------------------------------


def test_metrics_callback_contract_in_training_and_evaluation(tiny_dir, tmp_path):
    calls = []

    def metrics_callback(rollouts):
        calls.append(list(rollouts))
        if not rollouts:
            return {}
        return {"response_chars": sum(len(s.completion) for s in rollouts) / len(rollouts)}

    trainer = _trainer(IACTrainer, IACConfig, tiny_dir, tmp_path, train=1, test=3, callback=metrics_callback,
                       eval_num_samples=2, eval_batch_size=2)
    trainer.train()
    assert len(calls) == 1
    train_samples = calls[0]
    assert all(isinstance(s, RolloutSample) for s in train_samples)
    assert sorted(s.agent_idx for s in train_samples) == [0, 1]
    assert all(isinstance(s.prompt, str) and s.prompt and isinstance(s.completion, str) for s in train_samples)
    assert {"turn", "reward", "player", "item_index", "item"} <= set(train_samples[0].metadata)
    records = read_jsonl(tmp_path / "out" / "metrics.jsonl")
    assert any("response_chars" in r and "actor_loss" not in r for r in records)  # logged at rollout time

    calls.clear()
    metrics = trainer.evaluate()               # no count argument: args.eval_num_samples items
    assert len(calls) == 2                     # once per evaluation item
    per_item = [sum(len(s.completion) for s in c) / len(c) for c in calls]
    assert metrics["eval/response_chars"] == pytest.approx(sum(per_item) / 2)
    assert "eval/turn_1/reward_mean" in metrics and not any(k.startswith("eval/eval/") for k in metrics)
    trainer.args.eval_num_samples = 3
    calls.clear()
    trainer.evaluate()
    assert len(calls) == 3
    with pytest.raises(TypeError):
        trainer.evaluate(3)                    # the guide: evaluate() takes no sample count

    no_eval = _trainer(MAACTrainer, MAACConfig, tiny_dir, tmp_path / "x", callback=metrics_callback)
    assert no_eval.evaluate() == {}


def test_env_path_uses_the_envs_per_agent_rewards(tiny_dir, tmp_path):
    """length-ratio env, 2 turns: each transition's reward is the env's reward for that agent."""
    model, tok = _tiny(tiny_dir)
    trainer = IACTrainer(agent_model=model, tokenizer=tok, env="length-ratio", env_kwargs={"num_turns": 2},
                         args=_cfg(IACConfig, tmp_path, num_turns=2, max_steps=1))
    transitions, levels = trainer.collect([0])
    assert [(t.turn, t.agent) for t in transitions] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for t in transitions:
        assert t.reward == levels[t.turn][0].joint[0].rewards[t.agent]


@pytest.mark.parametrize(("cls", "cfg_cls"), [(IACTrainer, IACConfig), (MAACTrainer, MAACConfig)])
def test_iac_and_maac_train_on_an_mr_env_whose_futures_the_learner_plays(tiny_dir, tmp_path, monkeypatch, cls,
                                                                           cfg_cls):
    """The multiturn-aware reward's futures play the assistant with the model being trained: the
    rollouts hand the episode driver that model as the assistant's policy (no binding), so every
    future assistant turn is generated by it, with the learner's sampling (here
    ``max_new_tokens=3``; the reward sets no sampling of its own)."""
    import collab_env
    from collab_env.rewards.mr import MultiturnAwareReward

    model, tok = _tiny(tiny_dir)
    env = MultiturnAwareReward(collab_env.make("hidden-facts-easy"),
                               weights={"accuracy_rule": 1.0, "token_amount": -1e-2}, num_rollouts=2,
                               # window: reply, user, assistant (the future the learner plays), user;
                               # "collabllm" rolls futures of any reply (verl's rule zeroes a blank one)
                               max_user_turns=2, max_assistant_turns=3, aggregation="collabllm")
    trainer = cls(agent_model=model, tokenizer=tok, env=env,
                  args=_cfg(cfg_cls, tmp_path, num_agents=1, num_turns=1, max_steps=2, max_new_tokens=3))
    gen = trainer.models[0].generator
    futures = []  # what the model's policy generated: only the MR futures call act (the tree calls generate)
    act = gen.act

    async def counting_act(observations, **sampling):
        out = await act(observations, **sampling)
        futures.extend(out)
        return out

    monkeypatch.setattr(gen, "act", counting_act)
    before = [p.detach().clone() for p in trainer.models[0].model.parameters()]
    trainer.train()
    # 2 items x 1 reply x 2 rollouts, each with one future assistant turn (between the user's two)
    assert len(futures) == 4
    assert all(1 <= len(c.token_ids) <= 3 for c in futures)  # the learner's max_new_tokens reached them
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.models[0].model.parameters(), strict=True))
    rec = read_jsonl(tmp_path / "out" / "metrics.jsonl")[-1]
    # token_amount < 0 on every sample (the reply and the futures have tokens): a negative mean
    assert rec["turn_1/reward_mean"] < 0 and math.isfinite(rec["turn_1/reward_mean"])


def test_separate_critic_model_loads_through_the_agents_loader(tiny_dir, tmp_path):
    """critic_model= a folder: loaded by the agents' loader in float32, its own weights (not the
    actor's), and they train; a path that holds no model is a ConfigError naming critic_model."""
    model, tok = _tiny(tiny_dir)
    trainer = MAACTrainer(agent_model=model, tokenizer=tok, num_agents=2, formatters=formatters,
                          reward_func=reward_func, train_dataset=length_ratio_rows("train")[:1],
                          critic_model=str(tiny_dir), args=_cfg(MAACConfig, tmp_path, max_steps=1))
    backbone = trainer.critics[0].backbone
    assert backbone is not trainer.models[0].model
    assert {p.dtype for p in backbone.parameters()} == {torch.float32}
    before = [p.detach().clone() for p in backbone.parameters()]
    trainer.train()
    assert any(not torch.equal(a, b) for a, b in zip(before, backbone.parameters(), strict=True))
    with pytest.raises(ConfigError, match="critic_model"):
        IACTrainer(agent_model=model, tokenizer=tok, num_agents=2, formatters=formatters, reward_func=reward_func,
                   train_dataset=length_ratio_rows("train")[:1], critic_model=str(tmp_path / "no-model"),
                   args=_cfg(IACConfig, tmp_path))


# -- the scaffolding (collab_env.adapters.common.critic_learner) ---------------------------------


@pytest.mark.parametrize("share_model", [False, True])
def test_actor_batches_pack_each_models_transitions_in_micro_batches(tiny_dir, tmp_path, share_model):
    """CriticLearner.actor_batches: transitions grouped by distinct model (one per agent, or one
    shared), chunked by train_micro_batch_size, each row the transition's prompt then completion."""
    from collab_env.adapters.common.critic_learner import CriticLearner

    trainer = _trainer(IACTrainer, IACConfig, tiny_dir, tmp_path, train=2, num_turns=2, share_model=share_model,
                       train_micro_batch_size=3)
    assert isinstance(trainer, CriticLearner)
    transitions, _ = trainer.collect([0, 1])
    owners, packed = trainer.actor_batches(transitions)
    by_agent = {a: [i for i, t in enumerate(transitions) if t.agent == a] for a in (0, 1)}
    expected = {0: by_agent[0] + by_agent[1]} if share_model else by_agent
    assert {k: sorted(v) for k, v in owners.items()} == {k: sorted(v) for k, v in expected.items()}
    for owner, chunks in packed.items():
        assert [i for ch, _ in chunks for i in ch] == owners[owner]
        assert [len(ch) for ch, _ in chunks] == [len(owners[owner][s:s + 3]) for s in range(0, len(owners[owner]), 3)]
        for ch, batch in chunks:
            for row, i in enumerate(ch):
                t = transitions[i]
                ids = batch.input_ids[row][batch.attention_mask[row].bool()].tolist()
                assert ids == list(t.prompt_ids) + list(t.completion_ids)

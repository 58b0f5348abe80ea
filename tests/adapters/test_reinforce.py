"""MAREINFORCE (mean / RLOO / ReMax / no baseline): advantages and loss against hand-computed
values, the gradient of one step, ReMax's greedy rollouts, the guide's metrics and schedule."""

import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from collab_env.adapters.common.baselines import baseline_advantages  # noqa: E402
from collab_env.adapters.common.config import learner_sampling  # noqa: E402
from collab_env.adapters.common.logging import read_jsonl  # noqa: E402
from collab_env.adapters.common.losses import pack_sequences, token_logprobs  # noqa: E402
from collab_env.adapters.magrpo import MAGRPOConfig  # noqa: E402
from collab_env.adapters.reinforce import (  # noqa: E402
    MAREINFORCEConfig,
    MAREINFORCETrainer,
    MAReMaxConfig,
    MAReMaxTrainer,
    MARLOOConfig,
    MARLOOTrainer,
    reinforce_loss,
)
from collab_env.errors import ConfigError  # noqa: E402
from collab_env.tasks.cooperative import formatters, length_ratio_rows, reward_func  # noqa: E402


def _tiny(tiny_dir):
    from collab_env.testing.tiny_model import load_tiny_chat_model

    return load_tiny_chat_model(tiny_dir)


def _cfg(tmp_path, cls=MAREINFORCEConfig, **kw):
    base = dict(num_agents=1, num_generations=2, max_new_tokens=4, eval_interval=0, eval_num_samples=1,
                learning_rate=1e-2, output_dir=str(tmp_path / "out"), plot=False)
    base.update(kw)
    return cls(**base)


def one_agent_reward(completions, *, batch_items):
    return [min(len(c), 12) / 12.0 for c in completions]


def constant_reward(completions, *, batch_items):
    return [1.0] * len(completions)


def _one_agent(tiny_dir, tmp_path, reward=one_agent_reward, trainer=MAREINFORCETrainer, items=1, **kw):
    model, tok = _tiny(tiny_dir)
    return trainer(agent_model=model, tokenizer=tok, num_agents=1, formatters=[formatters[0]], reward_func=reward,
                   train_dataset=length_ratio_rows("train")[:items], eval_dataset=length_ratio_rows("test")[:1],
                   args=_cfg(tmp_path, cls=trainer.config_class, **kw))


# -- advantages and loss by hand -----------------------------------------------------------------


def test_baseline_advantages_by_hand():
    r = [1, 0, 0, 1]
    assert baseline_advantages(r, "mean") == [0.5, -0.5, -0.5, 0.5]
    assert baseline_advantages(r, "rloo") == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3])
    assert baseline_advantages(r, "remax", greedy_value=0.25) == [0.75, -0.25, -0.25, 0.75]
    assert baseline_advantages(r, "none") == [1.0, 0.0, 0.0, 1.0]
    # normalised: divided by the values' population std (0.5) + eps, whatever the baseline
    s = 0.5 + 1e-4
    assert baseline_advantages(r, "mean", normalize_std=True) == pytest.approx([0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s])
    assert baseline_advantages(r, "rloo", normalize_std=True) == pytest.approx([2 / 3 / s, -2 / 3 / s, -2 / 3 / s, 2 / 3 / s])
    assert baseline_advantages(r, "remax", greedy_value=0.25, normalize_std=True, eps=0.0) == pytest.approx(
        [1.5, -0.5, -0.5, 1.5])
    # values 1, 2, 6: mean 3; leave-one-out baselines 4, 3.5, 1.5
    assert baseline_advantages([1, 2, 6], "rloo") == pytest.approx([-3.0, -1.5, 4.5])
    assert baseline_advantages([3.0], "remax", greedy_value=1.0) == [2.0]   # ReMax needs no group
    assert baseline_advantages([0.7, 0.7], "rloo") == [0.0, 0.0]              # no signal, no gradient
    with pytest.raises(ConfigError, match="greedy_value"):
        baseline_advantages(r, "remax")
    with pytest.raises(ConfigError, match="num_generations >= 2"):
        baseline_advantages([1.0], "rloo")
    with pytest.raises(ConfigError, match="baseline must be one of"):
        baseline_advantages(r, "critic")


def test_reinforce_loss_by_hand():
    logp = torch.log(torch.tensor([[0.5, 0.25, 0.9], [0.125, 0.9, 0.9]])).requires_grad_(True)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    adv = torch.tensor([2.0, -1.0])
    l2, l4, l8 = math.log(2), math.log(4), math.log(8)
    # token: -(2 * (log .5 + log .25) - 1 * log .125) / 3 tokens = (2 * 3 log 2 - 3 log 2) / 3 = log 2
    loss, stats = reinforce_loss(logp, adv, mask, loss_type="token")
    assert loss.item() == pytest.approx((2 * (l2 + l4) - l8) / 3)
    loss.backward()
    # d loss / d logp = -A / num_tokens on real tokens, exactly 0 on padding
    assert logp.grad.flatten().tolist() == pytest.approx([-2 / 3, -2 / 3, 0.0, 1 / 3, 0.0, 0.0])
    # sequence: mean over each sequence's tokens, then over the 2 sequences
    seq, _ = reinforce_loss(logp, adv, mask, loss_type="sequence")
    assert seq.item() == pytest.approx((2 * (l2 + l4) / 2 - l8) / 2)
    # a KL term: beta * k3; the same policy as the reference adds 0, another adds > 0
    same, s = reinforce_loss(logp, adv, mask, ref_logp=logp.detach(), beta=0.5)
    assert same.item() == pytest.approx(loss.item()) and s["kl"].item() == 0.0
    other, s = reinforce_loss(logp, adv, mask, ref_logp=logp.detach() - 0.3, beta=0.5)
    k3 = math.exp(-0.3) + 0.3 - 1
    assert s["kl"].item() == pytest.approx(k3) and other.item() == pytest.approx(loss.item() + 0.5 * k3)
    assert stats["policy_loss"].item() == pytest.approx(loss.item())


def test_config_validation():
    assert MAREINFORCEConfig().baseline == "mean" and MAREINFORCEConfig().loss_type == "dapo"
    assert MARLOOConfig().baseline == "rloo" and MAReMaxConfig().baseline == "remax"
    assert MAReMaxConfig(num_generations=1).num_generations == 1        # one sample + greedy baseline
    assert MAREINFORCEConfig(baseline="none", num_generations=1).num_generations == 1
    with pytest.raises(ConfigError, match="baseline"):
        MAREINFORCEConfig(baseline="critic")
    # REINFORCE is on-policy: its config has no PPO fields (num_iterations, ratio clipping) at all
    for ppo_field in ("num_iterations", "clip_range", "clip_range_high"):
        with pytest.raises(ConfigError, match=f"has no field '{ppo_field}'"):
            MAREINFORCEConfig(**{ppo_field: 2})
    with pytest.raises(ConfigError, match="num_generations >= 2"):
        MARLOOConfig(num_generations=1)
    with pytest.raises(ConfigError, match="std"):
        MAReMaxConfig(num_generations=1, normalize_advantages=True)
    with pytest.raises(ConfigError, match="num_generations"):
        MAREINFORCEConfig(num_generations=0)


def test_trainer_argument_errors(tiny_dir, tmp_path):
    model, tok = _tiny(tiny_dir)
    kw = dict(agent_model=model, tokenizer=tok, num_agents=2, formatters=formatters, reward_func=reward_func,
              train_dataset=length_ratio_rows("train")[:1])
    with pytest.raises(ConfigError, match="MAGRPOTrainer"):
        MAREINFORCETrainer(**kw, args=MAGRPOConfig(output_dir=str(tmp_path)))
    with pytest.raises(ConfigError, match="baseline='rloo'"):
        MARLOOTrainer(**kw, args=MAREINFORCEConfig(baseline="mean", output_dir=str(tmp_path)))
    assert MAReMaxTrainer(**kw, args=None).args.baseline == "remax"


# -- training ------------------------------------------------------------------------------------


def test_one_step_is_the_hand_computed_reinforce_gradient(tiny_dir, tmp_path):
    """The update's loss is -(sum_i A_i sum_t log p) / tokens, and AdamW's first step moves every
    parameter by -lr * sign(gradient of that loss)."""
    trainer = _one_agent(tiny_dir, tmp_path, learning_rate=1e-3, max_grad_norm=None)
    pm = trainer.models[0]
    prompt = [5, 6, 7, 8]
    samples = [(prompt, (11, 12, 13), 0.75, 0), (prompt, (14,), -0.25, 0)]
    batch = pack_sequences([s[0] for s in samples], [s[1] for s in samples], pm.pad_id)
    logp = token_logprobs(pm.model, batch)
    expected = -(0.75 * logp[0, :3].sum() - 0.25 * logp[1, 0]) / 4
    pm.model.zero_grad()
    expected.backward()
    grads = {n: p.grad.clone() for n, p in pm.model.named_parameters()}
    before = {n: p.detach().clone() for n, p in pm.model.named_parameters()}
    out = trainer.update_model(pm, samples)
    assert out["loss"] == pytest.approx(expected.item(), rel=1e-5)
    moved = 0
    for n, p in pm.model.named_parameters():
        big = grads[n].abs() > 1e-4          # Adam's eps dominates below this
        delta = (p.detach() - before[n])[big]
        assert torch.allclose(delta, -1e-3 * grads[n][big].sign(), rtol=0.05, atol=1e-6), n
        moved += int(big.sum())
    assert moved > 100


@pytest.mark.parametrize("baseline", ["mean", "rloo", "remax", "none"])
def test_a_baseline_removes_a_constant_reward(tiny_dir, tmp_path, baseline):
    """Every completion earns 1: mean, RLOO and the greedy baseline give zero advantages (no
    parameter moves); plain REINFORCE still pushes up what it sampled."""
    trainer = _one_agent(tiny_dir, tmp_path, reward=constant_reward, baseline=baseline)
    before = {n: p.detach().clone() for n, p in trainer.models[0].model.named_parameters()}
    trainer.train()
    changed = [n for n, p in trainer.models[0].model.named_parameters() if not torch.equal(p, before[n])]
    assert bool(changed) == (baseline == "none"), changed[:3]


def test_two_agent_rloo_step_changes_parameters_and_logs_the_guides_metrics(tiny_dir, tmp_path):
    model, tok = _tiny(tiny_dir)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    args = _cfg(tmp_path, cls=MARLOOConfig, num_agents=2, num_turns=2, beta=0.1, eval_interval=1, plot=True)
    trainer = MARLOOTrainer(agent_model=model, tokenizer=tok, num_agents=2, formatters=formatters,
                            reward_func=reward_func, train_dataset=length_ratio_rows("train")[:1],
                            eval_dataset=length_ratio_rows("test")[:1], args=args)
    trainer.train()
    for pm in trainer.models:   # each agent trains its own copy
        assert any(not torch.equal(p, before[n]) for n, p in pm.model.named_parameters())
    assert trainer.state.env_step == 2 + 4 and trainer.state.optimizer_steps == 1
    records = read_jsonl(tmp_path / "out" / "metrics.jsonl")
    train = [r for r in records if "turn_1/reward_mean" in r][0]
    for key in ("turn_1/reward_mean", "turn_1/expected_return", "turn_2/reward_mean", "turn_2/expected_return",
                "turn_1/reference_kl_mean", "turn_2/reference_kl_penalty_mean", "reference_kl_mean",
                "loss", "policy_loss", "grad_norm", "learning_rate", "completion_length"):
        assert key in train, key
    evals = [r for r in records if "eval/turn_1/reward_mean" in r]
    assert evals and evals[0]["env_step"] == 0 and "eval/turn_2/expected_return" in evals[0]
    assert (tmp_path / "out" / "curves.png").read_bytes()[:4] == b"\x89PNG"


def test_eval_schedule_counts_training_items(tiny_dir, tmp_path):
    """eval_interval=2 over 3 items x 2 epochs: before items 0 and 2 of each epoch; evaluate()
    returns the guide's eval metrics."""
    trainer = _one_agent(tiny_dir, tmp_path, items=3, num_train_epochs=2, eval_interval=2, max_new_tokens=2)
    trainer.train()
    records = read_jsonl(tmp_path / "out" / "metrics.jsonl")
    assert [r["item"] for r in records if "eval/turn_1/reward_mean" in r] == [0, 2, 3, 5]
    assert trainer.state.optimizer_steps == 6
    metrics = trainer.evaluate(num_eval_samples=1)
    assert {"eval/turn_1/reward_mean", "eval/turn_1/expected_return"} <= set(metrics)


# -- ReMax's greedy rollouts ---------------------------------------------------------------------


def test_remax_baseline_is_the_reward_of_the_greedy_joint_action(tiny_dir, tmp_path):
    """Two agents: the baseline at the root is reward_func on both agents' temperature-0
    completions of the same prompts; the greedy rollouts count in env_step."""
    model, tok = _tiny(tiny_dir)
    item = length_ratio_rows("train")[0]
    trainer = MAReMaxTrainer(agent_model=model, tokenizer=tok, num_agents=2, formatters=formatters,
                             reward_func=reward_func, train_dataset=[item],
                             args=_cfg(tmp_path, cls=MAReMaxConfig, num_agents=2, max_new_tokens=6))
    _, levels = trainer.rollout(trainer.train_env, [0], lambda d: 2, "aligned", learner_sampling(trainer.args),
                                 trainer.task.seeds)
    greedy, steps = trainer.greedy_returns(levels)
    root = levels[0][0]
    texts = [trainer.models[i].generate([root.prompt_ids[i]], [0], temperature=0.0, max_new_tokens=6)[0].text
             for i in range(2)]
    expected = reward_func([texts[0]], [texts[1]], batch_items=[item])[0]
    assert steps == 1
    assert greedy[(id(root), 0)] == pytest.approx(expected) and greedy[(id(root), 1)] == pytest.approx(expected)
    out = trainer.train()
    assert trainer.state.env_step == 2 + 1 and "turn_1/greedy_return" in out


def test_remax_multi_turn_on_an_env_with_a_scripted_partner(tiny_dir, tmp_path):
    """length-ratio, agent_0 trained with one sample per node: each node's greedy chain runs to
    the tree's depth (turn 1: 2 steps, turn 2: 1 step) next to the sampled tree (1 + 1)."""
    model, tok = _tiny(tiny_dir)
    trainer = MAReMaxTrainer(agent_model=model, tokenizer=tok, env="length-ratio",
                             env_kwargs={"num_turns": 2}, trained_players=["agent_0"],
                             args=_cfg(tmp_path, cls=MAReMaxConfig, num_generations=1, num_turns=2, max_steps=1))
    assert set(trainer.others) == {"agent_1"}
    out = trainer.train()
    assert trainer.state.env_step == (1 + 1) + (2 + 1)
    assert math.isfinite(out["turn_1/greedy_return"]) and math.isfinite(out["turn_2/greedy_return"])

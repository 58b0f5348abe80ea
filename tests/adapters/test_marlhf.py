"""MARLHF: preferences from the task reward, a Bradley-Terry joint reward model trained on them
and frozen, an RL backend trained on its score; the reward model does not move during RL, and
evaluation scores with the task reward (not the learned one)."""


import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from collab_env.adapters.marlhf import RL_ALGORITHMS, MARLHFConfig, MARLHFTrainer  # noqa: E402
from collab_env.errors import ConfigError  # noqa: E402
from collab_env.tasks.cooperative import reward_func  # noqa: E402  (the CoMLRL guide's length-ratio reward)

ITEMS = [{"prompt": p, "target_min": 2.0, "target_max": 3.0} for p in
         ["Describe a city in the clouds.", "Invent a new holiday.", "Tell a story about dinosaurs."]]


class TaskReward:
    """The CoMLRL guide's length-ratio reward, recording every value it returns."""

    def __init__(self):
        self.values: list[float] = []

    def __call__(self, brief_completions, detailed_completions, *, batch_items):
        out = reward_func(brief_completions, detailed_completions, batch_items=batch_items)
        self.values.extend(out)
        return out


def _trainer(tiny_dir, tmp_path, task, **kw):
    from collab_env.testing.tiny_model import load_tiny_chat_model

    model, tok = load_tiny_chat_model(tiny_dir)
    base = dict(num_agents=2, preference_num_candidates=4, preference_pairs_per_sample=2, max_new_tokens=8,
                learning_rate=5e-3, reward_learning_rate=1e-3, num_generations=2, eval_interval=0,
                eval_num_samples=2, eval_batch_size=2, logging_steps=1, output_dir=str(tmp_path / "out"),
                plot=False)
    base.update(kw)
    return MARLHFTrainer(agent_model=model, tokenizer=tok, num_agents=2,
                         formatters=[lambda it: f"Brief: {it['prompt']}", lambda it: f"Detailed: {it['prompt']}"],
                         reward_func=task, train_dataset=ITEMS, eval_dataset=ITEMS[:2], args=MARLHFConfig(**base))


def test_config_choices_and_comlrl_names():
    assert MARLHFConfig(rl_algorithm="mareforce").rl_algorithm == "mareinforce"  # CoMLRL's alias
    with pytest.raises(ConfigError, match="rl_algorithm"):
        MARLHFConfig(rl_algorithm="ppo")
    with pytest.raises(ConfigError, match="critic_type"):
        MARLHFConfig(critic_type="separate")
    with pytest.raises(ConfigError, match="centralized"):
        MARLHFConfig(collaboration_mode="centralized")
    c = MARLHFConfig(preset="comlrl")
    assert (c.rl_algorithm, c.num_generations, c.reward_learning_rate, c.reward_train_batch_size,
            c.value_loss_coef) == ("magrpo", 4, 1e-5, 1, 0.6)


def test_rl_stage_leaves_the_reward_model_frozen_and_eval_uses_the_task_reward(tiny_dir, tmp_path):
    task = TaskReward()
    tr = _trainer(tiny_dir, tmp_path, task)
    pairs = tr.collect_pairs()
    # Collection: one task reward per candidate joint response (3 items x 4 candidates).
    assert len(task.values) == 3 * 4 and pairs
    rm = tr.train_reward_model(pairs)
    frozen = {n: p.detach().clone() for n, p in rm.lm.named_parameters()}
    head = {n: p.detach().clone() for n, p in rm.head.named_parameters()}
    assert all(not p.requires_grad for p in list(rm.lm.parameters()) + list(rm.head.parameters()))
    agents_before = [next(pm.model.parameters()).detach().clone() for pm in tr._unique]
    rm_scored = []
    score = rm.score
    rm.score = lambda prompts, joint, **kw: rm_scored.append(len(joint)) or score(prompts, joint, **kw)
    tr.run_rl()
    # The RL stage trained the agents on the reward model's score: one score per joint response.
    assert sum(rm_scored) == 3 * 2  # 3 items x num_generations 2
    for b, pm in zip(agents_before, tr._unique):
        assert not torch.equal(b, next(pm.model.parameters()))
    for n, p in rm.lm.named_parameters():
        assert torch.equal(p, frozen[n]), n  # bit for bit: nothing wrote into the reward model
    for n, p in rm.head.named_parameters():
        assert torch.equal(p, head[n]), n
    rm_scored.clear()
    task.values.clear()
    # Evaluation: the task reward, one joint response per item.
    out = tr.evaluate(num_eval_samples=2)
    assert rm_scored == [] and len(task.values) == 2
    assert out["eval/turn_1/reward_mean"] == pytest.approx(sum(task.values) / 2, abs=1e-12)


@pytest.mark.parametrize("algorithm", ["marloo", "iac"])
def test_other_backends_train_on_the_reward_model(tiny_dir, tmp_path, algorithm):
    assert algorithm in RL_ALGORITHMS
    task = TaskReward()
    tr = _trainer(tiny_dir, tmp_path, task, rl_algorithm=algorithm, critic_learning_rate=1e-3)
    before = [next(pm.model.parameters()).detach().clone() for pm in tr._unique]
    tr.train()
    assert type(tr.rl_trainer).__name__ == {"marloo": "MAREINFORCETrainer", "iac": "IACTrainer"}[algorithm]
    if algorithm == "iac":  # the critic settings reach the backend under their own names
        rl = tr.rl_trainer.args
        assert (rl.critic_type, rl.critic_placement, rl.critic_learning_rate) == ("v", "separate", 1e-3)
    for b, pm in zip(before, tr._unique):
        assert not torch.equal(b, next(pm.model.parameters()))
    records = tr.logger.records
    assert records[0]["preference/num_pairs"] == len(tr.pairs)
    assert any("reward_model/train_accuracy" in r for r in records)


@pytest.mark.parametrize("algorithm,separate,placement",
                         [("iac", True, "separate"), ("iac", False, "head"), ("maac", False, "separate")])
def test_the_critic_settings_reach_an_actor_critic_backend(algorithm, separate, placement):
    """IAC/MAAC take MARLHF's critic fields under their own names; ``use_separate_critic`` sets
    IAC's ``critic_placement`` (MAAC's critic is always separate)."""
    from types import SimpleNamespace

    from collab_env.adapters.actor_critic import IACConfig, MAACConfig

    a = MARLHFConfig(rl_algorithm=algorithm, use_separate_critic=separate, critic_type="q", critic_learning_rate=1e-3,
                     value_loss_coef=0.5, value_clip_range=None, num_agents=2)
    config_cls = IACConfig if algorithm == "iac" else MAACConfig
    cfg = MARLHFTrainer._backend_config(SimpleNamespace(args=a, players=("a", "b")), config_cls, {})
    assert (cfg.critic_type, cfg.critic_placement, cfg.critic_learning_rate, cfg.value_loss_coef,
            cfg.value_clip_range) == ("q", placement, 1e-3, 0.5, None)

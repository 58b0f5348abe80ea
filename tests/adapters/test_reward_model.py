"""The learned joint reward model: the Bradley-Terry loss by hand, the joint-text template, a
step that moves the weights, learning a synthetic preference on held-out pairs with the tiny
model, batched scoring and save/load, the CoMLRL reward_func contract, and one MAGRPO step
driven by the learned reward."""

import math
import random

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from collab_env.adapters.common.logging import read_jsonl  # noqa: E402
from collab_env.adapters.common.joint_reward import JointRewardModel, JointTemplate  # noqa: E402
from collab_env.adapters.reward_model import (  # noqa: E402
    RewardModelConfig,
    RewardModelTrainer,
    bradley_terry_loss,
)
from collab_env.errors import ConfigError, DataSchemaError  # noqa: E402

WORDS = ("the red box is heavy and blue ball light count then we answer how many apples are left "
         "after eat three of them").split()


def keyword_pairs(n, seed, keyword="Paris"):
    """Joint (agent 1, agent 2) responses; the chosen one has ``keyword`` somewhere in agent 2's
    answer, the rejected one is the same joint response without it."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        prompt = "Task " + " ".join(rng.choice(WORDS) for _ in range(4))
        a = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 8)))
        b = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 8)))
        words = b.split()
        words.insert(rng.randint(0, len(words)), keyword)
        out.append({"prompt": prompt, "chosen": [a, " ".join(words)], "rejected": [a, b]})
    return out


def _tiny(tiny_dir):
    from collab_env.testing.tiny_model import load_tiny_chat_model

    return load_tiny_chat_model(tiny_dir)


def _cfg(out, **kw):
    base = dict(learning_rate=3e-3, per_device_train_batch_size=8, eval_interval=0, plot=False,
                output_dir=str(out), max_length=128, eval_num_samples=64)
    base.update(kw)
    return RewardModelConfig(**base)


@pytest.fixture(scope="module")
def trained(tiny_dir, tmp_path_factory):
    """A reward model trained on 96 keyword pairs (12 steps of 8), evaluated on 64 held-out
    pairs before step 1, after step 6 and at the end."""
    model, tok = _tiny(tiny_dir)
    out = tmp_path_factory.mktemp("rm")
    trainer = RewardModelTrainer(model, keyword_pairs(96, 0), keyword_pairs(64, 1),
                                 _cfg(out, eval_interval=6), tokenizer=tok)
    trainer.train()
    evals = [r for r in read_jsonl(trainer.logger.path) if "eval/accuracy" in r]
    return trainer, evals[0], evals[-1]


# -- the math, by hand ---------------------------------------------------------------------------


def test_bradley_terry_loss_matches_hand_computed_values():
    rc = torch.tensor([1.0, 0.5, 0.0], requires_grad=True)
    rr = torch.tensor([0.0, 0.5, 1.0])
    loss = bradley_terry_loss(rc, rr)
    assert loss.tolist() == pytest.approx([math.log1p(math.exp(-1)), math.log(2), math.log1p(math.e)], abs=1e-6)
    assert loss[0].item() == pytest.approx(0.3132617, abs=1e-6)
    loss.sum().backward()  # d/dr_c -log sigmoid(r_c - r_r) = -sigmoid(r_r - r_c)
    assert rc.grad.tolist() == pytest.approx([-1 / (1 + math.e), -0.5, -math.e / (1 + math.e)], abs=1e-6)


def test_template_renders_the_documented_text():
    t = JointTemplate()
    assert t.render("Describe Paris.", ["Short.", "Long answer."]) == (
        "Task: Describe Paris.\n\nAgent 1: Short.\n\nAgent 2: Long answer.")
    assert t.render(["Be brief: X", "Be detailed: X"], ["a", "b"]) == (
        "Task for Agent 1: Be brief: X\n\nTask for Agent 2: Be detailed: X\n\nAgent 1: a\n\nAgent 2: b")
    assert t.render(["same", "same"], ["a", "b"]) == "Task: same\n\nAgent 1: a\n\nAgent 2: b"
    assert t.render("Q {x}", "one agent") == "Task: Q {x}\n\nAgent 1: one agent"  # braces in data are data
    assert t.render(None, ["a"]) == "Agent 1: a"
    with pytest.raises(ConfigError, match="completion"):
        JointTemplate(agent="Agent {index}")
    with pytest.raises(ConfigError, match="format string"):
        JointTemplate(task="Task: {prompt} {other}")
    with pytest.raises(DataSchemaError, match="one completion per agent"):
        t.render("x", [])


def test_config_and_data_errors(tiny_dir, tmp_path):
    with pytest.raises(ConfigError, match="center_rewards_coefficient"):
        RewardModelConfig(center_rewards_coefficient=-1.0)
    with pytest.raises(ConfigError, match="num_agents"):
        RewardModelConfig(num_agents=0)
    with pytest.raises(ConfigError, match="share_model"):
        RewardModelConfig(share_model=True)
    assert RewardModelConfig(template={"agent": "A{index}: {completion}"}).template.agent == "A{index}: {completion}"
    model, tok = _tiny(tiny_dir)
    with pytest.raises(DataSchemaError, match="'rejected'"):
        RewardModelTrainer(model, [{"prompt": "p", "chosen": ["a", "b"]}], args=_cfg(tmp_path), tokenizer=tok)
    with pytest.raises(DataSchemaError, match="expected 2"):
        RewardModelTrainer(model, [{"prompt": "p", "chosen": ["a", "b"], "rejected": ["c", "d"]},
                                   {"prompt": "p", "chosen": ["a"], "rejected": ["c"]}],
                           args=_cfg(tmp_path), tokenizer=tok)
    with pytest.raises(ConfigError, match="model is required"):
        RewardModelTrainer(None, keyword_pairs(2, 0), args=_cfg(tmp_path))


def test_joint_pairs_are_read_by_the_toolkit_and_the_model_files_have_one_home():
    """common.pairs.read_joint_pairs: a string is one agent's completion, num_agents=None takes the
    first row's count per row, a list prompt stays per agent; the model's file names are
    common.joint_reward's only (their former re-export from collab_env.adapters.reward_model is gone)."""
    import collab_env.adapters.reward_model as rm_mod
    from collab_env.adapters.common import joint_reward
    from collab_env.adapters.common.pairs import read_joint_pairs

    rows = [{"prompt": "p", "chosen": "good", "rejected": "bad"},
            {"prompt": ["p1", "p2"], "chosen": ["a", "b"], "rejected": ["c", "d"], "extra": 1}]
    assert read_joint_pairs(rows, "rows", None) == [("p", ["good"], ["bad"]), (["p1", "p2"], ["a", "b"], ["c", "d"])]
    assert read_joint_pairs(None, "rows", 2) == []
    with pytest.raises(DataSchemaError, match="expected 2"):
        read_joint_pairs(rows, "rows", 2)
    with pytest.raises(ConfigError, match="list of rows"):
        read_joint_pairs({"prompt": "p"}, "rows", None)
    with pytest.raises(DataSchemaError, match="rows row 0: prompt"):
        read_joint_pairs([{"prompt": 3, "chosen": "a", "rejected": "b"}], "rows", None)
    for name in ("JointTemplate", "JointRewardModel"):  # what the trainer uses
        assert getattr(rm_mod, name) is getattr(joint_reward, name)
    for name in ("HEAD_FILE", "META_FILE"):
        assert hasattr(joint_reward, name) and not hasattr(rm_mod, name)


# -- training ------------------------------------------------------------------------------------


def test_a_step_uses_the_bt_loss_and_changes_every_part_of_the_model(tiny_dir, tmp_path):
    model, tok = _tiny(tiny_dir)
    pairs = keyword_pairs(4, 3)
    trainer = RewardModelTrainer(model, pairs, args=_cfg(tmp_path, per_device_train_batch_size=2,
                                                         gradient_accumulation_steps=2), tokenizer=tok)
    rm = trainer.reward_model
    rc = rm.score([p["prompt"] for p in pairs], [p["chosen"] for p in pairs])
    rr = rm.score([p["prompt"] for p in pairs], [p["rejected"] for p in pairs])
    by_hand = sum(math.log1p(math.exp(-(c - r))) for c, r in zip(rc, rr, strict=True)) / 4
    before = {n: p.detach().clone() for n, p in rm.lm.named_parameters()}
    head_before = rm.head.weight.detach().clone()
    metrics = trainer.training_step(trainer.train_pairs)
    assert metrics["loss"] == pytest.approx(by_hand, rel=1e-4)
    assert metrics["pairs"] == 4.0
    assert not torch.equal(rm.head.weight, head_before)
    changed = [n for n, p in rm.lm.named_parameters() if not torch.equal(p, before[n])]
    assert any("layers.0" in n for n in changed) and any("embed" in n for n in changed)


def test_learns_a_keyword_preference_on_held_out_pairs(trained):
    trainer, before, after = trained
    # before: a random head has no idea (a constant reward would be exactly 0.5)
    assert after["eval/accuracy"] >= 0.9, (before, after)
    assert after["eval/accuracy"] > before["eval/accuracy"] + 0.3
    assert after["eval/loss"] < before["eval/loss"] and after["eval/loss"] < math.log(2)
    assert after["eval/margin"] > 0
    records = read_jsonl(trainer.logger.path)
    assert [r["env_step"] for r in records if "eval/accuracy" in r] == [0, 6, 12]
    assert after["eval/pairs"] == 64.0
    assert all("loss" in r and "accuracy" in r for r in records if "eval/accuracy" not in r)


def test_score_is_batched_under_no_grad_and_survives_save_and_load(trained, tmp_path):
    trainer, _, _ = trained
    rm = trainer.reward_model
    pairs = keyword_pairs(6, 7)
    prompts, joint = [p["prompt"] for p in pairs], [p["chosen"] for p in pairs]
    one_by_one = rm.score(prompts, joint, batch_size=1)
    batched = rm.score(prompts, joint, batch_size=16)
    assert batched == pytest.approx(one_by_one, abs=1e-4)
    assert all(type(x) is float for x in batched)
    assert torch.is_grad_enabled() and rm.forward_texts(["x"]).requires_grad  # score left grad mode alone
    path = trainer.save_model(tmp_path / "rm")
    loaded = JointRewardModel.from_pretrained(path, device="cpu")
    assert loaded.num_agents == 2 and loaded.template == rm.template
    assert loaded.score(prompts, joint) == pytest.approx(batched, abs=1e-5)
    with pytest.raises(DataSchemaError, match="2 completion"):
        loaded.score(["p"], [["only one"]])
    with pytest.raises(ConfigError, match="not a reward-model folder"):
        JointRewardModel.from_pretrained(tmp_path)


# -- the reward_func contract and an RL trainer using it -----------------------------------------


def test_reward_func_contract(trained):
    rm = trained[0].reward_model
    fn = rm.as_reward_func()
    item = {"prompt": "Task red box", "target_min": 2.0}
    a, b = ["the red box", "we count"], ["is heavy Paris", "is heavy"]
    out = fn(a, b, batch_items=[item])  # positional per-agent lists, one shared task item
    assert isinstance(out, list) and len(out) == 2 and all(type(x) is float for x in out)
    assert out == pytest.approx(rm.score([item["prompt"]] * 2, [[a[0], b[0]], [a[1], b[1]]]), abs=1e-6)
    assert out[0] > out[1]  # the learned preference: agent 2 says the keyword
    assert fn(a, b, batch_items=[item, item]) == pytest.approx(out, abs=1e-6)  # one item per sample
    by_prompts = rm.as_reward_func(prompt_from="prompts")(a, b, prompts=["Task red box", "Task red box"])
    assert by_prompts == pytest.approx(out, abs=1e-6)
    assert len(rm.as_reward_func(prompt_from="none")(a, b)) == 2
    with pytest.raises(ConfigError, match="aligned"):
        fn(a, b[:1], batch_items=[item])
    with pytest.raises(ConfigError, match="prompt_key"):
        fn(a, b, batch_items=[{"question": "x"}])
    with pytest.raises(DataSchemaError, match="2 completion"):
        fn(a, batch_items=[item])


def test_magrpo_trains_one_step_on_the_learned_reward(trained, tiny_dir, tmp_path, monkeypatch):
    from collab_env.adapters.magrpo import MAGRPOConfig, MAGRPOTrainer
    from collab_env.tasks.cooperative import formatters, length_ratio_rows

    rm = trained[0].reward_model
    score = rm.score
    calls = []

    def spy(prompts, joint, **kw):  # records what the trainer's reward calls score
        out = score(prompts, joint, **kw)
        calls.append((list(prompts), [list(j) for j in joint], out))
        return out

    monkeypatch.setattr(rm, "score", spy)
    model, tok = _tiny(tiny_dir)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    args = MAGRPOConfig(num_agents=2, num_generations=2, max_new_tokens=4, eval_interval=0, learning_rate=1e-2,
                        output_dir=str(tmp_path / "out"), plot=False)
    item = length_ratio_rows("train")[0]
    trainer = MAGRPOTrainer(agent_model=model, tokenizer=tok, num_agents=2, formatters=formatters,
                            reward_func=rm.as_reward_func(), train_dataset=[item], args=args)
    metrics = trainer.train()
    assert len(calls) == 2  # aligned: one call per joint action, one joint sample each
    for prompts, joint, out in calls:
        assert prompts == [item["prompt"]] and len(joint) == 1 and len(joint[0]) == 2 and len(out) == 1
        assert out == pytest.approx(score(prompts, joint), abs=1e-5)
    assert metrics["turn_1/reward_mean"] == pytest.approx(sum(c[2][0] for c in calls) / 2, abs=1e-4)
    changed = [n for pm in trainer.models for n, p in pm.model.named_parameters() if not torch.equal(p, before[n])]
    assert changed, "the MAGRPO step on the learned reward left every parameter unchanged"

"""MADPO: the factorised joint margin loss by hand and by autograd (each agent's gradient goes
through its own margin only), CoMLRL's pair selection, the centralised tags, and training on a
dataset (the CoMLRL guide's length-ratio reward) and in centralised mode on the tiny model."""

import json
import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from collab_env.adapters.madpo import (  # noqa: E402
    MADPOConfig,
    MADPOTrainer,
    madpo_losses,
    parse_tagged_joint,
    select_preference_pairs,
    tagged_joint_prompt,
)
from collab_env.errors import ConfigError  # noqa: E402
from collab_env.tasks.cooperative import (  # noqa: E402  (the CoMLRL guide's length-ratio task)
    brief_formatter,
    detailed_formatter,
    reward_func,
)


def _sig(x):
    return 1.0 / (1.0 + math.exp(-x))


# -- the math, by hand ---------------------------------------------------------------------------


def test_madpo_loss_matches_hand_computed_values():
    """beta = 0.5, margins Delta[b, i] = [[1, 2], [-1, 0]] (pair b, agent i).
    Joint logits: 0.5 * (1 + 2) = 1.5 and 0.5 * (-1 + 0) = -0.5.
    Losses: log(1 + e^-1.5) = 0.2014133, log(1 + e^0.5) = 0.9740770; mean 0.5877452 for every agent.
    d loss_0 / d Delta[0, 0] = -beta * sigmoid(-1.5) / 2 = -0.0456064
    d loss_0 / d Delta[1, 0] = -beta * sigmoid(+0.5) / 2 = -0.1556148
    d loss_0 / d Delta[:, 1] = 0 (agent 1's margin is a constant in agent 0's loss), and symmetrically.
    Float32 tolerance: a handful of ulps of values of order 1."""
    margins = torch.tensor([[1.0, 2.0], [-1.0, 0.0]], requires_grad=True)
    losses = madpo_losses(margins, 0.5)
    joint = (math.log(1 + math.exp(-1.5)) + math.log(1 + math.exp(0.5))) / 2
    assert joint == pytest.approx(0.5877452, abs=1e-7)
    assert losses.tolist() == pytest.approx([joint, joint], abs=1e-6)
    g0, = torch.autograd.grad(losses[0], margins, retain_graph=True)
    g1, = torch.autograd.grad(losses[1], margins)
    col0 = [-0.5 * _sig(-1.5) / 2, -0.5 * _sig(0.5) / 2]
    assert col0 == pytest.approx([-0.0456064, -0.1556148], abs=1e-7)
    assert g0[:, 0].tolist() == pytest.approx(col0, abs=1e-6)
    assert g0[:, 1].tolist() == [0.0, 0.0]  # exactly: no path from agent 1's margin
    assert g1[:, 1].tolist() == pytest.approx(col0, abs=1e-6)
    assert g1[:, 0].tolist() == [0.0, 0.0]
    # The sum of the agents' losses gives every agent exactly its own gradient.
    margins.grad = None
    madpo_losses(margins, 0.5).sum().backward()
    assert torch.equal(margins.grad, g0 + g1)
    with pytest.raises(ConfigError, match="beta"):
        madpo_losses(margins, 0.0)


def test_pair_selection_follows_comlrl():
    """rewards [0.2, 1.0, 0.5]: positive-gap ordered pairs (1,0) 0.8, (1,2) 0.5, (2,0) 0.3."""
    import numpy as np

    r = [0.2, 1.0, 0.5]
    assert select_preference_pairs(r, "reward_gap", 2) == [(1, 0), (1, 2)]
    assert select_preference_pairs(r, "reward_gap", None) == [(1, 0), (1, 2), (2, 0)]
    assert select_preference_pairs(r, "all", None) == [(1, 0), (1, 2), (2, 0)]  # index order
    picked = select_preference_pairs(r, "random", 2, rng=np.random.default_rng(0))
    assert len(picked) == 2 and set(picked) <= {(1, 0), (1, 2), (2, 0)}
    assert select_preference_pairs([0.3, 0.3, 0.3], "reward_gap", 4) == []  # ties prefer nothing
    with pytest.raises(ConfigError, match="rng"):
        select_preference_pairs(r, "random", 2)


def test_tagged_joint_prompt_and_parse():
    prompt = tagged_joint_prompt(["be brief", "be detailed"])
    assert "Agent 0 prompt:\nbe brief" in prompt and "<agent_1>" in prompt
    assert parse_tagged_joint("<agent_0> a </agent_0>\n<AGENT_1>b\nc</agent_1>", 2) == ["a", "b\nc"]
    assert parse_tagged_joint("<agent_1>only</agent_1>", 2) == ["", "only"]
    assert parse_tagged_joint("plain text", 2) == ["", ""]


def test_config_validation_and_comlrl_preset():
    with pytest.raises(ConfigError, match="num_turns"):
        MADPOConfig(num_turns=2)
    with pytest.raises(ConfigError, match="preference_pairs_per_sample=None"):
        MADPOConfig(pair_selection="all")
    with pytest.raises(ConfigError, match="pair_selection"):
        MADPOConfig(pair_selection="best")
    with pytest.raises(ConfigError, match="dpo_beta"):
        MADPOConfig(dpo_beta=0)
    with pytest.raises(ConfigError, match="collaboration_mode"):
        MADPOConfig(collaboration_mode="central")
    c = MADPOConfig(preset="comlrl")
    assert (c.preference_num_candidates, c.preference_pairs_per_sample, c.dpo_beta, c.num_turns,
            c.environment_steps_per_pair, c.pairs_per_update) == (80, 16, 0.1, 1, 2, 2)
    assert MADPOConfig(train_batch_size=3).pairs_per_update == 3
    assert MADPOConfig(per_device_train_batch_size=5).pairs_per_update == 5


# -- training on the tiny model ------------------------------------------------------------------

ITEMS = [{"prompt": p, "target_min": 2.0, "target_max": 3.0} for p in
         ["Describe a city in the clouds.", "Invent a new holiday.", "Tell a story about dinosaurs."]]


def _trainer(tiny_dir, tmp_path, **kw):
    from collab_env.testing.tiny_model import load_tiny_chat_model

    model, tok = load_tiny_chat_model(tiny_dir)
    base = dict(num_agents=2, preference_num_candidates=4, preference_pairs_per_sample=2, max_new_tokens=8,
                learning_rate=5e-3, train_batch_size=2, eval_interval=2, eval_num_samples=2, eval_batch_size=2,
                logging_steps=1, output_dir=str(tmp_path / "out"), plot=False)
    base.update(kw)
    return MADPOTrainer(agent_model=model, tokenizer=tok, num_agents=2,
                        formatters=[brief_formatter, detailed_formatter], reward_func=reward_func,
                        train_dataset=ITEMS, eval_dataset=ITEMS[:2], args=MADPOConfig(**base))


def test_each_agent_gets_the_gradient_of_its_own_margin_on_the_model(tiny_dir, tmp_path):
    """On real pairs: the update's single backward pass (sum of the agents' losses) leaves in
    agent 0's model exactly the gradient of -log sigmoid(beta * (Delta_0 + const)), computed on
    its own with agent 1's margin as a number; agent 1's model gets none of agent 0's loss."""
    tr = _trainer(tiny_dir, tmp_path, dpo_beta=0.7)
    pairs = tr.collect_pairs()
    assert pairs and all(p.chosen_reward > p.rejected_reward for p in pairs)
    batch = pairs[:2]
    m0, m1 = tr.models[0], tr.models[1]
    assert m0 is not m1
    # Reference: agent 0's loss alone, agent 1's margin a plain float tensor.
    with torch.no_grad():
        d1 = tr._margins(m1, 1, batch)
    m0.model.zero_grad(set_to_none=True)
    d0 = tr._margins(m0, 0, batch)
    (-torch.nn.functional.logsigmoid(0.7 * (d0 + d1))).mean().backward()
    expected = {n: p.grad.clone() for n, p in m0.model.named_parameters()}
    m0.model.zero_grad(set_to_none=True)
    m1.model.zero_grad(set_to_none=True)
    margins = torch.stack([tr._margins(m0, 0, batch), tr._margins(m1, 1, batch)], -1)
    madpo_losses(margins, 0.7).sum().backward()
    for n, p in m0.model.named_parameters():
        # The same float32 operations in the same order: equal up to summation-order noise.
        assert torch.allclose(p.grad, expected[n], rtol=1e-5, atol=1e-7), n
    # Agent 1's model: its gradient is that of its own loss only (zero if it had no margin path).
    g1 = {n: p.grad.clone() for n, p in m1.model.named_parameters()}
    m1.model.zero_grad(set_to_none=True)
    with torch.no_grad():
        d0c = tr._margins(m0, 0, batch)
    (-torch.nn.functional.logsigmoid(0.7 * (d0c + tr._margins(m1, 1, batch)))).mean().backward()
    for n, p in m1.model.named_parameters():
        assert torch.allclose(p.grad, g1[n], rtol=1e-5, atol=1e-7), n


def test_train_on_a_dataset_logs_and_moves_both_agents(tiny_dir, tmp_path):
    tr = _trainer(tiny_dir, tmp_path, num_train_epochs=2)
    before = [next(pm.model.parameters()).detach().clone() for pm in tr._unique]
    last = tr.train()
    n = len(tr.pairs)
    assert n > 0 and last["dpo/num_pairs"] >= 1
    updates = 2 * math.ceil(n / 2)
    assert tr.state.optimizer_steps == updates
    assert tr.state.env_step == 2 * 2 * n  # environment_steps_per_pair * pairs, per epoch
    for b, pm in zip(before, tr._unique):
        assert not torch.equal(b, next(pm.model.parameters()))
    records = [json.loads(x) for x in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert records[0]["preference/num_pairs"] == n
    assert sum("eval/turn_1/reward_mean" in r for r in records) == math.ceil(updates / 2)  # before updates 0, 2, ...
    assert any("dpo/loss" in r for r in records)
    # The joint loss of the first logged update is -log sigmoid(beta * sum Delta) at the initial policy.
    first = next(r for r in records if "dpo/loss" in r)
    assert 0.0 < first["dpo/loss"] < 5.0
    assert "eval/turn_1/reward_mean" in tr.evaluate(num_eval_samples=2)


def test_centralized_mode_trains_one_policy_on_the_joint_text(tiny_dir, tmp_path):
    """One model writes both parts; the tags are parsed and the task reward scores the parts. The
    tiny random model never writes tags, so its sampler is replaced by a scripted one that writes
    a good and a bad tagged answer (as CoMLRL's own test does)."""
    from collab_env.types import Completion

    tr = _trainer(tiny_dir, tmp_path, collaboration_mode="centralized", eval_interval=0)
    assert len(tr._unique) == 1 and tr.models[0] is tr.models[1]
    pm = tr.models[0]
    tok = pm.tokenizer
    good = "<agent_0>Hi.</agent_0><agent_1>Hello there.</agent_1>"  # ratio 12/3 = 4: reward e^-1
    better = "<agent_0>Hi there.</agent_0><agent_1>Hello, my friend.</agent_1>"  # 17/9 -> e^-(2-1.89)
    prompts_seen = []

    def scripted(prompts, seeds, **sampling):
        prompts_seen.extend(prompts)
        texts = [better if k % 2 == 0 else good for k in range(len(prompts))]
        return [Completion(text=t, token_ids=tuple(tok(t, add_special_tokens=False)["input_ids"])) for t in texts]

    pm.generate = scripted
    before = next(pm.model.parameters()).detach().clone()
    tr.train()
    assert prompts_seen and "Agent 0 prompt:" in tok.decode(prompts_seen[0])
    # 4 candidates (better, good, better, good): 4 pairs of equal gap, the first 2 kept per item.
    assert len(tr.pairs) == 2 * len(ITEMS) and all(p.chosen == ["Hi there.", "Hello, my friend."] for p in tr.pairs)
    assert tr.pairs[0].chosen_reward == pytest.approx(math.exp(-(2 - 17 / 9)), abs=1e-12)
    assert tr.pairs[0].rejected_reward == pytest.approx(math.exp(-1), abs=1e-12)
    assert len(tr.pairs[0].prompt_ids) == 1  # one actor: the loss is DPO on the joint text
    assert not torch.equal(before, next(pm.model.parameters()))
    out = tr.evaluate(num_eval_samples=2)
    assert out["eval/parsed_fraction"] == 1.0
    # Eval batch of 2 items: the script writes "better" for the first, "good" for the second.
    assert out["eval/turn_1/reward_mean"] == pytest.approx((math.exp(-(2 - 17 / 9)) + math.exp(-1)) / 2, abs=1e-12)

"""The loss menu of the tree learners (MAGRPO): the aggregations (GRPO, BNPO, Dr. GRPO, DAPO,
CoMLRL's sum), the objectives (PPO's clip with DAPO's clip-higher and the two-sided clip, CISPO,
GSPO's sequence ratio), the importance sampling against the sampler (TIS / masked IS) and DAPO's
dynamic sampling: each against values written out by hand from the papers' formulas, the
exact accumulation over micro-batches, and one MAGRPO step with two agents per option."""

import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from collab_env.adapters.common.losses import (  # noqa: E402
    aggregation_plan,
    clipped_surrogate,
    importance_weights,
    masked_aggregate,
    pack_sequences,
    policy_loss,
    token_logprobs,
)
from collab_env.adapters.common.tree_learner import policy_update  # noqa: E402
from collab_env.adapters.magrpo import MAGRPOConfig, MAGRPOTrainer  # noqa: E402
from collab_env.errors import ConfigError  # noqa: E402
from collab_env.tasks.cooperative import formatters, length_ratio_rows  # noqa: E402

# -- aggregations ----------------------------------------------------------------------------------

# Three sequences of 2, 1 and 3 loss tokens; the padding holds garbage (99) that must not count.
PER_TOKEN = [[1.0, 2.0, 99.0], [4.0, 99.0, 99.0], [3.0, -1.0, 5.0]]
MASK = [[1, 1, 0], [1, 0, 0], [1, 1, 1]]
# Summed loss per sequence L = [3, 4, 7], tokens n = [2, 1, 3], N = 3 sequences, T = 6 tokens.
BY_HAND = {
    "grpo": (3 / 2 + 4 / 1 + 7 / 3) / 3,
    "dapo": (3 + 4 + 7) / 6,
    "sum": (3 + 4 + 7) / 3,
    "dr_grpo": (3 + 4 + 7) / (3 * 5),                # max_new_tokens = 5
    # micro-batches [seq 0] (2 tokens) and [seq 1, seq 2] (4 tokens): the mean of their token means
    "bnpo": (3 / 2 + (4 + 7) / 4) / 2,
}


def _shares(loss_type, split):
    """The summed micro-batch shares of ``PER_TOKEN`` cut into micro-batches of ``split`` rows."""
    per_token, mask = torch.tensor(PER_TOKEN), torch.tensor(MASK)
    rows, start = [], 0
    for size in split:
        rows.append((per_token[start:start + size], mask[start:start + size]))
        start += size
    plan = aggregation_plan(loss_type, [int(m.sum()) for _, m in rows], [len(m) for _, m in rows], max_new_tokens=5)
    return sum(masked_aggregate(p, m, *step).item() for (p, m), step in zip(rows, plan, strict=True))


@pytest.mark.parametrize("loss_type", sorted(BY_HAND))
def test_every_aggregation_by_hand_and_exact_over_micro_batches(loss_type):
    assert _shares(loss_type, [1, 2]) == pytest.approx(BY_HAND[loss_type])
    if loss_type != "bnpo":  # accumulation is exact: any cut gives the one-batch loss
        assert _shares(loss_type, [3]) == pytest.approx(BY_HAND[loss_type])
        assert _shares(loss_type, [1, 1, 1]) == pytest.approx(BY_HAND[loss_type])


def test_bnpo_is_token_mean_in_one_micro_batch_and_grpo_with_one_sequence_each():
    assert BY_HAND["bnpo"] != pytest.approx(BY_HAND["dapo"])     # unequal micro-batches: they differ
    assert _shares("bnpo", [3]) == pytest.approx((3 + 4 + 7) / 6)
    assert _shares("bnpo", [1, 1, 1]) == pytest.approx((3 / 2 + 4 / 1 + 7 / 3) / 3)


def test_aggregation_errors_name_the_fix():
    with pytest.raises(ConfigError, match="max_new_tokens"):
        aggregation_plan("dr_grpo", [3], [1])
    with pytest.raises(ConfigError, match="dr_grpo"):
        aggregation_plan("luspo", [3], [1])
    with pytest.raises(ConfigError, match="aggregation_plan"):
        masked_aggregate(torch.ones(1, 1), torch.ones(1, 1), "dapo", 1, 1)


# -- objectives ------------------------------------------------------------------------------------


def test_dapo_clip_higher_and_the_two_sided_clip_by_hand():
    logp = torch.log(torch.tensor([[1.25, 1.5, 0.7, 5.0]]))
    old, mask = torch.zeros(1, 4), torch.ones(1, 4)
    loss, active = clipped_surrogate(logp, old, torch.tensor([1.0]), mask, clip_low=0.2, clip_high=0.28)
    # A = 1: -min(r, clip(r, 0.8, 1.28))
    assert loss[0].tolist() == pytest.approx([-1.25, -1.28, -0.7, -1.28])
    assert active[0].tolist() == [False, True, False, True]
    symmetric, _ = clipped_surrogate(logp, old, torch.tensor([1.0]), mask, clip_low=0.2)
    assert symmetric[0, 0].item() == pytest.approx(-1.2)            # clip-higher lets 1.25 through
    # A = -1, delta = 4: -min(min(r, 4) * -1, clip(r) * -1) = max(min(r, 4), clip(r))
    neg, active = clipped_surrogate(logp, old, torch.tensor([-1.0]), mask, clip_low=0.2, clip_high=0.28, delta=4.0)
    assert neg[0].tolist() == pytest.approx([1.25, 1.5, 0.8, 4.0])
    assert active[0].tolist() == [False, False, True, True]
    plain, _ = clipped_surrogate(logp, old, torch.tensor([-1.0]), mask, clip_low=0.2, clip_high=0.28)
    assert plain[0, 3].item() == pytest.approx(5.0)                 # no delta: unbounded


def test_cispo_value_and_stop_gradient_by_hand():
    logp = torch.tensor([[-1.0, -2.0, -7e4]], requires_grad=True)   # the last is padding
    old = torch.tensor([[-1.5, -1.8, 0.0]])
    mask = torch.tensor([[1, 1, 0]])
    loss, stats = policy_loss(logp, old, torch.tensor([2.0]), mask, objective="cispo", clip_high=0.2,
                              loss_type="token")
    w0 = min(math.exp(0.5), 1.2)            # 1.6487 capped at 1 + 0.2
    w1 = min(math.exp(-0.2), 1.2)           # 0.8187 kept
    # -sg(w) * A * log p, token mean over 2 tokens
    assert loss.item() == pytest.approx((-w0 * 2 * -1.0 + -w1 * 2 * -2.0) / 2, rel=1e-6)
    assert stats["clip_fraction"].item() == pytest.approx(0.5)
    loss.backward()
    # d/dlogp = -w * A / 2: the weight is a constant (stop-gradient), so no d(ratio)/dlogp term
    assert logp.grad[0].tolist() == pytest.approx([-w0 * 2 / 2, -w1 * 2 / 2, 0.0], rel=1e-6)


def test_gspo_sequence_ratio_value_and_gradient_by_hand():
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -9e4], [-1.0, -1.0]], requires_grad=True)
    old = torch.tensor([[-1.05, -2.15], [-0.5, 0.0], [-1.5, -1.5]])
    mask = torch.tensor([[1, 1], [1, 0], [1, 1]])
    adv = torch.tensor([1.0, -1.0, 1.0])
    loss, stats = policy_loss(logp, old, adv, mask, level="sequence", clip_low=0.2, loss_type="sequence")
    s0 = math.exp((0.05 + 0.15) / 2)        # 1.105: inside [0.8, 1.2]
    s1 = math.exp(0.0)                      # 1
    s2 = math.exp((0.5 + 0.5) / 2)          # 1.649: clipped at 1.2 (A > 0)
    assert s2 > 1.2
    seq_losses = [-s0 * 1.0, -(s1 * -1.0), -1.2 * 1.0]
    assert loss.item() == pytest.approx(sum(seq_losses) / 3, rel=1e-6)
    assert stats["clip_fraction"].item() == pytest.approx(2 / 5)     # sequence 2's two tokens of 5
    loss.backward()
    # d(-s A)/dlogp_t = -A s / n_i (the ratio is the mean over the sequence's n_i tokens), over N = 3
    assert logp.grad[0].tolist() == pytest.approx([-s0 / 2 / 3, -s0 / 2 / 3], rel=1e-6)
    assert logp.grad[1].tolist() == pytest.approx([s1 / 1 / 3, 0.0], rel=1e-6)
    assert logp.grad[2].tolist() == pytest.approx([0.0, 0.0])        # clipped: no gradient
    # per token, sequence 0's tokens would see different ratios: the levels differ
    token_loss, _ = policy_loss(logp.detach(), old, adv, mask, level="token", loss_type="sequence")
    assert token_loss.item() != pytest.approx(loss.item())


def test_padding_contributes_exactly_zero_to_every_option():
    logp = torch.tensor([[-0.5, -1.0, -1e4], [-0.2, -3e4, -5e4]], requires_grad=True)
    old = torch.tensor([[-0.4, -1.2, 0.0], [-0.3, 0.0, 0.0]])
    ref = torch.tensor([[-0.6, -0.9, 0.0], [-0.1, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    w = torch.tensor([[0.5, 2.0, 1e9], [1.5, float("nan"), 1e9]])
    w = torch.where(mask.bool(), w, torch.zeros_like(w))
    for objective in ("clip", "cispo"):
        for level in ("token", "sequence"):
            for loss_type in ("sequence", "token"):
                logp.grad = None
                loss, _ = policy_loss(logp, old, torch.tensor([1.0, -0.5]), mask, ref_logp=ref, beta=0.3,
                                      objective=objective, level=level, loss_type=loss_type, is_weight=w,
                                      delta=4.0 if objective == "clip" else None)
                loss.backward()
                assert torch.isfinite(loss)
                assert torch.all(logp.grad[mask == 0] == 0.0), (objective, level, loss_type)
                assert torch.all(logp.grad[mask == 1] != 0.0), (objective, level, loss_type)


# -- importance sampling against the sampler ---------------------------------------------------------


def test_importance_weights_truncate_and_mask_by_hand():
    old = torch.tensor([[-1.0, -2.0, 0.0]])
    sampler = torch.tensor([[-1.5, -0.5, 5.0]])      # padding garbage in the last column
    mask = torch.tensor([[1, 1, 0]])
    r0, r1 = math.exp(0.5), math.exp(-1.5)          # 1.649, 0.223
    w, st = importance_weights(old, sampler, mask, "token_truncate", cap=1.5)
    assert w[0].tolist() == pytest.approx([1.5, r1, 0.0])
    assert st == pytest.approx({"is_ratio_sum": r0 + r1, "is_ratio_max": r0, "is_clipped": 1.0, "is_units": 2.0})
    w, _ = importance_weights(old, sampler, mask, "token_truncate", cap=1.5, floor=0.5)
    assert w[0].tolist() == pytest.approx([1.5, 0.5, 0.0])
    w, st = importance_weights(old, sampler, mask, "token_mask", cap=1.5, floor=0.5)
    assert w[0].tolist() == [0.0, 0.0, 0.0] and st["is_clipped"] == 2.0
    w, _ = importance_weights(old, sampler, mask, "token_mask", cap=3.0)
    assert w[0].tolist() == pytest.approx([r0, r1, 0.0])
    seq = math.exp(0.5 - 1.5)                       # one ratio: the sum of the log-ratios
    w, st = importance_weights(old, sampler, mask, "sequence_truncate", cap=3.0, floor=0.5)
    assert w[0].tolist() == pytest.approx([0.5, 0.5, 0.0])
    assert st == pytest.approx({"is_ratio_sum": seq, "is_ratio_max": seq, "is_clipped": 1.0, "is_units": 1.0})
    w, _ = importance_weights(old, sampler, mask, "sequence_mask", cap=3.0)
    assert w[0].tolist() == pytest.approx([seq, seq, 0.0])
    w, _ = importance_weights(old, sampler, mask, "sequence_mask", cap=3.0, floor=0.5)
    assert w[0].tolist() == [0.0, 0.0, 0.0]
    with pytest.raises(ConfigError, match="bound"):
        importance_weights(old, sampler, mask, "token_truncate", cap=None)


def test_is_weight_scales_the_policy_term_not_the_kl():
    logp = torch.log(torch.tensor([[0.5, 0.5]]))
    ref = torch.log(torch.tensor([[0.25, 0.5]]))
    w = torch.tensor([[2.0, 0.0]])
    loss, stats = policy_loss(logp, logp, torch.tensor([1.0]), torch.ones(1, 2), ref_logp=ref, beta=0.1,
                              is_weight=w, loss_type="token")
    kl = ((0.5 + math.log(2) - 1) + 0.0) / 2          # k3 of the two tokens, token mean
    assert stats["policy_loss"].item() == pytest.approx((-1.0 * 2.0 + -1.0 * 0.0) / 2)
    assert loss.item() == pytest.approx(-1.0 + 0.1 * kl)


# -- policy_update with the sampler's log-probs ---------------------------------------------------------


def _tiny(tiny_dir):
    from collab_env.testing.tiny_model import load_tiny_chat_model

    return load_tiny_chat_model(tiny_dir)


def varied_reward(brief, detailed, *, batch_items):
    """Distinct values for distinct lengths: groups rarely tie."""
    return [len(b) + 0.37 * len(d) for b, d in zip(brief, detailed, strict=True)]


def tied_reward(brief, detailed, *, batch_items):
    return [1.0] * len(brief)


def _cfg(tmp_path, **kw):
    base = dict(num_agents=2, num_generations=2, max_new_tokens=4, eval_interval=0, eval_num_samples=1,
                learning_rate=1e-2, output_dir=str(tmp_path / "out"), plot=False)
    base.update(kw)
    return MAGRPOConfig(**base)


def _trainer(tiny_dir, tmp_path, reward=varied_reward, **kw):
    model, tok = _tiny(tiny_dir)
    return MAGRPOTrainer(agent_model=model, tokenizer=tok, num_agents=2, formatters=formatters, reward_func=reward,
                         train_dataset=length_ratio_rows("train")[:1], args=_cfg(tmp_path, **kw))


def test_policy_update_weighs_by_the_proximal_over_the_sampler_ratio(tiny_dir, tmp_path):
    """The hook gets ``old_logp`` from the model before the update (not ``logp.detach()``) and
    ``is_weight = min(exp(old_logp - sampler_logp), cap)``; the stats report the raw ratio."""
    trainer = _trainer(tiny_dir, tmp_path)
    pm = trainer.models[0]
    prompt = [5, 6, 7, 8]
    comps = [(11, 12, 13), (14,)]
    batch = pack_sequences([prompt, prompt], list(comps), pm.pad_id)
    pm.model.eval()
    with torch.no_grad():
        before = token_logprobs(pm.model, batch)
    # the sampler gave the first sequence's tokens log-probs 1 lower (ratio e, truncated at 2),
    # the second's 0.1 higher (ratio e^-0.1)
    samples = [(prompt, comps[0], 1.0, 0, tuple((before[0, :3] - 1.0).tolist())),
               (prompt, comps[1], -1.0, 0, tuple((before[1, :1] + 0.1).tolist()))]
    calls = []

    def hook(logp, old_logp, advantages, mask, **kw):
        calls.append(dict(old=old_logp.clone(), weight=kw["is_weight"].clone(), logp=logp.detach().clone()))
        return policy_loss(logp, old_logp, advantages, mask, **kw)

    out = policy_update(pm, samples, hook, iterations=2, is_correction="token_truncate", is_cap=2.0)
    m = batch.completion_mask.bool()
    assert len(calls) == 2                                  # one micro-batch, two iterations
    assert not torch.allclose(calls[1]["logp"][m], before[m], atol=1e-4)   # the model moved...
    for seen in calls:                                      # ...the proximal policy and the weights did not
        assert torch.allclose(seen["old"][m], before[m], atol=1e-5)
        assert seen["weight"][0, :3].tolist() == pytest.approx([2.0] * 3, rel=1e-5)
        assert seen["weight"][1, 0].item() == pytest.approx(math.exp(-0.1), rel=1e-4)
        assert torch.all(seen["weight"][~m] == 0.0)
    assert out["is_ratio_mean"] == pytest.approx((3 * math.e + math.exp(-0.1)) / 4, rel=1e-4)
    assert out["is_ratio_max"] == pytest.approx(math.e, rel=1e-4)
    assert out["is_clipped_fraction"] == pytest.approx(3 / 4)
    # 4-tuples train without the correction; with it, the missing log-probs are an error
    policy_update(pm, [s[:4] for s in samples], trainer.loss)
    with pytest.raises(ConfigError, match="sampler's log-probs"):
        policy_update(pm, [samples[0][:4] + (None,)], trainer.loss, is_correction="sequence_mask")


# -- MAGRPO with two agents ------------------------------------------------------------------------


OPTIONS = {
    "grpo": dict(loss_type="grpo"),
    "bnpo": dict(loss_type="bnpo", train_micro_batch_size=1),
    "dr_grpo": dict(loss_type="dr_grpo"),
    "dapo": dict(loss_type="dapo", clip_range=0.2, clip_range_high=0.28, num_iterations=2),
    "cispo": dict(policy_objective="cispo", clip_range_high=4.0, loss_type="dapo", num_iterations=2),
    "gspo": dict(importance_sampling_level="sequence", clip_range=3e-4, clip_range_high=4e-4, loss_type="grpo",
                 num_iterations=2),
    "luspo": dict(importance_sampling_level="sequence", loss_type="sum", num_iterations=2),
    "two_sided": dict(clip_delta=4.0, num_iterations=2, beta=0.05),
    "token_truncate": dict(is_correction="token_truncate"),
    "sequence_mask": dict(is_correction="sequence_mask", is_floor=0.5, num_iterations=2),
    "dynamic_sampling": dict(dynamic_sampling=True),
}


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_magrpo_two_agents_train_one_step_with_each_option(tiny_dir, tmp_path, name):
    trainer = _trainer(tiny_dir, tmp_path, **OPTIONS[name])
    before = [{n: p.detach().clone() for n, p in pm.model.named_parameters()} for pm in trainer.models]
    metrics = trainer.train_step([0])
    assert math.isfinite(metrics["loss"]) and math.isfinite(metrics["grad_norm"])
    for pm, old in zip(trainer.models, before, strict=True):   # each agent's model took its step
        assert any(not torch.equal(p, old[n]) for n, p in pm.model.named_parameters()), name
    if "is_correction" in OPTIONS[name]:
        # the sampler is the model itself (transformers, temperature 1): ratios of 1 up to rounding
        assert metrics["is_ratio_mean"] == pytest.approx(1.0, abs=1e-3)
        assert metrics["is_clipped_fraction"] == 0.0
    if name == "dynamic_sampling":
        assert metrics["groups_filtered"] == 0.0


def test_samples_carry_the_samplers_logprobs(tiny_dir, tmp_path):
    from collab_env.adapters.common.config import learner_sampling

    trainer = _trainer(tiny_dir, tmp_path)
    a = trainer.args
    _, levels = trainer.rollout(trainer.train_env, [0], lambda d: 2, "aligned", learner_sampling(a), trainer.task.seeds)
    groups, _ = trainer.node_groups(levels, lambda node, agent, values: [0.0] * len(values))
    assert [agent for agent, _ in groups] == [0, 1]
    for _, group in groups:
        for _prompt, comp, _adv, turn, logprobs in group:
            assert turn == 0
            assert logprobs is not None and len(logprobs) == len(comp) and all(lp <= 0.0 for lp in logprobs)


def test_dynamic_sampling_drops_tied_groups_and_skips_an_empty_update(tiny_dir, tmp_path):
    trainer = _trainer(tiny_dir, tmp_path, reward=tied_reward, dynamic_sampling=True)
    before = [{n: p.detach().clone() for n, p in pm.model.named_parameters()} for pm in trainer.models]
    metrics = trainer.train_step([0])
    assert metrics["groups_filtered"] == 2.0                      # one node, two agents, all tied
    assert "loss" not in metrics and trainer.state.optimizer_steps == 0
    for pm, old in zip(trainer.models, before, strict=True):
        assert all(torch.equal(p, old[n]) for n, p in pm.model.named_parameters())
    off = _trainer(tiny_dir, tmp_path, reward=tied_reward)         # default: no filter, a step on zeros
    metrics = off.train_step([0])
    assert "groups_filtered" not in metrics and off.state.optimizer_steps == 1


# -- configuration ---------------------------------------------------------------------------------


def test_config_accepts_trls_names_and_rejects_bad_combinations():
    for loss_type in ("grpo", "bnpo", "dr_grpo", "dapo", "sum"):
        assert MAGRPOConfig(loss_type=loss_type).loss_type == loss_type
    assert MAGRPOConfig().loss_type == "grpo"
    for former in ("sequence", "token"):  # one name per aggregation: the former names are gone
        with pytest.raises(ConfigError, match="loss_type must be one of"):
            MAGRPOConfig(loss_type=former)
    cfg = MAGRPOConfig()
    assert (cfg.policy_objective, cfg.importance_sampling_level, cfg.clip_delta, cfg.is_correction,
            cfg.dynamic_sampling) == ("clip", "token", None, None, False)
    with pytest.raises(ConfigError, match="loss_type must be one of"):
        MAGRPOConfig(loss_type="luspo")
    with pytest.raises(ConfigError, match="CISPO has no such term"):
        MAGRPOConfig(policy_objective="cispo", clip_delta=4.0)
    with pytest.raises(ConfigError, match="clip_delta must be above 1 \\+ clip_range_high = 1.28"):
        MAGRPOConfig(clip_range_high=0.28, clip_delta=1.2)
    with pytest.raises(ConfigError, match="is_floor .* below is_cap"):
        MAGRPOConfig(is_correction="token_mask", is_floor=3.0, is_cap=2.0)
    with pytest.raises(ConfigError, match="needs a bound"):
        MAGRPOConfig(is_correction="token_truncate", is_cap=None)
    with pytest.raises(ConfigError, match="is_correction must be one of"):
        MAGRPOConfig(is_correction="token")
    with pytest.raises(ConfigError, match="importance_sampling_level"):
        MAGRPOConfig(importance_sampling_level="seq")
    with pytest.raises(ConfigError, match="policy_objective"):
        MAGRPOConfig(policy_objective="sapo")
    with pytest.raises(ConfigError, match="dynamic_sampling"):
        MAGRPOConfig(dynamic_sampling=1)

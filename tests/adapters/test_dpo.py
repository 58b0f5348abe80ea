"""DPO: the loss against values computed by hand (with a reference and reference-free), the
pair selection rule, exact pair encoding and log-probs on the tiny model, offline training on
CollabLLM pairs, one DPO per agent, and online DPO whose pairs are ranked by the env's reward."""

import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import collab_env  # noqa: E402
from collab_env.adapters.common.pairs import pair_logps  # noqa: E402
from collab_env.adapters.common.preference import dpo_loss, select_pair  # noqa: E402
from collab_env.adapters.dpo import (  # noqa: E402
    DPOConfig,
    DPOTrainer,
    OnlineDPOConfig,
    OnlineDPOTrainer,
)
from collab_env.adapters.common.pairs import encode_pair  # noqa: E402
from collab_env.adapters.common.chat import chat_ids  # noqa: E402
from collab_env.errors import ConfigError, DataSchemaError  # noqa: E402

PROMPT = [
    {"role": "user", "content": "I need the capital of a country."},
    {"role": "assistant", "content": "Which country?"},
    {"role": "user", "content": "France."},
]


def _tiny(tiny_dir):
    from collab_env.testing.tiny_model import load_tiny_chat_model

    return load_tiny_chat_model(tiny_dir)


def _cfg(tmp_path, cls=DPOConfig, **kw):
    base = dict(learning_rate=5e-3, eval_interval=0, eval_num_samples=8, output_dir=str(tmp_path / "out"),
                plot=False, max_length=128, per_device_train_batch_size=2)
    base.update(kw)
    return cls(**base)


def _pairs(n=2, good="The capital is Paris.", bad="Rome."):
    return [{"prompt": PROMPT, "chosen": [{"role": "assistant", "content": good}],
             "rejected": [{"role": "assistant", "content": bad}]} for _ in range(n)]


# -- the math, by hand ---------------------------------------------------------------------------


def test_dpo_loss_matches_hand_computed_values():
    """beta = 0.1.
    Pair 1: pi_c = -10, pi_r = -12, ref_c = -9, ref_r = -13.
        with reference: 0.1 * ((-10 - -9) - (-12 - -13)) = 0.1 * (-1 - 1) = -0.2
                        loss = -log sigmoid(-0.2) = log(1 + e^0.2) = log(2.2214028) = 0.7981389
        reference-free: 0.1 * (-10 - -12) = 0.2, loss = log(1 + e^-0.2) = log(1.8187308) = 0.5981389
        rewards: chosen 0.1 * (-10 + 9) = -0.1, rejected 0.1 * (-12 + 13) = +0.1
    Pair 2: pi_c = pi_r = -5, ref_c = ref_r = -7: logits 0, loss = log 2 = 0.6931472 (both).
    Gradient of pair 1's loss in pi_c: -beta * sigmoid(-logits) = -0.1 * sigmoid(0.2) = -0.0549834.
    """
    pi_c = torch.tensor([-10.0, -5.0], requires_grad=True)
    pi_r = torch.tensor([-12.0, -5.0])
    ref_c, ref_r = torch.tensor([-9.0, -7.0]), torch.tensor([-13.0, -7.0])
    losses, rc, rr = dpo_loss(pi_c, pi_r, ref_c, ref_r, beta=0.1)
    assert losses.tolist() == pytest.approx([0.7981389, 0.6931472], abs=1e-6)
    assert rc.tolist() == pytest.approx([-0.1, 0.2], abs=1e-6) and rr.tolist() == pytest.approx([0.1, 0.2], abs=1e-6)
    losses[0].backward()
    assert pi_c.grad.tolist() == pytest.approx([-0.0549834, 0.0], abs=1e-6)
    free, frc, _ = dpo_loss(pi_c.detach(), pi_r, beta=0.1)
    assert free.tolist() == pytest.approx([0.5981389, 0.6931472], abs=1e-6)
    assert frc.tolist() == pytest.approx([-1.0, -0.5], abs=1e-6)  # beta * pi without a reference
    with pytest.raises(ConfigError, match="both"):
        dpo_loss(pi_c, pi_r, ref_c, None, beta=0.1)


def test_select_pair_rule():
    assert select_pair([0.2, 0.9, 0.1, 0.9]) == (1, 2)  # first best, first worst
    assert select_pair([0.3, 0.1], min_gap=0.2) == (0, 1)  # gap == min_gap is kept (float noise)
    assert select_pair([0.3, 0.1], min_gap=0.25) is None
    assert select_pair([0.5, 0.5]) is None  # no preference
    assert select_pair([1.0, 0.0], keys=["same", "same"]) is None  # identical replies
    assert select_pair([1.0]) is None


def test_config_validation():
    with pytest.raises(ConfigError, match="beta"):
        DPOConfig(beta=0.0)
    with pytest.raises(ConfigError, match="num_candidates"):
        OnlineDPOConfig(num_candidates=1)
    with pytest.raises(ConfigError, match="min_gap"):
        OnlineDPOConfig(min_gap=-1.0)


# -- encoding and log-probs on the tiny model ------------------------------------------------------


def test_encode_pair_and_sequence_logprobs_are_exact(tiny_dir):
    """Prompt ids are the chat template with its generation prompt; a completion's ids are its
    text plus the end-of-turn token; the packed (left-padded) log-prob sums equal those of a
    plain forward pass over each whole sequence."""
    model, tok = _tiny(tiny_dir)
    p, c, r = encode_pair(tok, PROMPT, _pairs(1)[0]["chosen"], "Rome, I think.")
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert p == chat_ids(tok, PROMPT, generation_prompt=True)
    assert c == tok("The capital is Paris.", add_special_tokens=False)["input_ids"] + [im_end]
    assert r == tok("Rome, I think.", add_special_tokens=False)["input_ids"] + [im_end]
    sp, sc, _ = encode_pair(tok, "France?", "Paris.", "Rome.")  # strings: a user turn, a reply
    assert sp == chat_ids(tok, [{"role": "user", "content": "France?"}], generation_prompt=True)
    assert encode_pair(tok, PROMPT, "a", "b", max_length=len(p)) is None  # no room for a reply
    pairs = [(p, c, r), (sp, sc, sc[:1])]
    with torch.no_grad():
        got_c, got_r = pair_logps(model, pairs, tok.pad_token_id, "cpu")
    for k, (pp, cc, rr) in enumerate(pairs):
        for comp, got in ((cc, got_c[k]), (rr, got_r[k])):
            ids = torch.tensor([pp + comp])
            with torch.no_grad():
                logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1)
            want = sum(float(logp[len(pp) - 1 + j, t]) for j, t in enumerate(comp))
            # Sums of float32 log-probs over a sequence, padded vs alone: errors grow with |sum|.
            assert float(got) == pytest.approx(want, rel=1e-5, abs=1e-4)
    with pytest.raises(DataSchemaError, match="assistant"):
        encode_pair(tok, PROMPT, [{"role": "user", "content": "x"}], "y")


def test_pair_rows_are_encoded_and_split_by_the_toolkit(tiny_dir):
    """common.pairs: encode_pair_rows keeps the rows' order, counts the rows whose prompt alone
    reaches max_length, and names a row without a column; split_by_agent takes an agent column
    or one dataset per agent."""
    from collab_env.adapters.common.pairs import encode_pair_rows, split_by_agent

    _, tok = _tiny(tiny_dir)
    long_prompt = "word " * 200
    rows = [{"prompt": "France?", "chosen": "Paris.", "rejected": "Rome."},
            {"prompt": long_prompt, "chosen": "a", "rejected": "b"},
            {"prompt": PROMPT, "chosen": "Paris.", "rejected": "Rome."}]
    pairs, skipped = encode_pair_rows(tok, rows, max_length=64, what="data")
    assert skipped == 1
    assert pairs == [encode_pair(tok, r["prompt"], r["chosen"], r["rejected"], max_length=64) for r in (rows[0], rows[2])]
    with pytest.raises(DataSchemaError, match="data row 1 has no 'rejected' column"):
        encode_pair_rows(tok, [rows[0], {"prompt": "p", "chosen": "c"}], max_length=None, what="data")
    tagged = [dict(rows[0], agent=1), dict(rows[2], agent=0)]
    assert split_by_agent(tagged, 2, "data") == [[tagged[1]], [tagged[0]]]
    assert split_by_agent([[rows[0]], [rows[2]]], 2, "data") == [[rows[0]], [rows[2]]]
    with pytest.raises(DataSchemaError, match="agent must be an int"):
        split_by_agent(rows, 2, "data")


# -- offline DPO ------------------------------------------------------------------------------------


def test_offline_dpo_on_collabllm_pairs_learns_the_preference(tiny_dir, tmp_path):
    """Pairs from build_dpo_dataset: at the start the policy is the reference, so every pair's
    loss is exactly log 2; DPO steps move the weights, lower the loss and make the implicit
    reward prefer the chosen replies."""
    from collab_env.tasks.collabllm_modes import build_dpo_dataset
    from collab_env.testing.collabllm_fixtures import collabllm_fixture_rows

    rows = collabllm_fixture_rows(2)
    rows = rows + [{**r, "completion": "Rome, twelve.", "score": r["score"] - 1.0} for r in rows]
    ds = build_dpo_dataset(rows, system_prompt="Be collaborative.")
    assert len(ds) == 2
    model, tok = _tiny(tiny_dir)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = DPOTrainer(agent_model=model, tokenizer=tok, train_dataset=ds, eval_dataset=ds,
                         args=_cfg(tmp_path, num_train_epochs=4, learning_rate=1e-2, max_length=512))
    start = trainer.evaluate()
    assert start["eval/loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert start["eval/margin"] == pytest.approx(0.0, abs=1e-6)
    out = trainer.train()
    end = trainer.evaluate(num_eval_samples=2)
    assert any(not torch.equal(p, before[n]) for n, p in model.named_parameters())
    assert end["eval/loss"] < math.log(2) - 0.1 and end["eval/reward_accuracy"] == 1.0 and end["eval/margin"] > 0
    assert out["env_step"] == 4 and math.isfinite(out["loss"]) and end["eval/pairs"] == 2
    ckpt = trainer.save_checkpoint()
    assert (ckpt / "model_0" / "config.json").exists()


def test_reference_free_builds_no_reference_and_uses_the_policy_margin(tiny_dir, tmp_path):
    model, tok = _tiny(tiny_dir)
    data = _pairs(2)
    trainer = DPOTrainer(agent_model=model, tokenizer=tok, train_dataset=data, eval_dataset=data,
                         args=_cfg(tmp_path, reference_free=True, beta=0.5))
    assert trainer.models[0].reference is None
    with torch.no_grad():
        pi_c, pi_r = pair_logps(model, trainer.eval_pairs[0][:1], tok.pad_token_id, "cpu")
    want = -torch.nn.functional.logsigmoid(0.5 * (pi_c - pi_r)).item()
    assert trainer.evaluate()["eval/loss"] == pytest.approx(want, abs=1e-5)
    trainer.train()
    assert trainer.evaluate()["eval/loss"] < want


def test_one_dpo_per_agent_on_its_own_pairs(tiny_dir, tmp_path):
    """Two agents with opposite preferences: an ``agent`` column and a list of datasets split the
    pairs the same way, each agent's model learns its own preference."""
    a0 = _pairs(2, good="Paris.", bad="Rome.")
    a1 = _pairs(2, good="Rome.", bad="Paris.")
    model, tok = _tiny(tiny_dir)
    column = DPOTrainer(agent_model=model, tokenizer=tok,
                        train_dataset=[{**r, "agent": 0} for r in a0] + [{**r, "agent": 1} for r in a1],
                        args=_cfg(tmp_path / "c", num_agents=2))
    listed = DPOTrainer(agent_model=model, tokenizer=tok, train_dataset=[a0, a1],
                        args=_cfg(tmp_path / "l", num_agents=2, num_train_epochs=4, learning_rate=1e-2))
    assert column.train_pairs == listed.train_pairs and len(listed.models) == 2
    assert listed.models[0] is not listed.models[1]
    listed.train()
    probe = listed.train_pairs[0][:1]  # chosen "Paris.", rejected "Rome."
    margins = []
    for pm in listed.models:
        with torch.no_grad(), pm.as_reference() as ref:
            pi_c, pi_r = pair_logps(pm.model, probe, tok.pad_token_id, "cpu")
            ref_c, ref_r = pair_logps(ref, probe, tok.pad_token_id, "cpu")
        margins.append(float((pi_c - ref_c) - (pi_r - ref_r)))
    assert margins[0] > 0 > margins[1]
    with pytest.raises(DataSchemaError, match="agent"):
        DPOTrainer(agent_model=model, tokenizer=tok, train_dataset=a0, args=_cfg(tmp_path, num_agents=2))
    with pytest.raises(ConfigError, match="one per agent"):
        DPOTrainer(agent_model=model, tokenizer=tok, train_dataset=[a0], args=_cfg(tmp_path, num_agents=2))


# -- online DPO ------------------------------------------------------------------------------------


def _short_is_better_env():
    """hidden-facts whose assistant reward is the multiturn-aware reward with window 0 and a
    single metric, ``token_amount`` with weight -1 (sum rule, no clamp): a reply's reward is
    exactly minus its number of words, so the ranking is known."""
    from collab_env.rewards.mr import MultiturnAwareReward

    return MultiturnAwareReward(collab_env.make("hidden-facts-easy"), max_user_turns=0,
                                weights={"token_amount": -1.0}, aggregation="collabllm")


def test_online_dpo_pairs_by_the_env_reward_and_trains(tiny_dir, tmp_path):
    model, tok = _tiny(tiny_dir)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    args = _cfg(tmp_path, OnlineDPOConfig, num_candidates=4, max_new_tokens=10, max_steps=2,
                per_device_train_batch_size=2, max_length=1024, eval_interval=1, eval_num_samples=1)
    trainer = OnlineDPOTrainer(agent_model=model, tokenizer=tok, env=_short_is_better_env(),
                               eval_env=_short_is_better_env(), args=args)
    pairs, records, evals = trainer.collect_pairs([0, 1])
    assert evals == 8 and len(records) == 2
    for rec in records:
        assert rec["rewards"] == [-float(len(t.split())) for t in rec["texts"]]
        if rec["chosen"] is not None:
            assert rec["rewards"][rec["chosen"]] == max(rec["rewards"])
            assert rec["rewards"][rec["rejected"]] == min(rec["rewards"])
    kept = [r for r in records if r["chosen"] is not None]
    assert kept, "the sampled candidates all had the same length; change the seed"
    for (_prompt, c, r), rec in zip(pairs[0], kept, strict=True):
        assert tok.decode(c, skip_special_tokens=True) == rec["texts"][rec["chosen"]]
        assert tok.decode(r, skip_special_tokens=True) == rec["texts"][rec["rejected"]]
    out = trainer.train()
    assert any(not torch.equal(p, before[n]) for n, p in model.named_parameters())
    assert out["item"] == 2 and out["env_step"] == 8 and math.isfinite(out["loss"])
    assert out["chosen_env_reward"] > out["rejected_env_reward"]
    metrics = trainer.evaluate(num_eval_samples=1)
    assert set(metrics) == {"eval/reward_mean", "eval/return_mean", "eval/completion_length"}
    assert trainer.state.evaluations == 2  # the scheduled one before the first update, the manual one


def test_online_dpo_pairs_at_every_trained_turn_going_on_from_the_best(tiny_dir, tmp_path):
    """num_turns=2 (issue 45): candidates, scores and a pair at the second trained turn too, the
    conversation going on from the first turn's best reply (not only each item's first turn)."""
    model, tok = _tiny(tiny_dir)
    args = _cfg(tmp_path, OnlineDPOConfig, num_candidates=4, max_new_tokens=10, max_steps=2, num_turns=2,
                per_device_train_batch_size=2, max_length=1024)
    trainer = OnlineDPOTrainer(agent_model=model, tokenizer=tok, env=_short_is_better_env(), args=args)
    pairs, records, evals = trainer.collect_pairs([0, 1])
    assert sorted(r["turn"] for r in records) == [1, 1, 2, 2] and evals == 16
    kept = [r for r in records if r["chosen"] is not None]
    assert {r["turn"] for r in kept} == {1, 2}, "no pair at one of the turns; change the seed"
    assert len(pairs[0]) == len(kept)
    for rec in records:
        if rec["chosen"] is not None:
            assert rec["rewards"][rec["chosen"]] == max(rec["rewards"]) > min(rec["rewards"])
    # the second turn goes on from the first turn's best reply: one path per item
    from collab_env.adapters.common.config import learner_sampling

    levels = trainer._rollout(trainer.train_env, [0, 1], 4, 2, learner_sampling(args), trainer.task.seeds,
                              every_turn=True)
    assert [len(level) for level in levels] == [2, 2]
    for first, second in zip(levels[0], levels[1], strict=True):
        best = max(first.joint, key=lambda ja: ja.rewards[0])
        assert best.child is second
        said = [m.content for m in second.obs["assistant"] if m.role == "assistant"]
        assert said == [first.completions[0][best.choice[0]].text]
    out = trainer.train()
    assert out["pairs"] >= 1 and math.isfinite(out["loss"])


def test_online_dpo_argument_errors(tiny_dir, tmp_path):
    model, tok = _tiny(tiny_dir)
    with pytest.raises(ConfigError, match="env="):
        OnlineDPOTrainer(agent_model=model, tokenizer=tok, args=_cfg(tmp_path, OnlineDPOConfig))
    with pytest.raises(ConfigError, match="num_agents"):
        OnlineDPOTrainer(agent_model=model, tokenizer=tok, env="hidden-facts-easy",
                         args=_cfg(tmp_path, OnlineDPOConfig, num_agents=2))
    with pytest.raises(ConfigError, match="OnlineDPOConfig"):
        OnlineDPOTrainer(agent_model=model, tokenizer=tok, env="hidden-facts-easy", args=_cfg(tmp_path))

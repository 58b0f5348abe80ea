"""MAGRPOTrainer: the CoMLRL trainer surface on the dataset path and on registered envs, the
rollout tree's returns, training steps, the guide's metrics and schedule, and bit-exact resume."""

import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import collab_env  # noqa: E402
from collab_env.adapters.common.logging import read_jsonl  # noqa: E402
from collab_env.adapters.common.rollout import (  # noqa: E402
    JointAction,
    TreeNode,
    completion_values,
    compute_returns,
)
from collab_env.adapters.magrpo import MAGRPOConfig, MAGRPOTrainer  # noqa: E402
from collab_env.errors import ConfigError  # noqa: E402
from collab_env.tasks.cooperative import formatters, length_ratio_rows, reward_func  # noqa: E402


def _tiny(tiny_dir):
    from collab_env.testing.tiny_model import load_tiny_chat_model

    return load_tiny_chat_model(tiny_dir)


def _cfg(tmp_path, **kw):
    base = dict(num_agents=2, num_generations=2, max_new_tokens=4, eval_interval=0, eval_num_samples=1,
                logging_steps=1, learning_rate=1e-2, output_dir=str(tmp_path / "out"))
    base.update(kw)
    return MAGRPOConfig(**base)


def one_agent_reward(completions, *, batch_items):
    return [min(len(c), 12) / 12.0 for c in completions]


# -- config and arguments ------------------------------------------------------------------------


def test_config_validation():
    assert MAGRPOConfig().num_generations == 4
    with pytest.raises(ConfigError, match="num_generations"):
        MAGRPOConfig(num_generations=1)
    with pytest.raises(ConfigError, match="joint_mode"):
        MAGRPOConfig(joint_mode="both")
    with pytest.raises(ConfigError, match="eval_pass_k"):
        MAGRPOConfig(eval_greedy=True, eval_pass_k=4)
    with pytest.raises(ConfigError, match="temperature"):
        MAGRPOConfig(temperature=0.0)


def test_trainer_argument_errors(tiny_dir, tmp_path):
    model, tok = _tiny(tiny_dir)
    rows = length_ratio_rows("train")[:2]
    with pytest.raises(ConfigError, match="reward_func"):  # formatters may be omitted (the prompt field)
        MAGRPOTrainer(agent_model=model, tokenizer=tok, formatters=formatters, train_dataset=rows,
                      args=_cfg(tmp_path))
    with pytest.raises(ConfigError, match="num_agents=3"):
        MAGRPOTrainer(agent_model=model, tokenizer=tok, num_agents=3, formatters=formatters * 2,
                      reward_func=reward_func, train_dataset=rows, args=_cfg(tmp_path))
    with pytest.raises(ConfigError, match="not both"):
        MAGRPOTrainer(agent_model=model, tokenizer=tok, env="length-ratio", formatters=formatters,
                      args=_cfg(tmp_path))


# -- the tree's returns and advantages (no model) ------------------------------------------------


def _node(depth, acting, g):
    node = TreeNode(root=0, depth=depth, env=None, obs={}, infos={}, players=("a", "b"), acting=acting)
    node.completions = {a: [None] * g for a in acting}
    return node


def test_returns_are_reward_plus_discounted_mean_child_return():
    root = _node(0, [0, 1], 2)
    kids = [_node(1, [0, 1], 2), _node(1, [0, 1], 2)]
    root.joint = [JointAction({0: 0, 1: 0}, [1.0, 1.0], kids[0]), JointAction({0: 1, 1: 1}, [0.0, 0.0], kids[1])]
    kids[0].joint = [JointAction({0: j, 1: j}, [r, r]) for j, r in enumerate([0.0, 1.0])]
    kids[1].joint = [JointAction({0: j, 1: j}, [r, r]) for j, r in enumerate([1.0, 1.0])]
    compute_returns([[root], kids], 2, discount=0.5)
    assert [ja.returns[0] for ja in root.joint] == [1.0 + 0.5 * 0.5, 0.0 + 0.5 * 1.0]
    assert completion_values(root, 0) == [1.25, 0.5]
    assert completion_values(kids[0], 1) == [0.0, 1.0]


def test_cross_mode_values_are_marginals():
    node = _node(0, [0, 1], 2)
    # rewards [[1, 0], [0, 0]] over (agent 0 choice, agent 1 choice)
    node.joint = [JointAction({0: i, 1: j}, [r, r]) for (i, j), r in
                  zip([(0, 0), (0, 1), (1, 0), (1, 1)], [1.0, 0.0, 0.0, 0.0], strict=True)]
    compute_returns([[node]], 2, discount=1.0)
    assert completion_values(node, 0) == [0.5, 0.0]
    assert completion_values(node, 1) == [0.5, 0.0]


# -- training ------------------------------------------------------------------------------------


def test_train_step_changes_parameters_and_logs_the_guides_metrics(tiny_dir, tmp_path):
    model, tok = _tiny(tiny_dir)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    args = _cfg(tmp_path, beta=0.1, num_turns=2, eval_interval=1, eval_pass_k=2, max_grad_norm=0.5)
    trainer = MAGRPOTrainer(agent_model=model, tokenizer=tok, num_agents=2, formatters=formatters,
                            reward_func=reward_func, train_dataset=length_ratio_rows("train")[:1],
                            eval_dataset=length_ratio_rows("test")[:1], args=args)
    trainer.train()
    for pm in trainer.models:   # each agent trains its own copy
        changed = [n for n, p in pm.model.named_parameters() if not torch.equal(p, before[n])]
        assert changed, "a training step left every parameter unchanged"
    assert trainer.models[0].model is not trainer.models[1].model
    assert trainer.state.env_step == 2 + 4          # G joint actions at turn 1, G*G at turn 2
    records = read_jsonl(tmp_path / "out" / "metrics.jsonl")
    train = [r for r in records if "turn_1/reward_mean" in r][0]
    for key in ("turn_1/reward_mean", "turn_1/expected_return", "turn_2/reward_mean",
                "turn_2/expected_return", "turn_1/reference_kl_mean", "turn_1/reference_kl_penalty_mean",
                "reference_kl_mean", "reference_kl_penalty_mean", "loss", "grad_norm", "learning_rate"):
        assert key in train, key
    assert train["env_step"] == 6
    evals = [r for r in records if "eval/turn_1/reward_mean" in r]
    assert evals and evals[0]["env_step"] == 0       # before the first item
    assert {"eval/turn_1/expected_return", "eval/turn_2/reward_mean", "eval/pass@2",
            "eval/best_of_2_return"} <= set(evals[0])
    assert (tmp_path / "out" / "curves.png").read_bytes()[:4] == b"\x89PNG"


def test_lora_on_a_shared_model_trains_only_the_adapters(tiny_dir, tmp_path):
    """share_model: one PeftModel plays both agents; the base weights stay frozen and the
    reference (adapters disabled) is the base model."""
    pytest.importorskip("peft")
    model, tok = _tiny(tiny_dir)
    args = _cfg(tmp_path, share_model=True, lora_r=4, lora_alpha=8.0, beta=0.2, learning_rate=5e-2)
    trainer = MAGRPOTrainer(agent_model=model, tokenizer=tok, num_agents=2, formatters=formatters,
                            reward_func=reward_func, train_dataset=length_ratio_rows("train")[:1], args=args)
    pm = trainer.models[0]
    assert trainer.models[1] is pm and pm.lora
    base = {n: p.detach().clone() for n, p in pm.model.named_parameters() if not p.requires_grad}
    lora = {n: p.detach().clone() for n, p in pm.trainable_parameters()}
    assert lora and all("lora_" in n for n in lora)
    trainer.train()
    assert all(torch.equal(p, base[n]) for n, p in pm.model.named_parameters() if n in base)
    assert any(not torch.equal(p, lora[n]) for n, p in pm.trainable_parameters())
    assert trainer.logger.records[-1]["reference_kl_mean"] >= 0.0
    trainer.save_checkpoint(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "model_0" / "adapter_config.json").is_file()


def test_one_agent_is_grpo_and_eval_schedule(tiny_dir, tmp_path):
    """num_agents=1 trains one model; eval_interval=2 over 3 items x 2 epochs evaluates before
    items 0 and 2 of each epoch."""
    model, tok = _tiny(tiny_dir)
    args = _cfg(tmp_path, num_agents=1, num_train_epochs=2, eval_interval=2, max_new_tokens=2)
    trainer = MAGRPOTrainer(agent_model=model, tokenizer=tok, num_agents=1, formatters=[formatters[0]],
                            reward_func=one_agent_reward, train_dataset=length_ratio_rows("train")[:3],
                            eval_dataset=length_ratio_rows("test")[:1], args=args)
    trainer.train()
    records = read_jsonl(tmp_path / "out" / "metrics.jsonl")
    assert [r["item"] for r in records if "eval/turn_1/reward_mean" in r] == [0, 2, 3, 5]
    assert [r["env_step"] for r in records if "turn_1/reward_mean" in r] == [2, 4, 6, 8, 10, 12]
    assert trainer.state.optimizer_steps == 6


def test_checkpoint_resume_is_bit_for_bit(tiny_dir, tmp_path):
    """Training 3 items straight equals training 2, saving, and resuming in a new trainer."""
    def make(out):
        model, tok = _tiny(tiny_dir)
        args = _cfg(tmp_path, num_agents=1, output_dir=str(out), save_steps=2, num_iterations=2, beta=0.05,
                    lr_scheduler_type="linear", warmup_steps=1, eval_interval=2)
        return MAGRPOTrainer(agent_model=model, tokenizer=tok, num_agents=1, formatters=[formatters[0]],
                             reward_func=one_agent_reward, train_dataset=length_ratio_rows("train")[:3],
                             eval_dataset=length_ratio_rows("test")[:1], args=args)

    straight = make(tmp_path / "a")
    straight.train()
    resumed = make(tmp_path / "b")
    resumed.train(resume_from_checkpoint=tmp_path / "a" / "checkpoint-2")
    for (n, p), (_, q) in zip(straight.models[0].model.named_parameters(), resumed.models[0].model.named_parameters(), strict=True):
        assert torch.equal(p, q), n
    last_a = [r for r in read_jsonl(tmp_path / "a" / "metrics.jsonl") if "loss" in r][-1]
    last_b = [r for r in read_jsonl(tmp_path / "b" / "metrics.jsonl") if "loss" in r][-1]
    assert last_a == last_b
    assert resumed.state.items_done == 3 and resumed.state.env_step == straight.state.env_step


# -- evaluation ----------------------------------------------------------------------------------


def _guide_example():
    """examples/length_ratio_magrpo.py (the CoMLRL guide's example) as a module: its
    ``eval_logger`` and ``eval_aggregator`` are what this test runs (its training is under
    ``__main__`` and does not run on import)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / "length_ratio_magrpo.py"
    spec = importlib.util.spec_from_file_location("length_ratio_magrpo", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_eval_logger_and_aggregator_contract(tiny_dir, tmp_path):
    guide = _guide_example()
    eval_logger, eval_aggregator = guide.eval_logger, guide.eval_aggregator
    model, tok = _tiny(tiny_dir)
    seen = {}

    def spy(*, agent_completions_turns, batch_items, prompts):
        seen.update(completions=agent_completions_turns, items=batch_items, prompts=prompts)
        return eval_logger(agent_completions_turns=agent_completions_turns, batch_items=batch_items, prompts=prompts)

    test_rows = length_ratio_rows("test")[:2]
    trainer = MAGRPOTrainer(agent_model=model, tokenizer=tok, num_agents=2, formatters=formatters,
                            reward_func=reward_func, train_dataset=length_ratio_rows("train")[:1],
                            eval_dataset=test_rows, args=_cfg(tmp_path, num_turns=2, eval_batch_size=2, eval_greedy=True),
                            eval_logger=spy, eval_aggregator=eval_aggregator)
    metrics = trainer.evaluate(num_eval_samples=len(test_rows))
    assert len(seen["completions"]) == 2                       # [agent]
    assert len(seen["completions"][0]) == 2                    # [agent][item]
    assert len(seen["completions"][0][0]) == 2                 # [agent][item][turn]
    assert seen["items"] == test_rows and seen["prompts"] == [r["prompt"] for r in test_rows]
    assert {"eval/turn_1/response_chars", "eval/turn_2/response_chars", "eval/turn_1/reward_mean",
            "eval/turn_2/expected_return"} <= set(metrics)
    assert not any(k.startswith("eval/eval/") for k in metrics)
    # greedy evaluation is deterministic
    again = trainer.evaluate(num_eval_samples=len(test_rows))
    assert again["eval/turn_1/reward_mean"] == metrics["eval/turn_1/reward_mean"]
    no_eval = MAGRPOTrainer(agent_model=model, tokenizer=tok, num_agents=2, formatters=formatters,
                            reward_func=reward_func, train_dataset=length_ratio_rows("train")[:1],
                            args=_cfg(tmp_path / "x"))
    assert no_eval.evaluate(num_eval_samples=3) == {}


# -- env path ------------------------------------------------------------------------------------


def test_env_path_with_an_untrained_partner(tiny_dir, tmp_path):
    """length-ratio with only agent_0 trained: agent_1 is the spec's scripted partner."""
    model, tok = _tiny(tiny_dir)
    trainer = MAGRPOTrainer(agent_model=model, tokenizer=tok, env="length-ratio", trained_players=["agent_0"],
                            eval_env=collab_env.make("length-ratio", split="test"),
                            args=_cfg(tmp_path, num_agents=1, max_steps=1))
    assert trainer.players == ("agent_0",) and set(trainer.others) == {"agent_1"}
    out = trainer.train()
    assert out["env_step"] == 2 and math.isfinite(out["turn_1/reward_mean"])
    assert "eval/turn_1/reward_mean" in trainer.evaluate(num_eval_samples=1)


def test_env_path_alternating_turns_with_a_simulated_user(tiny_dir, tmp_path):
    """hidden-facts: the assistant is trained over 2 of its turns; the user's replies (default
    policy) happen between them inside each joint action."""
    model, tok = _tiny(tiny_dir)
    trainer = MAGRPOTrainer(agent_model=model, tokenizer=tok, env="hidden-facts",
                            args=_cfg(tmp_path, num_agents=1, num_turns=2, max_steps=1))
    assert trainer.players == ("assistant",) and set(trainer.others) == {"user"}
    trainer.train()
    records = read_jsonl(tmp_path / "out" / "metrics.jsonl")
    assert "turn_2/reward_mean" in records[-1] and records[-1]["env_step"] == 6


def test_collabllm_style_training_with_the_multiturn_aware_reward(tiny_dir, tmp_path):
    """GRPO on hidden-facts whose reward is the MR: the futures' assistant turns are played by
    the live model being trained, with no binding step (the driver hands the reward the policy
    table the rollout plays with), and the scripted user answers."""
    from collab_env.rewards.mr import MultiturnAwareReward

    model, tok = _tiny(tiny_dir)
    env = MultiturnAwareReward(collab_env.make("hidden-facts-easy"),
                               weights={"accuracy_rule": 1.0, "token_amount": -1e-2}, num_rollouts=2,
                               max_user_turns=1, max_assistant_turns=2,
                               sampling={"assistant": {"max_new_tokens": 4}})
    trainer = MAGRPOTrainer(agent_model=model, tokenizer=tok, env=env,
                            args=_cfg(tmp_path, num_agents=1, num_turns=1, max_steps=1, num_generations=4,
                                      max_new_tokens=8))
    live = trainer.models[0].generator
    assert env.scorer.named == {}  # nothing was put into the env
    played = []  # the assistant of every set of futures the reward rolled
    future_policies = env.scorer.future_policies

    def recording(policies):
        table, from_driver = future_policies(policies)
        played.append(table["assistant"])
        return table, from_driver

    env.scorer.future_policies = recording  # clones of the env share this scorer's methods
    trained = trainer.models[0].model
    before = [p.detach().clone() for p in trained.parameters()]
    trainer.train()
    assert any(not torch.equal(a, b) for a, b in zip(before, trained.parameters(), strict=True))
    rec = read_jsonl(tmp_path / "out" / "metrics.jsonl")[-1]
    # token_amount < 0 on every sample (the reply and the futures have words): a negative mean
    assert rec["turn_1/reward_mean"] < 0 and math.isfinite(rec["turn_1/reward_mean"])
    assert played and all(p is live for p in played)  # every future's assistant: the live model
    assert env.scorer.named == {}


class RecordingUser:
    """A user that answers "I don't know." and records the sampling keywords (seed aside) of
    each call."""

    def __init__(self):
        self.seen = []

    async def act(self, observations, **sampling):
        from collab_env.types import Completion

        self.seen.append({k: v for k, v in sampling.items() if k != "seed"})
        return [Completion(text="I don't know.") for _ in observations]


def test_untrained_players_get_the_task_sources_sampling(tiny_dir, tmp_path):
    """The task source's ``others_sampling`` reaches the untrained players' policies in the tree
    (here the user of hidden-facts, on turn after every assistant reply)."""
    user = RecordingUser()
    seen = user.seen

    model, tok = _tiny(tiny_dir)
    trainer = MAGRPOTrainer(agent_model=model, tokenizer=tok, env="hidden-facts", policies={"user": user},
                            args=_cfg(tmp_path, num_agents=1, num_turns=2, max_steps=1))
    trainer.task.others_sampling = {"user": {"temperature": 0.3, "max_new_tokens": 5}}
    trainer.train()
    assert seen and all(s == {"temperature": 0.3, "max_new_tokens": 5} for s in seen)


def test_untrained_sampling_learner_gives_the_other_players_the_learners_sampling(tiny_dir, tmp_path):
    """``untrained_sampling="learner"``: one source of sampling for the tree and the untrained
    players (the user of hidden-facts); a mapping names players; bad values are errors."""
    from collab_env.errors import ConfigError
    user = RecordingUser()
    seen = user.seen

    model, tok = _tiny(tiny_dir)
    trainer = MAGRPOTrainer(agent_model=model, tokenizer=tok, env="hidden-facts", policies={"user": user},
                            args=_cfg(tmp_path, num_agents=1, num_turns=2, max_steps=1, temperature=0.7,
                                      top_p=0.9, max_new_tokens=5, untrained_sampling="learner"))
    trainer.train()
    assert seen and all(s == {"temperature": 0.7, "top_p": 0.9, "max_new_tokens": 5} for s in seen)
    with pytest.raises(ConfigError, match="untrained_sampling names"):
        MAGRPOTrainer(agent_model=model, tokenizer=tok, env="hidden-facts",
                      args=_cfg(tmp_path, num_agents=1, max_steps=1, untrained_sampling={"assistant": {"temperature": 0.1}}))
    with pytest.raises(ConfigError, match="unknown sampling parameter"):
        _cfg(tmp_path, untrained_sampling={"user": {"temprature": 0.1}})
    with pytest.raises(ConfigError, match="untrained_sampling must be"):
        _cfg(tmp_path, untrained_sampling="greedy")


# -- CoMLRL's placement fields ------------------------------------------------------------------


def test_comlrl_placement_fields_are_refused_where_they_cannot_hold():
    from collab_env.adapters.common.models import placement

    with pytest.raises(ConfigError, match="pass agent_devices"):
        MAGRPOConfig(parallel_training="mp")
    with pytest.raises(ConfigError, match="share_model=True trains one model"):
        MAGRPOConfig(parallel_training="mp", agent_devices=["cpu", "cpu"], share_model=True)
    with pytest.raises(ConfigError, match="parallel_training must be"):
        MAGRPOConfig(parallel_training="ddp")
    with pytest.raises(ConfigError, match="agent_devices must be"):
        MAGRPOConfig(agent_devices=[])
    mp = MAGRPOConfig(parallel_training="mp", agent_devices=["cpu", "cpu", "cpu"])
    with pytest.raises(ConfigError, match="3 devices for 2 agents"):
        placement(mp, 2)
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="'cuda:1', but torch sees 0 CUDA devices"):
            placement(MAGRPOConfig(parallel_training="mp", agent_devices=["cpu", "cuda:1"]), 2)
    with pytest.raises(ConfigError, match="not a torch device name"):
        placement(MAGRPOConfig(parallel_training="mp", agent_devices=["cpu", "gpu7"]), 2)
    # Without "mp" only the first device counts, for every agent (as in CoMLRL), so a device
    # that torch does not have in a later place is never touched.
    assert placement(MAGRPOConfig(agent_devices=["cpu", "cuda:7"]), 2) == ["cpu", "cpu"]
    assert placement(MAGRPOConfig(), 3) == ["cpu"] * 3 or torch.cuda.is_available()
    assert placement(mp, 3) == ["cpu"] * 3


def test_model_parallel_placement_is_the_same_update(tiny_dir, tmp_path):
    """``parallel_training="mp"`` places agent i's model on ``agent_devices[i]`` and changes no
    number: on CPU (this machine has no second device) the trained parameters equal those of the
    default placement bit for bit."""
    finals = []
    for name, kw in (("none", {}), ("mp", {"parallel_training": "mp", "agent_devices": ["cpu", "cpu"]})):
        model, tok = _tiny(tiny_dir)
        trainer = MAGRPOTrainer(agent_model=model, tokenizer=tok, num_agents=2, formatters=formatters,
                                reward_func=reward_func, train_dataset=length_ratio_rows("train")[:1],
                                args=_cfg(tmp_path / name, device="cpu", plot=False, **kw))
        trainer.train()
        assert [str(pm.device) for pm in trainer.models] == ["cpu", "cpu"]
        finals.append([torch.cat([p.detach().reshape(-1) for p in pm.model.parameters()]) for pm in trainer.models])
    for a, b in zip(*finals, strict=True):
        assert torch.equal(a, b)

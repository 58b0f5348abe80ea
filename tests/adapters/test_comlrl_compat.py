"""CoMLRL compatibility: the training guide's example with ``from collab_env.adapters import``,
CoMLRL's config names and defaults (``preset="comlrl"``), ``IterableDataset`` task sets, the
default ``prompt`` formatter and ``prompt_format="raw"``."""

import importlib.util
import math
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")

import collab_env.adapters as adapters  # noqa: E402
from collab_env.adapters import (  # noqa: E402
    DPOConfig,
    IACConfig,
    IACTrainer,
    MAACConfig,
    MAGRPOConfig,
    MAGRPOTrainer,
    MAREINFORCEConfig,
)
from collab_env.adapters.common.config import learner_sampling  # noqa: E402
from collab_env.errors import ConfigError, DataSchemaError, TaskFunctionError  # noqa: E402
from collab_env.tasks import from_dataset  # noqa: E402

# The names another part of issue 10 adds in new modules; checked once those modules exist.
PENDING = {"MADPOConfig": "madpo", "MADPOTrainer": "madpo", "MARLHFConfig": "marlhf", "MARLHFTrainer": "marlhf"}


def _tiny(tiny_dir):
    from collab_env.testing.tiny_model import load_tiny_chat_model

    return load_tiny_chat_model(tiny_dir)


def _params(trainer):
    return [p.detach().clone() for pm in trainer._unique for _, p in pm.trainable_parameters()]


def _changed(before, trainer):
    after = [p.detach() for pm in trainer._unique for _, p in pm.trainable_parameters()]
    return any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))


# -- imports -----------------------------------------------------------------------------------
def test_every_trainer_and_config_imports_from_collab_env_adapters():
    for name in adapters.__all__:
        module = PENDING.get(name)
        if module is not None and importlib.util.find_spec(f"collab_env.adapters.{module}") is None:
            continue  # created by another engineer; checked as soon as the module lands
        assert getattr(adapters, name).__name__ == name
        assert name in dir(adapters)
    for name in ("MAGRPOTrainer", "MAREINFORCETrainer", "MARLOOTrainer", "MAReMaxTrainer", "IACTrainer",
                 "MAACTrainer", "DPOTrainer", "OnlineDPOTrainer", "SFTTrainer", "RewardModelTrainer",
                 *PENDING):
        assert name in adapters.__all__ and name.replace("Trainer", "Config") in adapters.__all__
    with pytest.raises(AttributeError, match="MAGRPOTrainer"):
        adapters.MAGRPOTrainr  # noqa: B018


def test_importing_collab_env_adapters_stays_light():
    code = ("import sys, collab_env.adapters as a; assert 'MAGRPOTrainer' in a.__all__; "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# -- CoMLRL's names ------------------------------------------------------------------------------
def test_comlrl_field_names_mean_what_they_mean_in_comlrl():
    cfg = MAGRPOConfig(agent_learning_rate=3e-4, advantage_normalization=True, rollout_buffer_size=3,
                       early_termination_threshold=0.5, reference_kl_enabled=True, reference_kl_coef=0.25,
                       external_prompt_passthrough=True)
    assert cfg.learning_rate == 3e-4 and cfg.agent_learning_rate == 3e-4
    assert cfg.normalize_advantages is True and cfg.advantage_normalization is True
    assert cfg.train_batch_size == 3  # CoMLRL: None becomes the buffer size
    iac = IACConfig(use_separate_critic=False, critic_type="q")
    assert iac.critic_placement == "head" and iac.use_separate_critic is False and iac.critic_type == "q"
    with pytest.raises(ConfigError, match="no field 'critic_estimate'"):  # our former name: gone
        IACConfig(critic_estimate="q")
    with pytest.raises(ConfigError, match="critic_placement='head'"):
        IACConfig(critic_type="head")  # our former meaning of critic_type: the message says where it went
    with pytest.raises(ConfigError, match="same field"):
        MAGRPOConfig(agent_learning_rate=1e-3, learning_rate=1e-4)
    with pytest.raises(ConfigError, match="Did you mean 'agent_learning_rate'"):
        MAGRPOConfig(agent_learning_rat=1e-3)
    with pytest.raises(ConfigError, match="Did you mean 'rollout_buffer_size'"):
        IACConfig(rollout_bufer_size=4)
    with pytest.raises(ConfigError, match="use_separate_critic must be True or False"):
        IACConfig(use_separate_critic="yes")


# CoMLRL's documented defaults, copied by hand from its source:
#   comlrl/trainers/reinforce/magrpo.py  (MAGRPOConfig; train_batch_size None -> rollout_buffer_size)
#   comlrl/trainers/actor_critic/iac.py  (IACConfig; critic_learning_rate None -> agent_learning_rate)
#   comlrl/trainers/actor_critic/maac.py (MAACConfig: no value_clip_range, always a separate critic)
# and what those trainers hard-code: torch.optim.AdamW(params, lr=...) (weight decay 0.01, no
# gradient clipping), log_softmax of the raw logits, one on-policy pass, -A * sum(log p) per
# completion averaged over completions, tokenizer(prompt strings), and (actor-critic) the
# one-step TD error.
COMLRL_MAGRPO_TRAINER = {
    "weight_decay": 0.01, "max_grad_norm": None, "logprob_temperature": 1.0, "num_iterations": 1,
    "loss_type": "sum", "prompt_format": "raw", "beta": 0.0, "per_device_train_batch_size": 1,
    "lr_scheduler_type": "constant", "warmup_steps": 0,
}
# REINFORCE's configs have no PPO fields: one on-policy pass is the only kind it has.
COMLRL_REINFORCE_TRAINER = {k: v for k, v in COMLRL_MAGRPO_TRAINER.items() if k != "num_iterations"}
COMLRL_AC_TRAINER = {
    "weight_decay": 0.01, "max_grad_norm": None, "logprob_temperature": 1.0, "num_iterations": 1,
    "prompt_format": "raw", "advantage_estimator": "td", "lr_scheduler_type": "constant", "warmup_steps": 0,
    "per_device_train_batch_size": 4,  # rollout_buffer_size 8 / num_turns 2 agent turns per item
}
#: CoMLRL config fields with no field here, and why (the test fails on any other missing one).
NOT_MAPPED = {
    "reference_devices": "device placement (the reference model sits with its agent's model)", "critic_devices": "device placement",
    "reward_model_device": "device placement",
    "advantage_mode": "MAREINFORCE/MARLOO/MAReMax take CoMLRL's other baselines as trainers",
    "num_generations": "(actor-critic) one sample per turn is the actor-critic rule here",
    "critic_model_name": "MARLHF's reward model is a trainer argument",
    "value_head_hidden_dim": "the value head is a linear layer", "critic_value_head_hidden_dim": "the value head is a linear layer",
}


def _comlrl_config(module: str, name: str):
    import importlib

    pytest.importorskip("comlrl", reason="the comlrl extra: pip install 'collab-env[comlrl]'")
    return getattr(importlib.import_module(f"comlrl.trainers.{module}"), name)


@pytest.mark.parametrize("cls, module, name, trainer", [
    (MAGRPOConfig, "reinforce.magrpo", "MAGRPOConfig", COMLRL_MAGRPO_TRAINER),
    (MAREINFORCEConfig, "reinforce.mareinforce", "MAREINFORCEConfig", COMLRL_REINFORCE_TRAINER),
    (adapters.MARLOOConfig, "reinforce.marloo", "MARLOOConfig", COMLRL_REINFORCE_TRAINER),
    (adapters.MAReMaxConfig, "reinforce.maremax", "MAReMaxConfig", COMLRL_REINFORCE_TRAINER),
    (IACConfig, "actor_critic.iac", "IACConfig", COMLRL_AC_TRAINER),
    (MAACConfig, "actor_critic.maac", "MAACConfig", COMLRL_AC_TRAINER),
])
def test_preset_comlrl_equals_the_installed_comlrl_field_by_field(cls, module, name, trainer):
    """``preset="comlrl"`` against the installed CoMLRL's own dataclass defaults, read from the
    package (not a copied table): every field CoMLRL's config has, under CoMLRL's name (our
    ``ALIASES`` map it), equals its default, with CoMLRL's own resolutions (``train_batch_size``
    None: the rollout buffer; the critic's learning rate None: the agent's). What the trainers
    hard-code (the optimiser, the loss) is checked against the documented values."""
    import dataclasses

    theirs = _comlrl_config(module, name)
    cfg = cls(preset="comlrl")
    aliases = getattr(cls, "ALIASES", {})
    checked, missing = [], []
    for f in dataclasses.fields(theirs):
        if f.default is dataclasses.MISSING:
            continue
        if f.name in NOT_MAPPED:
            continue
        ours, convert = aliases.get(f.name, (f.name, None))
        if not hasattr(cfg, ours):
            missing.append(f.name)
            continue
        want = f.default if convert is None or f.default is None else convert(f.default)
        if f.name == "train_batch_size" and want is None:
            want = cfg.rollout_buffer_size
        if f.name == "critic_learning_rate" and want is None:
            want = cfg.learning_rate
        assert getattr(cfg, ours) == want, f"{name}.{f.name}: ours {getattr(cfg, ours)!r}, CoMLRL {want!r}"
        checked.append(f.name)
    assert missing == [], f"CoMLRL {name} fields with no counterpart here: {missing}"
    assert {"discount", "num_turns", "learning_rate" if "learning_rate" in checked else "agent_learning_rate"} <= set(checked)
    assert {k: getattr(cfg, k) for k in trainer} == trainer
    assert cls(preset="comlrl", temperature=1.0).temperature == 1.0  # what the caller passes wins
    assert cls().temperature == 1.0 and cls().prompt_format == "chat"  # ours stay the defaults


def test_preset_refused_where_comlrl_has_no_counterpart():
    with pytest.raises(ConfigError, match="no CoMLRL counterpart"):
        DPOConfig(preset="comlrl")
    with pytest.raises(ConfigError, match="preset must be"):
        MAGRPOConfig(preset="trl")


# -- the guide's example -------------------------------------------------------------------------
GUIDE_PROMPTS = [
    "Describe a city in the clouds.", "Invent a new holiday.", "Write a bedtime story for a dragon.",
    "Explain how teleportation might work.", "Tell a story about dinosaurs.",
    "Describe a world without electricity.", "Create a superhero with a unique power.",
    "Write a scene where the moon talks.", "Invent a new type of fruit.", "Design a playground on Mars.",
]


def _guide_tasks():
    return datasets.Dataset.from_dict({"prompt": GUIDE_PROMPTS, "target_min": [2.0] * 10,
                                       "target_max": [3.0] * 10})


def brief_formatter(item):
    return f"Write a short response to this task:\n{item['prompt']}"


def detailed_formatter(item):
    return f"Write a detailed response to this task:\n{item['prompt']}"


def reward_func(brief_completions, detailed_completions, *, batch_items):
    item = batch_items[0]
    rewards = []
    for brief, detailed in zip(brief_completions, detailed_completions):
        if not brief:
            rewards.append(0.0)
            continue
        ratio = len(detailed) / len(brief)
        distance = max(item["target_min"] - ratio, ratio - item["target_max"], 0.0)
        rewards.append(math.exp(-distance))
    return rewards


def test_guide_example_runs_with_collab_env_adapters(tiny_dir, tmp_path):
    split = _guide_tasks().train_test_split(test_size=0.2, seed=42)
    train_dataset, eval_dataset = split["train"], split["test"]
    item = train_dataset[0]
    assert item["prompt"] in brief_formatter(item)
    assert reward_func(["Hi"], ["Hello"], batch_items=[item]) == [1.0]
    assert reward_func([""], ["Hello"], batch_items=[item]) == [0.0]
    model, tok = _tiny(tiny_dir)
    config = MAGRPOConfig(  # the guide's fields; a short run of a tiny model on CPU
        num_agents=2, num_turns=1, num_train_epochs=1, num_generations=4, max_new_tokens=8,
        eval_interval=4, eval_num_samples=len(eval_dataset), eval_batch_size=1, logging_steps=4,
        max_steps=2, learning_rate=1e-2, output_dir=str(tmp_path), plot=False)
    trainer = MAGRPOTrainer(agent_model=model, tokenizer=tok, num_agents=2,
                            formatters=[brief_formatter, detailed_formatter], reward_func=reward_func,
                            train_dataset=train_dataset, eval_dataset=eval_dataset, args=config)
    before = _params(trainer)
    trainer.train()
    assert _changed(before, trainer)
    assert trainer.state.items_done == 2
    metrics = trainer.evaluate(num_eval_samples=len(eval_dataset))
    assert 0.0 <= metrics["eval/turn_1/reward_mean"] <= 1.0
    trainer.close()


# -- CoMLRL's field names at work ----------------------------------------------------------------
def _trainer(tiny_dir, tmp_path, rows=None, **kw):
    model, tok = _tiny(tiny_dir)
    base = dict(num_agents=2, num_turns=1, num_generations=2, max_new_tokens=4, eval_interval=0,
                agent_learning_rate=1e-2, output_dir=str(tmp_path), plot=False)
    base.update(kw)
    rows = rows if rows is not None else _guide_tasks().select(range(4))
    return MAGRPOTrainer(agent_model=model, tokenizer=tok, formatters=[brief_formatter, detailed_formatter],
                         reward_func=reward_func, train_dataset=rows, args=MAGRPOConfig(**base))


def test_rollout_buffer_updates_when_full_and_at_epoch_end(tiny_dir, tmp_path):
    trainer = _trainer(tiny_dir, tmp_path, rollout_buffer_size=2, advantage_normalization=True)
    before = _params(trainer)
    trainer.train_step([0])  # one node per agent: the buffers (size 2) are not full
    assert not _changed(before, trainer) and [len(b) for b in trainer._buffers] == [1, 1]
    trainer.train_step([1])  # full: each agent steps on its two nodes
    assert _changed(before, trainer) and [len(b) for b in trainer._buffers] == [0, 0]
    trainer.train_step([2])
    mid = _params(trainer)
    trainer.end_epoch()  # CoMLRL updates on what is left at the end of an epoch
    assert _changed(mid, trainer) and [len(b) for b in trainer._buffers] == [0, 0]


def test_early_termination_stops_a_branch(tiny_dir, tmp_path):
    def two_turns(agent_completions, **_):
        return ["Again, shorter."] * 2

    rows = _guide_tasks().select(range(2))
    for threshold, depths in ((-1e9, 1), (None, 2)):  # every reward (>= 0) exceeds -1e9
        model, tok = _tiny(tiny_dir)
        trainer = MAGRPOTrainer(
            agent_model=model, tokenizer=tok, formatters=[brief_formatter, detailed_formatter],
            reward_func=reward_func, train_dataset=rows, external_transition=two_turns,
            args=MAGRPOConfig(num_turns=2, num_generations=2, max_new_tokens=3, eval_interval=0, plot=False,
                              early_termination_threshold=threshold, output_dir=str(tmp_path / str(threshold))))
        _, levels = trainer.rollout(trainer.train_env, [0], lambda d: 2, "aligned", learner_sampling(trainer.args),
                                     trainer.task.seeds)
        assert len(levels) == depths


def test_reference_kl_is_zero_at_the_start_and_comes_off_returns(tiny_dir, tmp_path):
    trainer = _trainer(tiny_dir, tmp_path, reference_kl_enabled=True, reference_kl_coef=0.5)
    first = trainer.train_step([0])
    # The reference is an exact copy of the policy: identical log-probs, so k3 is exactly 0.
    assert first["turn_1/reference_kl_mean"] == 0.0
    second = trainer.train_step([1])  # after a step (lr 1e-2) the policy has moved
    assert second["turn_1/reference_kl_mean"] > 0.0
    assert second["turn_1/reference_kl_penalty_mean"] == pytest.approx(0.5 * second["turn_1/reference_kl_mean"])


def test_external_prompt_passthrough_has_comlrl_meaning():
    def formatter(item, external_prompts=None):
        return f"Task: {item['prompt']} | ext={external_prompts}"

    def plain(item):
        return f"Task: {item['prompt']}"

    def transition(agent_completions, **_):
        return ["EXT"] * 2

    def reward(a, b):
        return [0.0]

    rows = [{"prompt": "P"}]
    expected = {  # turn-2 prompt of (declaring formatter, plain formatter)
        True: ("EXT", "EXT"),  # CoMLRL: the external prompt as it is
        False: ("Task: EXT | ext=EXT", "Task: EXT"),  # CoMLRL: formatter on {**item, "prompt": external}
        None: ("Task: P | ext=EXT", "EXT"),  # collab_env's rule (unchanged default)
    }
    for mode, want in expected.items():
        env = from_dataset(rows, [formatter, plain], reward, num_turns=2, external_transition=transition,
                           external_prompt_passthrough=mode)
        env.reset(seed=0, options={"index": 0})
        obs, *_ = env.step({"agent_0": "a", "agent_1": "b"})
        assert (obs["agent_0"][-1].content, obs["agent_1"][-1].content) == want


def test_iac_with_comlrl_names_trains(tiny_dir, tmp_path):
    model, tok = _tiny(tiny_dir)
    args = IACConfig(num_agents=2, num_turns=1, max_new_tokens=4, eval_interval=0, agent_learning_rate=1e-2,
                     use_separate_critic=False, critic_type="q", advantage_normalization=True,
                     prompt_format="raw", output_dir=str(tmp_path), plot=False, max_steps=1)
    trainer = IACTrainer(agent_model=model, tokenizer=tok, formatters=[brief_formatter, detailed_formatter],
                         reward_func=reward_func, train_dataset=_guide_tasks().select(range(2)), args=args)
    assert all(c.backbone is trainer.models[k].model for k, c in enumerate(trainer.critics))  # heads
    before = _params(trainer)
    trainer.train()
    assert _changed(before, trainer)


# -- task sets: IterableDataset and the default formatter ------------------------------------------
def test_iterable_dataset_train_and_eval(tiny_dir, tmp_path):
    train = _guide_tasks().select(range(3)).to_iterable_dataset()
    evals = _guide_tasks().select(range(3, 5)).to_iterable_dataset()
    assert not hasattr(train, "__len__")
    model, tok = _tiny(tiny_dir)
    trainer = MAGRPOTrainer(agent_model=model, tokenizer=tok, formatters=[brief_formatter, detailed_formatter],
                            reward_func=reward_func, train_dataset=train, eval_dataset=evals,
                            args=MAGRPOConfig(num_generations=2, max_new_tokens=4, eval_interval=0,
                                              eval_num_samples=4, learning_rate=1e-2, output_dir=str(tmp_path),
                                              plot=False))
    assert trainer.task.train_items == 3  # a finite stream is read once to count its items
    before = _params(trainer)
    trainer.train()
    assert _changed(before, trainer) and trainer.state.items_done == 3
    metrics = trainer.evaluate()  # asks for 4 items; the stream has 2
    assert "eval/turn_1/reward_mean" in metrics
    rows = trainer.eval_env.unwrapped.task.dataset
    assert rows.exhausted and len(rows) == 2


def test_endless_stream_trains_with_max_steps(tiny_dir, tmp_path):
    def endless():
        k = 0
        while True:
            yield {"prompt": f"Describe thing number {k}.", "target_min": 2.0, "target_max": 3.0}
            k += 1

    stream = datasets.IterableDataset.from_generator(endless)
    trainer = _trainer(tiny_dir, tmp_path, rows=stream, max_steps=2)
    assert trainer.task.train_items is None
    trainer.train()
    assert trainer.state.items_done == 2
    assert trainer.train_env.unwrapped.task.get_item(1)["prompt"] == "Describe thing number 1."


def test_default_formatter_reads_the_prompt_field(tiny_dir, tmp_path):
    env = from_dataset([{"prompt": "Say hi."}], None, lambda a, b: [1.0], agent_ids=["a", "b"])
    obs, _ = env.reset(seed=0, options={"index": 0})
    assert obs["a"][-1].content == "Say hi." and obs["b"][-1].content == "Say hi."
    with pytest.raises(TaskFunctionError, match="reads the item's 'prompt' field") as info:
        bad = from_dataset([{"question": "Say hi."}], None, lambda a, b: [1.0], agent_ids=["a", "b"])
        bad.reset(seed=0, options={"index": 0})
    assert isinstance(info.value.__cause__, DataSchemaError)  # no prompt is never made up
    model, tok = _tiny(tiny_dir)
    trainer = MAGRPOTrainer(agent_model=model, tokenizer=tok, reward_func=reward_func,
                            train_dataset=_guide_tasks().select(range(1)),
                            args=MAGRPOConfig(num_generations=2, max_new_tokens=3, eval_interval=0,
                                              prompt_format="raw", output_dir=str(tmp_path), plot=False))
    roots, levels = trainer.rollout(trainer.train_env, [0], lambda d: 2, "aligned", learner_sampling(trainer.args),
                                     trainer.task.seeds)
    assert levels[0][0].prompts == {0: GUIDE_PROMPTS[0], 1: GUIDE_PROMPTS[0]}


# -- prompt_format="raw" -------------------------------------------------------------------------
def test_raw_prompts_are_the_formatter_strings_tokenised_one_per_turn(tiny_dir, tmp_path):
    def revise(agent_completions, **_):
        return [f"Revise: {c}" for c in agent_completions]

    rows = _guide_tasks().select(range(2))
    model, tok = _tiny(tiny_dir)
    trainer = MAGRPOTrainer(
        agent_model=model, tokenizer=tok, formatters=[brief_formatter, detailed_formatter],
        reward_func=reward_func, train_dataset=rows, external_transition=revise,
        args=MAGRPOConfig(num_turns=2, num_generations=2, max_new_tokens=4, eval_interval=0, prompt_format="raw",
                          external_prompt_passthrough=True, learning_rate=1e-2, output_dir=str(tmp_path),
                          plot=False))
    roots, levels = trainer.rollout(trainer.train_env, [0], lambda d: 2, "aligned", learner_sampling(trainer.args),
                                     trainer.task.seeds)
    item = rows[0]
    root = levels[0][0]
    for agent, fmt in enumerate((brief_formatter, detailed_formatter)):
        assert root.prompt_ids[agent] == tok(fmt(item))["input_ids"]
    for child in levels[1]:  # turn 2: the external prompt alone, no history, no chat template
        parent = next(n for n in levels[0] for ja in n.joint if ja.child is child)
        ja = next(ja for ja in parent.joint if ja.child is child)
        for agent in (0, 1):
            text = f"Revise: {parent.completions[agent][ja.choice[agent]].text}"
            assert child.prompts[agent] == text
            assert child.prompt_ids[agent] == tok(text)["input_ids"]
    chat = trainer.models[0].prompt_ids(root.obs["agent_0"])
    assert chat != root.prompt_ids[0]  # the chat template adds its own tokens
    before = _params(trainer)
    trainer.train()
    assert _changed(before, trainer)


def test_a_comlrl_module_path_names_the_import_that_works():
    """``comlrl.trainers.reinforce`` holds MAGRPOTrainer; here one import path per name, so
    ``collab_env.adapters.reinforce`` has none, and the error says where it is (or that there is
    no counterpart). Other missing names stay plain AttributeErrors (``hasattr`` works)."""
    with pytest.raises(ImportError, match=r"`from collab_env.adapters import MAGRPOTrainer`"):
        from collab_env.adapters.reinforce import MAGRPOTrainer  # noqa: F401
    with pytest.raises(ImportError, match=r"`from collab_env.adapters import MAGRPOConfig`"):
        from collab_env.adapters.reinforce import MAGRPOConfig  # noqa: F401
    with pytest.raises(ImportError, match="no counterpart of CoMLRL's comlrl.trainers.reinforce.CentralizedMAGRPOTrainer"):
        from collab_env.adapters.reinforce import CentralizedMAGRPOTrainer  # noqa: F401
    with pytest.raises(ImportError, match="no counterpart of CoMLRL's comlrl.trainers.actor_critic.ActorCriticTrainerBase"):
        from collab_env.adapters.actor_critic import ActorCriticTrainerBase  # noqa: F401
    from collab_env.adapters.actor_critic import IACTrainer as iac  # defined there: imports as in CoMLRL
    from collab_env.adapters.reinforce import MAREINFORCETrainer as mar
    assert iac is adapters.IACTrainer and mar is adapters.MAREINFORCETrainer
    import collab_env.adapters.reinforce as reinforce

    assert not hasattr(reinforce, "no_such_name") and not hasattr(reinforce, "__wrapped__")
    # Every CoMLRL name listed is really in the installed CoMLRL module (the table is not stale).
    pytest.importorskip("comlrl")
    import importlib

    for module, names in adapters.COMLRL_MODULE_NAMES.items():
        mod = importlib.import_module(f"comlrl.trainers.{module}")
        assert all(hasattr(mod, n) for n in names), module


def test_the_readme_defaults_table_says_what_the_installed_comlrl_says():
    """The README's "Field | CoMLRL | collab_env" table: every CoMLRL value that is a plain number
    or bool, for a field of CoMLRL's MAGRPOConfig (under its own name or the CoMLRL name in
    parentheses), equals the installed default; so the table cannot drift from the package."""
    import dataclasses
    import re
    from pathlib import Path

    theirs = {f.name: f.default for f in dataclasses.fields(_comlrl_config("reinforce.magrpo", "MAGRPOConfig"))}
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    table = text[text.index("| Field | CoMLRL | collab_env | Why ours |"):]
    table = table[:table.index("\n\n")]
    checked = []
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        names = [re.findall(r"`([a-z_]+)`", part) for part in cells[0].split(" / ")]
        values = [v.strip() for v in cells[1].split(" / ")]
        for group, value in zip(names, values):
            token = value.split()[0] if value else ""
            try:
                got = {"True": True, "False": False}.get(token, None)
                got = float(token) if got is None else got
            except ValueError:
                continue
            field = next((n for n in group if n in theirs), None)
            if field is None:
                continue
            assert theirs[field] == got, f"README says CoMLRL's {field} is {token}; installed CoMLRL: {theirs[field]!r}"
            checked.append(field)
    assert {"temperature", "top_p", "top_k", "discount", "num_turns", "early_termination_threshold",
            "num_train_epochs", "advantage_normalization"} <= set(checked), checked

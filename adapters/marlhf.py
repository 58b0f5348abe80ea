"""MARLHF: multi-agent RLHF, CoMLRL's second preference trainer.

Three stages, each reusing a learner of :mod:`collab_env.adapters`::

    from collab_env.adapters import MARLHFConfig, MARLHFTrainer

    trainer = MARLHFTrainer(agent_model="embedded", num_agents=2, formatters=formatters,
                            reward_func=reward_func, train_dataset=train_dataset,
                            eval_dataset=eval_dataset,
                            args=MARLHFConfig(num_agents=2, rl_algorithm="magrpo", ...))
    trainer.train()
    trainer.evaluate(num_eval_samples=len(eval_dataset))   # on the task reward

1. **Preferences** (:meth:`~collab_env.adapters.madpo.MADPOTrainer.collect_pairs`): joint
   responses of the initial policies ranked by the task reward (``reward_func``, or the env's
   reward on the env path), selected exactly as MADPO selects them.
2. **Joint reward model**: a Bradley-Terry :class:`~collab_env.adapters.reward_model.JointRewardModel`
   trained on those pairs by :class:`~collab_env.adapters.reward_model.RewardModelTrainer`
   (``reward_learning_rate``, ``reward_num_train_epochs``, ``reward_train_batch_size``,
   ``reward_max_length``; ``reward_freeze_backbone`` trains the head only). Its input is every
   agent's prompt and completion (``Task for Agent k`` / ``Agent k`` lines). The backbone is
   ``reward_model_name`` or, by default, a copy of agent 0's initial model. It is then
   **frozen**: every parameter ``requires_grad=False``, evaluation mode.
3. **RL** with the backend ``rl_algorithm`` (CoMLRL's choices): ``"magrpo"``
   (:class:`~collab_env.adapters.magrpo.MAGRPOTrainer`), ``"mareinforce"`` (REINFORCE without a
   baseline; CoMLRL's ``advantage_mode="raw"``), ``"maremax"``, ``"marloo"``
   (:mod:`~collab_env.adapters.reinforce`), ``"iac"``, ``"maac"``
   (:mod:`~collab_env.adapters.actor_critic`). The backend trains the same agent models on the
   training env whose reward is replaced by the frozen reward model's score
   (:class:`~collab_env.rewards.joint.JointReward`: the wrapped env still computes its own
   reward, which is replaced and kept only as the ``"env"`` reward component); its evaluations, and
   :meth:`MARLHFTrainer.evaluate`, use the evaluation env untouched, i.e. the **task reward**.

The backend's config is built from this config's fields that it shares (sampling, learning
rate, ``num_generations``, evaluation schedule...); ``critic_type`` (``"v"``/``"q"``, CoMLRL's
meaning), ``use_separate_critic``, ``critic_learning_rate``, ``value_loss_coef`` and
``value_clip_range`` go to IAC/MAAC. Logs: ``<output_dir>/metrics.jsonl`` holds the
``preference/*`` record, the reward model's ``reward_model/*`` summary and the RL stage's
records (training rewards there are the reward model's; ``eval/...`` are the task's); the
reward model's own log is in ``<output_dir>/reward_model/``.
"""

from __future__ import annotations

import copy
from dataclasses import fields
from pathlib import Path
from typing import Any, ClassVar, Literal

from collab_env.adapters.actor_critic import IACConfig, IACTrainer, MAACConfig, MAACTrainer
from collab_env.adapters.common.config import PPOFields, check_choice, check_float, check_int, learner_config
from collab_env.adapters.common.joint_reward import JointRewardModel
from collab_env.adapters.madpo import MADPOConfig, MADPOTrainer
from collab_env.adapters.magrpo import MAGRPOConfig, MAGRPOTrainer
from collab_env.adapters.reinforce import MAREINFORCEConfig, MAREINFORCETrainer
from collab_env.adapters.reward_model import RewardModelConfig, RewardModelTrainer
from collab_env.errors import ConfigError

__all__ = ["MARLHFConfig", "MARLHFTrainer", "RL_ALGORITHMS"]

#: The RL backends of ``rl_algorithm`` (CoMLRL's names; ``"mareforce"`` is read as
#: ``"mareinforce"``, as CoMLRL does).
RL_ALGORITHMS: tuple[str, ...] = ("magrpo", "mareinforce", "maremax", "marloo", "iac", "maac")


@learner_config
class MARLHFConfig(PPOFields, MADPOConfig):
    """Configuration of :class:`MARLHFTrainer`: :class:`~collab_env.adapters.madpo.MADPOConfig`'s
    fields (the preference collection) plus the PPO group, the reward model's and the RL
    backend's (each backend takes the fields it has), with CoMLRL's names and defaults."""

    COMLRL_DEFAULTS: ClassVar[dict[str, Any]] = {
        **MADPOConfig.COMLRL_DEFAULTS, "num_iterations": 1, "rl_algorithm": "magrpo", "num_generations": 4,
        "reward_learning_rate": 1e-5, "reward_num_train_epochs": 1, "reward_train_batch_size": 1,
        "reward_max_length": None, "reward_freeze_backbone": False, "use_separate_critic": True,
        "critic_type": "v", "value_loss_coef": 0.6, "value_clip_range": 0.2,
    }

    rl_algorithm: Literal["magrpo", "mareinforce", "maremax", "marloo", "iac", "maac"] = "magrpo"
    """The RL backend trained on the frozen reward model (module docstring)."""
    reward_model_name: str | None = None
    """Backbone of the reward model (a folder or hub id); ``None``: a copy of agent 0's initial
    model."""
    reward_learning_rate: float = 1e-5
    """AdamW learning rate of the reward model."""
    reward_num_train_epochs: int = 1
    """Passes of the reward model over the preference pairs."""
    reward_train_batch_size: int = 1
    """Preference pairs per reward-model optimiser step."""
    reward_max_length: int | None = None
    """Longest reward-model input in tokens (the last tokens are kept); ``None``: no limit."""
    reward_freeze_backbone: bool = False
    """Train only the reward model's linear head."""
    critic_type: Literal["v", "q"] = "v"
    """IAC/MAAC: the critic estimates state values (``"v"``) or action values (``"q"``)."""
    use_separate_critic: bool = True
    """IAC: a separate critic model (else a value head on each actor); MAAC's is always separate."""
    critic_learning_rate: float | None = None
    """IAC/MAAC: the critic's learning rate (``None``: ``learning_rate``)."""
    value_loss_coef: float = 0.6
    """IAC/MAAC: weight of the value loss."""
    value_clip_range: float | None = 0.2
    """IAC/MAAC: clip range of the value prediction (``None``: no clipping)."""

    def __post_init__(self) -> None:
        if self.rl_algorithm == "mareforce":
            self.rl_algorithm = "mareinforce"
        super().__post_init__()
        check_choice("rl_algorithm", self.rl_algorithm, RL_ALGORITHMS)
        if self.reward_model_name is not None and (not isinstance(self.reward_model_name, str)
                                                   or not self.reward_model_name):
            raise ConfigError(f"reward_model_name must be None or a model folder / hub id, "
                              f"got {self.reward_model_name!r}.")
        check_float("reward_learning_rate", self.reward_learning_rate, 0.0, low_open=True)
        check_int("reward_num_train_epochs", self.reward_num_train_epochs, 1)
        check_int("reward_train_batch_size", self.reward_train_batch_size, 1)
        check_int("reward_max_length", self.reward_max_length, 2, allow_none=True)
        for name in ("reward_freeze_backbone", "use_separate_critic"):
            if getattr(self, name) not in (True, False):
                raise ConfigError(f"{name} must be True or False, got {getattr(self, name)!r}.")
        check_choice("critic_type", self.critic_type, ("v", "q"))
        check_float("critic_learning_rate", self.critic_learning_rate, 0.0, low_open=True, allow_none=True)
        check_float("value_loss_coef", self.value_loss_coef, 0.0, low_open=True)
        check_float("value_clip_range", self.value_clip_range, 0.0, low_open=True, allow_none=True)
        if self.collaboration_mode != "decentralized":
            raise ConfigError("MARLHFTrainer trains decentralised agents here: set collaboration_mode='decentralized' "
                              "(MADPOTrainer supports 'centralized').")


def _backend(algorithm: str) -> tuple[type, type, dict[str, Any]]:
    """``(trainer class, config class, fixed config fields)`` of an RL backend."""
    if algorithm == "magrpo":

        return MAGRPOTrainer, MAGRPOConfig, {}
    if algorithm in ("mareinforce", "maremax", "marloo"):

        baseline = {"mareinforce": "none", "maremax": "remax", "marloo": "rloo"}[algorithm]
        return MAREINFORCETrainer, MAREINFORCEConfig, {"baseline": baseline}

    return (IACTrainer, IACConfig, {}) if algorithm == "iac" else (MAACTrainer, MAACConfig, {})


class MARLHFTrainer(MADPOTrainer):
    """Preferences from the task reward, a frozen Bradley-Terry joint reward model, then RL on it
    (module docstring).

    Takes MAGRPO's arguments (``agent_model``, ``num_agents``, ``formatters``, ``reward_func``
    (the task reward), ``train_dataset``, ``eval_dataset``, ``args``, ``env``, ``eval_env``,
    ...) with ``args`` a :class:`MARLHFConfig`.

    Attributes:
        reward_model: The :class:`~collab_env.adapters.reward_model.JointRewardModel` after
            :meth:`train` (frozen), else ``None``.
        rl_trainer: The RL backend's trainer after :meth:`train`.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        config = kwargs.get("args", args[7] if len(args) >= 8 else None)
        if config is None:
            kwargs["args"] = config = MARLHFConfig()
        if not isinstance(config, MARLHFConfig):
            raise ConfigError(f"args must be a MARLHFConfig, got {type(config).__name__}.")
        super().__init__(*args, **kwargs)
        # The reward model's default backbone is agent 0's *initial* model: copy it before RL.
        self._initial_backbone = None
        if config.reward_model_name is None:
            self._initial_backbone = copy.deepcopy(self.models[0].model).cpu()
        self.reward_model: Any = None
        self.rl_trainer: Any = None

    # -- stage 2 ----------------------------------------------------------------------------------
    def train_reward_model(self, pairs: list[Any]) -> Any:
        """Train the joint reward model on ``pairs`` (from :meth:`collect_pairs`), freeze it, log
        ``reward_model/*`` and return it."""

        a = self.args
        n = len(self.players)
        rows = [{"prompt": list(p.prompts), "chosen": list(p.chosen), "rejected": list(p.rejected)} for p in pairs]
        backbone = a.reward_model_name if a.reward_model_name is not None else self._initial_backbone
        tok = self.models[0].tokenizer if a.reward_model_name is None else None
        rm = JointRewardModel.from_model(backbone, tok, device=a.device, dtype=a.dtype, seed=a.seed,
                                         max_length=a.reward_max_length, num_agents=n)
        if a.reward_freeze_backbone:
            for p in rm.lm.parameters():
                p.requires_grad_(False)
        cfg = RewardModelConfig(
            num_agents=n, learning_rate=a.reward_learning_rate, num_train_epochs=a.reward_num_train_epochs,
            per_device_train_batch_size=a.reward_train_batch_size, max_length=a.reward_max_length, seed=a.seed,
            device=a.device, dtype=a.dtype, weight_decay=a.weight_decay, max_grad_norm=a.max_grad_norm,
            eval_interval=0, logging_steps=1, plot=False, output_dir=f"{a.output_dir}/reward_model")
        rm_trainer = RewardModelTrainer(model=rm, train_dataset=rows, args=cfg)
        last = rm_trainer.train()
        accuracy = rm_trainer.evaluate(eval_dataset=rows, num_eval_samples=len(rows))
        rm_trainer.close()
        rm.eval()
        for p in list(rm.lm.parameters()) + list(rm.head.parameters()):
            p.requires_grad_(False)  # frozen: the RL stage only reads it
        self._initial_backbone = None
        summary = {"reward_model/loss": float(last.get("loss", float("nan"))),
                   "reward_model/train_accuracy": float(accuracy.get("eval/accuracy", float("nan"))),
                   "reward_model/train_margin": float(accuracy.get("eval/margin", float("nan"))),
                   "reward_model/pairs": float(len(rows))}
        self.logger.log(summary, env_step=self.state.env_step, epoch=self.state.epoch, item=self.state.items_done)
        self.reward_model = rm
        return rm

    # -- stage 3 ----------------------------------------------------------------------------------
    def _backend_config(self, config_cls: type, fixed: dict[str, Any]) -> Any:
        a = self.args
        names = {f.name for f in fields(config_cls) if f.init}
        shared = {f.name: getattr(a, f.name) for f in fields(a)
                  if f.init and f.name in names and f.name not in ("preset", "train_batch_size",
                                                                   "rollout_buffer_size")}
        shared.update(fixed)
        shared.update(num_agents=len(self.players), lora_r=0, share_model=False,
                      output_dir=f"{a.output_dir}/rl", plot=False)
        if "critic_placement" in names:  # IAC/MAAC (critic_type and the critic's settings: same names)
            shared["critic_placement"] = "separate" if (a.use_separate_critic or a.rl_algorithm == "maac") else "head"
        return config_cls(**shared)

    def run_rl(self) -> dict[str, Any]:
        """Train the agents with the RL backend on the frozen reward model (env reward replaced
        by its score); evaluation stays on the task reward. Returns the backend's last training
        metrics."""
        from collab_env.rewards.joint import JointReward

        if self.reward_model is None:
            raise ConfigError("run_rl() needs a reward model: call train() (or train_reward_model(pairs)) first.")
        a = self.args
        trainer_cls, config_cls, fixed = _backend(a.rl_algorithm)
        rm_env = JointReward(self.train_env, self.reward_model.as_reward_func(prompt_from="prompts"),
                             agents=list(self.players), name="reward_model")
        models = [pm.model for pm in self.models]  # the same modules: the backend trains them in place
        toks = [pm.tokenizer for pm in self.models]
        backend = trainer_cls(agent_model=models, tokenizer=toks, env=rm_env, eval_env=self.eval_env,
                              policies=self.others, trained_players=list(self.players),
                              args=self._backend_config(config_cls, fixed))
        backend.logger.close()
        backend.logger = self.logger  # one metrics.jsonl for the whole run
        backend.state.env_step = self.state.env_step
        backend.state.last_log_step = self.state.env_step
        self.rl_trainer = backend
        last = backend.train()
        self.state.env_step = backend.state.env_step
        self.state.optimizer_steps += backend.state.optimizer_steps
        self.state.evaluations += backend.state.evaluations
        for pm in self._unique:
            pm.version += 1  # a vLLM engine of ours must resync the weights the backend changed
        return last

    def train(self) -> dict[str, Any]:
        """Collect preferences with the task reward, train and freeze the reward model, run the
        RL backend on it. Returns the RL stage's last training metrics (``{}`` when the task
        reward gave no preference pair)."""
        if self.train_env is None:
            raise ConfigError("train() needs train_dataset= (or env=).")
        if self.args.share_model:
            raise ConfigError("MARLHFTrainer trains one model per agent: leave share_model=False.")
        pairs = self.collect_pairs()
        if not pairs:
            return {}
        self.train_reward_model(pairs)
        last = self.run_rl()
        if self.args.plot:
            self.logger.plot()
        self.logger.wrote(Path(self.args.output_dir) / "reward_model" / "metrics.jsonl")
        self.logger.summary("MARLHF", {"preference pairs": len(pairs), "RL items": self.rl_trainer.state.items_done,
                                       "optimiser steps": self.state.optimizer_steps})
        return last

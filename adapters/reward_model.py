"""A learned joint reward model: Bradley-Terry on preference pairs of the agents' joint responses.

Any RL trainer of :mod:`collab_env.adapters` takes its reward as a CoMLRL ``reward_func``; this
module learns one from preferences instead of writing it by hand::

    from collab_env.adapters.reward_model import RewardModelConfig, RewardModelTrainer

    pairs = [{"prompt": "Describe Paris.",
              "chosen":   ["Paris is the capital.", "It has the Louvre, the Seine and 2M people."],
              "rejected": ["Paris is the capital.", "It is a city."]}, ...]
    trainer = RewardModelTrainer(model="embedded", train_dataset=pairs[:800],
                                 eval_dataset=pairs[800:], args=RewardModelConfig(num_agents=2))
    trainer.train()
    trainer.evaluate()                 # eval/accuracy, eval/loss, eval/margin
    trainer.save_model("rm")           # or JointRewardModel.from_pretrained("rm") later

    rm = trainer.reward_model          # JointRewardModel
    rm.score(["Describe Paris."], [["Paris is the capital.", "It has the Louvre."]])  # [float]
    MAGRPOTrainer(agent_model="embedded", num_agents=2, formatters=formatters,
                  reward_func=rm.as_reward_func(), train_dataset=items, args=...)

**Data.** Rows (a ``datasets.Dataset`` or a list of dicts) with ``prompt`` (the task: a string,
or a list with one prompt per agent), ``chosen`` and ``rejected`` (the joint responses: a list
with one completion per agent, in agent order, or a string when there is one agent).

**Text and model** (:mod:`~collab_env.adapters.common.joint_reward`): a joint sample becomes one
text through :class:`JointTemplate` (``Task: <prompt>``, then ``Agent k: <completion>`` lines),
tokenised with the EOS appended, its last ``max_length`` tokens kept; the reward is a linear head
(float32) on the hidden state of that last token of the causal LM (a folder, a hub id,
``"embedded"`` or a loaded model; LoRA through ``peft``).

**Loss.** Bradley-Terry: ``P(chosen > rejected) = sigmoid(r_c - r_r)``, so the loss of a pair is
``-log sigmoid(r_c - r_r)`` (:func:`bradley_terry_loss`); ``center_rewards_coefficient`` adds
``c * (r_c + r_r)^2`` to keep the rewards near 0 (BT only fixes their differences).

**Evaluation.** ``eval/accuracy`` is the fraction of pairs with ``r_c > r_r`` (a tie counts 1/2,
so a constant model scores 0.5), with ``eval/loss``, ``eval/margin`` (mean ``r_c - r_r``) and the
mean rewards. Logs go to ``<output_dir>/metrics.jsonl`` (``env_step`` = optimiser steps).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import field
from pathlib import Path
from typing import Any

from collab_env.adapters.common.config import TrainerConfig, check_float, check_int, learner_config
from collab_env.adapters.common.joint_reward import (
    JointRewardModel,
    JointTemplate,
    pair_rewards,
)
from collab_env.adapters.common.learner import epoch_order
from collab_env.adapters.common.logging import MetricsLogger
from collab_env.adapters.common.loop import RunState, Schedule, run
from collab_env.adapters.common.models import adamw, apply_lora, make_scheduler
from collab_env.adapters.common.pairs import JointPair, read_joint_pairs
from collab_env.errors import ConfigError, DataSchemaError

__all__ = ["RewardModelConfig", "RewardModelTrainer", "bradley_terry_loss"]


# ---------------------------------------------------------------------------------------------
# The loss
# ---------------------------------------------------------------------------------------------
def bradley_terry_loss(chosen, rejected):
    """``[B]`` Bradley-Terry loss ``-log sigmoid(r_c - r_r)`` of each pair (float32).

    Example: ``r_c = 1, r_r = 0`` gives ``log(1 + e^-1) = 0.3132617``; a tie gives ``log 2``.
    """
    import torch.nn.functional as F

    return -F.logsigmoid(chosen.float() - rejected.float())


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------
@learner_config
class RewardModelConfig(TrainerConfig):
    """Configuration of :class:`RewardModelTrainer`. Every field of
    :class:`~collab_env.adapters.common.config.TrainerConfig` applies (``share_model`` does not:
    there is one model); ``per_device_train_batch_size`` is pairs per forward pass, and
    ``max_steps``, ``eval_interval``, ``save_steps`` and ``logging_steps`` count optimiser
    steps."""

    num_agents: int | None = None
    """Completions per joint response; ``None``: taken from the first training row. Every row
    (and every scored sample later) must have this many."""
    max_length: int | None = 512
    """Longest input in tokens; longer texts keep their last ``max_length`` tokens (the agents'
    answers). ``None``: no limit."""
    append_eos: bool = True
    """End every input with the EOS token, whose hidden state is scored."""
    template: JointTemplate = field(default_factory=JointTemplate)
    """How a joint sample becomes text (module docstring)."""
    gradient_accumulation_steps: int = 1
    """Forward/backward passes per optimiser step."""
    center_rewards_coefficient: float = 0.0
    """Weight of ``(r_c + r_r)^2`` added to the loss to keep rewards centred on 0."""
    shuffle: bool = True
    """Shuffle the pairs every epoch (seeded by ``seed`` and the epoch)."""
    eval_num_samples: int = 256
    """Evaluation pairs used (at most), from the start of the evaluation set."""
    eval_batch_size: int = 16
    """Evaluation pairs per forward pass."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("num_agents", self.num_agents, 1, allow_none=True)
        check_int("max_length", self.max_length, 2, allow_none=True)
        for name in ("append_eos", "shuffle"):
            if getattr(self, name) not in (True, False):
                raise ConfigError(f"{name} must be True or False, got {getattr(self, name)!r}.")
        if isinstance(self.template, Mapping):
            self.template = JointTemplate(**self.template)
        if not isinstance(self.template, JointTemplate):
            raise ConfigError(f"template must be a JointTemplate or a dict of its fields, "
                              f"got {type(self.template).__name__}.")
        check_int("gradient_accumulation_steps", self.gradient_accumulation_steps, 1)
        check_float("center_rewards_coefficient", self.center_rewards_coefficient, 0.0)
        if self.share_model:
            raise ConfigError("share_model does not apply to a reward model (there is one model); leave it False.")



def _pair_sums(losses, rc, rr) -> dict[str, float]:
    d = (rc - rr).detach()
    return {"loss": float(losses.detach().sum()),
            "accuracy": float((d > 0).float().sum() + 0.5 * (d == 0).float().sum()),
            "margin": float(d.sum()), "chosen_reward": float(rc.detach().sum()),
            "rejected_reward": float(rr.detach().sum())}


class RewardModelTrainer:
    """Train a :class:`JointRewardModel` with the Bradley-Terry loss (module docstring).

    Args:
        model: A folder, a hub id, ``"embedded"``, a loaded causal LM, or a
            :class:`JointRewardModel` to keep training.
        train_dataset: Preference rows (``prompt``, ``chosen``, ``rejected``).
        eval_dataset: Same format; ``None``: :meth:`evaluate` returns ``{}``.
        args: A :class:`RewardModelConfig`.
        tokenizer: A tokenizer (or folder); default: the model folder's.
        wandb_config: ``None`` or Weights & Biases settings (see
            :class:`~collab_env.adapters.common.logging.MetricsLogger`).

    Attributes:
        reward_model: The :class:`JointRewardModel` being trained (score it, save it, or pass
            ``reward_model.as_reward_func()`` to an RL trainer).
    """

    def __init__(self, model: Any = None, train_dataset: Any = None, eval_dataset: Any = None,
                 args: RewardModelConfig | None = None, *, tokenizer: Any = None,
                 wandb_config: Mapping[str, Any] | None = None) -> None:
        import torch

        args = RewardModelConfig() if args is None else args
        if not isinstance(args, RewardModelConfig):
            raise ConfigError(f"args must be a RewardModelConfig, got {type(args).__name__}.")
        if model is None:
            raise ConfigError("model is required: a model folder, a hub id, 'embedded', a loaded causal LM "
                              "or a JointRewardModel.")
        if train_dataset is None and eval_dataset is None:
            raise ConfigError("pass train_dataset= (and optionally eval_dataset=).")
        self.args = args
        self.train_pairs = read_joint_pairs(train_dataset, "train_dataset", args.num_agents)
        num_agents = args.num_agents
        if num_agents is None and self.train_pairs:
            num_agents = len(self.train_pairs[0][1])
        self.train_pairs = read_joint_pairs(train_dataset, "train_dataset", num_agents)  # all rows agree
        self.eval_pairs = read_joint_pairs(eval_dataset, "eval_dataset", num_agents)
        if num_agents is None and self.eval_pairs:
            num_agents = len(self.eval_pairs[0][1])
            self.eval_pairs = read_joint_pairs(eval_dataset, "eval_dataset", num_agents)
        if train_dataset is not None and not self.train_pairs:
            raise DataSchemaError("train_dataset has no rows.")
        torch.manual_seed(args.seed)
        if isinstance(model, JointRewardModel):
            rm = model
            if rm.num_agents is not None and num_agents is not None and rm.num_agents != num_agents:
                raise ConfigError(f"the reward model scores {rm.num_agents} agent(s) but the data has {num_agents}.")
            rm.num_agents = rm.num_agents if num_agents is None else num_agents
        else:
            rm = JointRewardModel.from_model(model, tokenizer, device=args.device, dtype=args.dtype, seed=args.seed,
                                             template=args.template, max_length=args.max_length,
                                             append_eos=args.append_eos, num_agents=num_agents)
            if args.lora_r > 0:
                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(args.seed)
                    rm.lm = apply_lora(rm.lm, args)
        checkpointing = args.gradient_checkpointing
        if checkpointing is None:
            checkpointing = rm.device.type == "cuda"
        if checkpointing:
            rm.lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            if args.lora_r > 0 and hasattr(rm.lm, "enable_input_require_grads"):
                rm.lm.enable_input_require_grads()
        self.reward_model = rm
        params = rm.parameters()
        self.optimizer = adamw(params, args)
        self.scheduler = make_scheduler(self.optimizer, args, self._planned_steps())
        self.state = RunState()
        self.logger = MetricsLogger(args.output_dir, {**args.to_dict(), "num_agents": num_agents}, wandb_config)

    # -- schedule ---------------------------------------------------------------------------------
    def _batch_pairs(self) -> int:
        return self.args.per_device_train_batch_size * self.args.gradient_accumulation_steps

    def _steps_per_epoch(self) -> int:
        return max(1, math.ceil(len(self.train_pairs) / self._batch_pairs()))

    def _planned_steps(self) -> int:
        steps = self._steps_per_epoch() * self.args.num_train_epochs
        return min(steps, self.args.max_steps) if self.args.max_steps > 0 else steps

    def _order(self, epoch: int) -> list[int]:
        return epoch_order(len(self.train_pairs), self.args.shuffle, self.args.seed, epoch)

    # -- one optimiser step -----------------------------------------------------------------------
    def training_step(self, pairs: Sequence[JointPair]) -> dict[str, float]:
        """One optimiser step on ``pairs`` (micro-batches of ``per_device_train_batch_size``; the
        loss is the mean over all pairs, so accumulation is exact). Returns the step's metrics."""
        import torch

        a, rm, n = self.args, self.reward_model, len(pairs)
        if not n:
            raise ConfigError("training_step() needs at least one pair.")
        rm.train()
        self.optimizer.zero_grad(set_to_none=True)
        sums: dict[str, float] = {}
        for k in range(0, n, a.per_device_train_batch_size):
            chunk = pairs[k:k + a.per_device_train_batch_size]
            rc, rr = pair_rewards(rm, chunk)
            losses = bradley_terry_loss(rc, rr)
            total = losses.sum()
            if a.center_rewards_coefficient:
                total = total + a.center_rewards_coefficient * ((rc + rr) ** 2).sum()
            (total / n).backward()
            for key, v in _pair_sums(losses, rc, rr).items():
                sums[key] = sums.get(key, 0.0) + v
        clip = a.max_grad_norm if a.max_grad_norm is not None else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(rm.parameters(), clip)
        self.optimizer.step()
        self.scheduler.step()
        rm.eval()
        out = {k: v / n for k, v in sums.items()}
        out.update(grad_norm=float(grad_norm), pairs=float(n), learning_rate=float(self.scheduler.get_last_lr()[0]))
        return out

    # -- the run ----------------------------------------------------------------------------------
    def train(self) -> dict[str, Any]:
        """Train for ``num_train_epochs`` (or ``max_steps`` optimiser steps), evaluating every
        ``eval_interval`` steps and at the end; returns the last logged training metrics."""

        if not self.train_pairs:
            raise ConfigError("train() needs train_dataset=.")
        return run(self)

    def schedule(self) -> Schedule:
        """Optimiser steps; evaluation before step ``s`` when ``s % eval_interval == 0`` and
        after the last; logs every ``logging_steps`` steps; the model saved every
        ``save_steps`` steps."""
        a = self.args
        return Schedule(unit="step", per_epoch=self._steps_per_epoch(), limit=self._planned_steps(),
                        epochs=a.num_train_epochs, eval_every=a.eval_interval, eval_rule="done",
                        can_evaluate=bool(self.eval_pairs), final_eval=True, log_every=a.logging_steps,
                        log_item=False, log_next_epoch=True, save_every=a.save_steps, desc="RewardModel")

    def train_step(self, batch: Sequence[int]) -> dict[str, float]:
        """:meth:`training_step` on the ``batch[0]``-th slice of this epoch's shuffled pairs."""
        nb = self._batch_pairs()
        order = self._order(self.state.epoch)
        metrics = self.training_step([self.train_pairs[i] for s in batch for i in order[s * nb:(s + 1) * nb]])
        self.state.optimizer_steps += 1
        return {**metrics, "env_steps": 1}

    def end_epoch(self) -> dict[str, float]:
        """Nothing to do at an epoch's end: ``{}``."""
        return {}

    def save_checkpoint(self, path: str | Path | None = None) -> Path:
        """:meth:`save_model` into ``path`` (default ``<output_dir>/checkpoint-<step>``)."""
        if path is None:
            path = Path(self.args.output_dir) / f"checkpoint-{self.state.optimizer_steps}"
        return self.save_model(path)

    def evaluate(self, num_eval_samples: int | None = None, eval_dataset: Any = None) -> dict[str, float]:
        """Bradley-Terry loss, pairwise accuracy (ties count 1/2), margin and mean rewards on the
        first ``num_eval_samples`` evaluation pairs (default ``args.eval_num_samples``), without
        updating weights; ``eval_dataset`` replaces the trainer's for this call. Logs and returns
        ``eval/...`` metrics (``{}`` without evaluation pairs)."""
        import torch

        n = self.args.eval_num_samples if num_eval_samples is None else num_eval_samples
        check_int("num_eval_samples", n, 0)
        pool = self.eval_pairs if eval_dataset is None else read_joint_pairs(
            eval_dataset, "eval_dataset", self.reward_model.num_agents)
        pairs = pool[:n]
        if not pairs:
            return {}
        rm = self.reward_model
        was_training = rm.lm.training
        rm.eval()
        sums: dict[str, float] = {}
        with torch.no_grad():
            for k in range(0, len(pairs), self.args.eval_batch_size):
                rc, rr = pair_rewards(rm, pairs[k:k + self.args.eval_batch_size])
                for key, v in _pair_sums(bradley_terry_loss(rc, rr), rc, rr).items():
                    sums[key] = sums.get(key, 0.0) + v
        rm.train(was_training)
        self.state.evaluations += 1
        metrics = {f"eval/{k}": v / len(pairs) for k, v in sums.items()}
        metrics["eval/pairs"] = float(len(pairs))
        self.logger.log(metrics, env_step=self.state.env_step, epoch=self.state.epoch)
        return metrics

    def save_model(self, path: str | Path | None = None) -> Path:
        """Save the reward model (default ``<output_dir>/reward_model``); reload it with
        :meth:`JointRewardModel.from_pretrained`. (Weights only: optimiser state is not saved.)"""
        path = Path(path) if path is not None else Path(self.args.output_dir) / "reward_model"
        return self.reward_model.save_pretrained(path)

    def close(self) -> None:
        """Finish logging (closes the Weights & Biases run)."""
        self.logger.close()

"""Turn-level credit on TRL: :class:`TurnCreditGRPOTrainer`, a ``GRPOTrainer`` whose advantages are
per token, each move of the episode credited by its own reward.

TRL's ``GRPOTrainer`` gives every token of a completion the one advantage of its row (the
group-normalised episode reward). Its loss accepts advantages of shape ``(B, T)`` from a
subclass; this one replaces them after TRL has scored the batch::

    from trl import GRPOConfig
    from collab_env.adapters import trl as ce_trl

    trainer = ce_trl.TurnCreditGRPOTrainer(
        model, reward_funcs=ce_trl.episode_reward, train_dataset=ce_trl.dataset("hidden-facts", n=64),
        rollout_func=ce_trl.rollout_func(lambda: collab_env.make("hidden-facts", reward="mr", ...)),
        args=GRPOConfig(num_generations=4, max_completion_length=64))

Each row is one episode (:func:`~collab_env.adapters.trl.rollout.rollout_func`); its output carries
``turn_rewards`` (each move's credit: under the multiturn-aware reward, that reply's MR plus
the env's rewards until the player's next move) and ``turn_ids`` (which move wrote each
completion token). The rows of one prompt (TRL's group of ``num_generations`` consecutive rows)
are compared move position by move position
(:func:`~collab_env.adapters.common.turn_credit.turn_advantages`: MT-GRPO's turn-level grouping):
the tokens of move ``k`` get ``(r_k - mean_k) / (std_k + 1e-4)`` over the group's ``k``-th moves,
with TRL's Bessel-corrected std under ``scale_rewards="group"`` (the default) and no division
under ``"none"``; user and env tokens get 0 (they are masked out of the loss anyway). A move
position only one row of the group reached gets 0. Everything else (the loss type, clipping,
KL, the reward functions' logging) is TRL's; the reward functions still produce the logged
episode reward, which no longer drives the update.

Limits: ``scale_rewards="batch"`` and TRL's multi-objective ``normalize_then_sum`` have no
per-turn counterpart here (a :class:`~collab_env.errors.ConfigError` says so), and the groups
must be on one process (TRL gathers rewards across processes before grouping; the per-token
credit is not gathered): train with one process, or on verl/SkyRL for several machines.
"""

from __future__ import annotations

from typing import Any

from trl import GRPOTrainer

from collab_env.adapters.common.turn_credit import Scale, token_advantages, turn_advantages
from collab_env.adapters.trl.rollout import RolloutFunc
from collab_env.errors import ConfigError

__all__ = ["TurnCreditGRPOTrainer"]


class TurnCreditGRPOTrainer(GRPOTrainer):
    """TRL's ``GRPOTrainer`` with per-turn advantages (module docstring). Takes the same
    arguments; ``rollout_func`` must be a :func:`~collab_env.adapters.trl.rollout.rollout_func`.

    Raises:
        ConfigError: no collab_env ``rollout_func``, ``scale_rewards="batch"``, the
            ``normalize_then_sum`` aggregation, or more than one process.
    """

    def __init__(self, *args: Any, rollout_func: Any = None, **kwargs: Any) -> None:
        if not isinstance(rollout_func, RolloutFunc):
            raise ConfigError("TurnCreditGRPOTrainer credits the moves of collab_env episodes: pass "
                              "rollout_func=collab_env.adapters.trl.rollout_func(...).")
        kwargs["rollout_func"] = rollout_func
        super().__init__(*args, **kwargs)
        if self.scale_rewards not in ("group", "none"):
            raise ConfigError(f"TurnCreditGRPOTrainer compares each move with the same move of its group: "
                              f"scale_rewards must be 'group' or 'none', got {self.scale_rewards!r}.")
        if self.multi_objective_aggregation != "sum_then_normalize":
            raise ConfigError("TurnCreditGRPOTrainer needs multi_objective_aggregation='sum_then_normalize' "
                              "(the per-turn credit is one reward per move).")
        if self.accelerator.num_processes != 1:
            raise ConfigError("TurnCreditGRPOTrainer groups the moves on one process; train with one process "
                              "(or on verl / SkyRL for several machines).")

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        out = super()._generate_and_score_completions(inputs)
        # TRL merged the rollout's extra fields into the rows (in place) for the reward functions.
        missing = [i for i, row in enumerate(inputs) if "turn_ids" not in row or "turn_rewards" not in row]
        if missing:
            raise ConfigError(f"rows {missing[:5]} carry no turn_ids/turn_rewards: the rollout_func is not "
                              "collab_env's (collab_env.adapters.trl.rollout_func).")
        width = out["completion_ids"].shape[1]
        group = self.num_generations if self.model.training else self.num_generations_eval
        assert group is not None  # TRL's config types allow None; the trainer resolves both to ints
        if len(inputs) % group:
            raise ConfigError(f"{len(inputs)} rows do not split into groups of {group}.")
        scale: Scale = "sample" if self.scale_rewards == "group" else "none"
        rows: list[list[float]] = []
        for start in range(0, len(inputs), group):
            members = inputs[start:start + group]
            per_turn = turn_advantages([m["turn_rewards"] for m in members], scale=scale)
            for m, adv in zip(members, per_turn, strict=True):
                tokens = token_advantages(m["turn_ids"], adv)
                if len(tokens) > width:
                    raise ConfigError(f"a row has {len(tokens)} completion tokens but the batch is {width} wide.")
                rows.append(tokens + [0.0] * (width - len(tokens)))
        device = out["advantages"].device
        out["advantages"] = torch.tensor(rows, dtype=torch.float32, device=device)
        return out

"""Adapters: learners and integrations that train policies on collab_env environments
(installed as ``collab_env.adapters``).

Every trainer and config is importable from here, as in CoMLRL::

    from collab_env.adapters import MAGRPOConfig, MAGRPOTrainer

Importing this package imports nothing heavy: a name loads its module (and torch) on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

#: Public name -> the module under ``collab_env.adapters`` that defines it.
_EXPORTS: dict[str, str] = {
    # MAGRPO / GRPO
    "MAGRPOConfig": "magrpo",
    "MAGRPOTrainer": "magrpo",
    # REINFORCE family
    "MAREINFORCEConfig": "reinforce",
    "MAREINFORCETrainer": "reinforce",
    "MARLOOConfig": "reinforce",
    "MARLOOTrainer": "reinforce",
    "MAReMaxConfig": "reinforce",
    "MAReMaxTrainer": "reinforce",
    # actor-critic
    "ActorCriticConfig": "actor_critic",
    "IACConfig": "actor_critic",
    "IACTrainer": "actor_critic",
    "MAACConfig": "actor_critic",
    "MAACTrainer": "actor_critic",
    # preference learning and supervised fine-tuning
    "DPOConfig": "dpo",
    "DPOTrainer": "dpo",
    "OnlineDPOConfig": "dpo",
    "OnlineDPOTrainer": "dpo",
    "SFTConfig": "sft",
    "SFTTrainer": "sft",
    "RewardModelConfig": "reward_model",
    "RewardModelTrainer": "reward_model",
    "JointRewardModel": "common.joint_reward",
    # CoMLRL's preference trainers
    "MADPOConfig": "madpo",
    "MADPOTrainer": "madpo",
    "MARLHFConfig": "marlhf",
    "MARLHFTrainer": "marlhf",
    # shared toolkit
    "TrainerConfig": "common.config",
    "RunState": "common.loop",
    "Schedule": "common.loop",
    "Learner": "common.loop",
    "TaskSource": "common.task",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        from collab_env.errors import did_you_mean

        raise AttributeError(
            f"module 'collab_env.adapters' has no attribute {name!r}.{did_you_mean(name, _EXPORTS)}"
        )
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # later look-ups skip this function
    return value


#: The public names of CoMLRL 1.4.3's trainer modules (``comlrl.trainers.<module>``), for the
#: error a CoMLRL import path gets here: one import path per name, so no alias modules.
COMLRL_MODULE_NAMES: dict[str, tuple[str, ...]] = {
    "reinforce": ("CentralizedMAGRPOConfig", "CentralizedMAGRPOTrainer", "MAGRPOConfig", "MAGRPOTrainer",
                  "MAREINFORCEConfig", "MAREINFORCETrainer", "MARLOOConfig", "MARLOOTrainer", "MAReMaxConfig",
                  "MAReMaxTrainer"),
    "actor_critic": ("ActorCriticTrainerBase", "IACConfig", "IACTrainer", "MAACConfig", "MAACTrainer",
                     "RolloutSample"),
}


def comlrl_path_error(module: str, name: str) -> AttributeError | ImportError:
    """The error for ``from collab_env.adapters.<module> import <name>``, where ``module`` is
    also a CoMLRL module (``comlrl.trainers.reinforce``...) but ``name`` is defined elsewhere
    here: an ``ImportError`` naming the import that works (or saying there is no counterpart);
    for any other name the plain ``AttributeError``."""
    short = module.rsplit(".", 1)[-1]
    if name not in COMLRL_MODULE_NAMES.get(short, ()):
        return AttributeError(f"module {module!r} has no attribute {name!r}")
    if name in _EXPORTS:
        return ImportError(f"{name} is not in {module}: CoMLRL's comlrl.trainers.{short}.{name} is, here, "
                           f"`from collab_env.adapters import {name}` (one import path per name).", name=name)
    return ImportError(f"collab_env has no counterpart of CoMLRL's comlrl.trainers.{short}.{name}; the trainers "
                       f"it has are `from collab_env.adapters import ...`: {', '.join(sorted(_EXPORTS))}.", name=name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))

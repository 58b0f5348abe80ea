"""Learner configs are the common group plus only the field groups they use: no config carries a
field it refuses, the public constructors stay flat, and CoMLRL's names and presets still work."""

from __future__ import annotations

from dataclasses import dataclass, fields

import pytest

from collab_env.adapters.actor_critic import IACConfig
from collab_env.adapters.common.config import (
    PPOFields,
    RolloutFields,
    SamplingFields,
    TrainerConfig,
    TreeFields,
    learner_config,
    learner_sampling,
)
from collab_env.adapters.madpo import MADPOConfig
from collab_env.adapters.magrpo import MAGRPOConfig
from collab_env.adapters.marlhf import MARLHFConfig
from collab_env.adapters.reinforce import MAREINFORCEConfig, MAReMaxConfig
from collab_env.errors import ConfigError
from collab_env.policy import SamplingParams


def _names(group):
    return {f.name for f in fields(group)}


@pytest.mark.parametrize("config, groups, without", [
    (MAGRPOConfig, (TrainerConfig, SamplingFields, RolloutFields, TreeFields, PPOFields), ()),
    (MAREINFORCEConfig, (TrainerConfig, SamplingFields, RolloutFields, TreeFields), (PPOFields,)),
    (MADPOConfig, (TrainerConfig, SamplingFields, RolloutFields, TreeFields), (PPOFields,)),
    (MARLHFConfig, (MADPOConfig, PPOFields), ()),
    (IACConfig, (TrainerConfig, SamplingFields, RolloutFields), (TreeFields,)),
])
def test_each_config_is_the_groups_it_uses(config, groups, without):
    assert all(issubclass(config, g) for g in groups)
    for group in without:
        assert not issubclass(config, group)
        if group is PPOFields:
            assert not _names(config) & {"clip_range_high"}  # none of the group's fields rides along


def test_reinforce_has_no_ppo_fields_and_says_so_by_name():
    assert not _names(MAREINFORCEConfig) & _names(PPOFields)
    with pytest.raises(ConfigError, match="has no field 'num_iterations'"):
        MAReMaxConfig(num_iterations=2)


def test_the_flat_constructor_aliases_and_presets_still_work():
    cfg = MAGRPOConfig(num_generations=4, temperature=0.5, top_k=5, num_iterations=2, clip_range=0.1,
                       agent_learning_rate=0.1, advantage_normalization=True, num_agents=1)
    assert (cfg.num_generations, cfg.temperature, cfg.learning_rate, cfg.normalize_advantages) == (4, 0.5, 0.1, True)
    assert learner_sampling(cfg) == SamplingParams(temperature=0.5, top_p=1.0, top_k=5, max_new_tokens=256)
    assert MAREINFORCEConfig(preset="comlrl").temperature == 0.6  # CoMLRL's, for the fields it has
    with pytest.raises(ConfigError, match="num_generations"):
        MAGRPOConfig(num_generations=1)  # MAGRPO compares a group
    assert MAREINFORCEConfig(baseline="none", num_generations=1).num_generations == 1


def test_a_subclass_must_use_the_decorator():
    @learner_config
    class Good(MAGRPOConfig):
        extra: int = 1

    assert Good(agent_learning_rate=0.2, extra=3).learning_rate == 0.2

    @dataclass
    class Plain(MAGRPOConfig):
        extra: int = 1

    with pytest.raises(TypeError, match="learner_config"):
        Plain()

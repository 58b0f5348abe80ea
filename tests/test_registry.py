import gymnasium
import pytest

import collab_env
from collab_env.errors import ConfigError, UnknownEnvError
from collab_env.registry import EnvSpec, register, registry, spec


@pytest.fixture
def toy_versions():
    ids = []
    for v in (0, 1):
        s = register(EnvSpec(id=f"toy-writers-v{v}", entry_point="tests.toy_tasks:make_two_writers",
                             players=("agent_0", "agent_1", "user"), trainable=("agent_0", "agent_1"),
                             limits={"max_steps": 6}))
        ids.append(s.id)
    yield ids
    for i in ids:
        registry.pop(i, None)
        gymnasium.registry.pop(f"collab_env/{i}", None)


def test_unversioned_means_latest(toy_versions):
    assert spec("toy-writers").id == "toy-writers-v1"
    assert collab_env.make("toy-writers").spec.id == "toy-writers-v1"
    assert collab_env.make("toy-writers-v0").spec.id == "toy-writers-v0"
    with pytest.raises(UnknownEnvError, match="toy-writers-v0, toy-writers-v1"):
        collab_env.make("toy-writers-v7")


def test_typo_suggests_closest():
    with pytest.raises(UnknownEnvError, match="Did you mean 'hidden-facts'"):
        collab_env.make("hiden-facts")
    with pytest.raises(UnknownEnvError, match="collab-env list"):
        collab_env.make("zzzzzz")


def test_overrides_and_unknown_keywords():
    env = collab_env.make("hidden-facts", num_objects=3, max_steps=4)
    assert env.max_steps == 4 and env.spec.kwargs["num_objects"] == 3
    with pytest.raises(ConfigError, match="Did you mean 'num_objects'"):
        collab_env.make("hidden-facts", num_object=3)
    with pytest.raises(ConfigError, match="view="):
        collab_env.make("hidden-facts", policies={"user": "hidden-facts-user"})


def test_spec_is_data_and_validated():
    s = spec("hidden-facts")
    d = s.to_dict()
    assert d["players"] == ["assistant", "user"] and d["trainable"] == ["assistant"]
    assert s.name == "hidden-facts" and s.version == 0 and s.gym_id == "collab_env/hidden-facts-v0"
    with pytest.raises(ConfigError, match="name-vN"):
        EnvSpec(id="NoVersion", entry_point="x:y")
    with pytest.raises(ConfigError, match="trainable"):
        EnvSpec(id="bad-v0", entry_point="x:y", players=("a",), trainable=("b",))


def test_every_spec_matches_its_env():
    """Players and turn order declared as data agree with what the env does."""
    for env_id in collab_env.list_envs():
        s = spec(env_id)
        if s.needs_data:
            continue  # built from fixture files in test_conformance
        env = collab_env.make(env_id)
        assert env.possible_agents == list(s.players), env_id
        assert env.task.turn_order == s.turn_order, env_id
        if "max_steps" in s.limits:
            assert env.max_steps == s.limits["max_steps"], env_id


def test_gymnasium_registration():
    for env_id in collab_env.list_envs():
        assert f"collab_env/{env_id}" in gymnasium.registry
    env = gymnasium.make("collab_env/hidden-facts-v0")
    obs, info = env.reset(seed=0)
    assert obs.viewer == "assistant" and "opening" not in info
    assert collab_env.list_envs(suite="builtin") == ["hidden-facts-easy-v0", "hidden-facts-hard-v0", "hidden-facts-v0"]

import gymnasium
import pytest

import collab_env
from collab_env.errors import ConfigError, DeprecatedEnvWarning, UnknownEnvError
from collab_env.registry import EnvCard, EnvSpec, deprecation_message, list_envs, register, registry, spec
from collab_env.testing.versions import building


@pytest.fixture
def toy_versions():
    ids = []
    for v, note in ((0, "the writers take turns"), (1, "")):
        s = register(EnvSpec(id=f"toy-writers-v{v}", entry_point="tests.toy_tasks:make_two_writers",
                             players=("agent_0", "agent_1", "user"), trainable=("agent_0", "agent_1"),
                             limits={"max_steps": 6}, superseded=note))
        ids.append(s.id)
    yield ids
    for i in ids:
        registry.pop(i, None)
        gymnasium.registry.pop(f"collab_env/{i}", None)


def test_unversioned_means_latest(toy_versions):
    assert spec("toy-writers").id == "toy-writers-v1"
    assert collab_env.make("toy-writers").spec.id == "toy-writers-v1"
    with pytest.warns(DeprecatedEnvWarning):
        assert collab_env.make("toy-writers-v0").spec.id == "toy-writers-v0"
    with pytest.raises(UnknownEnvError, match="toy-writers-v0, toy-writers-v1"):
        collab_env.make("toy-writers-v7")


def test_a_superseded_version_warns_what_changed_and_the_id_to_use(toy_versions, recwarn):
    """As Gymnasium warns about an out-of-date version: the old id still builds (results recorded
    on it reproduce), with a warning of its own category naming the change and the latest id,
    pointing at the caller's line; the latest version, named or not, builds silently."""
    with pytest.warns(DeprecatedEnvWarning) as caught:
        collab_env.make("toy-writers-v0")
    (w,) = [w for w in caught if w.category is DeprecatedEnvWarning]
    assert str(w.message).startswith("toy-writers-v0 is superseded by toy-writers-v1. What changed: "
                                      "v1: the writers take turns. Use 'toy-writers-v1'")
    assert w.filename == __file__  # the user's make call, not the composer inside the library
    recwarn.clear()
    collab_env.make("toy-writers-v1"), collab_env.make("toy-writers")
    assert not [w for w in recwarn if issubclass(w.category, DeprecatedEnvWarning)]
    assert deprecation_message("toy-writers-v1") == "" and "toy-writers-v0" not in list_envs(superseded=False)
    assert "toy-writers-v1" in list_envs(superseded=False) and "toy-writers-v0" in list_envs()


def test_every_superseded_builtin_id_says_what_changed():
    """Each built-in version that a newer one replaces carries its note (the warning's "what
    changed"); the latest versions carry none."""
    for env_id in list_envs():
        s = spec(env_id)
        latest = spec(s.name)
        assert bool(s.superseded) == (latest.id != env_id), env_id
        if latest.id != env_id:
            assert "no note" not in deprecation_message(env_id) and latest.id in deprecation_message(env_id)
    assert "keyword" in deprecation_message("hidden-facts-v0")  # the gameable v0 user is named


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
    assert s.name == "hidden-facts" and s.version == 3 and s.gym_id == "collab_env/hidden-facts-v3"
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
        with building(env_id):  # every id, superseded ones too (they must stay reproducible)
            env = collab_env.make(env_id)
        assert env.possible_agents == list(s.players), env_id
        assert env.task.turn_order == s.turn_order, env_id
        if "max_steps" in s.limits:
            assert env.max_steps == s.limits["max_steps"], env_id


def test_gymnasium_registration():
    for env_id in collab_env.list_envs():
        assert f"collab_env/{env_id}" in gymnasium.registry
    env = gymnasium.make("collab_env/hidden-facts-v3")
    obs, info = env.reset(seed=0)
    assert obs.viewer == "assistant" and "opening" not in info
    builtin = collab_env.list_envs(suite="builtin")  # other builtin suites may join these
    assert {"hidden-facts-easy-v0", "hidden-facts-hard-v0", "hidden-facts-v0"} <= set(builtin)
    assert builtin == sorted(builtin) and "length-ratio-v0" not in builtin


# ---------------------------------------------------------------------------------------------
# Env cards
# ---------------------------------------------------------------------------------------------
def _card(**overrides):
    fields = dict(
        tests="Whether two writers agree.",
        players={"agent_0": "writes", "agent_1": "writes too"},
        sees={"agent_0": "the prompt", "agent_1": "the prompt"},
        reward="1 if they agree else 0",
        reward_range={"default": (0, 1), "mr": (-float("inf"), 1.0)},
        limits="one turn",
        data="generated",
        licence="MIT (generated by this package)",
        baselines={"scripted": "success 1.000 (200 ep)"},
    )
    fields.update(overrides)
    return EnvCard(**fields)


def test_card_validation_names_the_field_and_the_fix():
    with pytest.raises(ConfigError, match="EnvCard.tests must be a non-empty string"):
        _card(tests="  ")
    with pytest.raises(ConfigError, match="EnvCard.baselines is empty: give one entry per reference"):
        _card(baselines={})
    with pytest.raises(ConfigError, match=r"EnvCard.sees\['agent_1'\] must map"):
        _card(sees={"agent_0": "x", "agent_1": ""})
    with pytest.raises(ConfigError, match="needs a 'default' entry"):
        _card(reward_range={"mr": (0, 1)})
    with pytest.raises(ConfigError, match=r"reward_range\['mr'\] = \(1.0, 0.0\) is not an interval"):
        _card(reward_range={"default": (0, 1), "mr": (1, 0)})
    with pytest.raises(ConfigError, match="must be a pair"):
        _card(reward_range={"default": (0, 1, 2)})
    with pytest.raises(ConfigError, match="players must be a mapping"):
        _card(players=["agent_0"])


def test_card_is_frozen_and_normalised():
    c = _card()
    assert c.reward_range["default"] == (0.0, 1.0) and isinstance(c.reward_range["default"][0], float)
    with pytest.raises(TypeError, match="read-only"):
        c.players["agent_0"] = "changed"  # read-only mapping: the card is data
    with pytest.raises(TypeError, match="read-only"):
        c.reward_range.update(mr=(0, 0))
    import pickle

    assert pickle.loads(pickle.dumps(c)) == c and hash(c) == hash(_card())  # envs pickle their spec
    with pytest.raises(AttributeError):
        c.tests = "x"
    assert c == _card()


def test_spec_checks_its_card_against_players_and_default_range():
    base = dict(id="carded-v0", entry_point="tests.toy_tasks:make_two_writers",
                players=("agent_0", "agent_1"), reward_range=(0.0, 1.0))
    EnvSpec(**base, card=_card())
    with pytest.raises(ConfigError, match=r"card's players must name every player .*missing \['agent_1'\]"):
        EnvSpec(**base, card=_card(players={"agent_0": "writes"}))
    with pytest.raises(ConfigError, match=r"card's sees .*unknown \['user'\]"):
        EnvSpec(**base, card=_card(sees={"agent_0": "a", "agent_1": "b", "user": "c"}))
    with pytest.raises(ConfigError, match=r"default reward range \[0.0, 2.0\] differs .* \[0.0, 1.0\]"):
        EnvSpec(**base, card=_card(reward_range={"default": (0, 2)}))
    with pytest.raises(ConfigError, match="card must be an EnvCard"):
        EnvSpec(**base, card={"tests": "x"})


def test_card_round_trips_through_to_dict_and_json():
    import json

    c = _card()
    d = c.to_dict()
    assert d["reward_range"] == {"default": [0.0, 1.0], "mr": [-float("inf"), 1.0]}
    assert EnvCard.from_dict(json.loads(json.dumps(d))) == c
    with pytest.raises(ConfigError, match=r"unknown keys \['extra'\], missing keys \['tests'\]"):
        EnvCard.from_dict({**{k: v for k, v in d.items() if k != "tests"}, "extra": 1})
    s = EnvSpec(id="carded-v0", entry_point="x:y", players=("agent_0", "agent_1"),
                reward_range=(0.0, 1.0), card=c)
    sd = json.loads(json.dumps(s.to_dict()))
    assert EnvCard.from_dict(sd["card"]) == c
    assert EnvSpec(id="plain-v0", entry_point="x:y").to_dict()["card"] is None


def test_card_text_forms():
    c = _card()
    assert EnvCard.format_range((-float("inf"), 1.0)) == "[-inf, 1]"
    assert EnvCard.format_range((-0.5, 2.25)) == "[-0.5, 2.25]"
    lines = dict(c.lines())
    assert lines["players"] == "agent_0: writes; agent_1: writes too"
    assert lines["reward range"] == "default [0, 1]; mr [-inf, 1]"
    doc = c.to_docstring("carded-v0")
    assert doc.splitlines()[0] == "Card of carded-v0:"
    assert "    baselines: scripted: success 1.000 (200 ep)" in doc.splitlines()


def test_every_registered_id_has_a_card_its_docstring_carries():
    """Every id has a complete card (EnvCard validates completeness), and its env's docstring
    (the entry point's module or function) carries the card's text, whitespace aside."""
    import importlib

    def squash(text):
        return " ".join((text or "").split())

    missing = [i for i in collab_env.list_envs() if spec(i).card is None]
    assert not missing, f"registered ids without a card: {missing}"
    lacking = []
    for env_id in collab_env.list_envs():
        s = spec(env_id)
        module_name, _, fn_name = s.entry_point.partition(":")
        module = importlib.import_module(module_name)
        docs = squash(module.__doc__) + " " + squash(getattr(module, fn_name).__doc__)
        if squash(s.card.to_docstring(env_id)) not in docs:
            lacking.append(f"{env_id} ({s.entry_point})")
    assert not lacking, (
        f"these envs' docstrings do not carry their cards: {lacking}; append "
        "spec(id).card.to_docstring(id) to the module or entry-point docstring (as "
        "collab_env.tasks.cards.docstring_cards does for the built-in ids)"
    )


# --- The engine builds base envs from factories; the composer composes (no late binding) ----------


def test_collab_env_make_is_the_composer_and_the_registry_builds_base_envs():
    import importlib
    import inspect

    from collab_env.rollout.jobs import COMPOSER_KEYWORDS

    compose = importlib.import_module("collab_env.compose")
    reg = importlib.import_module("collab_env.registry")  # the attribute collab_env.registry is the dict

    assert collab_env.make is compose.make
    assert not hasattr(reg, "make") and not hasattr(reg, "set_composer")  # no late-bound composer
    base = reg.make_base_env("hidden-facts", max_steps=4)
    assert type(base) is type(collab_env.make("hidden-facts", max_steps=4)) and base.spec.kwargs["max_steps"] == 4
    # The keywords an id-building engine refuses are exactly the composer's own.
    own = set(inspect.signature(compose.make).parameters) - {"env_id", "render_mode", "overrides"}
    assert own == set(COMPOSER_KEYWORDS)


def test_every_registered_id_builds_through_the_composer_and_the_engine():
    from collab_env.registry import list_envs, make_base_env

    for env_id in list_envs():
        s = spec(env_id)
        if s.needs_data:
            continue  # built offline in the tasks' own tests (data_files=)
        with building(env_id):
            assert collab_env.make(env_id).spec.id == env_id
            assert make_base_env(env_id).spec.id == env_id


def test_the_rollout_engine_builds_an_id_s_base_env_and_asks_for_a_factory_to_compose():
    from collab_env.rollout import RolloutEngine

    eng = RolloutEngine("hidden-facts", {"assistant": "ask-then-answer"}, env_kwargs={"max_steps": 4},
                        progress=False)
    env = eng.make_env()
    assert env.spec.id.startswith("hidden-facts") and env.spec.kwargs["max_steps"] == 4
    with pytest.raises(ConfigError, match=r"lambda: collab_env.make\('hidden-facts', reward=\.\.\.\)"):
        RolloutEngine("hidden-facts", {"assistant": "ask-then-answer"}, env_kwargs={"reward": "mr"})
    factory = RolloutEngine(lambda: collab_env.make("hidden-facts", max_steps=4), {"assistant": "ask-then-answer"},
                            progress=False)
    assert factory.make_env().spec.kwargs["max_steps"] == 4

"""The policy contract in the core (collab_env.policy): the learner binding, the policy-name
registry, policies_for, and the old import paths."""

import subprocess
import sys

import pytest

import collab_env
from collab_env.errors import ConfigError
from collab_env.policy import (
    BACKEND_PREFIXES,
    LEARNER,
    POLICY_ALIASES,
    FixedTextPolicy,
    LearnerBindable,
    bind_learner,
    policies_for,
    register_backend,
    register_policy,
    resolve_policy,
)
from collab_env.wrappers.base import EnvWrapper


class FuturesLayer(EnvWrapper):
    """A wrapper with a policy table that may name LEARNER (like the multiturn-aware reward)."""

    def __init__(self, env, policies):
        super().__init__(env)
        self.policies = dict(policies)
        self.bound_calls = []

    def learner_players(self):
        return [p for p, v in self.policies.items() if isinstance(v, str) and v == LEARNER]

    def bind_policy(self, player, policy):
        self.bound_calls.append(player)
        self.policies[player] = policy


class PlainLayer(EnvWrapper):
    """A wrapper that has a policy table but does not take part in the binding."""

    def __init__(self, env):
        super().__init__(env)
        self.policies = {"assistant": LEARNER}


def test_bind_learner_binds_every_bindable_layer_for_its_learner_players():
    base = collab_env.make("hidden-facts")
    inner = FuturesLayer(base, {"assistant": LEARNER, "user": "hidden-facts-user"})
    middle = PlainLayer(inner)
    outer = FuturesLayer(middle, {"assistant": LEARNER, "user": LEARNER})
    assert isinstance(inner, LearnerBindable) and not isinstance(middle, LearnerBindable)
    assert not isinstance(base, LearnerBindable)

    a, u = FixedTextPolicy("a"), FixedTextPolicy("u")
    # outer: assistant and user; inner: assistant only (its user is a named policy); the plain
    # layer in between is skipped although its table names LEARNER: 3 bindings.
    assert bind_learner(outer, {"assistant": a, "user": u}) == 3
    assert outer.policies == {"assistant": a, "user": u}
    assert inner.policies == {"assistant": a, "user": "hidden-facts-user"}
    assert middle.policies == {"assistant": LEARNER}
    assert outer.bound_calls == ["assistant", "user"] and inner.bound_calls == ["assistant"]
    # Everything is bound now: a second call binds nothing.
    assert bind_learner(outer, {"assistant": a, "user": u}) == 0


def test_bind_learner_leaves_players_it_is_not_given_unbound():
    layer = FuturesLayer(collab_env.make("hidden-facts"), {"assistant": LEARNER, "user": LEARNER})
    p = FixedTextPolicy("p")
    assert bind_learner(layer, {"user": p, "nobody": p}) == 1
    assert layer.policies == {"assistant": LEARNER, "user": p}
    assert layer.learner_players() == ["assistant"]
    assert bind_learner(collab_env.make("hidden-facts"), {"assistant": p}) == 0


def test_bind_learner_stops_on_a_wrapper_chain_that_loops():
    class Loop:
        def __init__(self):
            self.env = self
            self.policies = {"a": LEARNER}

        def learner_players(self):
            return [k for k, v in self.policies.items() if v == LEARNER]

        def bind_policy(self, player, policy):
            self.policies[player] = policy

    assert bind_learner(Loop(), {"a": FixedTextPolicy("x")}) == 1


def test_rewards_mr_keeps_the_learner_names():
    from collab_env.rewards import mr

    assert mr.LEARNER == LEARNER == "learner"


def test_policies_for_merges_overrides_and_none_removes():
    s = collab_env.spec("length-ratio")
    mine = FixedTextPolicy("mine")
    assert policies_for(s, {"agent_0": mine}) == {
        "agent_0": mine, "agent_1": "collab_env.tasks.cooperative:LengthRatioPartner"}
    assert policies_for(s, {"agent_1": None}) == {"agent_0": "collab_env.tasks.cooperative:LengthRatioPartner"}
    assert policies_for(s, None) == dict(s.default_policies)
    assert policies_for(None, {"x": "ask-then-answer", "y": None}) == {"x": "ask-then-answer"}
    # The spec is not changed.
    assert dict(s.default_policies)["agent_1"] == "collab_env.tasks.cooperative:LengthRatioPartner"


def test_register_policy_and_backend_reach_resolve_policy():
    register_policy("test-fixed-policy", "collab_env.policy:FixedTextPolicy")
    register_backend("test-fixed", f"{__name__}:ModelEcho")
    try:
        assert POLICY_ALIASES["test-fixed-policy"] == "collab_env.policy:FixedTextPolicy"
        assert isinstance(resolve_policy("test-fixed-policy", text="hi"), FixedTextPolicy)
        p = resolve_policy("test-fixed:some/model")
        assert isinstance(p, ModelEcho) and p.model == "some/model"
    finally:
        from collab_env import policy

        policy._POLICIES.pop("test-fixed-policy", None)
        policy._BACKENDS.pop("test-fixed", None)
    for bad in ("", "a:b", " x"):
        with pytest.raises(ConfigError, match="name must be"):
            register_policy(bad, "m:C")
    with pytest.raises(ConfigError, match="'module:Class' entry point"):
        register_policy("ok-name", FixedTextPolicy)
    with pytest.raises(ConfigError, match="'module:Class' entry point"):
        register_backend("ok-name", "no_colon")


def test_registry_views_are_read_only_and_hold_tasks_and_agents():
    with pytest.raises(TypeError):
        POLICY_ALIASES["x"] = "m:C"  # type: ignore[index]
    # The tasks registered their names; the agents' names are declared as data.
    assert POLICY_ALIASES["ask-then-answer"] == "collab_env.tasks.hidden_facts:AskThenAnswer"
    assert POLICY_ALIASES["embedded"] == "collab_env.agents.embedded:EmbeddedPolicy"
    assert BACKEND_PREFIXES["hf"] == "collab_env.agents.hf:HFPolicy"


class ModelEcho(FixedTextPolicy):
    """A backend-like policy built with ``model=`` (for the backend-prefix test)."""

    def __init__(self, model):
        super().__init__(model)
        self.model = model


def test_resolving_a_backend_name_needs_only_import_collab_env():
    """`import collab_env` imports no agents module, yet the agents' names resolve (imported on use)."""
    code = (
        "import sys, collab_env; from collab_env.policy import resolve_policy; "
        "before = sorted(m for m in sys.modules if m.startswith('collab_env.agents')); "
        "p = resolve_policy('litellm:openai/x', api_base='http://127.0.0.1:9'); "
        "print(before, type(p).__module__, p.model)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["[]", "collab_env.agents.litellm", "openai/x"], out.stdout

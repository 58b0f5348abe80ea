"""The policy contract in the core (collab_env.policy): forks of per-episode policies, the
policy-name registry, policies_for, and the old import paths."""

import subprocess
import sys

import pytest

import collab_env
from collab_env.errors import ConfigError
from collab_env.policy import (
    BACKEND_PREFIXES,
    POLICY_ALIASES,
    FixedTextPolicy,
    fork_policy,
    policies_for,
    register_backend,
    register_policy,
    resolve_policy,
)


def test_the_policy_contract_holds_no_learner_binding():
    """Data flows one way: the core contract has no way to push a policy into an env."""
    import collab_env.policy as policy

    for name in ("LEARNER", "LearnerBindable", "bind_learner", "unbind_learner", "unbound_learners"):
        assert not hasattr(policy, name), name


def test_fork_policy_takes_a_per_episode_policys_fork():
    class PerEpisode(FixedTextPolicy):
        def fork(self):
            return FixedTextPolicy("fork")

    plain = FixedTextPolicy("plain")
    assert fork_policy(plain) is plain
    assert fork_policy(PerEpisode("live")).text == "fork"


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

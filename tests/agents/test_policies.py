import pytest

from collab_env.agents.litellm import LiteLLMPolicy
from collab_env.errors import ConfigError, MissingDependencyError
from collab_env.policy import POLICY_ALIASES, FixedTextPolicy, resolve_policy
from collab_env.tasks.hidden_facts import AskThenAnswer


def test_aliases_resolve_to_real_policies():
    assert isinstance(resolve_policy("ask-then-answer"), AskThenAnswer)
    for alias, target in POLICY_ALIASES.items():
        assert ":" in target, alias


def test_backend_prefix_builds_the_backend_with_the_model():
    p = resolve_policy("litellm:openai/some-model", api_base="http://127.0.0.1:9")
    assert isinstance(p, LiteLLMPolicy) and p.model == "openai/some-model"
    with pytest.raises(ConfigError, match="names no model"):
        resolve_policy("litellm:")


def test_vllm_without_vllm_names_the_extra():
    try:
        import vllm  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("vllm is installed here; tests_vllm covers it")
    with pytest.raises(MissingDependencyError, match=r"collab_env\[vllm\]"):
        policy = resolve_policy("vllm:some/model")
        import asyncio

        from collab_env.types import Conversation, Message

        asyncio.run(policy.act([Conversation((Message("user", "hi", author="user"),))]))


def test_errors_are_clear():
    with pytest.raises(ConfigError, match="Did you mean 'ask-then-answer'"):
        resolve_policy("ask-then-answr")
    with pytest.raises(ConfigError, match="not a policy"):
        resolve_policy("collab_env.tasks.hidden_facts:generate_item")
    with pytest.raises(ConfigError, match="constructor arguments"):
        resolve_policy(FixedTextPolicy("x"), text="y")


def test_a_stop_string_is_one_stop_string_when_a_reply_is_prefilled():
    from collab_env.agents.base import prefill_sampling, stop_list

    assert stop_list("abc") == ["abc"] and stop_list(None) == [] and stop_list(("a", "b")) == ["a", "b"]
    # A prefix that opens a JSON string adds its closing quote to the caller's stop strings.
    assert prefill_sampling('{"response": "', {"stop": "abc"})["stop"] == ["abc", '"']
    assert prefill_sampling('{"response": "', {"stop": ["x", "y"]})["stop"] == ["x", "y", '"']

"""A full collab_env episode with a vLLM engine as the assistant."""

from __future__ import annotations

import collab_env
from collab_env.rollout import run_episode
from collab_env.types import Episode


def test_hidden_facts_episode_with_vllm_assistant(policy):
    env = collab_env.make("hidden-facts", max_steps=4)  # two assistant turns: CPU time
    calls = policy.stats.requests
    ep = run_episode(env, {"assistant": policy, "user": "hidden-facts-user"}, seed=3,
                     sampling={"assistant": {"temperature": 0, "max_new_tokens": 32}})
    assert ep.terminated or ep.truncated
    assert ep.end_reason
    turns = ep.completions("assistant")
    assert turns and policy.stats.requests - calls == len(turns)
    for t in turns:
        c = t.completion
        assert t.trainable
        assert c.token_ids and len(c.logprobs) == len(c.token_ids)
        assert c.text.strip() and t.text.strip()
        # The prompt the engine read is the assistant's view of the conversation at that step.
        prompt = policy.tokenizer.decode(list(c.prompt_token_ids))
        assert "boxed" in prompt  # the assistant's system prompt
    assert ep.costs["completion_tokens"] == sum(len(t.completion.token_ids) for t in turns)
    assert Episode.from_json(ep.to_json()).to_dict() == ep.to_dict()

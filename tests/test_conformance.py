"""Every registered environment passes the conformance checker (driven by the registry: a new
env is checked without a new test). CollabLLM ids run on fixture files in the dataset schema."""

import pytest

import collab_env
from collab_env.checker import check_env
from collab_env.registry import spec
from collab_env.testing.versions import building


def make_kwargs_for(env_id, tmp_path):
    if spec(env_id).suite == "collabllm":
        from collab_env.testing.collabllm_fixtures import write_collabllm_fixture

        path = tmp_path / "collabllm.jsonl"
        write_collabllm_fixture(path, layout="struct", fmt="jsonl")
        return {"data_files": str(path)}
    return {}


def policies_for(env_id, request):
    """The chat envs' default user is the LLM user simulator on the embedded model; what is
    checked here is the env and its views, so the same simulator runs on the tiny model (the
    embedded user itself: tests/agents/test_embedded.py and the recorded chat episodes of
    tests/tasks/test_chats.py)."""
    from collab_env.policy import resolve_policy
    from collab_env.tasks.chats import EmbeddedChatUser

    chat_users = [p for p, ref in spec(env_id).default_policies.items()
                  if isinstance(resolve_policy(ref), EmbeddedChatUser)]
    if not chat_users:
        return None
    from collab_env.agents.hf import HFPolicy

    tiny = HFPolicy(str(request.getfixturevalue("tiny_dir")), device="cpu", dtype="float32")
    return {p: EmbeddedChatUser(backend=tiny) for p in chat_users}


@pytest.mark.parametrize("env_id", collab_env.list_envs())
def test_registered_env_conforms(env_id, tmp_path, request):
    # Every id, superseded versions too: they stay registered so that old results reproduce.
    with building(env_id):
        report = check_env(env_id, make_kwargs=make_kwargs_for(env_id, tmp_path), cycles=200, steps=40,
                           policies=policies_for(env_id, request))
    assert report.ok
    view = report.results[-1]
    assert view.name == "gymnasium_view" and view.passed is True, view

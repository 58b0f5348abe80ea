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


@pytest.mark.parametrize("env_id", collab_env.list_envs())
def test_registered_env_conforms(env_id, tmp_path):
    # Every id, superseded versions too: they stay registered so that old results reproduce.
    with building(env_id):
        report = check_env(env_id, make_kwargs=make_kwargs_for(env_id, tmp_path), cycles=200, steps=40)
    assert report.ok
    view = report.results[-1]
    assert view.name == "gymnasium_view" and view.passed is True, view

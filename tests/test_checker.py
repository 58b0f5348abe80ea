"""The checker catches broken environments (it is only worth running if it can fail)."""

import pytest

from collab_env.checker import EnvCheckError, check_env
from collab_env.env import CollabEnv
from tests.toy_tasks import NondeterministicTask, SharedStateTask, TwoWriters


def test_a_correct_env_passes_and_is_reported():
    report = check_env(lambda: CollabEnv(TwoWriters()), cycles=50, steps=20)
    assert report.ok
    names = [r.name for r in report.results]
    assert names[:6] == ["parallel_api", "parallel_seed", "determinism", "clone", "pickle", "robustness"]
    # no spec and no policies: the user cannot be driven, so the view check is skipped, not passed
    assert report.results[-1].name == "gymnasium_view" and report.results[-1].passed is None


def test_nondeterminism_is_caught():
    with pytest.raises(EnvCheckError) as err:
        check_env(lambda: CollabEnv(NondeterministicTask()), cycles=20, steps=10)
    failed = {r.name for r in err.value.report.failed}
    assert "determinism" in failed and "parallel_seed" in failed


def test_state_shared_between_clones_is_caught():
    task = SharedStateTask()
    report = check_env(lambda: CollabEnv(task), cycles=20, steps=10, raise_on_failure=False)
    assert "clone" in {r.name for r in report.failed}


def test_view_check_runs_with_given_policies():
    report = check_env(
        lambda: CollabEnv(TwoWriters()),
        policies={"agent_1": "collab_env.policy:FixedTextPolicy",
                  "agent_0": "collab_env.policy:FixedTextPolicy",
                  "user": "collab_env.policy:FixedTextPolicy"},
        cycles=20, steps=10,
    )
    assert report.results[-1].passed is True
    assert "agent_0" in report.results[-1].detail and "agent_1" in report.results[-1].detail

import subprocess
import sys

HEAVY = ("torch", "transformers", "vllm", "litellm", "ray", "stable_baselines3", "trl")


def test_import_collab_env_is_light():
    code = (
        "import sys, collab_env, collab_env.agents, collab_env.adapters, collab_env.wrappers; "
        "collab_env.make('hidden-facts'); "
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"heavy modules imported: {out.stdout}"


def test_the_library_never_imports_its_test_doubles():
    """collab_env.testing (tiny model, fake server, data fixtures) is for tests only: building and
    playing envs, resolving policies and importing the learners leave it unloaded."""
    code = (
        "import sys, collab_env, collab_env.agents, collab_env.adapters, collab_env.wrappers, "
        "collab_env.rollout, collab_env.eval, collab_env.cli, collab_env.rewards.mr; "
        "from collab_env.rollout import run_episode; "
        "from collab_env.tasks.hidden_facts import AskThenAnswer, HiddenFactsUser; "
        "run_episode(collab_env.make('hidden-facts'), "
        "{'assistant': AskThenAnswer(), 'user': HiddenFactsUser()}, seed=0); "
        "print(','.join(sorted(m for m in sys.modules if m.startswith('collab_env.testing'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"test doubles imported by the library: {out.stdout}"

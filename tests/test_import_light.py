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

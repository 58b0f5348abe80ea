"""Test-wide settings: the hub is never reached from tests."""

import os

for _var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

# The tiny model's fixtures (tiny_dir, tiny) come from collab_env.testing.pytest_fixtures, loaded
# as a plugin by pyproject.toml's addopts.

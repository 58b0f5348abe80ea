"""Test-wide settings: the hub is never reached from tests."""

import os

for _var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

if os.environ.get("PYTEST_XDIST_WORKER"):
    # One process per core (make test's `-n auto`): each worker computes on one thread, or every
    # worker's torch/OpenMP pool would take every core and they would fight over them.
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(_var, "1")

# The tiny model's fixtures (tiny_dir, tiny) come from collab_env.testing.pytest_fixtures, loaded
# as a plugin by pyproject.toml's addopts.

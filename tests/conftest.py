"""Test-wide settings: the hub is never reached from tests."""

import os

for _var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """A tiny random chat model folder (collab_env/testing/tiny_model.py), built once per test session.
    Tests load fresh copies from it; none writes into it."""
    from collab_env.testing.tiny_model import build_tiny_chat_model

    return build_tiny_chat_model(tmp_path_factory.mktemp("tiny"))

"""pytest fixtures of the tiny chat model, shared by every test suite (``tests/``, ``tests_verl/``,
``tests_skyrl/``...): pyproject.toml's ``addopts`` loads this module as a plugin
(``-p collab_env.testing.pytest_fixtures``). A test module's own fixture of the same name wins."""

from __future__ import annotations

import pytest

__all__ = ["tiny_dir", "tiny"]


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """A tiny random chat model folder (:mod:`collab_env.testing.tiny_model`), built once per test
    session. Tests load fresh copies from it; none writes into it."""
    from collab_env.testing.tiny_model import build_tiny_chat_model

    return build_tiny_chat_model(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="session")
def tiny(tiny_dir):
    """``(model, tokenizer)`` of the tiny model, loaded once per session (a test that edits the
    model loads its own copy from ``tiny_dir``)."""
    from collab_env.testing.tiny_model import load_tiny_chat_model

    return load_tiny_chat_model(tiny_dir)

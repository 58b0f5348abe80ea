"""Every leaderboard test keeps the verdicts its builds write in a folder of its own (outside the
boards it builds, as the user cache is), never in the user's cache."""

import pytest


@pytest.fixture(autouse=True)
def _kept_verdicts_in_tmp(tmp_path_factory, monkeypatch):
    from collab_env.leaderboard import board

    monkeypatch.setattr(board, "STAMPS_DIR", tmp_path_factory.mktemp("kept-verdicts"), raising=False)


@pytest.fixture(scope="session")
def honest_llm_user_entry(run_tmp):
    """The honest LLM-user entry of tests/leaderboard/forgery.py, played once per run, in the
    run's folder that every worker shares."""
    from tests.leaderboard.forgery import honest_entry

    return honest_entry(run_tmp)

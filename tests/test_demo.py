import json
from pathlib import Path

import pytest

from collab_env.demo import (
    ADAPTER,
    MODEL_ENV,
    TRAIN_COMMAND,
    default_adapter,
    facts_elicited,
    main,
    questions_per_episode,
)
from collab_env.eval import evaluate


def test_demo_prints_the_table_and_writes_results(tmp_path, capsys):
    assert main(["--episodes", "6", "--model-episodes", "0", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for env_id in ("hidden-facts-easy-v1", "hidden-facts-v1", "hidden-facts-hard-v1"):
        assert env_id in out
    assert "ask-then-answer" in out and "answer-at-once" in out
    files = sorted(f for f in tmp_path.rglob("*.jsonl") if not f.name.endswith(".failures.jsonl"))
    assert len(files) == 6
    lines = [json.loads(x) for x in files[0].read_text().splitlines()]
    assert len(lines) == 6


def test_questions_per_episode_counts_asking_turns():
    # hidden-facts-easy withholds one of two quantities: ask-then-answer asks once ("...?") then
    # boxes the total; answer-at-once boxes at once and never asks.
    ask = evaluate("hidden-facts-easy", {"assistant": "ask-then-answer"}, num_episodes=4, progress=False)
    once = evaluate("hidden-facts-easy", {"assistant": "answer-at-once"}, num_episodes=4, progress=False)
    assert questions_per_episode(ask) == 1.0
    assert questions_per_episode(once) == 0.0


def test_facts_elicited_is_the_share_of_episodes_where_the_user_revealed_a_withheld_fact():
    kw = {"split": "test", "max_steps": 4}
    ask = evaluate(MODEL_ENV, {"assistant": "ask-then-answer"}, num_episodes=4, progress=False, env_kwargs=kw)
    once = evaluate(MODEL_ENV, {"assistant": "answer-at-once"}, num_episodes=4, progress=False, env_kwargs=kw)
    assert facts_elicited(ask) == 1.0      # it asks for every withheld quantity
    assert facts_elicited(once) == 0.0     # it never asks


def test_the_adapter_path_and_the_command_that_makes_it():
    # The committed adapter of a source checkout is found from the module's own location; the
    # command the demo prints when it is missing is the benchmark whose default output prefix
    # (benchmarks/results/embedded_learning) puts the adapter at <prefix>_adapter.
    assert default_adapter().parts[-3:] == ("benchmarks", "results", "embedded_learning_adapter")
    bench = Path(__file__).resolve().parents[1] / TRAIN_COMMAND.split()[-1]
    text = bench.read_text()
    assert 'RESULTS / "embedded_learning"' in text and 'f"{out}_adapter"' in text
    assert ADAPTER == Path("benchmarks/results/embedded_learning_adapter")


@pytest.mark.skipif(not (Path(__file__).resolve().parents[1] / ADAPTER / "adapter_config.json").is_file(),
                    reason="no committed adapter (python benchmarks/bench_embedded_learning.py makes it)")
def test_model_rows_before_and_after_with_the_committed_adapter(tmp_path, capsys):
    """Loads the committed adapter (no training): one short held-out episode per row."""
    pytest.importorskip("peft")
    assert main(["--episodes", "1", "--model-episodes", "1", "--max-new-tokens", "8",
                 "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "embedded (before training)" in out and "embedded (after collab_env training)" in out
    assert "questions asked per episode" in out and "loaded from" in out
    assert "revealed the withheld fact" in out

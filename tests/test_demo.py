import json

from collab_env.demo import main


def test_demo_prints_the_table_and_writes_results(tmp_path, capsys):
    assert main(["--episodes", "6", "--model-episodes", "0", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for env_id in ("hidden-facts-easy-v0", "hidden-facts-v0", "hidden-facts-hard-v0"):
        assert env_id in out
    assert "ask-then-answer" in out and "answer-at-once" in out
    files = sorted(f for f in tmp_path.rglob("*.jsonl") if not f.name.endswith(".failures.jsonl"))
    assert len(files) == 6
    lines = [json.loads(x) for x in files[0].read_text().splitlines()]
    assert len(lines) == 6

"""README stays true: every registered id is in the catalogue, and the quickstart runs."""

import re
from pathlib import Path

import collab_env

ROOT = Path(__file__).resolve().parents[1]


def test_catalogue_lists_every_registered_id():
    readme = (ROOT / "README.md").read_text()
    for env_id in collab_env.list_envs():
        assert f"`{env_id}`" in readme, f"{env_id} missing from the README catalogue"


def test_readme_has_exactly_the_two_commands():
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"## The two commands\n\n```bash\n(.*?)```", readme, re.S).group(1)
    assert [line.split("#")[0].strip() for line in block.strip().splitlines()] == ["make demo", "make test"]


def test_quickstart_runs(tmp_path, monkeypatch):
    from collab_env.testing.collabllm_fixtures import write_collabllm_fixture

    readme = (ROOT / "README.md").read_text()
    code = re.search(r"## Quickstart\n\n```python\n(.*?)```", readme, re.S).group(1)
    data = tmp_path / "math-hard.parquet"
    write_collabllm_fixture(data, layout="list", fmt="parquet")
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md", "exec"), {"__name__": "readme"})


def test_rollouts_snippet_runs():
    readme = (ROOT / "README.md").read_text()
    code = re.search(r"## Rollouts\n\n.*?```python\n(.*?)```", readme, re.S).group(1)
    scope = {"__name__": "readme"}
    exec(compile(code, "README.md", "exec"), scope)
    assert len(scope["returns"]) == 64 and sum(scope["returns"]) == 64.0  # ask-then-answer solves all


def test_driver_snippet_runs(capsys):
    readme = (ROOT / "README.md").read_text()
    code = re.findall(r"## Rollouts\n\n.*?```python\n.*?```.*?```python\n(.*?)```", readme, re.S)[0]
    scope = {"__name__": "readme"}
    exec(compile(code, "README.md", "exec"), scope)
    run = scope["run"]
    assert run.stopped == "until" and run.moves()[0] == ("assistant", "How many apples?")
    assert [p for p, _ in run.moves()] == ["assistant", "user"]
    assert capsys.readouterr().out.startswith("until [('assistant', 'How many apples?'), ('user', ")


def test_exploit_audit_snippet_runs(capsys):
    readme = (ROOT / "README.md").read_text()
    code = re.search(r"## Exploit audit\n\n.*?```python\n(.*?)```", readme, re.S).group(1)
    exec(compile(code, "README.md:exploit-audit", "exec"), {})
    assert "none beats the naive baseline" in capsys.readouterr().out


def test_training_snippet_is_valid_python_with_real_names():
    """The snippet names the real trainer and config (running it needs minutes of training)."""
    import ast

    readme = (ROOT / "README.md").read_text()
    code = re.search(r"## Training\n\n.*?```python\n(.*?)```", readme, re.S).group(1)
    ast.parse(code)
    from collab_env.adapters.magrpo import MAGRPOConfig, MAGRPOTrainer  # noqa: F401

    MAGRPOConfig(num_agents=2, num_generations=4, max_new_tokens=64, max_steps=8)


def catalogue_rows() -> dict[str, dict[str, str]]:
    """The README's environment catalogue: id -> {column header: cell}."""
    readme = (ROOT / "README.md").read_text()
    section = re.search(r"## Environment catalogue\n(.*?)\n## ", readme, re.S).group(1)
    lines = [ln for ln in section.splitlines() if ln.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {}
    for ln in lines[2:]:
        # Cells never contain "|": split on the column separators.
        cells = [c.strip() for c in ln.strip().strip("|").split(" | ")]
        assert len(cells) == len(header), f"README catalogue row has {len(cells)} cells, not {len(header)}: {ln}"
        row = dict(zip(header, cells, strict=True))
        env_id = row["id"].strip("`")
        assert env_id not in rows, f"{env_id} is listed twice in the README catalogue"
        rows[env_id] = row
    return rows


def check_row(env_id: str, row: dict[str, str]) -> None:
    """A catalogue row agrees with the id's card: suite, players, what it tests, ranges."""
    s = collab_env.spec(env_id)
    assert s.card is not None, f"{env_id} has no card"
    card = dict(s.card.lines())
    assert row["suite"] == s.suite, env_id
    assert row["players"] == ", ".join(s.players), env_id
    assert row["what it tests"] == s.card.tests.replace("|", "/"), (
        f"{env_id}: README says {row['what it tests']!r}, the card {s.card.tests!r}"
    )
    assert row["reward range per option"] == card["reward range"], (
        f"{env_id}: README says {row['reward range per option']!r}, the card {card['reward range']!r}"
    )


def test_catalogue_rows_agree_with_the_cards():
    """Every registered id has a row, every row is a registered id, and the row's players, what it
    tests and reward ranges are the card's (so a range fixed in a card must be fixed here too)."""
    rows = catalogue_rows()
    registered = set(collab_env.list_envs())
    assert not registered - set(rows), f"registered but missing from the README catalogue: {sorted(registered - set(rows))}"
    assert not set(rows) - registered, f"in the README catalogue but not registered: {sorted(set(rows) - registered)}"
    for env_id, row in rows.items():
        check_row(env_id, row)


def test_catalogue_check_catches_a_wrong_range(monkeypatch):
    """The check above can fail: a README row whose range differs from the card's is caught."""
    import pytest

    readme = (ROOT / "README.md").read_text()
    wrong = readme.replace("| default [0, 1]; mr [0, 6]; conversation [0, 1] |",
                           "| default [0, 1]; mr [0, 1]; conversation [0, 1] |")
    assert wrong != readme
    real_read = Path.read_text
    monkeypatch.setattr(Path, "read_text",
                        lambda self, *a, **k: wrong if self.name == "README.md" else real_read(self, *a, **k))
    row = catalogue_rows()["hidden-facts-v0"]
    with pytest.raises(AssertionError, match=r"README says .*mr \[0, 1\].*the card .*mr \[0, 6\]"):
        check_row("hidden-facts-v0", row)


def test_card_baselines_agree_with_the_measured_file():
    """The baselines the cards quote are the numbers benchmarks/card_baselines.py measured."""
    import json

    doc = json.loads((ROOT / "benchmarks" / "results" / "card_baselines.json").read_text())
    n = doc["episodes"]
    for env_id, runs in doc["results"].items():
        card = collab_env.spec(env_id).card
        for name, r in runs.items():
            text = card.baselines[name]
            assert text.startswith(f"mean return {r['mean_return']:.3f}"), (env_id, name, text)
            assert f"({r['episodes']} ep, seeds 0-{n - 1})" in text and r["episodes"] == n, (env_id, name)
            if "success" in text:
                assert f"success {r['success']:.3f}" in text, (env_id, name, text)

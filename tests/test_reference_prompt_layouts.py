"""``prompts=PATH`` finds the recipe's files in every layout a user has.

Each test writes a stand-in tree in ``tmp_path`` with the layout of one real tree (file names and
constant names are the reference's, checked on github.com/volcengine/verl and
github.com/verl-project/verl-recipe; every text is OUR OWN ``LAYOUT-*`` marker) and reads every
template the layout holds through :func:`resolve_prompts`.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from collab_env.agents.reference_prompts import (
    COLLABLLM_FILES,
    PRE_MOVE_FILES,
    VERL_CONSTANTS,
    resolve_prompts,
)
from collab_env.errors import ConfigError

# Every placeholder a component may fill, so the stand-ins can use any of them.
FIELDS = ("task_desc", "single_turn_prompt", "chat_history", "termination_signal", "terminal_signal",
          "ground_truth", "max_new_tokens", "additional_info", "extract_type", "extraction_requirement")


def write_recipe(folder: Path, tag: str, *, with_interaction: bool = True) -> None:
    """The recipe's Python files under ``folder`` (its ``collabllm`` folder), one constant each
    holding ``LAYOUT-<tag>-<component>`` (our text), behind a line that fails if run."""
    for component, (rel, const) in VERL_CONSTANTS.items():
        if rel in PRE_MOVE_FILES and not with_interaction:
            continue
        write_constant(folder / rel, const, f"LAYOUT-{tag}-{component}")


def write_constant(path: Path, const: str, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'raise SystemExit("parsed, never run")\n{const} = {text!r}\n')


def read_all(root: Path) -> dict[str, str]:
    ps = resolve_prompts(str(root))
    assert ps is not None
    return {c: ps.template(c, fields=FIELDS, who="test").text for c in ps.components()}


def expect(tag: str, **other: str) -> dict[str, str]:
    want = {c: f"LAYOUT-{tag}-{c}" for c in VERL_CONSTANTS}
    want.update(other)
    return want


def test_verl_checkout_as_merged_september_2025(tmp_path):
    # verl 25d78fa (2025-09-25): the simulator template lives in verl/interactions/.
    root = tmp_path / "verl"
    write_recipe(root / "recipe" / "collabllm", "sep", with_interaction=False)
    write_constant(root / "verl/interactions/collabllm_interation.py", "USER_PROMPT_TEMPLATE", "LAYOUT-sep-user")
    assert read_all(root) == expect("sep", user_simulator="LAYOUT-sep-user")
    # ... and the same checkout's recipe folder passed alone finds the simulator two levels up.
    assert read_all(root / "recipe" / "collabllm") == expect("sep", user_simulator="LAYOUT-sep-user")


def test_verl_checkout_after_the_move_and_with_its_recipe_submodule(tmp_path):
    # verl cf619d6 (2025-10-09) on: every file in recipe/collabllm/ (also the layout of verl's
    # recipe/ submodule, which holds the verl-recipe repository, since 2026-01-06).
    root = tmp_path / "verl"
    (root / "verl" / "interactions").mkdir(parents=True)  # the old folder, without the file
    write_recipe(root / "recipe" / "collabllm", "oct")
    assert read_all(root) == expect("oct")


def test_verl_recipe_repository_root_now_and_legacy(tmp_path):
    now = tmp_path / "verl-recipe"
    write_recipe(now / "collabllm", "repo")
    assert read_all(now) == expect("repo")
    legacy = tmp_path / "verl-recipe-nov"  # 2025-11-27 to 2026-01-05: legacy/collabllm/
    write_recipe(legacy / "legacy" / "collabllm", "legacy")
    assert read_all(legacy) == expect("legacy")


def test_the_recipe_folder_itself(tmp_path):
    folder = tmp_path / "my-copy-of-the-recipe"
    write_recipe(folder, "own")
    assert read_all(folder) == expect("own")


@pytest.mark.parametrize("where", ["package", "repository"])
def test_the_collabllm_package_by_name_and_by_path(tmp_path, monkeypatch, where):
    site = tmp_path / "site"
    prompts = site / "collabllm" / "prompts"
    prompts.mkdir(parents=True)
    (site / "collabllm" / "__init__.py").write_text('raise RuntimeError("never imported")\n')
    for component, name in COLLABLLM_FILES.items():
        (prompts / name).write_text(f"LAYOUT-pkg-{component}")
    if where == "package":  # installed: prompts="collabllm" finds it on sys.path
        monkeypatch.delitem(sys.modules, "collabllm", raising=False)
        monkeypatch.syspath_prepend(str(site))
        importlib.invalidate_caches()
        ps = resolve_prompts("collabllm")
    else:  # a clone of the package's repository (or its folder) given by path
        ps = resolve_prompts(str(site))
        assert resolve_prompts(str(site / "collabllm")) == ps
    assert ps is not None and ps.source == "collabllm" and ps.root == prompts.resolve()
    got = {c: ps.template(c, fields=FIELDS, who="test").text for c in ps.components()}
    assert got == {c: f"LAYOUT-pkg-{c}" for c in COLLABLLM_FILES}


def test_an_unknown_layout_lists_every_path_it_looked_for(tmp_path):
    root = tmp_path / "not-a-recipe"
    (root / "src").mkdir(parents=True)
    with pytest.raises(ConfigError) as err:
        resolve_prompts(str(root))
    msg = str(err.value)
    assert "\n" not in msg
    for folder in ("", "/recipe/collabllm", "/collabllm", "/legacy/collabllm", "/verl/interactions"):
        assert f"{root.resolve()}{folder}," in msg or f"{root.resolve()}{folder} " in msg, folder
    for rel, _ in VERL_CONSTANTS.values():
        assert rel in msg
    assert str(root.resolve() / "prompts") in msg and str(root.resolve() / "collabllm" / "prompts") in msg


def test_a_file_missing_from_a_known_layout_lists_its_places(tmp_path):
    root = tmp_path / "verl"
    write_recipe(root / "recipe" / "collabllm", "oct", with_interaction=False)
    ps = resolve_prompts(str(root))
    with pytest.raises(ConfigError) as err:
        ps.template("user_simulator", fields=FIELDS, who="LLMUserSimulator")
    msg = str(err.value)
    for place in ("collabllm_interation.py", "recipe/collabllm/collabllm_interation.py",
                  "collabllm/collabllm_interation.py", "legacy/collabllm/collabllm_interation.py",
                  "verl/interactions/collabllm_interation.py"):
        assert f"{root.resolve()}/{place}" in msg


def test_a_verl_checkout_without_its_recipe_submodule_says_how_to_get_it(tmp_path):
    root = tmp_path / "verl"
    (root / "verl" / "trainer").mkdir(parents=True)
    (root / "recipe").mkdir()  # a fresh clone since 2026-01-06: the submodule is not checked out
    with pytest.raises(ConfigError, match=r"submodule update --init recipe"):
        resolve_prompts(str(root))

"""The extras ``make test`` installs are really there.

Many tests skip when an optional package is missing (``pytest.importorskip``), which is right for
a user's partial install but would let a broken ``.venv`` pass ``make test`` with the adapters'
tests skipped. ``make test`` names its extras in ``COLLAB_ENV_EXTRAS``; every requirement of each
of them (from setup.cfg, nested extras such as ``%(hf)s`` included) must then be installed at a
version its specifier admits. Without the variable (a plain ``pytest`` run) this test skips.
"""

from __future__ import annotations

import configparser
import os
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]


def extras_requirements() -> dict[str, list[Requirement]]:
    cfg = configparser.ConfigParser()  # interpolation expands %(hf)s into hf's lines
    cfg.read(ROOT / "setup.cfg")
    section = cfg["options.extras_require"]
    return {name: [Requirement(line) for line in section[name].splitlines()
                   if line.strip() and not line.strip().startswith("#")]
            for name in section}


def test_every_extra_of_make_test_is_installed():
    wanted = os.environ.get("COLLAB_ENV_EXTRAS")
    if not wanted:
        pytest.skip("COLLAB_ENV_EXTRAS is not set (make test sets it to the extras it installs)")
    extras = extras_requirements()
    unknown = [e for e in wanted.split(",") if e not in extras]
    assert not unknown, f"COLLAB_ENV_EXTRAS names {unknown}, which setup.cfg does not define"
    problems = []
    for extra in wanted.split(","):
        for req in extras[extra]:
            if req.marker is not None and not req.marker.evaluate():
                continue
            try:
                have = metadata.version(req.name)
            except metadata.PackageNotFoundError:
                problems.append(f"[{extra}] {req} is not installed")
                continue
            if req.specifier and not req.specifier.contains(have, prereleases=True):
                problems.append(f"[{extra}] {req}: {have} is installed")
    assert not problems, ("the test venv lacks what its extras require (rebuild it: make clean && "
                          "make test):\n" + "\n".join(problems))


def test_extras_parse_and_nest():
    extras = extras_requirements()
    # %(hf)s expands to hf's requirements inside trl and train
    hf = {r.name for r in extras["hf"]}
    assert hf and hf <= {r.name for r in extras["trl"]} and hf <= {r.name for r in extras["train"]}


def test_the_dev_extra_pins_the_checkers_make_test_runs():
    """``make test`` runs lint-imports, ruff and mypy before pytest: the dev extra pins each one
    (a new release with new rules must not fail a build that changed nothing), and the Makefile's
    test target runs them."""
    pins = {r.name: r for r in extras_requirements()["dev"]}
    for tool in ("import-linter", "ruff", "mypy"):
        assert tool in pins and str(pins[tool].specifier).startswith("=="), pins.get(tool)
    makefile = (ROOT / "Makefile").read_text()
    target = makefile[makefile.index("\ntest:"):].split("\n\n")[0]
    for line in ("-m tools.lint_imports", "-m ruff check", "-m mypy"):
        assert line in target, f"make test does not run `{line}`"


def test_make_test_installs_the_serve_extra_pinned():
    """``collab-env serve``'s tests run in ``make test``: the Makefile's extras name ``serve``, and
    the extra pins OpenEnv's package to the release measured to install beside the others without
    changing any of them (setup.cfg says why not a newer one)."""
    makefile = (ROOT / "Makefile").read_text()
    extras = next(line for line in makefile.splitlines() if line.startswith("EXTRAS :="))
    assert "serve" in extras.split(":=")[1].strip().split(",")
    pins = {r.name: r for r in extras_requirements()["serve"]}
    assert str(pins["openenv-core"].specifier) == "==0.2.1"
    assert "openenv-core" in {r.name for r in extras_requirements()["all"]}

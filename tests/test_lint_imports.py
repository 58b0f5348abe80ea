"""tools/lint_imports.py: the package_dir-aware graph and the two contract types of our own, on a
small package built here (one subpackage lives outside the package's directory, as
collab_env.agents does)."""

import copy
import sys
import textwrap
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: import-linter reads TOML with tomli there
    import tomli as tomllib

grimp = pytest.importorskip("grimp")
pytest.importorskip("importlinter")

from grimp.application.config import settings  # noqa: E402
from importlinter.contracts.layers import LayersContract  # noqa: E402

from tools.lint_imports import LazyOnlyContract, PackageDirFinder, PrivateNamesContract  # noqa: E402

FILES = {
    # `ext` is imported from outside/ext, like collab_env.agents from agents/.
    "lintpkg/__init__.py": "import os\n__path__.append(os.path.join(os.path.dirname(__file__), '..', 'outside'))\n",
    "lintpkg/low.py": "_secret = 1\nvalue = 2\n\n\ndef _helper():\n    return 1\n",
    "lintpkg/_private_mod.py": "x = 1\n",
    "lintpkg/good.py": """
        from lintpkg import _private_mod
        from lintpkg.low import value as _value


        def uses_ext_lazily():
            from lintpkg.ext.backend import Backend

            return Backend, _value, _private_mod


        class Holder:
            def method(self, obj):
                return obj._attr  # a private attribute of an object, not of a module
        """,
    "lintpkg/bad.py": """
        import lintpkg.low
        import lintpkg.low as low_alias
        from lintpkg.ext.backend import Backend
        from lintpkg.low import _secret


        class Uses:
            from lintpkg.ext import backend  # a class body runs at import time


        def f():
            return low_alias._helper(), lintpkg.low._secret, _secret, Backend
        """,
    "lintpkg/mine.py": "_own = 1\n\n\ndef g():\n    return _own\n",
    "outside/ext/__init__.py": "",
    "outside/ext/backend.py": "class Backend:\n    pass\n",
}


@pytest.fixture
def package(tmp_path, monkeypatch):
    """The package's files on sys.path; its modules are forgotten afterwards (finding
    lintpkg.ext imports lintpkg, whose __init__ extends its __path__)."""
    for name, text in FILES.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m == "lintpkg" or m.startswith("lintpkg.")]:
        del sys.modules[name]


@pytest.fixture
def graph(package):
    previous = settings.PACKAGE_FINDER
    settings.configure(PACKAGE_FINDER=PackageDirFinder())
    try:
        yield grimp.build_graph("lintpkg", "lintpkg.ext", cache_dir=None)
    finally:
        settings.configure(PACKAGE_FINDER=previous)


def contract(cls, **options):
    return cls("test", session_options={"root_packages": ["lintpkg", "lintpkg.ext"]},
               contract_options=options)


def test_the_subpackage_outside_the_directory_is_in_the_graph(graph):
    assert {"lintpkg.ext", "lintpkg.ext.backend"} <= set(graph.modules)
    assert "lintpkg.ext.backend" in graph.find_modules_directly_imported_by("lintpkg.bad")


def test_lazy_only_flags_module_level_and_class_body_imports_only(graph):
    check = contract(LazyOnlyContract, source_modules=["lintpkg"], forbidden_modules=["lintpkg.ext"]).check(
        graph, verbose=False)
    assert not check.kept
    lines = sorted(v.split("(l.")[1].split(":")[0] for v in check.metadata["violations"])
    # bad.py: line 3 (module level) and line 8 (class body); good.py's import inside a function passes.
    assert lines == ["3", "8"]
    assert all(v.startswith("lintpkg.bad -> lintpkg.ext") for v in check.metadata["violations"])
    exempt = contract(LazyOnlyContract, source_modules=["lintpkg"], forbidden_modules=["lintpkg.ext"],
                      exempt_modules=["lintpkg.bad"]).check(graph, verbose=False)
    assert exempt.kept


def test_lazy_only_refuses_to_pass_when_the_forbidden_package_is_not_in_the_graph(package):
    without_ext = grimp.build_graph("lintpkg", cache_dir=None)  # what a bare lint-imports would see
    assert "lintpkg.ext" not in without_ext.modules
    check = contract(LazyOnlyContract, source_modules=["lintpkg"], forbidden_modules=["lintpkg.ext"]).check(
        without_ext, verbose=False)
    assert not check.kept and check.metadata["missing"] == ["lintpkg.ext"]


def test_private_names_across_modules_are_flagged(graph):
    check = contract(PrivateNamesContract).check(graph, verbose=False)
    assert not check.kept
    assert sorted(check.metadata["violations"]) == [
        "lintpkg.bad (l.12) takes _helper from lintpkg.low",
        "lintpkg.bad (l.12) takes _secret from lintpkg.low",
        "lintpkg.bad (l.4) takes _secret from lintpkg.low",
    ]
    allowed = contract(PrivateNamesContract, ignore_names=[
        "lintpkg.bad -> lintpkg.low._secret", "lintpkg.bad -> lintpkg.low._helper"]).check(graph, verbose=False)
    assert allowed.kept


# --- The layers contract of pyproject.toml, probed on collab_env's own graph ---------------------
# The real graph, plus one import added by hand: the contract as configured must break on it (and
# be kept without it), so a rule that passes is a rule that looks.

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def _config() -> dict:
    with open(PYPROJECT, "rb") as f:
        return tomllib.load(f)["tool"]["importlinter"]


def _layers_contract(config: dict) -> LayersContract:
    (options,) = [c for c in config["contracts"] if c["id"] == "layers"]
    # import-linter's TOML reader passes booleans as strings; so does this.
    fields = {k: str(v) if isinstance(v, bool) else v for k, v in options.items()
              if k not in ("id", "name", "type")}
    return LayersContract(options["name"], session_options={"root_packages": config["root_packages"]},
                          contract_options=fields)


@pytest.fixture(scope="module")
def collab_graph():
    config = _config()
    previous = settings.PACKAGE_FINDER
    settings.configure(PACKAGE_FINDER=PackageDirFinder())
    try:
        graph = grimp.build_graph(*config["root_packages"], cache_dir=None,
                                  exclude_type_checking_imports=True)
    finally:
        settings.configure(PACKAGE_FINDER=previous)
    return config, graph


def _with_import(graph, importer: str, imported: str):
    probed = copy.deepcopy(graph)
    probed.add_import(importer=importer, imported=imported, line_number=1,
                      line_contents=f"import {imported}  # the probe")
    return probed


def _illegal_imports(check) -> set[tuple[str, str]]:
    """Every import on a chain the contract reports."""
    return {(link["importer"], link["imported"])
            for dependency in check.metadata["invalid_dependencies"]
            for route in dependency["routes"] for link in route["chain"]}


def test_the_layers_contract_is_kept_by_the_tree_and_has_no_blanket_exception(collab_graph):
    config, graph = collab_graph
    (options,) = [c for c in config["contracts"] if c["id"] == "layers"]
    assert not any("collab_env.agents" in i and "**" in i for i in options.get("ignore_imports", []))
    assert "env | agents" in options["layers"]
    assert _layers_contract(config).check(copy.deepcopy(graph), verbose=False).kept


@pytest.mark.parametrize("importer, imported", [
    ("collab_env.env", "collab_env.agents.users"),      # env and agents are independent siblings
    ("collab_env.agents.judges", "collab_env.env"),     # ... both ways
    ("collab_env.policy", "collab_env.agents.cache"),   # policy is below agents
    ("collab_env.agents.users", "collab_env.registry"), # agents imports nothing above env
])
def test_the_layers_contract_catches_an_import_across_the_agents_layer(collab_graph, importer, imported):
    config, graph = collab_graph
    check = _layers_contract(config).check(_with_import(graph, importer, imported), verbose=False)
    assert not check.kept
    assert _illegal_imports(check) == {(importer, imported)}

"""One import path per name: the package is unreleased, so a moved name leaves no forwarding module
or re-export behind at its old path (issue 27).

* The old paths deleted with the move stay deleted, and nothing in the repository names them.
* A module's ``__all__`` lists only the names it defines: a module does not re-export another
  module's names (a package's ``__init__`` may gather its own submodules' names: that is the
  package's face, e.g. ``collab_env.make``; it does not re-export names from outside it).
* ``from collab_env.x import name`` (anywhere in the repository's Python) takes ``name`` from the
  module that defines it, not from one that merely imported it.

The facades in :data:`FACADES` are the documented exceptions, each a module whose job is to be
one place to import a family of names from; a new one is added here on purpose.
"""

from __future__ import annotations

import ast
import importlib.util
import os
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Where each package's modules live (setuptools package_dir: agents/ and adapters/ are outside
#: collab_env/).
PACKAGE_DIRS = {"collab_env": ROOT / "collab_env", "collab_env.agents": ROOT / "agents",
                "collab_env.adapters": ROOT / "adapters"}

#: Deleted old paths (module -> where its names live now). Nothing may import, name or recreate them.
DELETED = {
    "collab_env.rewards.multiturn": "collab_env.rewards.mr",
    "collab_env.agents.vllm_offline": "collab_env.agents.vllm",
    "collab_env.rollout_ray": "collab_env.rollout.ray_engine",
    "collab_env.tasks.collabllm_build": "collab_env.data.collabllm_build",
    "collab_env.rewards.sandbox": "collab_env.sandbox",
    "collab_env.agents.scripted": "collab_env.policy",
    # the hand-written CPU decoder, deleted (issue 41; benchmarks/results/decode_table.md)
    "collab_env.agents.hf_decode": "model.generate (the HF backend) or the vLLM backend",
    "collab_env.agents.hf_rows_first": "torch's own linear layers",
}

#: Names removed from their old paths (old module -> names), which must not come back there.
REMOVED_NAMES = {
    "collab_env.registry": ("make", "set_composer", "load_entry_point", "_composer"),
    "collab_env.agents": ("Policy", "SamplingParams", "resolve_policy", "POLICY_ALIASES",
                          "ScriptedPolicy", "FixedTextPolicy", "CallablePolicy"),
    "collab_env.agents.base": ("Policy", "SamplingParams", "resolve_policy", "add_usage", "describe",
                               "as_mapping", "POLICY_ALIASES", "BACKEND_PREFIXES"),
    "collab_env.agents.litellm": ("ConcurrencyLimiter", "shared_limiter"),
    "collab_env.agents.hf": ("TokenGenerator", "sampling_params", "GenerationStats", "FLUSH_MODES"),
    "collab_env.agents.tokens": ("sampling_params",),
    "collab_env.agents.hf_prefix": ("distinct_rows", "plain_layers", "common_prefix_length"),
}

#: Modules whose job is to gather a family of names from their siblings (a second import path
#: for each of those names). None: issue 41 folded the last four (rewards.mr, tasks.collabllm,
#: tasks.dataset_env, agents.vllm) away; a new one would be added here on purpose.
FACADES: frozenset[str] = frozenset()

#: Packages whose own modules these rules do not check (none: the adapters' modules no longer
#: re-export the toolkit's names). A package named here is exempt on purpose.
UNCHECKED: tuple[str, ...] = ()


def _unchecked(module: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in UNCHECKED)

#: The folders whose Python files are checked for imports (tests and scripts import too).
SOURCE_DIRS = ("collab_env", "agents", "adapters", "tests", "tests_vllm", "tests_verl",
               "tests_verifiers", "tests_skyrl", "tests_tinker", "benchmarks", "examples", "tools")
#: Other files that may quote an import path.
TEXT_FILES = ("README.md", "CONTRIBUTING.md", "Makefile", "pyproject.toml", "setup.cfg", "setup.py")


def _walk(directory: Path, suffixes: tuple[str, ...]):
    for dirpath, dirnames, filenames in os.walk(directory):
        dirnames[:] = [d for d in dirnames if d != "__pycache__" and not d.startswith(".")]
        for name in filenames:
            if name.endswith(suffixes):
                yield Path(dirpath) / name


@cache
def modules() -> dict[str, Path]:
    """Every module of the library -> its source file."""
    found: dict[str, Path] = {}
    for package, directory in PACKAGE_DIRS.items():
        for path in _walk(directory, (".py",)):
            parts = list(path.relative_to(directory).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            name = ".".join([package, *parts])
            if package == "collab_env" and name.startswith(("collab_env.agents", "collab_env.adapters")):
                continue  # not a module of collab_env/: agents and adapters live elsewhere
            found[name] = path
    return found


@cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _top_level(tree: ast.Module):
    """The module-level statements, those inside module-level ``if``/``try`` blocks included
    (``if TYPE_CHECKING:`` blocks excluded: annotations only)."""
    stack = list(reversed(tree.body))
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If):
            if isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
                continue
            stack.extend(reversed(node.body + node.orelse))
        elif isinstance(node, ast.Try):
            stack.extend(reversed(node.body + node.orelse + node.finalbody
                                  + [s for h in node.handlers for s in h.body]))
        else:
            yield node


@cache
def defined(module: str) -> frozenset[str]:
    """The names ``module`` defines (def, class, assignment) at module level."""
    names: set[str] = set()
    for node in _top_level(_tree(modules()[module])):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return frozenset(names)


@cache
def imported(module: str) -> dict[str, str]:
    """Name bound by a module-level ``from X import name`` in ``module`` -> ``X`` (absolute)."""
    out: dict[str, str] = {}
    path = modules()[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in _top_level(_tree(path)):
        if isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                out[alias.asname or alias.name] = source
    return out


def _all(module: str) -> list[str]:
    for node in _top_level(_tree(modules()[module])):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets) and node.value:
                try:
                    return list(ast.literal_eval(node.value))
                except ValueError:  # built by code: its string items are what it lists
                    return [n.value for n in ast.walk(node.value)
                            if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    return []


def _is_package(module: str) -> bool:
    return modules()[module].name == "__init__.py"


@pytest.mark.parametrize("old", sorted(DELETED))
def test_a_deleted_old_path_stays_deleted(old):
    assert old not in modules(), f"{old} is back: import from {DELETED[old]} instead"
    assert importlib.util.find_spec(old) is None, f"{old} is importable again"


def test_nothing_names_a_deleted_old_path():
    me = Path(__file__).resolve()
    files = [p for d in SOURCE_DIRS if (ROOT / d).is_dir() for p in _walk(ROOT / d, (".py", ".md", ".toml",
                                                                                   ".cfg", ".yaml", ".json"))]
    files += [ROOT / f for f in TEXT_FILES if (ROOT / f).is_file()]
    hits = []
    for path in files:
        if path.resolve() == me:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        for old in DELETED:
            # the dotted path, or a "module:Name" entry point string
            if old in text:
                for number, line in enumerate(text.splitlines(), 1):
                    if old in line:
                        hits.append(f"{path.relative_to(ROOT)}:{number}: {old} -> use {DELETED[old]}")
    assert not hits, "\n".join(hits)


@pytest.mark.parametrize("module", sorted(REMOVED_NAMES))
def test_a_removed_name_is_not_back_at_its_old_path(module):
    # (The module may still import such a name for its own use: then it does not export it.)
    back = sorted(set(REMOVED_NAMES[module]) & (defined(module) | set(_all(module))))
    assert not back, f"{module} has {back} again: import each from the module that defines it"


def test_a_module_exports_only_its_own_names():
    bad = []
    for module in sorted(modules()):
        if module == "collab_env" or module in FACADES or _unchecked(module):
            continue  # collab_env: the root package's face (collab_env.make etc.)
        own, sources = defined(module), imported(module)
        for name in _all(module):
            if name in own or f"{module}.{name}" in modules():
                continue
            source = sources.get(name)
            if source is None:
                continue  # provided by a module __getattr__ (imported on first use)
            if _is_package(module) and source.startswith(module + "."):
                continue  # a package's face: its own submodules' names
            bad.append(f"{module} re-exports {name} from {source}")
    assert not bad, "\n".join(bad)


def _python_files():
    for directory in SOURCE_DIRS:
        if (ROOT / directory).is_dir():
            yield from _walk(ROOT / directory, (".py",))


def test_every_import_takes_a_name_from_its_home():
    """``from M import name``: ``M`` defines ``name`` (or ``name`` is its submodule), or ``M`` is a
    package whose face gathers it from its own submodules, or ``M`` is a known facade."""
    mods = modules()
    bad = []
    for path in _python_files():
        for node in ast.walk(_tree(path)):
            if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in mods):
                continue
            module = node.module
            if module == "collab_env" or module in FACADES or _unchecked(module):
                continue
            for alias in node.names:
                name = alias.name
                if name == "*" or name in defined(module) or f"{module}.{name}" in mods:
                    continue
                source = imported(module).get(name)
                if source is None:
                    continue  # a module __getattr__ provides it
                if _is_package(module) and source.startswith(module + "."):
                    continue
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name} from {module}; "
                           f"it lives in {source}")
    assert not bad, "\n".join(bad)


def test_sampling_params_has_one_import_path():
    """The sampling keywords' type is imported from collab_env.policy, nowhere else."""
    from collab_env import policy

    assert "SamplingParams" in policy.__all__
    homes = sorted(m for m in modules() if m != "collab_env.policy"
                   and ("SamplingParams" in _all(m) or "SamplingParams" in defined(m)))
    assert homes == []

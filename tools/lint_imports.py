"""``lint-imports`` for collab_env: import-linter over the whole ``collab_env`` namespace, with two
contract types of our own. Run ``python -m tools.lint_imports`` (``make test`` does, before
pytest); arguments are passed to ``lint-imports``. The contracts are in ``pyproject.toml``
(``[tool.importlinter]``).

Why a runner and not the bare ``lint-imports`` command: ``collab_env.agents`` and
``collab_env.adapters`` live in ``agents/`` and ``adapters/`` (setuptools ``package_dir``), outside
``collab_env/``. import-linter's graph builder (grimp) walks a root package's own directory only
and refuses a subpackage as a root, so a plain run sees neither package and every rule about them
would pass vacuously. :class:`PackageDirFinder` lets grimp take ``collab_env.agents`` and
``collab_env.adapters`` as roots of their own, found where Python imports them from. A plain
``lint-imports`` run does not crash: the ``lazy_only`` contract reports that those packages are
missing from the graph, so it fails instead of passing without looking.

Contract types:

* ``lazy_only`` (:class:`LazyOnlyContract`): ``source_modules`` may import ``forbidden_modules``
  only inside a function (a def or lambda body), never at module level (which includes class
  bodies and module-level ``if``/``try`` blocks): the core reaches the backends of
  ``collab_env.agents`` on demand, and ``import collab_env`` loads none of them.
* ``private_names`` (:class:`PrivateNamesContract`): no module imports another module's private
  name (``from collab_env.x import _name``) or reads one through a module it imported
  (``x._name``). Private *modules* (``collab_env._async``, ``collab_env.tasks._common``) are the
  built-in ``private_modules`` contract's business: importable within their parent package.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import sys
from collections.abc import Iterator
from functools import cache

import grimp
from grimp.adaptors.packagefinder import ImportLibPackageFinder
from grimp.application.config import settings as grimp_settings
from importlinter.application import contract_utils, output
from importlinter.domain import fields, helpers
from importlinter.domain.contract import Contract, ContractCheck

__all__ = ["PackageDirFinder", "LazyOnlyContract", "PrivateNamesContract", "main"]


class PackageDirFinder(ImportLibPackageFinder):
    """grimp's package finder, also accepting a subpackage as a root package when its parent is a
    regular package: its directories are where Python imports it from (setuptools ``package_dir``
    may put it anywhere). Remembers every root's directories for :func:`module_file`."""

    directories: dict[str, set[str]] = {}

    def determine_package_directories(self, package_name: str, file_system) -> set[str]:
        if "." in package_name:
            spec = importlib.util.find_spec(package_name)
            if spec is None or not spec.submodule_search_locations:
                raise ValueError(f"Could not find package {package_name!r} in your Python path.")
            found = set(spec.submodule_search_locations)
        else:
            found = super().determine_package_directories(package_name, file_system)
        PackageDirFinder.directories[package_name] = found
        return found


def module_file(module: str) -> str | None:
    """The source file of ``module``, from the directories of its root package (the longest root
    that contains it), without importing it; ``None`` for a namespace package (a directory without
    ``__init__.py``).

    Raises:
        LookupError: No root package holds ``module``, or its file is missing (the rule could not
            look at it).
    """
    roots = [r for r in PackageDirFinder.directories if module == r or module.startswith(r + ".")]
    if not roots:
        raise LookupError(f"no root package found by PackageDirFinder holds {module}: run "
                          "`python -m tools.lint_imports`, not the bare `lint-imports`.")
    root = max(roots, key=len)
    rest = module[len(root):].lstrip(".").split(".") if module != root else []
    for directory in sorted(PackageDirFinder.directories[root]):
        base = os.path.join(directory, *rest)
        candidates = [base + ".py", os.path.join(base, "__init__.py")] if rest else [
            os.path.join(base, "__init__.py")]
        for candidate in candidates:
            if os.path.isfile(candidate):
                return candidate
        if rest and os.path.isdir(base):
            return None
    raise LookupError(f"the source of {module} is not under {sorted(PackageDirFinder.directories[root])}.")


@cache
def _tree(path: str) -> ast.Module:
    with open(path, encoding="utf-8") as f:
        return ast.parse(f.read(), filename=path)


def _function_lines(tree: ast.Module) -> set[int]:
    """Every line inside the body of a function or lambda."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            body = node.body if isinstance(node.body, list) else [node.body]
            for stmt in body:
                lines.update(range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1))
    return lines


def _expand(graph: grimp.ImportGraph, expressions) -> set[str]:
    """The modules the expressions match, with their descendants."""
    modules = {m.name for m in helpers.module_expressions_to_modules(graph, expressions)}
    return modules | {d for m in modules for d in graph.find_descendants(m)}


class LazyOnlyContract(Contract):
    """``source_modules`` import ``forbidden_modules`` only inside functions.

    Configuration options:

        - source_modules:    The modules (and their descendants) to check.
        - forbidden_modules: The modules (and their descendants) they may import only lazily.
                             Each must be in the graph: a rule about a package the graph does not
                             hold would pass without looking.
        - exempt_modules:    Modules (and their descendants) of the sources not checked (optional).
        - ignore_imports:    Imports to ignore (optional).
    """

    type_name = "lazy_only"

    source_modules = fields.ListField(subfield=fields.ModuleExpressionField())
    forbidden_modules = fields.ListField(subfield=fields.ModuleExpressionField())
    exempt_modules = fields.ListField(subfield=fields.ModuleExpressionField(), required=False)
    ignore_imports = fields.SetField(subfield=fields.ImportExpressionField(), required=False)

    def check(self, graph: grimp.ImportGraph, verbose: bool) -> ContractCheck:
        missing = sorted(e.expression for e in self.forbidden_modules  # type: ignore[attr-defined]
                         if e.expression not in graph.modules)
        if missing:
            return ContractCheck(kept=False, metadata={"missing": missing, "violations": []})
        removal = contract_utils.remove_ignored_imports_and_report(
            graph=graph, ignore_imports=self.ignore_imports,  # type: ignore[arg-type]
            unmatched_alerting=contract_utils.AlertLevel.ERROR,
        )
        sources = _expand(graph, self.source_modules)
        forbidden = _expand(graph, self.forbidden_modules)
        exempt = _expand(graph, self.exempt_modules) if self.exempt_modules else set()
        violations = []
        for importer in sorted(sources - forbidden - exempt):
            path = module_file(importer)
            if path is None:
                continue
            inside = _function_lines(_tree(path))
            for imported in sorted(graph.find_modules_directly_imported_by(importer) & forbidden):
                for d in graph.get_import_details(importer=importer, imported=imported):
                    if d["line_number"] not in inside:
                        violations.append(f"{importer} -> {imported} (l.{d['line_number']}: "
                                          f"{d['line_contents']})")
        return ContractCheck(kept=not violations, warnings=list(removal.warnings),
                             metadata={"missing": [], "violations": violations})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for module in check.metadata["missing"]:
            output.print_error(
                f"{module} is not in the import graph, so this rule cannot be checked. It lives "
                "outside collab_env/ (setuptools package_dir): run `python -m tools.lint_imports`, "
                "which lists it as a root package, instead of the bare `lint-imports`.", bold=False)
            output.new_line()
        if check.metadata["violations"]:
            output.print_error("Imported at module level; import inside the function that needs it:",
                               bold=False)
            output.new_line()
        for v in check.metadata["violations"]:
            output.print_error(f"- {v}", bold=False)
        output.new_line()


def _resolve_from(importer: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    parts = importer.split(".")
    base = parts if is_package else parts[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_name_uses(module: str, path: str, modules: set[str]) -> Iterator[tuple[int, str, str]]:
    """``(line, owner, name)`` for every private name ``module`` (source at ``path``) takes from
    another module ``owner`` of ``modules``: ``from owner import _name`` (``_name`` not a
    submodule of ``owner``) and ``owner._name`` where ``owner`` was bound by an import."""
    tree = _tree(path)
    is_package = os.path.basename(path) == "__init__.py"
    aliases: dict[str, str] = {}  # local name -> the module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = _resolve_from(module, is_package, node)
            for a in node.names:
                if f"{source}.{a.name}" in modules:
                    aliases[a.asname or a.name] = f"{source}.{a.name}"
                elif source in modules and source != module and _private(a.name):
                    yield node.lineno, source, a.name
        elif isinstance(node, ast.Import):
            for a in node.names:
                bound = a.name if a.asname else a.name.split(".")[0]
                if bound in modules:
                    aliases[a.asname or bound] = bound
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and _private(node.attr)):
            continue
        chain, value = [], node.value
        while isinstance(value, ast.Attribute):
            chain.append(value.attr)
            value = value.value
        if not isinstance(value, ast.Name) or value.id not in aliases:
            continue
        # Follow the dotted path from the alias while it names modules (`collab_env.x._y`); a
        # private attribute of an object reached from a module (`x.obj._y`) is not a module's name.
        owner = aliases[value.id]
        for part in reversed(chain):
            if f"{owner}.{part}" not in modules:
                break
            owner = f"{owner}.{part}"
        else:
            if owner != module:
                yield node.lineno, owner, node.attr


class PrivateNamesContract(Contract):
    """No module imports another module's private (``_name``) names.

    Configuration options:

        - modules:        The modules (and their descendants) to check; default: every module
                          of the root packages.
        - ignore_names:   ``"importer -> module._name"`` strings to allow (optional).
    """

    type_name = "private_names"

    modules = fields.ListField(subfield=fields.ModuleExpressionField(), required=False)
    ignore_names = fields.SetField(subfield=fields.StringField(), required=False)

    def check(self, graph: grimp.ImportGraph, verbose: bool) -> ContractCheck:
        internal = {m for m in graph.modules if not graph.is_module_squashed(m)}
        checked = _expand(graph, self.modules) if self.modules else internal
        ignored = set(self.ignore_names or ())  # type: ignore[arg-type]
        violations = []
        for module in sorted(checked):
            path = module_file(module)
            if path is None:
                continue
            for line, owner, name in private_name_uses(module, path, internal):
                if f"{module} -> {owner}.{name}" not in ignored:
                    violations.append(f"{module} (l.{line}) takes {name} from {owner}")
        return ContractCheck(kept=not violations, metadata={"violations": violations})

    def render_broken_contract(self, check: ContractCheck) -> None:
        output.print_error("Private names taken from another module; make the helper public in the "
                           "lower module (or move it) instead:", bold=False)
        output.new_line()
        for v in check.metadata["violations"]:
            output.print_error(f"- {v}", bold=False)
        output.new_line()


def main(argv: list[str] | None = None) -> int:
    """Run ``lint-imports`` with :class:`PackageDirFinder`; ``argv`` as for ``lint-imports``
    (``--no-cache`` unless a cache option is given)."""
    from importlinter.cli import lint_imports_command

    args = list(sys.argv[1:] if argv is None else argv)
    if not any(a in ("--no-cache", "--cache-dir") or a.startswith("--cache-dir=") for a in args):
        args.append("--no-cache")
    grimp_settings.configure(PACKAGE_FINDER=PackageDirFinder())
    try:
        lint_imports_command.main(args=args, prog_name="lint-imports", standalone_mode=True)
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


if __name__ == "__main__":
    # Run the main() of the module import-linter loads the contract types from (tools.lint_imports),
    # not of this __main__ copy: the contracts read the directories its finder records.
    from tools.lint_imports import main as _main

    sys.exit(_main())

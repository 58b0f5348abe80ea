"""The folder mypy checks: ``collab_env`` as it installs, in ``build/typecheck/collab_env``.

Run ``python -m tools.typecheck_tree`` before ``python -m mypy`` (``make test`` does); the mypy
settings are in ``pyproject.toml`` (``[tool.mypy]``, whose ``files`` is this folder).

Why a folder of links: ``collab_env.agents`` lives in ``agents/`` and ``collab_env.adapters`` in
``adapters/`` (setuptools ``package_dir``, see setup.py), outside ``collab_env/``. mypy names a module by its file's place below a package root
and has no ``package_dir``: checked as ``agents/``, the backends would be a second package
``agents`` whose imports of ``collab_env.agents`` go unresolved, and every call from the core into
them would be unchecked. In this folder ``collab_env/`` holds a link to each entry of the source
``collab_env/`` and one to each folder of :data:`MAPPED`, so mypy sees every module under the name
Python imports it by. The folder is rebuilt on each run (a new module needs nothing), holds only
links (errors name ``build/typecheck/collab_env/<path>``, which opens the source file), and is
ignored by git (``build/``).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

__all__ = ["ROOT", "TREE", "MAPPED", "build_tree", "main"]

ROOT = Path(__file__).resolve().parents[1]
#: Where the tree goes: ``TREE / "collab_env"`` is the package mypy checks.
TREE = ROOT / "build" / "typecheck"
#: Subpackage of collab_env -> its source folder (setup.py's package_dir).
MAPPED = {"agents": "agents", "adapters": "adapters"}


def build_tree() -> Path:
    """(Re)build the tree of links and return its ``collab_env`` folder."""
    pkg = TREE / "collab_env"
    if pkg.is_symlink() or pkg.is_file():
        pkg.unlink()
    elif pkg.exists():
        shutil.rmtree(pkg)  # links only: rmtree removes a link, never what it points to
    pkg.mkdir(parents=True)
    for entry in sorted((ROOT / "collab_env").iterdir()):
        if entry.name == "__pycache__" or entry.name in MAPPED:
            continue
        (pkg / entry.name).symlink_to(os.path.relpath(entry, pkg))
    for name, folder in MAPPED.items():
        (pkg / name).symlink_to(os.path.relpath(ROOT / folder, pkg), target_is_directory=True)
    return pkg


def main(argv: list[str] | None = None) -> int:
    pkg = build_tree()
    print(f"typecheck tree: {os.path.relpath(pkg, ROOT)} (collab_env + {', '.join(sorted(MAPPED))})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

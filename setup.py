"""Which packages the distribution holds: found on disk, never listed by hand (a hand-kept list
once left ``collab_env.leaderboard`` out of the wheel while the editable install hid it).

Everything else is declared in setup.cfg. The code lives in three folders; two of them are
installed under another name (setuptools ``package_dir``), which setup.cfg's ``packages = find:``
cannot express (it names a package by its folder, so ``adapters/trl`` would become
``adapters.trl``), hence this file. Every folder with an ``__init__.py`` below a root is a
package; tests/test_wheel.py checks that every ``.py`` file of the three folders is in the wheel
(a folder without ``__init__.py`` would be left out, and that test says so).
"""

from setuptools import find_packages, setup

#: Import name -> folder of each root package. A new subpackage needs no entry here.
ROOTS = {
    "collab_env": "collab_env",
    "collab_env.agents": "agents",
    "collab_env.adapters": "adapters",
}


def discover_packages() -> list[str]:
    """Every package below the roots, by its import name."""
    found = []
    for name, folder in ROOTS.items():
        found += [name] + [f"{name}.{sub}" for sub in find_packages(folder)]
    return sorted(found)


setup(
    packages=discover_packages(),
    package_dir={name: folder for name, folder in ROOTS.items() if name != folder},
)

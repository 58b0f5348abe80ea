"""Write an installable verifiers environment package for a registered collab_env id.

prime-rl and ``vf-eval`` load an environment by its taskset id: the importable module of that
name must export one ``vf.Taskset`` subclass (and optionally one ``vf.Env``) through
``__all__``. :func:`write_package` writes such a package (``pyproject.toml`` plus the module)
whose classes are :func:`~collab_env.adapters.verifiers.taskset_class` and
:func:`~collab_env.adapters.verifiers.env_class` of the id.
"""

from __future__ import annotations

import re
from pathlib import Path

from collab_env.errors import ConfigError

__all__ = ["write_package", "package_name"]

_PYPROJECT = '''[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "{dist}"
version = "{version}"
description = "collab_env's {env_id} as a verifiers v1 environment (taskset + env), for prime-rl"
requires-python = ">=3.10"
dependencies = ["collab_env", "verifiers>=0.4,<0.5"]

[tool.setuptools]
py-modules = ["{module}"]
'''

_MODULE = '''"""collab_env's {env_id} as a verifiers v1 environment (written by
collab_env.adapters.verifiers.write_package; regenerate rather than edit).

Taskset id: {dist}. Roles (verifiers agents): {roles}; the other players act through
collab_env's policies (``--env.policies``). Rewards: each role's collab_env episode return.
"""

from collab_env.adapters.verifiers import env_class, taskset_class

{camel}Taskset = taskset_class({env_id!r}, module=__name__)
{camel}Env = env_class({env_id!r}, {roles!r}, module=__name__)
{camel}EnvConfig = {camel}Env.CONFIG

__all__ = ["{camel}Taskset", "{camel}Env"]
'''


def package_name(env_id: str) -> str:
    """The taskset id (distribution name) of an env's package: ``collab-<id>``, e.g.
    ``collab-hidden-facts-v2`` (module ``collab_hidden_facts_v2``)."""
    from collab_env.registry import spec

    return "collab-" + re.sub(r"[^0-9a-z]+", "-", spec(env_id).id.lower()).strip("-")


def write_package(env_id: str, dest: str | Path, *, roles: tuple[str, ...] | None = None,
                  version: str = "0.1.0") -> Path:
    """Write ``dest/<package_name(env_id)>/`` with ``pyproject.toml`` and the module.

    Install it with ``pip install -e <dir>`` next to collab_env and verifiers; then
    ``vf-eval <package_name>`` and prime-rl find it by that id.

    Args:
        env_id: Registered collab_env id (``"hidden-facts"`` means its latest version, which
            the package pins).
        dest: Directory to write into (created).
        roles: The players verifiers plays (default: the spec's trainable players).
        version: The package version.

    Returns:
        The package directory.

    Raises:
        ConfigError: The package directory exists and is not empty.
    """
    from collab_env.adapters.verifiers.env import class_prefix, env_class
    from collab_env.registry import spec

    s = spec(env_id)
    cls = env_class(s.id, tuple(roles) if roles is not None else None)
    dist = package_name(s.id)
    module = dist.replace("-", "_")
    root = Path(dest) / dist
    if root.exists() and any(root.iterdir()):
        raise ConfigError(f"{root} exists and is not empty; pass another dest or remove it.")
    root.mkdir(parents=True, exist_ok=True)
    (root / "pyproject.toml").write_text(_PYPROJECT.format(dist=dist, version=version, env_id=s.id, module=module))
    (root / f"{module}.py").write_text(_MODULE.format(env_id=s.id, dist=dist, camel=class_prefix(s.id),
                                                     roles=tuple(cls.ROLES)))
    return root

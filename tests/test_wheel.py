"""The package as users install it: a wheel built from the tracked files holds every package
(``collab_env/``, ``agents/`` as ``collab_env.agents``, ``adapters/`` as ``collab_env.adapters``)
and the leaderboard's track files, and, imported from that wheel alone (not the editable
checkout), ``collab-env leaderboard tracks`` lists the tracks."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _tracked() -> list[str]:
    out = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True, check=True).stdout
    return [p for p in out.decode().split("\0") if p]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    pytest.importorskip("setuptools")
    pytest.importorskip("wheel")
    if not (REPO / ".git").exists():
        pytest.skip("needs the git checkout (the wheel is built from its tracked files)")
    src = tmp_path_factory.mktemp("src")
    for rel in _tracked():  # a clean copy: no build/ folder or stray file can leak into the wheel
        if rel.startswith(("collab_env/", "agents/", "adapters/")) or rel in ("setup.cfg", "pyproject.toml", "README.md"):
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            (src / rel).write_bytes((REPO / rel).read_bytes())
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
                    str(src)], check=True, capture_output=True, timeout=300)
    [whl] = out.glob("collab_env-*.whl")
    return whl


def test_the_wheel_holds_every_package_and_the_track_files(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    tracked = _tracked()
    mapping = {"agents/": "collab_env/agents/", "adapters/": "collab_env/adapters/", "collab_env/": "collab_env/"}
    missing = []
    for rel in tracked:
        prefix = next((p for p in mapping if rel.startswith(p)), None)
        if prefix is None or not (rel.endswith(".py") or rel.startswith("collab_env/leaderboard/tracks/")):
            continue
        if mapping[prefix] + rel[len(prefix):] not in names:
            missing.append(rel)
    assert missing == [], f"tracked files missing from the wheel: {missing[:10]}"
    assert sum(n.startswith("collab_env/leaderboard/tracks/") for n in names) >= 40
    assert "collab_env/leaderboard/tracks/LOCK.json" in names


def test_the_installed_wheel_lists_the_tracks_without_the_checkout(wheel, tmp_path):
    """Unpacked alone on sys.path (``-S``: no site hooks, so the editable install of this checkout
    is not found), with the environment's dependencies after it."""
    unpacked = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(unpacked)
    deps = sysconfig.get_paths()["purelib"]
    code = ("import sys; sys.path[:0] = [sys.argv[1], sys.argv[2]]; import collab_env, collab_env.leaderboard.signing; "
            "assert collab_env.__file__.startswith(sys.argv[1]), collab_env.__file__; "
            "from collab_env.cli import main; sys.exit(main(['leaderboard', 'tracks']))")
    r = subprocess.run([sys.executable, "-S", "-c", code, str(unpacked), deps], capture_output=True, text=True,
                       cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "hidden-facts-easy@v2" in r.stdout and "humaneval-mini@v1" in r.stdout

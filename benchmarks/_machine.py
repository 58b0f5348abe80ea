"""Is the machine quiet enough to time something? The load check the benchmarks share.

A CPU benchmark of torch code measures the machine as much as the code: torch starts one
intra-op thread per core, and two processes that each use every core slow each other **far more
than 2x** (their threads wait on each other at every parallel barrier and lose their caches at
every switch). Measured here: one GRPO step of ``bench_grpo_vs_trl.py`` took 5.88 s on a quiet
2-core machine and 41 s while another torch process ran. A figure taken on a busy machine says
little, even as a ratio of two runs.

So a benchmark calls :func:`check` before it starts: it samples what the *other* processes use
(from ``/proc``: the machine's busy time in ``/proc/stat`` minus this process's own, over
``interval`` seconds, plus the busiest other processes from ``/proc/<pid>/stat``) and the load
average (``/proc/loadavg``), prints it, and refuses to start (exit status 3) when other
processes keep at least ``threshold`` cores busy, unless ``--allow-loaded`` is given (then it
warns loudly and goes on). :class:`LoadMeter` measures the same over a whole run, so a results
file can record how busy the machine was while it was timed. Only Linux's ``/proc`` is read:
no third-party package. Elsewhere the check reports that it cannot tell, and lets the run start.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

__all__ = ["MachineLoad", "LoadMeter", "sample_load", "check", "add_load_arguments", "OVERSUBSCRIPTION_NOTE"]

#: What the check prints when the machine is loaded (and what results files quote).
OVERSUBSCRIPTION_NOTE = (
    "two processes that each use every core slow each other far more than 2x (torch's threads wait "
    "on each other at every parallel step): a timing taken now measures the other work as much as "
    "this code. Run it again on a quiet machine (nothing else busy), or pass --allow-loaded to time "
    "it anyway and read the figures as rough."
)

_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class MachineLoad:
    """How busy the machine was, apart from this process.

    Attributes:
        cores: Processors this process may run on.
        load_average: ``/proc/loadavg``'s 1, 5 and 15 minute figures (they count this process
            too, and lag: a job that just ended still shows in them).
        other_busy_cores: Cores kept busy by other processes over the sampled interval (the
            machine's busy time less this process's own, per second of wall time).
        interval_s: Length of that interval.
        busiest: The busiest other processes over the interval: ``(pid, command, cores)``.
        known: False where ``/proc`` could not be read (not Linux): nothing is known then.
    """

    cores: int
    load_average: tuple[float, float, float]
    other_busy_cores: float
    interval_s: float
    busiest: tuple[tuple[int, str, float], ...] = ()
    known: bool = True

    def loaded(self, threshold: float) -> bool:
        """Other processes kept at least ``threshold`` cores busy."""
        return self.known and self.other_busy_cores >= threshold

    def describe(self) -> str:
        """One line: cores, the others' busy cores and the load average."""
        if not self.known:
            return f"machine load unknown (no /proc); {self.cores} cores"
        la = ", ".join(f"{x:.2f}" for x in self.load_average)
        return (f"{self.cores} cores; other processes kept {self.other_busy_cores:.2f} cores busy over "
                f"{self.interval_s:.1f} s; load average {la}")

    def to_dict(self) -> dict:
        """Plain JSON for a results file."""
        d = asdict(self)
        d["busiest"] = [{"pid": p, "command": c, "cores": round(x, 3)} for p, c, x in self.busiest]
        d["other_busy_cores"] = round(self.other_busy_cores, 3)
        return d


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _load_average() -> tuple[float, float, float]:
    parts = Path("/proc/loadavg").read_text().split()
    return float(parts[0]), float(parts[1]), float(parts[2])


def _machine_busy_ticks() -> int:
    """Busy clock ticks of all processors since boot (``/proc/stat``: all but idle and iowait)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    values = [int(x) for x in fields]
    # user nice system idle iowait irq softirq steal guest guest_nice; guest time is already in user
    busy = sum(values[:8]) - values[3] - values[4]
    return busy


def _own_seconds() -> float:
    """CPU seconds used by this process and its reaped children."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _process_ticks() -> dict[int, tuple[str, int]]:
    """pid -> (command name, utime + stime ticks) of every process that can be read."""
    out: dict[int, tuple[str, int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            raw = Path(entry.path, "stat").read_text()
        except OSError:  # the process ended meanwhile
            continue
        name = raw[raw.find("(") + 1: raw.rfind(")")]
        rest = raw[raw.rfind(")") + 2:].split()
        out[int(entry.name)] = (name, int(rest[11]) + int(rest[12]))  # fields 14 and 15: utime, stime
    return out


def _own_family() -> set[int]:
    """This process and its descendants (their CPU is this process's own)."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            raw = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        ppid = int(raw[raw.rfind(")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    family, todo = set(), [os.getpid()]
    while todo:
        pid = todo.pop()
        family.add(pid)
        todo.extend(children.get(pid, []))
    return family


class LoadMeter:
    """The other processes' busy cores over a stretch of time: :meth:`start`, then :meth:`stop`
    returns a :class:`MachineLoad` for that stretch (this process's own CPU, with its reaped
    children and its live descendants, is taken out of the machine's busy time; stop it before
    the run's worker processes end, since an exited child that is not reaped yet is counted by
    nobody)."""

    def __init__(self) -> None:
        self._t0: float | None = None
        self._busy0 = 0
        self._own0 = 0.0
        self._procs0: dict[int, tuple[str, int]] = {}
        self.known = Path("/proc/stat").exists()

    def start(self) -> LoadMeter:
        """Begin the stretch (returns ``self``)."""
        self._t0 = time.monotonic()
        if self.known:
            self._busy0, self._own0 = _machine_busy_ticks(), _own_seconds()
            self._procs0 = _process_ticks()
        return self

    def stop(self, top: int = 5) -> MachineLoad:
        """End the stretch: the load over it, with its ``top`` busiest other processes."""
        if self._t0 is None:
            raise RuntimeError("LoadMeter.stop() before start()")
        wall = max(time.monotonic() - self._t0, 1e-6)
        cores = _cores()
        if not self.known:
            return MachineLoad(cores, (0.0, 0.0, 0.0), 0.0, wall, (), known=False)
        busy = (_machine_busy_ticks() - self._busy0) / _CLK_TCK
        own = _own_seconds() - self._own0
        procs = _process_ticks()
        family = _own_family()
        me = os.getpid()
        per_proc = []
        for pid, (name, ticks) in procs.items():
            if pid in family and pid != me:
                # a live descendant (an engine's worker process): its CPU is not in os.times()
                # until it is reaped, but it is this run's own work
                before = self._procs0[pid][1] if pid in self._procs0 else 0
                own += (ticks - before) / _CLK_TCK
                continue
            if pid == me or pid not in self._procs0:
                continue
            used = (ticks - self._procs0[pid][1]) / _CLK_TCK / wall
            if used > 0.01:
                per_proc.append((pid, name, used))
        per_proc.sort(key=lambda x: -x[2])
        others = max(0.0, (busy - own) / wall)
        return MachineLoad(cores, _load_average(), others, wall, tuple(per_proc[:top]))


def sample_load(interval: float = 2.0) -> MachineLoad:
    """The other processes' load over the next ``interval`` seconds (this process sleeps)."""
    meter = LoadMeter().start()
    time.sleep(interval)
    return meter.stop()


def add_load_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--allow-loaded``, ``--load-threshold`` and ``--load-sample`` to a benchmark's parser."""
    parser.add_argument("--allow-loaded", action="store_true",
                        help="time it even when other processes keep the machine busy (the figures are then rough)")
    parser.add_argument("--load-threshold", type=float, default=0.5,
                        help="cores kept busy by other processes from which the machine counts as loaded (default 0.5)")
    parser.add_argument("--load-sample", type=float, default=2.0,
                        help="seconds over which the other processes' load is sampled before starting (default 2)")


@dataclass
class LoadCheck:
    """What :func:`check` found: the load before the run, and whether the run was let start on a
    loaded machine."""

    before: MachineLoad
    loaded: bool
    allowed: bool
    threshold: float
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"before": self.before.to_dict(), "loaded": self.loaded, "allowed_loaded": self.allowed,
                "threshold_cores": self.threshold, "note": OVERSUBSCRIPTION_NOTE if self.loaded else None}


def check(args: argparse.Namespace, *, stream=None) -> LoadCheck:
    """Sample the load (``args.load_sample`` seconds) and print it. On a loaded machine: without
    ``args.allow_loaded`` print why and exit with status 3; with it, warn loudly and go on."""
    stream = stream or sys.stderr
    load = sample_load(args.load_sample)
    loaded = load.loaded(args.load_threshold)
    print(f"machine: {load.describe()}", file=stream)
    result = LoadCheck(load, loaded, bool(args.allow_loaded), args.load_threshold)
    if not loaded:
        return result
    busiest = ", ".join(f"{c} (pid {p}, {x:.2f} cores)" for p, c, x in load.busiest) or "not attributable"
    bar = "!" * 78
    print(f"{bar}\nTHE MACHINE IS LOADED: other processes keep {load.other_busy_cores:.2f} of {load.cores} cores "
          f"busy (threshold {args.load_threshold}); busiest: {busiest}.\n{OVERSUBSCRIPTION_NOTE}\n{bar}", file=stream)
    if not args.allow_loaded:
        print("not started (pass --allow-loaded to run anyway).", file=stream)
        raise SystemExit(3)
    return result

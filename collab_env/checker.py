"""The conformance checker: run it on any collab_env environment, registered or your own.

>>> from collab_env.checker import check_env
>>> report = check_env("hidden-facts")          # raises EnvCheckError when a check fails

Checks (each named in the report):

* ``parallel_api``: PettingZoo's ``parallel_api_test``.
* ``parallel_seed``: PettingZoo's ``parallel_seed_test`` (two envs, same seed, same outputs).
* ``determinism``: our multi-step twin-env test: two envs reset with the same seed and fed the
  same actions (random Unicode, empty strings, ordinary text) give equal observations, rewards,
  terminations, truncations, infos and global state at every step, over several episodes.
* ``clone``: a clone taken mid-episode is independent of the original, and replaying the same
  actions on the clone reproduces the original's outputs exactly.
* ``pickle``: a pickled and restored env continues exactly like the original.
* ``robustness``: random Unicode, lone surrogates, empty and 1 MB actions never crash; a wrong
  action type raises :class:`~collab_env.errors.ActionError`; stepping after the end raises
  :class:`~collab_env.errors.EnvStateError`.
* ``gymnasium_view``: Gymnasium's ``check_env`` on the single-agent view of every trainable
  player (skipped when a non-controlled player has no policy).
* ``exploits`` (with ``exploits=True``, registered ids): the exploit audit
  (:func:`collab_env.exploits.audit_exploits`): every generic gaming policy must score no better
  than the card's naive baseline under every reward option; ``report.exploits`` holds its table.
"""

from __future__ import annotations

import contextlib
import io
import pickle
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from collab_env.env import CollabEnv
from collab_env.errors import ActionError, CollabEnvError, EnvStateError
from collab_env.policy import policies_for

__all__ = ["check_env", "CheckResult", "CheckReport", "EnvCheckError"]


class EnvCheckError(CollabEnvError, AssertionError):
    """One or more conformance checks failed; ``report`` has the details."""

    def __init__(self, report: CheckReport) -> None:
        self.report = report
        super().__init__(
            f"{report.env_id}: {len(report.failed)} check(s) failed:\n" + report.format(only_failed=True)
        )


@dataclass
class CheckResult:
    name: str
    passed: bool | None  # None: skipped
    detail: str = ""


@dataclass
class CheckReport:
    env_id: str
    results: list[CheckResult] = field(default_factory=list)
    #: The exploit audit's report (:class:`collab_env.exploits.ExploitReport`), with ``exploits=True``.
    exploits: Any = None

    @property
    def failed(self) -> list[CheckResult]:
        return [r for r in self.results if r.passed is False]

    @property
    def ok(self) -> bool:
        return not self.failed

    def format(self, only_failed: bool = False) -> str:
        lines = []
        for r in self.results:
            if only_failed and r.passed is not False:
                continue
            status = {True: "PASS", False: "FAIL", None: "SKIP"}[r.passed]
            lines.append(f"{status:4}  {r.name}" + (f": {r.detail}" if r.detail else ""))
        return "\n".join(lines)


def _action_stream(seed: int):
    """Deterministic mix of hostile and ordinary actions."""
    from collab_env.spaces import UnicodeText

    space = UnicodeText(sample_max_length=200, seed=seed)
    fixed = ["", "Could you tell me more about what you need?", "\\boxed{12}",
             "😀 中文 “quotes” \n\t end", "[[TERMINATE CHAT]]"]
    rng = np.random.default_rng(seed)
    while True:
        if rng.random() < 0.5:
            yield space.sample()
        else:
            yield fixed[int(rng.integers(len(fixed)))]


def _actions_for(env: CollabEnv, infos: Mapping[str, Mapping[str, Any]], stream) -> dict[str, str]:
    return {a: next(stream) for a in env.agents if infos[a].get("on_turn")}


def _equal(a: Any, b: Any) -> bool:
    from gymnasium.utils.env_checker import data_equivalence

    return data_equivalence(a, b)


def _play(env: CollabEnv, seed: int, steps: int, action_seed: int) -> list[Any]:
    """Run ``steps`` env steps from ``reset(seed)`` (resetting when an episode ends); return
    every output, for comparison."""
    trace: list[Any] = []
    stream = _action_stream(action_seed)
    obs, infos = env.reset(seed=seed)
    trace.append((obs, infos, env.state()))
    for _ in range(steps):
        if not env.agents:
            obs, infos = env.reset()
            trace.append((obs, infos, env.state()))
            continue
        out = env.step(_actions_for(env, infos, stream))
        obs, infos = out[0], out[4]
        trace.append((*out, env.state()))
    return trace


def _check_parallel_api(make: Callable[[], CollabEnv], cycles: int) -> str:
    from pettingzoo.test import parallel_api_test

    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")  # it passes options={"options": 1} on purpose
        parallel_api_test(make(), num_cycles=cycles)
    return f"{cycles} cycles"


def _check_parallel_seed(make: Callable[[], CollabEnv], cycles: int) -> str:
    from pettingzoo.test import parallel_seed_test

    parallel_seed_test(make, num_cycles=cycles)
    return ""


def _check_determinism(make: Callable[[], CollabEnv], steps: int) -> str:
    for seed in (0, 7, 123):
        t1 = _play(make(), seed, steps, action_seed=seed + 1)
        t2 = _play(make(), seed, steps, action_seed=seed + 1)
        for i, (x, y) in enumerate(zip(t1, t2)):
            if not _equal(x, y):
                raise AssertionError(f"seed {seed}: outputs differ at step {i}")
    return f"3 seeds x {steps} steps"


_BENIGN = "Could you tell me a bit more about what you need?"


def _check_clone(make: Callable[[], CollabEnv]) -> str:
    env = make()
    stream = _action_stream(5)
    obs, infos = env.reset(seed=3)
    for _ in range(2):  # ordinary text first, so the fork happens mid-episode
        if len(env.agents) and env.episode.step + 1 < env.max_steps:
            obs, _, _, _, infos = env.step({a: _BENIGN for a in env.on_turn})
    if not env.agents:
        return "episode too short to fork"
    fork = env.clone()
    before = fork.state()
    actions = []
    outs = []
    while env.agents:
        act = _actions_for(env, infos, stream)
        actions.append(act)
        out = env.step(act)
        outs.append((*out, env.state()))
        infos = out[4]
    if fork.state() != before or not fork.agents:
        raise AssertionError("stepping the original changed the clone")
    for i, act in enumerate(actions):
        out = fork.step(act)
        if not _equal((*out, fork.state()), outs[i]):
            raise AssertionError(f"the clone diverged from the original at step {i}")
    return f"{len(actions)} replayed steps"


def _check_pickle(make: Callable[[], CollabEnv]) -> str:
    env = make()
    stream = _action_stream(9)
    obs, infos = env.reset(seed=11)
    if env.agents and env.max_steps > 1:
        obs, _, _, _, infos = env.step({a: _BENIGN for a in env.on_turn})
    if not env.agents:
        return "episode ended after one step"
    copy_ = pickle.loads(pickle.dumps(env))
    while env.agents:
        act = _actions_for(env, infos, stream)
        out1 = env.step(act)
        out2 = copy_.step(act)
        if not _equal((*out1, env.state()), (*out2, copy_.state())):
            raise AssertionError("the unpickled env diverged from the original")
        infos = out1[4]
    return ""


def _check_robustness(make: Callable[[], CollabEnv]) -> str:
    env = make()
    hostile = ["", "\ud800 lone surrogate", "x" * (1 << 20), "\x00\x01\x1b[31m", "🤖" * 1000,
               "\u202e right-to-left", "line\r\nbreaks\n\n"]
    for i, text in enumerate(hostile):
        obs, infos = env.reset(seed=i)
        while env.agents:
            out = env.step({a: text for a in env.agents if infos[a].get("on_turn")})
            obs, infos = out[0], out[4]
            for a, o in obs.items():
                if not env.observation_space(a).contains(o):
                    raise AssertionError(f"observation of {a} not in its space after action {text[:20]!r}")
                for m in o:
                    m.content.encode("utf-8")  # every stored text must be valid Unicode
    env.reset(seed=0)
    on_turn = list(env.on_turn)
    bad_actions: tuple[Any, ...] = (123, None, b"bytes", ["list"])  # wrong types on purpose
    for bad in bad_actions:
        try:
            env.step({a: bad for a in on_turn})
        except ActionError:
            pass
        else:
            raise AssertionError(f"action {bad!r} was accepted; expected ActionError")
    while env.agents:
        env.step({a: "" for a in env.on_turn})
    try:
        env.step({a: "" for a in env.possible_agents})
    except EnvStateError:
        pass
    else:
        raise AssertionError("step() after the end did not raise EnvStateError")
    return f"{len(hostile)} hostile inputs, 4 wrong types"


def _check_gym_views(make_view: Callable[[str], Any], players: list[str]) -> str:
    from gymnasium.utils.env_checker import check_env as gym_check

    done = []
    for p in players:
        view = make_view(p)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            gym_check(view, skip_render_check=True)
        done.append(p)
    return "views: " + ", ".join(done)


def check_env(
    env: str | Callable[[], CollabEnv],
    *,
    make_kwargs: Mapping[str, Any] | None = None,
    policies: Mapping[str, Any] | None = None,
    cycles: int = 200,
    steps: int = 40,
    raise_on_failure: bool = True,
    exploits: bool = False,
    exploit_kwargs: Mapping[str, Any] | None = None,
) -> CheckReport:
    """Run every conformance check on an environment.

    Args:
        env: A registered id, or a zero-argument function returning a fresh ``CollabEnv``.
        make_kwargs: Keywords for ``collab_env.make`` (e.g. ``data_files=``), with an id.
        policies: Policies for the players a single-agent view does not control (defaults: the
            spec's default policies).
        cycles: Cycles for PettingZoo's tests.
        steps: Steps per seed for the twin-env determinism test.
        raise_on_failure: Raise :class:`EnvCheckError` when a check fails (default); otherwise
            return the report.
        exploits: Also run the exploit audit (a registered id only: the audit reads the card's
            naive baseline; register your env with a card whose ``audit`` names one).
        exploit_kwargs: Keywords for :func:`collab_env.exploits.audit_exploits` (``episodes``,
            ``reward_kwargs``, ``naive``...).
    """
    from collab_env.compose import make as make_registered

    kwargs = dict(make_kwargs or {})
    if isinstance(env, str):
        env_id = env
        make = lambda: make_registered(env_id, **kwargs)  # noqa: E731
    else:
        env_id = getattr(env, "__name__", "custom env")
        make = env
    report = CheckReport(env_id)
    probe = make()
    if not isinstance(probe, CollabEnv):
        report.results.append(CheckResult("type", False, f"expected a CollabEnv, got {type(probe).__name__}"))
        if raise_on_failure:
            raise EnvCheckError(report)
        return report
    spec = probe.spec
    checks: list[tuple[str, Callable[[], str]]] = [
        ("parallel_api", lambda: _check_parallel_api(make, cycles)),
        ("parallel_seed", lambda: _check_parallel_seed(make, cycles)),
        ("determinism", lambda: _check_determinism(make, steps)),
        ("clone", lambda: _check_clone(make)),
        ("pickle", lambda: _check_pickle(make)),
        ("robustness", lambda: _check_robustness(make)),
    ]
    for name, fn in checks:
        try:
            report.results.append(CheckResult(name, True, fn()))
        except Exception as exc:  # a failed check is reported, with what failed
            report.results.append(CheckResult(name, False, f"{type(exc).__name__}: {exc}"))

    trainable = list(spec.trainable) if spec is not None else [
        p for p in probe.possible_agents if probe.task.is_trainable(p)
    ]
    chosen = policies_for(spec, policies)
    viewable = [p for p in trainable if all(o in chosen for o in probe.possible_agents if o != p)]
    if not viewable:
        report.results.append(CheckResult("gymnasium_view", None, "no player whose partners all have policies"))
    else:
        from collab_env.wrappers.single_agent import SingleAgentEnv

        def make_view(p: str):
            e = make()
            return SingleAgentEnv(e, player=p, policies={k: v for k, v in chosen.items() if k != p})

        try:
            report.results.append(CheckResult("gymnasium_view", True, _check_gym_views(make_view, viewable)))
        except Exception as exc:
            report.results.append(CheckResult("gymnasium_view", False, f"{type(exc).__name__}: {exc}"))
    if exploits:
        if not isinstance(env, str):
            report.results.append(CheckResult(
                "exploits", False, "the exploit audit needs a registered id (it reads the card's naive "
                "baseline): collab_env.register(...) your env with a card, then check_env(id, exploits=True)"))
        else:
            from collab_env.exploits import audit_exploits

            try:
                audit = audit_exploits(env_id, make_kwargs=kwargs, **dict(exploit_kwargs or {}))
                report.exploits = audit
                detail = audit.summary()
                if not audit.ok:
                    detail += "\n" + audit.format(only_failed=True)
                report.results.append(CheckResult("exploits", audit.ok, detail))
            except CollabEnvError as exc:
                report.results.append(CheckResult("exploits", False, f"{type(exc).__name__}: {exc}"))
    if raise_on_failure and report.failed:
        raise EnvCheckError(report)
    return report

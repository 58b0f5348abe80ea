"""Policies and a tiny task for the eval and CLI tests (fakes live under tests/ only).

``SlowAskThenAnswer`` reads its delay from ``COLLAB_TEST_DELAY`` so a subprocess run can be
slowed down (to interrupt it) and the resumed run can go at full speed with the same policy.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import time

from collab_env.env import CollabEnv, Outcome, Start, Task, env_message
from collab_env.policy import ScriptedPolicy
from collab_env.tasks.hidden_facts import AskThenAnswer


class SlowAskThenAnswer(AskThenAnswer):
    """AskThenAnswer that waits ``COLLAB_TEST_DELAY`` seconds before every reply."""

    async def act(self, observations, **sampling):
        await asyncio.sleep(float(os.environ.get("COLLAB_TEST_DELAY", "0")))
        return await super().act(observations, **sampling)


class BlockingAskThenAnswer(AskThenAnswer):
    """AskThenAnswer that blocks the event loop ``COLLAB_TEST_DELAY`` seconds before every reply
    (``time.sleep``: as a local model's generate call holds the loop)."""

    async def act(self, observations, **sampling):
        time.sleep(float(os.environ.get("COLLAB_TEST_DELAY", "0")))
        return await super().act(observations, **sampling)


class FlakyAskThenAnswer(AskThenAnswer):
    """AskThenAnswer that raises on the first move of episodes whose seed is in ``fail_seeds``
    (like an API that times out on some requests)."""

    name = "flaky-ask-then-answer"

    def __init__(self, fail_seeds=()):
        self.fail_seeds = set(fail_seeds)
        self.calls = 0

    async def act(self, observations, **sampling):
        self.calls += 1
        first_move = not any(m.author == "assistant" for m in observations[0])
        if first_move and sampling.get("seed") in self.fail_seeds:
            raise TimeoutError(f"simulated timeout on seed {sampling['seed']}")
        return await super().act(observations, **sampling)


class MustNotRun(ScriptedPolicy):
    """Fails the test if it is ever asked to act."""

    name = "must-not-run"

    def respond(self, observation, rng):
        raise AssertionError("this policy must not be called")


class BoxedZero(ScriptedPolicy):
    """Always answers \\boxed{0}."""

    name = "boxed-zero"

    def respond(self, observation, rng):
        return "\\boxed{0}"


class SilentUser(ScriptedPolicy):
    name = "silent-user"

    def respond(self, observation, rng):
        return "..."


class GuessTask(Task):
    """Four items; item i's answer is 10 * i. One assistant move: reward 1 for the right box."""

    players = ("assistant", "user")
    user_players = ("user",)
    turn_order = (("assistant",), ("user",))
    default_max_steps = 4

    def num_items(self):
        return 4

    def get_item(self, index):
        return {"answer": 10 * index}

    def start(self, state, options):
        return Start(messages=[env_message("Guess my number.")], on_turn=("assistant",))

    def step(self, state, moves, final):
        m = re.search(r"\\boxed\{(-?\d+)\}", moves.get("assistant", ""))
        if m is None:
            return Outcome()
        ok = int(m.group(1)) == state.item["answer"]
        return Outcome(rewards={"assistant": float(ok)}, terminated=True, reason="answered")


def make_guess_env(**kwargs):
    return CollabEnv(GuessTask(), **kwargs)


class NoisyGuessTask(GuessTask):
    """Broken on purpose: the opening uses the global RNG, so seeded twins diverge."""

    def start(self, state, options):
        import random

        s = super().start(state, options)
        s.messages.append(env_message(f"noise {random.random()}"))
        return s


def make_noisy_guess_env(**kwargs):
    return CollabEnv(NoisyGuessTask(), **kwargs)


@contextlib.contextmanager
def registered(env_id: str, entry_point: str):
    """Register a guess-like test env for the duration of a test, then remove it again, so
    registry-driven tests elsewhere never see it."""
    import gymnasium

    from collab_env.registry import EnvSpec, register, registry

    s = register(EnvSpec(
        id=env_id,
        entry_point=entry_point,
        players=("assistant", "user"),
        turn_order=(("assistant",), ("user",)),
        trainable=("assistant",),
        default_policies={"user": "tests._eval_helpers:SilentUser"},
        reward_range=(0.0, 1.0),
        description="Test task: guess a number (items 0..3, answer 10*i).",
        suite="test",
    ))
    try:
        yield s.id
    finally:
        registry.pop(s.id, None)
        gymnasium.registry.pop(s.gym_id, None)

"""Small tasks used by the core tests (fakes live under tests/, never in the library)."""

from __future__ import annotations

import random

from collab_env.env import CollabEnv, Outcome, Start, Task, env_message


class TwoWriters(Task):
    """Two agents write at once, then a user replies; ends when the user says 'done'.

    Reward: each agent gets the length of its own message (so per-agent rewards are visible).
    """

    players = ("agent_0", "agent_1", "user")
    user_players = ("user",)
    turn_order = (("agent_0", "agent_1"), ("user",))
    option_keys = frozenset({"topic"})
    default_max_steps = 6

    def num_items(self):
        return 3

    def get_item(self, index):
        return {"topic": ["cats", "tea", "rain"][index]}

    def start(self, state, options):
        topic = options.get("topic", state.item["topic"])
        return Start(
            messages=[env_message(f"secret for user: {topic}", role="system", audience=("user",)),
                      env_message(f"Write about {topic}.")],
            on_turn=("agent_0", "agent_1"),
        )

    def audience(self, player):
        return None

    def step(self, state, moves, final):
        if "user" in moves:
            if moves["user"].strip() == "done":
                return Outcome(terminated=True, reason="user_done")
            return Outcome()
        return Outcome(
            rewards={p: float(len(t)) for p, t in moves.items()},
            components={p: {"length": float(len(t))} for p, t in moves.items()},
        )


class NondeterministicTask(TwoWriters):
    """Broken on purpose: draws from the global RNG, so seeded twins diverge."""

    def start(self, state, options):
        s = super().start(state, options)
        s.messages.append(env_message(f"noise {random.random()}"))
        return s


class SharedStateTask(TwoWriters):
    """Broken on purpose: keeps episode state on the (shared) task, so clones are not independent."""

    def __init__(self):
        self.log = []

    def start(self, state, options):
        self.log.clear()
        return super().start(state, options)

    def step(self, state, moves, final):
        self.log.append(dict(moves))
        out = super().step(state, moves, final)
        out.info = {"history_len": len(self.log)}
        return out


def make_two_writers(**kw):
    return CollabEnv(TwoWriters(), **kw)

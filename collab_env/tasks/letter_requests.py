"""letter-requests: a multi-turn chat with a dense, graded reward that a random model can earn.

A scripted user asks the assistant, turn after turn, for a reply of about ``N`` characters that
uses some letters and none of others ("About 24 characters, with the letters r, k and e, without
the letters s and u."). Every assistant reply is scored at once, in ``[0, 1]``::

    reward = coverage x avoidance x length
    coverage  = requested letters the reply contains / requested letters
    avoidance = 1 - forbidden letters the reply contains / forbidden letters
    length    = max(0, 1 - |len(reply) - N| / N)

(letters are compared case-insensitively). Because each factor is graded, even a randomly
initialised model gets a reward that varies from sample to sample, so a multi-turn learner's
update is never zero by construction (``hidden-facts`` pays only for an exact answer: a random
model earns 0 there). The factors multiply so that no reply wins without reading the request:
the empty reply scores 0 (no requested letter), a dump of the alphabet scores 0 (it contains the
forbidden letters), and echoing the request scores 0 (the request names the forbidden letters).

The plan (the letters and the length of every turn) is the item's: the user holds it in a hidden
system message and the reward reads it from the item, not from what the user said, so a user
policy that words its requests differently (an LLM user) changes what the assistant learns, not
how it is scored. Items are generated from the index (offline, unlimited); ``num_turns`` (default
3) is how many replies an episode scores.
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from collab_env.env import CollabEnv, EpisodeState, Outcome, Start, Task, env_message
from collab_env.errors import ConfigError
from collab_env.policy import ScriptedPolicy
from collab_env.registry import EnvCard
from collab_env.tasks._common import build_config, split_env_kwargs
from collab_env.tasks.cards import baseline_text, cards_section
from collab_env.tasks.exploit_quotes import EXPLOIT_QUOTES
from collab_env.types import Conversation, Message

__all__ = [
    "LetterRequestsConfig",
    "LetterRequestsTask",
    "LetterRequestsUser",
    "LetterRequestsSolver",
    "letter_request_score",
    "request_text",
    "make_env",
    "LETTER_REQUESTS_CARD",
    "LETTER_POLICIES",
]

LETTERS = string.ascii_lowercase
ENV_ID = "letter-requests-v0"


def letter_request_score(reply: str, use: str, avoid: str, length: int) -> dict[str, float]:
    """The score of one reply to the request ``(use, avoid, length)``: ``{"coverage",
    "avoidance", "length", "letters"}``, each in ``[0, 1]``; ``"letters"`` is their product (the
    reward)."""
    seen = set(reply.lower())
    coverage = sum(c in seen for c in use) / len(use)
    avoidance = 1.0 - sum(c in seen for c in avoid) / len(avoid)
    closeness = max(0.0, 1.0 - abs(len(reply) - length) / length)
    return {"coverage": coverage, "avoidance": avoidance, "length": closeness,
            "letters": coverage * avoidance * closeness}


def request_text(turn: Mapping[str, Any]) -> str:
    """The user's wording of one planned turn (what :class:`LetterRequestsUser` says)."""
    use, avoid = turn["use"], turn["avoid"]
    return (f"About {turn['length']} characters, with the letters {_listed(use)}, "
            f"without the letters {_listed(avoid)}.")


def _listed(letters: str) -> str:
    return letters[0] if len(letters) == 1 else ", ".join(letters[:-1]) + " and " + letters[-1]


_REQUEST = re.compile(r"About (\d+) characters, with the letters ([a-z, and]+), without the letters ([a-z, and]+)\.")


@dataclass(frozen=True)
class LetterRequestsConfig:
    """Task options of the letter-requests env."""

    num_turns: int = 3
    """Assistant replies per episode; every one is scored (the return is in ``[0, num_turns]``)."""
    num_use: int = 3
    """Letters each request asks for."""
    num_avoid: int = 2
    """Letters each request forbids."""
    min_length: int = 12
    """Shortest requested length (characters)."""
    max_length: int = 40
    """Longest requested length (characters)."""
    num_items: int | None = None
    """Make the suite finite (items ``0..num_items-1``, as a leaderboard track needs); ``None``
    for unlimited. Items do not depend on it: item ``i`` is the same either way."""

    def __post_init__(self) -> None:
        for name in ("num_turns", "num_use", "num_avoid", "min_length", "max_length"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{name} must be an int >= 1, got {v!r}.")
        if self.num_use + self.num_avoid > len(LETTERS):
            raise ConfigError(f"num_use + num_avoid must be at most {len(LETTERS)}, got "
                              f"{self.num_use} + {self.num_avoid}.")
        if self.num_items is not None and (isinstance(self.num_items, bool) or not isinstance(self.num_items, int)
                                           or self.num_items < 1):
            raise ConfigError(f"num_items must be an int >= 1 or None, got {self.num_items!r}.")
        if self.min_length > self.max_length:
            raise ConfigError(f"min_length ({self.min_length}) must not exceed max_length ({self.max_length}).")


class LetterRequestsTask(Task):
    """The task behind ``letter-requests-v0`` (see the module docstring)."""

    players = ("assistant", "user")
    user_players = ("user",)
    turn_order = (("assistant",), ("user",))

    def __init__(self, config: LetterRequestsConfig | None = None) -> None:
        self.config = config or LetterRequestsConfig()
        self.default_max_steps = 2 * self.config.num_turns

    def num_items(self) -> int | None:
        return self.config.num_items

    def get_item(self, index: int) -> Mapping[str, Any]:
        cfg = self.config
        rng = np.random.default_rng([index, 0x1E77E5])
        turns = []
        for _ in range(cfg.num_turns):
            picked = rng.permutation(len(LETTERS))[: cfg.num_use + cfg.num_avoid]
            use = "".join(sorted(LETTERS[i] for i in picked[: cfg.num_use]))
            avoid = "".join(sorted(LETTERS[i] for i in picked[cfg.num_use:]))
            turns.append({"use": use, "avoid": avoid,
                          "length": int(rng.integers(cfg.min_length, cfg.max_length + 1))})
        return {"turns": turns}

    def start(self, state: EpisodeState, options: Mapping[str, Any]) -> Start:
        turns = state.item["turns"]
        goal = ("You are a user asking an assistant for short replies. Ask for these, one per "
                "message, in order:\n" + "\n".join(f"{k + 1}. {request_text(t)}" for k, t in enumerate(turns)))
        return Start(messages=[
            env_message(goal, role="system", audience=("user",), meta={"plan": list(turns)}),
            # The opening request is the user's line, written from the item (not by a policy).
            Message(role="user", content=request_text(turns[0]), author="user", trainable=False),
        ], on_turn=("assistant",))

    def step(self, state: EpisodeState, moves: Mapping[str, str], final: bool) -> Outcome:
        if "assistant" not in moves:  # the user's request: nothing to score
            return Outcome()
        k = state.moves["assistant"]  # this reply's number (1-based)
        turn = state.item["turns"][k - 1]
        score = letter_request_score(moves["assistant"], turn["use"], turn["avoid"], turn["length"])
        done = k >= self.config.num_turns
        return Outcome(rewards={"assistant": score["letters"]},
                       components={"assistant": {"letters": score["letters"]}},
                       terminated=done, reason="num_turns" if done else None,
                       info={"letter_score": score})


def make_env(**kwargs: Any) -> CollabEnv:
    """Entry point of ``letter-requests-v0``: :class:`LetterRequestsConfig` keywords plus
    ``max_steps``, ``max_message_chars``, ``max_total_chars``, ``render_mode``."""
    env_kw, task_kw = split_env_kwargs(dict(kwargs))
    config = build_config(LetterRequestsConfig, task_kw, where="letter-requests")
    return CollabEnv(LetterRequestsTask(config), **env_kw)


# ---------------------------------------------------------------------------------------------
# Policies: the scripted user and the reference assistant
# ---------------------------------------------------------------------------------------------
class LetterRequestsUser(ScriptedPolicy):
    """The scripted user: asks for the next planned turn (read from its hidden system message)."""

    name = "letter-requests-user"
    uses_rng = False

    def respond(self, observation: Conversation, rng: np.random.Generator) -> str:
        plan = next((m.meta["plan"] for m in observation if m.role == "system" and "plan" in m.meta), None)
        if plan is None:
            raise ConfigError("LetterRequestsUser needs the user's observation of a letter-requests env "
                              "(its hidden plan was not found); use it only as that env's 'user'.")
        replies = sum(1 for m in observation if m.author == "assistant")
        return request_text(plan[min(replies, len(plan) - 1)])


class LetterRequestsSolver(ScriptedPolicy):
    """The reference assistant: reads the last request and writes exactly what it asks for (the
    requested letters, repeated to the requested length): every turn scores 1."""

    name = "letter-requests-solver"
    uses_rng = False

    def respond(self, observation: Conversation, rng: np.random.Generator) -> str:
        last = observation.last(role="user")
        found = _REQUEST.search(last.content) if last is not None else None
        if found is None:
            return "Please ask for letters and a length."
        length = int(found.group(1))
        use = re.findall(r"\b([a-z])\b", found.group(2).replace(" and ", ", "))
        return ("".join(use) * length)[:length] if use else "x" * length


#: The policies' short names (registered by :func:`collab_env.tasks.register_builtin`).
LETTER_POLICIES: dict[str, str] = {
    "letter-requests-user": "collab_env.tasks.letter_requests:LetterRequestsUser",
    "letter-requests-solver": "collab_env.tasks.letter_requests:LetterRequestsSolver",
}

#: The reply of the naive baseline (the exploit audit compares the gaming policies with it).
NAIVE_TEXT = "Sure, here is a short reply for you."

LETTER_REQUESTS_CARD = EnvCard(
    tests="Following a user's changing requests over several turns, with a dense graded reward: "
          "each reply should be about N characters long, use some letters and avoid others. "
          "Made so that multi-turn learners get a non-zero update from a random model; it scores "
          "letters and length, not meaning.",
    players={
        "assistant": "trainable; answers each request",
        "user": "simulated (default LetterRequestsUser, scripted): opens with the first planned "
                "request and asks for the next after each reply",
    },
    sees={
        "assistant": "the requests and its own replies; not the plan",
        "user": "the chat plus a hidden system message with the plan (every turn's letters and "
                "length)",
    },
    reward="default: every assistant reply gets coverage x avoidance x length in [0, 1] "
           "(letter_request_score against the item's plan for that turn: the share of the "
           "requested letters it contains, 1 - the share of the forbidden letters it contains, "
           "max(0, 1 - |len - N| / N)); num_turns 3 replies: the return is in [0, 3]. mr and "
           "conversation do not apply: the spec's weight letters is no registered metric.",
    reward_range={"default": (0.0, 3.0)},
    limits="num_turns 3: terminated ('num_turns') after the third reply; max_steps 6",
    data="generated from the index (offline, unlimited): per turn 3 requested and 2 forbidden "
         "letters (disjoint, uniform over a-z) and a length in 12..40",
    licence="Apache-2.0 (written for this package)",
    baselines={
        "letter-requests-solver": baseline_text("3.000", 200),
        "fixed text (naive)": baseline_text("0.417", 200) + f"; {NAIVE_TEXT!r} every turn",
    },
    audit={"naive": {"assistant": {"fixed": NAIVE_TEXT}}},
    exploits=EXPLOIT_QUOTES.get(ENV_ID, ""),
)

__doc__ = (__doc__ or "") + cards_section({ENV_ID: LETTER_REQUESTS_CARD}, "collab_env.tasks.letter_requests")

